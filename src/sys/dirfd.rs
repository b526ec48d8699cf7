//! `DirFd`: a directory handle, and the one way to touch anything inside
//! the volume (and inside a source).
//!
//! Every method takes one name component: not empty, no `/`, not `.` or
//! `..`, no NUL. A name that is not one component is refused with `EINVAL`
//! before the kernel sees it, so no method can walk out of the directory or
//! through a symlink in a middle component. The last component is never
//! followed either: directories are opened `O_NOFOLLOW | O_DIRECTORY`, files
//! `O_NOFOLLOW`, metadata is set through descriptors or with
//! `AT_SYMLINK_NOFOLLOW`. A relative path of several components is opened
//! with `open_beneath`: `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`
//! where the kernel has it, else one component at a time.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::Path;

use rustix::fs::{self as rfs, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use super::{Listed, Stat};

/// An open directory. Cheap to borrow across threads (`&DirFd` is `Sync`).
#[derive(Debug)]
pub struct DirFd(OwnedFd);

/// `name` as one path component, or `EINVAL`.
pub fn component(name: &[u8]) -> io::Result<&[u8]> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0)
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{:?} is not a single name inside a directory",
                String::from_utf8_lossy(name)
            ),
        ));
    }
    Ok(name)
}

impl DirFd {
    /// Open a directory the user named on the command line (a SOURCE root,
    /// DEST's parent): the only open that follows symlinks.
    pub fn open_path(path: &Path) -> io::Result<DirFd> {
        super::open_dir_path(path).map(DirFd)
    }

    /// Take over a descriptor known to be a directory.
    pub fn from_owned(fd: OwnedFd) -> DirFd {
        DirFd(fd)
    }

    pub fn into_owned(self) -> OwnedFd {
        self.0
    }

    pub fn try_clone(&self) -> io::Result<DirFd> {
        Ok(DirFd(self.0.try_clone()?))
    }

    /// A fresh handle on the same directory, with its own listing offset.
    pub fn reopen(&self) -> io::Result<DirFd> {
        super::open_dir_at(self.0.as_fd(), b".").map(DirFd)
    }

    /// The directory `name`; a symlink there is refused (ELOOP/ENOTDIR).
    pub fn open_dir(&self, name: &[u8]) -> io::Result<DirFd> {
        super::open_dir_at(self.0.as_fd(), component(name)?).map(DirFd)
    }

    /// The directory at relative `path` (components separated by `/`),
    /// never leaving this directory and never following a symlink. An empty
    /// path (or `.`) is this directory, reopened.
    pub fn open_beneath(&self, path: &[u8]) -> io::Result<DirFd> {
        let parts: Vec<&[u8]> = path
            .split(|b| *b == b'/')
            .filter(|p| !p.is_empty() && *p != b".")
            .collect();
        if parts.is_empty() {
            return self.reopen();
        }
        for p in &parts {
            component(p)?;
        }
        if parts.len() > 1 && openat2_works() {
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS;
            match rfs::openat2(self.0.as_fd(), path, flags, Mode::empty(), resolve) {
                Ok(fd) => return Ok(DirFd(fd)),
                // Seccomp filters in some container runtimes answer ENOSYS or EPERM.
                Err(Errno::NOSYS | Errno::PERM) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let mut dir = self.open_dir(parts[0])?;
        for p in &parts[1..] {
            dir = dir.open_dir(p)?;
        }
        Ok(dir)
    }

    /// A regular file for reading; a symlink is refused.
    pub fn open_read(&self, name: &[u8]) -> io::Result<OwnedFd> {
        super::open_read_at(self.0.as_fd(), component(name)?)
    }

    /// A new file, private (0600) until its content is written.
    pub fn create_excl(&self, name: &[u8]) -> io::Result<OwnedFd> {
        super::create_excl_at(self.0.as_fd(), component(name)?)
    }

    /// An empty regular file, made without opening it (see `make_file_at`).
    pub fn make_file(&self, name: &[u8]) -> io::Result<()> {
        super::make_file_at(self.0.as_fd(), component(name)?)
    }

    /// `name`'s metadata, not following a symlink.
    pub fn stat(&self, name: &[u8]) -> io::Result<Stat> {
        super::stat_at(self.0.as_fd(), component(name)?)
    }

    /// `name`'s extended attributes (`system.*` aside), not following a symlink.
    pub fn xattrs(&self, name: &[u8]) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        super::xattrs_at(self.0.as_fd(), component(name)?)
    }

    /// This directory's own extended attributes.
    pub fn xattrs_self(&self) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        super::xattrs_fd(self.0.as_fd())
    }

