//! The destination: DEST's parent held open, the state directory beside it,
//! the names inside it, and what DEST currently is. Every operation here is
//! relative to a handle this module holds; nothing is opened by full path
//! below DEST's parent.
//!
//! ```text
//! <parent>/<name>                     -> .<name>.packsync/gen/<GEN>
//! <parent>/.<name>.packsync/gen/      complete generations
//!                          meta/      <GEN>.manifest, <GEN>.retired, <GEN>.used
//!                          stage/     <host>-<pid>-<random>/ one writer's work
//!                          trash/     generations being removed
//!                          leases/    <GEN>.<host>-<pid>-<random> held by `exec`
//! ```
//!
//! The other layouts (see `layout`) reuse this shape: with `--layout fanout`
//! the published name is the data link `DEST/..data` (`..data-<slot>`) and the
//! state directory is `DEST/..packsync` (`..packsync/slots/<slot>`); with
//! `--layout dir` DEST is the live tree itself. Commands other than `sync`
//! open DEST with `layout::find` and ask `live_generation` / `open_live`,
//! which hide the layout.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::config::Layout;
use crate::error;
use crate::manifest::Manifest;
use crate::sys;

pub const SUBDIRS: [&str; 5] = ["gen", "meta", "stage", "trash", "leases"];

pub struct Volume {
    /// The directory holding the published name: DEST's parent (DEST itself with fanout).
    pub parent: OwnedFd,
    pub parent_path: PathBuf,
    /// The published name: DEST's name (the data link `..data[-<slot>]` with fanout).
    pub name: Vec<u8>,
    /// DEST as the user named it, for messages.
    pub display: String,
    pub layout: Layout,
    /// `--slot` (fanout only).
    pub slot: Option<String>,
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

impl Volume {
    /// Open DEST's parent (creating it when `mkpath`).
    pub fn open(dest: &Path, mkpath: bool) -> Result<Volume> {
        let display = dest.display().to_string();
        let name = dest
            .file_name()
            .filter(|n| *n != ".." && *n != ".")
            .with_context(|| {
                error::usage(format!(
                    "{display}: DEST must name an entry inside a directory"
                ))
            })?;
        let name = std::os::unix::ffi::OsStrExt::as_bytes(name).to_vec();
        let parent_path = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        if mkpath {
            std::fs::create_dir_all(&parent_path)
                .with_context(|| format!("cannot create {}", parent_path.display()))?;
        }
        let parent = match sys::open_dir_path(&parent_path) {
            Ok(fd) => fd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
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
        Ok(Volume {
            parent,
            parent_path,
            name,
            display,
            layout: Layout::Symlink,
            slot: None,
        })
    }

    /// The state directory, relative to `parent` (several components with fanout slots).
    pub fn state_name(&self) -> Vec<u8> {
        if self.layout == Layout::Fanout {
            return crate::layout::fanout::state_name(self.slot.as_deref());
        }
        let mut s = b".".to_vec();
        s.extend_from_slice(&self.name);
        s.extend_from_slice(b".packsync");
        s
    }

    /// The directory packsync owns and readers open: DEST.
    pub fn root_path(&self) -> PathBuf {
        match self.layout {
            Layout::Fanout => self.parent_path.clone(),
            _ => self.parent_path.join(sys::os(&self.name)),
        }
    }

    /// The live generation's name, whatever the layout (`None`: nothing published yet).
    pub fn live_generation(&self) -> Result<Option<String>> {
        Ok(match self.inspect()? {
            Dest::Live(g) => Some(g),
            _ => None,
        })
    }

    /// The live generation opened: name, root handle and absolute path, which
    /// always agree even while writers publish (see `layout::open_live`).
    pub fn open_live(&self, state: &State) -> Result<Option<crate::layout::LiveTree>> {
        crate::layout::open_live(self, state)
    }

    /// Generation `gen` opened: `gen/<GEN>`, or DEST itself when it is the
    /// live tree of `--layout dir`.
    pub fn open_generation(&self, state: &State, gen: &str) -> Result<OwnedFd> {
        crate::layout::open_generation(self, state, gen)
    }

    /// The link text that points DEST at `gen` (relative to the parent).
    pub fn link_target(&self, gen: &str) -> Vec<u8> {
        let mut t = self.state_name();
        t.extend_from_slice(b"/gen/");
        t.extend_from_slice(gen.as_bytes());
        t
    }

    pub fn inspect(&self) -> Result<Dest> {
        match self.read_link() {
            Ok(target) => {
                let prefix = self.link_target("");
                match target.strip_prefix(prefix.as_slice()) {
                    Some(g) if valid_gen(g) => {
                        Ok(Dest::Live(String::from_utf8_lossy(g).into_owned()))
                    }
                    _ => Ok(Dest::Foreign(crate::report::escape(&target))),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Dest::Absent),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                let st = sys::stat_at(self.parent.as_fd(), &self.name)
                    .with_context(|| format!("cannot stat {}", self.display))?;
                if sys::kind_of(&st) != sys::StatKind::Dir {
                    return Ok(Dest::File);
                }
                if self.layout == Layout::Dir {
                    if let Some(state) = self.state(false)? {
                        if let Some(g) = crate::layout::dir::gen_of(&state, st.st_ino as u64) {
                            return Ok(Dest::Live(g));
                        }
                    }
                }
                Ok(Dest::Directory)
            }
            Err(e) => Err(e).with_context(|| format!("cannot read {}", self.display)),
        }
    }

    /// DEST's link text. While another client swaps DEST, a network
    /// filesystem may answer ESTALE, an empty text (GlusterFS), or for an
    /// instant ENOENT: each is asked again a few times, with short waits,
    /// before it counts. An empty text is never taken for a foreign link.
    fn read_link(&self) -> std::io::Result<Vec<u8>> {
        let state_top = self.state_name();
        let state_top = state_top.split(|b| *b == b'/').next().unwrap_or_default();
        let mut last = None;
        for wait_ms in [0, 1, 2, 5, 10, 20, 50, 100, 200] {
            std::thread::sleep(std::time::Duration::from_millis(wait_ms));
            match sys::readlink_at(self.parent.as_fd(), &self.name) {
                Ok(t) if t.is_empty() => {
                    last = Some(std::io::Error::other(
                        "its link text reads empty (a network filesystem in the middle of a swap); try again",
                    ))
                }
                Err(e) if e.raw_os_error() == Some(libc::ESTALE) => last = Some(e),
                // Absent for a moment while DEST is swapped on another client?
                Err(e)
                    if e.kind() == std::io::ErrorKind::NotFound
                        && wait_ms < 5
                        && sys::exists_at(self.parent.as_fd(), state_top).unwrap_or(false) =>
                {
                    last = Some(e)
                }
                r => return r,
            }
        }
        Err(last.expect("at least one attempt"))
    }

    /// The state directory, created when `create`; `None` when absent.
    pub fn state(&self, create: bool) -> Result<Option<State>> {
        let sname = self.state_name();
        let path = self.parent_path.join(sys::os(&sname));
        // One component at a time: a fanout slot's state is `..packsync/slots/<slot>`.
        let mut fd = Ok(self.parent.try_clone()?);
        for part in sname.split(|b| *b == b'/') {
            fd = fd.and_then(|dir| {
                if create {
                    sys::ensure_dir_at(dir.as_fd(), part, 0o755)
                } else {
                    sys::open_dir_at(dir.as_fd(), part)
                }
            });
        }
        let fd = match fd {
            Ok(fd) => fd,
            Err(e) if !create && e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "cannot open state directory {} (it must be a real directory)",
                        path.display()
                    )
                })
            }
        };
        let mut subs = Vec::with_capacity(SUBDIRS.len());
        // `..packsync` holds the slots' state too: the unslotted state may not exist in it yet.
        if !create
            && self.layout == Layout::Fanout
            && self.slot.is_none()
            && !sys::exists_at(fd.as_fd(), b"gen")?
        {
            return Ok(None);
        }
        for s in SUBDIRS {
            let r = if create {
                sys::ensure_dir_at(fd.as_fd(), s.as_bytes(), 0o755)
            } else {
                sys::open_dir_at(fd.as_fd(), s.as_bytes())
            };
            // Another writer's first sync is creating it: nothing is published yet.
            if !create
                && r.as_ref()
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
            {
                return Ok(None);
            }
            subs.push(r.with_context(|| format!("cannot open {}/{s}", path.display()))?);
        }
        let mut it = subs.into_iter();
        let mut next = || it.next().unwrap();
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
    pub fd: OwnedFd,
    pub gen: OwnedFd,
    pub meta: OwnedFd,
    pub stage: OwnedFd,
    pub trash: OwnedFd,
    pub leases: OwnedFd,
    pub path: PathBuf,
}

