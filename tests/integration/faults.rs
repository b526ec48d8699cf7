//! The fault suite: packsync under many writers, kills, full disks and
//! hostile trees. After each fault it checks what a user would: DEST
//! resolves to a complete generation equal to one of the sources, nothing
//! outside DEST and its state directory changed, the next run leaves no
//! staging behind. Each part prints its figures (trials, kills, rounds,
//! reads, torn reads; `--nocapture` shows them). Parts that need root skip
//! with a message when not root; parts that need the crash and pause hooks
//! skip without `--features fault-injection`. CI runs all of it as root.
//! Every loop is bounded by a count, never by a clock.

mod disk;
mod hostile;
mod kills;
pub mod netfs;
mod readers;
mod writers;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

pub use crate::fixture::{code, is_root, ok, packsync, stderr};
use crate::fixture::{mirror, set_mtime, snapshot, write_at};

/// Whether the binary has the crash and pause hooks.
pub fn hooks() -> bool {
    cfg!(feature = "fault-injection")
}

/// Print why a part does not run here, and return true.
pub fn skip(part: &str, need_root: bool, need_hooks: bool) -> bool {
    let why = match (need_root && !is_root(), need_hooks && !hooks()) {
        (true, _) => "needs root",
        (_, true) => "needs --features fault-injection",
        _ => return false,
    };
    crate::fixture::skip(&format!("{part} {why}"))
}

/// A seeded xorshift generator: the same seed replays the same trials.
pub struct Rng(u64);

