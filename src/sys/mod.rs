//! The only place that talks to the kernel directly.
//!
//! Every call here is relative to a directory handle the caller holds and
//! never follows a symlink in the last component: directories are opened with
//! `O_NOFOLLOW | O_DIRECTORY`, files are created with `O_EXCL`, metadata is set
//! through file descriptors (or `AT_SYMLINK_NOFOLLOW` for symlinks, which have
//! no descriptor). Nothing in this module knows about generations or plans.
//!
//! Outside this module a name inside a directory is reached only through
//! `DirFd` (dirfd.rs), whose methods check that it is one component: the
//! name-based functions below are private to `sys`.

use std::ffi::OsStr;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{
    self as rfs, AtFlags, FileType, Mode, OFlags, RawDir, RenameFlags, Timespec, Timestamps,
};
use rustix::io::Errno;

pub use rustix::fs::Stat;

/// What a directory listing says of one entry before it is stat'ed.
pub struct Listed {
    pub name: Vec<u8>,
    pub file_type: FileType,
}

/// The kinds of entry packsync mirrors; everything else is skipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatKind {
    File,
    Dir,
    Symlink,
    Other(&'static str),
}

pub fn kind_of(st: &Stat) -> StatKind {
    match FileType::from_raw_mode(st.st_mode as _) {
        FileType::RegularFile => StatKind::File,
        FileType::Directory => StatKind::Dir,
        FileType::Symlink => StatKind::Symlink,
        FileType::Fifo => StatKind::Other("FIFO"),
        FileType::Socket => StatKind::Other("socket"),
        FileType::CharacterDevice => StatKind::Other("character device"),
        FileType::BlockDevice => StatKind::Other("block device"),
        FileType::Unknown => StatKind::Other("unknown file type"),
    }
}

/// The kind a directory listing gives (`d_type`), `None` where the
/// filesystem does not say (`DT_UNKNOWN`): then only a stat tells.
pub fn kind_listed(l: &Listed) -> Option<StatKind> {
    match l.file_type {
        FileType::Unknown => None,
        FileType::RegularFile => Some(StatKind::File),
        FileType::Directory => Some(StatKind::Dir),
        FileType::Symlink => Some(StatKind::Symlink),
        _ => Some(StatKind::Other("special file")),
    }
}

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Open a directory by path, following symlinks: only for paths the user
/// named on the command line (a SOURCE root, DEST's parent).
fn open_dir_path(path: &std::path::Path) -> io::Result<OwnedFd> {
    Ok(rfs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Open the directory `name` inside `dir`; a symlink there is refused (ELOOP/ENOTDIR).
fn open_dir_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<OwnedFd> {
    Ok(rfs::openat(dir, name, DIR_FLAGS, Mode::empty())?)
}

/// Open a regular file for reading; refuses a symlink.
fn open_read_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<OwnedFd> {
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK;
    Ok(rfs::openat(dir, name, flags, Mode::empty())?)
}

/// Create an empty regular file without opening it (mknod): nothing is
/// left for FUSE to release after it is unlinked. Falls back to an
/// `O_EXCL` create where mknod is refused.
fn make_file_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    match rfs::mknodat(
        dir,
        name,
        FileType::RegularFile,
        Mode::from_raw_mode(0o600),
        0,
    ) {
        Ok(()) => Ok(()),
        Err(Errno::EXIST) => Err(io::ErrorKind::AlreadyExists.into()),
        Err(_) => create_excl_at(dir, name).map(drop),
    }
}

/// Create a new file, private (0600) until its content is written.
fn create_excl_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<OwnedFd> {
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(rfs::openat(dir, name, flags, Mode::from_raw_mode(0o600))?)
}

fn stat_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<Stat> {
    Ok(rfs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?)
}

pub fn fstat(fd: BorrowedFd<'_>) -> io::Result<Stat> {
    Ok(rfs::fstat(fd)?)
}

/// Whether `name` exists in `dir` (without following it).
fn exists_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<bool> {
    match stat_at(dir, name) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Every entry of a directory but `.` and `..`, in the order the kernel gives.
/// The listing starts at the beginning even on a handle listed before.
fn list_dir(dir: BorrowedFd<'_>) -> io::Result<Vec<Listed>> {
    rfs::seek(dir, rfs::SeekFrom::Start(0))?;
    let (out, dots) = read_dir(dir)?;
    if dots {
        return Ok(out);
    }
    // Not even `.` and `..`: the handle was read to its end before and
    // the filesystem does not start it again (sshfs answers nothing once
    // a directory handle has reached its end, rewound or not). A handle
    // of its own on the same directory lists it from the start.
    let fresh = rfs::openat(
        dir,
        c".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Ok(read_dir(fresh.as_fd())?.0)
}

/// Every entry of `dir` from where its handle is, but `.` and `..`; and
/// whether those two were among them.
fn read_dir(dir: BorrowedFd<'_>) -> io::Result<(Vec<Listed>, bool)> {
    let mut buf = [MaybeUninit::<u8>::uninit(); 32 * 1024];
    let mut raw = RawDir::new(dir, &mut buf);
    let mut out = Vec::new();
    let mut dots = false;
    while let Some(entry) = raw.next() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            dots = true;
            continue;
        }
        out.push(Listed {
            name: name.to_vec(),
            file_type: entry.file_type(),
        });
    }
    Ok((out, dots))
}

fn readlink_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<Vec<u8>> {
    Ok(rfs::readlinkat(dir, name, Vec::new())?.into_bytes())
}

fn mkdir_at(dir: BorrowedFd<'_>, name: &[u8], mode: u32) -> io::Result<()> {
    Ok(rfs::mkdirat(dir, name, Mode::from_raw_mode(mode))?)
}

/// `mkdir` that accepts an existing directory (but not a symlink or file there).
/// `mkdir` then open. When another client makes the same directory at the
/// same instant, a network filesystem (GlusterFS) can answer EEXIST to the
/// `mkdir` and then ENOENT or ESTALE to the open: both are asked again a
/// few times, with short waits, before the error counts.
fn ensure_dir_at(dir: BorrowedFd<'_>, name: &[u8], mode: u32) -> io::Result<OwnedFd> {
    const WAITS_MS: [u64; 8] = [0, 1, 2, 5, 10, 20, 50, 100];
    let mut last = None;
    for ms in WAITS_MS {
        if ms > 0 {
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
        match mkdir_at(dir, name, mode) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        match open_dir_at(dir, name) {
            Err(e) if e.kind() == io::ErrorKind::NotFound || is_stale(&e) => last = Some(e),
            res => return res,
        }
    }
    Err(last.expect("at least one attempt"))
}

fn symlink_at(target: &[u8], dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    Ok(rfs::symlinkat(target, dir, name)?)
}

/// Hard link without following a symlink at the source name.
fn link_at(
    from_dir: BorrowedFd<'_>,
    from: &[u8],
    to_dir: BorrowedFd<'_>,
    to: &[u8],
) -> io::Result<()> {
    Ok(rfs::linkat(from_dir, from, to_dir, to, AtFlags::empty())?)
}

fn unlink_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    Ok(rfs::unlinkat(dir, name, AtFlags::empty())?)
}

fn rmdir_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    Ok(rfs::unlinkat(dir, name, AtFlags::REMOVEDIR)?)
}

