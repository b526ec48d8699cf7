//! Extended attributes: an archive's and an image layer's land on DEST as
//! GNU tar (`--xattrs`) extracts them; a directory source's with
//! `--xattrs`, as rsync -X mirrors them; a change of attributes alone is a
//! change; what the volume refuses is one warning.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Command;

use crate::fixture::{json, Fixture, Run};

/// The extended attributes of `path` (not followed), `system.*` aside,
/// sorted by name.
pub fn of(path: &Path) -> Vec<(String, Vec<u8>)> {
    let mut names = vec![0u8; 64 << 10];
    let n = rustix::fs::llistxattr(path, &mut names[..]).unwrap();
    let mut out = Vec::new();
    for name in names[..n].split(|&b| b == 0).filter(|n| !n.is_empty()) {
        if name.starts_with(b"system.") {
            continue;
        }
        let mut value = vec![0u8; 64 << 10];
        let k = rustix::fs::lgetxattr(path, OsStr::from_bytes(name), &mut value[..]).unwrap();
        value.truncate(k);
        out.push((String::from_utf8_lossy(name).into_owned(), value));
    }
    out.sort();
    out
}

/// Every entry's attributes below `root`, as `path: name=hex` lines.
fn all(root: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, lines: &mut Vec<String>) {
        let rel = dir.strip_prefix(root).unwrap().display().to_string();
        for (n, v) in of(dir) {
            let hex: String = v.iter().map(|b| format!("{b:02x}")).collect();
            lines.push(format!(
                "{}: {n}={hex}",
                if rel.is_empty() { "." } else { &rel }
            ));
        }
        if fs::symlink_metadata(dir).unwrap().is_dir() {
            let mut names: Vec<_> = fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            names.sort();
            for p in names {
                walk(root, &p, lines);
            }
        }
    }
    let root = fs::canonicalize(root).unwrap();
    let mut lines = Vec::new();
    walk(&root, &root, &mut lines);
    lines
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn setfattr(path: &Path, name: &str, value: &str) {
    run(Command::new("setfattr")
        .args(["-n", name, "-v", value])
        .arg(path));
}

/// Whether the fixture's filesystem keeps `user.*` attributes (and the
/// tools are here); skipped with one line where not.
fn usable(f: &Fixture) -> bool {
    let probe = f.path("probe");
    fs::write(&probe, "").unwrap();
    let tools = ["setfattr", "setcap", "tar"].iter().all(|t| {
        Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    let kept = tools
        && rustix::fs::lsetxattr(&probe, "user.probe", b"1", rustix::fs::XattrFlags::empty())
            .is_ok();
    fs::remove_file(&probe).unwrap();
    // `skip` says true (skipped) where it may; usable is then false.
    kept || !crate::fixture::skip(
        "extended attributes: setfattr/setcap/tar missing or user.* not kept here",
    )
}

/// A tree with attributes on a file, a directory and a capability.
fn tree_with_xattrs(f: &Fixture) {
    f.file("bin/ping", "ping");
    f.file("bin/ls", "ls");
    f.file("readme", "hello");
    setfattr(&f.src().join("bin/ping"), "user.color", "blue");
    setfattr(&f.src().join("bin"), "user.dir", "d1");
    run(Command::new("setcap")
        .arg("cap_net_raw+ep")
        .arg(f.src().join("bin/ping")));
}

fn tar_with_xattrs(f: &Fixture, name: &str) -> String {
    run(Command::new("tar")
        .args(["--xattrs", "--xattrs-include=*", "-cf"])
        .arg(f.path(name))
        .arg("-C")
        .arg(f.src())
        .arg("."));
    name.to_string()
}

fn sync_archive(f: &Fixture, archive: &str) -> Run {
    f.packsync(&["sync", "--grace", "0", "--json", archive, "vol/packs"])
        .ok()
}

#[test]
fn an_archive_s_xattrs_land_as_gnu_tar_extracts_them() {
    let f = Fixture::new();
    if !usable(&f) {
        return;
    }
    tree_with_xattrs(&f);
    let a = tar_with_xattrs(&f, "a.tar");
    // The oracle: GNU tar's own extraction of the archive.
    let oracle = f.path("oracle");
    fs::create_dir(&oracle).unwrap();
    run(Command::new("tar")
        .args(["--xattrs", "--xattrs-include=*", "-xf"])
        .arg(f.path(&a))
        .arg("-C")
        .arg(&oracle));
    let want = all(&oracle);
    assert!(
        want.iter()
            .any(|l| l.starts_with("bin/ping: security.capability="))
            && want.iter().any(|l| l == "bin: user.dir=6431"),
        "{want:?}"
    );
    let first = json(&sync_archive(&f, &a));
    assert_eq!(all(&f.dest()), want);
    assert_eq!(
        Command::new("getcap")
            .arg(f.dest().join("bin/ping"))
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).contains("cap_net_raw=ep"))
            .ok(),
        Some(true)
    );
    // The same archive again: up to date, nothing published.
    let again = json(&sync_archive(&f, &a));
    assert_eq!(again["generation"], first["generation"]);
    assert_eq!(again["status"], "up to date", "{again}");
    f.packsync(&["verify", "vol/packs"]).ok();
    // One attribute changed, nothing else: a new generation where that
    // file is copied with it and the others are hardlinked as before.
    setfattr(&f.src().join("bin/ping"), "user.color", "red");
    let b = tar_with_xattrs(&f, "b.tar");
    let changed = json(&sync_archive(&f, &b));
    assert_ne!(changed["generation"], first["generation"]);
    assert_eq!(changed["copied"], 1, "{changed}");
    assert_eq!(
        crate::xattrs::of(&f.dest().join("bin/ping"))
            .into_iter()
            .find(|(n, _)| n == "user.color")
            .map(|(_, v)| v),
        Some(b"red".to_vec())
    );
    assert!(all(&f.dest())
        .iter()
        .any(|l| l.starts_with("bin/ping: security.capability=")));
}

