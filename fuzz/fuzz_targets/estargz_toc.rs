//! The tail of an eStargz layer: its footer, then the TOC's decompressed
//! gzip member (or the TOC's JSON), as a registry hands them.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    packsync::fuzzing::target("estargz_toc", data);
});