fn rename_at(
    from_dir: BorrowedFd<'_>,
    from: &[u8],
    to_dir: BorrowedFd<'_>,
    to: &[u8],
) -> io::Result<()> {
    Ok(rfs::renameat(from_dir, from, to_dir, to)?)
}

/// Run the rename `op` of the names `moved` (each a directory handle and a
/// name), also when one is a read-only directory going to another parent.
/// Moving a directory rewrites its `..`, which needs write permission on the
/// directory itself: a caller that is not root, moving a tree whose root is
/// read-only (a source of mode 0555; a generation into trash/), gets
/// EACCES. Then, for each such directory this caller owns, the owner's write
/// bit is lent for one more try and given back through the handle held
/// across it, so a moved directory keeps its mode. Any other EACCES stands.
fn lending_write(
    moved: &[(BorrowedFd<'_>, &[u8])],
    op: impl Fn() -> io::Result<()>,
) -> io::Result<()> {
    let refused = match op() {
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => e,
        res => return res,
    };
    let me = rustix::process::geteuid().as_raw();
    let mut lent = Vec::new();
    for &(dir, name) in moved {
        let Ok(held) = open_dir_at(dir, name) else {
            continue;
        };
        let st = fstat(held.as_fd())?;
        let mode = st.st_mode & 0o7777;
        if mode & 0o200 == 0 && st.st_uid == me {
            set_mode_fd(held.as_fd(), mode | 0o200)?;
            lent.push((held, mode));
        }
    }
    if lent.is_empty() {
        return Err(refused);
    }
    let res = op();
    for (held, mode) in lent {
        set_mode_fd(held.as_fd(), mode)?;
    }
    res
}

/// `rename_at` through `lending_write`.
fn rename_dir_at(
    from_dir: BorrowedFd<'_>,
    from: &[u8],
    to_dir: BorrowedFd<'_>,
    to: &[u8],
) -> io::Result<()> {
    lending_write(&[(from_dir, from)], || {
        rename_at(from_dir, from, to_dir, to)
    })
}

/// Open directory `name` of `dir` for removing what it holds: one this
/// caller owns without the owner's read, write and search bits (a tree
/// copied from a read-only source) gets them first, since it is about to go.
fn open_dir_to_empty(dir: BorrowedFd<'_>, name: &[u8], st: &Stat) -> io::Result<OwnedFd> {
    let me = rustix::process::geteuid();
    let mode = st.st_mode & 0o7777;
    if st.st_uid != me.as_raw() || mode & 0o700 == 0o700 || me.is_root() {
        return open_dir_at(dir, name);
    }
    if mode & 0o400 == 0 {
        // Unreadable: not openable to fchmod it, so by path beneath the
        // handle (the last component not followed: it was just seen as a
        // directory, and a swap to a symlink is refused by O_NOFOLLOW below).
        let path = OFlags::PATH | OFlags::NOFOLLOW | OFlags::DIRECTORY | OFlags::CLOEXEC;
        use std::os::fd::AsRawFd;
        let fd = rfs::openat(dir, name, path, Mode::empty())?;
        rfs::chmod(
            format!("/proc/self/fd/{}", fd.as_raw_fd()),
            Mode::from_raw_mode(mode | 0o700),
        )?;
    }
    let sub = open_dir_at(dir, name)?;
    set_mode_fd(sub.as_fd(), mode | 0o700)?;
    Ok(sub)
}

/// Swap two names atomically; `Unsupported` where the filesystem lacks it.
fn rename_exchange(
    a_dir: BorrowedFd<'_>,
    a: &[u8],
    b_dir: BorrowedFd<'_>,
    b: &[u8],
) -> io::Result<()> {
    lending_write(&[(a_dir, a), (b_dir, b)], || {
        renameat2(a_dir, a, b_dir, b, RenameFlags::EXCHANGE, "RENAME_EXCHANGE")
    })
}

/// renameat2(2) with `flags` (named `flag` in the message where the
/// filesystem lacks it: `Unsupported`).
fn renameat2(
    from_dir: BorrowedFd<'_>,
    from: &[u8],
    to_dir: BorrowedFd<'_>,
    to: &[u8],
    flags: RenameFlags,
    flag: &str,
) -> io::Result<()> {
    match rfs::renameat_with(from_dir, from, to_dir, to, flags) {
        Ok(()) => Ok(()),
        Err(e) if exchange_unsupported(e) => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("the filesystem does not support renameat2({flag})"),
        )),
        Err(e) => Err(e.into()),
    }
}

