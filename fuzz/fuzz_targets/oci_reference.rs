//! `oci://` and `oci-layout:` references, as a user writes them.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    packsync::fuzzing::target("oci_reference", data);
});
