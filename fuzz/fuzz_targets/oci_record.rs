//! The record a generation's manifest keeps of the image layers it applied
//! (`layers` lines), as a volume holds it.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    packsync::fuzzing::target("oci_record", data);
});
