//! A `--trusted-root` (a Sigstore trusted_root.json) or one DER certificate, as a root or a bundle hands them over.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    packsync::fuzzing::target("trusted_root", data);
});
