//! `packsync sync`: the mirror, reuse, validation and guards.

use std::fs;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};

use crate::fixture::{changes_as_lines, is_root, mirror, packsync, Fixture, Run};

#[test]
fn first_sync_mirrors_the_source_through_a_relative_link() {
    let f = Fixture::new();
    f.file("pack1/actions/run.py", "print('hi')\n");
    f.file("pack1/pack.yaml", "name: pack1\n");
    fs::create_dir_all(f.src().join("pack1/empty")).unwrap();
    symlink("../pack.yaml", f.src().join("pack1/actions/meta")).unwrap();
    symlink("/nonexistent/abs", f.src().join("dangling")).unwrap();
    fs::set_permissions(
        f.src().join("pack1/actions/run.py"),
        fs::Permissions::from_mode(0o751),
    )
    .unwrap();
    let out = f.sync(&[]).ok();
    assert!(out.stdout.contains("synced"), "{}", out.stdout);
    let link = fs::read_link(f.dest()).unwrap();
    assert!(link.is_relative(), "{link:?}");
    assert!(link.starts_with(".packs.packsync/gen/"), "{link:?}");
    assert_eq!(mirror(&f.dest()), mirror(&f.src()));
}

#[test]
fn a_second_sync_with_nothing_changed_is_up_to_date_and_writes_nothing() {
    let f = Fixture::new();
    f.file("a/b.txt", "b");
    f.sync(&[]).ok();
    let out = f.unchanged_by(|| f.sync(&[]).ok());
    assert!(out.stdout.contains("up to date"), "{}", out.stdout);
}