#[test]
fn a_later_layer_s_attributes_replace_a_lower_one_s() {
    let f = Fixture::new();
    if !usable(&f) {
        return;
    }
    let layout = f.path("layout");
    crate::source_oci::write_layout(
        &layout,
        r#"[{"tag":"v1","platforms":[{"os":"linux","arch":"amd64","layers":[
            {"entries":[{"name":"etc","type":"dir","xattrs":{"user.dir":"base"}},
                        {"name":"etc/a.conf","data":"a","xattrs":{"user.a":"1"}},
                        {"name":"etc/b.conf","data":"b","xattrs":{"user.b":"1"}}]},
            {"entries":[{"name":"etc/a.conf","data":"a","xattrs":{"user.c":"2"}}]}]}]}]"#,
        "v1",
    );
    let src = format!("oci-layout:{}:v1", layout.display());
    f.packsync(&["sync", "--grace", "0", &src, "vol/packs"])
        .ok();
    assert_eq!(
        all(&f.dest()),
        [
            "etc: user.dir=62617365",
            "etc/a.conf: user.c=32",
            "etc/b.conf: user.b=31"
        ]
    );
    let again = json(
        &f.packsync(&["sync", "--grace", "0", "--json", &src, "vol/packs"])
            .ok(),
    );
    assert_eq!(again["status"], "up to date", "{again}");
}

#[test]
fn a_directory_source_s_attributes_are_mirrored_with_xattrs_only() {
    let f = Fixture::new();
    if !usable(&f) {
        return;
    }
    tree_with_xattrs(&f);
    let want = all(&f.src());
    let first = json(&f.sync(&["--xattrs", "--json"]).ok());
    assert_eq!(all(&f.dest()), want);
    let again = json(&f.sync(&["-X", "--json"]).ok());
    assert_eq!(again["status"], "up to date", "{again}");
    assert_eq!(again["generation"], first["generation"]);
    // Without the flag a directory source carries none: a new generation
    // without them, which is then up to date.
    let plain = json(&f.sync(&["--json"]).ok());
    assert_ne!(plain["generation"], first["generation"]);
    assert!(all(&f.dest()).is_empty(), "{:?}", all(&f.dest()));
    let plain_again = json(&f.sync(&["--json"]).ok());
    assert_eq!(plain_again["status"], "up to date", "{plain_again}");
    // An attribute changed in the source is a change with the flag.
    let back = json(&f.sync(&["-X", "--json"]).ok());
    assert_eq!(back["generation"], first["generation"]);
    setfattr(&f.src().join("readme"), "user.note", "new");
    let noted = json(&f.sync(&["-X", "--json"]).ok());
    assert_eq!(noted["copied"], 1, "{noted}");
    assert_eq!(
        crate::xattrs::of(&f.dest().join("readme")),
        [("user.note".to_string(), b"new".to_vec())]
    );
    // The root's own attributes are the root's change, listed and staged
    // as any directory's; then up to date without reading the tree again.
    setfattr(&f.src(), "user.top", "t");
    let topped = json(&f.sync(&["-X", "--json", "--itemize"]).ok());
    assert_eq!(topped["changed"], 1, "{topped}");
    assert_eq!(topped["changes"][0]["path"], ".", "{topped}");
    let live = fs::canonicalize(f.dest()).unwrap();
    assert_eq!(
        crate::xattrs::of(&live),
        [("user.top".to_string(), b"t".to_vec())]
    );
    let still = json(&f.sync(&["-X", "--json"]).ok());
    assert_eq!(still["status"], "up to date", "{still}");
    assert_eq!(still["generation"], topped["generation"]);
}

#[test]
fn a_tree_an_archive_gave_attributes_is_not_taken_for_a_listing_without_them() {
    // The header's `xattrs 1` is what keeps a listing (which shows no
    // attributes) from being taken for such a tree: a directory source of
    // the same files, times and modes, without --xattrs, is a change.
    let f = Fixture::new();
    if !usable(&f) {
        return;
    }
    tree_with_xattrs(&f);
    // Whole seconds, which the archive keeps exactly.
    run(Command::new("sh")
        .arg("-c")
        .arg("find . -exec touch -h -d @1700000000 {} +")
        .current_dir(f.src()));
    let a = tar_with_xattrs(&f, "a.tar");
    let first = json(&sync_archive(&f, &a));
    assert!(!all(&f.dest()).is_empty());
    let header = fs::read_to_string(
        fs::read_dir(f.path("vol/.packs.packsync/meta"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension() == Some(OsStr::new("manifest")))
            .unwrap(),
    )
    .unwrap();
    assert!(header.contains("\nxattrs 1\n"), "{header}");
    let plain = json(&f.sync(&["--json"]).ok());
    assert_eq!(plain["status"], "synced", "{plain}");
    assert_ne!(plain["generation"], first["generation"]);
    assert!(all(&f.dest()).is_empty(), "{:?}", all(&f.dest()));
}
