//! The contents of an `--exclude-from FILE`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    packsync::fuzzing::target("exclude_from", data);
});