#[test]
fn deletes_what_the_source_no_longer_has_and_reuses_unchanged_files() {
    let f = Fixture::new();
    f.file("keep/a.py", "a");
    f.file("gone/b.py", "b");
    f.file("keep/c.py", "c");
    f.sync(&[]).ok();
    let old_gen = fs::read_link(f.dest()).unwrap();
    let old_mirror = mirror(&f.dest());
    let ino_a = fs::metadata(f.dest().join("keep/a.py")).unwrap().ino();
    fs::remove_dir_all(f.src().join("gone")).unwrap();
    f.file("keep/c.py", "changed");
    let out = f.sync(&["--itemize"]).ok();
    assert!(
        out.stdout.contains("- gone/\n") && out.stdout.contains("- gone/b.py\n"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("~ keep/c.py\n"), "{}", out.stdout);
    assert_eq!(mirror(&f.dest()), mirror(&f.src()));
    assert_eq!(
        fs::metadata(f.dest().join("keep/a.py")).unwrap().ino(),
        ino_a,
        "unchanged file hardlinked"
    );
    // The previous generation is retained and unchanged.
    assert_eq!(mirror(&f.path("vol").join(&old_gen)), old_mirror);
}

#[test]
fn a_mode_only_change_gets_its_own_inode() {
    let f = Fixture::new();
    let p = f.file("x.sh", "#!/bin/sh\n");
    f.sync(&[]).ok();
    let old = fs::read_link(f.dest()).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    f.sync(&[]).ok();
    let now = fs::metadata(f.dest().join("x.sh")).unwrap();
    let before = fs::metadata(f.path("vol").join(&old).join("x.sh")).unwrap();
    assert_eq!(now.permissions().mode() & 0o777, 0o755);
    assert_eq!(
        before.permissions().mode() & 0o777,
        0o644,
        "retained generation untouched"
    );
    assert_ne!(now.ino(), before.ino());
}

#[test]
fn an_in_place_edit_of_the_live_tree_is_repaired() {
    let f = Fixture::new();
    f.file("a.txt", "original");
    f.sync(&[]).ok();
    // Someone edits the live tree (breaking the rule): the next sync repairs it.
    let live = f.dest().join("a.txt");
    fs::write(&live, "tampered!").unwrap();
    let out = f.sync(&["-i"]).ok();
    assert!(out.stdout.contains("~ a.txt"), "{}", out.stdout);
    assert_eq!(
        fs::read_to_string(f.dest().join("a.txt")).unwrap(),
        "original"
    );
}

#[test]
fn hardlink_groups_inside_the_source_are_kept() {
    let f = Fixture::new();
    let a = f.file("a", "shared");
    fs::create_dir(f.src().join("d")).unwrap();
    fs::hard_link(&a, f.src().join("d/b")).unwrap();
    f.sync(&[]).ok();
    let ia = fs::metadata(f.dest().join("a")).unwrap().ino();
    let ib = fs::metadata(f.dest().join("d/b")).unwrap().ino();
    assert_eq!(ia, ib);
    assert_eq!(mirror(&f.dest()), mirror(&f.src()));
}

#[test]
fn a_live_hardlink_group_split_by_hand_is_published_as_the_source_has_it() {
    // One path of a hardlinked pair replaced on the volume by a file of
    // the same size, mode and mtime but other bytes: the pair no longer
    // shares an inode, so neither path may be linked from the live tree.
    let f = Fixture::new();
    let a = f.file("a", "hello\n");
    fs::create_dir(f.src().join("d")).unwrap();
    fs::hard_link(&a, f.src().join("d/b")).unwrap();
    f.sync(&[]).ok();
    let live = fs::canonicalize(f.dest()).unwrap();
    let root = crate::fixture::mtime(&live);
    let (s, ns) = crate::fixture::mtime(&live.join("a"));
    let mode = fs::metadata(live.join("a")).unwrap().permissions();
    fs::write(live.join("a.new"), "HELLO\n").unwrap();
    fs::set_permissions(live.join("a.new"), mode).unwrap();
    crate::fixture::set_mtime(&live.join("a.new"), s, ns);
    fs::rename(live.join("a.new"), live.join("a")).unwrap();
    crate::fixture::set_mtime(&live, root.0, root.1);
    f.sync(&[]).ok();
    for p in ["a", "d/b"] {
        assert_eq!(
            fs::read_to_string(f.dest().join(p)).unwrap(),
            "hello\n",
            "{p}"
        );
    }
    let ino = |p: &str| fs::metadata(f.dest().join(p)).unwrap().ino();
    assert_eq!(ino("a"), ino("d/b"));
    f.packsync(&["verify", "vol/packs"]).ok();
}

#[test]
fn dry_run_with_itemize_writes_nothing() {
    let f = Fixture::new();
    f.file("a", "1");
    let out = f.unchanged_by(|| f.sync(&["-n", "-i"]).ok());
    assert!(out.stdout.contains("+ a\n"), "{}", out.stdout);
}

#[test]
fn json_summary_is_one_object() {
    let f = Fixture::new();
    f.file("a", "1");
    let out = f.sync(&["--json"]).ok();
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(v["status"], "synced");
    assert_eq!(v["entries"], 1);
    assert_eq!(v["copied"], 1);
    let out = f.sync(&["--json"]).ok();
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(v["status"], "up to date");
}

/// Check a successful `--json` run as a script would: exit 0 and stdout one
/// line holding one JSON object. Returns the object.
#[track_caller]
fn json_summary(run: &Run) -> serde_json::Value {
    assert_eq!(
        run.code, 0,
        "stdout: {}\nstderr: {}",
        run.stdout, run.stderr
    );
    assert_eq!(run.stdout.lines().count(), 1, "one line: {}", run.stdout);
    let v: serde_json::Value =
        serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {}", run.stdout));
    assert!(v.is_object(), "{v}");
    v
}

#[test]
fn json_with_itemize_lists_the_changes_inside_the_one_object() {
    let f = Fixture::new();
    f.file("keep/a.py", "a");
    f.file("keep/c.py", "c");
    f.file("gone.txt", "g");
    f.sync(&[]).ok();
    let live = fs::read_link(f.dest()).unwrap();
    fs::remove_file(f.src().join("gone.txt")).unwrap();
    f.file("keep/c.py", "changed");
    f.file("new.txt", "n");
    let before = f.volume();

    // The text lines, unchanged by --json's existence.
    let text = f.sync(&["--dry-run", "--itemize"]).ok();
    let lines: Vec<String> = text
        .stdout
        .lines()
        .filter(|l| !l.starts_with("packsync: "))
        .map(String::from)
        .collect();
    for want in ["- gone.txt", "~ keep/c.py", "+ new.txt"] {
        assert!(lines.iter().any(|l| l == want), "{want}: {}", text.stdout);
    }

    // What would change, as JSON: the same lines, in the same order.
    let v = json_summary(&f.sync(&["--dry-run", "--itemize", "--json"]));
    assert_eq!(v["status"], "would sync", "{v}");
    assert_eq!(v["dry_run"], true, "{v}");
    assert_eq!(changes_as_lines(&v), lines);
    assert_eq!(f.volume(), before, "a dry run writes nothing");

    // The sync itself reports the same changes.
    let v = json_summary(&f.sync(&["--itemize", "--json"]));
    assert_eq!(v["status"], "synced", "{v}");
    assert_eq!(v["added"], 1, "{v}");
    assert_eq!(v["deleted"], 1, "{v}");
    assert_eq!(changes_as_lines(&v), lines);
    assert_ne!(fs::read_link(f.dest()).unwrap(), live);
    assert_eq!(mirror(&f.dest()), mirror(&f.src()));

    // Up to date: an empty list; without --itemize: no key at all.
    let v = json_summary(&f.sync(&["--itemize", "--json"]));
    assert_eq!(v["status"], "up to date", "{v}");
    assert_eq!(v["changes"], serde_json::json!([]), "{v}");
    let v = json_summary(&f.sync(&["--json"]));
    assert!(v.get("changes").is_none(), "{v}");
}

#[test]
fn json_itemize_paths_are_escaped_as_in_the_text_lines() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let f = Fixture::new();
    fs::write(f.src().join(OsStr::from_bytes(b"new\nline")), "1").unwrap();
    fs::write(f.src().join(OsStr::from_bytes(b"\xff-not-utf8")), "2").unwrap();
    fs::create_dir(f.src().join("back\\slash")).unwrap();
    let text = f.sync(&["-n", "-i"]).ok();
    let v = json_summary(&f.sync(&["-n", "-i", "--json"]));
    let lines = changes_as_lines(&v);
    for want in ["+ new\\nline", "+ \\xff-not-utf8", "+ back\\\\slash/"] {
        assert!(lines.iter().any(|l| l == want), "{want}: {v}");
        assert!(
            text.stdout.contains(&format!("{want}\n")),
            "{}",
            text.stdout
        );
    }
}

