//! Hostile trees: symlinks to a victim directory planted in the live
//! generation, in `gen/`, `stage/`, `meta/`, `trash/` and `leases/`, and as
//! the state directory itself; symlink targets shaped like those of
//! CVE-2024-12088; FIFOs and devices in the source, also swapped in while a
//! sync runs. The victim directory (outside DEST and its state) must come
//! out byte for byte and mtime for mtime as it went in.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::{assert_clean, assert_one_of, code, ok, packsync, skip, stderr, variant_tree, Victim};
use crate::fixture::{mirror, Fixture};

fn sync(src: &Path, dest: &Path, extra: &[&str]) -> Output {
    packsync()
        .arg("sync")
        .args(extra)
        .arg(src)
        .arg(dest)
        .output()
        .unwrap()
}

/// The host part of the names this machine's packsync writes
/// (`<host>-<pid>-<random>`), read from the lease `packsync exec` holds on
/// the live generation of `dest`: `leases/<GEN>.<host>-<pid>-<random>`.
fn host_tag(dest: &Path) -> String {
    let gen = fs::read_link(dest).unwrap();
    let gen = gen.file_name().unwrap().to_string_lossy().into_owned();
    let leases = dest.parent().unwrap().join(format!(
        ".{}.packsync/leases",
        dest.file_name().unwrap().to_string_lossy()
    ));
    let out = ok(packsync()
        .arg("exec")
        .arg(dest)
        .args(["--", "ls"])
        .arg(&leases)
        .output()
        .unwrap());
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    let lease = listing.trim();
    let owner = lease
        .strip_prefix(&format!("{gen}."))
        .unwrap_or_else(|| panic!("not a lease on {gen}: {listing:?}"));
    let mut parts = owner.rsplitn(3, '-');
    let (random, pid, host) = (parts.next(), parts.next(), parts.next());
    assert!(
        random.is_some_and(|r| r.len() == 16) && pid.is_some_and(|p| p.parse::<u32>().is_ok()),
        "lease {lease:?}"
    );
    host.unwrap().to_string()
}

/// A pid no process has now (one that just exited).
fn dead_pid() -> u32 {
    let mut c = Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    pid
}

#[test]
fn symlinks_planted_in_the_volume_are_never_followed() {
    let f = Fixture::new();
    let victim = Victim::new(f.path("victim"));
    let v = &victim.dir;
    let (a, b) = (f.path("a"), f.path("b"));
    variant_tree(&a, 1, 30, 0);
    variant_tree(&b, 2, 30, 0);
    // B's generation name is its tree's digest: learn it from a scratch DEST.
    ok(sync(&b, &f.path("vol/scratch"), &[]));
    let gen_b = fs::read_link(f.path("vol/scratch"))
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    ok(sync(&a, &f.dest(), &[]));
    let live = fs::canonicalize(f.dest()).unwrap();
    let st = f.state();
    let me = host_tag(&f.dest());
    let dead = format!("{me}-{}-0123456789abcdef", dead_pid());
    // In the live generation, a directory its manifest lists.
    fs::remove_dir_all(live.join("d3")).unwrap();
    symlink(v, live.join("d3")).unwrap();
    // B's name in gen/, its manifest and stamps in meta/, a trash entry, a lease.
    symlink(v, st.join("gen").join(&gen_b)).unwrap();
    symlink(v.join("secret"), st.join(format!("meta/{gen_b}.manifest"))).unwrap();
    symlink(v.join("secret"), st.join(format!("meta/{gen_b}.used"))).unwrap();
    symlink(v, st.join(format!("trash/{gen_b}+{dead}"))).unwrap();
    symlink(v, st.join(format!("leases/{gen_b}.{dead}"))).unwrap();
    // A dead local writer's staging, and another host's.
    symlink(v, st.join(format!("stage/{dead}"))).unwrap();
    symlink(v, st.join("stage/otherhost-1-0123456789abcdef")).unwrap();

    let out = ok(sync(&b, &f.dest(), &["--itemize"]));
    assert!(String::from_utf8_lossy(&out.stdout).contains("~ d3"));
    assert_eq!(assert_one_of(&f.dest(), &[a.clone(), b.clone()]), 1);
    assert_ne!(
        fs::read_link(f.dest()).unwrap().file_name().unwrap(),
        gen_b.as_str()
    );
    victim.assert_untouched();
    // Back to A (reusing from B's fresh generation), then collect everything.
    ok(sync(&a, &f.dest(), &[]));
    assert_eq!(assert_one_of(&f.dest(), &[a.clone(), b.clone()]), 0);
    ok(packsync()
        .args(["gc", "--grace", "0", "--keep", "0"])
        .arg(f.dest())
        .output()
        .unwrap());
    assert_eq!(assert_one_of(&f.dest(), &[a, b]), 0);
    // Only the other host's staging symlink is left (it is not old yet), unfollowed.
    assert_eq!(
        super::entries(&st, "stage"),
        vec!["otherhost-1-0123456789abcdef"]
    );
    fs::remove_file(st.join("stage/otherhost-1-0123456789abcdef")).unwrap();
    assert_clean(&st);
    victim.assert_untouched();
}

