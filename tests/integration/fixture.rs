//! A temporary `src/` and `vol/`, and the real packsync binary to run on them.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};

pub struct Fixture {
    pub dir: tempfile::TempDir,
}

/// What a command printed and how it exited.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn from(out: Output) -> Run {
        Run {
            code: code(&out),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Wait for a spawned command (its output piped) to end.
    pub fn wait(child: Child) -> Run {
        Run::from(child.wait_with_output().unwrap())
    }

    #[track_caller]
    pub fn ok(self) -> Run {
        assert_eq!(
            self.code, 0,
            "expected success\nstdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        self
    }

    #[track_caller]
    pub fn fails(self, code: i32, needle: &str) -> Run {
        assert_eq!(
            self.code, code,
            "stdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        assert!(
            self.stderr.contains(needle),
            "stderr lacks {needle:?}: {}",
            self.stderr
        );
        assert_eq!(
            self.stderr.trim_end().lines().count(),
            1,
            "one line expected: {}",
            self.stderr
        );
        self
    }
}

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_packsync"))
}

/// The one way to run the binary: a command for it, to add arguments to.
pub fn packsync() -> Command {
    let mut c = Command::new(bin());
    clean_env(&mut c);
    c
}

/// Take out of `cmd`'s environment every `PACKSYNC_*` variable but the
/// tests' own `PACKSYNC_TEST_*`: any other is a flag of `sync` (its
/// environment form), and one left in the environment the tests run in
/// would change what every run does.
pub fn clean_env(cmd: &mut Command) -> &mut Command {
    for (name, _) in std::env::vars_os() {
        let n = name.to_string_lossy();
        if n.starts_with("PACKSYNC_") && !n.starts_with("PACKSYNC_TEST_") {
            cmd.env_remove(&name);
        }
    }
    cmd
}

/// The exit code, or 128 + the signal that ended the process (as a shell says).
pub fn code(out: &Output) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    out.status
        .code()
        .unwrap_or_else(|| 128 + out.status.signal().unwrap_or(0))
}

