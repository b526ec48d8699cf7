//! Fetching only what changed in a zstd:chunked layer. The layers are
//! written by the test as zstd:chunked writers write them (a zstd frame per
//! file's content, the tar headers in frames between, the TOC in a
//! skippable frame placed by the layer descriptor's annotations) and pushed
//! with skopeo to a docker-registry of the test's own; what packsync
//! fetched is read from the registry's access log (bytes sent), never from
//! packsync's own account. What a delta publishes is compared, tree and
//! manifest, with what a full fetch of the same image publishes (a fresh
//! DEST, where no live generation lends a file). Hostile TOCs, chunks, and
//! a proxy that ignores Range or answers the wrong bytes each fall back to
//! the whole layer with one line, or are refused with DEST unchanged.
//! One more test takes buildah's zstd:chunked output (the container rig)
//! as the oracle for the reader.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::fixture::{sha256_hex, Fixture, Run};
use crate::source_oci::{have, python, tree, wait_for, Auth, Registry, TOOLS};

const MTIME: &str = "2023-11-14T22:13:20Z";
const MTIME_S: u64 = 1_700_000_000;

fn z(b: &[u8]) -> Vec<u8> {
    ruzstd::encoding::compress_to_vec(b, ruzstd::encoding::CompressionLevel::Fastest)
}

fn octal(field: &mut [u8], v: u64) {
    let s = format!("{:0w$o}\0", v, w = field.len() - 1);
    field.copy_from_slice(s.as_bytes());
}

pub(crate) fn tar_header(name: &str, flag: u8, mode: u64, size: u64, link: &str) -> [u8; 512] {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    octal(&mut h[100..108], mode);
    octal(&mut h[108..116], 0);
    octal(&mut h[116..124], 0);
    octal(&mut h[124..136], size);
    octal(&mut h[136..148], MTIME_S);
    h[156] = flag;
    h[157..157 + link.len()].copy_from_slice(link.as_bytes());
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].fill(b' ');
    let sum: u64 = h.iter().map(|&b| b as u64).sum();
    octal(&mut h[148..155], sum);
    h
}

/// A zstd:chunked layer of `packs/` (a directory), its files and a symlink
/// `packs/link -> f0000`. `toc` may change the TOC before it is written;
/// returns the blob, the TOC annotations and the DiffID.
fn chunked_layer(
    files: &[(String, Vec<u8>)],
    toc: &dyn Fn(&mut Value),
) -> (Vec<u8>, BTreeMap<String, String>, String) {
    let mut blob = Vec::new();
    let mut plain = Vec::new();
    let mut entries =
        vec![json!({"type": "dir", "name": "packs/", "mode": 0o40755, "modtime": MTIME})];
    let frame = |bytes: &[u8], blob: &mut Vec<u8>, plain: &mut Vec<u8>| {
        plain.extend_from_slice(bytes);
        blob.extend(z(bytes));
    };
    frame(
        &tar_header("packs/", b'5', 0o755, 0, ""),
        &mut blob,
        &mut plain,
    );
    for (name, data) in files {
        let path = format!("packs/{name}");
        frame(
            &tar_header(&path, b'0', 0o644, data.len() as u64, ""),
            &mut blob,
            &mut plain,
        );
        let offset = blob.len();
        frame(data, &mut blob, &mut plain);
        let end = blob.len();
        let pad = (512 - data.len() % 512) % 512;
        if pad > 0 {
            frame(&vec![0; pad], &mut blob, &mut plain);
        }
        entries.push(json!({
            "type": "reg", "name": path, "mode": 0o100644, "size": data.len(),
            "modtime": MTIME, "digest": format!("sha256:{}", sha256_hex(data)),
            "offset": offset, "endOffset": end,
        }));
    }
    frame(
        &tar_header("packs/link", b'2', 0o777, 0, "f0000"),
        &mut blob,
        &mut plain,
    );
    entries.push(json!({"type": "symlink", "name": "packs/link", "linkName": "f0000", "mode": 0o120777, "modtime": MTIME}));
    frame(&[0; 1024], &mut blob, &mut plain);
    let mut doc = json!({"version": 1, "entries": entries});
    toc(&mut doc);
    let toc = serde_json::to_vec(&doc).unwrap();
    let ztoc = z(&toc);
    blob.extend_from_slice(&[0x50, 0x2a, 0x4d, 0x18]);
    blob.extend_from_slice(&(ztoc.len() as u32).to_le_bytes());
    let at = blob.len();
    blob.extend_from_slice(&ztoc);
    let mut ann = BTreeMap::new();
    ann.insert(
        "io.github.containers.zstd-chunked.manifest-position".to_string(),
        format!("{at}:{}:{}:1", ztoc.len(), toc.len()),
    );
    ann.insert(
        "io.github.containers.zstd-chunked.manifest-checksum".to_string(),
        format!("sha256:{}", sha256_hex(&ztoc)),
    );
    (blob, ann, format!("sha256:{}", sha256_hex(&plain)))
}