#[test]
fn a_state_directory_or_gen_that_is_a_symlink_is_refused() {
    let f = Fixture::new();
    let victim = Victim::new(f.path("victim"));
    variant_tree(&f.src(), 1, 10, 0);
    symlink(&victim.dir, f.state()).unwrap();
    let out = sync(&f.src(), &f.dest(), &[]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("must be a real directory"),
        "{}",
        stderr(&out)
    );
    assert!(fs::symlink_metadata(f.dest()).is_err(), "DEST was not made");
    victim.assert_untouched();
    // gen/ swapped for a symlink after a first sync.
    fs::remove_file(f.state()).unwrap();
    ok(sync(&f.src(), &f.dest(), &[]));
    fs::rename(f.state().join("gen"), f.path("gen-moved")).unwrap();
    symlink(&victim.dir, f.state().join("gen")).unwrap();
    variant_tree(&f.src(), 2, 10, 0);
    let out = sync(&f.src(), &f.dest(), &[]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(stderr(&out).contains("gen"), "{}", stderr(&out));
    victim.assert_untouched();
}

#[test]
fn symlink_targets_shaped_like_cve_2024_12088_are_copied_verbatim_and_never_followed() {
    let f = Fixture::new();
    let victim = Victim::new(f.path("victim"));
    let src = f.src();
    let targets = [
        ("cve", "../x/../../etc"),
        ("trailing", "a/b/.."),
        ("dotdot", ".."),
        ("deep", "../../../../../../../../etc/passwd"),
        ("abs", "/etc"),
        ("mixed", "d/./../../x/../.."),
        // From DEST's generation, four levels up is the fixture: this one reaches the victim.
        ("escape", "../../../../victim"),
    ];
    fs::create_dir_all(src.join("d")).unwrap();
    for (name, t) in targets {
        symlink(t, src.join(name)).unwrap();
        symlink(t, src.join("d").join(name)).unwrap();
    }
    ok(sync(&src, &f.dest(), &[]));
    for (name, t) in targets {
        assert_eq!(
            fs::read_link(f.dest().join(name)).unwrap(),
            PathBuf::from(t)
        );
        assert_eq!(
            fs::read_link(f.dest().join("d").join(name)).unwrap(),
            PathBuf::from(t)
        );
    }
    assert!(
        f.dest().join("escape/secret").exists(),
        "the link works for readers"
    );
    assert_eq!(mirror(&f.dest()), mirror(&src));
    // The next version has directories where the links were: written in the new tree only.
    for (name, _) in targets {
        fs::remove_file(src.join(name)).unwrap();
        fs::create_dir(src.join(name)).unwrap();
        fs::write(src.join(name).join("secret"), "planted\n").unwrap();
    }
    ok(sync(&src, &f.dest(), &[]));
    assert_eq!(mirror(&f.dest()), mirror(&src));
    assert!(fs::symlink_metadata(f.dest().join("escape"))
        .unwrap()
        .is_dir());
    victim.assert_untouched();
}

#[test]
fn fifos_sockets_and_devices_in_the_source_are_skipped() {
    let f = Fixture::new();
    variant_tree(&f.src(), 1, 5, 0);
    let mk = |args: &[&str]| {
        assert!(Command::new(args[0])
            .args(&args[1..])
            .status()
            .unwrap()
            .success())
    };
    let src = f.src();
    mk(&["mkfifo", src.join("fifo").to_str().unwrap()]);
    let _sock = std::os::unix::net::UnixListener::bind(src.join("sock")).unwrap();
    let mut want = vec!["skipping FIFO", "skipping socket"];
    if super::is_root() {
        mk(&["mknod", src.join("null").to_str().unwrap(), "c", "1", "3"]);
        mk(&[
            "mknod",
            src.join("d0/loop").to_str().unwrap(),
            "b",
            "7",
            "200",
        ]);
        want.extend(["skipping character device", "skipping block device"]);
    } else {
        crate::fixture::skip("device nodes in the source need root");
    }
    let out = ok(sync(&src, &f.dest(), &[]));
    for w in want {
        assert!(stderr(&out).contains(w), "{w}: {}", stderr(&out));
    }
    for p in ["fifo", "sock", "null", "d0/loop"] {
        assert!(
            fs::symlink_metadata(f.dest().join(p)).is_err(),
            "{p} mirrored"
        );
    }
}

/// Swap a source file for something else while the sync is stopped between
/// its scan and its copy: it must fail (exit 1) without reading it, never hang.
#[test]
fn a_file_swapped_for_a_fifo_device_or_symlink_mid_run_is_never_read() {
    if skip("swaps between scan and copy", false, true) {
        return;
    }
    type Swap = Box<dyn Fn(&Path, &Path)>;
    let mut swaps: Vec<(&str, Swap)> = vec![
        (
            "changed while being copied",
            Box::new(|p: &Path, _: &Path| {
                fs::remove_file(p).unwrap();
                assert!(Command::new("mkfifo").arg(p).status().unwrap().success());
            }),
        ),
        (
            "Too many levels of symbolic links",
            Box::new(|p: &Path, victim: &Path| {
                fs::remove_file(p).unwrap();
                symlink(victim.join("secret"), p).unwrap();
            }),
        ),
    ];
    if super::is_root() {
        swaps.push((
            "changed while being copied",
            Box::new(|p: &Path, _: &Path| {
                fs::remove_file(p).unwrap();
                let st = Command::new("mknod").arg(p).args(["c", "1", "5"]).status();
                assert!(st.unwrap().success());
            }),
        ));
    }
    for (want, swap) in swaps {
        let f = Fixture::new();
        let victim = Victim::new(f.path("victim"));
        fs::write(f.src().join("only"), "v1 only\n").unwrap();
        ok(sync(&f.src(), &f.dest(), &[]));
        let before = mirror(&f.dest());
        fs::write(f.src().join("only"), "v2 only, longer\n").unwrap();
        let resume = f.path("resume");
        let mut cmd = packsync();
        cmd.arg("sync").arg(f.src()).arg(f.dest());
        let child = super::start_paused(&mut cmd, "staging", &resume);
        swap(&f.src().join("only"), &victim.dir);
        fs::write(&resume, "").unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(code(&out), 1, "{}", stderr(&out));
        assert!(stderr(&out).contains(want), "{want}: {}", stderr(&out));
        assert_eq!(mirror(&f.dest()), before);
        assert_eq!(super::entries(&f.state(), "stage"), Vec::<String>::new());
        victim.assert_untouched();
    }
}