#[test]
fn retains_keep_generations_and_removes_older_ones() {
    let f = Fixture::new();
    let mut gens = Vec::new();
    for i in 0..4 {
        f.file("v", &format!("version {i}"));
        f.sync(&["--keep", "1"]).ok();
        gens.push(fs::read_link(f.dest()).unwrap());
    }
    let present: Vec<_> = fs::read_dir(f.state().join("gen"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(present.len(), 2, "{present:?}");
    for g in &gens[2..] {
        assert!(f.path("vol").join(g).is_dir(), "{g:?} kept");
    }
    assert!(
        fs::read_dir(f.state().join("stage"))
            .unwrap()
            .next()
            .is_none(),
        "no staging left"
    );
}

#[test]
fn skips_fifos_with_a_warning() {
    let f = Fixture::new();
    f.file("a", "1");
    let fifo = f.src().join("pipe");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let out = f.sync(&[]).ok();
    assert!(
        out.stderr.contains("skipping FIFO") && out.stderr.contains("pipe"),
        "{}",
        out.stderr
    );
    assert!(!f.dest().join("pipe").exists());
}

#[test]
fn names_that_break_line_formats_survive() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let f = Fixture::new();
    let names: Vec<&[u8]> = vec![
        b"with space",
        b"new\nline",
        b"tab\there",
        b"back\\slash",
        b"\xff\xfe-not-utf8",
        b"%41 percent",
    ];
    for n in &names {
        fs::write(f.src().join(OsStr::from_bytes(n)), n).unwrap();
    }
    fs::write(f.src().join("x".repeat(255)), "long").unwrap();
    let mut deep = f.src();
    for i in 0..30 {
        deep = deep.join(format!("level{i}"));
    }
    fs::create_dir_all(&deep).unwrap();
    fs::write(deep.join("bottom"), "deep").unwrap();
    f.sync(&[]).ok();
    assert_eq!(mirror(&f.dest()), mirror(&f.src()));
    // The manifest round-trips them: a second sync is up to date.
    assert!(f.sync(&[]).ok().stdout.contains("up to date"));
    let out = f.sync(&["-n", "-i"]).ok();
    assert!(
        out.stdout.lines().all(|l| l.starts_with("packsync")),
        "{}",
        out.stdout
    );
}

#[test]
fn several_sources_overlay_in_order() {
    let f = Fixture::new();
    f.file("a/same", "from first");
    f.file("a/only1", "1");
    fs::create_dir_all(f.path("src2/a")).unwrap();
    fs::write(f.path("src2/a/same"), "from second").unwrap();
    fs::write(f.path("src2/only2"), "2").unwrap();
    f.packsync(&["sync", "src/", "src2", "vol/packs"]).ok();
    assert_eq!(
        fs::read_to_string(f.dest().join("a/same")).unwrap(),
        "from second"
    );
    assert!(f.dest().join("a/only1").exists() && f.dest().join("only2").exists());
}

// ---- validation: one line naming the path, nothing written ----

#[test]
fn missing_source_is_refused() {
    let f = Fixture::new();
    let before = f.volume();
    f.refused(
        &["sync", "nope", "vol/packs"],
        2,
        "nope: source does not exist",
    );
    assert_eq!(f.volume(), before);
}

#[test]
fn source_that_is_a_file_is_refused() {
    let f = Fixture::new();
    f.file("a", "1");
    f.refused(
        &["sync", "src/a", "vol/packs"],
        2,
        "src/a: source is not a directory",
    );
    assert_eq!(f.volume(), Vec::<String>::new());
}

#[test]
fn dest_inside_source_and_source_inside_dest_are_refused() {
    let f = Fixture::new();
    f.file("a", "1");
    f.file("d/x", "1");
    f.refused(&["sync", "src", "src/out"], 2, "DEST is inside SOURCE");
    assert!(!f.src().join("out").exists());
    f.sync(&[]).ok();
    let before = f.volume();
    f.refused(
        &["sync", "vol/packs/d", "vol/packs"],
        2,
        "SOURCE is inside DEST",
    );
    f.refused(&["sync", "vol/packs/", "vol/packs"], 2, "is inside");
    f.refused(
        &["sync", "vol/.packs.packsync", "vol/packs"],
        2,
        "SOURCE is inside DEST",
    );
    assert_eq!(f.volume(), before);
}

#[test]
fn missing_parent_suggests_mkpath() {
    let f = Fixture::new();
    f.file("a", "1");
    f.refused(&["sync", "src", "vol/x/y/packs"], 2, "--mkpath");
    assert!(!f.path("vol/x").exists());
    f.packsync(&["sync", "--mkpath", "src", "vol/x/y/packs"])
        .ok();
    assert!(f.path("vol/x/y/packs/a").exists());
}

#[test]
fn dest_that_is_a_file_is_refused() {
    let f = Fixture::new();
    f.file("a", "1");
    fs::write(f.dest(), "not a dir").unwrap();
    let before = f.volume();
    f.sync_refused(&[], 2, "not a directory");
    assert_eq!(f.volume(), before);
}

#[test]
fn a_foreign_symlink_at_dest_is_refused() {
    let f = Fixture::new();
    f.file("a", "1");
    fs::create_dir(f.path("elsewhere")).unwrap();
    symlink("../elsewhere", f.dest()).unwrap();
    let before = f.volume();
    f.sync_refused(&[], 3, "not a packsync destination");
    assert_eq!(f.volume(), before);
    assert_eq!(fs::read_dir(f.path("elsewhere")).unwrap().count(), 0);
}

#[test]
fn empty_source_does_not_replace_a_full_tree() {
    let f = Fixture::new();
    f.file("a", "1");
    f.sync(&[]).ok();
    fs::remove_file(f.src().join("a")).unwrap();
    let before = f.volume();
    f.sync_refused(&[], 3, "--allow-empty");
    assert_eq!(f.volume(), before);
    f.sync(&["--allow-empty"]).ok();
    assert_eq!(fs::read_dir(f.dest()).unwrap().count(), 0);
}

/// A generation published empty, then files dropped into it on the
/// volume: an empty source does not wipe them without `--allow-empty`,
/// whichever way the sync is planned.
#[test]
fn empty_source_does_not_replace_files_dropped_into_an_empty_generation() {
    let f = Fixture::new();
    f.sync(&["--allow-empty"]).ok();
    fs::write(f.dest().join("dropped"), "kept").unwrap();
    let before = f.volume();
    for flags in [&[][..], &["--itemize"], &["--checksum"], &["--dry-run"]] {
        f.sync_refused(flags, 3, "--allow-empty");
        assert_eq!(f.volume(), before, "{flags:?}");
    }
    f.sync(&["--allow-empty"]).ok();
    assert_eq!(fs::read_dir(f.dest()).unwrap().count(), 0);
}

#[test]
fn max_delete_guards_mass_deletion() {
    let f = Fixture::new();
    for i in 0..5 {
        f.file(&format!("f{i}"), "x");
    }
    f.sync(&[]).ok();
    for i in 0..3 {
        fs::remove_file(f.src().join(format!("f{i}"))).unwrap();
    }
    let before = f.volume();
    f.sync_refused(&["--max-delete", "2"], 3, "refusing to delete 3 entries");
    assert_eq!(f.volume(), before);
    f.sync(&["--max-delete", "3"]).ok();
}

// ---- --json errors: one object on stdout, the same line on stderr ----

/// Check a failed `--json` run as a script would: the exit status, stdout
/// one JSON object `{"status": "error", "error", "exit_code"}`, and the
/// message the same as the line on stderr. Returns the message.
#[track_caller]
fn json_error(run: &Run, code: i32) -> String {
    assert_eq!(
        run.code, code,
        "stdout: {}\nstderr: {}",
        run.stdout, run.stderr
    );
    assert_eq!(run.stdout.lines().count(), 1, "one line: {}", run.stdout);
    let v: serde_json::Value =
        serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}: {}", run.stdout));
    assert_eq!(v["status"], "error", "{v}");
    assert_eq!(v["exit_code"], code, "{v}");
    assert_eq!(v.as_object().unwrap().len(), 3, "{v}");
    v["error"].as_str().expect("error is text").to_string()
}

