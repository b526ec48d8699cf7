//! `--chmod RULES`: the first four bytes are the mode it is applied to.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    packsync::fuzzing::target("chmod", data);
});