/// Rename onto a name that must not exist (`AlreadyExists` if it does, even an
/// empty directory, which plain rename(2) would replace); `Unsupported` where
/// the filesystem lacks RENAME_NOREPLACE.
fn rename_noreplace(
    from_dir: BorrowedFd<'_>,
    from: &[u8],
    to_dir: BorrowedFd<'_>,
    to: &[u8],
) -> io::Result<()> {
    lending_write(&[(from_dir, from)], || {
        renameat2(
            from_dir,
            from,
            to_dir,
            to,
            RenameFlags::NOREPLACE,
            "RENAME_NOREPLACE",
        )
    })
}

fn exchange_unsupported(e: Errno) -> bool {
    e == Errno::INVAL || e == Errno::NOSYS || e == Errno::OPNOTSUPP || e == Errno::NOTSUP
}

/// Set owner, then mode (chown clears setuid bits), then times, all through `fd`.
pub fn set_meta_fd(
    fd: BorrowedFd<'_>,
    owner: Option<(u32, u32)>,
    mode: Option<u32>,
    mtime: (i64, u32),
) -> io::Result<()> {
    if let Some((uid, gid)) = owner {
        rfs::fchown(
            fd,
            Some(rfs::Uid::from_raw(uid)),
            Some(rfs::Gid::from_raw(gid)),
        )?;
    }
    if let Some(mode) = mode {
        rfs::fchmod(fd, Mode::from_raw_mode(mode))?;
    }
    rfs::futimens(fd, &times(mtime))?;
    Ok(())
}

/// Set one extended attribute on `fd`.
pub fn set_xattr_fd(fd: BorrowedFd<'_>, name: &[u8], value: &[u8]) -> io::Result<()> {
    rfs::fsetxattr(fd, OsStr::from_bytes(name), value, rfs::XattrFlags::empty())?;
    Ok(())
}

/// The extended attributes of `name` in `dir` (a file or a directory, never
/// followed if a symlink), `system.*` (ACLs) left out: read with the `l`
/// calls through `/proc/self/fd/DIR/NAME`, a path that starts at the handle
/// and has one component after it, so one call lists an entry without
/// opening it. A filesystem without xattrs has none.
fn xattrs_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    use std::os::fd::AsRawFd;
    let mut path = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
    path.extend_from_slice(name);
    let path = OsStr::from_bytes(&path);
    read_xattrs(
        |buf| rfs::llistxattr(path, buf),
        |attr, buf| rfs::lgetxattr(path, attr, buf),
    )
}

/// `xattrs_at` for a descriptor (a source's root).
fn xattrs_fd(fd: BorrowedFd<'_>) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    read_xattrs(
        |buf| rfs::flistxattr(fd, buf),
        |attr, buf| rfs::fgetxattr(fd, attr, buf),
    )
}

