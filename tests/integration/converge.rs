//! `sync --set-mtime`: writers whose sources hold the same bytes with other
//! mtimes (a checkout in each replica, two image builds) publish one
//! generation between them, not one each round.

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt};
use std::path::Path;
use std::process::Command;

use crate::fixture::{json, set_mtime, Fixture, Run};

const EPOCH: i64 = 1_700_000_000;

/// One tree at `root`: files, a nested directory, an empty one, a
/// symlink, a hardlink; every entry (the root too) with mtime `t` + its
/// position, so that two copies made with other `t` differ in mtimes only.
fn tree(root: &Path, t: i64) {
    fs::create_dir_all(root.join("pack/actions")).unwrap();
    fs::create_dir_all(root.join("pack/empty")).unwrap();
    fs::write(root.join("pack/actions/run.py"), "print('hi')\n").unwrap();
    fs::write(root.join("pack/pack.yaml"), "name: pack\n").unwrap();
    fs::write(root.join("top.txt"), "top\n").unwrap();
    fs::hard_link(root.join("top.txt"), root.join("pack/top-link")).unwrap();
    symlink("../top.txt", root.join("pack/up")).unwrap();
    let mut all = Vec::new();
    walk(root, &mut all);
    // Deepest first: setting a child's time does not change its parent's.
    all.reverse();
    for (i, p) in all.iter().enumerate() {
        set_mtime(p, t + i as i64, 123_456_789);
    }
}

/// Every path at and below `root`, parents before children, not following symlinks.
fn walk(root: &Path, out: &mut Vec<std::path::PathBuf>) {
    out.push(root.to_path_buf());
    if fs::symlink_metadata(root).unwrap().is_dir() {
        let mut names: Vec<_> = fs::read_dir(root)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        for p in names {
            walk(&p, out);
        }
    }
}

/// The mtime of every entry of the live tree (lstat, nanoseconds), by path.
fn live_mtimes(f: &Fixture) -> Vec<(String, i64, i64)> {
    let root = fs::canonicalize(f.dest()).unwrap();
    let mut all = Vec::new();
    walk(&root, &mut all);
    all.iter()
        .map(|p| {
            let m = fs::symlink_metadata(p).unwrap();
            let rel = p.strip_prefix(&root).unwrap().display().to_string();
            (rel, m.mtime(), m.mtime_nsec())
        })
        .collect()
}

fn generations(f: &Fixture) -> usize {
    fs::read_dir(f.state().join("gen")).unwrap().count()
}

/// `sync --json --grace 0 SOURCE vol/packs` plus `extra`: its status and generation.
fn sync_json(f: &Fixture, source: &str, extra: &[&str]) -> (String, String) {
    let mut args = vec!["sync", "--json", "--grace", "0"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[source, "vol/packs"]);
    let run = f.packsync(&args).ok();
    let v = json(&run);
    (
        v["status"].as_str().unwrap().to_string(),
        v["generation"].as_str().unwrap().to_string(),
    )
}

/// Two copies of one tree, `a/` and `b/`, whose mtimes differ everywhere.
fn two_copies(f: &Fixture) {
    tree(&f.path("a"), 1_500_000_000);
    tree(&f.path("b"), 1_600_000_000);
}

#[test]
fn two_copies_with_other_mtimes_publish_one_generation_under_set_mtime() {
    let f = Fixture::new();
    two_copies(&f);
    let flag = ["--set-mtime", "1700000000"];
    let (status, first) = sync_json(&f, "a", &flag);
    assert_eq!(status, "synced");
    for (i, from) in ["b", "a", "b", "a"].iter().enumerate() {
        let (status, gen) = sync_json(&f, from, &flag);
        assert_eq!(
            (status.as_str(), gen.as_str()),
            ("up to date", first.as_str()),
            "run {} from {from}",
            i + 2
        );
    }
    assert_eq!(generations(&f), 1, "one generation published");
    let mtimes = live_mtimes(&f);
    assert!(mtimes.len() >= 9, "{mtimes:?}");
    for (path, s, ns) in &mtimes {
        assert_eq!((*s, *ns), (EPOCH, 0), "mtime of {path:?}");
    }
    assert_eq!(
        fs::read_to_string(f.dest().join("pack/up")).unwrap(),
        "top\n"
    );
    f.packsync(&["verify", "vol/packs"]).ok();
}

#[test]
fn under_set_mtime_a_same_size_edit_is_still_published() {
    // Every file has one mtime: only the content tells this edit apart.
    let f = Fixture::new();
    two_copies(&f);
    let flag = ["--set-mtime", "1700000000"];
    sync_json(&f, "a", &flag);
    fs::write(f.path("b/pack/pack.yaml"), "name: PACK\n").unwrap();
    let v = json(
        &f.packsync(&[
            "sync",
            "--json",
            "--grace",
            "0",
            "--itemize",
            flag[0],
            flag[1],
            "b",
            "vol/packs",
        ])
        .ok(),
    );
    assert_eq!(v["status"], "synced", "{v}");
    // The edited file alone is copied; every other file, read and found
    // equal to its recorded hash, is hardlinked from the live generation.
    assert_eq!(
        (&v["changed"], &v["copied"], &v["reused"]),
        (&1.into(), &1.into(), &3.into()),
        "{v}"
    );
    assert_eq!(v["changes"][0]["path"], "pack/pack.yaml", "{v}");
    assert_eq!(
        fs::read_to_string(f.dest().join("pack/pack.yaml")).unwrap(),
        "name: PACK\n"
    );
    assert_eq!(
        live_mtimes(&f)
            .iter()
            .filter(|m| (m.1, m.2) != (EPOCH, 0))
            .count(),
        0
    );
}

