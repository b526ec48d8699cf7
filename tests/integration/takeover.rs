//! Nothing is lost by a habit: a directory `cp -aR` left at DEST is kept as
//! a generation when a sync takes it over, a DEST one level too deep is
//! refused, and what `verify` found damaged is repaired by the next sync.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use crate::fixture::{changes_as_lines, json, mirror, set_mtime, write_at, Fixture, Run};

/// A tree as `cp -aR` leaves it at DEST: two packs, modes, old mtimes, a
/// symlink, a hardlink.
fn cp_left_tree(dest: &Path) {
    fs::create_dir_all(dest.join("core/actions")).unwrap();
    fs::create_dir_all(dest.join("linux")).unwrap();
    write_at(
        &dest.join("core/actions/run.py"),
        b"print(1)\n",
        1_600_000_000,
        5,
    );
    fs::set_permissions(
        dest.join("core/actions/run.py"),
        fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    write_at(
        &dest.join("core/pack.yaml"),
        b"name: core\n",
        1_600_000_001,
        0,
    );
    fs::hard_link(dest.join("core/pack.yaml"), dest.join("core/same.yaml")).unwrap();
    write_at(
        &dest.join("linux/pack.yaml"),
        b"name: linux\n",
        1_600_000_002,
        7,
    );
    std::os::unix::fs::symlink("../core/pack.yaml", dest.join("linux/core.yaml")).unwrap();
    set_mtime(&dest.join("linux/core.yaml"), 1_600_000_003, 0);
    for d in ["core/actions", "core", "linux", ""] {
        set_mtime(&dest.join(d), 1_600_000_100, 9);
    }
}

/// The generation the take-over warning names, checking the line itself.
#[track_caller]
fn kept_generation(run: &Run) -> String {
    let line = run
        .stderr
        .lines()
        .find(|l| l.contains("took over the plain directory"))
        .unwrap_or_else(|| panic!("no take-over warning: {}", run.stderr));
    let gen = line
        .split("kept as generation ")
        .nth(1)
        .and_then(|r| r.split(':').next())
        .unwrap_or_else(|| panic!("{line}"))
        .to_string();
    assert_eq!(
        line,
        format!(
            "packsync: warning: took over the plain directory vol/packs (2 entries); \
             kept as generation {gen}: `packsync rollback vol/packs` restores it"
        )
    );
    gen
}

fn takes_over_and_rolls_back(layout: &[&str]) {
    let f = Fixture::new();
    f.file("core/pack.yaml", "name: core v2\n");
    cp_left_tree(&f.dest());
    let old = mirror(&f.dest());
    let out = f.sync(layout);
    if out.code == 3 && out.stderr.contains("RENAME_EXCHANGE") {
        crate::fixture::skip("the temp directory's filesystem lacks RENAME_EXCHANGE");
        return;
    }
    let out = out.ok();
    let gen = kept_generation(&out);
    assert_eq!(mirror(&f.dest()), mirror(&f.src()), "the new tree is live");
    let status = json(&f.packsync(&["status", "--json", "vol/packs"]).ok());
    let retained: Vec<&str> = status["retained"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["generation"].as_str().unwrap())
        .collect();
    assert_eq!(retained, vec![gen.as_str()]);

    // Every old file comes back: bytes, modes, mtimes, the link, the hardlink.
    let back = f.packsync(&["rollback", "vol/packs"]).ok();
    assert!(
        back.stdout.contains(&format!("to generation {gen}")),
        "{}",
        back.stdout
    );
    assert_eq!(mirror(&f.dest()), old);
    f.packsync(&["verify", "vol/packs"]).ok();

    // Published over again, it is retired like any other generation.
    let again = f.sync(layout).ok();
    assert!(!again.stderr.contains("took over"), "{}", again.stderr);
    assert_eq!(mirror(&f.dest()), mirror(&f.src()));
    assert!(f.state().join("gen").join(&gen).is_dir());
    f.packsync(&["gc", "--keep", "0", "--grace", "0", "vol/packs"])
        .ok();
    assert!(
        !f.state().join("gen").join(&gen).exists(),
        "retired by --keep 0"
    );
    assert!(!f
        .state()
        .join("meta")
        .join(format!("{gen}.manifest"))
        .exists());
}

#[test]
fn a_directory_left_by_cp_is_kept_as_a_generation_that_rollback_restores() {
    takes_over_and_rolls_back(&[]);
}

#[test]
fn with_layout_dir_a_directory_left_by_cp_is_kept_too() {
    takes_over_and_rolls_back(&["--layout", "dir"]);
}

/// `cp -a` of the source at DEST: the take-over plans no change, its
/// hardlinks included (the pair is one inode on both sides), and only
/// what was added since is listed. A copy that lost the hardlink (`cp -R`)
/// lists the pair as changed: the sync joins it again.
#[test]
fn a_copy_left_by_cp_a_is_planned_as_it_is_hardlinks_included() {
    let f = Fixture::new();
    cp_left_tree(&f.src());
    fs::create_dir_all(f.path("vol")).unwrap();
    let cp = |flags: &[&str]| {
        let ok = std::process::Command::new("cp")
            .args(flags)
            .arg(f.src())
            .arg(f.dest())
            .status()
            .unwrap();
        assert!(ok.success());
    };
    cp(&["-a"]);
    // A FIFO in DEST is in no listing, and said so, dry run or not.
    let ok = std::process::Command::new("mkfifo")
        .arg(f.dest().join("fifo"))
        .status()
        .unwrap();
    assert!(ok.success());
    let (s, ns) = crate::fixture::mtime(&f.src());
    set_mtime(&f.dest(), s, ns);
    let skipped = serde_json::json!(["skipping FIFO vol/packs/fifo"]);
    let v = json(&f.sync(&["--dry-run", "--itemize", "--json"]).ok());
    assert_eq!(v["status"], "would sync", "{v}");
    assert_eq!(changes_as_lines(&v), Vec::<String>::new(), "{v}");
    assert_eq!(
        (v["added"].as_u64(), v["changed"].as_u64()),
        (Some(0), Some(0))
    );
    assert_eq!(v["warnings"], skipped, "{v}");
    // (The volume is not read whole here: opening the FIFO would block.)
    assert!(!f.state().exists(), "a dry run writes nothing");
    assert!(fs::symlink_metadata(f.dest()).unwrap().is_dir());

    f.file("linux/actions/new.py", "new\n");
    let out = f.sync(&["--itemize", "--json"]).ok();
    assert!(
        out.stderr
            .starts_with("packsync: warning: skipping FIFO vol/packs/fifo\n"),
        "{}",
        out.stderr
    );
    let v = json(&out);
    assert_eq!(v["warnings"][0], skipped[0], "{v}");
    assert_eq!(v["status"], "synced", "{v}");
    assert_eq!(
        changes_as_lines(&v),
        ["~ linux/", "+ linux/actions/", "+ linux/actions/new.py"]
    );
    assert_eq!(mirror(&f.dest()), mirror(&f.src()));
    let links = |p: &Path| fs::metadata(p.join("core/pack.yaml")).unwrap().nlink();
    assert_eq!(
        fs::metadata(f.dest().join("core/pack.yaml")).unwrap().ino(),
        fs::metadata(f.dest().join("core/same.yaml")).unwrap().ino(),
        "the pair is one inode in the new generation"
    );
    assert!(links(&f.dest()) >= 2);

    // The same source over a copy that split the pair.
    let f2 = Fixture::new();
    cp_left_tree(&f2.src());
    fs::create_dir_all(f2.path("vol")).unwrap();
    let ok = std::process::Command::new("cp")
        .args(["-R", "--preserve=mode,timestamps", "--no-dereference"])
        .arg(f2.src())
        .arg(f2.dest())
        .status()
        .unwrap();
    assert!(ok.success());
    let v = json(&f2.sync(&["--itemize", "--json"]).ok());
    assert_eq!(
        changes_as_lines(&v),
        ["~ core/pack.yaml", "~ core/same.yaml"],
        "{v}"
    );
    assert_eq!(mirror(&f2.dest()), mirror(&f2.src()));
}

/// A live generation whose manifest was lost, synced with `--checksum`:
/// each file read on both sides, and the ones equal are hardlinked from
/// the live generation, as the dry run said they would be.
#[test]
fn with_its_manifest_lost_checksum_reuses_what_it_reads_equal() {
    let f = Fixture::new();
    for (name, text) in [("a", "aaaa"), ("d/b", "bbbb"), ("d/c", "cccc")] {
        f.file(name, text);
    }
    f.sync(&[]).ok();
    let gen = live_gen(&f);
    fs::remove_file(f.state().join("meta").join(format!("{gen}.manifest"))).unwrap();
    f.file("d/c", "CCCC");
    let plan = json(&f.sync(&["--checksum", "--dry-run", "--json"]).ok());
    let v = json(&f.sync(&["--checksum", "--json"]).ok());
    assert_eq!(v["status"], "synced", "{v}");
    for key in ["changed", "copied", "reused"] {
        assert_eq!(v[key], plan[key], "{key}: {v} against {plan}");
    }
    assert_eq!(
        (v["copied"].as_u64(), v["reused"].as_u64()),
        (Some(1), Some(2)),
        "{v}"
    );
    let old = f.state().join("gen").join(&gen);
    assert_eq!(ino(&old.join("a")), ino(&f.dest().join("a")), "a is linked");
    assert_eq!(mirror(&f.dest()), mirror(&f.src()));
}

/// The first sync into a DEST that a generation's directory was taken
/// for: refused, nothing written anywhere on the volume.
#[test]
fn a_dest_inside_a_published_generation_or_a_state_directory_is_refused() {
    let f = Fixture::new();
    f.file("hello_st2/pack.yaml", "name: hello\n");
    f.sync(&[]).ok();
    let gen = fs::read_link(f.dest())
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let inside = format!("is inside generation {gen} of ");
    f.refused(&["sync", "src", "vol/packs/hello_st2"], 2, &inside);
    f.refused(
        &["sync", "src", "vol/packs/new/deeper", "--mkpath"],
        2,
        &inside,
    );
    let state = format!("vol/.packs.packsync/gen/{gen}/hello_st2");
    f.refused(&["sync", "src", &state], 2, &inside);
    f.refused(
        &["sync", "src", "vol/.packs.packsync/stage"],
        2,
        "is inside the state directory",
    );
    f.refused(
        &["sync", "src", "vol/.packs.packsync"],
        2,
        "DEST is a packsync state directory",
    );
}

#[test]
fn a_dest_inside_a_dir_layout_tree_is_refused() {
    let f = Fixture::new();
    f.file("hello_st2/pack.yaml", "name: hello\n");
    let out = f.sync(&["--layout", "dir"]);
    if out.code == 3 && out.stderr.contains("RENAME_EXCHANGE") {
        crate::fixture::skip("the temp directory's filesystem lacks RENAME_EXCHANGE");
        return;
    }
    out.ok();
    f.refused(
        &["sync", "src", "vol/packs/hello_st2"],
        2,
        "which packsync publishes",
    );
}

/// Write `data` (the same length) over `path` and put its mtime back.
fn damage(path: &Path, data: &[u8]) {
    let m = fs::metadata(path).unwrap();
    assert_eq!(m.len(), data.len() as u64);
    let (s, ns) = (m.mtime(), m.mtime_nsec() as u32);
    let mut perms = m.permissions();
    let mode = perms.mode();
    perms.set_mode(0o644);
    fs::set_permissions(path, perms.clone()).unwrap();
    fs::write(path, data).unwrap();
    perms.set_mode(mode);
    fs::set_permissions(path, perms).unwrap();
    set_mtime(path, s, ns);
}

fn ino(path: &Path) -> u64 {
    fs::metadata(path).unwrap().ino()
}

fn live_gen(f: &Fixture) -> String {
    fs::read_link(f.dest())
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

#[test]
fn what_verify_found_damaged_the_next_sync_repairs() {
    let f = Fixture::new();
    f.file("core/a.py", "good bytes\n");
    f.file("core/b.py", "untouched\n");
    f.sync(&[]).ok();
    let first = live_gen(&f);
    let b = ino(&f.dest().join("core/b.py"));

    damage(&f.dest().join("core/a.py"), b"evil bytes\n");
    f.packsync(&["verify", "vol/packs"]).fails(
        4,
        "recorded: the next `packsync sync` copies those paths afresh",
    );
    let status = json(&f.packsync(&["status", "--json", "vol/packs"]).ok());
    assert_eq!(status["damaged"]["paths"], 1, "{status}");
    assert_eq!(status["damaged"]["first"][0], "core/a.py");
    let shown = f.packsync(&["status", "vol/packs"]).ok().stdout;
    assert!(
        shown.contains(&format!(
            "damaged: `packsync verify` found 1 path of generation {first} differing from its \
             manifest (core/a.py); the next sync copies it afresh"
        )),
        "{shown}"
    );

    // A dry run plans it as a change, and lists it.
    let planned = json(&f.sync(&["--dry-run", "--itemize", "--json"]).ok());
    assert_eq!(planned["changed"], 1, "{planned}");
    assert_eq!(planned["changes"][0]["path"], "core/a.py", "{planned}");
    // The quick compare would call it up to date: a new generation instead.
    let out = f.sync(&[]).ok();
    assert!(out.stdout.contains("1 copied"), "{}", out.stdout);
    assert_ne!(live_gen(&f), first);
    assert_eq!(
        fs::read(f.dest().join("core/a.py")).unwrap(),
        b"good bytes\n"
    );
    assert_eq!(ino(&f.dest().join("core/b.py")), b, "still hardlinked");
    f.packsync(&["verify", "vol/packs"]).ok();
    let status = json(&f.packsync(&["status", "--json", "vol/packs"]).ok());
    assert!(status["damaged"].is_null(), "{status}");

    // With another change in the source (a streamed update otherwise): the
    // damaged file is still copied, never linked from the live generation.
    let second = live_gen(&f);
    damage(&f.dest().join("core/a.py"), b"worse bytes");
    f.packsync(&["verify", "vol/packs"]).fails(4, "recorded");
    f.file("core/c.py", "new\n");
    let out = f.sync(&[]).ok();
    assert!(out.stdout.contains("2 copied"), "{}", out.stdout);
    assert_ne!(live_gen(&f), second);
    assert_eq!(
        fs::read(f.dest().join("core/a.py")).unwrap(),
        b"good bytes\n"
    );
    assert_eq!(ino(&f.dest().join("core/b.py")), b, "still hardlinked");
    f.packsync(&["verify", "vol/packs"]).ok();
}

#[test]
fn what_verify_found_damaged_in_an_archive_s_tree_the_next_sync_repairs() {
    // The archive is unchanged, so its own hash would call the tree up to
    // date: the record sends the damaged file to be unpacked afresh.
    let f = Fixture::new();
    f.file("core/a.py", "good bytes\n");
    f.file("core/b.py", "untouched\n");
    let ok = std::process::Command::new("tar")
        .args(["-cf", "packs.tar", "-C", "src", "."])
        .current_dir(f.path(""))
        .status()
        .unwrap()
        .success();
    assert!(ok, "tar");
    let sync = |f: &Fixture| {
        json(
            &f.packsync(&["sync", "--json", "--grace", "0", "packs.tar", "vol/packs"])
                .ok(),
        )
    };
    sync(&f);
    let first = live_gen(&f);
    let b = ino(&f.dest().join("core/b.py"));
    damage(&f.dest().join("core/a.py"), b"evil bytes\n");
    f.packsync(&["verify", "vol/packs"]).fails(4, "recorded");
    let v = sync(&f);
    assert_eq!((&v["copied"], &v["reused"]), (&1.into(), &1.into()), "{v}");
    assert_ne!(live_gen(&f), first);
    assert_eq!(
        fs::read(f.dest().join("core/a.py")).unwrap(),
        b"good bytes\n"
    );
    assert_eq!(ino(&f.dest().join("core/b.py")), b, "still hardlinked");
    f.packsync(&["verify", "vol/packs"]).ok();
    let again = sync(&f);
    assert_eq!(again["status"], "up to date", "{again}");
}

#[test]
fn a_damage_record_that_does_not_parse_is_ignored_with_a_warning() {
    let f = Fixture::new();
    f.file("core/a.py", "good bytes\n");
    f.sync(&[]).ok();
    let gen = live_gen(&f);
    let record = f.state().join("meta").join(format!("{gen}.damaged"));
    fs::write(&record, "packsync-damaged 1\ngeneration elsewhere\n").unwrap();
    let out = f.sync(&[]).ok();
    assert!(out.stdout.contains("up to date"), "{}", out.stdout);
    assert!(
        out.stderr.contains(&format!(
            "packsync: warning: ignoring {}/meta/{gen}.damaged: it names generation \"elsewhere\"",
            "vol/.packs.packsync"
        )),
        "{}",
        out.stderr
    );
    // Too large to be read.
    fs::write(&record, vec![b'x'; 1 << 20]).unwrap();
    let out = f.sync(&[]).ok();
    assert!(out.stderr.contains("larger than"), "{}", out.stderr);
}

/// `--checksum` over a directory `cp -a` left: each file equal by its
/// listing is read on both sides and hardlinked from the directory kept
/// as a generation where its bytes are the source's; a same-size edit
/// under the same mtime is copied; two source files a hardlink joins in
/// DEST are copied apart, a group on one inode on both sides is linked.
/// What the dry run says is what the sync does.
#[test]
fn checksum_over_a_directory_left_by_cp_links_what_it_reads_equal() {
    let f = Fixture::new();
    cp_left_tree(&f.src());
    let t = 1_600_000_050;
    for name in ["linux/one", "linux/two", "linux/edited"] {
        write_at(&f.src().join(name), b"same bytes\n", t, 0);
    }
    set_mtime(&f.src().join("linux"), 1_600_000_100, 9);
    fs::create_dir_all(f.path("vol")).unwrap();
    let ok = std::process::Command::new("cp")
        .arg("-a")
        .arg(f.src())
        .arg(f.dest())
        .status()
        .unwrap();
    assert!(ok.success());
    // In DEST only: `one` and `two` made one inode; `edited` changed in
    // place, its size and mtime as they were.
    let keep_times = |change: &dyn Fn()| {
        let (s, ns) = crate::fixture::mtime(&f.dest().join("linux"));
        change();
        set_mtime(&f.dest().join("linux"), s, ns);
    };
    keep_times(&|| {
        fs::remove_file(f.dest().join("linux/two")).unwrap();
        fs::hard_link(f.dest().join("linux/one"), f.dest().join("linux/two")).unwrap();
    });
    write_at(&f.dest().join("linux/edited"), b"SAME BYTES\n", t, 0);

    let plan = f.unchanged_by(|| f.sync(&["--checksum", "--dry-run", "--json"]).ok());
    let plan = json(&plan);
    let run = f.sync(&["--checksum", "--json"]).ok();
    let kept = kept_generation(&run);
    let v = json(&run);
    assert_eq!(v["status"], "synced", "{v}");
    for key in ["added", "changed", "deleted", "copied", "reused"] {
        assert_eq!(v[key], plan[key], "{key}: {v} against {plan}");
    }
    // Copied: one, two (apart in the source) and edited; linked: run.py,
    // linux/pack.yaml, and the pair pack.yaml/same.yaml.
    assert_eq!(
        (v["copied"].as_u64(), v["reused"].as_u64()),
        (Some(3), Some(4)),
        "{v}"
    );
    assert_eq!(mirror(&f.dest()), mirror(&f.src()));
    assert_eq!(
        crate::fixture::links(&f.dest()),
        crate::fixture::links(&f.src())
    );
    let old = f.state().join("gen").join(&kept);
    for linked in ["core/actions/run.py", "core/pack.yaml", "linux/pack.yaml"] {
        assert_eq!(
            ino(&old.join(linked)),
            ino(&f.dest().join(linked)),
            "{linked}"
        );
    }
    for copied in ["linux/one", "linux/two", "linux/edited"] {
        assert_ne!(
            ino(&old.join(copied)),
            ino(&f.dest().join(copied)),
            "{copied}"
        );
    }
    f.packsync(&["verify", "vol/packs"]).ok();
    let v = json(&f.sync(&["--checksum", "--json"]).ok());
    assert_eq!(v["status"], "up to date", "{v}");
    // The directory kept is recorded as it was, its hardlinks (the pair
    // cp -a kept, the two joined) its own, not the new tree's links into it.
    f.packsync(&["rollback", "vol/packs"]).ok();
    f.packsync(&["verify", "vol/packs"]).ok();
    let manifest = fs::read_to_string(f.state().join("meta").join(format!("{kept}.manifest")));
    let grouped = manifest
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("f ") && l.split(' ').nth(7) != Some("-"))
        .count();
    assert_eq!(grouped, 4, "two groups of two paths");
}