fn read_xattrs(
    list: impl Fn(&mut [u8]) -> rustix::io::Result<usize>,
    get: impl Fn(&OsStr, &mut [u8]) -> rustix::io::Result<usize>,
) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let unsupported = |e: Errno| e == Errno::NOTSUP || e == Errno::OPNOTSUPP;
    let mut names = vec![0u8; 1024];
    let n = loop {
        match list(&mut names) {
            Ok(n) => break n,
            Err(e) if unsupported(e) => return Ok(Vec::new()),
            Err(Errno::RANGE) if names.len() < 1 << 20 => names.resize(names.len() * 8, 0),
            Err(e) => return Err(e.into()),
        }
    };
    let mut out = Vec::new();
    let mut value = vec![0u8; 256];
    for attr in names[..n].split(|&b| b == 0).filter(|a| !a.is_empty()) {
        if attr.starts_with(b"system.") {
            continue;
        }
        let got = loop {
            match get(OsStr::from_bytes(attr), &mut value) {
                Ok(k) => break Some(k),
                Err(Errno::NODATA) => break None, // removed since the listing
                Err(Errno::RANGE) if value.len() < 1 << 17 => value.resize(value.len() * 8, 0),
                Err(e) => return Err(e.into()),
            }
        };
        if let Some(k) = got {
            out.push((attr.to_vec(), value[..k].to_vec()));
        }
    }
    Ok(out)
}

/// Whether a refused xattr is one the volume cannot keep (no support, no
/// permission for that namespace) rather than an I/O failure.
pub fn is_xattr_refusal(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EPERM | libc::EOPNOTSUPP | libc::EACCES | libc::EINVAL | libc::ERANGE)
    )
}

/// Owner and times of a symlink, which has no descriptor to set them through.
fn set_symlink_meta(
    dir: BorrowedFd<'_>,
    name: &[u8],
    owner: Option<(u32, u32)>,
    mtime: (i64, u32),
) -> io::Result<()> {
    if let Some((uid, gid)) = owner {
        rfs::chownat(
            dir,
            name,
            Some(rfs::Uid::from_raw(uid)),
            Some(rfs::Gid::from_raw(gid)),
            AtFlags::SYMLINK_NOFOLLOW,
        )?;
    }
    rfs::utimensat(dir, name, &times(mtime), AtFlags::SYMLINK_NOFOLLOW)?;
    Ok(())
}

/// Set the mtime of an open file or directory to now.
pub fn touch_fd(fd: BorrowedFd<'_>) -> io::Result<()> {
    let now = Timespec {
        tv_sec: 0,
        tv_nsec: rfs::UTIME_NOW,
    };
    Ok(rfs::futimens(
        fd,
        &Timestamps {
            last_access: now,
            last_modification: now,
        },
    )?)
}

/// Where a handle lives, as far as packsync's behaviour depends on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsKind {
    Local,
    /// FUSE (`fuse.sshfs`, `fuse.glusterfs`, ...): `syncfs` does not flush,
    /// and setting a symlink's own times or owner may reach its target.
    Fuse,
    /// A network filesystem in the kernel (NFS, SMB, CephFS, ...).
    Network,
}

impl FsKind {
    /// Other clients may see its names and attributes late (caches).
    pub fn is_shared(self) -> bool {
        self != FsKind::Local
    }
}

pub fn fs_kind(fd: BorrowedFd<'_>) -> io::Result<FsKind> {
    #[allow(clippy::unnecessary_cast)]
    let magic = rfs::fstatfs(fd)?.f_type as u64 & 0xffff_ffff;
    Ok(match magic {
        0x6573_5546 => FsKind::Fuse,
        // NFS, SMB, CIFS, SMB2, CephFS, AFS, 9p, Lustre, GPFS, OCFS2
        0x6969 | 0x517b | 0xff53_4d42 | 0xfe53_4d42 | 0x00c3_6400 | 0x5346_414f | 0x0102_1997
        | 0x0bd0_0bd0 | 0x4750_4653 | 0x7461_636f => FsKind::Network,
        _ => FsKind::Local,
    })
}

/// Set a name's mtime to now (the server's clock on a network filesystem).
fn touch_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    let now = Timespec {
        tv_sec: 0,
        tv_nsec: rfs::UTIME_NOW,
    };
    let t = Timestamps {
        last_access: now,
        last_modification: now,
    };
    Ok(rfs::utimensat(dir, name, &t, AtFlags::SYMLINK_NOFOLLOW)?)
}

fn times(mtime: (i64, u32)) -> Timestamps {
    let m = Timespec {
        tv_sec: mtime.0,
        tv_nsec: mtime.1 as _,
    };
    Timestamps {
        last_access: m,
        last_modification: m,
    }
}

pub fn fsync(fd: BorrowedFd<'_>) -> io::Result<()> {
    Ok(rfs::fsync(fd)?)
}

pub fn syncfs(fd: BorrowedFd<'_>) -> io::Result<()> {
    Ok(rfs::syncfs(fd)?)
}

