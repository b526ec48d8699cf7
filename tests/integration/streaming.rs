//! Trees compared and staged a directory at a time: wide directories,
//! entries that change kind in the middle of the walk (where a directory's
//! children come in pre-order, `m/x` before `m-x`), hardlinks across
//! directories, and generations made before this way of walking existed.
//! An update is staged a directory at a time beside the live manifest
//! (without `--itemize`, `--dry-run`, `--verify`, `--checksum`, which
//! compare whole trees): it must find what the whole-tree plan finds.

use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;

use proptest::prelude::*;

use crate::fixture::{
    changes_as_lines, is_root, json, links, mirror, mtime, set_mtime, write_at, Fixture,
};
use std::os::unix::fs::MetadataExt;

#[test]
fn a_directory_of_100000_entries_is_mirrored_then_up_to_date_then_updated() {
    let f = Fixture::new();
    let wide = f.src().join("wide");
    fs::create_dir_all(&wide).unwrap();
    for i in 0..100_000 {
        write_at(
            &wide.join(format!("f{i:06}")),
            &[(i % 251) as u8; 3],
            1_700_000_000,
            0,
        );
    }
    f.file("wide-after/x", "x");
    let v = json(&f.sync(&["--json"]).ok());
    assert_eq!(v["status"], "synced", "{v}");
    assert_eq!(v["entries"], 100_003, "{v}");
    assert_eq!(v["copied"], 100_001, "{v}");

    let v = json(&f.sync(&["--json"]).ok());
    assert_eq!(v["status"], "up to date", "{v}");
    assert_eq!(
        (v["entries"].as_u64(), v["bytes"].as_u64()),
        (Some(100_003), Some(300_001))
    );

    // The very last file of the wide directory: found however far the walk goes.
    write_at(&wide.join("f099999"), b"new", 1_700_000_001, 0);
    let v = json(&f.sync(&["--json", "--itemize"]).ok());
    assert_eq!(v["status"], "synced", "{v}");
    assert_eq!(changes_as_lines(&v), ["~ wide/f099999"]);
    assert_eq!(
        (v["copied"].as_u64(), v["reused"].as_u64()),
        (Some(1), Some(100_000))
    );
    assert_eq!(mirror(&f.dest()), mirror(&f.src()));
    let v = json(&f.sync(&["--json"]).ok());
    assert_eq!(v["status"], "up to date", "{v}");

    // The same without --itemize: staged a directory at a time beside the
    // live manifest, the one file copied, every other one linked.
    write_at(&wide.join("f000000"), b"one", 1_700_000_002, 0);
    let v = synced(&f, &["--json"]);
    assert_eq!(
        changed_added_deleted(&v),
        (Some(1), Some(0), Some(0)),
        "{v}"
    );
    assert_eq!(
        (v["copied"].as_u64(), v["reused"].as_u64()),
        (Some(1), Some(100_000))
    );
}

/// `mid/m` a directory with children and `mid/n` a file, between siblings
/// that sort around them bytewise but not in pre-order (`m-x`, `m.txt`).
fn kinds_tree(f: &Fixture, m_is_dir: bool) {
    let _ = fs::remove_dir_all(f.src());
    fs::create_dir(f.src()).unwrap();
    f.file("a/first", "1");
    f.file("mid/l", "l");
    f.file("mid/m-x", "m-x");
    f.file("mid/m.txt", "m.txt");
    f.file("mid/o/p", "p");
    f.file("z/last", "z");
    if m_is_dir {
        f.file("mid/m/deep/x", "x");
        f.file("mid/m/y", "y");
        f.file("mid/n", "n as a file");
    } else {
        f.file("mid/m", "m as a file");
        f.file("mid/n/deep/x", "x");
        f.file("mid/n/y", "y");
    }
    // Only kinds and contents differ between the two trees, never a time.
    fn settle(dir: &std::path::Path) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                settle(&p);
            }
            set_mtime(&p, 1_700_000_000, 0);
        }
    }
    settle(&f.src());
    set_mtime(&f.src(), 1_700_000_000, 0);
}

