//! `oci://` and `oci-layout:` references, as a user writes them.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        packsync::fuzzing::oci_reference(text);
    }
});
