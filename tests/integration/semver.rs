//! `--semver RANGE` (with `--tag-filter`) and `--label auto`: which tag an
//! image source publishes, and the label taken from the content.
//!
//! Most tests run against a small registry in the test (a std
//! `TcpListener` on 127.0.0.1 serving an OCI layout the test writes: its
//! tags, in pages of `n` with `Link` headers, its manifests and blobs), so
//! that what the registry lists, how it pages and where its links point
//! can be changed between syncs. One test pushes tags with skopeo to a real
//! `docker-registry` and lists them two at a time; it is skipped with one
//! line where those are absent.

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::fixture::{json_lines, Fixture};
use crate::source_oci::{have, tree, wait_for, Helper};

/// Writes one-layer images into an OCI layout (stdin: `{"dir", "images":
/// [{"tag", "files": {name: text}, "annotations"?, "labels"?}]}`), adding
/// to its index (an image of the same tag replaced); prints `{tag: digest}`.
const LAYOUT_PY: &str = r#"
import hashlib, io, json, os, sys, tarfile
spec = json.load(sys.stdin)
root = spec["dir"]
os.makedirs(os.path.join(root, "blobs", "sha256"), exist_ok=True)
def put(data):
    d = hashlib.sha256(data).hexdigest()
    open(os.path.join(root, "blobs", "sha256", d), "wb").write(data)
    return {"digest": "sha256:" + d, "size": len(data)}
out = {}
index_path = os.path.join(root, "index.json")
top = json.load(open(index_path)) if os.path.exists(index_path) else {"schemaVersion": 2, "manifests": []}
for img in spec["images"]:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, text in sorted(img["files"].items()):
            data = text.encode()
            ti = tarfile.TarInfo(name)
            ti.size, ti.mtime, ti.mode = len(data), 1700000000, 0o644
            t.addfile(ti, io.BytesIO(data))
    layer = put(buf.getvalue())
    layer["mediaType"] = "application/vnd.oci.image.layer.v1.tar"
    cfg = {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}
    if "labels" in img:
        cfg["config"] = {"Labels": img["labels"]}
    c = put(json.dumps(cfg).encode())
    c["mediaType"] = "application/vnd.oci.image.config.v1+json"
    m = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
         "config": c, "layers": [layer]}
    if "annotations" in img:
        m["annotations"] = img["annotations"]
    d = put(json.dumps(m).encode())
    d["mediaType"] = "application/vnd.oci.image.manifest.v1+json"
    d["annotations"] = {"org.opencontainers.image.ref.name": img["tag"]}
    top["manifests"] = [x for x in top["manifests"]
                        if x.get("annotations", {}).get("org.opencontainers.image.ref.name") != img["tag"]]
    top["manifests"].append(d)
    out[img["tag"]] = d["digest"]
# Published as a registry does: whole, by rename (a sidecar may be
# reading the index while this runs).
with open(os.path.join(root, "index.json.tmp"), "w") as tmp:
    json.dump(top, tmp)
os.replace(os.path.join(root, "index.json.tmp"), os.path.join(root, "index.json"))
open(os.path.join(root, "oci-layout"), "w").write('{"imageLayoutVersion": "1.0.0"}')
json.dump(out, sys.stdout)
"#;