#[test]
fn a_directory_that_becomes_a_file_and_a_file_that_becomes_a_directory_mid_tree() {
    let f = Fixture::new();
    kinds_tree(&f, true);
    f.sync(&[]).ok();
    assert_eq!(mirror(&f.dest()), mirror(&f.src()));

    kinds_tree(&f, false);
    let v = json(&f.sync(&["--json", "--itemize"]).ok());
    assert_eq!(v["status"], "synced", "{v}");
    assert_eq!(
        changes_as_lines(&v),
        [
            "~ mid/m",
            "- mid/m/deep/",
            "- mid/m/deep/x",
            "- mid/m/y",
            "~ mid/n/",
            "+ mid/n/deep/",
            "+ mid/n/deep/x",
            "+ mid/n/y",
        ]
    );
    assert_eq!(mirror(&f.dest()), mirror(&f.src()));
    let v = json(&f.sync(&["--json"]).ok());
    assert_eq!(v["status"], "up to date", "{v}");

    // And back again, staged a directory at a time: what the plan finds.
    kinds_tree(&f, true);
    let planned = json(&f.sync(&["--json", "--dry-run"]).ok());
    let v = json(&f.sync(&["--json"]).ok());
    assert_eq!(v["status"], "synced", "{v}");
    assert_eq!(mirror(&f.dest()), mirror(&f.src()));
    for k in ["added", "changed", "deleted", "copied", "reused", "entries"] {
        assert_eq!(v[k], planned[k], "{k}: planned {planned} done {v}");
    }
    // mid/m and mid/n changed kind; m/deep, m/deep/x, m/y came, n/deep, n/deep/x, n/y went.
    assert_eq!(
        changed_added_deleted(&v),
        (Some(2), Some(3), Some(3)),
        "{v}"
    );
    let v = json(&f.sync(&["--json"]).ok());
    assert_eq!(v["status"], "up to date", "{v}");
}

#[test]
fn hardlinks_across_directories_decide_whether_a_tree_is_up_to_date() {
    let f = Fixture::new();
    for d in ["a", "b", "c"] {
        write_at(&f.src().join(format!("{d}.txt")), b"same", 1_700_000_000, 0);
    }
    fs::create_dir_all(f.src().join("x/y")).unwrap();
    fs::create_dir_all(f.src().join("z")).unwrap();
    fs::hard_link(f.src().join("a.txt"), f.src().join("x/y/a-link")).unwrap();
    fs::hard_link(f.src().join("a.txt"), f.src().join("z/a-link")).unwrap();
    f.sync(&[]).ok();
    assert_eq!(mirror(&f.dest()), mirror(&f.src()));
    let v = json(&f.sync(&["--json"]).ok());
    assert_eq!(v["status"], "up to date", "{v}");
    // Content counted once per inode.
    assert_eq!(v["bytes"], 12, "{v}");

    // One link becomes a file of its own, equal in every other way.
    let z = f.src().join("z/a-link");
    fs::remove_file(&z).unwrap();
    write_at(&z, b"same", 1_700_000_000, 0);
    set_mtime(&f.src().join("z"), 1_700_000_000, 0);
    let live_z = mirror(&f.dest());
    let v = json(&f.sync(&["--json"]).ok());
    assert_eq!(v["status"], "synced", "{v}");
    assert_ne!(mirror(&f.dest()), live_z);
    assert_eq!(mirror(&f.dest()), mirror(&f.src()));

    // Two separate files join one inode.
    fs::remove_file(f.src().join("c.txt")).unwrap();
    fs::hard_link(f.src().join("b.txt"), f.src().join("c.txt")).unwrap();
    set_mtime(&f.src(), 1_700_000_000, 0);
    let v = json(&f.sync(&["--json"]).ok());
    assert_eq!(v["status"], "synced", "{v}");
    assert_eq!(mirror(&f.dest()), mirror(&f.src()));
    let v = json(&f.sync(&["--json"]).ok());
    assert_eq!(v["status"], "up to date", "{v}");
}

