//! The manifest reader, on bytes a volume hands it.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    packsync::fuzzing::target("manifest", data);
});