    /// This directory's own metadata.
    pub fn fstat(&self) -> io::Result<Stat> {
        super::fstat(self.0.as_fd())
    }

    /// Whether `name` exists (without following it).
    pub fn exists(&self, name: &[u8]) -> io::Result<bool> {
        super::exists_at(self.0.as_fd(), component(name)?)
    }

    /// Every entry but `.` and `..`, from the start.
    pub fn list(&self) -> io::Result<Vec<Listed>> {
        super::list_dir(self.0.as_fd())
    }

    pub fn readlink(&self, name: &[u8]) -> io::Result<Vec<u8>> {
        super::readlink_at(self.0.as_fd(), component(name)?)
    }

    pub fn mkdir(&self, name: &[u8], mode: u32) -> io::Result<()> {
        super::mkdir_at(self.0.as_fd(), component(name)?, mode)
    }

    /// `mkdir` that accepts an existing directory (not a symlink or a file).
    pub fn ensure_dir(&self, name: &[u8], mode: u32) -> io::Result<DirFd> {
        super::ensure_dir_at(self.0.as_fd(), component(name)?, mode).map(DirFd)
    }

    /// `mkdir -p` of a relative path, one component at a time, never
    /// following a symlink: `--mkpath` below a directory the user named.
    pub fn ensure_path(&self, path: &[u8], mode: u32) -> io::Result<DirFd> {
        let mut dir = self.reopen()?;
        for p in path
            .split(|b| *b == b'/')
            .filter(|p| !p.is_empty() && *p != b".")
        {
            dir = dir.ensure_dir(p, mode)?;
        }
        Ok(dir)
    }

    /// A symlink `name` holding `target` (any text: it is never followed here).
    pub fn symlink(&self, target: &[u8], name: &[u8]) -> io::Result<()> {
        super::symlink_at(target, self.0.as_fd(), component(name)?)
    }

    /// Hard link `from` (here) as `to` in `to_dir`, not following a symlink.
    pub fn link(&self, from: &[u8], to_dir: &DirFd, to: &[u8]) -> io::Result<()> {
        super::link_at(
            self.0.as_fd(),
            component(from)?,
            to_dir.0.as_fd(),
            component(to)?,
        )
    }

    pub fn unlink(&self, name: &[u8]) -> io::Result<()> {
        super::unlink_at(self.0.as_fd(), component(name)?)
    }

    pub fn rmdir(&self, name: &[u8]) -> io::Result<()> {
        super::rmdir_at(self.0.as_fd(), component(name)?)
    }

    pub fn rename(&self, from: &[u8], to_dir: &DirFd, to: &[u8]) -> io::Result<()> {
        super::rename_dir_at(
            self.0.as_fd(),
            component(from)?,
            to_dir.0.as_fd(),
            component(to)?,
        )
    }

    /// Swap two names atomically; `Unsupported` where the filesystem lacks it.
    pub fn rename_exchange(&self, a: &[u8], b_dir: &DirFd, b: &[u8]) -> io::Result<()> {
        super::rename_exchange(
            self.0.as_fd(),
            component(a)?,
            b_dir.0.as_fd(),
            component(b)?,
        )
    }

    /// Rename onto a name that must not exist (`AlreadyExists` if it does).
    pub fn rename_noreplace(&self, from: &[u8], to_dir: &DirFd, to: &[u8]) -> io::Result<()> {
        super::rename_noreplace(
            self.0.as_fd(),
            component(from)?,
            to_dir.0.as_fd(),
            component(to)?,
        )
    }

