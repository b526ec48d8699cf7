//! The same on a network filesystem: `../shared/netfs-rig.sh` gives two FUSE
//! clients of one export (GlusterFS, then sshfs), which act as two hosts
//! with no shared locks (sshfs) and no RENAME_EXCHANGE. On each backend:
//! symlink times never reach the target, a sync with nothing changed is up
//! to date from either client, unchanged files are reused; then writers on
//! both clients race for a few rounds while readers on both read.
//!
//! Needs root and the rig. When the rig cannot come up the test fails under
//! CI (`CI` set) and is skipped elsewhere. The rig runs in a private
//! directory and is taken down when the test ends, even when it fails.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use super::{code, common_paths, entries, ok, packsync, variant_of, variant_tree, Victim};
use crate::fixture::Fixture;

const FILES: usize = 20;
const ROUNDS: usize = 8;

fn script() -> PathBuf {
    std::env::var_os("NETFS_RIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/netfs-rig.sh"))
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// One rig, in a private directory; `down` when dropped.
struct Rig {
    env: Vec<(String, String)>,
    vars: HashMap<String, String>,
}

impl Rig {
    fn up(backend: &str) -> Result<Rig, String> {
        let dir =
            std::env::temp_dir().join(format!("packsync-rig-{}-{backend}", std::process::id()));
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(2299);
        let mut env = vec![
            ("NETFS_RIG_DIR".to_string(), dir.display().to_string()),
            ("NETFS_RIG_BACKEND".to_string(), backend.to_string()),
            ("NETFS_RIG_SSH_PORT".to_string(), port.to_string()),
        ];
        // The rig asks `sshfs --help | grep -q` under pipefail, which loses the
        // option now and then (SIGPIPE); ask once here, reading all of it.
        let help = Command::new("sshfs").arg("--help").output();
        if help.is_ok_and(|h| {
            String::from_utf8_lossy(&[h.stdout, h.stderr].concat()).contains("no_contain_symlinks")
        }) {
            env.push((
                "NETFS_RIG_SSHFS_OPTS".to_string(),
                "dir_cache=no,no_contain_symlinks".to_string(),
            ));
        }
        let mut rig = Rig {
            env,
            vars: HashMap::new(),
        };
        let up = rig.run("up")?;
        if !up.status.success() {
            return Err(format!(
                "`netfs-rig.sh up` failed: {}",
                String::from_utf8_lossy(&up.stderr)
            ));
        }
        let env = rig.run("env")?;
        for line in String::from_utf8_lossy(&env.stdout).lines() {
            if let Some((k, v)) = line.split_once('=') {
                rig.vars.insert(k.to_string(), v.to_string());
            }
        }
        Ok(rig)
    }

    fn run(&self, cmd: &str) -> Result<std::process::Output, String> {
        Command::new("bash")
            .arg(script())
            .arg(cmd)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .output()
            .map_err(|e| format!("cannot run {}: {e}", script().display()))
    }

    fn mnt(&self, which: &str) -> PathBuf {
        PathBuf::from(&self.vars[&format!("NETFS_MNT_{which}")])
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        match self.run("down") {
            Ok(o) if o.status.success() => {}
            other => eprintln!("netfs-rig.sh down failed: {other:?}"),
        }
    }
}

