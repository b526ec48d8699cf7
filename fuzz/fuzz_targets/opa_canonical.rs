//! A bundle's data.json, hashed in OPA's canonical JSON form.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    packsync::fuzzing::target("opa_canonical", data);
});
