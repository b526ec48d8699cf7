//! `--layout fanout`, `--slot` and `--layout dir`: what a reader of DEST sees,
//! what is refused, and what is never touched.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::fixture::{mirror, snapshot, Fixture};

fn write(p: &Path, content: &str) {
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, content).unwrap();
}

/// Names in a directory, sorted.
fn names(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

fn link(p: &Path) -> String {
    fs::read_link(p).unwrap().to_string_lossy().into_owned()
}

fn set<const N: usize>(items: [&str; N]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// `packsync sync --layout fanout [--grace 0] [extra] SRC vol/packs`.
fn fanout(f: &Fixture, src: &str, extra: &[&str]) -> crate::fixture::Run {
    let mut args = vec!["sync", "--layout", "fanout"];
    if !extra.contains(&"--grace") {
        args.extend(["--grace", "0"]);
    }
    args.extend_from_slice(extra);
    args.push(src);
    args.push("vol/packs");
    f.packsync(&args)
}

fn is_real_dir(p: &Path) -> bool {
    fs::symlink_metadata(p).unwrap().is_dir()
}

#[test]
fn fanout_first_sync_into_an_existing_empty_directory() {
    let f = Fixture::new();
    f.file("aws/actions/run.py", "print('aws')\n");
    f.file("aws/pack.yaml", "name: aws\n");
    f.file("gcp/pack.yaml", "name: gcp\n");
    f.file("README", "top-level file\n");
    fs::set_permissions(
        f.src().join("aws/actions/run.py"),
        fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    // The volume's mount point: an empty directory that must stay one.
    fs::create_dir(f.dest()).unwrap();
    let ino = fs::metadata(f.dest()).unwrap().ino();
    let out = fanout(&f, "src", &[]).ok();
    assert!(out.stdout.contains("synced"), "{}", out.stdout);
    assert!(is_real_dir(&f.dest()));
    assert_eq!(
        fs::metadata(f.dest()).unwrap().ino(),
        ino,
        "DEST itself kept"
    );
    assert_eq!(
        names(&f.dest()),
        set(["..data", "..packsync", "README", "aws", "gcp"])
    );
    let data = link(&f.dest().join("..data"));
    assert!(data.starts_with("..packsync/gen/"), "{data}");
    for e in ["aws", "gcp", "README"] {
        assert_eq!(link(&f.dest().join(e)), format!("..data/{e}"));
    }
    for e in ["aws", "gcp"] {
        assert_eq!(mirror(&f.dest().join(e)), mirror(&f.src().join(e)), "{e}");
    }
    assert_eq!(
        fs::read_to_string(f.dest().join("README")).unwrap(),
        "top-level file\n"
    );
    // Nothing is written next to DEST: the state lives inside the volume.
    assert_eq!(names(&f.path("vol")), set(["packs"]));
    let before = f.volume();
    let out = fanout(&f, "src", &[]).ok();
    assert!(out.stdout.contains("up to date"), "{}", out.stdout);
    assert_eq!(f.volume(), before);
}

#[test]
fn fanout_creates_an_absent_dest_and_a_dry_run_writes_nothing() {
    let f = Fixture::new();
    f.file("aws/a", "1");
    let out = fanout(&f, "src", &["--dry-run", "--itemize"]).ok();
    assert!(out.stdout.contains("+ aws/a\n"), "{}", out.stdout);
    assert!(!f.dest().exists(), "dry run made DEST");
    fanout(&f, "src", &[]).ok();
    assert!(is_real_dir(&f.dest()));
    assert_eq!(fs::read_to_string(f.dest().join("aws/a")).unwrap(), "1");
}

#[test]
fn fanout_update_adds_and_removes_entry_links() {
    let f = Fixture::new();
    f.file("aws/pack.yaml", "v1");
    f.file("gcp/pack.yaml", "v1");
    fanout(&f, "src", &[]).ok();
    let old_data = link(&f.dest().join("..data"));
    fs::remove_dir_all(f.src().join("gcp")).unwrap();
    f.file("azure/pack.yaml", "v2 new");
    f.file("aws/pack.yaml", "v2 new");
    let out = fanout(&f, "src", &["--itemize"]).ok();
    assert!(out.stdout.contains("- gcp/\n"), "{}", out.stdout);
    assert!(out.stdout.contains("+ azure/\n"), "{}", out.stdout);
    assert_eq!(
        names(&f.dest()),
        set(["..data", "..packsync", "aws", "azure"])
    );
    assert_ne!(link(&f.dest().join("..data")), old_data);
    assert_eq!(link(&f.dest().join("azure")), "..data/azure");
    assert_eq!(
        fs::read_to_string(f.dest().join("aws/pack.yaml")).unwrap(),
        "v2 new"
    );
    for e in ["aws", "azure"] {
        assert_eq!(mirror(&f.dest().join(e)), mirror(&f.src().join(e)), "{e}");
    }
    // The previous generation is retained whole (a reader may hold it).
    let old = f.dest().join(&old_data);
    assert_eq!(names(&old), set(["aws", "gcp"]));
    assert_eq!(fs::read_to_string(old.join("aws/pack.yaml")).unwrap(), "v1");
}

#[test]
fn fanout_refuses_entries_it_did_not_create_and_adopt_replaces_them() {
    let f = Fixture::new();
    f.file("aws/pack.yaml", "new");
    f.file("gcp/pack.yaml", "new");
    // Left by `cp -aR src/. /vol/packs/` before packsync, and by mkfs.
    write(&f.dest().join("aws/pack.yaml"), "old");
    write(&f.dest().join("removed_pack/pack.yaml"), "old");
    write(&f.dest().join("notes.txt"), "old");
    fs::create_dir(f.dest().join("lost+found")).unwrap();
    let before = f.volume();
    let out = f.unchanged_by(|| fanout(&f, "src", &[]).fails(3, "--adopt"));
    assert!(
        out.stderr.contains("aws") && out.stderr.contains("removed_pack"),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains("lost+found"), "{}", out.stderr);
    assert_eq!(f.volume(), before, "a refused sync changes nothing");

    fanout(&f, "src", &["--adopt"]).ok();
    assert_eq!(
        names(&f.dest()),
        set(["..data", "..packsync", "aws", "gcp", "lost+found"])
    );
    assert_eq!(link(&f.dest().join("aws")), "..data/aws");
    assert_eq!(
        fs::read_to_string(f.dest().join("aws/pack.yaml")).unwrap(),
        "new"
    );
    assert!(
        is_real_dir(&f.dest().join("lost+found")),
        "mkfs's directory left alone"
    );
    // Adopted once: later syncs need no --adopt.
    f.file("aws/pack.yaml", "newer");
    fanout(&f, "src", &[]).ok();
    assert_eq!(
        fs::read_to_string(f.dest().join("aws/pack.yaml")).unwrap(),
        "newer"
    );
}

#[test]
fn fanout_reserves_dot_dot_names_and_refuses_a_dest_of_another_layout() {
    let f = Fixture::new();
    f.file("..data/x", "1");
    let before = f.volume();
    fanout(&f, "src", &[]).fails(2, "..data");
    assert_eq!(f.volume(), before, "a refused sync changes nothing");

    let g = Fixture::new();
    g.file("aws/a", "1");
    g.sync(&[]).ok(); // the default symlink layout
    let before = g.volume();
    g.unchanged_by(|| fanout(&g, "src", &[]).fails(3, "--layout symlink"));
    assert_eq!(g.volume(), before);

    let h = Fixture::new();
    h.file("aws/a", "1");
    fanout(&h, "src", &[]).ok();
    let before = h.volume();
    h.sync_refused(&[], 3, "--layout fanout");
    assert_eq!(h.volume(), before);
}

#[test]
fn slot_and_adopt_need_fanout_and_slot_names_are_checked() {
    let f = Fixture::new();
    f.file("a", "1");
    f.sync_refused(&["--slot", "x"], 2, "--slot needs --layout fanout");
    f.sync_refused(&["--adopt"], 2, "--adopt needs --layout fanout");
    f.unchanged_by(|| fanout(&f, "src", &["--slot", "../escape"]).fails(2, "--slot"));
    assert!(!f.dest().exists());
}

/// Two images publishing into one volume, each as its own slot.
fn two_slots() -> Fixture {
    let f = Fixture::new();
    write(&f.path("img-a/aws/pack.yaml"), "a1");
    write(&f.path("img-a/azure/pack.yaml"), "a1");
    write(&f.path("img-b/gcp/pack.yaml"), "b1");
    fs::create_dir(f.dest()).unwrap();
    fanout(&f, "img-a", &["--slot", "a"]).ok();
    fanout(&f, "img-b", &["--slot", "b"]).ok();
    f
}

#[test]
fn two_slots_share_one_dest_and_never_touch_each_other() {
    let f = two_slots();
    assert_eq!(
        names(&f.dest()),
        set(["..data-a", "..data-b", "..packsync", "aws", "azure", "gcp"])
    );
    assert_eq!(link(&f.dest().join("aws")), "..data-a/aws");
    assert_eq!(link(&f.dest().join("gcp")), "..data-b/gcp");
    assert!(link(&f.dest().join("..data-b")).starts_with("..packsync/slots/b/gen/"));
    let b_before = snapshot(&f.dest().join("..packsync/slots/b"), true);
    let lstat = |n: &str| {
        let m = fs::symlink_metadata(f.dest().join(n)).unwrap();
        (m.ino(), m.mtime(), m.mtime_nsec())
    };
    let (gcp, data_b) = (lstat("gcp"), lstat("..data-b"));

    // Slot a drops azure and changes aws: only its own links move.
    fs::remove_dir_all(f.path("img-a/azure")).unwrap();
    write(&f.path("img-a/aws/pack.yaml"), "a2");
    fanout(&f, "img-a", &["--slot", "a"]).ok();
    assert_eq!(
        names(&f.dest()),
        set(["..data-a", "..data-b", "..packsync", "aws", "gcp"])
    );
    assert_eq!(
        fs::read_to_string(f.dest().join("aws/pack.yaml")).unwrap(),
        "a2"
    );
    assert_eq!(lstat("gcp"), gcp, "slot b's entry link untouched");
    assert_eq!(lstat("..data-b"), data_b, "slot b's data link untouched");
    assert_eq!(
        snapshot(&f.dest().join("..packsync/slots/b"), true),
        b_before,
        "slot b's state untouched"
    );
    assert_eq!(
        fs::read_to_string(f.dest().join("gcp/pack.yaml")).unwrap(),
        "b1"
    );

    // Slot b emptied: its entries go, slot a's stay.
    fs::remove_dir_all(f.path("img-b/gcp")).unwrap();
    fanout(&f, "img-b", &["--slot", "b", "--allow-empty"]).ok();
    assert_eq!(
        names(&f.dest()),
        set(["..data-a", "..data-b", "..packsync", "aws"])
    );
}

#[test]
fn an_entry_claimed_by_two_slots_is_refused_and_nothing_changes() {
    let f = two_slots();
    // Image b now also ships aws, which slot a published.
    write(&f.path("img-b/aws/pack.yaml"), "b-aws");
    write(&f.path("img-b/new_pack/pack.yaml"), "b");
    let before = f.volume();
    let out =
        f.unchanged_by(|| fanout(&f, "img-b", &["--slot", "b"]).fails(3, "aws belongs to slot a"));
    assert!(!out.stderr.contains("gcp"), "{}", out.stderr);
    assert_eq!(f.volume(), before, "nothing changed");
    // --adopt takes over what packsync did not make, never another slot's entry.
    f.unchanged_by(|| {
        fanout(&f, "img-b", &["--slot", "b", "--adopt"]).fails(3, "aws belongs to slot a")
    });
    assert_eq!(f.volume(), before);
    // The sync without --slot is a slot of its own.
    write(&f.path("img-c/aws/pack.yaml"), "c");
    f.unchanged_by(|| fanout(&f, "img-c", &[]).fails(3, "aws belongs to slot a"));
    assert_eq!(f.volume(), before);
    // Once a drops it, b may take it.
    fs::remove_dir_all(f.path("img-a/aws")).unwrap();
    fanout(&f, "img-a", &["--slot", "a"]).ok();
    fanout(&f, "img-b", &["--slot", "b"]).ok();
    assert_eq!(link(&f.dest().join("aws")), "..data-b/aws");
    assert_eq!(
        fs::read_to_string(f.dest().join("aws/pack.yaml")).unwrap(),
        "b-aws"
    );
}

#[test]
fn slots_racing_for_one_new_entry_leave_it_to_exactly_one() {
    // No timing: whatever the interleaving, one slot owns the entry and the
    // other was refused with its data link unmoved.
    for round in 0..4 {
        let f = Fixture::new();
        fs::create_dir(f.dest()).unwrap();
        for s in ["a", "b"] {
            write(&f.path(&format!("img-{s}/{s}_only/x")), s);
            fanout(&f, &format!("img-{s}"), &["--slot", s]).ok();
            write(&f.path(&format!("img-{s}/shared/x")), s);
        }
        let data_before: Vec<String> = ["..data-a", "..data-b"]
            .iter()
            .map(|d| link(&f.dest().join(d)))
            .collect();
        let runs: Vec<_> = std::thread::scope(|sc| {
            let hs: Vec<_> = ["a", "b"]
                .iter()
                .map(|s| {
                    let f = &f;
                    sc.spawn(move || fanout(f, &format!("img-{s}"), &["--slot", s]))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let ok: Vec<usize> = (0..2).filter(|i| runs[*i].code == 0).collect();
        assert_eq!(
            ok.len(),
            1,
            "round {round}: exactly one wins: {:?}",
            runs.iter()
                .map(|r| (r.code, r.stderr.clone()))
                .collect::<Vec<_>>()
        );
        let (w, l) = (ok[0], 1 - ok[0]);
        let slot = ["a", "b"];
        assert_eq!(runs[l].code, 3, "{}", runs[l].stderr);
        assert_eq!(
            link(&f.dest().join("shared")),
            format!("..data-{}/shared", slot[w])
        );
        assert_eq!(
            fs::read_to_string(f.dest().join("shared/x")).unwrap(),
            slot[w]
        );
        assert_eq!(
            link(&f.dest().join(format!("..data-{}", slot[l]))),
            data_before[l],
            "the refused slot's data link did not move"
        );
    }
}

#[test]
fn fanout_readers_that_resolve_the_data_link_once_read_one_whole_generation() {
    let f = Fixture::new();
    let files = ["aws/a", "aws/sub/b", "gcp/c", "top"];
    let version = |v: &str| {
        for p in files {
            f.file(p, &format!("{v} {p}"));
        }
    };
    version("v1");
    fanout(&f, "src", &["--grace", "10m"]).ok();
    // A reader resolves ..data (and an entry link) once, then a sync runs.
    let data = fs::File::open(f.dest().join("..data")).unwrap();
    let aws = fs::File::open(f.dest().join("aws")).unwrap();
    version("v2 new");
    f.file("aws/added", "v2 only");
    fanout(&f, "src", &["--grace", "10m"]).ok();
    let through = |fd: &fs::File, rel: &str| {
        use std::os::fd::AsRawFd;
        fs::read_to_string(format!("/proc/self/fd/{}/{rel}", fd.as_raw_fd()))
    };
    for p in files {
        assert_eq!(through(&data, p).unwrap(), format!("v1 {p}"));
    }
    assert!(through(&data, "aws/added").is_err());
    assert_eq!(through(&aws, "a").unwrap(), "v1 aws/a");
    assert_eq!(through(&aws, "sub/b").unwrap(), "v1 aws/sub/b");
    // A fresh resolve sees the new one.
    assert_eq!(
        fs::read_to_string(f.dest().join("aws/a")).unwrap(),
        "v2 new aws/a"
    );
    assert_eq!(
        fs::read_to_string(f.dest().join("aws/added")).unwrap(),
        "v2 only"
    );
}

#[test]
fn fanout_readers_never_see_a_mix_while_writers_publish() {
    let f = Fixture::new();
    let files = ["aws/a", "aws/sub/b", "gcp/c", "top"];
    let trees: Vec<PathBuf> = (0..2).map(|i| f.path(&format!("v{i}"))).collect();
    for (i, t) in trees.iter().enumerate() {
        for p in files {
            write(&t.join(p), &format!("v{i}{}", "+".repeat(i)));
        }
    }
    fanout(&f, "v0", &["--grace", "10m"]).ok();
    let done = std::sync::atomic::AtomicBool::new(false);
    let reads = std::thread::scope(|sc| {
        let reader = sc.spawn(|| {
            // (reads, reads during which ..data moved, versions seen)
            let mut reads = (0, 0, BTreeSet::new());
            loop {
                let last = done.load(std::sync::atomic::Ordering::SeqCst);
                let link = || fs::read_link(f.dest().join("..data")).unwrap();
                let before = link();
                let root = fs::File::open(f.dest().join("..data")).unwrap();
                use std::os::fd::AsRawFd;
                let seen: BTreeSet<String> = files
                    .iter()
                    .map(|p| {
                        fs::read_to_string(format!("/proc/self/fd/{}/{p}", root.as_raw_fd()))
                            .unwrap_or_else(|e| panic!("{p}: {e}"))
                    })
                    .collect();
                assert_eq!(seen.len(), 1, "a mix of generations: {seen:?}");
                reads.0 += 1;
                if link() != before {
                    reads.1 += 1;
                }
                reads.2.extend(seen);
                if last {
                    return reads;
                }
            }
        });
        for i in 0..12 {
            fanout(
                &f,
                &format!("v{}", (i + 1) % 2),
                &["--grace", "10m", "--keep", "0"],
            )
            .ok();
        }
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        reader.join().unwrap()
    });
    let (n, moved, versions) = reads;
    assert_eq!(versions.len(), 2, "the reader saw both trees: {versions:?}");
    assert!(
        moved > 0,
        "none of {n} reads overlapped a publish: the test showed nothing"
    );
}

#[test]
fn dir_layout_keeps_dest_a_real_directory_and_swaps_it_whole() {
    let f = Fixture::new();
    f.file("aws/a", "v1");
    f.file("gone", "v1");
    let out = f.packsync(&["sync", "--layout", "dir", "src", "vol/packs"]);
    if out.code == 3 && out.stderr.contains("RENAME_EXCHANGE") {
        crate::fixture::skip("the temp directory's filesystem lacks RENAME_EXCHANGE");
        return;
    }
    out.ok();
    assert!(is_real_dir(&f.dest()));
    assert_eq!(mirror(&f.dest()), mirror(&f.src()));
    assert_eq!(names(&f.path("vol")), set([".packs.packsync", "packs"]));
    // A reader holding the old tree keeps it whole across the swap.
    let held = fs::File::open(f.dest()).unwrap();
    fs::remove_file(f.src().join("gone")).unwrap();
    f.file("aws/a", "v2 new");
    let dir_sync = || f.packsync(&["sync", "--layout", "dir", "src", "vol/packs"]);
    dir_sync().ok();
    assert!(is_real_dir(&f.dest()));
    assert_eq!(mirror(&f.dest()), mirror(&f.src()));
    use std::os::fd::AsRawFd;
    let old = PathBuf::from(format!("/proc/self/fd/{}", held.as_raw_fd()));
    assert_eq!(fs::read_to_string(old.join("aws/a")).unwrap(), "v1");
    assert_eq!(fs::read_to_string(old.join("gone")).unwrap(), "v1");
    // ...which is now a retained generation in the state directory.
    let gens = names(&f.state().join("gen"));
    assert_eq!(gens.len(), 1, "{gens:?}");
    let kept = f.state().join("gen").join(gens.iter().next().unwrap());
    assert_eq!(fs::read_to_string(kept.join("gone")).unwrap(), "v1");
    let before = f.volume();
    dir_sync().ok();
    assert_eq!(f.volume(), before, "up to date");
    // The default layout refuses to turn it into a link.
    f.sync_refused(&[], 3, "--layout dir");
}

#[test]
fn dir_layout_takes_over_a_plain_directory() {
    let f = Fixture::new();
    f.file("a", "new");
    write(&f.dest().join("stale"), "left by cp -aR");
    let out = f.sync(&["--layout", "dir"]);
    if out.code == 3 && out.stderr.contains("RENAME_EXCHANGE") {
        crate::fixture::skip("the temp directory's filesystem lacks RENAME_EXCHANGE");
        return;
    }
    out.ok();
    assert_eq!(mirror(&f.dest()), mirror(&f.src()));
}

/// A tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: PathBuf) -> Option<Tmpfs> {
        if !crate::fixture::is_root() {
            crate::fixture::skip("mounting a tmpfs needs root");
            return None;
        }
        fs::create_dir_all(&at).unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=16m", "tmpfs"])
            .arg(&at)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            crate::fixture::skip("cannot mount a tmpfs here");
            return None;
        }
        Some(Tmpfs(at))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[test]
fn dir_layout_works_on_tmpfs_and_refuses_a_mount_point() {
    let f = Fixture::new();
    let Some(t) = Tmpfs::mount(f.path("tmpfs")) else {
        return;
    };
    f.file("a", "v1");
    let dest = t.0.join("packs");
    let dest_s = dest.to_str().unwrap();
    f.packsync(&["sync", "--layout", "dir", "src", dest_s]).ok();
    assert!(is_real_dir(&dest));
    f.file("a", "v2 new");
    f.packsync(&["sync", "--layout", "dir", "src", dest_s]).ok();
    assert_eq!(mirror(&dest), mirror(&f.src()));
    // The tmpfs root is a mount point: it cannot be renamed, so it is refused whole.
    let before = snapshot(&f.path("tmpfs"), true);
    f.refused(
        &["sync", "--layout", "dir", "src", t.0.to_str().unwrap()],
        3,
        "mount point",
    );
    assert_eq!(snapshot(&f.path("tmpfs"), true), before);
    assert!(!f.path(".tmpfs.packsync").exists(), "no state left behind");
}

#[test]
fn dir_layout_is_refused_on_a_fuse_filesystem() {
    // A directory on FUSE (GlusterFS, sshfs): PACKSYNC_TEST_FUSE_DIR, else
    // a mount of the sshfs rig (as root, where the rig script is).
    use crate::faults::netfs;
    let (_lock, rig);
    let dir = match std::env::var_os("PACKSYNC_TEST_FUSE_DIR") {
        Some(d) => PathBuf::from(d),
        None if !crate::fixture::is_root() || !netfs::script().exists() => {
            crate::fixture::skip(
                "set PACKSYNC_TEST_FUSE_DIR to a writable directory on a FUSE filesystem, \
                 or run as root with the netfs rig",
            );
            return;
        }
        None => {
            _lock = netfs::rig_lock();
            rig = match netfs::Rig::up("sshfs") {
                Ok(r) => r,
                Err(e) => {
                    crate::fixture::skip(&format!("the sshfs rig did not come up: {e}"));
                    return;
                }
            };
            rig.mnt("A")
        }
    };
    let f = Fixture::new();
    f.file("a", "1");
    let base = dir.join(format!("packsync-fuse-test-{}", std::process::id()));
    fs::create_dir_all(&base).unwrap();
    let dest = base.join("packs");
    let out = f.packsync(&["sync", "--layout", "dir", "src", dest.to_str().unwrap()]);
    let left = names(&base);
    let _ = fs::remove_dir_all(&base);
    out.fails(3, "RENAME_EXCHANGE");
    assert!(left.is_empty(), "a refused sync left {left:?}");
}

#[test]
fn gc_keeps_every_slots_live_generation() {
    let f = two_slots();
    for v in ["a2", "a3"] {
        write(&f.path("img-a/aws/pack.yaml"), v);
        fanout(&f, "img-a", &["--slot", "a", "--keep", "5"]).ok();
    }
    let gens = |slot: &str| names(&f.dest().join(format!("..packsync/slots/{slot}/gen")));
    assert_eq!(gens("a").len(), 3);
    f.packsync(&["gc", "vol/packs", "--keep", "0", "--grace", "0"])
        .ok();
    let live = |slot: &str| {
        link(&f.dest().join(format!("..data-{slot}")))
            .rsplit('/')
            .next()
            .unwrap()
            .to_string()
    };
    assert_eq!(gens("a"), set([live("a").as_str()]));
    assert_eq!(gens("b"), set([live("b").as_str()]));
    assert_eq!(
        fs::read_to_string(f.dest().join("aws/pack.yaml")).unwrap(),
        "a3"
    );
    assert_eq!(
        fs::read_to_string(f.dest().join("gcp/pack.yaml")).unwrap(),
        "b1"
    );
}

#[test]
fn links_of_a_slot_removed_by_hand_can_be_adopted() {
    let f = two_slots();
    // Someone deletes slot b's data link and state, leaving its entry link behind.
    fs::remove_file(f.dest().join("..data-b")).unwrap();
    fs::remove_dir_all(f.dest().join("..packsync/slots/b")).unwrap();
    write(&f.path("img-c/gcp/pack.yaml"), "c");
    let before = f.volume();
    f.unchanged_by(|| fanout(&f, "img-c", &["--slot", "c"]).fails(3, "--adopt"));
    assert_eq!(f.volume(), before);
    fanout(&f, "img-c", &["--slot", "c", "--adopt"]).ok();
    assert_eq!(link(&f.dest().join("gcp")), "..data-c/gcp");
    assert_eq!(
        fs::read_to_string(f.dest().join("gcp/pack.yaml")).unwrap(),
        "c"
    );
    assert_eq!(
        link(&f.dest().join("aws")),
        "..data-a/aws",
        "slot a untouched"
    );
}

/// DEST published twice (v1, then v2) with `layout_args`; `dest` as given.
fn published_twice(f: &Fixture, layout_args: &[&str], dest: &str) {
    for v in ["v1", "v2 new"] {
        f.file("aws/pack.yaml", v);
        let mut args = vec![
            "sync",
            "--grace",
            "10m",
            "--label",
            v.split(' ').next().unwrap(),
        ];
        args.extend_from_slice(layout_args);
        args.extend(["src", dest]);
        f.packsync(&args).ok();
    }
}

#[test]
fn operator_commands_work_with_every_layout() {
    let cases: [(&str, &[&str], &[&str]); 4] = [
        ("symlink", &[], &[]),
        ("fanout", &["--layout", "fanout"], &[]),
        (
            "fanout slot",
            &["--layout", "fanout", "--slot", "a"],
            &["--slot", "a"],
        ),
        ("dir", &["--layout", "dir"], &[]),
    ];
    for (what, sync_args, pick) in cases {
        let f = Fixture::new();
        published_twice(&f, sync_args, "vol/packs");
        let with = |cmd: &[&str]| {
            let mut args = cmd.to_vec();
            args.extend_from_slice(pick);
            f.packsync(&args)
        };
        let status = with(&["status", "vol/packs", "--json"]).ok();
        let v: serde_json::Value = serde_json::from_str(status.stdout.trim()).unwrap();
        assert_eq!(v["resolves"], true, "{what}: {v}");
        assert_eq!(v["live"]["label"], "v2", "{what}: {v}");
        assert_eq!(v["retained"].as_array().unwrap().len(), 1, "{what}: {v}");
        with(&["verify", "vol/packs"]).ok();
        with(&["wait", "vol/packs", "--timeout", "5s", "--label", "v2"]).ok();
        let exec = with(&[
            "exec",
            "vol/packs",
            "--",
            "sh",
            "-c",
            "cat \"$PACKSYNC_ROOT/aws/pack.yaml\"",
        ])
        .ok();
        assert_eq!(exec.stdout, "v2 new", "{what}");
        with(&["rollback", "vol/packs"]).ok();
        assert_eq!(
            fs::read_to_string(f.dest().join("aws/pack.yaml")).unwrap(),
            "v1",
            "{what}: rolled back"
        );
        with(&["verify", "vol/packs"]).ok();
        f.packsync(&["gc", "vol/packs", "--keep", "0", "--grace", "0"])
            .ok();
        let v: serde_json::Value =
            serde_json::from_str(with(&["status", "vol/packs", "--json"]).ok().stdout.trim())
                .unwrap();
        assert_eq!(v["live"]["label"], "v1", "{what}: {v}");
        assert_eq!(
            v["retained"].as_array().unwrap().len(),
            0,
            "{what}: gc retired v2: {v}"
        );
        assert_eq!(
            fs::read_to_string(f.dest().join("aws/pack.yaml")).unwrap(),
            "v1",
            "{what}: the live tree survives gc"
        );
    }
}

/// `--mkpath` makes DEST's parents only once the sync is about to stage: a
/// refused sync leaves no directory behind, and an accepted one makes them.
#[test]
fn mkpath_makes_nothing_for_a_refused_sync() {
    let f = Fixture::new();
    f.file("..data/x", "reserved name");
    let args = [
        "sync",
        "--mkpath",
        "--layout",
        "fanout",
        "src",
        "vol/new/deeper/packs",
    ];
    f.refused(&args, 2, "..data");
    assert!(!f.path("vol/new").exists());
    fs::remove_dir_all(f.src().join("..data")).unwrap();
    f.file("pack/a.txt", "a");
    f.packsync(&args).ok();
    assert_eq!(
        fs::read_link(f.path("vol/new/deeper/packs/pack")).unwrap(),
        Path::new("..data/pack")
    );
}

/// Replicas that start together stage the same generation; with `--layout
/// dir` the second to swap takes the first one's tree out of DEST. Readers
/// may be in it: it is kept as a generation of its own and retired after the
/// grace period like any replaced tree, never removed on the spot.
#[test]
fn dir_layout_keeps_a_twin_of_the_same_generation_for_the_grace_period() {
    use std::os::fd::AsRawFd;
    let f = Fixture::new();
    f.file("a", "v1");
    let first = f.packsync(&["sync", "--layout", "dir", "src", "vol/packs"]);
    if first.code == 3 && first.stderr.contains("RENAME_EXCHANGE") {
        crate::fixture::skip("the temp directory's filesystem lacks RENAME_EXCHANGE");
        return;
    }
    first.ok();
    f.file("a", "v2");
    // Writer 1 stops with its v2 tree staged and recorded, just before the exchange.
    let resume = f.path("resume");
    let mut cmd = f.command(&["sync", "--layout", "dir", "src", "vol/packs"]);
    let writer1 = crate::faults::start_paused(&mut cmd, "before-exchange", &resume);
    // Writer 2 publishes the same v2 meanwhile; a reader opens it.
    f.packsync(&["sync", "--layout", "dir", "src", "vol/packs"])
        .ok();
    let held = fs::File::open(f.dest()).unwrap();
    let reader = PathBuf::from(format!("/proc/self/fd/{}", held.as_raw_fd()));
    assert_eq!(fs::read_to_string(reader.join("a")).unwrap(), "v2");
    // Writer 1 swaps its own v2 in, and so takes writer 2's out.
    fs::write(&resume, "").unwrap();
    let out = writer1.wait_with_output().unwrap();
    assert_eq!(
        crate::fixture::code(&out),
        0,
        "{}",
        crate::fixture::stderr(&out)
    );
    assert_eq!(fs::read_to_string(f.dest().join("a")).unwrap(), "v2");
    // The reader's tree is whole, and retained beside the v1 generation.
    assert_eq!(fs::read_to_string(reader.join("a")).unwrap(), "v2");
    assert_eq!(fs::read_dir(&reader).unwrap().count(), 1);
    let gens = names(&f.state().join("gen"));
    assert_eq!(gens.len(), 2, "{gens:?}");
    f.packsync(&["status", "vol/packs"]).ok();
    // Once the grace period is over, gc takes both old trees.
    f.packsync(&["gc", "--keep", "0", "--grace", "0", "vol/packs"])
        .ok();
    assert_eq!(names(&f.state().join("gen")), set([]));
    assert_eq!(fs::read_to_string(f.dest().join("a")).unwrap(), "v2");
    assert!(
        fs::read_to_string(reader.join("a")).is_err(),
        "retired by gc"
    );
    f.packsync(&["sync", "--layout", "dir", "src", "vol/packs"])
        .ok();
    assert_eq!(fs::read_to_string(f.dest().join("a")).unwrap(), "v2");
}