/// A tree as a client shows it: symlinks keep the times they were made with
/// (`linkmeta 0`); sshfs keeps whole seconds and shows no hardlinks at all
/// (see `server_hardlinks`).
fn view(root: &Path, whole_seconds: bool) -> Vec<String> {
    super::mirror_without_link_meta(root)
        .into_iter()
        .filter(|l| !l.starts_with("hardlinks "))
        .map(|l| {
            if !whole_seconds {
                return l;
            }
            l.split(' ')
                .map(
                    |w| match w.strip_prefix("mtime=").and_then(|t| t.split_once('.')) {
                        Some((secs, _)) => format!("mtime={secs}"),
                        None => w.to_string(),
                    },
                )
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

/// The hardlink pair of `variant_tree`, as the server's own directory shows it.
#[track_caller]
fn server_hardlinks(rig: &Rig, dest: &str) {
    use std::os::unix::fs::MetadataExt;
    let root = fs::canonicalize(Path::new(&rig.vars["NETFS_RIG_SERVER_DIR"]).join(dest)).unwrap();
    let ino = |p: &str| fs::metadata(root.join(p)).unwrap().ino();
    assert_eq!(
        ino("d0/f0000.txt"),
        ino("d1/hardlink"),
        "hardlink group in {}",
        root.display()
    );
}

/// Serialise rig users of this machine (one glusterd port).
fn rig_lock() -> fs::File {
    let f = fs::File::create(std::env::temp_dir().join("packsync-netfs-rig.lock")).unwrap();
    rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive).unwrap();
    f
}

#[test]
fn netfs_rig_writers_and_readers_on_two_clients() {
    if super::skip("the network-filesystem rig", true, false) {
        return;
    }
    if !script().exists() {
        assert!(!in_ci(), "{} is missing", script().display());
        eprintln!("skipped: {} is missing", script().display());
        return;
    }
    let _lock = rig_lock();
    for backend in ["gluster", "sshfs"] {
        let rig = match Rig::up(backend) {
            Ok(r) => r,
            Err(e) if !in_ci() => {
                eprintln!("skipped: {backend} rig did not come up: {e}");
                continue;
            }
            Err(e) => panic!("{backend} rig did not come up: {e}"),
        };
        fidelity(backend, &rig);
        writers_and_readers(backend, &rig);
    }
}

/// Up to date from both clients, reuse, and symlink times kept off targets.
fn fidelity(backend: &str, rig: &Rig) {
    let f = Fixture::new();
    let victim = Victim::new(f.path("victim"));
    let src = f.src();
    variant_tree(&src, 1, FILES, 0);
    std::os::unix::fs::symlink(&victim.dir, src.join("to-victim")).unwrap();
    std::os::unix::fs::symlink(victim.dir.join("secret"), src.join("d2/to-secret")).unwrap();
    let (a, b) = (
        rig.mnt("A").join("fid/packs"),
        rig.mnt("B").join("fid/packs"),
    );
    fs::create_dir_all(a.parent().unwrap()).unwrap();
    let sync = |dest: &Path, extra: &[&str]| {
        packsync()
            .arg("sync")
            .args(extra)
            .arg(&src)
            .arg(dest)
            .output()
            .unwrap()
    };
    ok(sync(&a, &[]));
    victim.assert_untouched();
    let sshfs = backend == "sshfs";
    assert_eq!(
        super::one_of(&a, std::slice::from_ref(&src), &|p| view(p, sshfs)),
        0
    );
    server_hardlinks(rig, "fid/packs");
    let manifest = fs::read_dir(rig.mnt("A").join("fid/.packs.packsync/meta"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "manifest"))
        .unwrap();
    let head = fs::read_to_string(manifest).unwrap();
    assert!(head.contains("\nlinkmeta 0\n"), "{head}");
    for dest in [&a, &b] {
        let out = ok(sync(dest, &[]));
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("up to date"),
            "{backend} via {}",
            dest.display()
        );
    }
    fs::write(src.join("d4/f0004.txt"), "v1 changed\n").unwrap();
    let out = ok(sync(&b, &["--json"]));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Every unchanged file is hardlinked, not copied: the other FILES - 1, and
    // only-1.txt (a hardlink pair is linked once, its second name to its first).
    assert_eq!(
        (v["copied"].as_u64(), v["reused"].as_u64()),
        (Some(1), Some(FILES as u64)),
        "{v}"
    );
    victim.assert_untouched();
    eprintln!(
        "netfs {backend}: symlink targets untouched, up to date from both clients, {} reused / {} copied after one change; {}",
        v["reused"], v["copied"],
        head.lines().filter(|l| l.starts_with("granularity") || l.starts_with("hardlinks")).collect::<Vec<_>>().join(", ")
    );
}

#[derive(Default)]
struct Reads {
    whole: AtomicU64,
    torn: AtomicU64,
    through: AtomicU64,
    transient: AtomicU64,
}

fn reader(dest: &Path, paths: &[String], done: &AtomicBool, r: &Reads) {
    let mut i = 0usize;
    while !done.load(Ordering::Relaxed) {
        i += 1;
        // Through DEST: a network filesystem may answer ESTALE/ENOENT mid-swap; counted, not fatal.
        match fs::read(dest.join(&paths[i % paths.len()])) {
            Ok(b) if variant_of(&b).is_some() => r.through.fetch_add(1, Ordering::Relaxed),
            _ => r.transient.fetch_add(1, Ordering::Relaxed),
        };
        // Resolved once: one whole generation. GlusterFS may answer ESTALE or an
        // empty link text mid-swap (as packsync's own readers know): transient.
        let root = match fs::read_link(dest) {
            Ok(t) if !t.as_os_str().is_empty() => dest.parent().unwrap().join(t),
            _ => {
                r.transient.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        let vs: Vec<Option<u32>> = paths
            .iter()
            .map(|p| fs::read(root.join(p)).ok().and_then(|b| variant_of(&b)))
            .collect();
        if vs.iter().all(|v| v.is_some() && *v == vs[0]) {
            r.whole.fetch_add(1, Ordering::Relaxed);
        } else {
            eprintln!("torn read in {}: {vs:?}", root.display());
            r.torn.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn spawn(src: &Path, dest: &Path) -> Child {
    packsync()
        .args(["sync", "-q", "--grace", "0", "--keep", "0"])
        .arg(src)
        .arg(dest)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Two writers on each client, a reader on each, for a few rounds.
fn writers_and_readers(backend: &str, rig: &Rig) {
    let sshfs = backend == "sshfs";
    let f = Fixture::new();
    let sources: Vec<PathBuf> = (0..4).map(|i| f.path(&format!("src{i}"))).collect();
    let (a, b) = (
        rig.mnt("A").join("race/packs"),
        rig.mnt("B").join("race/packs"),
    );
    fs::create_dir_all(a.parent().unwrap()).unwrap();
    variant_tree(&sources[0], 0, FILES, 0);
    ok(packsync()
        .arg("sync")
        .arg(&sources[0])
        .arg(&a)
        .output()
        .unwrap());
    let paths = common_paths(FILES, 0);
    let done = AtomicBool::new(false);
    let (ra, rb) = (Reads::default(), Reads::default());
    let mut syncs = 0;
    thread::scope(|s| {
        s.spawn(|| reader(&a, &paths, &done, &ra));
        s.spawn(|| reader(&b, &paths, &done, &rb));
        for round in 0..ROUNDS {
            for (i, src) in sources.iter().enumerate() {
                variant_tree(src, (1 + round * 4 + i) as u32, FILES, 0);
            }
            let children: Vec<Child> = sources
                .iter()
                .enumerate()
                .map(|(i, src)| spawn(src, if i % 2 == 0 { &a } else { &b }))
                .collect();
            for c in children {
                let out = c.wait_with_output().unwrap();
                syncs += 1;
                if code(&out) != 0 {
                    done.store(true, Ordering::Relaxed);
                }
                assert_eq!(
                    code(&out),
                    0,
                    "{backend} round {round}: {}",
                    super::stderr(&out)
                );
            }
            let via_a = super::one_of(&a, &sources, &|p| view(p, sshfs));
            server_hardlinks(rig, "race/packs");
            // B may show the old link for its cache time (about 1 s on GlusterFS).
            let mut via_b = None;
            for _ in 0..30 {
                via_b = sources
                    .iter()
                    .position(|s| view(s, sshfs) == view(&b, sshfs));
                if via_b == Some(via_a) {
                    break;
                }
                thread::sleep(Duration::from_millis(100));
            }
            assert_eq!(
                via_b,
                Some(via_a),
                "{backend}: both clients show the same tree"
            );
        }
        done.store(true, Ordering::Relaxed);
    });
    ok(packsync()
        .args(["gc", "--grace", "0", "--keep", "0"])
        .arg(&b)
        .output()
        .unwrap());
    let state = rig.mnt("A").join("race/.packs.packsync");
    for sub in ["stage", "trash", "leases"] {
        assert_eq!(
            entries(&state, sub),
            Vec::<String>::new(),
            "{backend}: {sub}/ left behind"
        );
    }
    let n = |r: &Reads| {
        (
            r.whole.load(Ordering::Relaxed),
            r.torn.load(Ordering::Relaxed),
            r.through.load(Ordering::Relaxed),
            r.transient.load(Ordering::Relaxed),
        )
    };
    let (wa, ta, ha, xa) = n(&ra);
    let (wb, tb, hb, xb) = n(&rb);
    eprintln!(
        "netfs {backend}: 4 writers (2 per client) x {ROUNDS} rounds = {syncs} syncs, all exit 0; \
         reader A: {wa} whole-tree reads, {ha} reads through DEST, {xa} transient errors, {ta} torn; \
         reader B: {wb} whole-tree reads, {hb} through DEST, {xb} transient, {tb} torn; no staging left"
    );
    assert_eq!((ta, tb), (0, 0), "{backend}: torn reads");
    assert!(wa + wb > 0, "the readers ran");
}
