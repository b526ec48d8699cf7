//! OCI artifacts as SOURCE: manifests written by the test into OCI layouts
//! (what `oras push` makes: layers titled by `org.opencontainers.image.title`,
//! of any media type; an OPA bundle as a tar+gzip layer), synced from
//! `oci-layout:`. Checked as a user would: the files and their bytes, what
//! `--layer-media-type` picks, the refusals (exit 1, one line, the volume
//! as it was), a re-sync up to date.
//!
//! Needs python3; without it each test is skipped with one line.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use crate::fixture::Fixture;
use crate::source_oci::have;

/// Writes an OCI layout holding one manifest tagged `tag` (stdin: JSON):
/// `layers`: each `{"mediaType", "title"?, "annotations"?, "data"}` (the
/// blob's bytes) or `{"mediaType", "tar": [{"name", "data"}]}` (a tar+gzip
/// of those files); `annotations` of the manifest; `config` media type.
/// Prints the manifest's digest.
const ARTIFACT_PY: &str = r#"
import gzip, hashlib, io, json, os, sys, tarfile
spec = json.load(sys.stdin)
root = spec["dir"]
os.makedirs(os.path.join(root, "blobs", "sha256"), exist_ok=True)
def put(data, mt):
    d = hashlib.sha256(data).hexdigest()
    open(os.path.join(root, "blobs", "sha256", d), "wb").write(data)
    return {"mediaType": mt, "digest": "sha256:" + d, "size": len(data)}
layers = []
for l in spec["layers"]:
    if "tar" in l:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
            for e in l["tar"]:
                data = e["data"].encode()
                ti = tarfile.TarInfo(e["name"]); ti.size = len(data); ti.mtime = 1700000000; ti.mode = 0o644
                t.addfile(ti, io.BytesIO(data))
        data = gzip.compress(buf.getvalue(), mtime=0)
    else:
        data = l["data"].encode()
    d = put(data, l["mediaType"])
    ann = dict(l.get("annotations", {}))
    if "title" in l:
        ann["org.opencontainers.image.title"] = l["title"]
    if ann:
        d["annotations"] = ann
    layers.append(d)
cfg = put(b"{}", spec.get("config", "application/vnd.oci.image.config.v1+json"))
m = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "config": cfg, "layers": layers}
if spec.get("annotations"):
    m["annotations"] = spec["annotations"]
md = put(json.dumps(m).encode(), "application/vnd.oci.image.manifest.v1+json")
md["annotations"] = {"org.opencontainers.image.ref.name": spec["tag"]}
index = {"schemaVersion": 2, "manifests": [md]}
# Published as a registry does: whole, by rename (a sidecar may be
# reading the index while this runs).
with open(os.path.join(root, "index.json.tmp"), "w") as tmp:
    json.dump(index, tmp)
os.replace(os.path.join(root, "index.json.tmp"), os.path.join(root, "index.json"))
open(os.path.join(root, "oci-layout"), "w").write('{"imageLayoutVersion": "1.0.0"}')
print(md["digest"])
"#;

/// Write the layout `dir` (replacing its index) from `layers` and the
/// manifest's `annotations` (JSON); the manifest digest.
fn artifact(dir: &Path, layers: &str, annotations: &str) -> String {
    let spec = format!(
        r#"{{"dir":{:?},"tag":"1.0","layers":{layers},"annotations":{annotations}}}"#,
        dir.display().to_string()
    );
    let out = crate::fixture::python(ARTIFACT_PY, &spec, "writing the layout");
    String::from_utf8(out).unwrap().trim().to_string()
}

/// `path=content` of every file below `root`, `dir/` for directories, sorted.
fn tree(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            if p.is_dir() {
                out.push(format!("{rel}/"));
                walk(root, &p, out);
            } else {
                out.push(format!(
                    "{rel}={}",
                    String::from_utf8_lossy(&fs::read(&p).unwrap())
                ));
            }
        }
    }
    walk(root, root, &mut out);
    out.sort();
    out
}

const TGZ: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

#[test]
fn titled_blobs_land_as_files_and_a_resync_is_up_to_date() {
    if !have(&["python3"]) {
        return;
    }
    let f = Fixture::new();
    let layout = f.path("layout");
    // A gzip blob that is a file, not a layer: its bytes stay as they are.
    let digest = artifact(
        &layout,
        r#"[{"mediaType":"application/vnd.example.policy+yaml","title":"policy.yaml","data":"allow: true\n"},
            {"mediaType":"text/plain","title":"docs/README.txt","data":"read me"}]"#,
        r#"{"org.opencontainers.image.created":"2023-11-14T22:13:20Z"}"#,
    );
    let src = format!("oci-layout:{}:1.0", layout.display());
    f.packsync(&["sync", &src, "vol/packs"]).ok();
    assert_eq!(
        tree(&f.dest()),
        [
            "docs/",
            "docs/README.txt=read me",
            "policy.yaml=allow: true\n"
        ]
    );
    let m = fs::metadata(f.dest().join("policy.yaml")).unwrap();
    assert_eq!((m.mode() & 0o7777, m.mtime()), (0o644, 1_700_000_000));
    let status = f.packsync(&["status", "--json", "vol/packs"]).ok();
    assert!(status.stdout.contains(&digest), "{}", status.stdout);

    let again = f.packsync(&["sync", &src, "vol/packs"]).ok();
    assert!(again.stdout.contains("up to date"), "{}", again.stdout);
}

