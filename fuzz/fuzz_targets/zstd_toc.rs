//! A zstd:chunked layer's table of contents (decompressed), as a registry
//! hands it.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    packsync::fuzzing::target("zstd_toc", data);
});
