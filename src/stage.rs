//! Stage: build the new tree inside this writer's private staging directory.
//!
//! Directories first, then their files in parallel; a file the plan marked
//! `reuse` is hardlinked from the live generation (and checked: what the link
//! reaches must be a regular file matching the manifest), everything else is
//! copied from its source and hashed on the way. Files are created `O_EXCL`
//! with mode 0600 and get their owner, mode and times through the open
//! descriptor once written; directories get theirs after their contents.
//! Hardlinked followers and the directories holding them are finished in a
//! second, sequential pass. Nothing here touches the live tree but to link
//! from it, nor anything outside the staging directory.
//!
//! The volume's capabilities (`caps`) shape three things: reused files are
//! checked against mtimes as coarse as the volume keeps them; symlink times
//! and owners are not set where that would reach the target (FUSE); and where
//! `syncfs` does not flush (FUSE), every file and directory is fsynced here
//! through the handle that wrote it. A long copy refreshes the staging
//! directory's mtime every `HEARTBEAT` so that writers on other hosts do not
//! take it for a dead writer's (see `retire`).

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{bail, Context, Result};
use rayon::prelude::*;
use sha2::{Digest, Sha256};

use crate::caps::Caps;
use crate::error::Failure;
use crate::report::Reporter;
use crate::scan::display;
use crate::sys;
use crate::tree::{Entry, Meta, Node, Tree};

/// What the stage needs besides the tree.
pub struct Job<'a> {
    /// One open directory per SOURCE, in order.
    pub sources: &'a [OwnedFd],
    /// SOURCE paths, for messages.
    pub labels: &'a [String],
    /// The live generation's root, to hardlink unchanged files from.
    pub live: Option<BorrowedFd<'a>>,
    /// Set owners from the tree (root or `--chown`).
    pub owners: bool,
    pub reporter: &'a dyn Reporter,
    /// What the destination volume can do (probed in staging).
    pub caps: Caps,
    /// This writer's staging directory, whose mtime is its heartbeat.
    pub heartbeat: Option<BorrowedFd<'a>>,
    /// The sync will flush what it wrote (no `--no-fsync`): large files
    /// start their writeback as they are copied.
    pub durable: bool,
}

/// How often a running copy refreshes its staging directory's mtime; far
/// below `config::STALE_STAGE`, after which other hosts may remove it.
pub const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(60);

#[derive(Debug, Default)]
pub struct Staged {
    pub copied: u64,
    pub copied_bytes: u64,
    pub reused: u64,
    /// Owners the volume refused to set (not root, root_squash).
    pub owner_failures: u64,
}

struct Ctx<'a> {
    job: &'a Job<'a>,
    /// Hardlink group → path of its first member (the one that is copied).
    leaders: HashMap<u32, Vec<u8>>,
    /// Directories holding a follower: finished in the second pass.
    late_dirs: HashSet<Vec<u8>>,
    copied: AtomicU64,
    copied_bytes: AtomicU64,
    reused: AtomicU64,
    owner_failures: AtomicU64,
    start: std::time::Instant,
    /// Seconds after `start` of the last heartbeat.
    last_beat: AtomicU64,
}

impl Ctx<'_> {
    /// Refresh the staging directory's mtime if `HEARTBEAT` has passed.
    fn beat(&self) {
        let Some(fd) = self.job.heartbeat else { return };
        let now = self.start.elapsed().as_secs();
        let last = self.last_beat.load(Ordering::Relaxed);
        if now >= last + HEARTBEAT.as_secs()
            && self
                .last_beat
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let _ = sys::touch_fd(fd);
        }
    }

    /// Flush what was written through `fd`, where `syncfs` would not.
    fn flush(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        if self.job.caps.fsync_each {
            sys::fsync(fd)?;
        }
        Ok(())
    }
}

/// Files up to this size are copied through user space (read, hash,
/// write); larger ones by the kernel (`copy_large`).
const SMALL: u64 = 1 << 20;

