//! The live manifest's index by directory, on bytes a volume hands it.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    packsync::fuzzing::target("manifest_index", data);
});