impl State {
    pub fn open_gen(&self, gen: &str) -> Result<OwnedFd> {
        sys::open_dir_at(self.gen.as_fd(), gen.as_bytes())
            .with_context(|| format!("cannot open generation {}/gen/{gen}", self.path.display()))
    }

    pub fn read_manifest(&self, gen: &str) -> Result<Manifest> {
        let (mut r, shown) = self.manifest_reader(gen)?;
        Manifest::read(&mut r).with_context(|| format!("bad manifest {shown}"))
    }

    /// A buffered reader over `meta/<GEN>.manifest`, and its path for messages.
    pub fn manifest_reader(
        &self,
        gen: &str,
    ) -> Result<(std::io::BufReader<std::fs::File>, String)> {
        let name = format!("{gen}.manifest");
        let shown = format!("{}/meta/{name}", self.path.display());
        let fd = sys::open_read_at(self.meta.as_fd(), name.as_bytes())
            .with_context(|| format!("cannot open manifest {shown}"))?;
        Ok((
            std::io::BufReader::with_capacity(256 * 1024, std::fs::File::from(fd)),
            shown,
        ))
    }

    /// Generations present in `gen/`, sorted by name.
    pub fn generations(&self) -> Result<Vec<String>> {
        let mut out: Vec<String> = sys::list_dir(self.gen.as_fd())
            .with_context(|| format!("cannot list {}/gen", self.path.display()))?
            .into_iter()
            .filter(|l| valid_gen(&l.name))
            .map(|l| String::from_utf8_lossy(&l.name).into_owned())
            .collect();
        out.sort();
        Ok(out)
    }

