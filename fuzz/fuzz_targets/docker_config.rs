//! Docker config.json / .dockerconfigjson, WWW-Authenticate challenges and
//! token answers: what a mounted Secret or a registry hands packsync.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    packsync::fuzzing::target("docker_config", data);
});
