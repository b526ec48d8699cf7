//! The record a generation's manifest keeps of the image layers it applied
//! (`layers` lines), as a volume holds it.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        packsync::fuzzing::oci_record(text);
    }
});