fn put(layout: &Path, data: &[u8]) -> Value {
    let hex = sha256_hex(data);
    fs::write(layout.join("blobs/sha256").join(&hex), data).unwrap();
    json!({"digest": format!("sha256:{hex}"), "size": data.len()})
}

fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// An OCI layout at `layout` holding one image of one layer as `tag`;
/// returns the layer's digest.
pub(crate) fn write_image(
    layout: &Path,
    tag: &str,
    layer: &(Vec<u8>, BTreeMap<String, String>, String),
) -> String {
    write_image_as(
        layout,
        tag,
        layer,
        "application/vnd.oci.image.layer.v1.tar+zstd",
    )
}

/// `write_image` with a layer of `media_type`.
pub(crate) fn write_image_as(
    layout: &Path,
    tag: &str,
    layer: &(Vec<u8>, BTreeMap<String, String>, String),
    media_type: &str,
) -> String {
    fs::create_dir_all(layout.join("blobs/sha256")).unwrap();
    fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    let (blob, ann, diff_id) = layer;
    let config = json!({"architecture": arch(), "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [diff_id]}});
    let config = put(layout, &serde_json::to_vec(&config).unwrap());
    let mut l = put(layout, blob);
    l["mediaType"] = media_type.into();
    l["annotations"] = serde_json::to_value(ann).unwrap();
    let digest = l["digest"].as_str().unwrap().to_string();
    let mut c = config;
    c["mediaType"] = "application/vnd.oci.image.config.v1+json".into();
    let manifest = json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": c, "layers": [l]});
    let mut m = put(layout, &serde_json::to_vec(&manifest).unwrap());
    m["mediaType"] = "application/vnd.oci.image.manifest.v1+json".into();
    m["annotations"] = json!({"org.opencontainers.image.ref.name": tag});
    let index_path = layout.join("index.json");
    let mut index: Value = fs::read(&index_path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(json!({"schemaVersion": 2, "manifests": []}));
    index["manifests"].as_array_mut().unwrap().push(m);
    fs::write(index_path, serde_json::to_vec(&index).unwrap()).unwrap();
    digest
}

/// `n` files of `size` bytes (unique text, little to compress), the first
/// `changed` of them edited.
pub(crate) fn files(n: usize, size: usize, changed: usize) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let mut data = Vec::with_capacity(size);
            let mut h = Sha256::digest(format!("file {i}").as_bytes()).to_vec();
            while data.len() < size {
                data.extend_from_slice(sha256_hex(&h).as_bytes());
                h = Sha256::digest(&h).to_vec();
            }
            data.truncate(size);
            if i < changed {
                data[..8].copy_from_slice(b"edited!!");
            }
            (format!("f{i:04}"), data)
        })
        .collect()
}

/// Bytes packsync was sent for blob `digest` (the access log's byte counts).
/// Sync `src` onto vol/packs and check it fell back as a user would see:
/// one line saying the whole layer was fetched and why (`why`), at least
/// the layer's `size` bytes of blob `digest` in the registry's log, and
/// the tree and generation a full fetch (in a fresh DEST) publishes.
pub(crate) fn fell_back_whole(
    reg: &Registry,
    f: &Fixture,
    src: &str,
    digest: &str,
    size: u64,
    why: &str,
) {
    let out = sync(f, src, "vol/packs").ok();
    let warned: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains("whole layer"))
        .collect();
    assert_eq!(warned.len(), 1, "{}", out.stderr);
    assert!(warned[0].contains(why), "{}", out.stderr);
    assert!(
        blob_bytes(reg, digest) >= size,
        "the whole layer was fetched"
    );
    let (t, gen) = full(f, src, "full");
    assert_eq!(tree(&f.dest()), t);
    assert_eq!(generation(&f.dest()), gen);
}

pub(crate) fn blob_bytes(reg: &Registry, digest: &str) -> u64 {
    reg.access_log()
        .lines()
        .filter(|l| l.contains(&format!("/blobs/{digest}")) && l.contains("packsync/"))
        .filter_map(|l| {
            let after = l.split("HTTP/1.1\" ").nth(1)?;
            after.split(' ').nth(1)?.parse::<u64>().ok()
        })
        .sum()
}