#[test]
fn without_set_mtime_the_two_copies_publish_every_time() {
    let f = Fixture::new();
    two_copies(&f);
    let mut seen = Vec::new();
    for from in ["a", "b", "a"] {
        let (status, gen) = sync_json(&f, from, &[]);
        assert_eq!(status, "synced", "from {from}");
        seen.push(gen);
    }
    assert_ne!(seen[0], seen[1]);
    assert_eq!(seen[0], seen[2], "a's tree again, under its own digest");
}

#[test]
fn a_generation_with_other_mtimes_is_not_up_to_date_under_set_mtime() {
    let f = Fixture::new();
    two_copies(&f);
    let (_, plain) = sync_json(&f, "a", &[]);
    let (status, gen) = sync_json(&f, "a", &["--set-mtime", "1700000000"]);
    assert_eq!(status, "synced");
    assert_ne!(gen, plain);
    let (status, _) = sync_json(&f, "a", &["--set-mtime", "1700000001"]);
    assert_eq!(status, "synced", "another EPOCH is another tree");
    assert!(live_mtimes(&f).iter().all(|m| (m.1, m.2) == (EPOCH + 1, 0)));
}

/// `tar -cf NAME -C DIR .` in the fixture: GNU tar keeps the mtimes.
fn tar_of(f: &Fixture, dir: &str, name: &str) -> String {
    let ok = Command::new("tar")
        .args(["-cf", name, "-C", dir, "."])
        .current_dir(f.path(""))
        .status()
        .unwrap()
        .success();
    assert!(ok, "tar of {dir}");
    name.to_string()
}

#[test]
fn two_archives_of_one_tree_with_other_mtimes_publish_one_generation() {
    let f = Fixture::new();
    two_copies(&f);
    let a = tar_of(&f, "a", "a.tar");
    let b = tar_of(&f, "b", "b.tar");
    assert_ne!(fs::read(f.path(&a)).unwrap(), fs::read(f.path(&b)).unwrap());
    let flag = ["--set-mtime", "1700000000"];
    let (status, first) = sync_json(&f, &a, &flag);
    assert_eq!(status, "synced");
    for from in [&b, &a, &b] {
        let (status, gen) = sync_json(&f, from, &flag);
        assert_eq!(
            (status.as_str(), gen.as_str()),
            ("up to date", first.as_str()),
            "from {from}"
        );
    }
    // The value may come from the environment.
    let run = Run::from(
        f.command(&["sync", "--json", "--grace", "0", &a, "vol/packs"])
            .env("PACKSYNC_SET_MTIME", "1700000000")
            .output()
            .unwrap(),
    )
    .ok();
    assert_eq!(json(&run)["status"], "up to date");
    assert_eq!(generations(&f), 1);
    for (path, s, ns) in live_mtimes(&f) {
        assert_eq!((s, ns), (EPOCH, 0), "mtime of {path:?}");
    }
    // The directory and the archive give one tree: up to date across kinds.
    let (status, gen) = sync_json(&f, "b", &flag);
    assert_eq!(
        (status.as_str(), gen.as_str()),
        ("up to date", first.as_str())
    );
    // Without the flag the archives alternate.
    let (s1, _) = sync_json(&f, &a, &[]);
    let (s2, _) = sync_json(&f, &b, &[]);
    assert_eq!((s1.as_str(), s2.as_str()), ("synced", "synced"));
}

#[test]
fn an_archive_unchanged_since_is_synced_again_under_another_set_mtime() {
    // The archive's own hash says "unchanged since the live generation":
    // that is not up to date when the live tree got other mtimes.
    let f = Fixture::new();
    tree(&f.path("a"), 1_500_000_000);
    let a = tar_of(&f, "a", "a.tar");
    let (_, plain) = sync_json(&f, &a, &[]);
    let (status, set) = sync_json(&f, &a, &["--set-mtime", "1700000000"]);
    assert_eq!(status, "synced");
    let (status, _) = sync_json(&f, &a, &["--set-mtime", "1700000000"]);
    assert_eq!(status, "up to date");
    let (status, gen) = sync_json(&f, &a, &[]);
    assert_eq!((status.as_str(), gen.as_str()), ("synced", plain.as_str()));
    assert_ne!(plain, set);
    let top = fs::symlink_metadata(f.dest().join("top.txt")).unwrap();
    let src = fs::symlink_metadata(f.path("a/top.txt")).unwrap();
    assert_eq!(
        top.mtime(),
        src.mtime(),
        "the archive's mtime (whole seconds in a ustar header)"
    );
}

#[test]
fn a_bad_set_mtime_is_a_usage_error() {
    let f = Fixture::new();
    f.file("x", "x");
    for bad in ["soon", "1.5", "9999999999", "-9999999999"] {
        f.unchanged_by(|| {
            f.sync(&["--set-mtime", bad])
                .fails(2, &format!("invalid value \"{bad}\" for --set-mtime"))
        });
    }
    let run = Run::from(
        f.command(&["sync", "--grace", "0", "src", "vol/packs"])
            .env("PACKSYNC_SET_MTIME", "yesterday")
            .output()
            .unwrap(),
    );
    run.fails(2, "invalid value \"yesterday\" for --set-mtime");
    // Before the epoch is a time too.
    f.sync(&["--set-mtime", "-86400"]).ok();
    assert_eq!(live_mtimes(&f)[0].1, -86400);
}