#[test]
fn a_generation_made_before_streaming_keeps_its_name_and_is_up_to_date() {
    if !is_root() {
        crate::fixture::skip("needs root (owners are part of the digest)");
        return;
    }
    // Every field of every manifest line fixed: modes, owners, times, content.
    let f = Fixture::new();
    let t = 1_700_000_000;
    f.file("pack/actions/run.py", "print('hi')\n");
    f.file("pack/pack.yaml", "name: pack\n");
    f.file("pack/a b%c", "escaped\n");
    f.file("other/x", "");
    fs::create_dir_all(f.src().join("pack/empty")).unwrap();
    std::os::unix::fs::symlink("../pack.yaml", f.src().join("pack/actions/meta")).unwrap();
    fs::hard_link(
        f.src().join("pack/pack.yaml"),
        f.src().join("other/pack-link"),
    )
    .unwrap();
    for p in [
        "pack/actions/run.py",
        "pack/pack.yaml",
        "pack/a b%c",
        "other/x",
        "pack/actions/meta",
        "pack/empty",
        "pack/actions",
        "pack",
        "other",
        "",
    ] {
        let path = f.src().join(p);
        if !path.is_symlink() {
            let mode = match p {
                "pack/actions/run.py" => 0o751,
                _ if path.is_dir() => 0o755,
                _ => 0o644,
            };
            fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
        }
        set_mtime(&path, t, 123_456_789);
    }
    let v = json(&f.sync(&["--json", "--chown", "0:0", "--label", "v1"]).ok());
    // The name the README's definition gives this tree: the manifest lines
    // written out by hand (pre-order, names sorted bytewise; the two names
    // of pack.yaml in hardlink group 0, the hash on the first name only),
    // their SHA-256 with the label.
    let sha = |s: &str| crate::fixture::sha256_hex(s.as_bytes());
    let at = "1700000000.123456789";
    let lines = [
        format!("d 0755 0 0 0 {at} - - ."),
        format!("d 0755 0 0 0 {at} - - other"),
        format!(
            "f 0644 0 0 11 {at} {} 0 other/pack-link",
            sha("name: pack\n")
        ),
        format!("f 0644 0 0 0 {at} {} - other/x", sha("")),
        format!("d 0755 0 0 0 {at} - - pack"),
        format!("f 0644 0 0 8 {at} {} - pack/a%20b%25c", sha("escaped\n")),
        format!("d 0755 0 0 0 {at} - - pack/actions"),
        format!("l 0777 0 0 12 {at} - - pack/actions/meta ../pack.yaml"),
        format!(
            "f 0751 0 0 12 {at} {} - pack/actions/run.py",
            sha("print('hi')\n")
        ),
        format!("d 0755 0 0 0 {at} - - pack/empty"),
        format!("f 0644 0 0 11 {at} - 0 pack/pack.yaml"),
    ];
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let digest = crate::fixture::digest_of(&text, "v1");
    assert_eq!(v["generation"], &digest[..16], "{v}");
    // The binary of main before streaming gave this tree that name too.
    assert_eq!(&digest[..16], "d1217733c0e6face");
    let v = json(&f.sync(&["--json", "--chown", "0:0", "--label", "v1"]).ok());
    assert_eq!(v["status"], "up to date", "{v}");
}

/// Hardlinked files are counted path by path, as `--dry-run` counts them:
/// a pair on a first sync is two files copied; a third link added to it
/// gives the tree a group the live one does not have, so the two kept
/// paths are changes and all three are copied anew (the live pair's inode
/// stays the previous generation's); unchanged, the three are reused.
#[test]
fn hardlinked_files_are_counted_path_by_path_as_the_plan_counts_them() {
    counted_path_by_path(&[]);
}

/// `--verify` stages the whole tree at once: it counts as the plan does too.
#[test]
fn a_whole_tree_stage_counts_hardlinked_files_path_by_path_too() {
    counted_path_by_path(&["--verify"]);
}

