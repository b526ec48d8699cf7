//! A duration flag's value (`--grace`, `--timeout`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(s) = std::str::from_utf8(data) {
        packsync::fuzzing::duration(s);
    }
});
