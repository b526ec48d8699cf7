//! The destination: the directory that holds the published name, the state
//! directory beside it, the names inside it, and what DEST currently is.
//! Every operation here goes through a `sys::DirFd` this module holds;
//! nothing is opened by full path below DEST's parent.
//!
//! ```text
//! <parent>/<name>                     -> .<name>.packsync/gen/<GEN>
//! <parent>/.<name>.packsync/gen/      complete generations
//!                          meta/      <GEN>.manifest, <GEN>.retired, <GEN>.used, <GEN>.damaged
//!                          stage/     <host>-<pid>-<random>/ one writer's work
//!                          trash/     generations being removed
//!                          leases/    <GEN>.<host>-<pid>-<random> held by `exec`
//! ```
//!
//! This module knows no layout: a layout driver (`layout`) decides where the
//! published name and the state directory are (`Volume::inside_dest` for a
//! name inside DEST, as fanout's data link) and what DEST's state means;
//! here it is only read (`read_dest`) and opened (`state`). The layout is
//! carried as a tag for `layout::of`.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, Result};

use crate::clock;
use crate::config::Layout;
use crate::error;
use crate::manifest::Manifest;
use crate::sys::{self, DirFd};

/// How many hex digits of its manifest's digest name a generation.
pub const GEN_LEN: usize = 16;

pub const SUBDIRS: [&str; 5] = ["gen", "meta", "stage", "trash", "leases"];

pub struct Volume {
    /// The directory holding the published name: DEST's parent (DEST itself
    /// with fanout). Empty until it exists: a fanout DEST that the first sync
    /// creates only when it is about to stage (see `state`).
    dir: OnceLock<DirFd>,
    /// Where to make `dir` when it is missing: the nearest directory that
    /// exists, and the relative path below it (one name, or several with
    /// `--mkpath`).
    make: Option<(DirFd, Vec<u8>)>,
    /// The path of `dir`, for messages.
    pub parent_path: PathBuf,
    /// The published name inside `dir`: DEST's name (the data link with fanout).
    pub name: Vec<u8>,
    /// DEST as the user named it, for messages.
    pub display: String,
    /// Which driver publishes here (see `layout::of`).
    pub layout: Layout,
    /// `--slot` (fanout only).
    pub slot: Option<String>,
    /// The state directory, relative to `dir` (several components with fanout slots).
    state_name: Vec<u8>,
}

/// What DEST is right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dest {
    Absent,
    /// A packsync link to this generation.
    Live(String),
    /// A real directory (left by `cp -aR`): taken over by the first sync.
    Directory,
    /// A regular file or other non-directory.
    File,
    /// A symlink packsync did not make; its target.
    Foreign(String),
}

fn not_yet(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{what} does not exist yet"),
    )
}