#[test]
fn a_title_that_leaves_the_tree_is_refused_and_nothing_changes() {
    if !have(&["python3"]) {
        return;
    }
    let f = Fixture::new();
    let layout = f.path("layout");
    artifact(
        &layout,
        r#"[{"mediaType":"text/plain","title":"a.txt","data":"a"}]"#,
        "{}",
    );
    let src = format!("oci-layout:{}:1.0", layout.display());
    f.packsync(&["sync", &src, "vol/packs"]).ok();
    for bad in ["../escape.txt", "/etc/evil", "ok/../../x"] {
        artifact(
            &layout,
            &format!(r#"[{{"mediaType":"text/plain","title":"{bad}","data":"x"}}]"#),
            "{}",
        );
        f.refused(&["sync", &src, "vol/packs"], 1, "layer 1 (sha256:");
    }
    assert!(!f.path("vol/escape.txt").exists() && !f.path("escape.txt").exists());
    assert_eq!(tree(&f.dest()), ["a.txt=a"]);
}

#[test]
fn an_opa_bundle_layer_lands_as_the_bundles_files() {
    if !have(&["python3"]) {
        return;
    }
    let f = Fixture::new();
    let layout = f.path("layout");
    // What `oras push` of an OPA bundle writes: the tarball titled, beside
    // a README of another type.
    artifact(
        &layout,
        &format!(
            r#"[{{"mediaType":"{TGZ}","title":"bundle.tar.gz","tar":[
                  {{"name":"/.manifest","data":"{{\"revision\":\"7\"}}"}},
                  {{"name":"/authz/policy.rego","data":"package authz"}},
                  {{"name":"/data.json","data":"{{}}"}}]}},
                {{"mediaType":"text/markdown","title":"README.md","data":"notes"}}]"#
        ),
        "{}",
    );
    let src = format!("oci-layout:{}:1.0", layout.display());
    f.packsync(&["sync", "--layer-media-type", TGZ, &src, "vol/packs"])
        .ok();
    assert_eq!(
        tree(&f.dest()),
        [
            ".manifest={\"revision\":\"7\"}",
            "authz/",
            "authz/policy.rego=package authz",
            "data.json={}"
        ]
    );
    let again = f
        .packsync(&["sync", "--layer-media-type", TGZ, &src, "vol/packs"])
        .ok();
    assert!(again.stdout.contains("up to date"), "{}", again.stdout);

    // Without the selection the same manifest is its two titled files:
    // another tree, another generation.
    let whole = f.packsync(&["sync", &src, "vol/packs"]).ok();
    assert!(!whole.stdout.contains("up to date"), "{}", whole.stdout);
    let names: Vec<String> = tree(&f.dest())
        .into_iter()
        .map(|l| l.split('=').next().unwrap().to_string())
        .collect();
    assert_eq!(names, ["README.md", "bundle.tar.gz"]);
}

#[test]
fn a_mixed_manifest_with_a_selection_publishes_only_those_layers() {
    if !have(&["python3"]) {
        return;
    }
    let f = Fixture::new();
    let layout = f.path("layout");
    artifact(
        &layout,
        &format!(
            r#"[{{"mediaType":"text/plain","title":"one.txt","data":"1"}},
                {{"mediaType":"{TGZ}","tar":[{{"name":"packs/core.yaml","data":"core"}}]}},
                {{"mediaType":"application/x.foo","title":"two.foo","data":"2"}},
                {{"mediaType":"text/plain","title":"three.txt","data":"3"}}]"#
        ),
        "{}",
    );
    let src = format!("oci-layout:{}:1.0", layout.display());
    f.packsync(&[
        "sync",
        "--layer-media-type",
        "text/plain",
        &src,
        "vol/packs",
    ])
    .ok();
    assert_eq!(tree(&f.dest()), ["one.txt=1", "three.txt=3"]);
    // The environment's newline-separated list, as other repeatable flags.
    let mut c = f.command(&["sync", &src, "vol/other"]);
    c.env(
        "PACKSYNC_LAYER_MEDIA_TYPE",
        format!("application/x.foo\n{TGZ}"),
    );
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        tree(&f.path("vol/other")),
        ["packs/", "packs/core.yaml=core", "two.foo=2"]
    );
}

