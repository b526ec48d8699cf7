//! A Rekor checkpoint (a signed note), an RFC 6962 inclusion proof, or a log entry body, as a bundle holds them.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    packsync::fuzzing::target("checkpoint", data);
});