#[track_caller]
pub fn ok(out: Output) -> Output {
    assert_eq!(
        code(&out),
        0,
        "expected success\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Whether the tests run as root (owners, mounts, device nodes).
/// A generation's digest as the README defines it: the SHA-256 of its
/// manifest's entry lines (each with its newline) and `label LABEL`.
pub fn digest_of(entry_lines: &str, label: &str) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(entry_lines.as_bytes());
    h.update(format!("label {label}").as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The SHA-256 of `data`, in hex.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `openssl ARGS` in `dir`; its stderr shown if it fails.
pub fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A private CA (`dir/ca.pem`, `dir/ca.key`) and a server certificate for
/// 127.0.0.1 that it signs (`dir/cert.pem`, `dir/key.pem`), made by openssl.
pub fn private_ca(dir: &Path) {
    fs::create_dir_all(dir).unwrap();
    fs::write(
        dir.join("ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    let days = ["-days", "2"];
    openssl(
        dir,
        &[
            &["req", "-x509", "-newkey", "rsa:2048", "-nodes"][..],
            &days,
            &[
                "-subj",
                "/CN=test ca",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
            ],
        ]
        .concat(),
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "key.pem",
            "-out",
            "leaf.csr",
        ],
    );
    openssl(
        dir,
        &[
            &[
                "x509",
                "-req",
                "-in",
                "leaf.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
            ][..],
            &days,
            &["-extfile", "ext", "-out", "cert.pem"],
        ]
        .concat(),
    );
}

/// Whether this run is CI's (`CI` set, as `.ci/run` sets it): there, no
/// test may skip.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// A test that cannot run here: one line on stderr, appended to the file
/// `PACKSYNC_SKIP_LOG` names (so CI can count them); under CI a failure.
/// Returns true, for `if skip(..) { return; }`.
#[track_caller]
pub fn skip(why: &str) -> bool {
    let at = std::panic::Location::caller();
    assert!(!in_ci(), "{why} (required under CI; at {at})");
    eprintln!("skipped: {why}");
    if let Some(log) = std::env::var_os("PACKSYNC_SKIP_LOG") {
        use std::io::Write;
        if let Ok(mut f) = fs::OpenOptions::new().create(true).append(true).open(log) {
            let _ = writeln!(f, "{at}: {why}");
        }
    }
    true
}

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Set the mtime (and atime) of `path` to `secs`.`nsec` after the epoch,
/// of a symlink itself rather than its target.
pub fn set_mtime(path: &Path, secs: i64, nsec: u32) {
    let t = rustix::fs::Timespec {
        tv_sec: secs,
        tv_nsec: nsec.into(),
    };
    let ts = rustix::fs::Timestamps {
        last_access: t,
        last_modification: t,
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        path,
        &ts,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .unwrap_or_else(|e| panic!("set mtime of {}: {e}", path.display()));
}

/// Write `data` at `path` with the mtime `secs`.`nsec`.
pub fn write_at(path: &Path, data: &[u8], secs: i64, nsec: u32) {
    fs::write(path, data).unwrap();
    set_mtime(path, secs, nsec);
}

/// The mtime of `path` (not following a symlink) as (seconds, nanoseconds).
pub fn mtime(path: &Path) -> (i64, u32) {
    let m = fs::symlink_metadata(path).unwrap();
    (m.mtime(), m.mtime_nsec() as u32)
}

impl Fixture {
    pub fn new() -> Fixture {
        let dir = tempfile::Builder::new()
            .prefix("packsync-test")
            .tempdir()
            .unwrap();
        fs::create_dir(dir.path().join("src")).unwrap();
        fs::create_dir(dir.path().join("vol")).unwrap();
        Fixture { dir }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn src(&self) -> PathBuf {
        self.path("src")
    }

    pub fn dest(&self) -> PathBuf {
        self.path("vol/packs")
    }

    pub fn state(&self) -> PathBuf {
        self.path("vol/.packs.packsync")
    }

    /// Write a file below src/ (parents created). Its mtime is the time of
    /// writing: `set_mtime` gives it another.
    pub fn file(&self, rel: &str, content: &str) -> PathBuf {
        let p = self.src().join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, content).unwrap();
        p
    }

    /// `packsync ARGS`, run in the fixture's directory.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = packsync();
        c.args(args).current_dir(self.dir.path());
        c
    }

    pub fn packsync(&self, args: &[&str]) -> Run {
        Run::from(self.command(args).output().unwrap())
    }

    /// `packsync ARGS` started with its output piped; `Run::wait` ends it.
    pub fn spawn(&self, args: &[&str]) -> Child {
        self.command(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// `packsync sync --grace 0 src vol/packs` plus `extra`.
    pub fn sync(&self, extra: &[&str]) -> Run {
        let mut args = vec!["sync", "--grace", "0"];
        args.extend_from_slice(extra);
        args.push("src");
        args.push("vol/packs");
        self.packsync(&args)
    }

    /// `volume` and vol/'s own mtime, but the mtime of the state
    /// directory's `stage/` (every writer makes and removes its staging
    /// directory there).
    pub fn volume_but_staging(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .volume()
            .into_iter()
            .map(|l| {
                if l.starts_with("\".packs.packsync/stage\" d") {
                    let cut = l.find(" mtime=").unwrap();
                    let rest = &l[cut + 7..];
                    let end = rest.find(' ').unwrap();
                    format!("{}{}", &l[..cut], &rest[end..])
                } else {
                    l
                }
            })
            .collect();
        v.push(format!("vol/ itself: {:?}", mtime(&self.path("vol"))));
        v
    }

    /// Snapshot of everything below vol/ (state directory included).
    pub fn volume(&self) -> Vec<String> {
        snapshot(&self.path("vol"), true)
    }

    /// `unchanged_by`, where the only trace a spooling writer may leave is
    /// the mtime of the state directory's `stage/` (its own staging
    /// directory, made and removed there as every writer's is).
    #[track_caller]
    pub fn unchanged_but_staging(&self, run: impl FnOnce() -> Run) -> Run {
        let before = self.volume_but_staging();
        let out = run();
        assert_eq!(
            self.volume_but_staging(),
            before,
            "the volume changed; stderr: {}",
            out.stderr
        );
        out
    }

    /// Run `run`, and check that it left the whole volume (DEST, the state
    /// directory and everything else below vol/, vol/ itself: a name made
    /// and removed again shows in its mtime) and the source as they were,
    /// entry by entry: types, bytes, modes, link targets, mtimes, owners,
    /// inodes.
    #[track_caller]
    pub fn unchanged_by(&self, run: impl FnOnce() -> Run) -> Run {
        let look = || {
            let mut v = self.volume();
            v.push(format!("vol/ itself: mtime={:?}", mtime(&self.path("vol"))));
            (v, snapshot(&self.src(), true))
        };
        let before = look();
        let out = run();
        let after = look();
        assert_eq!(
            after.0, before.0,
            "the volume changed; stderr: {}",
            out.stderr
        );
        assert_eq!(
            after.1, before.1,
            "the source changed; stderr: {}",
            out.stderr
        );
        out
    }

    /// `packsync ARGS` must be refused with `code` and one line holding
    /// `needle`, changing nothing (`unchanged_by`).
    #[track_caller]
    pub fn refused(&self, args: &[&str], code: i32, needle: &str) -> Run {
        self.unchanged_by(|| self.packsync(args).fails(code, needle))
    }

    /// `refused` for `packsync sync --grace 0 EXTRA src vol/packs`.
    #[track_caller]
    pub fn sync_refused(&self, extra: &[&str], code: i32, needle: &str) -> Run {
        let mut args = vec!["sync", "--grace", "0"];
        args.extend_from_slice(extra);
        args.extend(["src", "vol/packs"]);
        self.refused(&args, code, needle)
    }
}

/// Every entry below `root` with type, mode, size, mtime, owner, content
/// digest or link target, and (when `inodes`) inode; sorted by path.
pub fn snapshot(root: &Path, inodes: bool) -> Vec<String> {
    let mut out = Vec::new();
    walk(root, root, inodes, &mut out);
    out.sort();
    out
}

fn walk(root: &Path, dir: &Path, inodes: bool, out: &mut Vec<String>) {
    // A missing root lists nothing; any other failure shows in the listing,
    // so an unreadable directory or file never passes for an empty one.
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if dir == root && e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => {
            out.push(format!(
                "{:?} unreadable directory: {e}",
                dir.strip_prefix(root).unwrap()
            ));
            return;
        }
    };
    for e in rd {
        let e = e.unwrap();
        let p = e.path();
        let m = fs::symlink_metadata(&p).unwrap();
        let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
        let what = if m.file_type().is_symlink() {
            format!("l {:?}", fs::read_link(&p).unwrap())
        } else if m.is_dir() {
            "d".to_string()
        } else {
            match fs::read(&p) {
                Ok(data) => format!("f {} {:x}", m.size(), fxhash(&data)),
                Err(e) => format!("f {} unreadable: {e}", m.size()),
            }
        };
        let ino = if inodes {
            format!(" ino={}", m.ino())
        } else {
            String::new()
        };
        let mode = if m.file_type().is_symlink() {
            0
        } else {
            m.permissions().mode() & 0o7777
        };
        out.push(format!(
            "{rel:?} {what} mode={mode:o} mtime={}.{} owner={}:{}{ino}",
            m.mtime(),
            m.mtime_nsec(),
            m.uid(),
            m.gid()
        ));
        if m.is_dir() {
            walk(root, &p, inodes, out);
        }
    }
}

fn fxhash(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in data {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// The mirror of `src` as a reader sees it through `dest`: the same listing
/// as `snapshot`, without inode numbers. Hardlink groups are compared as
/// "which paths share an inode".
pub fn mirror(dest: &Path) -> Vec<String> {
    let mut v = snapshot(dest, false);
    v.extend(links(dest));
    let root = fs::metadata(dest).unwrap();
    v.push(format!(
        ". mode={:o} mtime={}.{}",
        root.permissions().mode() & 0o7777,
        root.mtime(),
        root.mtime_nsec()
    ));
    v
}

/// `hardlinks [paths]` lines: which files below `root` share an inode.
pub fn links(root: &Path) -> Vec<String> {
    let mut by_ino: std::collections::BTreeMap<u64, Vec<String>> = Default::default();
    fn collect(root: &Path, dir: &Path, by: &mut std::collections::BTreeMap<u64, Vec<String>>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                collect(root, &p, by);
            } else if m.is_file() && m.nlink() > 1 {
                by.entry(m.ino())
                    .or_default()
                    .push(p.strip_prefix(root).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    collect(root, root, &mut by_ino);
    let mut groups: Vec<String> = by_ino
        .into_values()
        .filter(|g| g.len() > 1)
        .map(|mut g| {
            g.sort();
            format!("hardlinks {g:?}")
        })
        .collect();
    groups.sort();
    groups
}

/// A writer started in the background: `packsync sync -q --grace 0 --keep 0
/// EXTRA SRC DEST`, its stdout dropped, its stderr piped for a failure's message.
pub fn spawn_sync(src: &Path, dest: &Path, extra: &[&str]) -> std::process::Child {
    packsync()
        .args(["sync", "-q", "--grace", "0", "--keep", "0"])
        .args(extra)
        .arg(src)
        .arg(dest)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// The one JSON object a `--json` run printed on stdout.
#[track_caller]
/// Each line of `stdout` as a JSON object, and each one's `status`.
pub fn json_lines(stdout: &str) -> (Vec<serde_json::Value>, Vec<String>) {
    let objects: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    let statuses = objects
        .iter()
        .map(|o| o["status"].as_str().unwrap().to_string())
        .collect();
    (objects, statuses)
}

pub fn json(run: &Run) -> serde_json::Value {
    serde_json::from_str(run.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", run.stdout))
}

/// `changes` of a `--json --itemize` summary as `--itemize` lines.
#[track_caller]
pub fn changes_as_lines(v: &serde_json::Value) -> Vec<String> {
    v["changes"]
        .as_array()
        .unwrap_or_else(|| panic!("no changes list: {v}"))
        .iter()
        .map(|c| {
            assert_eq!(c.as_object().unwrap().len(), 2, "{c}");
            format!(
                "{} {}",
                c["change"].as_str().unwrap(),
                c["path"].as_str().unwrap()
            )
        })
        .collect()
}

/// Run the Python `script` with `stdin`; its standard output. `what` names
/// it in the failure.
pub fn python(script: &str, stdin: &str, what: &str) -> Vec<u8> {
    use std::io::Write;
    let mut child = Command::new("python3")
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{what} failed");
    out.stdout
}
