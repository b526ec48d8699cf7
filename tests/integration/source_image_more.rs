//! Images and archives as the container runtime sees them: an archive
//! re-synced unchanged is up to date without being unpacked (and drift is
//! still repaired), `--platform` matches index entries as containerd does,
//! the layer shortcut holds when a new layer rewrites one member of a
//! hardlink group, and `oci-archive:`/`docker-archive:` FILEs are image
//! sources. Every archive and layout is written by the test itself
//! (python3's tarfile and the layout writer of `source_oci`).

use std::fs;
use std::io::Write;
use std::process::{Command, Stdio};

use crate::fixture::{json, links, Fixture};
use crate::source_oci::{have, tree};

/// A tar of `entries` (`{"name", "type": file|dir|hardlink|symlink,
/// "data", "target"}` as JSON), gzip-compressed when `gz`.
fn tar_of(entries: &str, gz: bool) -> Vec<u8> {
    let script = r#"
import gzip, io, json, sys, tarfile
out = io.BytesIO()
with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as t:
    for e in json.load(sys.stdin):
        i = tarfile.TarInfo(e["name"])
        i.mtime = e.get("mtime", 1700000000)
        kind = e.get("type", "file")
        i.mode = 0o755 if kind == "dir" else 0o644
        if kind == "dir":
            i.type = tarfile.DIRTYPE
            t.addfile(i)
        elif kind in ("hardlink", "symlink"):
            i.type = tarfile.LNKTYPE if kind == "hardlink" else tarfile.SYMTYPE
            i.linkname = e["target"]
            t.addfile(i)
        else:
            data = e.get("data", "").encode()
            i.size = len(data)
            t.addfile(i, io.BytesIO(data))
raw = out.getvalue()
sys.stdout.buffer.write(gzip.compress(raw, mtime=0) if sys.argv[1] == "1" else raw)
"#;
    let mut child = Command::new("python3")
        .args(["-c", script, if gz { "1" } else { "0" }])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(entries.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "python3 tarfile failed");
    out.stdout
}

/// `packsync sync --grace 0 --json --itemize SOURCE vol/packs`.
fn sync_json(f: &Fixture, source: &str) -> serde_json::Value {
    let run = f
        .packsync(&[
            "sync",
            "--grace",
            "0",
            "--json",
            "--itemize",
            source,
            "vol/packs",
        ])
        .ok();
    json(&run)
}

