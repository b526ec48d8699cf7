//! `--semver` ranges and tags: a range, then two tags, a line each.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    packsync::fuzzing::target("semver", data);
});
