//! Image manifests and indexes, as a registry or a layout hands them over;
//! the first byte picks the Content-Type the server claimed.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&pick, doc)) = data.split_first() else {
        return;
    };
    let types = [
        None,
        Some("application/vnd.oci.image.index.v1+json"),
        Some("application/vnd.oci.image.manifest.v1+json"),
        Some("application/vnd.docker.distribution.manifest.v2+json"),
        Some("application/vnd.docker.distribution.manifest.list.v2+json; charset=utf-8"),
    ];
    packsync::fuzzing::oci_manifest(doc, types[pick as usize % types.len()]);
});