fn counted_path_by_path(extra: &[&str]) {
    let f = Fixture::new();
    let t = 1_700_000_000;
    write_at(&f.src().join("a"), b"shared", t, 0);
    fs::create_dir(f.src().join("d")).unwrap();
    fs::hard_link(f.src().join("a"), f.src().join("d/b")).unwrap();
    let settle = || {
        set_mtime(&f.src().join("d"), t, 0);
        set_mtime(&f.src(), t, 0);
    };
    settle();
    let counts = |v: &serde_json::Value| -> Vec<Option<u64>> {
        ["changed", "added", "copied", "copied_bytes", "reused"]
            .iter()
            .map(|k| v[k].as_u64())
            .collect()
    };
    let planned_then_synced = || {
        let planned = json(&f.sync(&["--json", "--dry-run"]).ok());
        let done = synced(&f, &[&["--json"], extra].concat());
        assert_eq!(done["status"], "synced", "{done}");
        assert_eq!(
            counts(&done),
            counts(&planned),
            "planned {planned} done {done}"
        );
        done
    };
    let ino = |p: &str| fs::metadata(f.dest().join(p)).unwrap().ino();

    let v = planned_then_synced();
    let n = |k: &[u64]| k.iter().map(|&k| Some(k)).collect::<Vec<_>>();
    // changed, added, copied, copied_bytes, reused
    assert_eq!(counts(&v), n(&[0, 3, 2, 12, 0]), "{v}");
    let pair = ino("a");

    fs::hard_link(f.src().join("a"), f.src().join("d/c")).unwrap();
    settle();
    let v = planned_then_synced();
    assert_eq!(counts(&v), n(&[2, 1, 3, 18, 0]), "{v}");
    let trio = ino("a");
    assert_ne!(trio, pair, "a new inode, not the live pair's");
    assert_eq!((ino("d/b"), ino("d/c")), (trio, trio));

    write_at(&f.src().join("other"), b"new", t, 0);
    settle();
    let v = planned_then_synced();
    assert_eq!(counts(&v), n(&[0, 1, 1, 3, 3]), "{v}");
    assert_eq!(ino("d/c"), trio, "hardlinked from the live generation");
}

/// (changed, added, deleted) of a `--json` summary.
fn changed_added_deleted(v: &serde_json::Value) -> (Option<u64>, Option<u64>, Option<u64>) {
    let n = |k: &str| v[k].as_u64();
    (n("changed"), n("added"), n("deleted"))
}

/// Sync, and check what a user would: exit 0, the mirror equal to the
/// source, `verify` content with the live tree, a second sync up to date.
fn synced(f: &Fixture, args: &[&str]) -> serde_json::Value {
    let v = json(&f.sync(args).ok());
    assert_eq!(mirror(&f.dest()), mirror(&f.src()), "{v}");
    f.packsync(&["verify", "vol/packs"]).ok();
    let again = json(&f.sync(&["--json", "--allow-empty"]).ok());
    assert_eq!(again["status"], "up to date", "{again}");
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random updates, each planned a directory at a time (`--dry-run
    /// --itemize`) and then synced, in turn reading every candidate's
    /// bytes on both sides (`--checksum --itemize`: no operation here
    /// keeps a file's size and mtime while changing its bytes, so the
    /// bytes agree with the metadata) and by metadata (`--itemize` alone):
    /// the same counts, the same changes listed, the same tree. (The
    /// whole-tree plan, `plan::build`, is the fold of the same `plan::dir`;
    /// the differential test holds both against the previous binary.)
    #[test]
    fn a_streamed_update_finds_what_the_whole_tree_plan_finds(
        rounds in prop::collection::vec(
            prop::collection::vec(crate::property::op(), 1..8), 2..6)
    ) {
        let f = Fixture::new();
        let mut n = 0;
        for ops in &rounds {
            for o in ops {
                n += 1;
                crate::property::apply(&f.src(), o, n);
            }
            let planned = json(&f.sync(&["--json", "--dry-run", "--itemize", "--allow-empty"]).ok());
            let whole = n % 2 == 0;
            let done = match whole {
                true => synced(&f, &["--json", "--checksum", "--itemize", "--allow-empty"]),
                false => synced(&f, &["--json", "--itemize", "--allow-empty"]),
            };
            prop_assert_eq!(changes_as_lines(&done), changes_as_lines(&planned));
            if planned["status"] == "up to date" {
                prop_assert_eq!(&done["status"], "up to date", "{}", done);
                continue;
            }
            prop_assert_eq!(&done["status"], "synced", "{}", done);
            let keys = [
                "entries",
                "bytes",
                "added",
                "deleted",
                "changed",
                "copied",
                "copied_bytes",
                "reused",
            ];
            for k in keys {
                prop_assert_eq!(&done[k], &planned[k], "{}: planned {} done {}", k, planned, done);
            }
        }
    }
}

