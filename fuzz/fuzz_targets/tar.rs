//! The tar reader behind the gzip/zstd sniffing, on bytes an archive or a registry hands it.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    packsync::fuzzing::target("tar", data);
});