/// Add images to the layout `dir`: (tag, one file `v` holding the tag);
/// `extra` is merged into each image's JSON (annotations, labels). The
/// manifest digest of each tag.
pub(crate) fn add_images(dir: &Path, tags: &[&str], extra: &str) -> BTreeMap<String, String> {
    let images: Vec<String> = tags
        .iter()
        .map(|t| format!(r#"{{"tag":{t:?},"files":{{"v":{t:?}}}{extra}}}"#))
        .collect();
    let spec = format!(
        r#"{{"dir":{:?},"images":[{}]}}"#,
        dir.display().to_string(),
        images.join(",")
    );
    let out = crate::fixture::python(LAYOUT_PY, &spec, "writing the layout");
    serde_json::from_slice(&out).unwrap()
}

/// Where the test registry's `Link` headers point.
#[derive(Clone, Copy, PartialEq)]
enum Links {
    /// `</v2/…?n=..&last=..>`, as docker-registry writes them.
    Relative,
    /// `<http://127.0.0.1:PORT/v2/…>`: the same host, absolute.
    Absolute,
    /// `<http://127.0.0.2:PORT/v2/…>`: another host.
    Elsewhere,
}

struct State {
    layout: PathBuf,
    /// Tags the listing leaves out (a registry mirror behind).
    hidden: Vec<String>,
    /// The page size when the client names none, and the most it gets.
    page: usize,
    links: Links,
    /// Every request line's path, in order.
    requests: Vec<String>,
}

/// The test registry: repository `app`, from an OCI layout.
struct Fake {
    port: u16,
    state: Arc<Mutex<State>>,
}

impl Fake {
    fn start(layout: &Path) -> Fake {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(State {
            layout: layout.to_path_buf(),
            hidden: Vec::new(),
            page: 2,
            links: Links::Relative,
            requests: Vec::new(),
        }));
        let s = state.clone();
        std::thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(tcp) = conn else { continue };
                let s = s.clone();
                std::thread::spawn(move || serve(tcp, port, &s));
            }
        });
        Fake { port, state }
    }

    fn source(&self) -> String {
        format!("oci://127.0.0.1:{}/app", self.port)
    }

    fn set(&self, change: impl FnOnce(&mut State)) {
        change(&mut self.state.lock().unwrap());
    }

    /// The tag-list requests since the last call.
    fn listings(&self) -> Vec<String> {
        let mut s = self.state.lock().unwrap();
        let got = s
            .requests
            .iter()
            .filter(|r| r.contains("/tags/list"))
            .cloned()
            .collect();
        s.requests.clear();
        got
    }
}

fn serve(tcp: std::net::TcpStream, port: u16, state: &Mutex<State>) {
    let mut r = BufReader::new(tcp.try_clone().unwrap());
    let mut first = String::new();
    if r.read_line(&mut first).is_err() {
        return;
    }
    let mut line = String::new();
    while r.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
        line.clear();
    }
    let path = first.split(' ').nth(1).unwrap_or("/").to_string();
    let mut st = state.lock().unwrap();
    st.requests.push(path.clone());
    let (status, ctype, link, body) = answer(&st, port, &path);
    drop(st);
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if let Some(t) = ctype {
        head.push_str(&format!("Content-Type: {t}\r\n"));
    }
    if let Some(l) = link {
        head.push_str(&format!("Link: {l}\r\n"));
    }
    head.push_str("\r\n");
    let mut tcp = tcp;
    let _ = tcp.write_all(head.as_bytes());
    let _ = tcp.write_all(&body);
}