pub fn read(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match rustix::io::read(fd, &mut *buf) {
            Ok(n) => return Ok(n),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

pub fn pread(fd: BorrowedFd<'_>, buf: &mut [u8], off: u64) -> io::Result<usize> {
    loop {
        match rustix::io::pread(fd, &mut *buf, off) {
            Ok(n) => return Ok(n),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

pub fn write_all(fd: BorrowedFd<'_>, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match rustix::io::write(fd, buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Clone the whole file (reflink) where source and destination share a
/// filesystem that supports it.
pub fn ficlone(dst: BorrowedFd<'_>, src: BorrowedFd<'_>) -> io::Result<()> {
    Ok(rfs::ioctl_ficlone(dst, src)?)
}

/// Start writing a range of `fd` back to disk without waiting for it
/// (`sync_file_range(SYNC_FILE_RANGE_WRITE)`); a hint, so errors are ignored:
/// the flush that makes the data durable comes later and reports them.
pub fn start_writeback(fd: BorrowedFd<'_>, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: plain integers and a descriptor the caller keeps open; rustix
    // has no wrapper for this call.
    let _ = unsafe {
        libc::sync_file_range(
            fd.as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        )
    };
}

/// One `copy_file_range` call; `Ok(0)` at end of file.
pub fn copy_range(src: BorrowedFd<'_>, dst: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
    loop {
        match rfs::copy_file_range(src, None, dst, None, len) {
            Ok(n) => return Ok(n),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Whether an error from `copy_file_range` or `FICLONE` means "use another way".
pub fn is_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::EXDEV
                | libc::EINVAL
                | libc::ENOSYS
                | libc::EOPNOTSUPP
                | libc::ENOTTY
                | libc::EBADF
                | libc::EPERM
        )
    )
}

/// Remove `name` inside `dir` and everything below it, never following a
/// symlink: directories are opened with `O_NOFOLLOW` and emptied through
/// their handle. Names the filesystem keeps for open-but-deleted files
/// (`.nfsXXXX`, `.fuse_hiddenXXXX`) are never touched; their directory is
/// then left in place and `Ok(false)` is returned.
fn remove_tree_at(dir: BorrowedFd<'_>, name: &[u8]) -> io::Result<bool> {
    let st = match stat_at(dir, name) {
        Ok(st) => st,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(true),
        Err(e) => return Err(e),
    };
    if kind_of(&st) != StatKind::Dir {
        return match unlink_at(dir, name) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(true),
        };
    }
    let sub = match open_dir_to_empty(dir, name, &st) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(true),
        Err(e) => return Err(e),
    };
    let mut complete = true;
    for entry in list_dir(sub.as_fd())? {
        if is_silly_name(&entry.name) {
            complete = false;
            continue;
        }
        if entry.file_type == FileType::Directory || entry.file_type == FileType::Unknown {
            complete &= remove_tree_at(sub.as_fd(), &entry.name)?;
        } else {
            match unlink_at(sub.as_fd(), &entry.name) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) if e.raw_os_error() == Some(libc::EISDIR) => {
                    complete &= remove_tree_at(sub.as_fd(), &entry.name)?;
                }
                Err(e) => return Err(e),
            }
        }
    }
    drop(sub);
    if !complete {
        return Ok(false);
    }
    match rmdir_at(dir, name) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(true),
        // A file still open on NFS/FUSE shows up as a silly name after our listing.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOTEMPTY | libc::EBUSY | libc::EEXIST)
            ) =>
        {
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// Names NFS and FUSE give to files deleted while open; removing them is the
/// filesystem's job, not ours.
pub fn is_silly_name(name: &[u8]) -> bool {
    name.starts_with(b".nfs") || name.starts_with(b".fuse_hidden")
}

/// Raise the soft open-file limit to the hard one: the copy holds a few
/// directory handles per directory in flight.
pub fn raise_fd_limit() {
    if let Ok(lim) = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .maximum
        .ok_or(())
    {
        let _ = rustix::process::setrlimit(
            rustix::process::Resource::Nofile,
            rustix::process::Rlimit {
                current: Some(lim),
                maximum: Some(lim),
            },
        );
    }
}

pub fn hostname() -> String {
    let uname = rustix::system::uname();
    let name = uname.nodename().to_string_lossy().into_owned();
    if name.is_empty() {
        "localhost".into()
    } else {
        name
    }
}

pub fn pid() -> u32 {
    rustix::process::getpid().as_raw_nonzero().get() as u32
}

/// Whether a process with this pid exists on this host.
pub fn pid_alive(pid: u32) -> bool {
    match rustix::process::Pid::from_raw(pid as i32) {
        Some(p) => !matches!(rustix::process::test_kill_process(p), Err(Errno::SRCH)),
        None => false,
    }
}

/// The effective uid, asked once: it is compared on every file copied.
pub fn euid() -> u32 {
    static ID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *ID.get_or_init(|| rustix::process::geteuid().as_raw())
}

/// The effective gid, asked once.
pub fn egid() -> u32 {
    static ID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *ID.get_or_init(|| rustix::process::getegid().as_raw())
}

/// Random bytes for unique names.
pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    if rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        return t.as_nanos() as u64 ^ ((pid() as u64) << 32);
    }
    u64::from_ne_bytes(b)
}

/// Whether stderr is a terminal.
pub fn stderr_is_tty() -> bool {
    rustix::termios::isatty(std::io::stderr())
}

pub fn os(name: &[u8]) -> &OsStr {
    OsStr::from_bytes(name)
}

/// Stat fields as plain numbers.
pub fn mtime_of(st: &Stat) -> (i64, u32) {
    #[allow(clippy::unnecessary_cast)]
    let t = (st.st_mtime as i64, st.st_mtime_nsec as u32);
    t
}

/// The change and modification times as one number (each in nanoseconds
/// since the epoch, wrapping, the mtime's bits rotated before they are
/// mixed in): only ever compared for equality, to see that a file changed.
pub fn change_stamp(st: &Stat) -> u64 {
    #[allow(clippy::unnecessary_cast)]
    let (s, ns) = (st.st_ctime as i64, st.st_ctime_nsec as u64);
    let ctime = (s as u64).wrapping_mul(1_000_000_000).wrapping_add(ns);
    let (ms, mns) = mtime_of(st);
    let mtime = (ms as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(mns as u64);
    ctime ^ mtime.rotate_left(32)
}

mod dirfd;
pub mod forward;
pub use dirfd::DirFd;

/// SIGINT/SIGTERM become a flag that long work polls, so that it can clean
/// up its staging directory before exiting 130/143.
pub mod signals {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    static PENDING: std::sync::OnceLock<Arc<AtomicUsize>> = std::sync::OnceLock::new();

    pub fn install() {
        let flag = PENDING.get_or_init(|| Arc::new(AtomicUsize::new(0)));
        for sig in [libc::SIGINT, libc::SIGTERM] {
            let _ = signal_hook::flag::register_usize(sig, flag.clone(), sig as usize);
        }
    }

    /// The signal received, if any.
    pub fn pending() -> Option<i32> {
        match PENDING.get().map(|f| f.load(Ordering::SeqCst)) {
            Some(0) | None => None,
            Some(s) => Some(s as i32),
        }
    }

    /// What ended a `pause`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Wake {
        /// The time was up.
        Elapsed,
        /// SIGHUP: do the next round now.
        Hangup,
        /// SIGINT or SIGTERM (its number): stop.
        Stop(i32),
    }

    /// SIGHUP seen since the last `pause` returned `Hangup`.
    static HANGUP: std::sync::OnceLock<Arc<std::sync::atomic::AtomicBool>> =
        std::sync::OnceLock::new();
    /// The read end of a socket pair that SIGINT, SIGTERM and SIGHUP write a
    /// byte to, so that `pause` wakes at once instead of polling.
    static WAKER: std::sync::OnceLock<std::os::unix::net::UnixStream> = std::sync::OnceLock::new();

    /// For `sync --every`: SIGHUP no longer ends the process but wakes
    /// `pause`, as SIGINT and SIGTERM do (after `install`). Only the loop
    /// calls it: a one-shot sync keeps SIGHUP's default.
    pub fn install_loop() -> std::io::Result<()> {
        use std::os::unix::net::UnixStream;
        let hup = HANGUP.get_or_init(|| Arc::new(std::sync::atomic::AtomicBool::new(false)));
        signal_hook::flag::register(libc::SIGHUP, hup.clone())?;
        if WAKER.get().is_some() {
            return Ok(());
        }
        let (read, write) = UnixStream::pair()?;
        write.set_nonblocking(true)?;
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            signal_hook::low_level::pipe::register(sig, write.try_clone()?)?;
        }
        let _ = WAKER.set(read);
        Ok(())
    }

    /// Wait up to `limit`, or until SIGINT, SIGTERM or SIGHUP arrives (or
    /// arrived during the last round). A stop signal wins over a hangup.
    pub fn pause(limit: std::time::Duration) -> Wake {
        use std::io::Read;
        let deadline = std::time::Instant::now() + limit;
        let mut buf = [0u8; 64];
        loop {
            if let Some(sig) = pending() {
                return Wake::Stop(sig);
            }
            if HANGUP
                .get()
                .is_some_and(|h| h.swap(false, Ordering::SeqCst))
            {
                return Wake::Hangup;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Wake::Elapsed;
            }
            let Some(mut waker) = WAKER.get() else {
                std::thread::sleep(left.min(std::time::Duration::from_millis(50)));
                continue;
            };
            // A byte per signal: drained here, the flags above say which.
            if waker.set_read_timeout(Some(left)).is_err() {
                std::thread::sleep(left.min(std::time::Duration::from_millis(50)));
                continue;
            }
            let _ = waker.read(&mut buf);
        }
    }
}