/// The per-thread buffer: a file up to this size is copied with one read
/// and one write, a larger one hashed this much at a time. Small, as the
/// pool has many threads: at 1 MiB, 16 threads held 3 MiB more at peak.
const BUF_MAX: usize = 64 << 10;

/// `copy_large` copies, hashes and starts writeback this much at a time.
const CHUNK: u64 = 8 << 20;

thread_local! {
    static BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Stage `tree` into the empty directory `out`.
pub fn run(job: &Job<'_>, tree: &mut Tree, out: BorrowedFd<'_>) -> Result<Staged> {
    sys::pause_point("staging");
    let mut ctx = Ctx {
        job,
        leaders: HashMap::new(),
        late_dirs: HashSet::new(),
        copied: AtomicU64::new(0),
        copied_bytes: AtomicU64::new(0),
        reused: AtomicU64::new(0),
        owner_failures: AtomicU64::new(0),
        start: std::time::Instant::now(),
        last_beat: AtomicU64::new(0),
    };
    tree.for_each(&mut |path, e| {
        if let Node::File(f) = &e.node {
            if let Some(g) = f.group {
                if let Some(leader) = ctx.leaders.get(&g) {
                    if leader.as_slice() != path {
                        let dir = path
                            .rsplit_once_byte(b'/')
                            .map(|(d, _)| d.to_vec())
                            .unwrap_or_default();
                        ctx.late_dirs.insert(dir);
                    }
                } else {
                    ctx.leaders.insert(g, path.to_vec());
                }
            }
        }
    });
    let srcs: Vec<Option<BorrowedFd<'_>>> = job
        .sources
        .iter()
        .enumerate()
        .map(|(i, fd)| (tree.root_srcs & (1 << i) != 0).then(|| fd.as_fd()))
        .collect();
    copy_dir(&ctx, &mut tree.entries, &srcs, job.live, out, &[])?;
    link_followers(&ctx, tree, out)?;
    apply_meta(&ctx, out, &tree.root).context("cannot set metadata of the staged root")?;
    ctx.flush(out)
        .context("cannot flush the staged root to disk (nothing was published)")?;
    Ok(Staged {
        copied: ctx.copied.into_inner(),
        copied_bytes: ctx.copied_bytes.into_inner(),
        reused: ctx.reused.into_inner(),
        owner_failures: ctx.owner_failures.into_inner(),
    })
}

trait SplitByte {
    fn rsplit_once_byte(&self, b: u8) -> Option<(&[u8], &[u8])>;
}

impl SplitByte for [u8] {
    fn rsplit_once_byte(&self, b: u8) -> Option<(&[u8], &[u8])> {
        let i = self.iter().rposition(|&c| c == b)?;
        Some((&self[..i], &self[i + 1..]))
    }
}

fn check_signal() -> Result<()> {
    match sys::signals::pending() {
        Some(sig) => Err(Failure::Interrupted(sig).into()),
        None => Ok(()),
    }
}

fn join(rel: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(rel.len() + 1 + name.len());
    p.extend_from_slice(rel);
    if !rel.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

fn copy_dir(
    ctx: &Ctx<'_>,
    entries: &mut [Entry],
    srcs: &[Option<BorrowedFd<'_>>],
    live: Option<BorrowedFd<'_>>,
    out: BorrowedFd<'_>,
    rel: &[u8],
) -> Result<()> {
    entries.par_iter_mut().try_for_each(|e| -> Result<()> {
        check_signal()?;
        ctx.beat();
        let path = join(rel, &e.name);
        match &mut e.node {
            Node::Dir(d) => {
                sys::mkdir_at(out, &e.name, 0o700).with_context(|| {
                    format!("cannot create directory {} in staging", sys_escape(&path))
                })?;
                let sub_out = sys::open_dir_at(out, &e.name).with_context(|| {
                    format!("cannot open staged directory {}", sys_escape(&path))
                })?;
                let mut sub_srcs: Vec<Option<OwnedFd>> = Vec::with_capacity(srcs.len());
                for (i, s) in srcs.iter().enumerate() {
                    sub_srcs.push(match s {
                        Some(fd) if d.srcs & (1 << i) != 0 => {
                            Some(sys::open_dir_at(*fd, &e.name).with_context(|| {
                                format!(
                                    "cannot open directory {}",
                                    display(&ctx.job.labels[i], &path)
                                )
                            })?)
                        }
                        _ => None,
                    });
                }
                // The live side is only a place to link from: if it is not a directory now, there is nothing to reuse.
                let sub_live = live.and_then(|l| sys::open_dir_at(l, &e.name).ok());
                let borrowed: Vec<Option<BorrowedFd<'_>>> = sub_srcs
                    .iter()
                    .map(|s| s.as_ref().map(|f| f.as_fd()))
                    .collect();
                copy_dir(
                    ctx,
                    &mut d.entries,
                    &borrowed,
                    sub_live.as_ref().map(|f| f.as_fd()),
                    sub_out.as_fd(),
                    &path,
                )?;
                if !ctx.late_dirs.contains(&path) {
                    apply_meta(ctx, sub_out.as_fd(), &e.meta).with_context(|| {
                        format!("cannot set metadata of staged {}", sys_escape(&path))
                    })?;
                    ctx.flush(sub_out.as_fd()).with_context(|| {
                        format!("cannot flush staged directory {}", sys_escape(&path))
                    })?;
                }
                ctx.job.reporter.advance(0);
            }
            Node::Symlink(target) => {
                sys::symlink_at(target, out, &e.name).with_context(|| {
                    format!("cannot create symlink {} in staging", sys_escape(&path))
                })?;
                if !ctx.job.caps.link_meta {
                    // On FUSE, lutimes/lchown may reach the target: leave the link as made.
                    ctx.job.reporter.advance(0);
                    return Ok(());
                }
                let owner = ctx.job.owners.then_some((e.meta.uid, e.meta.gid));
                if let Err(err) = sys::set_symlink_meta(out, &e.name, owner, e.meta.mtime.pair()) {
                    if !is_owner_refusal(&err) {
                        return Err(err).with_context(|| {
                            format!(
                                "cannot set metadata of symlink {} in staging",
                                sys_escape(&path)
                            )
                        });
                    }
                    ctx.owner_failures.fetch_add(1, Ordering::Relaxed);
                    sys::set_symlink_meta(out, &e.name, None, e.meta.mtime.pair())?;
                }
                ctx.job.reporter.advance(0);
            }
            Node::File(f) => {
                if let Some(g) = f.group {
                    if ctx.leaders.get(&g).is_some_and(|l| *l != path) {
                        return Ok(()); // a follower: linked in the second pass
                    }
                }
                let reused = f.reuse
                    && live.is_some_and(|l| {
                        reuse(l, out, &e.name, &e.meta, ctx.job.caps.granularity_ns)
                            .unwrap_or(false)
                    });
                if reused {
                    ctx.reused.fetch_add(1, Ordering::Relaxed);
                    ctx.job.reporter.advance(0);
                    return Ok(());
                }
                let i = f.src as usize;
                let src = srcs[i].expect("a file's source directory is open");
                let label = &ctx.job.labels[i];
                let hash = copy_file(ctx, src, out, &e.name, &e.meta, f, &display(label, &path))?;
                f.hash = Some(hash);
                f.reuse = false;
                ctx.copied.fetch_add(1, Ordering::Relaxed);
                ctx.copied_bytes.fetch_add(e.meta.size, Ordering::Relaxed);
                ctx.job.reporter.advance(e.meta.size);
            }
        }
        Ok(())
    })
}

fn sys_escape(p: &[u8]) -> String {
    crate::report::escape(p)
}

/// Hardlink `name` from the live generation, then check what was linked:
/// a regular file with the expected size, mode and mtime. Anything else (a
/// symlink swapped in, a file edited in place) is unlinked and `false`
/// returned, so the caller copies from the source instead.
fn reuse(
    live: BorrowedFd<'_>,
    out: BorrowedFd<'_>,
    name: &[u8],
    meta: &Meta,
    granularity_ns: u64,
) -> io::Result<bool> {
    if sys::link_at(live, name, out, name).is_err() {
        return Ok(false);
    }
    let st = sys::stat_at(out, name)?;
    let ok = sys::kind_of(&st) == sys::StatKind::File
        && st.st_size as u64 == meta.size
        && st.st_mode & 0o7777 == meta.mode
        && crate::plan::mtime_eq(sys::mtime_of(&st).into(), meta.mtime, granularity_ns);
    if !ok {
        sys::unlink_at(out, name)?;
    }
    Ok(ok)
}

fn is_owner_refusal(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EPERM | libc::EINVAL))
}

/// Owner (softly: a refusal is counted), then mode, then times.
fn apply_meta(ctx: &Ctx<'_>, fd: BorrowedFd<'_>, meta: &Meta) -> io::Result<()> {
    let mut owner = ctx.job.owners.then_some((meta.uid, meta.gid));
    if let Some((uid, gid)) = owner {
        if let Ok(st) = sys::fstat(fd) {
            if st.st_uid == uid && st.st_gid == gid {
                owner = None; // already right: save the syscall
            }
        }
    }
    if let Err(e) = sys::set_meta_fd(fd, owner, Some(meta.mode), meta.mtime.pair()) {
        if owner.is_none() || !is_owner_refusal(&e) {
            return Err(e);
        }
        ctx.owner_failures.fetch_add(1, Ordering::Relaxed);
        sys::set_meta_fd(fd, None, Some(meta.mode), meta.mtime.pair())?;
    }
    Ok(())
}

/// Copy one file into staging, hashing its content; fails if the source
/// changed or vanished while it was copied.
fn copy_file(
    ctx: &Ctx<'_>,
    src_dir: BorrowedFd<'_>,
    out: BorrowedFd<'_>,
    name: &[u8],
    meta: &Meta,
    scanned: &crate::tree::File,
    shown: &str,
) -> Result<[u8; 32]> {
    let src = sys::open_read_at(src_dir, name).with_context(|| format!("cannot read {shown}"))?;
    // Swapped for another file, a FIFO or a device since the scan: do not read it.
    let st = sys::fstat(src.as_fd()).with_context(|| format!("cannot stat {shown}"))?;
    if sys::kind_of(&st) != sys::StatKind::File || st.st_ino != scanned.ino {
        bail!("{shown} changed while being copied; run the sync again once the source is stable");
    }
    sys::pause_point("copy-file");
    let dst = sys::create_excl_at(out, name)
        .with_context(|| format!("cannot create {shown} in staging"))?;
    let copied = if meta.size <= SMALL {
        copy_small(src.as_fd(), dst.as_fd(), meta.size)
    } else {
        copy_large(src.as_fd(), dst.as_fd(), ctx.job.durable)
    };
    // A copy cut short by SIGINT/SIGTERM is an interruption, not an I/O error.
    check_signal()?;
    let (hash, n) = copied.with_context(|| format!("cannot copy {shown} into staging"))?;
    let st = sys::fstat(src.as_fd()).with_context(|| format!("cannot stat {shown}"))?;
    if n != meta.size
        || st.st_size as u64 != meta.size
        || st.st_ino != scanned.ino
        || sys::mtime_of(&st) != meta.mtime.pair()
        || sys::ctime_of(&st) != scanned.ctime
    {
        bail!("{shown} changed while being copied; run the sync again once the source is stable");
    }
    // A new file is ours already: chown only when the owner differs.
    let owner = (ctx.job.owners && (meta.uid, meta.gid) != (sys::euid(), sys::egid()))
        .then_some((meta.uid, meta.gid));
    if let Err(e) = sys::set_meta_fd(
        dst.as_fd(),
        owner,
        (meta.mode != 0o600 || owner.is_some()).then_some(meta.mode),
        meta.mtime.pair(),
    ) {
        if owner.is_none() || !is_owner_refusal(&e) {
            return Err(e).with_context(|| format!("cannot set metadata of {shown} in staging"));
        }
        ctx.owner_failures.fetch_add(1, Ordering::Relaxed);
        sys::set_meta_fd(dst.as_fd(), None, Some(meta.mode), meta.mtime.pair())?;
    }
    ctx.flush(dst.as_fd())
        .with_context(|| format!("cannot flush {shown} in staging"))?;
    sys::crash_point("copied-file");
    Ok(hash)
}

fn copy_small(src: BorrowedFd<'_>, dst: BorrowedFd<'_>, size: u64) -> io::Result<([u8; 32], u64)> {
    BUF.with(|b| {
        let mut buf = b.borrow_mut();
        let cap = (size as usize).min(BUF_MAX);
        if buf.len() < cap {
            buf.resize(cap, 0);
        }
        // Up to BUF_MAX: one read and one write. Never more than `size`: a
        // file that grew meanwhile is caught by the caller's check.
        let mut h = Sha256::new();
        let mut total = 0u64;
        while total < size {
            let want = ((size - total) as usize).min(cap);
            let mut got = 0;
            while got < want {
                let n = sys::read(src, &mut buf[got..want])?;
                if n == 0 {
                    break;
                }
                got += n;
            }
            h.update(&buf[..got]);
            sys::write_all(dst, &buf[..got])?;
            total += got as u64;
            if got < want {
                break;
            }
        }
        Ok((h.finalize().into(), total))
    })
}

/// Large files: reflink where the filesystem can (then only the hash reads
/// the data), else copy_file_range (no bytes through user space) a chunk at
/// a time, hashing each chunk from the page cache right after; read/write
/// where the kernel offers neither. A durable sync starts each chunk's
/// writeback at once, so that the final flush finds little left to write and
/// the disk works while the next chunk is read and hashed.
fn copy_large(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    durable: bool,
) -> io::Result<([u8; 32], u64)> {
    BUF.with(|b| {
        let mut buf = b.borrow_mut();
        if buf.len() < BUF_MAX {
            buf.resize(BUF_MAX, 0);
        }
        copy_large_with(src, dst, durable, &mut buf[..BUF_MAX])
    })
}

/// `copy_large` with the thread's buffer.
fn copy_large_with(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    durable: bool,
    buf: &mut [u8],
) -> io::Result<([u8; 32], u64)> {
    let mut h = Sha256::new();
    if sys::ficlone(dst, src).is_ok() {
        let size = sys::fstat(src)?.st_size as u64;
        let n = hash_range(src, &mut h, buf, 0, u64::MAX)?;
        if n != size {
            return Err(io::Error::other("source size changed during copy"));
        }
        return Ok((h.finalize().into(), n));
    }
    let mut copied = 0u64;
    loop {
        match sys::copy_range(src, dst, CHUNK as usize) {
            Ok(0) => return Ok((h.finalize().into(), copied)),
            Ok(n) => {
                let n = n as u64;
                if durable {
                    sys::start_writeback(dst, copied, n);
                }
                if hash_range(src, &mut h, buf, copied, n)? != n {
                    return Err(io::Error::other("source size changed during copy"));
                }
                copied += n;
            }
            Err(e) if copied == 0 && sys::is_unsupported(&e) => break,
            Err(e) => return Err(e),
        }
        if sys::signals::pending().is_some() {
            return Err(io::Error::new(io::ErrorKind::Interrupted, "interrupted"));
        }
    }
    let mut written_back = 0u64;
    loop {
        let n = sys::read(src, buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        sys::write_all(dst, &buf[..n])?;
        copied += n as u64;
        if durable && copied - written_back >= CHUNK {
            sys::start_writeback(dst, written_back, copied - written_back);
            written_back = copied;
        }
        if sys::signals::pending().is_some() {
            return Err(io::Error::new(io::ErrorKind::Interrupted, "interrupted"));
        }
    }
    Ok((h.finalize().into(), copied))
}

/// Hash `len` bytes of `fd` from `off` (fewer at end of file); the bytes read.
fn hash_range(
    fd: BorrowedFd<'_>,
    h: &mut Sha256,
    buf: &mut [u8],
    off: u64,
    len: u64,
) -> io::Result<u64> {
    let mut done = 0u64;
    while done < len {
        let want = (len - done).min(buf.len() as u64) as usize;
        let n = sys::pread(fd, &mut buf[..want], off + done)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        done += n as u64;
    }
    Ok(done)
}

/// Second pass: link every hardlink follower to its leader, then set the
/// metadata of the directories that hold followers (linking changed their mtime).
fn link_followers(ctx: &Ctx<'_>, tree: &Tree, out: BorrowedFd<'_>) -> Result<()> {
    if ctx.late_dirs.is_empty() {
        return Ok(());
    }
    let mut dirs: Vec<&Vec<u8>> = ctx.late_dirs.iter().collect();
    dirs.sort();
    for dir in dirs {
        let (entries, meta) =
            find_dir(tree, dir).context("hardlink directory vanished from the plan")?;
        let dfd = open_path(out, dir)?;
        for e in entries {
            if let Node::File(f) = &e.node {
                let Some(g) = f.group else { continue };
                let leader = &ctx.leaders[&g];
                let path = join(dir, &e.name);
                if *leader == path {
                    continue;
                }
                let (ldir, lname) = leader.rsplit_once_byte(b'/').unwrap_or((&[], leader));
                let lfd = open_path(out, ldir)?;
                sys::link_at(lfd.as_fd(), lname, dfd.as_fd(), &e.name).with_context(|| {
                    format!(
                        "cannot hardlink {} to {} in staging",
                        sys_escape(&path),
                        sys_escape(leader)
                    )
                })?;
                ctx.job.reporter.advance(0);
            }
        }
        if !dir.is_empty() {
            apply_meta(ctx, dfd.as_fd(), &meta)
                .with_context(|| format!("cannot set metadata of staged {}", sys_escape(dir)))?;
        }
        ctx.flush(dfd.as_fd())
            .with_context(|| format!("cannot flush staged directory {}", sys_escape(dir)))?;
    }
    Ok(())
}

fn find_dir<'t>(tree: &'t Tree, path: &[u8]) -> Option<(&'t [Entry], Meta)> {
    let mut entries = &tree.entries[..];
    let mut meta = tree.root;
    if path.is_empty() {
        return Some((entries, meta));
    }
    for part in path.split(|&b| b == b'/') {
        let i = entries.binary_search_by(|e| (*e.name).cmp(part)).ok()?;
        match &entries[i].node {
            Node::Dir(d) => {
                meta = entries[i].meta;
                entries = &d.entries;
            }
            _ => return None,
        }
    }
    Some((entries, meta))
}

/// Open a staged directory by walking its components without following links.
fn open_path(root: BorrowedFd<'_>, path: &[u8]) -> Result<OwnedFd> {
    let mut fd = sys::open_dir_at(root, b".")?;
    if path.is_empty() {
        return Ok(fd);
    }
    for part in path.split(|&b| b == b'/') {
        fd = sys::open_dir_at(fd.as_fd(), part)
            .with_context(|| format!("cannot open staged {}", sys_escape(path)))?;
    }
    Ok(fd)
}