impl Volume {
    /// Open DEST's parent, in the default shape: DEST is the published name
    /// and `.<name>.packsync` the state directory. With `mkpath` a missing
    /// parent is made by the first `state(true)`, once every refusal has
    /// passed; until then it reads as empty.
    pub fn open(dest: &Path, mkpath: bool) -> Result<Volume> {
        let (name, parent_path) = split(dest)?;
        let parent = match DirFd::open_path(&parent_path) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound && mkpath => {
                let make = anchor_of(&parent_path)?;
                let mut vol = Volume::at(dest, None, parent_path, name);
                vol.make = Some(make);
                return Ok(vol);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(error::usage(format!(
                    "{}: parent directory does not exist (use --mkpath to create it)",
                    parent_path.display()
                )))
            }
            Err(e) => {
                return Err(e).with_context(|| {
                    format!("cannot open parent directory {}", parent_path.display())
                })
            }
        };
        Ok(Volume::at(dest, Some(parent), parent_path, name))
    }

    /// As `open`, for commands that only read: `None` when DEST's parent is
    /// missing or not a directory.
    pub fn find(dest: &Path) -> Result<Option<Volume>> {
        let (name, parent_path) = split(dest)?;
        match DirFd::open_path(&parent_path) {
            Ok(parent) => Ok(Some(Volume::at(dest, Some(parent), parent_path, name))),
            Err(e) if e.kind() == io::ErrorKind::NotFound || sys::is_not_dir(&e) => Ok(None),
            Err(e) => Err(e)
                .with_context(|| format!("cannot open parent directory {}", parent_path.display())),
        }
    }

    fn at(dest: &Path, parent: Option<DirFd>, parent_path: PathBuf, name: Vec<u8>) -> Volume {
        let mut state_name = b".".to_vec();
        state_name.extend_from_slice(&name);
        state_name.extend_from_slice(b".packsync");
        let dir = OnceLock::new();
        if let Some(parent) = parent {
            let _ = dir.set(parent);
        }
        Volume {
            dir,
            make: None,
            parent_path,
            name,
            display: dest.display().to_string(),
            layout: Layout::Symlink,
            slot: None,
            state_name,
        }
    }

    /// The same place, published by `layout`'s driver.
    pub fn with_layout(mut self, layout: Layout) -> Volume {
        self.layout = layout;
        self
    }

    /// DEST itself holds the published name `name` and the state directory
    /// `state_name` (fanout). A DEST that does not exist yet is made by the
    /// first `state(true)`; until then it reads as empty. Fails with
    /// ELOOP/ENOTDIR when DEST is a symlink or a file.
    pub fn inside_dest(
        self,
        name: Vec<u8>,
        state_name: Vec<u8>,
        layout: Layout,
        slot: Option<&str>,
    ) -> io::Result<Volume> {
        let dest_path = self.parent_path.join(sys::os(&self.name));
        let dir = OnceLock::new();
        let mut make = None;
        match (self.dir.into_inner(), self.make) {
            (Some(outer), _) => match outer.open_dir(&self.name) {
                Ok(fd) => {
                    let _ = dir.set(fd);
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => make = Some((outer, self.name)),
                Err(e) => return Err(e),
            },
            // `--mkpath`: DEST's parent is to be made too.
            (None, Some((anchor, mut rest))) => {
                rest.push(b'/');
                rest.extend_from_slice(&self.name);
                make = Some((anchor, rest));
            }
            (None, None) => return Err(not_yet(&self.display)),
        }
        Ok(Volume {
            dir,
            make,
            parent_path: dest_path,
            name,
            display: self.display,
            layout,
            slot: slot.map(str::to_string),
            state_name,
        })
    }

    /// The directory holding the published name; NotFound while a DEST that
    /// the first sync creates is not there yet.
    pub fn parent(&self) -> io::Result<&DirFd> {
        self.dir.get().ok_or_else(|| not_yet(&self.display))
    }

    /// What kind of filesystem DEST is on (that of the nearest directory
    /// that exists, for a DEST the sync is to make); `None` where fstatfs fails.
    pub fn fs_kind(&self) -> Option<crate::sys::FsKind> {
        let dir = self
            .dir
            .get()
            .or(self.make.as_ref().map(|(outer, _)| outer))?;
        dir.fs_kind().ok()
    }

    /// `parent`, made first when this sync is the one to create it.
    fn make_parent(&self) -> Result<&DirFd> {
        if let Some(d) = self.dir.get() {
            return Ok(d);
        }
        let (outer, name) = self.make.as_ref().ok_or_else(|| not_yet(&self.display))?;
        let fd = outer
            .ensure_path(name, 0o755)
            .with_context(|| format!("cannot create {}", self.parent_path.display()))?;
        let _ = self.dir.set(fd);
        Ok(self.dir.get().expect("just set"))
    }

    /// Remove again, deepest first, the directories `make_parent` made for
    /// DEST (its parents with `--mkpath`, a fanout DEST), for a sync that
    /// made them and then stopped before staging: a refused sync leaves the
    /// volume as it found it. Only empty directories go (rmdir), so nothing
    /// another writer put there meanwhile is touched.
    pub fn unmake_parent(&self) {
        let (Some((outer, rel)), Some(_)) = (&self.make, self.dir.get()) else {
            return;
        };
        let parts: Vec<&[u8]> = rel
            .split(|b| *b == b'/')
            .filter(|p| !p.is_empty())
            .collect();
        for depth in (0..parts.len()).rev() {
            let above = parts[..depth].join(&b'/');
            let dir = if above.is_empty() {
                outer.try_clone()
            } else {
                outer.open_beneath(&above)
            };
            if dir.and_then(|d| d.rmdir(parts[depth])).is_err() {
                return;
            }
        }
    }

    /// The state directory, relative to `parent` (several components with fanout slots).
    pub fn state_name(&self) -> Vec<u8> {
        self.state_name.clone()
    }

    /// The link text that points DEST at `gen` (relative to the parent).
    pub fn link_target(&self, gen: &str) -> Vec<u8> {
        let mut t = self.state_name.clone();
        t.extend_from_slice(b"/gen/");
        t.extend_from_slice(gen.as_bytes());
        t
    }

    /// What the published name is, read as a link. A real directory there
    /// is `Directory` whatever it holds: only a layout driver knows whether
    /// it is a live tree (`layout::inspect` asks it).
    pub fn read_dest(&self) -> Result<Dest> {
        match self.read_link() {
            Ok(target) => {
                let prefix = self.link_target("");
                match target.strip_prefix(prefix.as_slice()) {
                    Some(g) if valid_gen(g) => {
                        Ok(Dest::Live(String::from_utf8_lossy(g).into_owned()))
                    }
                    _ => Ok(Dest::Foreign(crate::escape::c_style(&target))),
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Dest::Absent),
            Err(e) if sys::is_not_symlink(&e) => {
                let st = self
                    .parent()?
                    .stat(&self.name)
                    .with_context(|| format!("cannot stat {}", self.display))?;
                Ok(match sys::kind_of(&st) {
                    sys::StatKind::Dir => Dest::Directory,
                    _ => Dest::File,
                })
            }
            Err(e) => Err(e).with_context(|| format!("cannot read {}", self.display)),
        }
    }

    /// DEST's link text. While another client swaps DEST, a network
    /// filesystem may answer ESTALE, an empty text (GlusterFS), or for an
    /// instant ENOENT: each is asked again a few times, with short waits,
    /// before it counts. An empty text is never taken for a foreign link.
    fn read_link(&self) -> io::Result<Vec<u8>> {
        use std::ops::ControlFlow::{Break, Continue};
        let dir = self.parent()?;
        let state_top = self
            .state_name
            .split(|b| *b == b'/')
            .next()
            .unwrap_or_default();
        clock::retry(clock::BRIEF, |i| {
            match dir.readlink(&self.name) {
            Ok(t) if t.is_empty() => Continue(io::Error::other(
                "its link text reads empty (a network filesystem in the middle of a swap); try again",
            )),
            Err(e) if sys::is_stale(&e) => Continue(e),
            // Absent for a moment while DEST is swapped on another client?
            Err(e)
                if e.kind() == io::ErrorKind::NotFound
                    && clock::BRIEF[i] < 5
                    && dir.exists(state_top).unwrap_or(false) =>
            {
                Continue(e)
            }
            r => Break(r),
        }
        })?
    }

    /// The state directory, created when `create` (and with it DEST, when
    /// this sync is the one to make it); `None` when absent.
    pub fn state(&self, create: bool) -> Result<Option<State>> {
        let path = self.parent_path.join(sys::os(&self.state_name));
        // Several components for a fanout slot: `..packsync/slots/<slot>`.
        let opened = if create {
            self.make_parent()?.ensure_path(&self.state_name, 0o755)
        } else {
            self.parent().and_then(|d| d.open_beneath(&self.state_name))
        };
        let fd = match opened {
            Ok(fd) => fd,
            Err(e) if !create && e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                // Say what this process may not do, and where.
                let exists = self
                    .parent()
                    .is_ok_and(|d| d.exists(&self.state_name).unwrap_or(false));
                let (verb, need) = match (create, exists) {
                    (true, false) => (
                        "create",
                        format!(
                            "write and search permission on {}, DEST's parent",
                            self.parent_path.display()
                        ),
                    ),
                    (true, true) => ("open", "read, write and search permission on it".into()),
                    (false, _) => ("open", "read and search permission on it".into()),
                };
                return Err(anyhow::anyhow!(
                    "cannot {verb} state directory {}: permission denied (uid {} needs {need})",
                    path.display(),
                    sys::euid()
                ));
            }
            Err(e) if sys::is_not_dir(&e) => {
                return Err(e).with_context(|| {
                    format!(
                        "cannot open state directory {} (it must be a real directory, not a symlink or a file)",
                        path.display()
                    )
                })
            }
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("cannot open state directory {}", path.display()))
            }
        };
        let mut subs = Vec::with_capacity(SUBDIRS.len());
        for s in SUBDIRS {
            let r = if create {
                fd.ensure_dir(s.as_bytes(), 0o755)
            } else {
                fd.open_dir(s.as_bytes())
            };
            // Another writer's first sync is creating it (or, in fanout's
            // `..packsync`, only slots have state yet): nothing is published.
            if !create
                && r.as_ref()
                    .is_err_and(|e| e.kind() == io::ErrorKind::NotFound)
            {
                return Ok(None);
            }
            subs.push(r.with_context(|| format!("cannot open {}/{s}", path.display()))?);
        }
        let mut it = subs.into_iter();
        let mut next = || it.next().expect("one handle per subdirectory");
        Ok(Some(State {
            gen: next(),
            meta: next(),
            stage: next(),
            trash: next(),
            leases: next(),
            fd,
            path,
        }))
    }
}

