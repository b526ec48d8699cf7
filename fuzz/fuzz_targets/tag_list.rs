//! A registry's tag list page: a `Link` header line, then the JSON page.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    packsync::fuzzing::target("tag_list", data);
});