type Answer = (&'static str, Option<String>, Option<String>, Vec<u8>);

fn answer(st: &State, port: u16, path: &str) -> Answer {
    let not_found = ("404 Not Found", None, None, b"{}".to_vec());
    if path == "/bundle.tar.gz" {
        return match fs::read(st.layout.join("bundle.tar.gz")) {
            Ok(b) => ("200 OK", Some("application/gzip".into()), None, b),
            Err(_) => not_found,
        };
    }
    let index: serde_json::Value =
        serde_json::from_slice(&fs::read(st.layout.join("index.json")).unwrap()).unwrap();
    let descs = index["manifests"].as_array().unwrap().clone();
    let tag_of = |d: &serde_json::Value| {
        d["annotations"]["org.opencontainers.image.ref.name"]
            .as_str()
            .map(str::to_string)
    };
    let blob = |digest: &str| {
        fs::read(
            st.layout
                .join("blobs/sha256")
                .join(digest.strip_prefix("sha256:")?),
        )
        .ok()
    };
    if path == "/v2/" {
        return ("200 OK", None, None, b"{}".to_vec());
    }
    if let Some(query) = path.strip_prefix("/v2/app/tags/list") {
        let q: BTreeMap<&str, &str> = query
            .trim_start_matches('?')
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .collect();
        let n = q
            .get("n")
            .and_then(|n| n.parse().ok())
            .unwrap_or(st.page)
            .min(st.page);
        let mut tags: Vec<String> = descs
            .iter()
            .filter_map(tag_of)
            .filter(|t| !st.hidden.contains(t))
            .collect();
        tags.sort();
        if let Some(last) = q.get("last") {
            tags.retain(|t| t.as_str() > *last);
        }
        let more = tags.len() > n;
        tags.truncate(n);
        let link = (more).then(|| {
            let next = format!("/v2/app/tags/list?n={n}&last={}", tags.last().unwrap());
            match st.links {
                Links::Relative => format!("<{next}>; rel=\"next\""),
                Links::Absolute => format!("<http://127.0.0.1:{port}{next}>; rel=\"next\""),
                Links::Elsewhere => format!("<http://127.0.0.2:{port}{next}>; rel=\"next\""),
            }
        });
        let body = serde_json::json!({"name": "app", "tags": tags}).to_string();
        return (
            "200 OK",
            Some("application/json".into()),
            link,
            body.into_bytes(),
        );
    }
    if let Some(r) = path.strip_prefix("/v2/app/manifests/") {
        let desc = descs
            .iter()
            .find(|d| d["digest"] == r || tag_of(d).as_deref() == Some(r));
        return match desc.and_then(|d| {
            Some((
                d["mediaType"].as_str()?.to_string(),
                blob(d["digest"].as_str()?)?,
            ))
        }) {
            Some((mt, bytes)) => ("200 OK", Some(mt), None, bytes),
            None => not_found,
        };
    }
    if let Some(d) = path.strip_prefix("/v2/app/blobs/") {
        return match blob(d) {
            Some(bytes) => (
                "200 OK",
                Some("application/octet-stream".into()),
                None,
                bytes,
            ),
            None => not_found,
        };
    }
    not_found
}

fn tools() -> bool {
    have(&["python3"])
}

/// `sync --grace 0 EXTRA SOURCE vol/packs`.
fn sync(f: &Fixture, extra: &[&str], source: &str) -> crate::fixture::Run {
    let mut args = vec!["sync", "--grace", "0"];
    args.extend_from_slice(extra);
    args.extend([source, "vol/packs"]);
    f.packsync(&args)
}

fn status_json(f: &Fixture) -> serde_json::Value {
    let run = f.packsync(&["status", "--json", "vol/packs"]).ok();
    serde_json::from_str(&run.stdout).unwrap()
}

/// The live generation's label and sources, as `status --json` says.
fn live(f: &Fixture) -> (String, Vec<String>) {
    let s = status_json(f);
    let live = &s["live"];
    (
        live["label"].as_str().unwrap_or("-").to_string(),
        live["sources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect(),
    )
}

#[test]
fn the_highest_matching_tag_is_published_across_pages() {
    if !tools() {
        return;
    }
    let f = Fixture::new();
    let layout = f.path("layout");
    let digests = add_images(
        &layout,
        &[
            "latest",
            "1.3.9",
            "v1.4.0",
            "1.4.2",
            "v1.4.10",
            "1.5.0-rc.1",
            "2.0.0",
        ],
        "",
    );
    let reg = Fake::start(&layout);
    sync(&f, &["--semver", ">=1.4.0 <2.0.0"], &reg.source()).ok();
    // v1.4.10: the highest release in the range (v prefix and all), not
    // the pre-release above it, nor 2.0.0 outside it.
    assert_eq!(tree(&f.dest()), ["v=v1.4.10"]);
    // Seven tags two a page: four pages, each asked for once, the first
    // with the page size packsync asks for and the rest by the Link.
    let pages = reg.listings();
    assert_eq!(pages.len(), 4, "{pages:?}");
    assert!(pages[1].contains("last="), "{pages:?}");
    let (label, sources) = live(&f);
    assert_eq!(label, "v1.4.10", "the chosen tag is the label");
    assert_eq!(
        sources,
        [format!("{}:v1.4.10@{}", reg.source(), digests["v1.4.10"])]
    );
    let text = f.packsync(&["status", "vol/packs"]).ok().stdout;
    assert!(
        text.contains(&format!(
            "from {}:v1.4.10@{}",
            reg.source(),
            digests["v1.4.10"]
        )),
        "{text}"
    );

    // A range that names a pre-release admits it; `~1.4`, `^1.3`, `1.x`
    // and `||` as Flux takes them.
    for (range, want) in [
        (">=1.5.0-0", "v=2.0.0"),
        (">=1.5.0-0 <2", "v=1.5.0-rc.1"),
        ("~1.3", "v=1.3.9"),
        ("^1.3", "v=v1.4.10"),
        ("1.x", "v=v1.4.10"),
        ("1.4.2 || 1.3.9", "v=1.4.2"),
        ("=1.4.0", "v=v1.4.0"),
    ] {
        let g = Fixture::new();
        sync(&g, &["--semver", range], &reg.source()).ok();
        assert_eq!(tree(&g.dest()), [want], "{range}");
    }
}

#[test]
fn the_tag_filter_narrows_the_tags_first() {
    if !tools() {
        return;
    }
    let f = Fixture::new();
    let layout = f.path("layout");
    add_images(&layout, &["1.2.0", "2.0.0", "stable-1.9.0"], "");
    let reg = Fake::start(&layout);
    sync(
        &f,
        &["--semver", "*", "--tag-filter", r"^1\."],
        &reg.source(),
    )
    .ok();
    assert_eq!(tree(&f.dest()), ["v=1.2.0"]);
    // Nothing the filter keeps is a version: a runtime failure naming both.
    let g = Fixture::new();
    let run = g.unchanged_by(|| {
        sync(
            &g,
            &["--semver", "*", "--tag-filter", "^stable-"],
            &reg.source(),
        )
        .fails(
            1,
            "no tag matches --semver \"*\" and --tag-filter \"^stable-\"",
        )
    });
    assert!(
        run.stderr.contains("(3 tags, 0 of them versions)"),
        "{}",
        run.stderr
    );
}

#[test]
fn no_matching_tag_is_one_line_and_writes_nothing() {
    if !tools() {
        return;
    }
    let f = Fixture::new();
    let layout = f.path("layout");
    add_images(
        &layout,
        &["latest", "1.0.0", "1.1.0", "v1.2.0", "2.0.0-rc.1"],
        "",
    );
    let reg = Fake::start(&layout);
    let run = f.unchanged_by(|| {
        sync(&f, &["--semver", ">=2.0.0"], &reg.source())
            .fails(1, "no tag matches --semver \">=2.0.0\"")
    });
    assert!(
        run.stderr.contains(
            "(5 tags, 4 of them versions; the highest: 2.0.0-rc.1, v1.2.0, 1.1.0, 1.0.0)"
        ),
        "{}",
        run.stderr
    );
    assert!(!f.state().exists(), "no state directory was made");
}

#[test]
fn absolute_links_are_followed_and_a_link_to_another_host_is_refused() {
    if !tools() {
        return;
    }
    let f = Fixture::new();
    let layout = f.path("layout");
    add_images(&layout, &["1.0.0", "1.1.0", "1.2.0", "1.3.0", "1.4.0"], "");
    let reg = Fake::start(&layout);
    reg.set(|s| s.links = Links::Absolute);
    sync(&f, &["--semver", "1.x"], &reg.source()).ok();
    assert_eq!(tree(&f.dest()), ["v=1.4.0"]);
    assert_eq!(reg.listings().len(), 3, "three pages");

    reg.set(|s| s.links = Links::Elsewhere);
    add_images(&layout, &["1.5.0"], "");
    f.unchanged_by(|| {
        sync(&f, &["--semver", "1.x"], &reg.source())
            .fails(1, "the tag list's Link points at another host (127.0.0.2:")
    });
    // Only the first page was asked for: the link elsewhere was not followed.
    assert_eq!(reg.listings().len(), 1);
}

#[test]
fn a_new_release_is_followed_and_an_older_one_refused() {
    if !tools() {
        return;
    }
    let f = Fixture::new();
    let layout = f.path("layout");
    add_images(&layout, &["1.0.0", "1.1.0"], "");
    let reg = Fake::start(&layout);
    let src = reg.source();
    sync(&f, &["--semver", "^1"], &src).ok();
    assert_eq!(tree(&f.dest()), ["v=1.1.0"]);

    // A new release: the next sync moves to it.
    add_images(&layout, &["1.2.0"], "");
    sync(&f, &["--semver", "^1"], &src).ok();
    assert_eq!(tree(&f.dest()), ["v=1.2.0"]);
    assert_eq!(live(&f).0, "1.2.0");

    // The same listing again: up to date, nothing written.
    let again = f.unchanged_by(|| sync(&f, &["--semver", "^1"], &src).ok());
    assert!(again.stdout.contains("up to date"), "{}", again.stdout);

    // A new tag on the live image: a new generation labelled with it, and
    // no layer fetched (the live generation has them all).
    let index = layout.join("index.json");
    let mut doc: serde_json::Value = serde_json::from_slice(&fs::read(&index).unwrap()).unwrap();
    let ms = doc["manifests"].as_array_mut().unwrap();
    let mut alias = ms
        .iter()
        .find(|d| d["annotations"]["org.opencontainers.image.ref.name"] == "1.2.0")
        .unwrap()
        .clone();
    alias["annotations"]["org.opencontainers.image.ref.name"] = "1.2.1".into();
    ms.push(alias);
    fs::write(&index, doc.to_string()).unwrap();
    reg.set(|s| s.requests.clear());
    sync(&f, &["--semver", "^1"], &src).ok();
    assert_eq!(tree(&f.dest()), ["v=1.2.0"]);
    let (label, sources) = live(&f);
    assert_eq!(label, "1.2.1");
    assert!(sources[0].contains(":1.2.1@sha256:"), "{sources:?}");
    let asked = reg.state.lock().unwrap().requests.clone();
    assert!(!asked.iter().any(|r| r.contains("/blobs/")), "{asked:?}");
    reg.set(|s| s.hidden.push("1.2.1".into()));

    // A registry mirror behind: 1.2.0 is not listed, 1.1.0 is the highest
    // it has. A replica syncing from it must not put 1.1.0 back.
    reg.set(|s| s.hidden = vec!["1.2.0".into(), "1.2.1".into()]);
    f.unchanged_by(|| {
        sync(&f, &["--semver", "^1"], &src).fails(3, "refusing to replace live generation")
    });
    // The operator moved the range below the live version on purpose: the
    // range says so, and the older tag is published.
    sync(&f, &["--semver", "<1.2.0"], &src).ok();
    assert_eq!(tree(&f.dest()), ["v=1.1.0"]);
    // --allow-downgrade lets any range go below.
    reg.set(|s| s.hidden = vec!["1.1.0".into(), "1.2.0".into(), "1.2.1".into()]);
    sync(&f, &["--semver", "^1", "--allow-downgrade"], &src).ok();
    assert_eq!(tree(&f.dest()), ["v=1.0.0"]);
}

#[test]
fn the_sidecar_follows_new_releases() {
    if !tools() {
        return;
    }
    let f = Fixture::new();
    let layout = f.path("layout");
    add_images(&layout, &["1.0.0"], "");
    let reg = Fake::start(&layout);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let bind = format!("127.0.0.1:{port}");
    let src = reg.source();
    let child = f.spawn(&[
        "sync",
        "--grace",
        "0",
        "--every",
        "200ms",
        "--json",
        "--http-bind",
        &bind,
        "--semver",
        "1.x",
        &src,
        "vol/packs",
    ]);
    let mut child = Helper(child);
    let now = || fs::read_to_string(f.dest().join("v")).unwrap_or_default();
    wait_for(20, "the first release", || now() == "1.0.0");
    add_images(&layout, &["1.1.0", "2.0.0"], "");
    wait_for(20, "the new release", || now() == "1.1.0");
    let chosen = format!("packsync_source_info{{source=\"{src}\",tag=\"1.1.0\",digest=\"sha256:");
    wait_for(10, "the metric", || {
        let m = get(port, "/metrics");
        m.contains(&chosen) && m.contains("label=\"1.1.0\"")
    });
    // SIGTERM, not a kill: the loop ends after the round it is in has
    // printed its line (the metrics change before the line is written).
    let pid = rustix::process::Pid::from_child(&child.0);
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let _ = child.0.wait();
    let mut out = String::new();
    child
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let (lines, _) = json_lines(&out);
    let moved = lines
        .iter()
        .find(|l| l["label"] == "1.1.0")
        .unwrap_or_else(|| panic!("no round line for 1.1.0: {out}"));
    assert_eq!(moved["status"], "synced");
    assert_eq!(moved["chosen"][0]["tag"], "1.1.0", "{moved}");
    assert_eq!(moved["chosen"][0]["source"], src.as_str(), "{moved}");
}

/// `GET path` from the sidecar's HTTP server: the body.
fn get(port: u16, path: &str) -> String {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes());
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn a_layout_with_several_tags() {
    if !tools() {
        return;
    }
    let f = Fixture::new();
    let layout = f.path("layout");
    let digests = add_images(&layout, &["1.9.0", "v1.10.0", "2.0.0-beta.1", "edge"], "");
    let src = format!("oci-layout:{}", layout.display());
    sync(&f, &["--semver", ">=1.0"], &src).ok();
    assert_eq!(tree(&f.dest()), ["v=v1.10.0"]);
    let (label, sources) = live(&f);
    assert_eq!(label, "v1.10.0");
    let canon = fs::canonicalize(&layout).unwrap();
    assert_eq!(
        sources,
        [format!(
            "oci-layout:{}:v1.10.0@{}",
            canon.display(),
            digests["v1.10.0"]
        )]
    );
}

#[test]
fn bad_ranges_filters_and_references_are_usage_errors() {
    let f = Fixture::new();
    let reg = "oci://127.0.0.1:9/app";
    for (extra, src, needle) in [
        (
            vec!["--semver", ">= bar"],
            reg.to_string(),
            "invalid value \">= bar\" for --semver: expected a version",
        ),
        (
            vec!["--semver", "1.x", "--tag-filter", "(["],
            reg.to_string(),
            "invalid value \"([\" for --tag-filter",
        ),
        (
            vec!["--tag-filter", "x"],
            reg.to_string(),
            "--tag-filter needs --semver",
        ),
        (
            vec!["--semver", "1.x"],
            format!("{reg}:1.0.0"),
            "--semver chooses the tag",
        ),
        (
            vec!["--semver", "1.x"],
            format!("{reg}@sha256:{}", "a".repeat(64)),
            "--semver chooses the tag",
        ),
        (
            vec!["--semver", "1.x"],
            "oci-layout:/nowhere:1.0".into(),
            "--semver chooses the tag",
        ),
        (
            vec!["--semver", "1.x"],
            "src".into(),
            "--semver needs an oci:// or oci-layout: SOURCE",
        ),
    ] {
        let mut args = vec!["sync", "--grace", "0"];
        args.extend(extra.iter().copied());
        args.extend([src.as_str(), "vol/packs"]);
        f.refused(&args, 2, needle);
    }
}

#[test]
fn label_auto_takes_the_image_version() {
    if !tools() {
        return;
    }
    let f = Fixture::new();
    let layout = f.path("layout");
    add_images(
        &layout,
        &["annotated"],
        r#","annotations":{"org.opencontainers.image.version":"2.3.0"},"labels":{"org.opencontainers.image.version":"9.9.9"}"#,
    );
    add_images(
        &layout,
        &["labelled"],
        r#","labels":{"org.opencontainers.image.version":"v2.4.0"}"#,
    );
    add_images(
        &layout,
        &["older"],
        r#","annotations":{"org.opencontainers.image.version":"2.2.0"}"#,
    );
    add_images(&layout, &["none"], "");
    let at = |tag: &str| format!("oci-layout:{}:{tag}", layout.display());
    // The manifest's annotation wins over the config's label.
    sync(&f, &["--label", "auto"], &at("annotated")).ok();
    assert_eq!(live(&f).0, "2.3.0");
    // Without the annotation: the config's label.
    sync(&f, &["--label", "auto"], &at("labelled")).ok();
    assert_eq!(live(&f).0, "v2.4.0");
    // The guard orders what the content says.
    f.unchanged_by(|| {
        sync(&f, &["--label", "auto"], &at("older")).fails(3, "labelled v2.4.0 with older 2.2.0")
    });
    // No version anywhere: one line naming the source.
    f.unchanged_by(|| {
        sync(&f, &["--label", "auto"], &at("none"))
            .fails(1, &format!("--label auto: no version in {}", at("none")))
    });
    // From a registry too, with --semver choosing the tag.
    let g = Fixture::new();
    let reg_layout = g.path("layout");
    add_images(
        &reg_layout,
        &["1.0.0"],
        r#","labels":{"org.opencontainers.image.version":"1.0.0+build.7"}"#,
    );
    let reg = Fake::start(&reg_layout);
    sync(&g, &["--label", "auto", "--semver", "1.x"], &reg.source()).ok();
    assert_eq!(live(&g).0, "1.0.0+build.7");
}

#[test]
fn label_auto_takes_a_bundles_manifest_revision() {
    let f = Fixture::new();
    f.file("policy.rego", "package x\n");
    f.file(".manifest", r#"{"revision": "1.7.0", "roots": ["x"]}"#);
    f.sync(&["--label", "auto"]).ok();
    assert_eq!(live(&f).0, "1.7.0");
    f.file(".manifest", r#"{"revision": "1.6.0", "roots": ["x"]}"#);
    f.sync_refused(&["--label", "auto"], 3, "labelled 1.7.0 with older 1.6.0");
    f.file(".manifest", r#"{"revision": "deadbeef"}"#);
    f.sync_refused(
        &["--label", "auto"],
        1,
        "names the version \"deadbeef\", which is not a version",
    );
    f.file(".manifest", r#"{"roots": ["x"]}"#);
    f.sync_refused(&["--label", "auto"], 1, "--label auto: no version in src");
    f.file(".manifest", "not json");
    f.sync_refused(&["--label", "auto"], 1, "src/.manifest: not JSON");
    fs::remove_file(f.src().join(".manifest")).unwrap();
    f.sync_refused(&["--label", "auto"], 1, "--label auto: no version in src");
}

/// A real docker-registry on a free port, its storage in a temporary directory.
fn real_registry() -> Option<(Helper, u16, tempfile::TempDir)> {
    if !have(&["docker-registry", "skopeo", "python3"]) {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let conf = dir.path().join("config.yml");
    fs::write(
        &conf,
        format!(
            "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: false\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let log = fs::File::create(dir.path().join("log")).unwrap();
    let child = Command::new("docker-registry")
        .arg("serve")
        .arg(&conf)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let helper = Helper(child);
    wait_for(20, "the registry to answer", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    Some((helper, port, dir))
}

#[test]
fn a_real_registry_lists_its_tags_two_at_a_time() {
    if !cfg!(feature = "fault-injection") {
        crate::fixture::skip(
            "the real registry's pages: needs --features fault-injection (PACKSYNC_TEST_TAGS_PAGE)",
        );
        return;
    }
    let Some((_reg, port, dir)) = real_registry() else {
        return;
    };
    let f = Fixture::new();
    let layout = f.path("layout");
    let tags = ["0.9.0", "1.0.0", "v1.1.0", "1.2.0-rc.1", "latest"];
    add_images(&layout, &tags, "");
    for t in tags {
        let out = Command::new("skopeo")
            .args(["copy", "-q", "--dest-tls-verify=false"])
            .arg(format!("oci:{}:{t}", layout.display()))
            .arg(format!("docker://127.0.0.1:{port}/app:{t}"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "skopeo: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut c = f.command(&[
        "sync",
        "--grace",
        "0",
        "--semver",
        "<2",
        &format!("oci://127.0.0.1:{port}/app"),
        "vol/packs",
    ]);
    c.env("PACKSYNC_TEST_TAGS_PAGE", "2");
    let run = crate::fixture::Run::from(c.output().unwrap());
    let run = run.ok();
    assert_eq!(tree(&f.dest()), ["v=v1.1.0"], "{}", run.stderr);
    // Debian's docker-registry (distribution 2.8) lists every tag on one
    // page whatever `n` says; distribution 3 pages by `n` and `last` with
    // Link headers: three pages of five tags two at a time. Either way,
    // every request after the first follows a Link (it carries `last`).
    let log = fs::read_to_string(dir.path().join("log")).unwrap();
    let listed: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("GET /v2/app/tags/list") && l.contains("packsync/"))
        .collect();
    assert!(listed[0].contains("n=2"), "{listed:#?}");
    assert!(listed.len() == 1 || listed.len() == 3, "{listed:#?}");
    assert!(
        listed.iter().skip(1).all(|l| l.contains("last=")),
        "{listed:#?}"
    );
}

/// An OPA bundle as a gzip tar at `path`: a policy and a `.manifest` with `revision`.
fn bundle(path: &Path, revision: &str) {
    let code = r#"
import io, json, sys, tarfile
path, rev = sys.argv[1], sys.argv[2]
with tarfile.open(path, "w:gz") as t:
    for name, text in [("policy.rego", "package x\n"), (".manifest", json.dumps({"revision": rev, "roots": ["x"]}))]:
        data = text.encode()
        ti = tarfile.TarInfo(name)
        ti.size, ti.mtime = len(data), 1700000000
        t.addfile(ti, io.BytesIO(data))
"#;
    let ok = Command::new("python3")
        .args(["-c", code])
        .arg(path)
        .arg(revision)
        .status()
        .unwrap()
        .success();
    assert!(ok, "writing the bundle failed");
}

#[test]
fn label_auto_reads_an_archives_and_a_urls_manifest_revision() {
    if !tools() {
        return;
    }
    let f = Fixture::new();
    let archive = f.path("bundle.tar.gz");
    bundle(&archive, "v3.1.0");
    let src = archive.display().to_string();
    sync(&f, &["--label", "auto"], &src).ok();
    assert_eq!(live(&f).0, "v3.1.0");
    // The same archive again: up to date, nothing written.
    let again = f.unchanged_by(|| sync(&f, &["--label", "auto", "--json"], &src).ok());
    let again: serde_json::Value = serde_json::from_str(&again.stdout).unwrap();
    assert_eq!(again["status"], "up to date");
    assert_eq!(
        again["label"], "v3.1.0",
        "the live label, not fetched again"
    );
    bundle(&archive, "v3.0.9");
    f.unchanged_but_staging(|| {
        sync(&f, &["--label", "auto"], &src).fails(3, "labelled v3.1.0 with older v3.0.9")
    });
    bundle(&archive, "v3.2.0");
    sync(&f, &["--label", "auto"], &src).ok();
    assert_eq!(live(&f).0, "v3.2.0");

    // Over http(s)://: the bundle OPA's bundle servers hand out.
    let g = Fixture::new();
    let dir = g.path("served");
    fs::create_dir(&dir).unwrap();
    bundle(&dir.join("bundle.tar.gz"), "2024.05.01");
    let server = Fake::start(&dir);
    let url = format!("http://127.0.0.1:{}/bundle.tar.gz", server.port);
    sync(&g, &["--label", "auto"], &url).ok();
    assert_eq!(live(&g).0, "2024.05.01");
    assert!(tree(&g.dest()).contains(&"policy.rego=package x\n".to_string()));
}

#[test]
fn label_auto_with_several_sources_takes_the_first_that_names_a_version() {
    if !tools() {
        return;
    }
    let f = Fixture::new();
    f.file("extra.txt", "no manifest here");
    let archive = f.path("bundle.tar.gz");
    bundle(&archive, "1.4.0");
    let other = f.path("other.tar.gz");
    bundle(&other, "9.0.0");
    let (a, o) = (archive.display().to_string(), other.display().to_string());
    f.packsync(&[
        "sync",
        "--grace",
        "0",
        "--label",
        "auto",
        "src",
        &a,
        &o,
        "vol/packs",
    ])
    .ok();
    assert_eq!(
        live(&f).0,
        "1.4.0",
        "src names none; the first archive's wins"
    );
}
