//! An image's cosign signature manifest (`sha256-HEX.sig`) and its simple
//! signing payload, as a registry or a layout hands them over.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    packsync::fuzzing::target("cosign_signature", data);
});
