//! Image manifests and indexes, as a registry or a layout hands them over;
//! the first byte picks the Content-Type the server claimed.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    packsync::fuzzing::target("oci_manifest", data);
});