#[test]
fn nothing_publishable_lists_the_media_types() {
    if !have(&["python3"]) {
        return;
    }
    let f = Fixture::new();
    let layout = f.path("layout");
    artifact(
        &layout,
        r#"[{"mediaType":"application/x.foo","data":"a"},{"mediaType":"application/x.foo","data":"b"},
            {"mediaType":"application/vnd.bar","data":"c"}]"#,
        "{}",
    );
    let src = format!("oci-layout:{}:1.0", layout.display());
    let run = f.packsync(&["sync", &src, "vol/packs"]).fails(
        1,
        "nothing to publish: layers are application/x.foo (2), application/vnd.bar; use --layer-media-type",
    );
    assert!(run.stderr.contains(&src), "{}", run.stderr);
    assert!(!f.path("vol/packs").exists());
    f.packsync(&["sync", "--layer-media-type", TGZ, &src, "vol/packs"])
        .fails(1, &format!("no layer is of --layer-media-type {TGZ}"));
    assert!(!f.path("vol/packs").exists());
    f.packsync(&[
        "sync",
        "--layer-media-type",
        "not a type",
        &src,
        "vol/packs",
    ])
    .fails(2, "--layer-media-type");
}

#[test]
fn an_opa_bundle_pushed_to_a_registry_is_one_oci_source() {
    if !have(crate::source_oci::TOOLS) {
        return;
    }
    let reg = crate::source_oci::Registry::start(crate::source_oci::Auth::None);
    let host = reg.host();
    let f = Fixture::new();
    let layout = f.path("layout");
    let digest = artifact(
        &layout,
        &format!(
            r#"[{{"mediaType":"{TGZ}","title":"bundle.tar.gz","tar":[
                  {{"name":"/.manifest","data":"{{\"revision\":\"r1\"}}"}},
                  {{"name":"/authz/policy.rego","data":"package authz"}}]}},
                {{"mediaType":"text/markdown","title":"README.md","data":"notes"}}]"#
        ),
        r#"{"org.opencontainers.image.created":"2024-01-02T03:04:05Z"}"#,
    );
    let repo = "packsync-tests/artifacts";
    let pushed = Command::new("skopeo")
        .args([
            "copy",
            "--quiet",
            "--dest-tls-verify=false",
            "--preserve-digests",
        ])
        .arg(format!("oci:{}:1.0", layout.display()))
        .arg(format!("docker://{host}/{repo}:1.0"))
        .output()
        .unwrap();
    assert!(
        pushed.status.success(),
        "skopeo copy: {}",
        String::from_utf8_lossy(&pushed.stderr)
    );
    let src = format!("oci://{host}/{repo}:1.0");
    let args = [
        "sync",
        "--insecure-registry",
        &host,
        "--layer-media-type",
        TGZ,
    ];
    let mut sync = args.to_vec();
    sync.extend([src.as_str(), "vol/packs"]);
    f.packsync(&sync).ok();
    assert_eq!(
        tree(&f.dest()),
        [
            ".manifest={\"revision\":\"r1\"}",
            "authz/",
            "authz/policy.rego=package authz"
        ]
    );
    let status = f.packsync(&["status", "--json", "vol/packs"]).ok();
    assert!(status.stdout.contains(&digest), "{}", status.stdout);
    let again = f.packsync(&sync).ok();
    assert!(again.stdout.contains("up to date"), "{}", again.stdout);

    // The same artifact without the selection: its two titled files.
    let mut whole = vec!["sync", "--insecure-registry", &host, &src];
    whole.push("vol/files");
    f.packsync(&whole).ok();
    let m = fs::metadata(f.path("vol/files/README.md")).unwrap();
    assert_eq!((m.mode() & 0o7777, m.mtime()), (0o644, 1_704_164_645));
    assert_eq!(fs::read(f.path("vol/files/README.md")).unwrap(), b"notes");
}

#[test]
fn an_oras_directory_layer_unpacks_below_its_title_only() {
    if !have(&["python3"]) {
        return;
    }
    let f = Fixture::new();
    let layout = f.path("layout");
    let dir = |entries: &str| {
        format!(
            r#"[{{"mediaType":"{TGZ}","title":"keys","annotations":{{"io.deis.oras.content.unpack":"true"}},"tar":[{entries}]}},
                {{"mediaType":"text/plain","title":"top.txt","data":"top"}}]"#
        )
    };
    artifact(
        &layout,
        &dir(r#"{"name":"keys/a.pub","data":"A"},{"name":"keys/sub/b.pub","data":"B"}"#),
        "{}",
    );
    let src = format!("oci-layout:{}:1.0", layout.display());
    f.packsync(&["sync", &src, "vol/packs"]).ok();
    assert_eq!(
        tree(&f.dest()),
        [
            "keys/",
            "keys/a.pub=A",
            "keys/sub/",
            "keys/sub/b.pub=B",
            "top.txt=top"
        ]
    );
    // An entry outside the title: refused, the live tree stays.
    artifact(
        &layout,
        &dir(r#"{"name":"keys/a.pub","data":"A2"},{"name":"other/evil","data":"x"}"#),
        "{}",
    );
    f.unchanged_but_staging(|| {
        f.packsync(&["sync", &src, "vol/packs"])
            .fails(1, "entry other/evil is not below keys")
    });
    assert_eq!(tree(&f.dest())[1], "keys/a.pub=A");
}