#[test]
fn json_sync_errors_are_json_on_stdout_with_the_same_exit_code() {
    let f = Fixture::new();
    f.file("a", "1");
    f.file("b", "2");
    let before = f.volume();
    // Bad arguments: exit 2, naming the path.
    let run = f.refused(
        &["sync", "--json", "nope", "vol/packs"],
        2,
        "nope: source does not exist",
    );
    let msg = json_error(&run, 2);
    assert_eq!(msg, "nope: source does not exist");
    assert_eq!(run.stderr, format!("packsync: error: {msg}\n"));
    assert_eq!(f.volume(), before);
    // A guard: exit 3.
    f.sync(&["--json"]).ok();
    fs::remove_file(f.src().join("a")).unwrap();
    let run = f.sync_refused(&["--json", "--max-delete", "0"], 3, "refusing to delete");
    let msg = json_error(&run, 3);
    assert!(msg.contains("refusing to delete 1 entries"), "{msg}");
    assert!(msg.starts_with("vol/packs: "), "{msg}");
    // Without --json, stdout stays empty.
    let run = f.sync_refused(&["--max-delete", "0"], 3, "refusing to delete 1 entries");
    assert_eq!(run.stdout, "");
}

#[test]
fn json_status_and_verify_errors_are_json() {
    let f = Fixture::new();
    for cmd in ["status", "verify"] {
        let run = f.packsync(&[cmd, "--json", "vol/packs"]);
        let msg = json_error(&run, 3);
        assert!(
            msg.starts_with("vol/packs: not a packsync destination"),
            "{cmd}: {msg}"
        );
        assert_eq!(run.stderr, format!("packsync: error: {msg}\n"));
    }
}