/// Named crash points for the fault suite: with the `fault-injection`
/// feature, `PACKSYNC_TEST_CRASH_AT=<point>` kills the process there with
/// SIGKILL. Compiled to nothing otherwise.
#[inline]
pub fn crash_point(_point: &str) {
    #[cfg(feature = "fault-injection")]
    if std::env::var("PACKSYNC_TEST_CRASH_AT").is_ok_and(|p| p == _point) {
        let _ =
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
    }
}

/// Whether `e` says the filesystem is full or the quota spent (ENOSPC, EDQUOT).
pub fn out_of_space(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// Named flush failures for the fault suite: with the `fault-injection`
/// feature, `PACKSYNC_TEST_FLUSH_FAIL=<point>` makes the flush at `<point>`
/// fail with EIO, as a disk that lost the write would. Compiled to
/// `Ok(())` otherwise.
#[inline]
pub fn flush_fault(_point: &str) -> io::Result<()> {
    #[cfg(feature = "fault-injection")]
    if std::env::var("PACKSYNC_TEST_FLUSH_FAIL").is_ok_and(|p| p == _point) {
        return Err(io::Error::from_raw_os_error(libc::EIO));
    }
    Ok(())
}

/// Named pause points for the fault suite: with the `fault-injection`
/// feature, `PACKSYNC_TEST_PAUSE_AT=<point>:<path>` stops the process the
/// first time it reaches `<point>`: it creates `<path>.paused`, then waits
/// until `<path>` exists or SIGINT/SIGTERM arrives, so a test can change the
/// world (or signal) at a known instant. Compiled to nothing otherwise.
#[inline]
pub fn pause_point(_point: &str) {
    #[cfg(feature = "fault-injection")]
    {
        use std::sync::atomic::{AtomicBool, Ordering};
        static PAUSED: AtomicBool = AtomicBool::new(false);
        let Ok(spec) = std::env::var("PACKSYNC_TEST_PAUSE_AT") else {
            return;
        };
        let Some((point, path)) = spec.split_once(':') else {
            return;
        };
        if point != _point || PAUSED.swap(true, Ordering::SeqCst) {
            return;
        }
        let _ = std::fs::write(format!("{path}.paused"), std::process::id().to_string());
        while !std::path::Path::new(path).exists() && signals::pending().is_none() {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}

/// Metadata of a path the user named (a SOURCE), following symlinks.
pub fn stat_path(path: &std::path::Path) -> io::Result<Stat> {
    Ok(rfs::stat(path)?)
}

/// Whether setting an owner failed because the volume or the user may not
/// (not root, root_squash, an id the filesystem cannot store): a soft failure.
pub fn is_owner_refusal(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EPERM | libc::EINVAL))
}

/// The absolute path without symlinks of a path the user named, to compare
/// SOURCE and DEST (`DEST is inside SOURCE`).
pub fn canonicalize(path: &std::path::Path) -> io::Result<std::path::PathBuf> {
    std::fs::canonicalize(path)
}

/// The whole text of a file the user named (`--exclude-from`).
pub fn read_text(path: &std::path::Path) -> io::Result<String> {
    std::fs::read_to_string(path)
}

/// `read_text`, refusing a file longer than `max` bytes.
pub fn read_text_bounded(path: &std::path::Path, max: u64) -> io::Result<String> {
    String::from_utf8(read_bounded(path, max)?).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        )
    })
}