#[test]
fn an_update_staged_by_directory_reuses_the_live_files_and_counts_its_changes() {
    let f = Fixture::new();
    for d in 0..20 {
        fs::create_dir_all(f.src().join(format!("d{d:02}"))).unwrap();
        for i in 0..50 {
            write_at(
                &f.src().join(format!("d{d:02}/f{i:02}")),
                format!("{d} {i}").as_bytes(),
                1_700_000_000,
                0,
            );
        }
    }
    f.file("kind/was-file", "file");
    f.file("kind/was-dir/a", "a");
    f.file("kind/was-dir/deep/b", "b");
    synced(&f, &["--json"]);
    let ino = |p: &str| {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(f.dest().join(p)).unwrap().ino()
    };
    let before = ino("d07/f07");

    // 1% changed, a directory removed, one added, two kinds swapped.
    for d in 0..10 {
        write_at(
            &f.src().join(format!("d{d:02}/f00")),
            b"new",
            1_700_000_001,
            0,
        );
    }
    fs::remove_dir_all(f.src().join("d19")).unwrap();
    f.file("d20/new", "new");
    fs::remove_file(f.src().join("kind/was-file")).unwrap();
    f.file("kind/was-file/now", "dir");
    fs::remove_dir_all(f.src().join("kind/was-dir")).unwrap();
    f.file("kind/was-dir", "now a file");
    let v = synced(&f, &["--json", "--max-delete", "54"]);
    assert_eq!(v["status"], "synced", "{v}");
    // 50 files and their directory, and what was below was-dir (a, deep, deep/b).
    assert_eq!(v["deleted"], 54, "{v}");
    // d20, d20/new, was-file/now.
    assert_eq!(v["added"], 3, "{v}");
    assert_eq!(
        (v["copied"].as_u64(), v["reused"].as_u64()),
        (Some(13), Some(940)),
        "{v}"
    );
    assert_eq!(
        ino("d07/f07"),
        before,
        "an unchanged file is the live one, linked"
    );
}

#[test]
fn max_delete_refuses_a_streamed_update_before_anything_is_written() {
    let f = Fixture::new();
    for i in 0..10 {
        f.file(&format!("pack/f{i}"), "x");
    }
    f.sync(&[]).ok();
    fs::remove_dir_all(f.src().join("pack")).unwrap();
    f.file("other", "y");
    f.unchanged_by(|| f.sync_refused(&["--max-delete", "10"], 3, "refusing to delete 11 entries"));
    let v = synced(&f, &["--json", "--max-delete", "11"]);
    assert_eq!(v["deleted"], 11, "{v}");
}

