//! Images as SOURCE: `oci://` from a real registry (Debian's
//! `docker-registry`, started by the test on a free port: plain, with
//! htpasswd Basic auth, and with the Bearer token flow against a small
//! token server), and `oci-layout:` directories. The images are OCI layouts
//! written by the test (gzip, zstd and plain layers, whiteouts, an opaque
//! directory, an index with two platforms) and pushed with skopeo. Checked
//! as a user would: the published tree is the merged root filesystem,
//! `status` names the image digest, a second sync of the same tag fetches
//! no blob (the registry's access log), failures exit 1 with one line and
//! leave the volume as it was.
//!
//! Needs docker-registry, skopeo, python3, zstd and openssl; without them
//! each test is skipped with one line, and fails under CI (`CI` set).

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::fixture::{mtime, set_mtime, Fixture, Run};

/// Whether every tool is on PATH; else one line (or a panic under CI).
pub(crate) fn have(tools: &[&str]) -> bool {
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|t| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {t}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .collect();
    if missing.is_empty() {
        return true;
    }
    crate::fixture::skip(&format!("source tests: needs {}", missing.join(", ")));
    false
}

/// Poll `cond` every 20 ms until it holds or `secs` pass.
#[track_caller]
pub(crate) fn wait_for(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The first line a helper process prints (its port), with a deadline.
pub(crate) fn first_line(child: &mut Child) -> String {
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("the helper printed nothing")
        .trim()
        .to_string()
}

/// A child process ended (by its pid) when dropped.
pub(crate) struct Helper(pub Child);

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn python(code: &str, args: &[&str]) -> Helper {
    Helper(
        Command::new("python3")
            .arg("-c")
            .arg(code)
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    )
}

/// What a reader sees below `root`: `path=content`, `path/`, `path -> target`.
pub(crate) fn tree(root: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let m = fs::symlink_metadata(&p).unwrap();
            if m.file_type().is_symlink() {
                out.push(format!("{rel} -> {}", fs::read_link(&p).unwrap().display()));
            } else if m.is_dir() {
                out.push(format!("{rel}/"));
                walk(root, &p, out);
            } else {
                out.push(format!("{rel}={}", fs::read_to_string(&p).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

fn ino(p: &Path) -> u64 {
    fs::metadata(p).unwrap().ino()
}

/// Writes an OCI layout from a JSON description (stdin): images by tag,
/// each one platform (the tag names its manifest) or several (an index).
/// A layer is its "entries", or "tar": the path of a tar file taken as it is.
/// Prints {tag: {"top": digest, "platforms": [manifest digests]}}.
const LAYOUT_PY: &str = r#"
import hashlib, io, json, os, subprocess, sys, tarfile, gzip
spec = json.load(sys.stdin)
root = spec["dir"]
os.makedirs(os.path.join(root, "blobs", "sha256"), exist_ok=True)
def put(data):
    d = hashlib.sha256(data).hexdigest()
    with open(os.path.join(root, "blobs", "sha256", d), "wb") as f:
        f.write(data)
    return {"digest": "sha256:" + d, "size": len(data)}
def layer(l):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for e in l.get("entries", []):
            ti = tarfile.TarInfo(e["name"])
            ti.mtime = e.get("mtime", 1700000000)
            kind = e.get("type", "file")
            ti.mode = e.get("mode", 0o755 if kind == "dir" else 0o644)
            for k, v in e.get("xattrs", {}).items():
                ti.pax_headers["SCHILY.xattr." + k] = v
            data = None
            if kind == "dir":
                ti.type = tarfile.DIRTYPE
            elif kind == "symlink":
                ti.type = tarfile.SYMTYPE
                ti.linkname = e["target"]
            elif kind == "hardlink":
                ti.type = tarfile.LNKTYPE
                ti.linkname = e["target"]
            else:
                data = e.get("data", "").encode() * e.get("repeat", 1)
                ti.size = len(data)
            t.addfile(ti, io.BytesIO(data) if data is not None else None)
    raw = open(l["tar"], "rb").read() if "tar" in l else buf.getvalue()
    c = l.get("compression", "gzip")
    if c == "gzip":
        return gzip.compress(raw, mtime=0), "application/vnd.oci.image.layer.v1.tar+gzip"
    if c == "zstd":
        z = subprocess.run(["zstd", "-q", "-c"], input=raw, stdout=subprocess.PIPE, check=True).stdout
        return z, "application/vnd.oci.image.layer.v1.tar+zstd"
    return raw, "application/vnd.oci.image.layer.v1.tar"
def image(p):
    cfg = json.dumps({"architecture": p["arch"], "os": p["os"], "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    c = put(cfg)
    c["mediaType"] = "application/vnd.oci.image.config.v1+json"
    layers = []
    for l in p["layers"]:
        data, mt = layer(l)
        d = put(data)
        d["mediaType"] = mt
        layers.append(d)
    m = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": c, "layers": layers}).encode()
    d = put(m)
    d["mediaType"] = "application/vnd.oci.image.manifest.v1+json"
    d["platform"] = {"os": p["os"], "architecture": p["arch"]}
    if p.get("variant"):
        d["platform"]["variant"] = p["variant"]
    return d
index_path = os.path.join(root, "index.json")
top = json.load(open(index_path)) if os.path.exists(index_path) else {"schemaVersion": 2, "manifests": []}
out = {}
for img in spec["images"]:
    descs = [image(p) for p in img["platforms"]]
    if len(descs) == 1:
        d = dict(descs[0])
        d.pop("platform", None)
    else:
        idx = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                          "manifests": descs}).encode()
        d = put(idx)
        d["mediaType"] = "application/vnd.oci.image.index.v1+json"
    d["annotations"] = {"org.opencontainers.image.ref.name": img["tag"]}
    top["manifests"] = [m for m in top["manifests"]
                        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") != img["tag"]]
    top["manifests"].append(d)
    out[img["tag"]] = {"top": d["digest"], "platforms": [x["digest"] for x in descs]}
# Published as a registry does: whole, by rename (a sidecar may be
# reading the index while this runs).
with open(os.path.join(root, "index.json.tmp"), "w") as tmp:
    json.dump(top, tmp)
os.replace(os.path.join(root, "index.json.tmp"), os.path.join(root, "index.json"))
open(os.path.join(root, "oci-layout"), "w").write('{"imageLayoutVersion": "1.0.0"}')
json.dump(out, sys.stdout)
"#;

/// Write `spec` (the JSON above, without "dir") into the layout `dir`;
/// the manifest digests per platform of `tag`.
pub(crate) fn write_layout(dir: &Path, images: &str, tag: &str) -> Vec<String> {
    let spec = format!(
        r#"{{"dir":{:?},"images":{images}}}"#,
        dir.display().to_string()
    );
    let out = crate::fixture::python(LAYOUT_PY, &spec, "writing the layout");
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    v[tag]["platforms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap().to_string())
        .collect()
}

/// Two platforms; amd64: a gzip layer, then a zstd layer with a whiteout,
/// an opaque directory and a hardlink; arm64: one plain layer.
fn two_platforms(tag: &str, marker: &str) -> String {
    format!(
        r#"[{{"tag":"{tag}","platforms":[
        {{"os":"linux","arch":"amd64","layers":[
          {{"compression":"gzip","entries":[
            {{"name":"opt","type":"dir"}},{{"name":"opt/packs","type":"dir"}},
            {{"name":"opt/packs/core.yaml","data":"core {marker}"}},
            {{"name":"opt/packs/gone.yaml","data":"removed by the next layer"}},
            {{"name":"opt/cache","type":"dir"}},{{"name":"opt/cache/old","data":"hidden by opq"}},
            {{"name":"etc","type":"dir"}},{{"name":"etc/motd","data":"hello"}}]}},
          {{"compression":"zstd","entries":[
            {{"name":"opt/packs/.wh.gone.yaml"}},
            {{"name":"opt/cache/.wh..wh..opq"}},{{"name":"opt/cache/new","data":"fresh"}},
            {{"name":"opt/packs/st2.yaml","data":"st2 {marker}"}},
            {{"name":"opt/packs/st2-link.yaml","type":"hardlink","target":"opt/packs/st2.yaml"}},
            {{"name":"etc/motd-link","type":"symlink","target":"motd"}}]}}]}},
        {{"os":"linux","arch":"arm64","variant":"v8","layers":[
          {{"compression":"none","entries":[{{"name":"opt","type":"dir"}},{{"name":"opt/arm","data":"arm {marker}"}}]}}]}}]}}]"#
    )
}

fn amd64_tree(marker: &str) -> Vec<String> {
    let mut v: Vec<String> = [
        "etc/".to_string(),
        "etc/motd=hello".into(),
        "etc/motd-link -> motd".into(),
        "opt/".into(),
        "opt/cache/".into(),
        "opt/cache/new=fresh".into(),
        "opt/packs/".into(),
        format!("opt/packs/core.yaml=core {marker}"),
        format!("opt/packs/st2-link.yaml=st2 {marker}"),
        format!("opt/packs/st2.yaml=st2 {marker}"),
    ]
    .into();
    v.sort();
    v
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Whether `port` answers HTTP.
fn answers(port: u16) -> bool {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /v2/ HTTP/1.0\r\n\r\n").is_err() {
        return false;
    }
    let mut buf = [0; 12];
    s.read_exact(&mut buf).is_ok() && buf.starts_with(b"HTTP/1.")
}

/// How a registry asks for credentials.
pub(crate) enum Auth<'a> {
    None,
    /// htpasswd Basic auth for this user and password.
    Basic(&'a str, &'a str),
    /// Bearer tokens from the token server on this port, signed with this
    /// certificate's key.
    Token(u16, &'a Path),
}

/// One docker-registry, on a free port, with its data and access log in
/// a temporary directory.
pub(crate) struct Registry {
    _proc: Helper,
    port: u16,
    dir: tempfile::TempDir,
}

impl Registry {
    pub(crate) fn start(auth: Auth) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let auth_conf = match auth {
            Auth::None => String::new(),
            Auth::Basic(user, pass) => {
                let out = Command::new("python3")
                    .args([
                        "-c",
                        "import crypt,sys; print(sys.argv[1] + ':' + crypt.crypt(sys.argv[2], crypt.mksalt(crypt.METHOD_BLOWFISH)))",
                        user,
                        pass,
                    ])
                    .output()
                    .unwrap();
                assert!(out.status.success(), "no bcrypt");
                fs::write(dir.path().join("htpasswd"), &out.stdout).unwrap();
                format!(
                    "auth:\n  htpasswd:\n    realm: packsync-test\n    path: {}\n",
                    dir.path().join("htpasswd").display()
                )
            }
            Auth::Token(tport, cert) => format!(
                "auth:\n  token:\n    realm: http://127.0.0.1:{tport}/token\n    service: packsync-test-registry\n    issuer: packsync-test\n    rootcertbundle: {}\n",
                cert.display()
            ),
        };
        let conf = format!(
            "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: false\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n{auth_conf}",
            dir.path().join("data").display()
        );
        let conf_path = dir.path().join("config.yml");
        fs::write(&conf_path, conf).unwrap();
        let log = fs::File::create(dir.path().join("log")).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&conf_path)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let r = Registry {
            _proc: Helper(child),
            port,
            dir,
        };
        wait_for(20, "the registry to answer", || answers(port));
        r
    }

    pub(crate) fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Push the layout's `tag` as `repo:tag` (every platform).
    pub(crate) fn push(&self, layout: &Path, tag: &str, repo: &str, creds: Option<&str>) {
        let mut c = Command::new("skopeo");
        c.args(["copy", "-q", "--all", "--dest-tls-verify=false"]);
        if let Some(creds) = creds {
            c.args(["--dest-creds", creds]);
        }
        let out = c
            .arg(format!("oci:{}:{tag}", layout.display()))
            .arg(format!("docker://{}/{repo}:{tag}", self.host()))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "skopeo push: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The registry's access log so far.
    pub(crate) fn access_log(&self) -> String {
        fs::read_to_string(self.dir.path().join("log")).unwrap()
    }

    /// Requests packsync made whose path holds `part` (`/blobs/`, `/manifests/`).
    pub(crate) fn requests(&self, part: &str) -> usize {
        fs::read_to_string(self.dir.path().join("log"))
            .unwrap()
            .lines()
            .filter(|l| l.contains("\"GET /v2/") && l.contains(part) && l.contains("packsync/"))
            .count()
    }

    /// The file holding a blob in the registry's storage.
    fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

/// The layer digests of a manifest blob in a layout.
fn layers_of(layout: &Path, manifest: &str) -> Vec<String> {
    let hex = manifest.strip_prefix("sha256:").unwrap();
    let m: serde_json::Value =
        serde_json::from_slice(&fs::read(layout.join("blobs/sha256").join(hex)).unwrap()).unwrap();
    m["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .collect()
}

pub(crate) const TOOLS: &[&str] = &["docker-registry", "skopeo", "python3", "zstd"];

#[test]
fn an_image_lands_as_its_merged_root_filesystem() {
    if !have(TOOLS) {
        return;
    }
    let reg = Registry::start(Auth::None);
    let f = Fixture::new();
    let layout = f.path("layout");
    let digests = write_layout(&layout, &two_platforms("1.0", "v1"), "1.0");
    reg.push(&layout, "1.0", "st2/packs", None);
    let src = format!("oci://{}/st2/packs:1.0", reg.host());

    f.packsync(&["sync", "--platform", "linux/amd64", &src, "vol/packs"])
        .ok();
    assert_eq!(tree(&f.dest()), amd64_tree("v1"));
    assert_eq!(
        ino(&f.dest().join("opt/packs/st2.yaml")),
        ino(&f.dest().join("opt/packs/st2-link.yaml")),
        "a hardlink in the image stays one"
    );
    let status = f.packsync(&["status", "--json", "vol/packs"]).ok();
    let want = format!("oci://{}/st2/packs@{}", reg.host(), digests[0]);
    assert!(status.stdout.contains(&want), "{}", status.stdout);

    // --platform picks the other image of the index.
    f.packsync(&["sync", "--platform", "linux/arm64", &src, "vol/arm"])
        .ok();
    assert_eq!(tree(&f.path("vol/arm")), ["opt/", "opt/arm=arm v1"]);
    // No image for the platform: exit 1, naming what the index has.
    f.packsync(&["sync", "--platform", "linux/s390x", &src, "vol/none"])
        .fails(
            1,
            "no image for linux/s390x in the index (it has linux/amd64, linux/arm64/v8",
        );
    assert!(!f.path("vol/none").exists());

    // //PATH takes one subtree; an absent one is exit 1, nothing published.
    let sub = format!("{src}//opt/packs");
    f.packsync(&["sync", "--platform", "linux/amd64", &sub, "vol/sub"])
        .ok();
    assert_eq!(
        tree(&f.path("vol/sub")),
        [
            "core.yaml=core v1",
            "st2-link.yaml=st2 v1",
            "st2.yaml=st2 v1"
        ]
    );
    let absent = format!("{src}//opt/nothing");
    f.unchanged_but_staging(|| {
        f.packsync(&["sync", "--platform", "linux/amd64", &absent, "vol/packs"])
            .fails(1, "//opt/nothing")
    });

    // The same image from an OCI layout that skopeo wrote.
    let saved = f.path("saved");
    let out = Command::new("skopeo")
        .args([
            "copy",
            "-q",
            "--src-tls-verify=false",
            "--override-arch",
            "amd64",
        ])
        .arg(format!("docker://{}/st2/packs:1.0", reg.host()))
        .arg(format!("oci:{}:1.0", saved.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lay = format!("oci-layout:{}:1.0", saved.display());
    f.packsync(&["sync", &lay, "vol/saved"]).ok();
    assert_eq!(tree(&f.path("vol/saved")), amd64_tree("v1"));
    // Without a tag: the only image of the layout.
    let untagged = format!("oci-layout:{}", saved.display());
    f.packsync(&["sync", &untagged, "vol/saved2"]).ok();
    assert_eq!(tree(&f.path("vol/saved2")), amd64_tree("v1"));
    f.packsync(&[
        "sync",
        &format!("oci-layout:{}:2.0", saved.display()),
        "vol/x",
    ])
    .fails(1, "no tag 2.0 in the layout (it has 1.0)");
}

#[test]
fn an_unchanged_tag_fetches_no_blob_and_a_moved_tag_publishes() {
    if !have(TOOLS) {
        return;
    }
    let reg = Registry::start(Auth::None);
    let f = Fixture::new();
    let layout = f.path("layout");
    write_layout(&layout, &two_platforms("1", "v1"), "1");
    reg.push(&layout, "1", "app", None);
    let src = format!("oci://{}/app:1", reg.host());
    let sync = || {
        f.packsync(&[
            "sync",
            "--grace",
            "0",
            "--platform",
            "linux/amd64",
            &src,
            "vol/packs",
        ])
    };

    sync().ok();
    let blobs = reg.requests("/blobs/");
    assert_eq!(blobs, 2, "two layers fetched");
    let manifests = reg.requests("/manifests/");
    let core = ino(&f.dest().join("opt/packs/core.yaml"));

    // The same tag: up to date after one manifest request, no blob.
    let again = f.unchanged_by(|| sync().ok());
    assert!(again.stdout.contains("up to date"), "{}", again.stdout);
    assert_eq!(reg.requests("/blobs/"), blobs, "no blob fetched");
    assert_eq!(
        reg.requests("/manifests/"),
        manifests + 1,
        "one manifest request"
    );

    // The live tree drifted: the unchanged tag is fetched after all, and
    // the sync repairs it.
    let live = fs::canonicalize(f.dest()).unwrap();
    fs::write(live.join("etc/motd"), "edited in place").unwrap();
    sync().ok();
    assert_eq!(tree(&f.dest()), amd64_tree("v1"));
    assert!(reg.requests("/blobs/") > blobs, "fetched on drift");
    assert_eq!(
        ino(&f.dest().join("opt/packs/core.yaml")),
        core,
        "the repair hardlinks what did not drift"
    );

    // The tag moves: one changed file; the unchanged ones are hardlinked
    // from the previous generation.
    write_layout(
        &layout,
        &two_platforms("1", "v2").replace("core v2", "core v1"),
        "1",
    );
    reg.push(&layout, "1", "app", None);
    let core_now = ino(&f.dest().join("opt/packs/core.yaml"));
    sync().ok();
    let mut want = amd64_tree("v2");
    for l in want.iter_mut() {
        *l = l.replace("core v2", "core v1");
    }
    assert_eq!(tree(&f.dest()), want);
    assert_eq!(
        ino(&f.dest().join("opt/packs/core.yaml")),
        core_now,
        "an unchanged file is hardlinked from the live generation"
    );
}

#[test]
fn registry_failures_exit_1_and_change_nothing() {
    if !have(TOOLS) {
        return;
    }
    let reg = Registry::start(Auth::None);
    let f = Fixture::new();
    let layout = f.path("layout");
    write_layout(&layout, &two_platforms("1", "v1"), "1");
    reg.push(&layout, "1", "app", None);
    let good = format!("oci://{}/app:1", reg.host());
    f.packsync(&[
        "sync",
        "--grace",
        "0",
        "--platform",
        "linux/amd64",
        &good,
        "vol/packs",
    ])
    .ok();

    // A tag or a repository that is not there.
    f.refused(
        &["sync", &format!("oci://{}/app:2", reg.host()), "vol/packs"],
        1,
        "404 Not Found (no tag 2 in app)",
    );
    // Malformed references: exit 2 before anything is read.
    for bad in [
        format!("oci://{}/App:1", reg.host()),
        "oci://registry.example/app:bad tag".to_string(),
        format!("oci://{}/app@sha256:1234", reg.host()),
        format!("oci://{}/app:1//../etc", reg.host()),
    ] {
        f.refused(&["sync", &bad, "vol/packs"], 2, &bad[..12]);
    }
    // A registry that is down.
    let down = format!("oci://127.0.0.1:{}/app:1", free_port());
    f.refused(
        &["sync", "--timeout", "2s", &down, "vol/packs"],
        1,
        "cannot connect to 127.0.0.1:",
    );

    // A layer whose bytes do not match its digest (changed in the
    // registry's storage): the digest is what the error names, not what
    // the decompressor made of the bytes; nothing published.
    let other = f.path("other");
    let digests = write_layout(&other, &two_platforms("9", "v9"), "9");
    reg.push(&other, "9", "app", None);
    let layer = layers_of(&other, &digests[0])[0].clone();
    let stored = reg.blob_file(&layer);
    let mut bytes = fs::read(&stored).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    fs::write(&stored, bytes).unwrap();
    let bad = format!("oci://{}/app:9", reg.host());
    f.unchanged_but_staging(|| {
        f.packsync(&["sync", "--platform", "linux/amd64", &bad, "vol/packs"])
            .fails(1, "digest mismatch")
    });
    assert_eq!(
        tree(&f.dest()),
        amd64_tree("v1"),
        "the last good tree stays"
    );
}

#[test]
fn basic_auth_takes_a_docker_config_or_a_mounted_secret() {
    if !have(TOOLS) {
        return;
    }
    let reg = Registry::start(Auth::Basic("puller", "s3cret"));
    let f = Fixture::new();
    let layout = f.path("layout");
    write_layout(&layout, &two_platforms("1", "v1"), "1");
    reg.push(&layout, "1", "app", Some("puller:s3cret"));
    let src = format!("oci://{}/app:1", reg.host());
    let empty_home = f.path("home");
    fs::create_dir(&empty_home).unwrap();
    let run = |extra: &[&str], env: &[(&str, &Path)]| {
        let mut args = vec!["sync", "--grace", "0", "--platform", "linux/amd64"];
        args.extend_from_slice(extra);
        args.extend([src.as_str(), "vol/packs"]);
        let mut c = f.command(&args);
        c.env("HOME", &empty_home).env_remove("DOCKER_CONFIG");
        for (k, v) in env {
            c.env(k, v);
        }
        Run::from(c.output().unwrap())
    };

    // No credentials: 401, with the hint, and nothing written.
    f.unchanged_by(|| {
        run(&[], &[]).fails(
            1,
            &format!("{src}: 401 Unauthorized (credentials: --registry-auth FILE)"),
        )
    });

    // A Kubernetes image pull Secret mounted as a file (.dockerconfigjson).
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode("puller:s3cret");
    let secret = f.path("secret/.dockerconfigjson");
    fs::create_dir_all(secret.parent().unwrap()).unwrap();
    fs::write(
        &secret,
        format!(r#"{{"auths":{{"{}":{{"auth":"{b64}"}}}}}}"#, reg.host()),
    )
    .unwrap();
    run(&["--registry-auth", secret.to_str().unwrap()], &[]).ok();
    assert_eq!(tree(&f.dest()), amd64_tree("v1"));

    // $DOCKER_CONFIG/config.json with username and password.
    let cfg_dir = f.path("docker");
    fs::create_dir(&cfg_dir).unwrap();
    fs::write(
        cfg_dir.join("config.json"),
        format!(
            r#"{{"auths":{{"https://{}":{{"username":"puller","password":"s3cret"}}}}}}"#,
            reg.host()
        ),
    )
    .unwrap();
    run(&[], &[("DOCKER_CONFIG", &cfg_dir)]).ok();

    // Wrong credentials: the file is named.
    let wrong = f.path("wrong.json");
    let b64 = base64::engine::general_purpose::STANDARD.encode("puller:nope");
    fs::write(
        &wrong,
        format!(r#"{{"auths":{{"{}":{{"auth":"{b64}"}}}}}}"#, reg.host()),
    )
    .unwrap();
    f.unchanged_by(|| {
        run(&["--registry-auth", wrong.to_str().unwrap()], &[])
            .fails(1, "401 Unauthorized (the credentials for 127.0.0.1:")
    });
    // An unreadable --registry-auth is a usage error.
    f.unchanged_by(|| {
        run(&["--registry-auth", "/nonexistent/config.json"], &[])
            .fails(2, "cannot read --registry-auth")
    });
}

/// A token server for the registry's Bearer flow: GET /token with Basic
/// credentials user:pw grants pull and push on the scope's repository;
/// anonymous requests get a token that grants nothing. Tokens are JWTs
/// signed (RS256, by openssl) with the key whose certificate is in x5c.
const TOKEN_PY: &str = r#"
import base64, http.server, json, os, subprocess, sys, time, urllib.parse
key, cert_der, user, pw = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
x5c = base64.b64encode(open(cert_der, "rb").read()).decode()
def b64(b): return base64.urlsafe_b64encode(b).rstrip(b"=").decode()
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        u = urllib.parse.urlparse(self.path)
        q = urllib.parse.parse_qs(u.query)
        got = self.headers.get("Authorization", "")
        want = "Basic " + base64.b64encode(f"{user}:{pw}".encode()).decode()
        if got and got != want:
            self.send_response(401); self.end_headers(); return
        access = []
        for s in q.get("scope", []):
            t, name, _ = s.split(":")
            if got == want:
                access.append({"type": t, "name": name, "actions": ["pull", "push"]})
        now = int(time.time())
        claims = {"iss": "packsync-test", "sub": user if got else "", "aud": q.get("service", [""])[0],
                  "exp": now + 600, "nbf": now - 60, "iat": now, "jti": os.urandom(8).hex(), "access": access}
        head = {"typ": "JWT", "alg": "RS256", "x5c": [x5c]}
        signing = (b64(json.dumps(head).encode()) + "." + b64(json.dumps(claims).encode())).encode()
        sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", key], input=signing,
                             stdout=subprocess.PIPE, check=True).stdout
        body = json.dumps({"token": signing.decode() + "." + b64(sig)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"#;

#[test]
fn the_bearer_token_flow() {
    if !have(&["docker-registry", "skopeo", "python3", "zstd", "openssl"]) {
        return;
    }
    let keys = tempfile::tempdir().unwrap();
    let (key, cert, der) = (
        keys.path().join("key.pem"),
        keys.path().join("cert.pem"),
        keys.path().join("cert.der"),
    );
    let ok = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=packsync-test-token",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(ok.success());
    let ok = Command::new("openssl")
        .args(["x509", "-outform", "DER"])
        .arg("-in")
        .arg(&cert)
        .arg("-out")
        .arg(&der)
        .status()
        .unwrap();
    assert!(ok.success());
    let mut token = python(
        TOKEN_PY,
        &[
            key.to_str().unwrap(),
            der.to_str().unwrap(),
            "puller",
            "s3cret",
        ],
    );
    let tport: u16 = first_line(&mut token.0).parse().unwrap();
    let reg = Registry::start(Auth::Token(tport, &cert));
    let f = Fixture::new();
    let layout = f.path("layout");
    write_layout(&layout, &two_platforms("1", "v1"), "1");
    reg.push(&layout, "1", "team/app", Some("puller:s3cret"));
    let src = format!("oci://{}/team/app:1", reg.host());
    let home = f.path("home");
    fs::create_dir(&home).unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["sync", "--grace", "0", "--platform", "linux/amd64"];
        args.extend_from_slice(extra);
        args.extend([src.as_str(), "vol/packs"]);
        let mut c = f.command(&args);
        c.env("HOME", &home).env_remove("DOCKER_CONFIG");
        Run::from(c.output().unwrap())
    };
    // Anonymous: the realm's token grants nothing, the registry says 401.
    f.unchanged_by(|| run(&[]).fails(1, "401 Unauthorized (credentials: --registry-auth FILE)"));
    let auth = f.path("auth.json");
    fs::write(
        &auth,
        format!(
            r#"{{"auths":{{"{}":{{"username":"puller","password":"s3cret"}}}}}}"#,
            reg.host()
        ),
    )
    .unwrap();
    run(&["--registry-auth", auth.to_str().unwrap()]).ok();
    assert_eq!(tree(&f.dest()), amd64_tree("v1"));
    // Again: the token flow once more, and no blob.
    let blobs = reg.requests("/blobs/");
    let again = run(&["--registry-auth", auth.to_str().unwrap()]).ok();
    assert!(again.stdout.contains("up to date"), "{}", again.stdout);
    assert_eq!(reg.requests("/blobs/"), blobs);
}

/// An image of three layers ("1") and the same three with a fourth on top
/// ("2") that edits a file, adds one, whites one out and makes a directory
/// opaque. `lower` marks the lower layers' content (another image: other
/// lower layers).
fn stacked(lower: &str) -> String {
    let base = format!(
        r#"{{"compression":"gzip","entries":[
            {{"name":"app","type":"dir"}},{{"name":"app/lib","type":"dir"}},
            {{"name":"app/lib/a.py","data":"a {lower}"}},{{"name":"app/lib/b.py","data":"b {lower}"}},
            {{"name":"app/cache","type":"dir"}},{{"name":"app/cache/old","data":"old {lower}"}},
            {{"name":"etc","type":"dir"}},{{"name":"etc/motd","data":"hello {lower}"}}]}},
          {{"compression":"zstd","entries":[
            {{"name":"app/lib/h.py","data":"h {lower}"}},
            {{"name":"app/lib/h-link.py","type":"hardlink","target":"app/lib/h.py"}},
            {{"name":"app/gone.txt","data":"gone {lower}"}},
            {{"name":"app/latest","type":"symlink","target":"lib/a.py"}}]}},
          {{"compression":"gzip","entries":[
            {{"name":"app/lib/c.py","data":"c {lower}"}},{{"name":"app/cache/older","data":"older"}}]}}"#
    );
    let top = r#"{"compression":"gzip","entries":[
            {"name":"app/lib/b.py","data":"b edited"},{"name":"app/lib/new.py","data":"new"},
            {"name":"app/.wh.gone.txt"},
            {"name":"app/cache/.wh..wh..opq"},{"name":"app/cache/fresh","data":"fresh"}]}"#;
    format!(
        r#"[{{"tag":"1","platforms":[{{"os":"linux","arch":"amd64","layers":[{base}]}}]}},
           {{"tag":"2","platforms":[{{"os":"linux","arch":"amd64","layers":[{base},{top}]}}]}}]"#
    )
}

fn stacked_v2(lower: &str) -> Vec<String> {
    let mut v: Vec<String> = vec![
        "app/".into(),
        "app/cache/".into(),
        "app/cache/fresh=fresh".into(),
        "app/latest -> lib/a.py".into(),
        "app/lib/".into(),
        format!("app/lib/a.py=a {lower}"),
        "app/lib/b.py=b edited".into(),
        format!("app/lib/c.py=c {lower}"),
        format!("app/lib/h-link.py=h {lower}"),
        format!("app/lib/h.py=h {lower}"),
        "app/lib/new.py=new".into(),
        "etc/".into(),
        format!("etc/motd=hello {lower}"),
    ];
    v.sort();
    v
}

impl Registry {
    /// GETs packsync made of the blob `digest`.
    fn fetched(&self, digest: &str) -> usize {
        self.requests(&format!("/blobs/{digest}"))
    }
}

/// A registry holding `stacked("v1")` as `app:1` and `app:2` (v2: one
/// layer more), the fixture, and the layout pushed.
fn stacked_in_registry() -> (Registry, Fixture, PathBuf) {
    let reg = Registry::start(Auth::None);
    let f = Fixture::new();
    let layout = f.path("layout");
    write_layout(&layout, &stacked("v1"), "1");
    for tag in ["1", "2"] {
        reg.push(&layout, tag, "app", None);
    }
    (reg, f, layout)
}

/// The generation DEST shows (its manifest's digest names it).
fn generation(dest: &Path) -> String {
    let target = fs::read_link(dest).unwrap();
    target.file_name().unwrap().to_string_lossy().into_owned()
}

#[test]
fn an_added_top_layer_is_the_only_one_fetched() {
    if !have(TOOLS) {
        return;
    }
    let (reg, f, layout) = stacked_in_registry();
    let manifest_of = |tag: &str| {
        let index: serde_json::Value =
            serde_json::from_slice(&fs::read(layout.join("index.json")).unwrap()).unwrap();
        index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
            .unwrap()["digest"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let layers = layers_of(&layout, &manifest_of("2"));
    assert_eq!(layers.len(), 4);
    assert_eq!(layers[..3], layers_of(&layout, &manifest_of("1"))[..]);
    let sync = |dest: &str, tag: &str, sub: &str| {
        let src = format!("oci://{}/app:{tag}{sub}", reg.host());
        f.packsync(&["sync", "--grace", "0", &src, dest]).ok()
    };

    sync("vol/packs", "1", "");
    for l in &layers[..3] {
        assert_eq!(reg.fetched(l), 1, "{l}");
    }
    let before: Vec<u64> = ["app/lib/a.py", "app/lib/c.py", "app/lib/h.py", "etc/motd"]
        .iter()
        .map(|p| ino(&f.dest().join(p)))
        .collect();

    // The update: only the new top layer is fetched, the unchanged files
    // are the previous generation's inodes, and the tree is v2's.
    let out = sync("vol/packs", "2", "");
    assert!(out.stdout.contains("synced"), "{}", out.stdout);
    assert_eq!(tree(&f.dest()), stacked_v2("v1"));
    for l in &layers[..3] {
        assert_eq!(reg.fetched(l), 1, "{l} not fetched again");
    }
    assert_eq!(reg.fetched(&layers[3]), 1);
    let after: Vec<u64> = ["app/lib/a.py", "app/lib/c.py", "app/lib/h.py", "etc/motd"]
        .iter()
        .map(|p| ino(&f.dest().join(p)))
        .collect();
    assert_eq!(after, before, "unchanged files hardlinked from v1");
    assert_eq!(
        ino(&f.dest().join("app/lib/h-link.py")),
        ino(&f.dest().join("app/lib/h.py")),
        "a hardlink inside the image stays one"
    );
    // Byte for byte (metadata too) the generation a fresh sync of v2 makes.
    sync("vol/fresh", "2", "");
    assert_eq!(generation(&f.dest()), generation(&f.path("vol/fresh")));
    assert_eq!(tree(&f.path("vol/fresh")), stacked_v2("v1"));

    // The same with a //PATH.
    sync("vol/sub", "1", "//app/lib");
    let fetched: Vec<usize> = layers.iter().map(|l| reg.fetched(l)).collect();
    sync("vol/sub", "2", "//app/lib");
    let now: Vec<usize> = layers.iter().map(|l| reg.fetched(l)).collect();
    assert_eq!(now[..3], fetched[..3], "lower layers not fetched again");
    assert_eq!(now[3], fetched[3] + 1);
    sync("vol/sub-fresh", "2", "//app/lib");
    assert_eq!(
        generation(&f.path("vol/sub")),
        generation(&f.path("vol/sub-fresh"))
    );
}

#[test]
fn a_drifted_base_file_or_another_image_fetches_every_layer() {
    if !have(TOOLS) {
        return;
    }
    let (reg, f, _) = stacked_in_registry();
    let other = f.path("other");
    write_layout(&other, &stacked("other"), "1");
    reg.push(&other, "1", "other", None);
    let sync = |src: String| {
        f.packsync(&["sync", "--grace", "0", &src, "vol/packs"])
            .ok()
    };
    let blobs = || reg.requests("/blobs/");

    // Drift: a base file edited in the live generation is repaired; also
    // where the drifted file is hardlinked (both paths of a group listed
    // from the live generation, linked at the end of the stage).
    for drifted in ["app/lib/a.py", "app/lib/h.py"] {
        sync(format!("oci://{}/app:1", reg.host()));
        let live = fs::canonicalize(f.dest()).unwrap();
        fs::write(live.join(drifted), "edited in place").unwrap();
        let before = blobs();
        sync(format!("oci://{}/app:2", reg.host()));
        assert_eq!(tree(&f.dest()), stacked_v2("v1"), "{drifted}");
        assert!(
            blobs() >= before + 4,
            "every layer fetched on drift of {drifted}"
        );
    }

    // A hardlink group split in the live tree (one path replaced by a copy
    // of the same bytes, mode and mtime): the shortcut's stage finds it,
    // and so does the try after it, which streams every layer; the last
    // try streams them again avoiding the split group, and publishes the
    // image's group again.
    sync(format!("oci://{}/app:1", reg.host()));
    let live = fs::canonicalize(f.dest()).unwrap();
    let link = live.join("app/lib/h-link.py");
    let (root, dir) = (mtime(&live), mtime(&live.join("app/lib")));
    let (s, ns) = mtime(&link);
    let mode = fs::metadata(&link).unwrap().permissions();
    fs::copy(&link, live.join("app/lib/h-copy")).unwrap();
    fs::set_permissions(live.join("app/lib/h-copy"), mode).unwrap();
    set_mtime(&live.join("app/lib/h-copy"), s, ns);
    fs::rename(live.join("app/lib/h-copy"), &link).unwrap();
    set_mtime(&live.join("app/lib"), dir.0, dir.1);
    set_mtime(&live, root.0, root.1);
    assert_ne!(ino(&link), ino(&live.join("app/lib/h.py")));
    sync(format!("oci://{}/app:2", reg.host()));
    assert_eq!(tree(&f.dest()), stacked_v2("v1"));
    assert_eq!(
        ino(&f.dest().join("app/lib/h-link.py")),
        ino(&f.dest().join("app/lib/h.py")),
        "the image's hardlink published as one inode"
    );
    f.packsync(&["verify", "vol/packs"]).ok();

    // A live generation from another image (other lower layers): every
    // layer of the new one is fetched.
    sync(format!("oci://{}/other:1", reg.host()));
    let before = blobs();
    sync(format!("oci://{}/app:2", reg.host()));
    assert_eq!(tree(&f.dest()), stacked_v2("v1"));
    assert_eq!(blobs(), before + 4, "all four layers fetched");
}