/// Set the file mode creation mask; the previous one.
pub fn set_umask(mode: u32) -> u32 {
    rustix::process::umask(Mode::from_raw_mode(mode)).as_raw_mode()
}

/// `SIGINT` / `SIGTERM` by name, for messages.
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        _ => "a signal",
    }
}

// ---- For the volume, the layouts, commit and the operator commands. ----

/// `readlink` said EINVAL: the name exists and is not a symlink.
pub fn is_not_symlink(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EINVAL)
}

/// ESTALE: a network filesystem's handle went stale (another client swapped the name).
pub fn is_stale(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ESTALE)
}

/// Opening a directory met a symlink or a non-directory there (ELOOP, ENOTDIR).
pub fn is_not_dir(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR))
}

/// ELOOP: what a path-free open of a non-file says; for callers that refuse one.
pub fn symlink_refused() -> io::Error {
    io::Error::from_raw_os_error(libc::ELOOP)
}

/// Set the mode of an open file (widened once its content is written).
pub fn set_mode_fd(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    Ok(rfs::fchmod(fd, Mode::from_raw_mode(mode))?)
}

/// This boot's id and this process's pid namespace, as the kernel names
/// them (empty where unreadable): what tells two hosts with one hostname apart.
pub fn host_identity() -> (Vec<u8>, Vec<u8>) {
    let boot = std::fs::read("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let pidns = std::fs::read_link("/proc/self/ns/pid")
        .map(|p| p.into_os_string().into_encoded_bytes())
        .unwrap_or_default();
    (boot, pidns)
}

/// EPERM: the filesystem will not do it for this caller (sshfs refusing a
/// link that points outside its export, for one).
pub fn is_not_permitted(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EPERM)
}

