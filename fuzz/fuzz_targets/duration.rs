//! A duration flag's value (`--grace`, `--timeout`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    packsync::fuzzing::target("duration", data);
});
