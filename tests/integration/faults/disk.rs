//! Runs that fail midway: a full disk, an unreadable source file, a source
//! file changing during the copy, SIGTERM and SIGINT. Each exits with its
//! code and one clear line, removes its staging, and leaves DEST as it was.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::{assert_clean, code, entries, ok, packsync, skip, stderr, variant_tree};
use crate::fixture::{mirror, Fixture};

/// A small tmpfs mounted over a directory for one test; unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        let st = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size}"),
                "packsync-enospc",
            ])
            .arg(dir)
            .status()
            .unwrap();
        assert!(st.success(), "mount tmpfs on {}", dir.display());
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn sync(f: &Fixture) -> Output {
    packsync()
        .args(["sync", "--grace", "0"])
        .arg(f.src())
        .arg(f.dest())
        .output()
        .unwrap()
}

/// A source of one 2 MiB file, so that a paused copy is that file's.
fn one_file(f: &Fixture, fill: u8) {
    let src = f.src();
    if src.exists() {
        fs::remove_dir_all(&src).unwrap();
    }
    fs::create_dir(&src).unwrap();
    fs::write(src.join("big.bin"), vec![fill; 2 << 20]).unwrap();
}

/// One line, naming what failed, and what the user must check afterwards.
#[track_caller]
fn failed_cleanly(
    out: &std::process::Output,
    want: i32,
    needles: &[&str],
    f: &Fixture,
    before: &[String],
) {
    let err = stderr(out);
    assert_eq!(code(out), want, "{err}");
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}: {err}");
    }
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert_eq!(mirror(&f.dest()), before, "DEST changed");
    assert_eq!(
        entries(&f.state(), "stage"),
        Vec::<String>::new(),
        "staging left behind"
    );
}

#[test]
fn a_full_disk_fails_cleanly_and_leaves_dest_as_it_was() {
    if skip("ENOSPC on a small tmpfs", true, false) {
        return;
    }
    let f = Fixture::new();
    let _tmpfs = Tmpfs::mount(&f.path("vol"), "1m");
    variant_tree(&f.src(), 1, 20, 0);
    ok(sync(&f));
    let before = mirror(&f.dest());
    variant_tree(&f.src(), 2, 20, 1); // 2 MiB more than the volume holds
    let out = sync(&f);
    failed_cleanly(
        &out,
        1,
        &["big0.bin", "No space left on device"],
        &f,
        &before,
    );
    // Space is back: the same sync succeeds.
    variant_tree(&f.src(), 3, 20, 0);
    ok(sync(&f));
    assert_eq!(mirror(&f.dest()), mirror(&f.src()));
    assert_clean(&f.state());
}

/// A writer that died (another host's, its staging untouched for two
/// hours) left 3 MiB of staging on a 4 MiB volume: the next sync, out of
/// space, removes that staging and tries again, instead of failing until
/// someone runs `gc`.
#[test]
fn a_full_disk_frees_the_staging_of_dead_writers_and_tries_again() {
    if skip("ENOSPC on a small tmpfs", true, false) {
        return;
    }
    let f = Fixture::new();
    let _tmpfs = Tmpfs::mount(&f.path("vol"), "4m");
    variant_tree(&f.src(), 1, 20, 0);
    ok(sync(&f));
    let dead = f.state().join("stage/otherhost-4242-0123456789abcdef");
    fs::create_dir_all(dead.join("packs/d0")).unwrap();
    fs::write(dead.join("packs/d0/half.bin"), vec![7u8; 3 << 20]).unwrap();
    for p in [dead.join("packs/d0"), dead.join("packs"), dead.clone()] {
        let st = Command::new("touch")
            .args(["-h", "-d", "2 hours ago"])
            .arg(&p)
            .status()
            .unwrap();
        assert!(st.success());
    }
    variant_tree(&f.src(), 2, 20, 1); // 2 MiB: only fits without the dead staging
    let out = sync(&f);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stderr(&out)
            .contains("the volume was full: removed the staging of 1 dead writer and tried again"),
        "{}",
        stderr(&out)
    );
    assert!(!dead.exists(), "the dead writer's staging is gone");
    assert_eq!(mirror(&f.dest()), mirror(&f.src()));
    assert_clean(&f.state());
}

#[test]
fn an_unreadable_source_file_fails_cleanly() {
    if skip("an unreadable source file", true, false) {
        return;
    }
    // Root reads mode-000 files: run as nobody on a fixture nobody owns.
    let f = Fixture::new();
    let bin = f.path("packsync");
    fs::copy(crate::fixture::bin(), &bin).unwrap();
    variant_tree(&f.src(), 1, 20, 0);
    let st = Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(f.dir.path())
        .status()
        .unwrap();
    assert!(st.success());
    let nobody = |args: &[&str]| {
        crate::fixture::clean_env(&mut Command::new("setpriv"))
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&bin)
            .args(args)
            .current_dir(f.dir.path())
            .output()
            .unwrap()
    };
    ok(nobody(&["sync", "src", "vol/packs"]));
    let before = mirror(&f.dest());
    let secret = f.src().join("d3/f0003.txt");
    fs::write(&secret, "v1 changed\n").unwrap();
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o000)).unwrap();
    let out = nobody(&["sync", "src", "vol/packs"]);
    failed_cleanly(
        &out,
        1,
        &["src/d3/f0003.txt", "Permission denied"],
        &f,
        &before,
    );
}

/// Start a sync stopped just after it opened the one file it copies.
fn stopped_in_copy(f: &Fixture, resume: &Path) -> std::process::Child {
    let mut cmd = packsync();
    cmd.args(["sync", "--grace", "0"])
        .arg(f.src())
        .arg(f.dest());
    super::start_paused(&mut cmd, "copy-file", resume)
}

