//! A bundle's /.signatures.json and the compact JWS inside it, as a
//! bundle (a directory, an archive, a URL) hands them over.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    packsync::fuzzing::target("opa_signatures", data);
});