/// `canonicalize` of a path whose last components may not exist yet
/// (`--mkpath`): the nearest ancestor that exists, resolved, with the
/// missing names after it as written.
pub fn canonicalize_existing(path: &std::path::Path) -> io::Result<std::path::PathBuf> {
    let mut missing = Vec::new();
    let mut base = path;
    loop {
        match std::fs::canonicalize(base) {
            Ok(mut p) => {
                p.extend(missing.iter().rev());
                return Ok(p);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                match (base.parent(), base.file_name()) {
                    (Some(up), Some(name)) => {
                        missing.push(name);
                        base = if up.as_os_str().is_empty() {
                            std::path::Path::new(".")
                        } else {
                            up
                        };
                    }
                    _ => return Err(e),
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// Give the memory the allocator holds free back to the kernel: after a
/// round of `sync --every`, whose many threads leave freed chunks spread
/// over their arenas, so the process's RSS stays at what it uses. glibc
/// only (`malloc_trim`); elsewhere nothing.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Make every thread share one allocator arena: with an arena per thread,
/// each keeps the fragments of whatever it freed, which raises a one-shot
/// sync's peak RSS with its many threads and makes the loop's (`sync
/// --every`) creep up with the rounds. Called before any thread but main
/// exists. glibc only (`mallopt(M_ARENA_MAX, 1)`); elsewhere nothing.
pub fn share_one_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; no memory is touched.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// This process's resident bytes (`VmRSS` of `/proc/self/status`) and open
/// file descriptors (the entries of `/proc/self/fd`, less the one reading
/// it); `None` where /proc is not mounted.
pub fn own_resources() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    let fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    Some((kib * 1024, fds.saturating_sub(1)))
}

/// What a Prometheus client library's process collector exports, read
/// from `/proc/self` when asked (`/metrics` of `sync --every`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessFigures {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub start_time_seconds: f64,
    pub open_fds: u64,
    pub max_fds: Option<u64>,
}

/// This process's figures, or `None` where /proc is not mounted (or says
/// something that does not parse).
pub fn process_figures() -> Option<ProcessFigures> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let btime = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<u64>().ok())?;
    let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    let ticks = rustix::param::clock_ticks_per_second() as f64;
    let page = rustix::param::page_size() as u64;
    parse_stat(&stat, btime, ticks, page).map(|(cpu, start, vsize, rss)| ProcessFigures {
        cpu_seconds: cpu,
        resident_bytes: rss,
        virtual_bytes: vsize,
        start_time_seconds: start,
        // Less the descriptor that listed them.
        open_fds: open_fds.saturating_sub(1),
        max_fds: limit,
    })
}

/// From `/proc/PID/stat`: CPU seconds (user + system), the start time
/// (seconds since the epoch, from the boot time `btime`), virtual and
/// resident bytes. The command name (field 2) may hold spaces and
/// parentheses: the fields counted are those after its last `)`.
fn parse_stat(stat: &str, btime: u64, ticks: f64, page: u64) -> Option<(f64, f64, u64, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    // `rest` starts at field 3 (state): field n is f[n - 3].
    let num = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
    let cpu = (num(14)? + num(15)?) as f64 / ticks;
    let start = btime as f64 + num(22)? as f64 / ticks;
    Some((cpu, start, num(23)?, num(24)?.saturating_mul(page)))
}

// ---- For sources that are not directories (`net`, `source::oci`). ----

/// At most `max` bytes of a file the user named (`--registry-auth`, a
/// Docker config, `--ca-file`); `InvalidData` when it is longer.
pub fn read_bounded(path: &std::path::Path, max: u64) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::new();
    std::fs::File::open(path)?
        .take(max + 1)
        .read_to_end(&mut out)?;
    if out.len() as u64 > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("longer than {max} bytes"),
        ));
    }
    Ok(out)
}

/// A file a source opened (a blob of an OCI layout below its handle), as a
/// reader: the descriptor is ours, only its bytes are read.
pub fn reader(fd: OwnedFd) -> std::fs::File {
    std::fs::File::from(fd)
}

/// Open a regular file the user named (an archive SOURCE) for reading,
/// following symlinks: the user named it.
pub fn open_file_path(path: &std::path::Path) -> io::Result<OwnedFd> {
    Ok(rfs::open(
        path,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    )?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        // A command name with a space and a ')' of its own.
        let stat = "4242 (pack sync) ) S 1 4242 4242 0 -1 4194560 900 0 0 0 \
                    250 50 0 0 20 0 5 0 1000 123456789 300 18446744073709551615";
        let (cpu, start, vsize, rss) = super::parse_stat(stat, 1_700_000_000, 100.0, 4096).unwrap();
        assert_eq!(cpu, 3.0);
        assert_eq!(start, 1_700_000_010.0);
        assert_eq!((vsize, rss), (123456789, 300 * 4096));
        assert_eq!(super::parse_stat("1 (x) S 1 2", 0, 100.0, 4096), None);
        let live = super::process_figures().expect("/proc is mounted where the tests run");
        assert!(live.resident_bytes > 0 && live.open_fds >= 3, "{live:?}");
    }
}