/// DEST's name and its parent's path.
fn split(dest: &Path) -> Result<(Vec<u8>, PathBuf)> {
    let display = dest.display();
    let name = dest
        .file_name()
        .filter(|n| *n != ".." && *n != ".")
        .with_context(|| {
            error::usage(format!(
                "{display}: DEST must name an entry inside a directory"
            ))
        })?;
    let parent_path = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((name.as_encoded_bytes().to_vec(), parent_path))
}

/// `--mkpath`: the nearest ancestor of `path` that exists (opened as the
/// user named it, the one place a symlink is followed) and the path of the
/// missing rest below it, which `ensure_path` makes without following a
/// symlink. Nothing is created here.
fn anchor_of(path: &Path) -> Result<(DirFd, Vec<u8>)> {
    let failed = || format!("cannot create {}", path.display());
    let mut base = path;
    let mut missing = Vec::new();
    let anchor = loop {
        match DirFd::open_path(base) {
            Ok(fd) => break fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(failed),
        }
        match (base.parent(), base.file_name()) {
            (Some(up), Some(name)) => {
                missing.push(name);
                base = if up.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    up
                };
            }
            // `..` or `/` that does not open: nothing left to climb.
            _ => return Err(io::Error::from(io::ErrorKind::NotFound)).with_context(failed),
        }
    };
    let rest: Vec<&[u8]> = missing.iter().rev().map(|n| n.as_encoded_bytes()).collect();
    Ok((anchor, rest.join(&b'/')))
}