#[test]
fn an_unchanged_archive_is_up_to_date_without_unpacking_and_drift_is_repaired() {
    if !have(&["python3"]) {
        return;
    }
    let f = Fixture::new();
    let entries = r#"[{"name":"app","type":"dir"},
        {"name":"app/a.py","data":"a = 1\n"},{"name":"app/b.py","data":"b = 2\n"},
        {"name":"app/b-link.py","type":"hardlink","target":"app/b.py"},
        {"name":"app/latest","type":"symlink","target":"a.py"}]"#;
    fs::write(f.path("bundle.tar.gz"), tar_of(entries, true)).unwrap();
    let first = sync_json(&f, "bundle.tar.gz");
    assert_eq!(first["status"], "synced", "{first}");
    let want = tree(&f.dest());
    let want_links = links(&f.dest());
    assert_eq!(want_links.len(), 1, "{want_links:?}");

    // The same bytes again: up to date, nothing copied, and nothing written
    // on the volume at all (no spool made in a staging directory), even
    // with the archive's own mtime moved.
    let archive = f.path("bundle.tar.gz");
    crate::fixture::set_mtime(&archive, 1_800_000_000, 0);
    let again = f.unchanged_by(|| {
        f.packsync(&[
            "sync",
            "--grace",
            "0",
            "--json",
            "--itemize",
            "bundle.tar.gz",
            "vol/packs",
        ])
        .ok()
    });
    let again = json(&again);
    assert_eq!(again["status"], "up to date", "{again}");
    assert_eq!(again["copied"], 0, "{again}");
    assert_eq!(again["changes"], serde_json::json!([]), "{again}");

    // Drift: a live file edited in place is repaired by the same archive.
    let live = fs::canonicalize(f.dest()).unwrap();
    fs::write(live.join("app/a.py"), "edited in the live tree\n").unwrap();
    let repaired = sync_json(&f, "bundle.tar.gz");
    assert_eq!(repaired["status"], "synced", "{repaired}");
    assert_eq!(tree(&f.dest()), want);
    assert_eq!(links(&f.dest()), want_links);
    assert_eq!(sync_json(&f, "bundle.tar.gz")["status"], "up to date");

    // The same archive, another //PATH: another tree, not up to date.
    let sub = sync_json(&f, "bundle.tar.gz//app");
    assert_eq!(sub["status"], "synced", "{sub}");
    assert!(f.dest().join("a.py").exists());
    assert_eq!(sync_json(&f, "bundle.tar.gz//app")["status"], "up to date");
    let whole = sync_json(&f, "bundle.tar.gz");
    assert_eq!(whole["status"], "synced", "{whole}");
    assert_eq!(tree(&f.dest()), want);

    // Other bytes under the same name: published.
    let changed = entries.replace("a = 1", "a = 3");
    fs::write(&archive, tar_of(&changed, true)).unwrap();
    let next = sync_json(&f, "bundle.tar.gz");
    assert_eq!(next["status"], "synced", "{next}");
    assert_eq!(
        fs::read_to_string(f.dest().join("app/a.py")).unwrap(),
        "a = 3\n"
    );
}

/// One image per platform, each a single file naming it, under tag `multi`.
fn multi_platform(platforms: &[(&str, &str, Option<&str>)]) -> String {
    let images: Vec<String> = platforms
        .iter()
        .map(|(os, arch, variant)| {
            let v = variant.map_or(String::new(), |v| format!(r#","variant":"{v}""#));
            let name = format!("{os}-{arch}-{}", variant.unwrap_or("none"));
            format!(
                r#"{{"os":"{os}","arch":"{arch}"{v},"layers":[{{"compression":"gzip","entries":[{{"name":"platform","data":"{name}"}}]}}]}}"#
            )
        })
        .collect();
    format!(r#"[{{"tag":"multi","platforms":[{}]}}]"#, images.join(","))
}

#[test]
fn platform_variants_match_as_containerd_matches_them() {
    if !have(&["python3"]) {
        return;
    }
    let f = Fixture::new();
    let layout = f.path("layout");
    // What `buildah manifest add` writes: arm64 without a variant; arm/v6
    // listed before arm/v7.
    crate::source_oci::write_layout(
        &layout,
        &multi_platform(&[
            ("linux", "amd64", None),
            ("linux", "arm64", None),
            ("linux", "arm", Some("v6")),
            ("linux", "arm", Some("v7")),
        ]),
        "multi",
    );
    let src = format!("oci-layout:{}:multi", layout.display());
    for (i, (asked, want)) in [
        ("linux/arm64/v8", "linux-arm64-none"),
        ("linux/arm64", "linux-arm64-none"),
        ("linux/arm", "linux-arm-v7"),
        ("linux/arm/v6", "linux-arm-v6"),
    ]
    .into_iter()
    .enumerate()
    {
        let dest = format!("vol/p{i}");
        f.packsync(&["sync", "--grace", "0", "--platform", asked, &src, &dest])
            .ok();
        assert_eq!(
            tree(&f.path(&dest)),
            [format!("platform={want}")],
            "--platform {asked}"
        );
    }
    f.packsync(&["sync", "--platform", "linux/arm/v5", &src, "vol/none"])
        .fails(1, "no image for linux/arm/v5 in the index (it has linux/amd64, linux/arm64, linux/arm/v6, linux/arm/v7");
    assert!(!f.path("vol/none").exists());
}
