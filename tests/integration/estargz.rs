//! Fetching only what changed in an eStargz layer. The layers are written
//! here from the format's documentation (containerd/stargz-snapshotter
//! `docs/estargz.md`): a gzip layer of one member per file chunk, the tar
//! headers in the members between, the last tar entry `stargz.index.json`
//! (the TOC) in a member of its own, then the 51-byte footer (an empty gzip
//! member whose extra field holds the TOC's offset); the TOC's SHA-256 in
//! the layer descriptor's `containerd.io/snapshot/stargz/toc.digest`. They
//! are pushed to a docker-registry of the test's own, and what packsync
//! fetched is read from its access log. What a delta publishes is compared
//! with what a full fetch of the same image publishes.

use std::collections::BTreeMap;
use std::io::Write;

use serde_json::{json, Value};

use crate::delta_pull::{
    blob_bytes, fell_back_whole, files, full, generation, sync, tar_header, write_image_as,
};
use crate::fixture::{sha256_hex, Fixture};
use crate::source_oci::{have, Auth, Registry, TOOLS};

const MTIME: &str = "2023-11-14T22:13:20Z";
const GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// Files are cut into chunks of this many bytes, each in a member of its own.
const CHUNK: usize = 2048;

fn gz(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

/// The footer placing the TOC member at `at`.
fn footer(at: u64) -> Vec<u8> {
    let mut f = vec![
        0x1f, 0x8b, 8, 4, 0, 0, 0, 0, 0, 0xff, 26, 0, b'S', b'G', 22, 0,
    ];
    f.extend_from_slice(format!("{at:016x}STARGZ").as_bytes());
    f.extend_from_slice(&[1, 0, 0, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(f.len(), 51);
    f
}

/// An eStargz layer of `packs/`, its files and a symlink `packs/link`.
/// `toc` may change the TOC before it is written, `footer_at` place the
/// footer's TOC elsewhere; returns the blob, the annotation and the DiffID.
fn estargz_layer(
    files: &[(String, Vec<u8>)],
    toc: &dyn Fn(&mut Value),
    footer_at: Option<u64>,
) -> (Vec<u8>, BTreeMap<String, String>, String) {
    let mut blob = Vec::new();
    let mut plain = Vec::new();
    // The member being written, not yet compressed.
    let mut open: Vec<u8> = Vec::new();
    let close = |open: &mut Vec<u8>, blob: &mut Vec<u8>, plain: &mut Vec<u8>| {
        if !open.is_empty() {
            plain.extend_from_slice(open);
            blob.extend(gz(open));
            open.clear();
        }
    };
    let mut entries =
        vec![json!({"type": "dir", "name": "packs/", "mode": 0o40755, "modtime": MTIME})];
    open.extend_from_slice(&tar_header("packs/", b'5', 0o755, 0, ""));
    for (name, data) in files {
        let path = format!("packs/{name}");
        open.extend_from_slice(&tar_header(&path, b'0', 0o644, data.len() as u64, ""));
        for (i, chunk) in data.chunks(CHUNK).enumerate() {
            close(&mut open, &mut blob, &mut plain);
            let offset = blob.len();
            open.extend_from_slice(chunk);
            let mut e = json!({
                "name": path, "offset": offset, "chunkOffset": i * CHUNK,
                "chunkSize": chunk.len(), "chunkDigest": format!("sha256:{}", sha256_hex(chunk)),
            });
            if i == 0 {
                e["type"] = "reg".into();
                e["mode"] = 0o644.into();
                e["size"] = data.len().into();
                e["modtime"] = MTIME.into();
                e["digest"] = format!("sha256:{}", sha256_hex(data)).into();
            } else {
                e["type"] = "chunk".into();
            }
            entries.push(e);
        }
        open.resize(open.len() + (512 - data.len() % 512) % 512, 0);
    }
    open.extend_from_slice(&tar_header("packs/link", b'2', 0o777, 0, "f0000"));
    entries.push(json!({"type": "symlink", "name": "packs/link", "linkName": "f0000", "mode": 0o777, "modtime": MTIME}));
    close(&mut open, &mut blob, &mut plain);
    let mut doc = json!({"version": 1, "entries": entries});
    toc(&mut doc);
    let toc = serde_json::to_vec(&doc).unwrap();
    let at = blob.len() as u64;
    open.extend_from_slice(&tar_header(
        "stargz.index.json",
        b'0',
        0o444,
        toc.len() as u64,
        "",
    ));
    open.extend_from_slice(&toc);
    open.resize(open.len() + (512 - toc.len() % 512) % 512 + 1024, 0);
    close(&mut open, &mut blob, &mut plain);
    blob.extend(footer(footer_at.unwrap_or(at)));
    let mut ann = BTreeMap::new();
    ann.insert(
        "containerd.io/snapshot/stargz/toc.digest".to_string(),
        format!("sha256:{}", sha256_hex(&toc)),
    );
    (blob, ann, format!("sha256:{}", sha256_hex(&plain)))
}

fn push(
    reg: &Registry,
    f: &Fixture,
    tag: &str,
    layer: &(Vec<u8>, BTreeMap<String, String>, String),
) -> (String, String) {
    let layout = f.path(&format!("layout{tag}"));
    let _ = std::fs::remove_dir_all(&layout);
    let digest = write_image_as(&layout, tag, layer, GZIP);
    reg.push(&layout, tag, "app", None);
    (format!("oci://{}/app:{tag}", reg.host()), digest)
}

#[test]
fn a_one_percent_update_of_an_estargz_layer_fetches_a_few_percent() {
    if !have(TOOLS) {
        return;
    }
    let reg = Registry::start(Auth::None);
    let f = Fixture::new();
    let (src1, _) = push(
        &reg,
        &f,
        "1",
        &estargz_layer(&files(2000, 4096, 0), &|_| {}, None),
    );
    sync(&f, &src1, "vol/packs").ok();
    let before = generation(&f.dest());
    let ino = |p: &str| {
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(f.dest().join(p)).unwrap())
    };
    let unchanged = ino("packs/f1999");
    let layer = estargz_layer(&files(2000, 4096, 20), &|_| {}, None);
    let size = layer.0.len() as u64;
    let (src, digest) = push(&reg, &f, "2", &layer);
    let out = f
        .packsync(&["sync", "--grace", "0", "--json", &src, "vol/packs"])
        .ok();
    assert!(!out.stderr.contains("warning"), "{}", out.stderr);
    let got = blob_bytes(&reg, &digest);
    assert!(got > 0, "the layer was read");
    let summary: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(summary["fetched_bytes"], got, "{summary}");
    assert_eq!(summary["reused_bytes"], 1980 * 4096, "{summary}");
    assert!(
        got * 10 <= size,
        "fetched {got} of the layer's {size} bytes: more than 10%"
    );
    assert_ne!(generation(&f.dest()), before);
    assert_eq!(ino("packs/f1999"), unchanged);
    let (t, gen) = full(&f, &src, "full");
    assert_eq!(crate::source_oci::tree(&f.dest()), t);
    assert_eq!(generation(&f.dest()), gen);
    assert!(t.iter().any(|l| l.starts_with("packs/f0000=edited!!")));
    assert!(
        t.iter().any(|l| l.starts_with("stargz.index.json")),
        "{t:?}"
    );
    assert!(blob_bytes(&reg, &digest) >= got + size);
}

/// Each hostile v2 falls back to the whole layer with one line and
/// publishes what a full fetch publishes.
fn falls_back(
    tweak: &dyn Fn(&mut Value),
    annotations: &dyn Fn(&mut BTreeMap<String, String>),
    footer_at: Option<u64>,
    why: &str,
) {
    if !have(TOOLS) {
        return;
    }
    let reg = Registry::start(Auth::None);
    let f = Fixture::new();
    let (src1, _) = push(
        &reg,
        &f,
        "1",
        &estargz_layer(&files(50, 2048, 0), &|_| {}, None),
    );
    sync(&f, &src1, "vol/packs").ok();
    let mut layer = estargz_layer(&files(50, 2048, 1), tweak, footer_at);
    annotations(&mut layer.1);
    let size = layer.0.len() as u64;
    let (src, digest) = push(&reg, &f, "2", &layer);
    fell_back_whole(&reg, &f, &src, &digest, size, why);
}

#[test]
fn an_estargz_toc_whose_digest_is_not_the_annotated_one_falls_back() {
    falls_back(
        &|_| {},
        &|a| {
            a.insert(
                "containerd.io/snapshot/stargz/toc.digest".into(),
                format!("sha256:{}", "0".repeat(64)),
            );
        },
        None,
        "the TOC's digest is",
    );
}

#[test]
fn an_estargz_chunk_that_does_not_match_its_digest_falls_back() {
    falls_back(
        &|toc| toc["entries"][1]["chunkDigest"] = format!("sha256:{}", "1".repeat(64)).into(),
        &|_| {},
        None,
        "does not match its digest",
    );
}

#[test]
fn an_estargz_toc_naming_a_path_out_of_the_tree_falls_back() {
    falls_back(
        &|toc| toc["entries"][1]["name"] = "../x".into(),
        &|_| {},
        None,
        "\"..\" component",
    );
}

#[test]
fn an_estargz_footer_pointing_outside_the_blob_falls_back() {
    falls_back(&|_| {}, &|_| {}, Some(1 << 40), "outside the layer");
}