/// A generation name: what packsync writes, nothing that walks elsewhere.
pub fn valid_gen(g: &[u8]) -> bool {
    !g.is_empty()
        && g.len() <= 64
        && g[0] != b'.'
        && g.iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(b))
}

/// The state directory, its subdirectories held open.
pub struct State {
    pub fd: DirFd,
    pub gen: DirFd,
    pub meta: DirFd,
    pub stage: DirFd,
    pub trash: DirFd,
    pub leases: DirFd,
    pub path: PathBuf,
}

impl State {
    pub fn open_gen(&self, gen: &str) -> Result<DirFd> {
        self.gen
            .open_dir(gen.as_bytes())
            .with_context(|| format!("cannot open generation {}/gen/{gen}", self.path.display()))
    }

    pub fn read_manifest(&self, gen: &str) -> Result<Manifest> {
        let (mut r, shown) = self.manifest_reader(gen)?;
        Manifest::read_checked(&mut r).with_context(|| format!("bad manifest {shown}"))
    }

    /// The header of `meta/<GEN>.manifest`, once the whole manifest is
    /// found to match its digest, as `read_manifest` checks it but a line
    /// at a time (`Manifest::digest_matches`), holding no tree; where that
    /// check fails, `read_manifest` reads it whole and says why.
    pub fn checked_header(&self, gen: &str) -> Result<Manifest> {
        let (mut r, _) = self.manifest_reader(gen)?;
        if let Ok(header) = Manifest::read_header(&mut r) {
            if header.digest_matches(&mut r) {
                return Ok(header);
            }
        }
        let mut m = self.read_manifest(gen)?;
        m.tree = Default::default();
        Ok(m)
    }

    /// A buffered reader over `meta/<GEN>.manifest`, and its path for messages.
    /// The `std::fs::File` only reads the descriptor `sys` opened through the
    /// `meta/` handle (no symlink followed): no path reaches std.
    pub fn manifest_reader(&self, gen: &str) -> Result<(io::BufReader<std::fs::File>, String)> {
        let name = format!("{gen}.manifest");
        let shown = format!("{}/meta/{name}", self.path.display());
        let fd = self
            .meta
            .open_read(name.as_bytes())
            .with_context(|| format!("cannot open manifest {shown}"))?;
        Ok((
            io::BufReader::with_capacity(256 * 1024, std::fs::File::from(fd)),
            shown,
        ))
    }

    /// Generations present in `gen/`, sorted by name.
    pub fn generations(&self) -> Result<Vec<String>> {
        let mut out: Vec<String> = self
            .gen
            .list()
            .with_context(|| format!("cannot list {}/gen", self.path.display()))?
            .into_iter()
            .filter(|l| valid_gen(&l.name))
            .map(|l| String::from_utf8_lossy(&l.name).into_owned())
            .collect();
        out.sort();
        Ok(out)
    }