#[test]
fn after_an_update_every_live_file_has_two_links_and_a_join_inside_the_tree_is_still_found() {
    // 20,000 files equal in content and metadata, so that two of them
    // joined into one inode differ in nothing a stat compares but the inode.
    let f = Fixture::new();
    for d in 0..200 {
        for i in 0..100 {
            let p = f.src().join(format!("d{d:03}/f{i:03}"));
            if i == 0 {
                fs::create_dir_all(p.parent().unwrap()).unwrap();
            }
            write_at(&p, b"same", 1_700_000_000, 0);
        }
    }
    f.sync(&[]).ok();
    // An update: the previous generation keeps (`--keep 2`) a second link
    // of every file but the changed one.
    write_at(&f.src().join("d100/f000"), b"changed", 1_700_000_001, 0);
    let v = json(&f.sync(&["--json"]).ok());
    assert_eq!(v["status"], "synced", "{v}");
    let two_links = |p: &str| fs::metadata(f.dest().join(p)).unwrap().nlink();
    assert_eq!((two_links("d000/f000"), two_links("d199/f099")), (2, 2));
    let v = json(&f.sync(&["--json"]).ok());
    assert_eq!(v["status"], "up to date", "{v}");

    // Someone joins two live files far apart in the walk (the directory's
    // mtime put back): only their inodes tell.
    let (a, b) = (f.dest().join("d003/f007"), f.dest().join("d150/f050"));
    let (secs, nsec) = mtime(&f.dest().join("d150"));
    fs::remove_file(&b).unwrap();
    fs::hard_link(&a, &b).unwrap();
    set_mtime(&f.dest().join("d150"), secs, nsec);
    assert_eq!(links(&f.dest()).len(), 1);
    let found = f.packsync(&["verify", "--json", "vol/packs"]);
    assert_eq!(found.code, 4, "{}", found.stdout);
    let what: Vec<_> = json(&found)["differences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            format!(
                "{} {}",
                d["what"].as_str().unwrap(),
                d["path"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        what,
        ["hardlink joined d003/f007", "hardlink joined d150/f050"]
    );
    let v = json(&f.sync(&["--json"]).ok());
    assert_eq!(v["status"], "synced", "{v}");
    // Both copied apart; everything else still linked from the live tree.
    assert_eq!(
        (v["copied"].as_u64(), v["reused"].as_u64()),
        (Some(2), Some(19_998)),
        "{v}"
    );
    let (live, src) = (mirror(&f.dest()), mirror(&f.src()));
    let (in_live, in_src): (HashSet<_>, HashSet<_>) = (live.iter().collect(), src.iter().collect());
    let differ: Vec<_> = in_live.symmetric_difference(&in_src).collect();
    assert!(differ.is_empty(), "{differ:?}");
    assert!(links(&f.dest()).is_empty());
    let v = json(&f.sync(&["--json"]).ok());
    assert_eq!(v["status"], "up to date", "{v}");
}

/// Hardlinks drifted two ways at once in the live tree: two files joined
/// into one inode, and a group split (one path replaced by a copy of the
/// same bytes, mode and mtime). A dry run lists exactly the four paths
/// that drifted as changes, and so does the repair (`--itemize`), which
/// copies those four and hardlinks every other file from the live tree,
/// as the whole-tree plan would; the image is the source's, links and all.
#[test]
fn a_join_and_a_split_in_one_live_tree_are_repaired_by_copying_only_what_drifted() {
    let f = Fixture::new();
    let t = 1_700_000_000;
    for d in 0..3 {
        for i in 0..100 {
            let p = f.src().join(format!("d{d}/f{i:03}"));
            if i == 0 {
                fs::create_dir_all(p.parent().unwrap()).unwrap();
            }
            write_at(&p, b"same", t, 0);
        }
    }
    // Two groups of two paths each, across directories.
    for (a, b) in [("d0/g1", "d2/g1-link"), ("d1/g2", "d2/g2-link")] {
        write_at(&f.src().join(a), format!("group {a}").as_bytes(), t, 0);
        fs::hard_link(f.src().join(a), f.src().join(b)).unwrap();
    }
    for d in ["d0", "d1", "d2"] {
        set_mtime(&f.src().join(d), t, 0);
    }
    f.sync(&[]).ok();
    // An update, so that every live file has a second link (`--keep 2`).
    write_at(&f.src().join("d1/f050"), b"changed", t + 1, 0);
    set_mtime(&f.src().join("d1"), t, 0);
    let v = json(&f.sync(&["--json"]).ok());
    assert_eq!(v["status"], "synced", "{v}");
    let want_links = links(&f.src());
    assert_eq!(links(&f.dest()), want_links);

    let live = fs::canonicalize(f.dest()).unwrap();
    let keep_times = |dir: &str, change: &dyn Fn()| {
        let (s, ns) = mtime(&live.join(dir));
        change();
        set_mtime(&live.join(dir), s, ns);
    };
    // Joined: d2/f099 made a second name of d0/f007.
    keep_times("d2", &|| {
        fs::remove_file(live.join("d2/f099")).unwrap();
        fs::hard_link(live.join("d0/f007"), live.join("d2/f099")).unwrap();
    });
    // Split: d2/g2-link replaced by a copy of its group's file.
    keep_times("d2", &|| {
        let link = live.join("d2/g2-link");
        let (s, ns) = mtime(&link);
        let mode = fs::metadata(&link).unwrap().permissions();
        fs::copy(&link, live.join("d2/copy")).unwrap();
        fs::set_permissions(live.join("d2/copy"), mode).unwrap();
        set_mtime(&live.join("d2/copy"), s, ns);
        fs::rename(live.join("d2/copy"), &link).unwrap();
    });
    assert_ne!(links(&f.dest()), want_links, "the drift is in place");

    let drifted = ["d0/f007", "d1/g2", "d2/f099", "d2/g2-link"];
    let planned = f.unchanged_by(|| f.sync(&["--dry-run", "--itemize"]).ok());
    let listed: Vec<&str> = planned
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("~ "))
        .collect();
    assert_eq!(listed, drifted, "{}", planned.stdout);
    let v = json(&f.sync(&["--json", "--itemize"]).ok());
    assert_eq!(v["status"], "synced", "{v}");
    let changed: Vec<&str> = v["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["path"].as_str().unwrap())
        .collect();
    assert_eq!(changed, drifted, "{v}");
    // The joined pair, and both paths of the split group, copied; the
    // other 300 files (the intact group's two paths among them) linked.
    assert_eq!(
        (v["copied"].as_u64(), v["reused"].as_u64()),
        (Some(4), Some(300)),
        "{v}"
    );
    assert_eq!(mirror(&f.dest()), mirror(&f.src()));
    assert_eq!(links(&f.dest()), want_links);
    let ino = |p: &str| fs::metadata(f.dest().join(p)).unwrap().ino();
    assert_ne!(ino("d0/f007"), ino("d2/f099"));
    f.packsync(&["verify", "vol/packs"]).ok();
    let v = json(&f.sync(&["--json"]).ok());
    assert_eq!(v["status"], "up to date", "{v}");
}

/// A round tried again (the stage found two live files joined) meets the
/// source's FIFO on each try: the user is told once, on stderr and in the
/// JSON's `warnings`.
#[test]
fn a_round_tried_again_after_drift_warns_once() {
    let f = Fixture::new();
    let t = 1_700_000_000;
    fs::create_dir_all(f.src().join("d")).unwrap();
    for i in 0..4 {
        write_at(&f.src().join(format!("d/f{i}")), b"same", t, 0);
    }
    let made = std::process::Command::new("mkfifo")
        .arg(f.src().join("d/pipe"))
        .status()
        .unwrap();
    assert!(made.success());
    f.sync(&[]).ok();
    // An update, so that every live file has a second link (`--keep 2`).
    write_at(&f.src().join("d/f3"), b"changed", t, 0);
    f.sync(&[]).ok();
    let join = |n: &str| {
        let live = fs::canonicalize(f.dest()).unwrap();
        fs::remove_file(live.join("d/f1")).unwrap();
        fs::hard_link(live.join("d/f0"), live.join("d/f1")).unwrap();
        write_at(&f.src().join("d/f3"), n.as_bytes(), t, 0);
    };
    let warning = "warning: skipping FIFO";
    join("again");
    let run = f.sync(&[]).ok();
    assert_eq!(run.stderr.matches(warning).count(), 1, "{}", run.stderr);
    // The joined pair and the change copied: the repair, not whole trees.
    let said = run.stdout.clone() + &run.stderr;
    assert!(said.contains("3 copied (13 B), 1 reused"), "{said}");
    assert_eq!(links(&f.dest()), links(&f.src()));

    join("and again");
    let run = f.sync(&["--json"]).ok();
    assert_eq!(run.stderr.matches(warning).count(), 1, "{}", run.stderr);
    let v = json(&run);
    let warned: Vec<_> = v["warnings"].as_array().unwrap().iter().collect();
    assert_eq!(warned.len(), 1, "{v}");
    assert_eq!(
        (v["copied"].as_u64(), v["reused"].as_u64()),
        (Some(3), Some(1)),
        "{v}"
    );
}