#[test]
fn json_command_line_errors_are_json_and_keep_clap_usage_on_stderr() {
    let f = Fixture::new();
    let run = f.unchanged_by(|| f.sync(&["--json", "--no-such-flag"]));
    let msg = json_error(&run, 2);
    assert!(msg.contains("--no-such-flag"), "{msg}");
    assert!(
        run.stderr.contains("Usage: packsync sync"),
        "{}",
        run.stderr
    );
    // A value clap rejects.
    let run = f.unchanged_by(|| f.sync(&["--json", "--layout", "sideways"]));
    let msg = json_error(&run, 2);
    assert!(msg.contains("sideways"), "{msg}");
    // Without --json, clap's text alone.
    let run = f.unchanged_by(|| f.sync(&["--no-such-flag"]));
    assert_eq!(run.code, 2);
    assert_eq!(run.stdout, "");
    // --help is not an error: its text, not JSON.
    let run = f.packsync(&["sync", "--json", "--help"]).ok();
    assert!(run.stdout.starts_with("Mirror SOURCE"), "{}", run.stdout);
}

#[test]
fn owners_are_mirrored_as_root() {
    if !is_root() {
        crate::fixture::skip("owners are mirrored only as root");
        return;
    }
    let f = Fixture::new();
    let p = f.file("owned", "x");
    std::os::unix::fs::lchown(&p, Some(1234), Some(5678)).unwrap();
    let l = f.src().join("link");
    symlink("owned", &l).unwrap();
    std::os::unix::fs::lchown(&l, Some(42), Some(43)).unwrap();
    fs::set_permissions(&p, fs::Permissions::from_mode(0o4755)).unwrap();
    f.sync(&[]).ok();
    let m = fs::metadata(f.dest().join("owned")).unwrap();
    assert_eq!(
        (m.uid(), m.gid(), m.permissions().mode() & 0o7777),
        (1234, 5678, 0o4755)
    );
    let m = fs::symlink_metadata(f.dest().join("link")).unwrap();
    assert_eq!((m.uid(), m.gid()), (42, 43));
    assert!(f.sync(&[]).ok().stdout.contains("up to date"));
}