    /// Record now as the time `gen` stopped being live (or was last reused).
    /// Write `meta/GEN.WHAT` holding `text` (a few bytes: what the sync
    /// that made the generation fetched), replacing any, by a rename.
    pub fn note(&self, gen: &str, what: &str, text: &str) -> Result<()> {
        let name = format!("{gen}.{what}");
        let tmp = format!("{name}-{}", unique_name());
        let fd = self.meta.create_excl(tmp.as_bytes())?;
        let written = sys::write_all(fd.as_fd(), text.as_bytes())
            .map_err(anyhow::Error::from)
            .and_then(|_| {
                self.meta
                    .rename(tmp.as_bytes(), &self.meta, name.as_bytes())
                    .map_err(anyhow::Error::from)
            });
        if written.is_err() {
            let _ = self.meta.unlink(tmp.as_bytes());
        }
        written
    }

    /// `meta/GEN.fetched`: the bytes the sync that made `gen` fetched and
    /// the bytes it took from the live generation instead; `None` where
    /// nothing is recorded (no remote source) or the record is malformed.
    pub fn fetched(&self, gen: &str) -> Option<(u64, u64)> {
        let fd = self
            .meta
            .open_read(format!("{gen}.fetched").as_bytes())
            .ok()?;
        if sys::fstat(fd.as_fd()).ok()?.st_size > 64 {
            return None;
        }
        let text = read_to_string(fd.as_fd()).ok()?;
        let (a, b) = text.trim_end().split_once(' ')?;
        Some((a.parse().ok()?, b.parse().ok()?))
    }

    pub fn stamp(&self, gen: &str, what: &str) -> Result<()> {
        let name = format!("{gen}.{what}");
        let meta = &self.meta;
        match meta.create_excl(name.as_bytes()) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                // Through a handle: by name, FUSE would follow a symlink planted here.
                let touched = meta.open_read(name.as_bytes()).and_then(|fd| {
                    if sys::kind_of(&sys::fstat(fd.as_fd())?) != sys::StatKind::File {
                        return Err(sys::symlink_refused());
                    }
                    sys::touch_fd(fd.as_fd())
                });
                match touched {
                    Err(e) if sys::is_not_dir(&e) => {
                        // Not a stamp packsync made: replace it, never follow it.
                        let _ = meta.unlink(name.as_bytes());
                        meta.create_excl(name.as_bytes()).map(drop)
                    }
                    r => r,
                }
                .with_context(|| format!("cannot update {}/meta/{name}", self.path.display()))
            }
            Err(e) => {
                Err(e).with_context(|| format!("cannot create {}/meta/{name}", self.path.display()))
            }
        }
    }
}

pub fn read_to_string(fd: BorrowedFd<'_>) -> Result<String> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = sys::read(fd, &mut buf)?;
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8(out).map_err(|_| anyhow::anyhow!("not UTF-8"))
}

/// This host's name as used in staging and lease names (no `-`, no `/`).
///
/// Pods with `hostNetwork` share the node's hostname but not its pids, so
/// the name carries a digest of the boot id and the pid namespace: two
/// writers with the same tag can see each other's pids.
pub fn host_tag() -> String {
    static TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TAG.get_or_init(|| {
        let host: String = sys::hostname()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let (boot, pidns) = sys::host_identity();
        if boot.is_empty() && pidns.is_empty() {
            return host;
        }
        let mut h = <sha2::Sha256 as sha2::Digest>::new();
        sha2::Digest::update(&mut h, &boot);
        sha2::Digest::update(&mut h, &pidns);
        let d = sha2::Digest::finalize(h);
        format!("{host}_{:02x}{:02x}{:02x}{:02x}", d[0], d[1], d[2], d[3])
    })
    .clone()
}

/// `<host>-<pid>-<random>`: unique to this process, and says who made it.
pub fn unique_name() -> String {
    format!("{}-{}-{:016x}", host_tag(), sys::pid(), sys::random_u64())
}

/// Parse `<host>-<pid>-<random>` into (host, pid).
pub fn stage_owner(name: &str) -> Option<(&str, u32)> {
    let (rest, rand) = name.rsplit_once('-')?;
    let (host, pid) = rest.rsplit_once('-')?;
    if rand.len() != 16 {
        return None;
    }
    Some((host, pid.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_names_cannot_walk_out() {
        assert!(valid_gen(b"0123abcd0123abcd"));
        for bad in [&b""[..], b"..", b".hidden", b"a/b", b"../etc", b"a\nb"] {
            assert!(!valid_gen(bad), "{bad:?}");
        }
    }

    #[test]
    fn stage_names_parse_with_dashes_in_the_host() {
        assert_eq!(
            stage_owner("node_a-17-0123456789abcdef"),
            Some(("node_a", 17))
        );
        assert_eq!(stage_owner(&unique_name()).map(|o| o.1), Some(sys::pid()));
        assert_eq!(stage_owner("junk"), None);
    }
}