/// Sync `src` onto `dest` (relative to the fixture).
pub(crate) fn sync(f: &Fixture, src: &str, dest: &str) -> Run {
    f.packsync(&["sync", "--grace", "0", src, dest])
}

/// The generation DEST shows (named by its manifest's digest).
pub(crate) fn generation(dest: &Path) -> String {
    fs::read_link(dest)
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// What a full fetch of `src` publishes: the tree and the generation, on
/// a DEST of its own (nothing to lend a file).
pub(crate) fn full(f: &Fixture, src: &str, name: &str) -> (Vec<String>, String) {
    let dest = format!("vol/{name}");
    sync(f, src, &dest).ok();
    let p = f.path(&dest);
    (tree(&p), generation(&p))
}

/// v1 pushed as `app:1`, `v2` (from `layer2`) as `app:2`; v1 synced.
fn v1_live(reg: &Registry, f: &Fixture, n: usize, size: usize) -> String {
    let layout = f.path("layout1");
    write_image(&layout, "1", &chunked_layer(&files(n, size, 0), &|_| {}));
    reg.push(&layout, "1", "app", None);
    let src = format!("oci://{}/app:1", reg.host());
    sync(f, &src, "vol/packs").ok();
    src
}

fn push_v2(
    reg: &Registry,
    f: &Fixture,
    layer: &(Vec<u8>, BTreeMap<String, String>, String),
) -> (String, String) {
    let layout = f.path("layout2");
    let _ = fs::remove_dir_all(&layout);
    let digest = write_image(&layout, "2", layer);
    reg.push(&layout, "2", "app", None);
    (format!("oci://{}/app:2", reg.host()), digest)
}

#[test]
fn a_one_percent_update_fetches_a_few_percent_and_publishes_what_a_full_fetch_does() {
    if !have(TOOLS) {
        return;
    }
    let reg = Registry::start(Auth::None);
    let f = Fixture::new();
    v1_live(&reg, &f, 2000, 4096);
    let before = generation(&f.dest());
    let ino =
        |p: &str| std::os::unix::fs::MetadataExt::ino(&fs::metadata(f.dest().join(p)).unwrap());
    let unchanged = ino("packs/f1999");
    let layer = chunked_layer(&files(2000, 4096, 20), &|_| {});
    let size = layer.0.len() as u64;
    let (src, digest) = push_v2(&reg, &f, &layer);

    let out = f
        .packsync(&["sync", "--grace", "0", "--json", &src, "vol/packs"])
        .ok();
    assert!(!out.stderr.contains("warning"), "{}", out.stderr);
    let got = blob_bytes(&reg, &digest);
    assert!(got > 0, "the layer was read");
    // What packsync says it fetched is what the registry sent; what it
    // took from the live generation is the unchanged files' bytes.
    let summary: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(summary["fetched_bytes"], got, "{summary}");
    assert_eq!(summary["reused_bytes"], 1980 * 4096, "{summary}");
    // `status` says it of the live generation, as the sync did.
    let st: Value =
        serde_json::from_str(&f.packsync(&["status", "--json", "vol/packs"]).ok().stdout).unwrap();
    assert_eq!(st["live"]["fetched_bytes"], got, "{st}");
    assert_eq!(st["live"]["reused_bytes"], 1980 * 4096, "{st}");
    let text = f.packsync(&["status", "vol/packs"]).ok().stdout;
    assert!(text.contains("fetched: "), "{text}");
    assert!(
        got * 10 <= size,
        "fetched {got} of the layer's {size} bytes: more than 10%"
    );
    assert_ne!(generation(&f.dest()), before);
    // An unchanged file is the live generation's inode, not a copy.
    assert_eq!(ino("packs/f1999"), unchanged);
    // What a full download publishes, byte for byte: the same tree and
    // the same manifest (the generation is named by its digest).
    let (t, gen) = full(&f, &src, "full");
    assert_eq!(tree(&f.dest()), t);
    assert_eq!(generation(&f.dest()), gen);
    assert!(t.iter().any(|l| l.starts_with("packs/f0000=edited!!")));
    // The full fetch read the whole layer.
    assert!(blob_bytes(&reg, &digest) >= got + size);
}

/// Each hostile v2 falls back to the whole layer with one line and
/// publishes what a full fetch publishes.
fn falls_back(
    tweak: &dyn Fn(&mut Value),
    annotations: &dyn Fn(&mut BTreeMap<String, String>),
    why: &str,
) {
    if !have(TOOLS) {
        return;
    }
    let reg = Registry::start(Auth::None);
    let f = Fixture::new();
    v1_live(&reg, &f, 50, 2048);
    let mut layer = chunked_layer(&files(50, 2048, 1), tweak);
    annotations(&mut layer.1);
    let size = layer.0.len() as u64;
    let (src, digest) = push_v2(&reg, &f, &layer);
    fell_back_whole(&reg, &f, &src, &digest, size, why);
}

#[test]
fn a_toc_whose_digest_is_not_the_annotated_one_falls_back() {
    falls_back(
        &|_| {},
        &|a| {
            a.insert(
                "io.github.containers.zstd-chunked.manifest-checksum".into(),
                format!("sha256:{}", "0".repeat(64)),
            );
        },
        "the TOC's digest is",
    );
}

#[test]
fn a_chunk_that_does_not_match_its_digest_falls_back() {
    falls_back(
        &|toc| {
            // The edited file's frames are not what the TOC says they hold.
            let e = &mut toc["entries"][1];
            e["digest"] = format!("sha256:{}", "1".repeat(64)).into();
        },
        &|_| {},
        "does not match its digest",
    );
}

#[test]
fn a_toc_naming_a_path_out_of_the_tree_falls_back() {
    falls_back(
        &|toc| toc["entries"][1]["name"] = "../x".into(),
        &|_| {},
        "\"..\" component",
    );
}

#[test]
fn a_toc_naming_a_path_through_a_symlink_falls_back() {
    falls_back(
        &|toc| {
            let entries = toc["entries"].as_array_mut().unwrap();
            let link = entries.pop().unwrap();
            entries.insert(1, link);
            entries[2]["name"] = "packs/link/f0000".into();
        },
        &|_| {},
        "through a symlink",
    );
}

/// A proxy in front of the registry that ignores Range (`ignore`: the
/// header is not passed on, the registry answers 200 and the whole blob)
/// or answers other bytes than those asked for (`long`: ten more).
const PROXY_PY: &str = r#"
import http.server, sys, urllib.request, re
mode, upstream = sys.argv[1], sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "range")}
        rng = self.headers.get("Range")
        if rng and mode == "long":
            a, b = re.match(r"bytes=(\d+)-(\d+)", rng).groups()
            headers["Range"] = "bytes=%s-%d" % (a, int(b) + 10)
        req = urllib.request.Request("http://" + upstream + self.path, headers=headers)
        try:
            r = urllib.request.urlopen(req)
        except urllib.error.HTTPError as e:
            r = e
        body = r.read()
        self.send_response(r.status if hasattr(r, "status") else r.code)
        for k, v in r.headers.items():
            if k.lower() not in ("content-length", "connection", "transfer-encoding"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_HEAD = do_GET
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"#;

fn through_proxy(mode: &str, why: &str) {
    if !have(TOOLS) {
        return;
    }
    let reg = Registry::start(Auth::None);
    let f = Fixture::new();
    let mut proxy = python(PROXY_PY, &[mode, &reg.host()]);
    let port = crate::source_oci::first_line(&mut proxy.0);
    let via = format!("127.0.0.1:{port}");
    wait_for(10, "the proxy", || {
        std::net::TcpStream::connect(&via).is_ok()
    });
    let layout = f.path("layout1");
    write_image(&layout, "1", &chunked_layer(&files(50, 2048, 0), &|_| {}));
    reg.push(&layout, "1", "app", None);
    sync(&f, &format!("oci://{via}/app:1"), "vol/packs").ok();
    let layer = chunked_layer(&files(50, 2048, 1), &|_| {});
    let size = layer.0.len() as u64;
    let (_, digest) = push_v2(&reg, &f, &layer);
    let src = format!("oci://{via}/app:2");
    fell_back_whole(&reg, &f, &src, &digest, size, why);
}

#[test]
fn a_server_that_ignores_range_gets_the_whole_layer_asked_for() {
    through_proxy("ignore", "does not answer Range requests");
}

#[test]
fn a_range_answer_of_the_wrong_bytes_falls_back() {
    through_proxy("long", "Content-Range");
}

/// buildah's zstd:chunked output (the container rig) as the oracle: the
/// reader takes what buildah writes (its TOC, its chunks), fetches a few
/// percent of the layer for a 1% change, and publishes what a full fetch
/// publishes.
#[test]
fn what_buildah_writes_is_read_and_fetched_in_part() {
    if !crate::fixture::is_root() {
        crate::fixture::skip("delta_pull: buildah's zstd:chunked needs root and the container rig");
        return;
    }
    let _lock = crate::containers::rig_lock();
    let rig = match crate::containers::Rig::up() {
        Ok(r) => r,
        Err(why) => {
            crate::fixture::skip(&format!("delta_pull: no container rig: {why}"));
            return;
        }
    };
    let vars = rig.env.clone();
    let registry = rig.var("CONTAINER_RIG_REGISTRY").to_string();
    let rig_dir = rig.var("CONTAINER_RIG_DIR").to_string();
    let f = Fixture::new();
    let repo = format!("packsync-delta-{}", std::process::id());
    let build = |tag: &str, changed: usize| {
        let root = f.path(&format!("root{tag}"));
        fs::create_dir_all(root.join("packs")).unwrap();
        for (name, data) in files(200, 8192, changed) {
            fs::write(root.join("packs").join(name), data).unwrap();
        }
        let script = format!(
            "set -e; c=$(buildah from scratch); m=$(buildah mount $c); cp -a {root}/. $m/; \
             buildah umount $c >/dev/null; buildah commit -q $c localhost/{repo}:{tag} >/dev/null; buildah rm $c >/dev/null; \
             buildah push -q --compression-format zstd:chunked --tls-verify=false localhost/{repo}:{tag} docker://{registry}/{repo}:{tag}; \
             buildah rmi localhost/{repo}:{tag} >/dev/null",
            root = root.display()
        );
        let out = Command::new("bash")
            .arg("-c")
            .arg(&script)
            .envs(vars.iter().cloned())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "buildah: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    build("1", 0);
    build("2", 2);
    let src1 = format!("oci://{registry}/{repo}:1");
    let src2 = format!("oci://{registry}/{repo}:2");
    sync(&f, &src1, "vol/packs").ok();
    // What the rig's registry sent packsync for the update (its access log).
    let log = Path::new(&rig_dir).join("logs/registry.log");
    let seen = fs::read_to_string(&log).map(|s| s.len()).unwrap_or(0);
    let out = sync(&f, &src2, "vol/packs").ok();
    assert!(!out.stderr.contains("warning"), "{}", out.stderr);
    let sent = |from: usize| -> u64 {
        let text = fs::read_to_string(&log).unwrap();
        text[from..]
            .lines()
            .filter(|l| l.contains(&format!("/v2/{repo}/blobs/")) && l.contains("packsync/"))
            .filter_map(|l| {
                l.split("HTTP/1.1\" ")
                    .nth(1)?
                    .split(' ')
                    .nth(1)?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    };
    let delta = sent(seen);
    let at_full = fs::read_to_string(&log).unwrap().len();
    let (t, gen) = full(&f, &src2, "full");
    let whole = sent(at_full);
    assert!(
        delta > 0 && delta * 10 <= whole,
        "the update took {delta} bytes, a full fetch {whole}"
    );
    assert_eq!(tree(&f.dest()), t);
    assert_eq!(generation(&f.dest()), gen);
    assert!(t.iter().any(|l| l.starts_with("packs/f0001=edited!!")));
}

/// An OCI layout directory serves parts too: the update of a zstd:chunked
/// image there takes the unchanged files from the live generation (the
/// same inodes) and publishes what a full read does.
#[test]
fn a_layout_directory_updates_from_its_toc_too() {
    let f = Fixture::new();
    let layout = f.path("layout");
    write_image(&layout, "1", &chunked_layer(&files(40, 2048, 0), &|_| {}));
    write_image(&layout, "2", &chunked_layer(&files(40, 2048, 2), &|_| {}));
    sync(&f, "oci-layout:layout:1", "vol/packs").ok();
    let ino =
        |p: &str| std::os::unix::fs::MetadataExt::ino(&fs::metadata(f.dest().join(p)).unwrap());
    let unchanged = ino("packs/f0039");
    let out = f
        .packsync(&[
            "sync",
            "--grace",
            "0",
            "--json",
            "oci-layout:layout:2",
            "vol/packs",
        ])
        .ok();
    assert!(!out.stderr.contains("warning"), "{}", out.stderr);
    let summary: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(summary["reused_bytes"], 38 * 2048, "{summary}");
    assert_eq!(ino("packs/f0039"), unchanged);
    let (t, gen) = full(&f, "oci-layout:layout:2", "full");
    assert_eq!(tree(&f.dest()), t);
    assert_eq!(generation(&f.dest()), gen);
    assert!(t.iter().any(|l| l.starts_with("packs/f0001=edited!!")));
}