#[test]
fn a_source_changing_during_the_copy_fails_cleanly() {
    if skip("a source changing during the copy", false, true) {
        return;
    }
    let f = Fixture::new();
    one_file(&f, b'a');
    ok(sync(&f));
    let before = mirror(&f.dest());
    one_file(&f, b'b');
    let resume = f.path("resume");
    let child = stopped_in_copy(&f, &resume);
    // A build step still writing the source.
    fs::OpenOptions::new()
        .append(true)
        .open(f.src().join("big.bin"))
        .and_then(|mut fh| std::io::Write::write_all(&mut fh, b"more"))
        .unwrap();
    fs::write(&resume, "").unwrap();
    let out = child.wait_with_output().unwrap();
    failed_cleanly(
        &out,
        1,
        &["big.bin", "changed while being copied"],
        &f,
        &before,
    );
}

/// `--itemize` lists what it planned before staging starts: a copy that
/// then fails leaves the list on stdout, the one error line on stderr, and
/// DEST as it was.
#[test]
fn itemize_lists_its_plan_before_a_copy_that_fails() {
    if skip("a source changing during the copy", false, true) {
        return;
    }
    let f = Fixture::new();
    one_file(&f, b'a');
    ok(sync(&f));
    let before = mirror(&f.dest());
    one_file(&f, b'b');
    let resume = f.path("resume");
    let mut cmd = packsync();
    cmd.args(["sync", "--grace", "0", "--itemize"])
        .arg(f.src())
        .arg(f.dest());
    let child = super::start_paused(&mut cmd, "copy-file", &resume);
    fs::OpenOptions::new()
        .append(true)
        .open(f.src().join("big.bin"))
        .and_then(|mut fh| std::io::Write::write_all(&mut fh, b"more"))
        .unwrap();
    fs::write(&resume, "").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "~ .\n~ big.bin\n");
    failed_cleanly(
        &out,
        1,
        &["big.bin", "changed while being copied"],
        &f,
        &before,
    );
}

/// A writer paused for longer than the stale age (its staging untouched
/// for two hours, as a stopped VM's would be) has its staging collected
/// by another run; when it wakes it publishes nothing, and DEST stays.
#[test]
fn a_writer_paused_past_the_stale_age_publishes_nothing() {
    if skip("a writer paused past the stale age", false, true) {
        return;
    }
    let f = Fixture::new();
    one_file(&f, b'a');
    ok(sync(&f));
    let before = mirror(&f.dest());
    one_file(&f, b'b');
    let resume = f.path("resume");
    let child = stopped_in_copy(&f, &resume);
    let stages = entries(&f.state(), "stage");
    assert_eq!(stages.len(), 1, "{stages:?}");
    let st = Command::new("touch")
        .args(["-h", "-d", "2 hours ago"])
        .arg(f.state().join("stage").join(&stages[0]))
        .status()
        .unwrap();
    assert!(st.success());
    ok(packsync().arg("gc").arg(f.dest()).output().unwrap());
    assert_eq!(
        entries(&f.state(), "stage"),
        Vec::<String>::new(),
        "collected"
    );
    fs::write(&resume, "").unwrap();
    let out = child.wait_with_output().unwrap();
    eprintln!("the paused writer: {}", stderr(&out));
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert_eq!(
        stderr(&out).trim_end().lines().count(),
        1,
        "{}",
        stderr(&out)
    );
    assert_eq!(mirror(&f.dest()), before, "DEST as it was");
    assert_clean(&f.state());
    ok(sync(&f));
    assert_eq!(mirror(&f.dest()), mirror(&f.src()));
}

/// A flush that fails before the rename publishes nothing; one after it
/// exits 1 too, with DEST already on the new, complete generation (what
/// the README's "Durability" promises), each in one line.
#[test]
fn a_flush_error_before_or_after_the_rename() {
    if skip("a flush error", false, true) {
        return;
    }
    let f = Fixture::new();
    one_file(&f, b'a');
    ok(sync(&f));
    let before = mirror(&f.dest());
    one_file(&f, b'b');
    let failing = |point: &str| {
        packsync()
            .env("PACKSYNC_TEST_FLUSH_FAIL", point)
            .args(["sync", "--grace", "0"])
            .arg(f.src())
            .arg(f.dest())
            .output()
            .unwrap()
    };
    let out = failing("staged");
    failed_cleanly(
        &out,
        1,
        &[
            "cannot flush the staged tree to disk (nothing was published)",
            "Input/output error",
        ],
        &f,
        &before,
    );
    let out = failing("published");
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("after publishing (DEST already shows the new generation)"),
        "{err}"
    );
    assert_eq!(
        mirror(&f.dest()),
        mirror(&f.src()),
        "DEST on the new generation"
    );
    assert_eq!(entries(&f.state(), "stage"), Vec::<String>::new());
}

#[test]
fn sigterm_and_sigint_mid_run_clean_up_and_exit_143_and_130() {
    if skip("SIGTERM and SIGINT mid-run", false, true) {
        return;
    }
    for (sig, want, name) in [
        (rustix::process::Signal::TERM, 143, "SIGTERM"),
        (rustix::process::Signal::INT, 130, "SIGINT"),
    ] {
        let f = Fixture::new();
        one_file(&f, b'a');
        ok(sync(&f));
        let before = mirror(&f.dest());
        one_file(&f, b'b');
        let resume = f.path("resume");
        let child = stopped_in_copy(&f, &resume);
        let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
        rustix::process::kill_process(pid, sig).unwrap();
        let out = child.wait_with_output().unwrap();
        failed_cleanly(
            &out,
            want,
            &[&format!("interrupted by {name}")],
            &f,
            &before,
        );
    }
}