    /// Record now as the time `gen` stopped being live (or was last reused).
    pub fn stamp(&self, gen: &str, what: &str) -> Result<()> {
        let name = format!("{gen}.{what}");
        match sys::create_excl_at(self.meta.as_fd(), name.as_bytes()) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                // Through a handle: by name, FUSE would follow a symlink planted here.
                let touched =
                    sys::open_read_at(self.meta.as_fd(), name.as_bytes()).and_then(|fd| {
                        if sys::kind_of(&sys::fstat(fd.as_fd())?) != sys::StatKind::File {
                            return Err(std::io::Error::from_raw_os_error(libc::ELOOP));
                        }
                        sys::touch_fd(fd.as_fd())
                    });
                match touched {
                    Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                        // Not a stamp packsync made: replace it, never follow it.
                        let _ = sys::unlink_at(self.meta.as_fd(), name.as_bytes());
                        sys::create_excl_at(self.meta.as_fd(), name.as_bytes()).map(drop)
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
        let boot = std::fs::read("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let pidns = std::fs::read_link("/proc/self/ns/pid").unwrap_or_default();
        if boot.is_empty() && pidns.as_os_str().is_empty() {
            return host;
        }
        let mut h = <sha2::Sha256 as sha2::Digest>::new();
        sha2::Digest::update(&mut h, &boot);
        sha2::Digest::update(&mut h, pidns.as_os_str().as_encoded_bytes());
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