impl Rng {
    /// From `PACKSYNC_FAULT_SEED` when set, else a fixed seed; printed so a failure can be replayed.
    pub fn new(part: &str) -> Rng {
        let seed = std::env::var("PACKSYNC_FAULT_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x5eed_0003_u64);
        eprintln!("{part}: seed {seed} (PACKSYNC_FAULT_SEED)");
        Rng(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Write `data` at `path` with an mtime that only this variant has (trees
/// written within one clock tick would otherwise pass a size+mtime check).
fn write_variant(path: &Path, data: &[u8], variant: u32) {
    write_at(path, data, 1_600_000_000 + 60 * variant as i64, 0);
}

/// Write (replacing what was there) a source tree in which every file says
/// which variant it belongs to (`v<N> <path>`): `files` small files in
/// seven directories, `big` files of 2 MiB, a symlink, a hardlink, and a
/// file only odd or only even variants have.
pub fn variant_tree(root: &Path, variant: u32, files: usize, big: usize) {
    if root.exists() {
        fs::remove_dir_all(root).unwrap();
    }
    for d in 0..7 {
        fs::create_dir_all(root.join(format!("d{d}"))).unwrap();
    }
    for i in 0..files {
        let rel = format!("d{}/f{i:04}.txt", i % 7);
        write_variant(
            &root.join(&rel),
            format!("v{variant} {rel}\n").as_bytes(),
            variant,
        );
    }
    for j in 0..big {
        let mut data = format!("v{variant} big{j}.bin\n").into_bytes();
        data.resize(2 << 20, b'0' + (variant % 10) as u8);
        write_variant(&root.join(format!("big{j}.bin")), &data, variant);
    }
    write_variant(
        &root.join(format!("only-{}.txt", variant % 2)),
        format!("v{variant} only\n").as_bytes(),
        variant,
    );
    symlink("d0/f0000.txt", root.join("link")).unwrap();
    if files > 0 {
        fs::hard_link(root.join("d0/f0000.txt"), root.join("d1/hardlink")).unwrap();
    }
}

/// The paths every `variant_tree(_, _, files, big)` has, whatever the variant.
pub fn common_paths(files: usize, big: usize) -> Vec<String> {
    let mut v: Vec<String> = (0..files)
        .map(|i| format!("d{}/f{i:04}.txt", i % 7))
        .collect();
    v.extend((0..big).map(|j| format!("big{j}.bin")));
    v.push("link".into());
    if files > 0 {
        v.push("d1/hardlink".into());
    }
    v
}

/// Every entry below `root`, as a reader sees it: path, kind, mode, and a
/// file's content and mtime or a link's target (directories' mtimes are
/// the time the source was written, not part of a variant). Sorted.
pub fn listing(root: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let rd = match fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) => return out.push(format!("{} unreadable: {e}", dir.display())),
        };
        for e in rd {
            let p = match e {
                Ok(e) => e.path(),
                Err(e) => return out.push(format!("{} unreadable: {e}", dir.display())),
            };
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let m = match fs::symlink_metadata(&p) {
                Ok(m) => m,
                Err(e) => {
                    out.push(format!("{rel} unreadable: {e}"));
                    continue;
                }
            };
            let mode = m.permissions().mode() & 0o7777;
            if m.file_type().is_symlink() {
                out.push(format!("{rel} l {:?}", fs::read_link(&p).ok()));
            } else if m.is_dir() {
                out.push(format!("{rel} d {mode:o}"));
                walk(root, &p, out);
            } else {
                let data = fs::read(&p).map(|b| String::from_utf8_lossy(&b).into_owned());
                out.push(format!("{rel} f {mode:o} {} {data:?}", m.mtime()));
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

/// What a reader must see of each variant of `variant_tree(_, v, files,
/// big)`: its `listing`, made (below `dir`) the first time it is asked for.
pub struct Variants {
    dir: PathBuf,
    files: usize,
    big: usize,
    made: std::sync::Mutex<std::collections::HashMap<u32, Vec<String>>>,
}

impl Variants {
    pub fn new(dir: PathBuf, files: usize, big: usize) -> Variants {
        Variants {
            dir,
            files,
            big,
            made: Default::default(),
        }
    }

    pub fn listing(&self, v: u32) -> Vec<String> {
        let mut made = self.made.lock().unwrap();
        made.entry(v)
            .or_insert_with(|| {
                let root = self.dir.join(v.to_string());
                variant_tree(&root, v, self.files, self.big);
                let l = listing(&root);
                fs::remove_dir_all(&root).unwrap();
                l
            })
            .clone()
    }

    /// Whether `root` (a resolved DEST) holds one variant, whole; else a
    /// line saying what is extra and what is missing.
    pub fn whole(&self, root: &Path) -> Result<u32, String> {
        let got = listing(root);
        let v = fs::read(root.join("d0/f0000.txt"))
            .ok()
            .and_then(|b| variant_of(&b));
        let want = v.map(|v| self.listing(v));
        match (v, &want) {
            (Some(v), Some(w)) if *w == got => Ok(v),
            _ => {
                let extra: Vec<_> = got
                    .iter()
                    .filter(|l| want.as_ref().is_none_or(|w| !w.contains(l)))
                    .collect();
                let lost: Vec<_> = want.iter().flatten().filter(|l| !got.contains(l)).collect();
                Err(format!(
                    "torn read in {} (variant {v:?}): extra {extra:?}, missing {lost:?}",
                    root.display()
                ))
            }
        }
    }
}

/// The variant a file's content names (`v<N> ...`).
pub fn variant_of(bytes: &[u8]) -> Option<u32> {
    let rest = bytes.strip_prefix(b"v")?;
    let end = rest.iter().position(|b| *b == b' ')?;
    std::str::from_utf8(&rest[..end]).ok()?.parse().ok()
}

/// Spawn `cmd` stopped at pause point `point` (the `fault-injection` hook);
/// returns once it is there. Creating `resume` lets it go on.
pub fn start_paused(cmd: &mut Command, point: &str, resume: &Path) -> std::process::Child {
    let mut child = cmd
        .env(
            "PACKSYNC_TEST_PAUSE_AT",
            format!("{point}:{}", resume.display()),
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let marker = PathBuf::from(format!("{}.paused", resume.display()));
    // Bounded by a count: the process either reaches the point or exits.
    for _ in 0..6000 {
        if marker.exists() {
            return child;
        }
        if child.try_wait().unwrap().is_some() {
            let out = child.wait_with_output().unwrap();
            panic!("exited ({}) before {point}: {}", code(&out), stderr(&out));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let _ = child.kill();
    panic!("{point} was never reached");
}

/// DEST resolves to a complete generation equal to one of `sources`; its index.
#[track_caller]
pub fn assert_one_of(dest: &Path, sources: &[PathBuf]) -> usize {
    one_of(dest, sources, &mirror)
}

/// `mirror`, but symlinks as made on a volume where their own time and owner
/// cannot be set (FUSE: the manifest's `linkmeta 0`).
pub fn mirror_without_link_meta(root: &Path) -> Vec<String> {
    mirror(root)
        .into_iter()
        .map(|l| match l.split_once("\" l \"") {
            Some(_) => l
                .split(' ')
                .map(|w| {
                    if w.starts_with("mtime=") {
                        "mtime=-"
                    } else if w.starts_with("owner=") {
                        "owner=-"
                    } else {
                        w
                    }
                })
                .collect::<Vec<_>>()
                .join(" "),
            None => l,
        })
        .collect()
}

#[track_caller]
pub fn one_of(dest: &Path, sources: &[PathBuf], mirror: &dyn Fn(&Path) -> Vec<String>) -> usize {
    let link = fs::read_link(dest).unwrap_or_else(|e| panic!("{}: {e}", dest.display()));
    assert!(
        dest.parent().unwrap().join(&link).is_dir(),
        "{} -> {} dangles",
        dest.display(),
        link.display()
    );
    let got = mirror(dest);
    let want: Vec<Vec<String>> = sources.iter().map(|s| mirror(s)).collect();
    want.iter().position(|w| *w == got).unwrap_or_else(|| {
        let diffs: Vec<String> = want
            .iter()
            .zip(sources)
            .map(|(w, s)| {
                let extra: Vec<&String> = got.iter().filter(|l| !w.contains(l)).collect();
                let lacks: Vec<&String> = w.iter().filter(|l| !got.contains(l)).collect();
                format!(
                    "vs {} ({} lines, DEST {}): has {extra:#?}\nlacks {lacks:#?}",
                    s.display(),
                    w.len(),
                    got.len()
                )
            })
            .collect();
        panic!(
            "{} -> {} equals none of the sources:\n{}",
            dest.display(),
            link.display(),
            diffs.join("\n")
        )
    })
}

/// Names in `state/<sub>` (`stage`, `trash`, `leases`, `gen`, `meta`).
pub fn entries(state: &Path, sub: &str) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(state.join(sub))
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// No staging, trash or leases left, and a manifest for every generation.
#[track_caller]
pub fn assert_clean(state: &Path) {
    assert!(state.is_dir(), "no state directory at {}", state.display());
    for sub in ["stage", "trash", "leases"] {
        assert_eq!(
            entries(state, sub),
            Vec::<String>::new(),
            "{sub}/ left behind"
        );
    }
    let gens = entries(state, "gen");
    let manifests: Vec<String> = entries(state, "meta")
        .into_iter()
        .filter_map(|m| m.strip_suffix(".manifest").map(str::to_string))
        .collect();
    assert_eq!(manifests, gens, "one manifest per generation, no orphans");
}

/// A directory outside DEST that packsync must never touch: its listing
/// (types, modes, mtimes, owners, contents, inodes) and its own mtime are
/// compared before and after.
pub struct Victim {
    pub dir: PathBuf,
    before: Vec<String>,
}

impl Victim {
    pub fn new(dir: PathBuf) -> Victim {
        fs::create_dir_all(dir.join("sub")).unwrap();
        fs::write(dir.join("secret"), "victim secret\n").unwrap();
        fs::write(dir.join("sub/file"), "victim file\n").unwrap();
        for p in ["secret", "sub/file", "sub", ""] {
            set_mtime(&dir.join(p), 1_000_000_000, 0);
        }
        let mut v = Victim {
            dir,
            before: Vec::new(),
        };
        v.before = v.now();
        v
    }

    fn now(&self) -> Vec<String> {
        use std::os::unix::fs::MetadataExt;
        let m = fs::symlink_metadata(&self.dir).unwrap();
        let mut v = snapshot(&self.dir, true);
        v.push(format!(
            ". mtime={}.{} mode={:o}",
            m.mtime(),
            m.mtime_nsec(),
            m.mode()
        ));
        v
    }

    #[track_caller]
    pub fn assert_untouched(&self) {
        assert_eq!(
            self.now(),
            self.before,
            "{} was touched",
            self.dir.display()
        );
    }
}
