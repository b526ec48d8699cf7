//! `--label` ordering: up to three labels, one a line.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    packsync::fuzzing::target("label", data);
});