#[test]
fn a_directory_left_by_cp_is_taken_over() {
    let f = Fixture::new();
    f.file("new", "1");
    fs::create_dir(f.dest()).unwrap();
    fs::write(f.dest().join("stale"), "old").unwrap();
    f.sync(&[]).ok();
    assert!(fs::symlink_metadata(f.dest())
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(mirror(&f.dest()), mirror(&f.src()));
}

#[test]
fn completions_are_committed_and_current() {
    for shell in ["bash", "zsh", "fish"] {
        let out = packsync().args(["completions", shell]).output().unwrap();
        assert!(out.status.success());
        let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("completions")
            .join(match shell {
                "bash" => "packsync.bash",
                "zsh" => "_packsync",
                _ => "packsync.fish",
            });
        let committed = fs::read(&file).unwrap_or_default();
        assert!(
            committed == out.stdout,
            "{} is out of date: run `packsync completions {shell} > {}`",
            file.display(),
            file.display()
        );
    }
}

/// `--no-fsync` flushes nothing, even where a durable sync fsyncs every
/// staged file and directory (FUSE, where `syncfs` does not flush; forced
/// here on a local directory with the fault build's PACKSYNC_TEST_FLUSH).
/// Counted with strace, as a user checking the flag would.
#[test]
fn no_fsync_flushes_nothing_even_where_each_file_is_fsynced() {
    if !cfg!(feature = "fault-injection") {
        crate::fixture::skip("needs --features fault-injection (PACKSYNC_TEST_FLUSH)");
        return;
    }
    if std::process::Command::new("strace")
        .arg("-V")
        .output()
        .is_err()
    {
        crate::fixture::skip("no strace");
        return;
    }
    let f = Fixture::new();
    for i in 0..20 {
        f.file(&format!("pack/f{i}"), "x");
    }
    let flushes = |dest: &str, extra: &[&str]| -> u64 {
        let log = f.path("strace.txt");
        let out = crate::fixture::clean_env(&mut std::process::Command::new("strace"))
            .args(["-f", "-c", "-e", "trace=fsync,fdatasync,syncfs", "-o"])
            .arg(&log)
            .arg(crate::fixture::bin())
            .args(["sync", "-q"])
            .args(extra)
            .args(["src", dest])
            .env("PACKSYNC_TEST_FLUSH", "each")
            .current_dir(f.dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        // The `total` row's third column is the number of calls.
        let text = fs::read_to_string(&log).unwrap();
        text.lines()
            .find(|l| l.ends_with(" total"))
            .map_or(0, |l| l.split_whitespace().nth(3).unwrap().parse().unwrap())
    };
    let durable = flushes("vol/durable", &[]);
    assert!(durable >= 21, "each file and directory fsynced: {durable}");
    assert_eq!(flushes("vol/fast", &["--no-fsync"]), 0);
}
