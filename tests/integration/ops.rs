//! The operator's commands (`status`, `verify`, `rollback`, `wait`, `exec`)
//! and the sync options around publication (`--chmod`, `--label`,
//! `--allow-downgrade`, `--exec-after`, `--verify`), through the real binary.

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use crate::fixture::{is_root, json, mtime, set_mtime, Fixture, Run};

/// The generation DEST points at.
fn live_gen(f: &Fixture) -> String {
    fs::read_link(f.dest())
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

fn gen_dir(f: &Fixture, gen: &str) -> PathBuf {
    f.state().join("gen").join(gen)
}

/// A `--json` run that exited `code` with exactly one JSON object on stdout.
fn one_json_object(run: &Run, code: i32) -> serde_json::Value {
    assert_eq!(
        run.code, code,
        "stdout: {}\nstderr: {}",
        run.stdout, run.stderr
    );
    assert_eq!(run.stdout.lines().count(), 1, "{}", run.stdout);
    json(run)
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

/// Rewrite a file in place with content of the same size, keeping its mtime:
/// drift that size and mtime cannot show.
fn corrupt_keeping_mtime(p: &Path, content: &str) {
    let (s, ns) = mtime(p);
    assert_eq!(fs::metadata(p).unwrap().len() as usize, content.len());
    fs::write(p, content).unwrap();
    set_mtime(p, s, ns);
}

fn mkfifo(p: &Path) {
    let ok = Command::new("mkfifo").arg(p).status().unwrap().success();
    assert!(ok, "mkfifo {}", p.display());
}

/// Block until the other end of a FIFO writes a line.
fn read_fifo(p: &Path) -> String {
    let mut s = String::new();
    fs::File::open(p).unwrap().read_to_string(&mut s).unwrap();
    s
}

/// `packsync exec vol/packs -- sh -c SCRIPT`, returned once the command is
/// running: `script(ready, go)` gets two FIFOs, must write a line to `ready`
/// and may wait for one on `go`.
fn exec_held(f: &Fixture, script: impl Fn(&Path, &Path) -> String) -> (Child, PathBuf) {
    let (ready, go) = (f.path("ready"), f.path("go"));
    mkfifo(&ready);
    mkfifo(&go);
    let script = script(&ready, &go);
    let exec = f.spawn(&["exec", "vol/packs", "--", "sh", "-c", &script]);
    assert_eq!(read_fifo(&ready), "ready\n");
    (exec, go)
}

fn write_fifo(p: &Path, s: &str) {
    fs::File::options()
        .write(true)
        .open(p)
        .unwrap()
        .write_all(s.as_bytes())
        .unwrap();
}

/// The volume, but for the staging directory's own mtime (a writer that made
/// and removed its staging changed it).
fn volume_but_staging(f: &Fixture) -> Vec<String> {
    f.volume()
        .into_iter()
        .filter(|l| !l.starts_with("\".packs.packsync/stage\" "))
        .collect()
}

/// Write to a FIFO if something still reads it (never block).
fn release_fifo(p: &Path) {
    use std::os::unix::fs::OpenOptionsExt;
    if let Ok(mut w) = fs::File::options()
        .write(true)
        .custom_flags(libc_nonblock())
        .open(p)
    {
        let _ = w.write_all(b"go\n");
    }
}

fn libc_nonblock() -> i32 {
    rustix::fs::OFlags::NONBLOCK.bits() as i32
}

// ---- status ----

#[test]
fn status_shows_the_live_generation_and_the_retained_ones() {
    let f = Fixture::new();
    f.file("pack/a.txt", "one");
    f.sync(&["--label", "v1"]).ok();
    let first = live_gen(&f);
    f.file("pack/a.txt", "two!");
    f.sync(&["--label", "v2"]).ok();
    let second = live_gen(&f);

    let human = f.packsync(&["status", "vol/packs"]).ok();
    let live_line = human
        .stdout
        .lines()
        .find(|l| l.starts_with('*'))
        .unwrap_or_else(|| panic!("{}", human.stdout));
    assert!(
        live_line.contains(&second) && live_line.contains("live") && live_line.contains("v2"),
        "{live_line}"
    );
    let old_line = human.stdout.lines().find(|l| l.contains(&first)).unwrap();
    assert!(
        old_line.contains("retired") && old_line.contains("v1"),
        "{old_line}"
    );

    let s = json(&f.packsync(&["status", "--json", "vol/packs"]).ok());
    assert_eq!(s["dest"], "vol/packs");
    assert_eq!(s["resolves"], true);
    let live = &s["live"];
    assert_eq!(live["generation"], second.as_str());
    assert_eq!(live["label"], "v2");
    assert_eq!(live["entries"], 2);
    assert_eq!(live["bytes"], 4);
    assert_eq!(live["complete"], true);
    assert_eq!(live["leased"], false);
    assert_eq!(
        live["path"],
        fs::canonicalize(gen_dir(&f, &second))
            .unwrap()
            .to_str()
            .unwrap()
    );
    assert_eq!(
        live["sources"][0],
        fs::canonicalize(f.src()).unwrap().to_str().unwrap()
    );
    // The digest by its definition, from the manifest's own entry lines;
    // the file line is the one the tree gives.
    let manifest = fs::read_to_string(f.state().join(format!("meta/{second}.manifest"))).unwrap();
    let (_, lines) = manifest.split_once("---\n").unwrap();
    let file_line = lines.lines().find(|l| l.ends_with(" pack/a.txt")).unwrap();
    let sha = crate::fixture::sha256_hex(b"two!");
    assert!(
        file_line.starts_with("f 0644 ") && file_line.contains(" 4 ") && file_line.contains(&sha),
        "{file_line}"
    );
    let digest = crate::fixture::digest_of(lines, "v2");
    assert_eq!(live["digest"], digest.as_str());
    assert_eq!(second, digest[..16]);
    assert!(live["created"].as_str().unwrap().ends_with('Z'));
    let retained = s["retained"].as_array().unwrap();
    assert_eq!(retained.len(), 1);
    assert_eq!(retained[0]["generation"], first.as_str());
    assert_eq!(retained[0]["label"], "v1");
    assert!(retained[0]["retired_unix"].as_i64().unwrap() > 0);
    assert_eq!(s["staging"].as_array().unwrap().len(), 0);
}

#[test]
fn status_verify_rollback_and_exec_refuse_what_is_not_packsync() {
    let f = Fixture::new();
    let cmds: [&[&str]; 4] = [
        &["status"],
        &["verify"],
        &["rollback"],
        &["exec", "DEST", "--", "true"],
    ];
    let run = |cmd: &[&str], dest: &str| {
        let mut args: Vec<&str> = cmd
            .iter()
            .map(|a| if *a == "DEST" { dest } else { a })
            .collect();
        if !cmd.contains(&"DEST") {
            args.push(dest);
        }
        f.packsync(&args)
    };
    fs::create_dir(f.path("vol/plain")).unwrap();
    fs::write(f.path("vol/file"), "x").unwrap();
    symlink("/etc", f.path("vol/foreign")).unwrap();
    for cmd in cmds {
        run(cmd, "vol/absent").fails(3, "vol/absent: not a packsync destination");
        run(cmd, "vol/plain").fails(3, "a plain directory");
        run(cmd, "vol/file").fails(3, "not a packsync destination");
        run(cmd, "vol/foreign").fails(3, "a symlink to /etc");
        run(cmd, "nowhere/packs").fails(3, "not a packsync destination");
    }
    // Nothing was created by any of them.
    assert_eq!(f.volume().len(), 3);
}

// ---- verify ----

#[test]
fn verify_passes_on_an_untouched_tree() {
    let f = Fixture::new();
    f.file("pack/a.txt", "a");
    f.file("pack/lib/b.txt", "bb");
    fs::hard_link(f.src().join("pack/a.txt"), f.src().join("pack/lib/a-link")).unwrap();
    symlink("a.txt", f.src().join("pack/s")).unwrap();
    f.sync(&[]).ok();
    let out = f.packsync(&["verify", "vol/packs"]).ok();
    assert!(
        out.stdout.contains("matches its manifest"),
        "{}",
        out.stdout
    );
    let v = json(&f.packsync(&["verify", "--json", "vol/packs"]).ok());
    assert_eq!(v["ok"], true);
    assert_eq!(v["generation"], live_gen(&f).as_str());
    assert_eq!(v["differences"].as_array().unwrap().len(), 0);
    assert_eq!(v["entries"], 6);
}

#[test]
fn verify_lists_each_difference_and_exits_4() {
    let f = Fixture::new();
    f.file("content.txt", "abc");
    f.file("mode.txt", "m");
    f.file("gone.txt", "g");
    f.file("touched.txt", "t");
    symlink("content.txt", f.src().join("link")).unwrap();
    f.sync(&[]).ok();
    let d = f.dest();
    corrupt_keeping_mtime(&d.join("content.txt"), "xyz");
    fs::set_permissions(d.join("mode.txt"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::remove_file(d.join("gone.txt")).unwrap();
    fs::write(d.join("extra.txt"), "e").unwrap();
    let file = fs::File::options()
        .write(true)
        .open(d.join("touched.txt"))
        .unwrap();
    file.set_times(fs::FileTimes::new().set_modified(std::time::UNIX_EPOCH))
        .unwrap();
    fs::remove_file(d.join("link")).unwrap();
    symlink("elsewhere", d.join("link")).unwrap();

    let out = f.packsync(&["verify", "vol/packs"]);
    let out = out.fails(4, "difference(s) between generation");
    for line in [
        "modified content.txt (expected sha256 ",
        "mode changed mode.txt (expected 0644, found 0600)",
        "missing gone.txt",
        "extra extra.txt",
        "mtime changed touched.txt",
        "link changed link (expected content.txt, found elsewhere)",
    ] {
        assert!(
            out.stdout.lines().any(|l| l.starts_with(line)),
            "no {line:?} in\n{}",
            out.stdout
        );
    }
    let v = json(&f.packsync(&["verify", "--json", "vol/packs"]));
    assert_eq!(v["ok"], false);
    let diffs = v["differences"].as_array().unwrap();
    let has = |what: &str, path: &str| diffs.iter().any(|d| d["what"] == what && d["path"] == path);
    assert!(has("modified", "content.txt"), "{diffs:?}");
    assert!(has("missing", "gone.txt"));
    assert!(has("extra", "extra.txt"));
    assert!(has("link changed", "link"));
    // Adding and removing names changed the root directory's mtime too.
    assert!(has("mtime changed", "."));
}

#[test]
fn sync_checksum_repairs_what_verify_found() {
    let f = Fixture::new();
    f.file("a.txt", "abc");
    f.sync(&[]).ok();
    let gen = live_gen(&f);
    corrupt_keeping_mtime(&f.dest().join("a.txt"), "xyz");
    f.packsync(&["verify", "vol/packs"]).fails(
        4,
        "recorded: the next `packsync sync` copies those paths afresh",
    );
    // Size and mtime agree, so only the content tells (a plain sync, by
    // verify's record: tests/integration/takeover.rs).
    let out = f.sync(&["--checksum", "--itemize"]).ok();
    assert!(out.stdout.contains("~ a.txt"), "{}", out.stdout);
    // Not the edited generation under its old name: a tree of its own.
    assert_ne!(live_gen(&f), gen);
    assert_eq!(fs::read_to_string(f.dest().join("a.txt")).unwrap(), "abc");
    f.packsync(&["verify", "vol/packs"]).ok();
    assert!(
        f.sync(&[]).ok().stdout.contains("up to date"),
        "the record is gone"
    );
}

#[test]
fn verify_sees_a_changed_owner_as_root() {
    if !is_root() {
        crate::fixture::skip("owners are mirrored only as root");
        return;
    }
    let f = Fixture::new();
    f.file("a", "a");
    f.sync(&[]).ok();
    std::os::unix::fs::lchown(f.dest().join("a"), Some(4321), Some(4321)).unwrap();
    let out = f
        .packsync(&["verify", "vol/packs"])
        .fails(4, "1 difference(s)");
    assert!(
        out.stdout
            .contains("owner changed a (expected 0:0, found 4321:4321)"),
        "{}",
        out.stdout
    );
}

// ---- rollback ----

#[test]
fn rollback_publishes_the_previous_generation_and_back() {
    let f = Fixture::new();
    f.file("a.txt", "one");
    f.sync(&["--label", "v1"]).ok();
    let first = live_gen(&f);
    f.file("a.txt", "two");
    f.sync(&["--label", "v2"]).ok();
    let second = live_gen(&f);

    let out = f.packsync(&["rollback", "vol/packs"]).ok();
    assert!(
        out.stdout.contains(&format!("to generation {first}")),
        "{}",
        out.stdout
    );
    assert_eq!(fs::read_to_string(f.dest().join("a.txt")).unwrap(), "one");
    assert!(fs::read_link(f.dest()).unwrap().is_relative());
    // Nothing older than the first generation is retained.
    f.packsync(&["rollback", "vol/packs"])
        .fails(1, "no generation older than the live one");
    // Forward again by name, by prefix, and by label.
    f.packsync(&["rollback", "vol/packs", "--to", &second]).ok();
    assert_eq!(fs::read_to_string(f.dest().join("a.txt")).unwrap(), "two");
    f.packsync(&["rollback", "vol/packs", "--to", &first[..6]])
        .ok();
    assert_eq!(live_gen(&f), first);
    f.packsync(&["rollback", "vol/packs", "--to", "v2"]).ok();
    assert_eq!(live_gen(&f), second);
    let again = f.packsync(&["rollback", "vol/packs", "--to", "v2"]).ok();
    assert!(again.stdout.contains("already live"), "{}", again.stdout);
    // The generation rolled away from is retired like any other.
    let s = json(&f.packsync(&["status", "--json", "vol/packs"]).ok());
    assert!(s["retained"][0]["retired_unix"].as_i64().is_some());
    f.packsync(&["verify", "vol/packs"]).ok();
}

#[test]
fn rollback_refuses_an_unknown_generation() {
    let f = Fixture::new();
    f.file("a.txt", "one");
    f.sync(&[]).ok();
    let gen = live_gen(&f);
    let before = f.volume();
    f.packsync(&["rollback", "vol/packs", "--to", "0123456789abcdef"])
        .fails(
            2,
            &format!("no generation \"0123456789abcdef\" (retained: {gen}"),
        );
    f.packsync(&["rollback", "vol/packs", "--to", "../../etc"])
        .fails(2, "no generation");
    assert_eq!(f.volume(), before);
}

#[test]
fn rollback_refuses_a_generation_that_fails_verification() {
    let f = Fixture::new();
    f.file("a.txt", "one");
    f.sync(&[]).ok();
    let first = live_gen(&f);
    f.file("a.txt", "two");
    f.sync(&[]).ok();
    let second = live_gen(&f);
    corrupt_keeping_mtime(&gen_dir(&f, &first).join("a.txt"), "bad");
    f.packsync(&["rollback", "vol/packs"]).fails(
        3,
        &format!("generation {first} differs from its manifest (modified a.txt"),
    );
    assert_eq!(live_gen(&f), second);
    assert_eq!(fs::read_to_string(f.dest().join("a.txt")).unwrap(), "two");
}

// ---- wait ----

#[test]
fn wait_started_before_the_first_sync_returns_once_it_is_live() {
    let f = Fixture::new();
    f.file("a.txt", "a");
    let waiter = f.spawn(&["wait", "vol/packs", "--timeout", "60s"]);
    f.sync(&["--label", "v1"]).ok();
    let out = Run::wait(waiter).ok();
    assert!(
        out.stdout
            .contains(&format!("generation {} (label v1) is live", live_gen(&f))),
        "{}",
        out.stdout
    );
}

#[test]
fn wait_times_out_with_exit_5() {
    let f = Fixture::new();
    f.packsync(&["wait", "vol/packs", "--timeout", "200ms"])
        .fails(5, "vol/packs: no live generation after 200ms");
    // The parent may not even exist yet: still a wait, not an error.
    f.packsync(&["wait", "later/packs", "--timeout", "0"])
        .fails(5, "no live generation");
    assert_eq!(f.volume().len(), 0);
}

#[test]
fn wait_for_a_label_ignores_other_generations() {
    let f = Fixture::new();
    f.file("a.txt", "a");
    f.sync(&["--label", "v1"]).ok();
    f.packsync(&["wait", "vol/packs", "--label", "v2", "--timeout", "200ms"])
        .fails(5, "no live generation labelled v2 (live: ");
    let waiter = f.spawn(&["wait", "vol/packs", "--label", "v2", "--timeout", "60s"]);
    f.sync(&["--label", "v2"]).ok();
    let out = Run::wait(waiter).ok();
    assert!(out.stdout.contains("(label v2) is live"), "{}", out.stdout);
    f.packsync(&["wait", "vol/packs", "--label", "v2"]).ok();
}

#[test]
fn wait_refuses_bad_durations_and_foreign_destinations() {
    let f = Fixture::new();
    for bad in ["soon", "10x", "-1s", ""] {
        f.packsync(&["wait", "vol/packs", &format!("--timeout={bad}")])
            .fails(2, "invalid value");
    }
    symlink("/etc", f.path("vol/packs")).unwrap();
    f.packsync(&["wait", "vol/packs", "--timeout", "10s"])
        .fails(3, "not a packsync destination (a symlink to /etc)");
}

// ---- exec ----

#[test]
fn exec_runs_the_command_on_the_live_generation_and_returns_its_status() {
    let f = Fixture::new();
    f.file("a.txt", "one");
    f.sync(&[]).ok();
    let gen = live_gen(&f);
    let out = f.packsync(&[
        "exec",
        "vol/packs",
        "--",
        "sh",
        "-c",
        "cat \"$PACKSYNC_ROOT/a.txt\"; echo \" $PACKSYNC_GENERATION $PACKSYNC_ROOT\"; exit 7",
    ]);
    assert_eq!(out.code, 7, "{}", out.stderr);
    let root = fs::canonicalize(gen_dir(&f, &gen)).unwrap();
    assert_eq!(out.stdout, format!("one {gen} {}\n", root.display()));
    // The lease is gone once the command is.
    assert_eq!(fs::read_dir(f.state().join("leases")).unwrap().count(), 0);
    f.packsync(&["exec", "vol/packs", "--", "/nonexistent/cmd"])
        .fails(127, "cannot run /nonexistent/cmd");
}

#[test]
fn gc_keeps_a_generation_leased_by_exec() {
    let f = Fixture::new();
    f.file("a.txt", "one");
    f.sync(&[]).ok();
    let first = live_gen(&f);
    let (exec, go) = exec_held(&f, |ready, go| {
        format!(
            "echo ready > {}; read x < {}; cat \"$PACKSYNC_ROOT/a.txt\"",
            ready.display(),
            go.display()
        )
    });
    // A new generation, then a collection that keeps nothing it need not.
    f.file("a.txt", "two");
    f.sync(&["--keep", "0"]).ok();
    f.packsync(&["gc", "vol/packs", "--keep", "0", "--grace", "0"])
        .ok();
    assert!(gen_dir(&f, &first).is_dir(), "leased generation removed");
    let s = json(&f.packsync(&["status", "--json", "vol/packs"]).ok());
    assert_eq!(s["retained"][0]["leased"], true);
    write_fifo(&go, "go\n");
    let out = Run::wait(exec).ok();
    assert_eq!(out.stdout, "one");
    // Released: the next collection removes it.
    f.packsync(&["gc", "vol/packs", "--keep", "0", "--grace", "0"])
        .ok();
    assert!(!gen_dir(&f, &first).exists());
}

#[test]
fn a_lease_left_by_a_killed_exec_expires() {
    let f = Fixture::new();
    f.file("a.txt", "one");
    f.sync(&[]).ok();
    let first = live_gen(&f);
    let (mut exec, go) = exec_held(&f, |ready, go| {
        format!(
            "echo ready > {}; read x < {}",
            ready.display(),
            go.display()
        )
    });
    exec.kill().unwrap(); // SIGKILL: no chance to remove the lease
    exec.wait().unwrap();
    assert_eq!(fs::read_dir(f.state().join("leases")).unwrap().count(), 1);
    f.file("a.txt", "two");
    f.sync(&["--keep", "0"]).ok();
    assert!(
        !gen_dir(&f, &first).exists(),
        "a dead process's lease kept it"
    );
    assert_eq!(fs::read_dir(f.state().join("leases")).unwrap().count(), 0);
    write_fifo(&go, "go\n"); // let the orphaned shell finish
}

#[test]
fn exec_relays_sigterm_to_the_command() {
    let f = Fixture::new();
    f.file("a.txt", "one");
    f.sync(&[]).ok();
    // The shell waits on a child that blocks on a FIFO; its TERM trap reports.
    // (A TERM that reaches that child before it has reset its traps is lost:
    // then the test releases it through the FIFO instead.)
    let (exec, go) = exec_held(&f, |ready, go| {
        format!(
            "trap 'kill $p 2>/dev/null; echo terminated; exit 9' TERM; \
             (read x < {}) >/dev/null 2>&1 & p=$!; echo ready > {}; wait $p",
            go.display(),
            ready.display()
        )
    });
    let pid = rustix::process::Pid::from_raw(exec.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let out = Run::wait(exec);
    release_fifo(&go);
    assert_eq!(out.code, 9, "{}", out.stderr);
    assert_eq!(out.stdout, "terminated\n");
    assert_eq!(fs::read_dir(f.state().join("leases")).unwrap().count(), 0);
}

// ---- sync --chmod ----

#[test]
fn chmod_rules_apply_to_the_mirror_and_stay_up_to_date() {
    let f = Fixture::new();
    let p = f.file("pack/run.sh", "#!/bin/sh\n");
    fs::set_permissions(&p, fs::Permissions::from_mode(0o700)).unwrap();
    let q = f.file("pack/data.txt", "d");
    fs::set_permissions(&q, fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(f.src().join("pack"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::set_permissions(f.src(), fs::Permissions::from_mode(0o700)).unwrap();
    f.sync(&["--chmod", "D755,F644,Fu+X"]).ok();
    let d = f.dest();
    assert_eq!(mode(&d.join("pack")), 0o755);
    assert_eq!(
        fs::metadata(&d).unwrap().permissions().mode() & 0o7777,
        0o755
    );
    assert_eq!(mode(&d.join("pack/data.txt")), 0o644);
    assert_eq!(
        mode(&d.join("pack/run.sh")),
        0o644,
        "F644 came first, so X sees no x"
    );
    // The source keeps its modes, and the same rules find nothing to do.
    assert_eq!(mode(&p), 0o700);
    let out = f.sync(&["--chmod", "D755,F644,Fu+X"]).ok();
    assert!(out.stdout.contains("up to date"), "{}", out.stdout);
    f.sync(&["--chmod", "go-rwx,u+w"]).ok();
    assert_eq!(mode(&d.join("pack/run.sh")), 0o700);
    assert_eq!(mode(&d.join("pack/data.txt")), 0o600);
    f.packsync(&["verify", "vol/packs"]).ok();
}

#[test]
fn malformed_chmod_rules_are_refused_before_anything_is_written() {
    let f = Fixture::new();
    f.file("a", "a");
    for bad in ["D755,", "D8", "u+q", "x+r", "D", "77777", "g=u"] {
        f.sync_refused(
            &["--chmod", bad],
            2,
            &format!("invalid value {bad:?} for --chmod"),
        );
    }
    assert_eq!(f.volume().len(), 0);
}

// ---- sync --label / --allow-downgrade ----

#[test]
fn an_older_label_is_refused_unless_allowed() {
    let f = Fixture::new();
    f.file("a.txt", "new");
    f.sync(&["--label", "v1.10"]).ok();
    let gen = live_gen(&f);
    let before = f.volume();
    f.file("a.txt", "old");
    f.sync_refused(
        &["--label", "v1.9"],
        3,
        &format!("refusing to replace live generation {gen} labelled v1.10 with older v1.9"),
    );
    f.sync_refused(&["--label", "v1.9", "--dry-run"], 3, "--allow-downgrade");
    assert_eq!(f.volume(), before);
    f.sync(&["--label", "v1.9", "--allow-downgrade"]).ok();
    assert_eq!(fs::read_to_string(f.dest().join("a.txt")).unwrap(), "old");
    // Without --label there is nothing to order by; then nothing to order against.
    f.file("a.txt", "unlabelled");
    f.sync(&[]).ok();
    f.sync(&["--label", "1.2.0"]).ok();
    f.sync_refused(
        &["--label", "1.2.0-rc1"],
        3,
        "labelled 1.2.0 with older 1.2.0-rc1",
    );
    f.sync(&["--label", "v1.2"]).ok();
    f.sync(&["--label", "1.2.1"]).ok();
}

#[test]
fn a_sync_that_weakens_the_label_guard_warns() {
    let f = Fixture::new();
    f.file("a.txt", "v1");
    f.sync(&["--label", "1.2.0"]).ok();
    let gen = live_gen(&f);
    // The label not bumped with the content: published, with a warning.
    f.file("a.txt", "v1 changed");
    let out = f.sync(&["--label", "1.2.0"]).ok();
    assert!(
        out.stderr.contains(&format!(
            "warning: vol/packs: live generation {gen} is labelled 1.2.0 too, but its content differs"
        )),
        "{}",
        out.stderr
    );
    assert_eq!(
        fs::read_to_string(f.dest().join("a.txt")).unwrap(),
        "v1 changed"
    );
    // Nothing changed: nothing to say.
    assert!(!f
        .sync(&["--label", "1.2.0"])
        .ok()
        .stderr
        .contains("warning"));
    assert!(!f.sync(&[]).ok().stderr.contains("warning"));
    // No --label over a labelled generation: the guard is off from here on.
    let gen = live_gen(&f);
    f.file("a.txt", "unlabelled");
    let out = f.sync(&[]).ok();
    assert!(
        out.stderr.contains(&format!(
            "warning: vol/packs: replacing live generation {gen} labelled 1.2.0 with an unlabelled one: \
             the downgrade guard is off until a sync names a --label again"
        )),
        "{}",
        out.stderr
    );
    let s = json(&f.packsync(&["status", "--json", "vol/packs"]).ok());
    assert_eq!(s["live"]["label"], serde_json::Value::Null);
    // A newer label: no warning.
    f.file("a.txt", "v2");
    assert!(!f
        .sync(&["--label", "1.3.0"])
        .ok()
        .stderr
        .contains("warning"));
}

#[test]
fn a_new_label_on_the_same_content_is_a_new_generation() {
    let f = Fixture::new();
    f.file("a.txt", "a");
    f.sync(&["--label", "v1"]).ok();
    let first = live_gen(&f);
    assert!(f
        .sync(&["--label", "v1"])
        .ok()
        .stdout
        .contains("up to date"));
    assert!(f.sync(&[]).ok().stdout.contains("up to date"));
    let out = f.sync(&["--label", "v1.1"]).ok();
    assert!(out.stdout.contains("synced"), "{}", out.stdout);
    assert_ne!(live_gen(&f), first);
    let s = json(&f.packsync(&["status", "--json", "vol/packs"]).ok());
    assert_eq!(s["live"]["label"], "v1.1");
}

#[test]
fn labels_that_are_not_versions() {
    let f = Fixture::new();
    f.file("a.txt", "a");
    f.sync_refused(
        &["--label", "latest"],
        2,
        "invalid value \"latest\" for --label: not a version",
    );
    assert_eq!(f.volume().len(), 0);
    // Recorded as text when ordering is waived; then nothing can be ordered against it.
    f.sync(&["--label", "hotfix build", "--allow-downgrade"])
        .ok();
    let s = json(&f.packsync(&["status", "--json", "vol/packs"]).ok());
    assert_eq!(s["live"]["label"], "hotfix build");
    f.file("a.txt", "b");
    f.sync_refused(
        &["--label", "v2"],
        3,
        "is labelled \"hotfix build\", which is not a version",
    );
    f.sync(&["--label", "v2", "--allow-downgrade"]).ok();
}

// ---- sync --exec-after ----

#[test]
fn exec_after_runs_once_per_new_generation() {
    let f = Fixture::new();
    f.file("a.txt", "a");
    let log = f.path("hook.log");
    let hook = format!(
        "echo \"$PACKSYNC_GENERATION $PACKSYNC_ROOT $(cat \"$PACKSYNC_ROOT/a.txt\")\" >> {}",
        log.display()
    );
    f.sync(&["--exec-after", &hook]).ok();
    let gen = live_gen(&f);
    let root = fs::canonicalize(gen_dir(&f, &gen)).unwrap();
    assert_eq!(
        fs::read_to_string(&log).unwrap(),
        format!("{gen} {} a\n", root.display())
    );
    // Up to date, or a dry run: not run.
    f.sync(&["--exec-after", &hook]).ok();
    f.file("a.txt", "b");
    f.sync(&["--exec-after", &hook, "--dry-run"]).ok();
    assert_eq!(fs::read_to_string(&log).unwrap().lines().count(), 1);
    f.sync(&["--exec-after", &hook]).ok();
    assert_eq!(fs::read_to_string(&log).unwrap().lines().count(), 2);
}

#[test]
fn a_failing_exec_after_exits_1_and_the_generation_stays_live() {
    let f = Fixture::new();
    f.file("a.txt", "a");
    let out = f.sync(&["--exec-after", "exit 3"]).fails(
        1,
        "--exec-after command \"exit 3\" failed with exit status 3",
    );
    assert!(out.stdout.contains("synced"), "{}", out.stdout);
    let gen = live_gen(&f);
    assert!(out.stderr.contains(&format!("generation {gen} stays live")));
    assert_eq!(fs::read_to_string(f.dest().join("a.txt")).unwrap(), "a");
    assert_eq!(fs::read_dir(f.state().join("leases")).unwrap().count(), 0);
}

#[test]
fn exec_after_output_does_not_break_json() {
    let f = Fixture::new();
    f.file("a.txt", "a");
    let out = f
        .sync(&["--json", "--exec-after", "echo hello from the hook"])
        .ok();
    let v = json(&out);
    assert_eq!(v["status"], "synced");
    assert_eq!(
        v["exec_after"],
        serde_json::json!({
            "command": "echo hello from the hook",
            "ok": true,
            "exit_code": 0,
            "error": null
        })
    );
    assert!(out.stderr.contains("hello from the hook"), "{}", out.stderr);
    // Up to date, and the hook succeeded on this generation: it does not run.
    let v = json(&f.sync(&["--json", "--exec-after", "echo again"]).ok());
    assert_eq!(v["status"], "up to date");
    assert!(v["exec_after"].is_null(), "{v}");
}

#[test]
fn a_retried_sync_reruns_a_failed_exec_after_until_it_succeeds() {
    let f = Fixture::new();
    f.file("a.txt", "a");
    let count = f.path("runs");
    // Fails the first time it runs, succeeds after: a flaky registration.
    let hook = format!(
        "echo run >> {c}; [ $(wc -l < {c}) -ge 2 ]",
        c = count.display()
    );
    let first = f.sync(&["--json", "--exec-after", &hook]);
    assert_eq!(json(&first)["exec_after"]["ok"], false);
    assert_eq!(first.code, 1);
    let gen = live_gen(&f);
    // The init container restarts: the tree is up to date, the hook runs again.
    let v = json(&f.sync(&["--json", "--exec-after", &hook]).ok());
    assert_eq!(v["status"], "up to date");
    assert_eq!(v["exec_after"]["ok"], true, "{v}");
    assert_eq!(live_gen(&f), gen);
    // Once it succeeded on this generation, it is not run again for it.
    let v = json(&f.sync(&["--json", "--exec-after", &hook]).ok());
    assert!(v["exec_after"].is_null(), "{v}");
    assert_eq!(fs::read_to_string(&count).unwrap().lines().count(), 2);
    // A new generation runs it; the old one's record goes with the old one.
    f.file("a.txt", "b");
    let v = json(&f.sync(&["--json", "--exec-after", &hook]).ok());
    assert_eq!(v["exec_after"]["ok"], true, "{v}");
    f.packsync(&["gc", "vol/packs", "--keep", "0", "--grace", "0"])
        .ok();
    assert!(!gen_dir(&f, &gen).exists());
    let left: Vec<_> = fs::read_dir(f.state().join("meta"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(gen.as_str()))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_failing_exec_after_is_in_the_json_summary_and_exits_1() {
    let f = Fixture::new();
    f.file("a.txt", "a");
    let out = f.sync(&["--json", "--exec-after", "exit 3"]);
    // One object, the summary: no second, error-only object after it.
    let v = one_json_object(&out, 1);
    assert_eq!(v["status"], "synced");
    let gen = live_gen(&f);
    assert_eq!(v["generation"], gen.as_str());
    let hook = &v["exec_after"];
    assert_eq!(hook["command"], "exit 3");
    assert_eq!(hook["ok"], false);
    assert_eq!(hook["exit_code"], 3);
    let msg = format!(
        "--exec-after command \"exit 3\" failed with exit status 3; generation {gen} stays live"
    );
    assert_eq!(hook["error"], msg.as_str());
    assert_eq!(out.stderr, format!("packsync: error: {msg}\n"));
    assert_eq!(fs::read_to_string(f.dest().join("a.txt")).unwrap(), "a");
}

#[test]
fn verify_json_with_drift_prints_its_report_once_and_exits_4() {
    let f = Fixture::new();
    f.file("a.txt", "abc");
    f.sync(&[]).ok();
    corrupt_keeping_mtime(&f.dest().join("a.txt"), "xyz");
    let out = f.packsync(&["verify", "--json", "vol/packs"]);
    let v = one_json_object(&out, 4);
    assert_eq!(v["ok"], false);
    assert!(v.get("status").is_none(), "not an error object: {v}");
    assert_eq!(v["differences"][0]["what"], "modified");
    assert_eq!(v["differences"][0]["path"], "a.txt");
    // The one-line error stays on stderr for logs.
    assert!(
        out.stderr
            .starts_with("packsync: error: vol/packs: 1 difference(s)"),
        "{}",
        out.stderr
    );
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
}

// ---- sync --verify ----

#[test]
fn verify_option_catches_a_reused_file_that_changed_in_place() {
    let f = Fixture::new();
    f.file("a.txt", "abc");
    f.sync(&[]).ok();
    let gen = live_gen(&f);
    // Same size and mtime: the quick check reuses it, only its content differs.
    corrupt_keeping_mtime(&f.dest().join("a.txt"), "xyz");
    f.file("b.txt", "new");
    let before = volume_but_staging(&f);
    f.sync(&["--verify"]).fails(
        1,
        "--verify: the staged tree differs from the source: modified a.txt",
    );
    assert_eq!(volume_but_staging(&f), before, "something was published");
    assert_eq!(fs::read_dir(f.state().join("stage")).unwrap().count(), 0);
    assert_eq!(live_gen(&f), gen);
    // With a clean tree, --verify publishes.
    fs::write(f.dest().join("a.txt"), "abc").unwrap();
    let out = f.sync(&["--verify", "--checksum"]).ok();
    assert!(out.stdout.contains("synced"), "{}", out.stdout);
    f.packsync(&["verify", "vol/packs"]).ok();
}

// ---- durations ----

#[test]
fn malformed_durations_are_refused() {
    let f = Fixture::new();
    f.file("a", "a");
    f.sync(&[]).ok();
    for bad in ["15 minutes", "m", "1.2.3s"] {
        f.packsync(&["gc", "vol/packs", "--grace", bad])
            .fails(2, &format!("invalid value {bad:?} for --grace"));
        f.refused(
            &["sync", "--grace", bad, "src", "vol/packs"],
            2,
            "for --grace",
        );
    }
}

// ---- other layouts ----

/// Two images publishing into one fanout DEST as slots `a` and `b`.
fn two_slots(f: &Fixture) {
    for (slot, entry) in [("a", "aws"), ("b", "gcp")] {
        let p = f.path(&format!("img-{slot}/{entry}/pack.yaml"));
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, slot).unwrap();
        let src = format!("img-{slot}");
        let label = format!("v1-{slot}");
        f.packsync(&[
            "sync",
            "--layout",
            "fanout",
            "--slot",
            slot,
            "--label",
            &label,
            &src,
            "vol/packs",
        ])
        .ok();
    }
}

#[test]
fn the_commands_cover_every_fanout_slot_or_the_one_named() {
    let f = Fixture::new();
    two_slots(&f);
    let s = json(&f.packsync(&["status", "--json", "vol/packs"]).ok());
    assert_eq!(s["layout"], "fanout");
    assert_eq!(s["resolves"], true);
    let slots = s["slots"].as_array().unwrap();
    assert_eq!(slots.len(), 2);
    assert_eq!(
        (&slots[0]["slot"], &slots[1]["slot"]),
        (&"a".into(), &"b".into())
    );
    assert_eq!(slots[1]["live"]["label"], "v1-b");
    let one = json(
        &f.packsync(&["status", "--json", "--slot", "b", "vol/packs"])
            .ok(),
    );
    assert_eq!(one["slot"], "b");
    assert_eq!(one["live"]["label"], "v1-b");
    f.packsync(&["status", "--slot", "zz", "vol/packs"])
        .fails(3, "no slot zz here");

    f.packsync(&["verify", "vol/packs"]).ok();
    corrupt_keeping_mtime(&f.path("vol/packs/gcp/pack.yaml"), "x");
    let out = f
        .packsync(&["verify", "vol/packs"])
        .fails(4, "(slot b): 1 difference(s)");
    assert!(
        out.stdout.contains("slot b: modified gcp/pack.yaml"),
        "{}",
        out.stdout
    );
    f.packsync(&["verify", "--slot", "a", "vol/packs"]).ok();

    f.packsync(&["exec", "vol/packs", "--", "true"])
        .fails(2, "publishes several slots (a, b); choose one with --slot");
    let out = f
        .packsync(&[
            "exec",
            "--slot",
            "a",
            "vol/packs",
            "--",
            "sh",
            "-c",
            "cat \"$PACKSYNC_ROOT/aws/pack.yaml\"; echo \" $PACKSYNC_ROOT\"",
        ])
        .ok();
    let root = fs::canonicalize(f.path("vol/packs/..packsync/slots/a/gen")).unwrap();
    assert!(
        out.stdout.starts_with(&format!("a {}/", root.display())),
        "{}",
        out.stdout
    );

    f.packsync(&["wait", "vol/packs", "--timeout", "10s"]).ok();
    f.packsync(&["wait", "vol/packs", "--slot", "b", "--label", "v1-b"])
        .ok();
    f.packsync(&["wait", "vol/packs", "--label", "v1-b", "--timeout", "0"])
        .fails(5, "(slot a): no live generation labelled v1-b");
    f.packsync(&["rollback", "vol/packs"])
        .fails(2, "choose one with --slot");
    f.packsync(&["rollback", "--slot", "a", "vol/packs"])
        .fails(1, "no generation older than the live one");
}

#[test]
fn wait_on_an_empty_mount_point_returns_after_the_first_fanout_sync() {
    let f = Fixture::new();
    fs::create_dir(f.dest()).unwrap(); // the volume's mount point
    f.file("aws/pack.yaml", "x");
    f.packsync(&["wait", "vol/packs", "--timeout", "200ms"])
        .fails(5, "vol/packs: no live generation after 200ms");
    let waiter = f.spawn(&["wait", "vol/packs", "--timeout", "60s"]);
    f.packsync(&["sync", "--layout", "fanout", "src", "vol/packs"])
        .ok();
    let out = Run::wait(waiter).ok();
    assert!(out.stdout.contains("is live"), "{}", out.stdout);
    f.packsync(&["status", "--slot", "a", "vol/packs"])
        .fails(3, "no slot a here");
}

#[test]
fn rollback_verify_and_exec_with_the_dir_layout() {
    let f = Fixture::new();
    f.file("a.txt", "one");
    f.sync(&["--layout", "dir", "--label", "v1"]).ok();
    f.file("a.txt", "two");
    f.sync(&["--layout", "dir", "--label", "v2"]).ok();
    f.packsync(&["verify", "vol/packs"]).ok();
    f.packsync(&["status", "--slot", "a", "vol/packs"])
        .fails(2, "slots exist only with --layout fanout");
    let out = f.packsync(&["rollback", "vol/packs"]).ok();
    assert!(out.stdout.contains("(label v1)"), "{}", out.stdout);
    assert_eq!(fs::read_to_string(f.dest().join("a.txt")).unwrap(), "one");
    assert!(fs::symlink_metadata(f.dest()).unwrap().is_dir());
    f.packsync(&["verify", "vol/packs"]).ok();
    // With this layout the live generation is DEST itself.
    let out = f
        .packsync(&[
            "exec",
            "vol/packs",
            "--",
            "sh",
            "-c",
            "echo \"$PACKSYNC_ROOT\"",
        ])
        .ok();
    assert_eq!(
        out.stdout.trim(),
        fs::canonicalize(f.dest()).unwrap().to_str().unwrap()
    );
    f.packsync(&["rollback", "vol/packs", "--to", "v2"]).ok();
    assert_eq!(fs::read_to_string(f.dest().join("a.txt")).unwrap(), "two");
}

// ---- a manifest lost to a power cut ----

/// A live generation whose manifest is empty (what a power cut after a
/// `--no-fsync` sync leaves), missing, or cut short is not up to date: the
/// next sync republishes it with a whole manifest, and `verify` passes.
#[test]
fn a_live_generation_with_a_lost_manifest_is_rebuilt_not_reused() {
    let f = Fixture::new();
    f.file("pack/a.txt", "a");
    f.file("pack/lib/b.txt", "bb");
    f.sync(&["--no-fsync"]).ok();
    let gen = live_gen(&f);
    let manifest = f.state().join("meta").join(format!("{gen}.manifest"));
    // The manifest as written, but for the time it was written.
    let text = |p: &std::path::Path| -> Vec<String> {
        let all = String::from_utf8(fs::read(p).unwrap()).unwrap();
        all.lines()
            .filter(|l| !l.starts_with("created "))
            .map(str::to_string)
            .collect()
    };
    let whole = fs::read(&manifest).unwrap();
    let recorded = text(&manifest);
    let damages: [(&str, Option<&[u8]>); 3] = [
        ("empty", Some(b"")),
        ("cut short", Some(&whole[..whole.len() - 20])),
        ("missing", None),
    ];
    for (what, damaged) in damages {
        match damaged {
            Some(text) => fs::write(&manifest, text).unwrap(),
            None => fs::remove_file(&manifest).unwrap(),
        }
        // `verify` refuses a manifest that does not read whole.
        assert_eq!(f.packsync(&["verify", "vol/packs"]).code, 1, "{what}");
        // A plain sync sees a missing or empty one; --checksum reads every entry.
        let extra: &[&str] = if what == "cut short" {
            &["--checksum"]
        } else {
            &[]
        };
        let out = f.sync(extra).ok();
        assert!(out.stdout.contains("synced"), "{what}: {}", out.stdout);
        assert_eq!(live_gen(&f), gen, "{what}: the same tree keeps its name");
        assert_eq!(text(&manifest), recorded, "{what}");
        f.packsync(&["verify", "vol/packs"]).ok();
        assert!(f.sync(&[]).ok().stdout.contains("up to date"), "{what}");
    }
    // Converging on it from another version: the bad manifest is replaced too.
    fs::write(&manifest, b"").unwrap();
    let pack = f.src().join("pack");
    let (s, ns) = mtime(&pack);
    f.file("pack/c.txt", "c");
    f.sync(&[]).ok();
    fs::remove_file(pack.join("c.txt")).unwrap();
    set_mtime(&pack, s, ns);
    f.sync(&[]).ok();
    assert_eq!(live_gen(&f), gen);
    assert_eq!(text(&manifest), recorded);
    f.packsync(&["verify", "vol/packs"]).ok();
}

/// A live manifest whose header reads but whose entries do not (cut short
/// in its last line, two lines out of order) is trusted for no file: a
/// sync of a changed source plans against the live listing, as where the
/// manifest is missing, and copies every file afresh rather than reuse one
/// on that manifest's word; `--dry-run --itemize` shows the change first.
/// The new generation has a whole manifest, `verify` passes, and the next
/// sync is up to date.
#[test]
fn a_live_manifest_that_does_not_index_is_trusted_for_no_file() {
    for damage in ["cut short", "out of order"] {
        let f = Fixture::new();
        f.file("pack/a.txt", "a");
        f.file("pack/lib/b.txt", "bb");
        f.file("pack/lib/c.txt", "cc");
        f.sync(&[]).ok();
        let manifest = f
            .state()
            .join("meta")
            .join(format!("{}.manifest", live_gen(&f)));
        let text = fs::read_to_string(&manifest).unwrap();
        let damaged = match damage {
            "cut short" => text[..text.len() - 20].to_string(),
            _ => {
                let mut lines: Vec<&str> = text.lines().collect();
                let n = lines.len();
                lines.swap(n - 1, n - 2);
                lines.join("\n") + "\n"
            }
        };
        fs::write(&manifest, damaged).unwrap();
        f.file("pack/a.txt", "a, changed");

        let planned = f.unchanged_by(|| f.sync(&["--dry-run", "--itemize"]).ok());
        assert!(
            planned.stdout.contains("pack/a.txt"),
            "{damage}: {}",
            planned.stdout
        );
        let v = json(&f.sync(&["--json"]).ok());
        assert_eq!(v["status"], "synced", "{damage}: {v}");
        assert_eq!(
            (v["copied"].as_u64(), v["reused"].as_u64()),
            (Some(3), Some(0)),
            "{damage}: every file copied: {v}"
        );
        assert_eq!(
            fs::read_to_string(f.dest().join("pack/a.txt")).unwrap(),
            "a, changed"
        );
        f.packsync(&["verify", "vol/packs"]).ok();
        let v = json(&f.sync(&["--json"]).ok());
        assert_eq!(v["status"], "up to date", "{damage}: {v}");
    }
}

/// Durations and numbers past what packsync can hold are a usage error
/// (exit 2, one line), never a crash, and change nothing.
#[test]
fn out_of_range_durations_and_numbers_are_refused_in_one_line() {
    let f = Fixture::new();
    f.file("pack/a.txt", "a");
    f.sync(&[]).ok();
    for (flag, value) in [
        ("--grace", "99999999999999999999d"),
        ("--grace", "18446744073709551615s"),
        ("--keep", "99999999999999999999999"),
        ("--max-delete", "-1"),
    ] {
        let arg = format!("{flag}={value}");
        f.refused(&["sync", &arg, "src", "vol/packs"], 2, flag);
    }
    f.refused(
        &["wait", "vol/packs", "--timeout", "99999999999999999999d"],
        2,
        "--timeout",
    );
    f.refused(
        &["gc", "vol/packs", "--grace", "99999999999999999999d"],
        2,
        "--grace",
    );
}

// ---- gc: what the README promises ----

fn generations(f: &Fixture) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(f.state().join("gen"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// `--keep 2` by default; nothing retired less than `--grace` ago is
/// collected, even with `--keep 0`; past the grace, only the live one stays.
#[test]
fn gc_keeps_two_by_default_and_nothing_inside_the_grace() {
    let f = Fixture::new();
    for v in ["1", "2", "3", "4", "5"] {
        f.file("a.txt", v);
        f.sync(&[]).ok();
    }
    // The syncs' own collection ran with --grace 0 (Fixture::sync): the live
    // generation and the two before it.
    assert_eq!(generations(&f).len(), 3, "{:?}", generations(&f));
    f.file("a.txt", "6");
    f.packsync(&["sync", "--keep", "0", "src", "vol/packs"])
        .ok();
    // Retired seconds ago, inside the default 15 minutes: kept.
    f.packsync(&["gc", "vol/packs", "--keep", "0"]).ok();
    assert_eq!(generations(&f).len(), 4, "{:?}", generations(&f));
    f.packsync(&["gc", "vol/packs", "--keep", "0", "--grace", "0"])
        .ok();
    assert_eq!(generations(&f), [live_gen(&f)]);
}

/// Another host's staging is collected once untouched for an hour, and
/// not before (its writer may be alive there).
#[test]
fn gc_removes_another_hosts_staging_after_an_hour() {
    let f = Fixture::new();
    f.file("a.txt", "1");
    f.sync(&[]).ok();
    let stage = f.state().join("stage");
    let plant = |name: &str, ago: &str| {
        let dir = stage.join(name);
        fs::create_dir_all(dir.join("packs")).unwrap();
        fs::write(dir.join("packs/half"), "x").unwrap();
        for p in [dir.join("packs"), dir.clone()] {
            let st = Command::new("touch")
                .args(["-h", "-d", ago])
                .arg(&p)
                .status()
                .unwrap();
            assert!(st.success());
        }
        dir
    };
    let old = plant("otherhost-17-0123456789abcdef", "61 minutes ago");
    let young = plant("otherhost-18-0123456789abcdee", "59 minutes ago");
    f.packsync(&["gc", "vol/packs"]).ok();
    assert!(!old.exists(), "an hour untouched: collected");
    assert!(young.exists(), "younger than an hour: kept");
}

/// A retired generation holding a `.nfs*` file (an NFS client's name for a
/// file deleted while open elsewhere) waits in `trash/` with that file
/// untouched; once the name is gone, the next gc removes the rest.
#[test]
fn gc_leaves_nfs_silly_renames_and_their_generation_waits_in_trash() {
    let f = Fixture::new();
    f.file("a.txt", "1");
    f.sync(&[]).ok();
    let old = live_gen(&f);
    let silly = gen_dir(&f, &old).join(".nfs0000000000a1b2c300000001");
    fs::write(&silly, "still open on another client").unwrap();
    f.file("a.txt", "2");
    f.sync(&[]).ok();
    f.packsync(&["gc", "vol/packs", "--keep", "0", "--grace", "0"])
        .ok();
    assert!(!gen_dir(&f, &old).exists(), "out of gen/");
    let trash: Vec<PathBuf> = fs::read_dir(f.state().join("trash"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(trash.len(), 1, "{trash:?}");
    let kept = trash[0].join(silly.file_name().unwrap());
    assert_eq!(
        fs::read_to_string(&kept).unwrap(),
        "still open on another client"
    );
    assert_eq!(
        fs::read_dir(&trash[0]).unwrap().count(),
        1,
        "the rest removed"
    );
    fs::remove_file(&kept).unwrap();
    f.packsync(&["gc", "vol/packs"]).ok();
    assert_eq!(fs::read_dir(f.state().join("trash")).unwrap().count(), 0);
    assert_eq!(fs::read_to_string(f.dest().join("a.txt")).unwrap(), "2");
}

/// `--checksum` decides an up-to-date tree a directory at a time, reading
/// both sides: an edit that kept size and mtime, on either side and deep
/// in the tree, is found and copied; an untouched tree is up to date
/// with nothing written.
#[test]
fn checksum_reads_both_sides_of_every_directory_before_calling_a_tree_up_to_date() {
    let f = Fixture::new();
    for d in 0..4 {
        for i in 0..5 {
            f.file(&format!("d{d}/sub/f{i}"), &format!("{d}-{i}"));
        }
    }
    f.sync(&[]).ok();
    let out = f.unchanged_by(|| f.sync(&["--checksum"]).ok());
    assert!(out.stdout.contains("up to date"), "{}", out.stdout);

    // One edit in the source, one in the live tree: neither changes size nor mtime.
    corrupt_keeping_mtime(&f.src().join("d3/sub/f4"), "3-X");
    let out = f.sync(&[]).ok();
    assert!(
        out.stdout.contains("up to date"),
        "the quick check cannot tell"
    );
    let out = f.sync(&["--checksum", "--itemize"]).ok();
    assert_eq!(changes_as_lines_text(&out.stdout), ["~ d3/sub/f4"]);
    corrupt_keeping_mtime(&f.dest().join("d1/sub/f0"), "1-Y");
    let ino = |p: &str| {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(f.dest().join(p)).unwrap().ino()
    };
    let (kept, bad) = (ino("d2/sub/f2"), ino("d1/sub/f0"));
    let out = f.sync(&["--checksum", "--itemize"]).ok();
    assert_eq!(changes_as_lines_text(&out.stdout), ["~ d1/sub/f0"]);
    assert_eq!(
        fs::read_to_string(f.dest().join("d1/sub/f0")).unwrap(),
        "1-0"
    );
    // Bytes equal on both sides: hardlinked from the live generation; the
    // edited one copied afresh, its live inode left to the old generation.
    assert_eq!(ino("d2/sub/f2"), kept);
    assert_ne!(ino("d1/sub/f0"), bad);
    assert_eq!(
        fs::read_to_string(f.dest().join("d3/sub/f4")).unwrap(),
        "3-X"
    );
    let out = f.unchanged_by(|| f.sync(&["--checksum"]).ok());
    assert!(out.stdout.contains("up to date"), "{}", out.stdout);
}

/// The `--itemize` lines of a text run (the summary line left out).
fn changes_as_lines_text(stdout: &str) -> Vec<&str> {
    stdout
        .lines()
        .filter(|l| !l.starts_with("packsync:"))
        .collect()
}