    /// Remove `name` and everything below it (see `remove_tree_at`).
    pub fn remove_tree(&self, name: &[u8]) -> io::Result<bool> {
        super::remove_tree_at(self.0.as_fd(), component(name)?)
    }

    /// Owner and times of the symlink `name`.
    pub fn set_symlink_meta(
        &self,
        name: &[u8],
        owner: Option<(u32, u32)>,
        mtime: (i64, u32),
    ) -> io::Result<()> {
        super::set_symlink_meta(self.0.as_fd(), component(name)?, owner, mtime)
    }

    /// Set `name`'s mtime to now (the server's clock on a network filesystem).
    pub fn touch(&self, name: &[u8]) -> io::Result<()> {
        super::touch_at(self.0.as_fd(), component(name)?)
    }

    /// Set this directory's own mtime to now.
    pub fn touch_self(&self) -> io::Result<()> {
        super::touch_fd(self.0.as_fd())
    }

    pub fn fsync(&self) -> io::Result<()> {
        super::fsync(self.0.as_fd())
    }

    pub fn syncfs(&self) -> io::Result<()> {
        super::syncfs(self.0.as_fd())
    }

    pub fn fs_kind(&self) -> io::Result<super::FsKind> {
        super::fs_kind(self.0.as_fd())
    }
}

impl AsFd for DirFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl AsRawFd for DirFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl From<DirFd> for OwnedFd {
    fn from(d: DirFd) -> OwnedFd {
        d.0
    }
}

/// openat2 exists on Linux 5.6 and later; asked once.
fn openat2_works() -> bool {
    static WORKS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WORKS.get_or_init(|| {
        let root = match rfs::open(".", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()) {
            Ok(fd) => fd,
            Err(_) => return false,
        };
        !matches!(
            rfs::openat2(
                &root,
                ".",
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
                ResolveFlags::BENEATH,
            ),
            Err(Errno::NOSYS | Errno::PERM)
        )
    })
}

/// For the volume and the operator commands.
impl DirFd {
    /// The absolute path this handle's directory has now, as the kernel
    /// tracks it (`/proc/self/fd/N`): for telling a command where a held
    /// tree is. `None` where /proc is missing or the directory was removed.
    pub fn path(&self) -> Option<std::path::PathBuf> {
        let p = std::fs::read_link(format!("/proc/self/fd/{}", self.0.as_raw_fd())).ok()?;
        let deleted = p.as_os_str().as_encoded_bytes().ends_with(b" (deleted)");
        (p.is_absolute() && !deleted).then_some(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_single_components_are_accepted() {
        for bad in [&b""[..], b".", b"..", b"a/b", b"/etc", b"a\0b", b"../x"] {
            assert!(component(bad).is_err(), "{bad:?}");
        }
        for good in [&b"a"[..], b"..data", b".hidden", b"a b", b"\xff"] {
            assert!(component(good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn beneath_never_follows_a_symlink_or_leaves() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("a/b")).unwrap();
        std::os::unix::fs::symlink("/", t.path().join("a/up")).unwrap();
        std::os::unix::fs::symlink("b", t.path().join("a/side")).unwrap();
        let root = DirFd::open_path(t.path()).unwrap();
        assert!(root.open_beneath(b"a/b").is_ok());
        assert!(root.open_beneath(b"a/up").is_err());
        assert!(root.open_beneath(b"a/side/").is_err());
        assert!(root.open_beneath(b"a/../a").is_err());
        assert!(root.open_dir(b"a/b").is_err());
        let made = root.ensure_path(b"x/y/z", 0o755).unwrap();
        assert!(made.fstat().is_ok());
        assert!(t.path().join("x/y/z").is_dir());
        assert!(root.ensure_path(b"a/up/evil", 0o755).is_err());
        assert!(!std::path::Path::new("/evil").exists());
    }
}
