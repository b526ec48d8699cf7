//! Stage: build the new tree inside this writer's private staging directory.
//! `run` stages a planned `Tree`; `stream` stages a first sync a directory
//! at a time, straight from the sources, writing the manifest's lines as it
//! goes, so that no whole tree is held.
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
//! through the handle that wrote it (`caps::Flush`; nothing at all under
//! `--no-fsync`). Sources are read through their directory handles where
//! they have them (`source::Source::root`), each file by one name; a
//! source that owns its files (a spool: `Source::owns_root`) has them
//! moved into the staged tree instead of copied. A long copy refreshes the staging
//! directory's mtime every `HEARTBEAT` so that writers on other hosts do not
//! take it for a dead writer's (see `retire`).

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use anyhow::{Context, Result};
use rayon::prelude::*;
use sha2::{Digest, Sha256};

use crate::caps::{Caps, Flush};
use crate::error::check_signal;
use crate::escape::{c_style, display};
pub use crate::plan::Drifted;
use crate::report::Reporter;
use crate::source::{self, Source};
use crate::sys::{self, DirFd};
use crate::tree::join;
use crate::tree::{Entry, Meta, Node, Tree};
use crate::walk::{Sub, Visit, Visited};

/// What the stage needs besides the tree.
pub struct Job<'a> {
    /// Every SOURCE, in order (an entry's `src` indexes it).
    pub sources: &'a [&'a dyn Source],
    /// The live generation's root, to hardlink unchanged files from.
    pub live: Option<&'a DirFd>,
    /// Set owners from the tree (root or `--chown`).
    pub owners: bool,
    pub reporter: &'a dyn Reporter,
    /// What the destination volume can do (probed in staging), and what
    /// the sync flushes (`caps.flush`: nothing with `--no-fsync`).
    pub caps: Caps,
    /// This writer's staging directory, whose mtime is its heartbeat.
    pub heartbeat: Option<&'a DirFd>,
}

#[derive(Debug)]
pub struct Staged {
    /// The staged tree (`tree` in the staging directory), for `--verify`.
    pub tree: DirFd,
    pub copied: u64,
    pub copied_bytes: u64,
    pub reused: u64,
    /// Owners the volume refused to set (not root, root_squash).
    pub owner_failures: u64,
    /// Extended attributes the volume refused, and the first refusal
    /// (the attribute's name and why).
    pub xattr_failures: u64,
    pub first_xattr_failure: Option<(Vec<u8>, io::Error)>,
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
    xattr_failures: AtomicU64,
    first_xattr_failure: std::sync::Mutex<Option<(Vec<u8>, io::Error)>>,
    start: std::time::Instant,
    /// Seconds after `start` of the last heartbeat.
    last_beat: AtomicU64,
}

impl<'a> Ctx<'a> {
    fn new(job: &'a Job<'a>) -> Ctx<'a> {
        Ctx {
            job,
            leaders: HashMap::new(),
            late_dirs: HashSet::new(),
            copied: AtomicU64::new(0),
            copied_bytes: AtomicU64::new(0),
            reused: AtomicU64::new(0),
            owner_failures: AtomicU64::new(0),
            xattr_failures: AtomicU64::new(0),
            first_xattr_failure: Default::default(),
            start: std::time::Instant::now(),
            last_beat: AtomicU64::new(0),
        }
    }

    /// Refresh the staging directory's mtime if `HEARTBEAT` has passed.
    fn beat(&self) {
        let Some(dir) = self.job.heartbeat else {
            return;
        };
        let now = self.start.elapsed().as_secs();
        let last = self.last_beat.load(Ordering::Relaxed);
        if now >= last + crate::staging::HEARTBEAT.as_secs()
            && self
                .last_beat
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let _ = dir.touch_self();
        }
    }

    /// Flush what was written through `fd`, where `syncfs` would not (and
    /// never under `--no-fsync`: see `caps::Flush`).
    fn flush(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        if self.job.caps.flush == Flush::EachFile {
            sys::fsync(fd)?;
        }
        Ok(())
    }

    /// What was staged into `out`, as counted.
    fn staged(self, out: DirFd) -> Staged {
        Staged {
            tree: out,
            copied: self.copied.into_inner(),
            copied_bytes: self.copied_bytes.into_inner(),
            reused: self.reused.into_inner(),
            owner_failures: self.owner_failures.into_inner(),
            xattr_failures: self.xattr_failures.into_inner(),
            first_xattr_failure: self
                .first_xattr_failure
                .into_inner()
                .unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// A refused owner is counted, not fatal.
    fn owner_refused(&self) {
        self.owner_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// An extended attribute the volume cannot keep is counted, not fatal.
    fn xattr_refused(&self, name: Vec<u8>, err: io::Error) {
        if self.xattr_failures.fetch_add(1, Ordering::Relaxed) == 0 {
            *self
                .first_xattr_failure
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some((name, err));
        }
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

/// The new directory `tree` inside `staging` (this writer's empty staging
/// directory), where the tree is staged.
fn staged_root(staging: &DirFd) -> Result<DirFd> {
    staging
        .mkdir(b"tree", 0o700)
        .context("cannot create the staging tree")?;
    staging
        .open_dir(b"tree")
        .context("cannot open the staging tree")
}

/// Stage `tree` into a new directory `tree` inside `staging` (this
/// writer's empty staging directory).
pub fn run(job: &Job<'_>, tree: &mut Tree, staging: &DirFd) -> Result<Staged> {
    sys::pause_point("staging");
    let out = staged_root(staging)?;
    let mut ctx = Ctx::new(job);
    // (follower, leader) of every later path of a hardlink group.
    let mut links: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
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
                        links.push((path.to_vec(), leader.clone()));
                    }
                } else {
                    ctx.leaders.insert(g, path.to_vec());
                }
            }
        }
    });
    let srcs: Vec<Option<&DirFd>> = job
        .sources
        .iter()
        .enumerate()
        .map(|(i, s)| s.root().filter(|_| tree.root_srcs & (1 << i) != 0))
        .collect();
    copy_dir(&ctx, &mut tree.entries, &srcs, job.live, &out, &[])?;
    // Every later path of a group counts as its first path went (linked
    // from the live generation, or copied), path by path as the plan and
    // the streamed stage count.
    let mut went: HashMap<&[u8], (bool, u64)> = HashMap::new();
    // One more pass over the tree, only where it holds a group.
    if !links.is_empty() {
        tree.for_each(&mut |path, e| {
            if let Node::File(f) = &e.node {
                if let Some(leader) = f.group.and_then(|g| ctx.leaders.get(&g)) {
                    if leader.as_slice() == path {
                        went.insert(leader.as_slice(), (f.reuse, e.meta.size));
                    }
                }
            }
        });
    }
    for (_, leader) in &links {
        match went.get(leader.as_slice()) {
            Some(&(true, _)) => _ = ctx.reused.fetch_add(1, Ordering::Relaxed),
            Some(&(false, size)) => {
                ctx.copied.fetch_add(1, Ordering::Relaxed);
                ctx.copied_bytes.fetch_add(size, Ordering::Relaxed);
            }
            None => {}
        }
    }
    drop(went);
    // The root is finished below, as every sync finishes it.
    let mut late = Vec::with_capacity(ctx.late_dirs.len());
    for dir in ctx.late_dirs.iter().filter(|d| !d.is_empty()) {
        let meta = find_dir(tree, dir).context("hardlink directory vanished from the plan")?;
        late.push((dir.clone(), meta));
    }
    link_followers(&ctx, &out, &links, late)?;
    apply_meta(&ctx, out.as_fd(), &tree.root).context("cannot set metadata of the staged root")?;
    ctx.flush(out.as_fd())
        .context("cannot flush the staged root to disk (nothing was published)")?;
    Ok(ctx.staged(out))
}

/// What a streamed stage works from besides its `Job`: the sources are
/// read a directory at a time (each with a `root`), as `scan` would give
/// them, never into a whole `Tree`.
pub struct Stream<'a> {
    pub job: &'a Job<'a>,
    pub filter: &'a crate::filter::Filter,
    /// Owners and modes as the sync gives them, applied to every entry.
    pub adjust: &'a (dyn Fn(&mut Meta, crate::tree::Kind) + Sync),
    /// The root's metadata, adjusted.
    pub root: Meta,
    /// An update: what the live tree (its root is `job.live`) holds, a
    /// directory at a time, and how its entries are compared with the
    /// sources'.
    pub against: Option<(Against<'a>, crate::plan::Compare)>,
    /// `--checksum`: a file is hardlinked from the live generation only
    /// where its bytes and the source's have the same SHA-256, both read
    /// now (`checked_link`).
    pub checksum: bool,
    /// Files `verify` found damaged in the live generation: compared as
    /// changed, so copied afresh.
    pub damaged: Option<&'a crate::damage::Damaged>,
    /// What an earlier stage of this round found drifted in the live
    /// tree's hardlinks: those live files are not linked from, but copied.
    pub avoid: Option<&'a Drifted>,
}

/// What a streamed update reads the live tree's entries from.
pub enum Against<'a> {
    /// The live generation's manifest, by its index: a file recorded with
    /// the source's metadata is hardlinked from the live generation.
    Recorded(&'a crate::index::Index),
    /// The live tree's own listing, where there is no manifest to read,
    /// under `--checksum`: a file equal by its listed metadata is
    /// hardlinked where its bytes and the source's are the same
    /// (`checked_link`), as the whole-tree path reuses such files.
    /// `label` names the live tree in messages; `shared`: the inodes, by
    /// (device, inode), that two of its paths or more are on, sorted (its
    /// groups, from the plan made first: `scan::Surveyed::shared`). A
    /// round staged so is counted as that plan counted it.
    Listed {
        label: &'a str,
        shared: &'a [(u64, u64)],
    },
}

/// The live tree's entries in the directory at `rel` (`live`, where it is
/// still there), by its own listing (`Against::Listed`): each file of more
/// than one link on an inode `shared` names gets that inode's group. What
/// the listing would warn of was said by the plan made first.
fn listed(
    live: Option<&DirFd>,
    rel: &[u8],
    label: &str,
    shared: &[(u64, u64)],
) -> Result<Vec<Entry>> {
    let Some(dir) = live else {
        return Ok(Vec::new());
    };
    let quiet = crate::report::Collected::default();
    let filter = crate::filter::Filter::default();
    let mut entries = source::Dir::list(dir, rel, label, 0, &filter, &quiet)?;
    for e in entries.iter_mut() {
        if let Node::File(f) = &mut e.node {
            f.group = shared
                .binary_search(&(f.dev, f.ino))
                .ok()
                .filter(|_| f.nlink > 1)
                .map(|i| i as u32);
        }
    }
    Ok(entries)
}

/// Why a streamed stage stopped short of a tree to publish.
#[derive(Debug)]
pub enum Redo {
    /// The live tree's hardlinks are not its manifest's: staged again
    /// avoiding what drifted (`Stream::avoid`), the rest is still linked.
    Links(Drifted),
    /// A file a spool lists from the live generation was not as recorded
    /// there: the spool has no bytes for it.
    Lent,
}

/// What `stream` staged, and the manifest body it wrote.
pub struct Streamed {
    pub staged: Staged,
    /// `body` in the staging directory: the manifest's entry lines.
    pub body: crate::manifest::Spooled,
    /// Against the live generation's manifest (all added on a first sync).
    pub changes: Changes,
    /// Some entry (the root included) carries extended attributes: the
    /// manifest's header says so (`xattrs 1`), as a whole tree's does.
    pub xattrs: bool,
}

/// Entries added, changed and deleted, counted as `plan` counts them: a
/// deleted directory with everything below it, a file that became a
/// directory as one change (what was below the old one deleted).
#[derive(Debug, Default)]
pub struct Changes {
    pub added: u64,
    pub changed: u64,
    pub deleted: u64,
}

/// Stage a sync a directory at a time, in parallel across directories and
/// files, holding only the directories in progress: each directory is
/// listed, its files copied and hashed, its manifest lines appended to a
/// spool (`lines` in staging, see `manifest::Fragments`), then its
/// subdirectories done. An update (`Stream::recorded`) reads the live
/// manifest's entries of the same directory beside it: a file recorded
/// with the same metadata is hardlinked from the live generation and keeps
/// its recorded hash (checked as `run` checks a reuse), anything else is
/// copied. What is held for the whole tree is one index entry per
/// directory and one map entry per file of more than one link (or in a
/// live hardlink group). Whether such files may be hardlinked from the
/// live generation depends on every path of their inodes on both sides,
/// so the first path of each that may be is placed once every directory
/// is done
/// (`Walker::place_leaders`, deciding and counting as the whole-tree plan
/// does), and the second and later paths are linked to it then, as `run`
/// does. The body is then put in pre-order (`body` in staging) and its
/// digest computed.
///
/// `Redo::Links` when two files hardlinked from the live generation turned
/// out to be one inode (a few bits each tell them apart, and name the ones
/// that were, `distinct::Distinct::collecting`): the live tree joined them
/// after it was published, its manifest records them apart, and the
/// staged tree would carry the join on; or when a recorded group was
/// found on more than one inode. The caller then stages again in a new
/// directory, avoiding what it names (`Stream::avoid`).
pub fn stream(s: &Stream<'_>, staging: &DirFd) -> Result<Result<Streamed, Redo>> {
    let out = staged_root(staging)?;
    let in_stage = |what: &str| format!("cannot write the manifest's {what} in staging");
    let spool = staging
        .create_excl(b"lines")
        .with_context(|| in_stage("lines"))?;
    let spool = crate::manifest::LineSpool::new(spool);
    let mut frags = crate::manifest::Fragments::default();
    if let Some((Against::Recorded(ix), _)) = &s.against {
        let (dirs, path_bytes) = ix.dirs_and_path_bytes();
        frags.index.reserve(dirs, path_bytes);
    }
    let w = Walker {
        s,
        ctx: Ctx::new(s.job),
        spool,
        frags: std::sync::Mutex::new(frags),
        copies: std::sync::Mutex::new(HashMap::new()),
        followers: std::sync::Mutex::new(Vec::new()),
        late: std::sync::Mutex::new(HashMap::new()),
        kept: std::sync::Mutex::new(Vec::new()),
        deferred: std::sync::Mutex::new(Vec::new()),
        reused_inodes: std::sync::Mutex::new(crate::distinct::Distinct::collecting()),
        live_groups: std::sync::Mutex::new(HashMap::new()),
        split: std::sync::Mutex::new(Vec::new()),
        lent_missed: AtomicBool::new(false),
        added: AtomicU64::new(0),
        changed: AtomicU64::new(0),
        deleted: AtomicU64::new(0),
        xattrs: AtomicBool::new(!s.root.xattrs.is_empty()),
    };
    let srcs: Vec<Option<&DirFd>> = s.job.sources.iter().map(|src| src.root()).collect();
    if let Some((Against::Recorded(ix), c)) = &s.against {
        let dir = |meta| Entry {
            name: Default::default(),
            meta,
            node: Node::Dir(Default::default()),
        };
        if !crate::plan::same_entry(&dir(s.root), &dir(ix.root), c) {
            w.changed.fetch_add(1, Ordering::Relaxed);
        }
    }
    let live = s.against.as_ref().and(s.job.live);
    let root = Staging {
        out: out.try_clone().context("cannot open the staged root")?,
        live: live.map(DirFd::try_clone).transpose()?,
        recorded: s.against.is_some(),
    };
    crate::walk::run(&w, s.job.sources, &srcs, &root)?;
    drop(root);
    if !w.lent_missed.load(Ordering::Relaxed) {
        w.place_leaders(&out, live)?;
    }
    // A file a spool lists from the live generation is not as recorded
    // there; or the live tree's hardlinks are not its manifest's (files
    // joined or a group split on the volume since).
    if w.lent_missed.load(Ordering::Relaxed) {
        return Ok(Err(Redo::Lent));
    }
    let joined = std::mem::take(&mut *w.reused_inodes.lock().unwrap()).twice();
    let split = std::mem::take(&mut *w.split.lock().unwrap());
    if !joined.is_empty() || !split.is_empty() {
        return Ok(Err(Redo::Links(Drifted::new(joined, split))));
    }
    w.link_followers(&out)?;
    let ctx = &w.ctx;
    apply_meta(ctx, out.as_fd(), &s.root).context("cannot set metadata of the staged root")?;
    ctx.flush(out.as_fd())
        .context("cannot flush the staged root to disk (nothing was published)")?;

    let mut frags = w.frags.into_inner().unwrap();
    let lines = staging
        .open_read(b"lines")
        .with_context(|| in_stage("lines"))?;
    let body = staging
        .create_excl(b"body")
        .with_context(|| in_stage("body"))?;
    // The `File` only writes the descriptor `sys` created in staging.
    let mut bw = std::io::BufWriter::with_capacity(256 * 1024, std::fs::File::from(body));
    let root = Entry {
        name: Default::default(),
        meta: s.root,
        node: Node::Dir(Default::default()),
    };
    let spooled = crate::manifest::assemble_spool(&root, &mut frags, lines.as_fd(), &mut bw)
        .with_context(|| in_stage("body"))?;
    use std::io::Write;
    bw.flush().with_context(|| in_stage("body"))?;
    drop(bw);
    drop(frags);
    let _ = staging.unlink(b"lines");
    let changes = Changes {
        added: w.added.into_inner(),
        changed: w.changed.into_inner(),
        deleted: w.deleted.into_inner(),
    };
    let xattrs = w.xattrs.into_inner();
    let ctx = w.ctx;
    Ok(Ok(Streamed {
        changes,
        staged: ctx.staged(out),
        body: spooled,
        xattrs,
    }))
}

/// Whether `f` is a file a spool lists from the live generation
/// (`BORROWED_DEV`), which only a link from there can stage: then `missed`
/// is set (it was not linked) and nothing is copied.
fn lent_from_live(f: &crate::tree::File, missed: &AtomicBool) -> bool {
    let lent = f.dev == crate::source::spool::BORROWED_DEV;
    if lent {
        missed.store(true, Ordering::Relaxed);
    }
    lent
}

/// The state of one `stream`, shared by its threads.
struct Walker<'a> {
    s: &'a Stream<'a>,
    ctx: Ctx<'a>,
    /// The spool of fragments.
    spool: crate::manifest::LineSpool,
    frags: std::sync::Mutex<crate::manifest::Fragments>,
    /// Each multiply-linked source inode → its first path staged.
    copies: std::sync::Mutex<HashMap<crate::manifest::Inode, Leader>>,
    /// (path, inode) of every later link of an inode, linked at the end.
    followers: std::sync::Mutex<Vec<(Vec<u8>, crate::manifest::Inode)>>,
    /// Directories holding such a link or a deferred first path (their
    /// metadata is set after it), by path.
    late: std::sync::Mutex<HashMap<Vec<u8>, Meta>>,
    /// An update: each file kept equal to the live one that is hardlinked
    /// on either side, as (its source inode where it has more than one
    /// link, its live group): whether the hardlinks match is known once
    /// every directory is listed (`place_leaders`).
    kept: std::sync::Mutex<Vec<(Option<crate::manifest::Inode>, Option<u32>)>>,
    /// (path, entry) of the first path of each multiply-linked source
    /// inode that may be hardlinked from the live generation: placed by
    /// `place_leaders`.
    deferred: std::sync::Mutex<Vec<(Vec<u8>, Entry)>>,
    /// The inode of each file hardlinked from the live generation (a
    /// group's first path only: its later links are to the staged copy).
    reused_inodes: std::sync::Mutex<crate::distinct::Distinct>,
    /// Each live hardlink group the manifest records, by the live inode
    /// its first path kept equal was found on: another path of the group
    /// on another inode (split on the volume since) stops the stage.
    live_groups: std::sync::Mutex<HashMap<u32, u64>>,
    /// Each recorded live group found split.
    split: std::sync::Mutex<Vec<u32>>,
    /// A file a spool lists from the live generation (`BORROWED_DEV`)
    /// could not be linked from there (changed on the volume since): the
    /// spool has no bytes for it, and the walk stops.
    lent_missed: AtomicBool,
    added: AtomicU64,
    changed: AtomicU64,
    deleted: AtomicU64,
    /// Some entry written carries extended attributes.
    xattrs: AtomicBool,
}

/// The first path staged of a multiply-linked source inode: its later
/// paths are linked to it.
struct Leader {
    path: Vec<u8>,
    size: u64,
    /// Hardlinked from the live generation (else copied).
    reused: bool,
    /// Kept equal with hardlinks that match, but the live file was not as
    /// recorded (changed on the volume since it was published): copied.
    drifted: bool,
}

/// One directory of a streamed stage: made already in staging (`out`),
/// the live generation's handle on it where it has one, and whether the
/// live manifest lists a directory here (an update).
struct Staging {
    out: DirFd,
    live: Option<DirFd>,
    recorded: bool,
}

impl Visit for Walker<'_> {
    type Dir = Staging;
    /// A subdirectory's metadata, set once its entries are in, and whether
    /// the live manifest has a directory of its name.
    type Keep = (Meta, bool);

    /// Stage the directory at `rel`: `srcs` holds each source's handle on
    /// it, where that source provides it. Its own number: 1 where it holds
    /// an entry linked at the end (its metadata is set then).
    fn visit(
        &self,
        srcs: &[Option<&DirFd>],
        at: &Staging,
        rel: &[u8],
    ) -> Result<Visited<(Meta, bool)>> {
        self.stage_dir(srcs, at, rel)
    }

    fn enter(
        &self,
        at: &Staging,
        keep: &(Meta, bool),
        name: &[u8],
        path: &[u8],
    ) -> Result<Staging> {
        let shown = || c_style(path);
        at.out
            .mkdir(name, 0o700)
            .with_context(|| format!("cannot create directory {} in staging", shown()))?;
        let out = at
            .out
            .open_dir(name)
            .with_context(|| format!("cannot open staged directory {}", shown()))?;
        // Gone or replaced on the volume: nothing to reuse below.
        let was_dir = keep.1;
        let live = at
            .live
            .as_ref()
            .filter(|_| was_dir)
            .and_then(|l| l.open_dir(name).ok());
        Ok(Staging {
            out,
            live,
            recorded: was_dir,
        })
    }

    fn leave(&self, at: Staging, keep: (Meta, bool), path: &[u8], late: u64) -> Result<()> {
        let meta = keep.0;
        if late != 0 {
            self.late.lock().unwrap().insert(path.to_vec(), meta);
        } else {
            let shown = || c_style(path);
            apply_meta(&self.ctx, at.out.as_fd(), &meta)
                .with_context(|| format!("cannot set metadata of staged {}", shown()))?;
            self.ctx
                .flush(at.out.as_fd())
                .with_context(|| format!("cannot flush staged directory {}", shown()))?;
        }
        self.s.job.reporter.advance(0);
        Ok(())
    }

    fn stopped(&self) -> bool {
        self.lent_missed.load(Ordering::Relaxed)
    }
}

impl Walker<'_> {
    /// Whether the live file just hardlinked as `name` in `out`, of inode
    /// `ino`, is not one an earlier stage found joined (`Drifted`): if it
    /// is, the link is undone, and the caller copies.
    fn not_joined(&self, ino: u64, out: &DirFd, name: &[u8]) -> bool {
        let joined = self.s.avoid.is_some_and(|a| a.joined(ino));
        if joined {
            // Where it cannot go, the copy over it says why.
            let _ = out.unlink(name);
        }
        !joined
    }

    /// Stage the directory at `rel` (made already, open as `out`): `srcs`
    /// holds each source's handle on it, where that source provides it;
    /// `live` the live generation's, where it has one; `recorded`: the live
    /// manifest lists a directory here (an update).
    fn stage_dir(
        &self,
        srcs: &[Option<&DirFd>],
        at: &Staging,
        rel: &[u8],
    ) -> Result<Visited<(Meta, bool)>> {
        let (live, recorded, out) = (at.live.as_ref(), at.recorded, &at.out);
        let job = self.s.job;
        let mut entries = source::list_merged(job.sources, srcs, rel, self.s.filter, job.reporter)?;
        if rel.is_empty() {
            // Where `run` pauses: listed (here the top only), nothing copied.
            sys::pause_point("staging");
        }
        for e in entries.iter_mut() {
            let kind = e.kind();
            (self.s.adjust)(&mut e.meta, kind);
        }
        let was_dir = self.against_recorded(srcs, live, rel, recorded, &mut entries)?;
        let holds_follower = std::sync::atomic::AtomicBool::new(false);
        // Files and symlinks first (their hashes go into the fragment).
        entries.par_iter_mut().try_for_each(|e| -> Result<()> {
            check_signal()?;
            self.ctx.beat();
            let path = join(rel, &e.name);
            let bytes = match &e.node {
                Node::Dir(_) => return Ok(()),
                Node::Symlink(_) => stage_symlink(&self.ctx, e, out, &path).map(|()| 0)?,
                Node::File(f) => {
                    // An inode of more than one link: its first path is
                    // staged here (copied, or left for `place_leaders`
                    // where it may be hardlinked from the live
                    // generation), its others linked to it at the end;
                    // all are counted once the first is placed.
                    if f.nlink > 1 {
                        let key = (f.dev, f.ino);
                        *self.frags.lock().unwrap().links.entry(key).or_default() += 1;
                        let mut copies = self.copies.lock().unwrap();
                        if copies.contains_key(&key) {
                            drop(copies);
                            self.followers.lock().unwrap().push((path, key));
                            holds_follower.store(true, Ordering::Relaxed);
                            return Ok(());
                        }
                        let leader = Leader {
                            path: path.clone(),
                            size: e.meta.size,
                            reused: false,
                            drifted: false,
                        };
                        copies.insert(key, leader);
                        drop(copies);
                        if f.reuse {
                            self.deferred.lock().unwrap().push((path, e.clone()));
                            holds_follower.store(true, Ordering::Relaxed);
                            return Ok(());
                        }
                    }
                    let granularity = self.ctx.job.caps.granularity_ns;
                    let owners = job.owners;
                    let i = f.src as usize;
                    let linked = match live.filter(|_| f.reuse) {
                        Some(l) => reuse(l, out, &e.name, &e.meta, granularity, owners)
                            .ok()
                            .flatten()
                            .filter(|&ino| self.not_joined(ino, out, &e.name)),
                        None => None,
                    };
                    let reused = match linked {
                        Some(ino) if self.s.checksum => {
                            checked_link(&self.ctx, i, srcs[i], out, e, &path)?.map(|h| (ino, h))
                        }
                        Some(ino) => Some((ino, f.hash.expect("recorded"))),
                        None => None,
                    };
                    let (hash, bytes) = if let Some((ino, hash)) = reused {
                        self.reused_inodes.lock().unwrap().insert(ino);
                        self.ctx.reused.fetch_add(1, Ordering::Relaxed);
                        (hash, 0)
                    } else {
                        if lent_from_live(f, &self.lent_missed) {
                            return Ok(());
                        }
                        if f.reuse {
                            // Changed on the volume since it was published.
                            self.changed.fetch_add(1, Ordering::Relaxed);
                        }
                        let (hash, shown) = fetch_file(&self.ctx, i, srcs[i], out, e, &path)?;
                        if f.nlink <= 1 {
                            self.ctx.copied.fetch_add(1, Ordering::Relaxed);
                            self.ctx
                                .copied_bytes
                                .fetch_add(e.meta.size, Ordering::Relaxed);
                        }
                        (hash, e.meta.size - shown)
                    };
                    if let Node::File(f) = &mut e.node {
                        f.hash = Some(hash);
                        f.reuse = false;
                        if f.nlink > 1 {
                            let key = (f.dev, f.ino);
                            self.frags.lock().unwrap().hashes.insert(key, hash);
                        }
                    }
                    bytes
                }
            };
            job.reporter.advance(bytes);
            Ok(())
        })?;
        self.fragment(rel, &entries)?;
        // Then the subdirectories, holding only their names, sources and metadata.
        let subdirs = entries
            .into_iter()
            .zip(was_dir)
            .filter_map(|(e, was_dir)| match e.node {
                Node::Dir(d) => Some(Sub {
                    name: e.name,
                    srcs: d.srcs,
                    keep: (e.meta, was_dir),
                }),
                _ => None,
            })
            .collect();
        Ok((u64::from(holds_follower.into_inner()), subdirs))
    }

    /// An update: compare one directory's entries with the live manifest's
    /// (`recorded`: it lists this directory), name by name. Count what was
    /// added, changed and deleted; mark each file recorded with the same
    /// metadata and a hash for reuse (`File::reuse`, the recorded hash
    /// with it). Returns, per entry, whether the live manifest has a
    /// directory of that name (its entries are compared when the walk
    /// gets there).
    fn against_recorded(
        &self,
        srcs: &[Option<&DirFd>],
        live_dir: Option<&DirFd>,
        rel: &[u8],
        recorded: bool,
        entries: &mut [Entry],
    ) -> Result<Vec<bool>> {
        let mut was_dir = vec![false; entries.len()];
        let Some((side, c)) = self.s.against.as_ref().filter(|_| recorded) else {
            self.added
                .fetch_add(entries.len() as u64, Ordering::Relaxed);
            return Ok(was_dir);
        };
        let (mut live, ix) = match side {
            Against::Recorded(ix) => (ix.entries(rel)?, Some(*ix)),
            Against::Listed { label, shared } => (listed(live_dir, rel, label, shared)?, None),
        };
        if let Some(d) = self.s.damaged {
            for e in live.iter_mut() {
                d.forget(&join(rel, &e.name), e);
            }
        }
        // Where only content tells (`--set-mtime`), read the candidates first.
        crate::scan::hash_by_content(self.s.job.sources, srcs, rel, entries, &live, c)?;
        let (mut added, mut changed, mut deleted) = (0, 0, 0);
        let mut kept = Vec::new();
        let mut grouped = Vec::new();
        let mut i = 0;
        crate::index::pair(entries, &live, |e, l| {
            // A listing's deletions are counted by the plan made first.
            match (l, ix) {
                (Some(l), Some(ix)) => deleted += ix.gone(rel, l, e.as_deref()),
                (Some(_), None) => deleted += u64::from(e.is_none()),
                (None, _) => {}
            }
            let Some(e) = e else { return };
            i += 1;
            let Some(l) = l else {
                added += 1;
                return;
            };
            if l.kind() != e.kind() {
                changed += 1;
                return;
            }
            // A streamed source's file is the live one only by its content.
            let same = crate::plan::same_entry(e, l, c) && crate::plan::same_content(e, l, c);
            changed += u64::from(!same);
            // A path of a live group found split: a change, copied.
            if let (true, Node::File(lf)) = (same, &l.node) {
                if lf
                    .group
                    .is_some_and(|g| self.s.avoid.is_some_and(|a| a.split(g)))
                {
                    changed += 1;
                    return;
                }
            }
            match (&mut e.node, &l.node) {
                (Node::Dir(_), Node::Dir(_)) => was_dir[i - 1] = true,
                (Node::File(f), Node::File(lf)) if same => {
                    let inode = (f.nlink > 1).then_some((f.dev, f.ino));
                    if inode.is_some() || lf.group.is_some() {
                        kept.push((inode, lf.group));
                    }
                    if let Some(g) = lf.group {
                        grouped.push((e.name.clone(), g));
                    }
                    // A file of one link never takes a live file that has
                    // others (the two would share an inode in the new
                    // tree): equal but for the inodes it shares, a change
                    // of hardlinks (`plan::broken_links` finds it so).
                    // Files of more than one link are decided once every
                    // directory is listed (`place_leaders`).
                    let apart = inode.is_none() && lf.group.is_some();
                    changed += u64::from(apart);
                    // A listed file's bytes are read as it is linked.
                    f.reuse = (lf.hash.is_some() || ix.is_none()) && !apart;
                    // A spooled file keeps the hash its stream gave where
                    // it is not taken from the live generation (nor read
                    // from a listed one as it is linked).
                    if f.reuse && ix.is_some() {
                        f.hash = lf.hash;
                    }
                }
                _ => {}
            }
        });
        if !kept.is_empty() {
            self.kept.lock().unwrap().append(&mut kept);
        }
        // Each path of a recorded live group kept equal must still be on
        // the group's one inode (a file replaced on the volume is not),
        // where the volume shows hardlinks: else the groups are only the
        // manifest's.
        // (A listing's groups are its inodes: none is split.)
        let recorded_groups = c.hardlinks && ix.is_some();
        if let (false, Some(dir), true) = (grouped.is_empty(), live_dir, recorded_groups) {
            let mut groups = self.live_groups.lock().unwrap();
            for (name, g) in grouped {
                // A path gone from the volume is copied, as any file the
                // stage cannot link: it splits nothing it would reuse.
                let Ok(st) = dir.stat(&name) else { continue };
                if *groups.entry(g).or_insert(st.st_ino) != st.st_ino {
                    self.split.lock().unwrap().push(g);
                }
            }
        }
        self.added.fetch_add(added, Ordering::Relaxed);
        self.changed.fetch_add(changed, Ordering::Relaxed);
        self.deleted.fetch_add(deleted, Ordering::Relaxed);
        Ok(was_dir)
    }

    /// Once every directory is listed: whether the hardlinks of the files
    /// kept equal match the live tree's (`plan::broken_links`, as the
    /// whole-tree plan decides), then the first path of each
    /// multiply-linked source inode left for now (`deferred`) hardlinked
    /// from the live generation where they do (and the link checks out,
    /// as `run` checks a reuse), copied where not. Every path of such an
    /// inode is then counted as the whole-tree plan counts it, path by
    /// path: each reused, or each copied with its bytes; each path kept
    /// equal whose hardlinks do not match a change.
    fn place_leaders(&self, out: &DirFd, live: Option<&DirFd>) -> Result<()> {
        use crate::manifest::Inode;
        let kept = std::mem::take(&mut *self.kept.lock().unwrap());
        let paths = |k: &Inode| -> u64 {
            let frags = self.frags.lock().unwrap();
            frags.links.get(k).map_or(0, |&n| n.into())
        };
        // A source group is an inode with more than one path in the tree.
        let groups: Vec<crate::plan::Kept<Inode>> = kept
            .iter()
            .map(|&(inode, lg)| (inode.filter(|k| paths(k) > 1), lg, inode))
            .collect();
        let broken_flags = crate::plan::broken_links(&groups, |k| paths(k) as usize);
        drop(groups);
        // Source inode → its paths kept whose hardlinks do not match (a
        // file of one link taking a live group's inode was counted already).
        let mut broken: HashMap<Inode, u64> = HashMap::new();
        for ((inode, _), b) in kept.iter().zip(broken_flags) {
            if let (Some(k), true) = (inode, b) {
                *broken.entry(*k).or_default() += 1;
            }
        }
        drop(kept);
        let deferred = std::mem::take(&mut *self.deferred.lock().unwrap());
        let job = self.s.job;
        deferred
            .par_iter()
            .try_for_each(|(path, e)| -> Result<()> {
                check_signal()?;
                self.ctx.beat();
                let Node::File(f) = &e.node else {
                    unreachable!("only files are deferred")
                };
                let key = (f.dev, f.ino);
                let (dir, _) = path.rsplit_once_byte(b'/').unwrap_or((&[], path));
                let dfd = open_staged(out, dir)?;
                let matches = !broken.contains_key(&key);
                let granularity = job.caps.granularity_ns;
                let i = f.src as usize;
                let linked = live
                    .filter(|_| matches)
                    .and_then(|l| l.open_beneath(dir).ok())
                    .and_then(|l| reuse(&l, &dfd, &e.name, &e.meta, granularity, job.owners).ok())
                    .flatten()
                    .filter(|&ino| self.not_joined(ino, &dfd, &e.name));
                let checked = match linked {
                    Some(ino) if self.s.checksum => {
                        checked_link(&self.ctx, i, None, &dfd, e, path)?.map(|h| (ino, h))
                    }
                    Some(ino) => Some((ino, f.hash.expect("recorded"))),
                    None => None,
                };
                let reused = checked.is_some();
                let (hash, bytes) = match checked {
                    Some((ino, hash)) => {
                        self.reused_inodes.lock().unwrap().insert(ino);
                        (hash, 0)
                    }
                    None if lent_from_live(f, &self.lent_missed) => return Ok(()),
                    None => {
                        let (hash, shown) = copy_file(&self.ctx, i, None, &dfd, e, path)?;
                        (hash, e.meta.size - shown)
                    }
                };
                self.frags.lock().unwrap().hashes.insert(key, hash);
                if let Some(leader) = self.copies.lock().unwrap().get_mut(&key) {
                    leader.reused = reused;
                    leader.drifted = matches && !reused;
                }
                job.reporter.advance(bytes);
                Ok(())
            })?;
        let (mut reused, mut copied, mut copied_bytes, mut changed) = (0, 0, 0, 0);
        for (key, leader) in self.copies.lock().unwrap().iter() {
            let n = paths(key);
            if leader.reused {
                reused += n;
            } else {
                copied += n;
                copied_bytes += n * leader.size;
            }
            changed += broken.get(key).copied().unwrap_or(0);
            if leader.drifted {
                changed += n;
            }
        }
        self.ctx.reused.fetch_add(reused, Ordering::Relaxed);
        self.ctx.copied.fetch_add(copied, Ordering::Relaxed);
        self.ctx
            .copied_bytes
            .fetch_add(copied_bytes, Ordering::Relaxed);
        self.changed.fetch_add(changed, Ordering::Relaxed);
        Ok(())
    }

    /// Append the manifest lines of one directory's entries to the spool.
    fn fragment(&self, rel: &[u8], entries: &[Entry]) -> Result<()> {
        if entries.iter().any(|e| !e.meta.xattrs.is_empty()) {
            self.xattrs.store(true, Ordering::Relaxed);
        }
        let text = crate::manifest::fragment_text(rel, entries, true);
        self.spool
            .append(&self.frags, rel, &text)
            .context("cannot write the manifest's lines in staging")
    }

    /// Link every later link of an inode to its first path, then set the
    /// metadata of the directories that hold one (`link_followers`).
    fn link_followers(&self, out: &DirFd) -> Result<()> {
        let followers = std::mem::take(&mut *self.followers.lock().unwrap());
        let copies = self.copies.lock().unwrap();
        let links: Vec<(Vec<u8>, Vec<u8>)> = followers
            .into_iter()
            .map(|(path, key)| (path, copies[&key].path.clone()))
            .collect();
        drop(copies);
        let late: Vec<(Vec<u8>, Meta)> = self.late.lock().unwrap().drain().collect();
        link_followers(&self.ctx, out, &links, late)
    }
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

/// Stage the entries of one directory (in parallel): `srcs` holds each
/// source's handle on it, `live` the live generation's, `out` the staged one.
fn copy_dir(
    ctx: &Ctx<'_>,
    entries: &mut [Entry],
    srcs: &[Option<&DirFd>],
    live: Option<&DirFd>,
    out: &DirFd,
    rel: &[u8],
) -> Result<()> {
    entries.par_iter_mut().try_for_each(|e| -> Result<()> {
        check_signal()?;
        ctx.beat();
        let path = join(rel, &e.name);
        let bytes = match &e.node {
            Node::Dir(_) => stage_dir(ctx, e, srcs, live, out, &path).map(|()| 0)?,
            Node::Symlink(_) => stage_symlink(ctx, e, out, &path).map(|()| 0)?,
            Node::File(_) => match stage_file(ctx, e, srcs, live, out, &path)? {
                Some(bytes) => bytes,
                None => return Ok(()), // a hardlink follower: linked in the second pass
            },
        };
        ctx.job.reporter.advance(bytes);
        Ok(())
    })
}

/// A directory: made private, filled, then given its metadata (unless it
/// holds a hardlink follower: the second pass finishes it).
fn stage_dir(
    ctx: &Ctx<'_>,
    e: &mut Entry,
    srcs: &[Option<&DirFd>],
    live: Option<&DirFd>,
    out: &DirFd,
    path: &[u8],
) -> Result<()> {
    let Node::Dir(d) = &mut e.node else {
        unreachable!("stage_dir is given directories")
    };
    let shown = || c_style(path);
    out.mkdir(&e.name, 0o700)
        .with_context(|| format!("cannot create directory {} in staging", shown()))?;
    let sub_out = out
        .open_dir(&e.name)
        .with_context(|| format!("cannot open staged directory {}", shown()))?;
    let sub_srcs = source::open_dirs(ctx.job.sources, srcs, d.srcs, &e.name, path)?;
    // The live side is only a place to link from: if it is not a directory now, there is nothing to reuse.
    let sub_live = live.and_then(|l| l.open_dir(&e.name).ok());
    copy_dir(
        ctx,
        &mut d.entries,
        &source::borrow(&sub_srcs),
        sub_live.as_ref(),
        &sub_out,
        path,
    )?;
    if !ctx.late_dirs.contains(path) {
        apply_meta(ctx, sub_out.as_fd(), &e.meta)
            .with_context(|| format!("cannot set metadata of staged {}", shown()))?;
        ctx.flush(sub_out.as_fd())
            .with_context(|| format!("cannot flush staged directory {}", shown()))?;
    }
    Ok(())
}

/// A symlink, with its own owner and mtime where setting them cannot reach
/// the target (not on FUSE: there the link stays as made).
fn stage_symlink(ctx: &Ctx<'_>, e: &Entry, out: &DirFd, path: &[u8]) -> Result<()> {
    let Node::Symlink(target) = &e.node else {
        unreachable!("stage_symlink is given symlinks")
    };
    out.symlink(target, &e.name)
        .with_context(|| format!("cannot create symlink {} in staging", c_style(path)))?;
    if !ctx.job.caps.link_meta {
        return Ok(());
    }
    let owner = ctx.job.owners.then_some((e.meta.uid, e.meta.gid));
    let mtime = e.meta.mtime.pair();
    match out.set_symlink_meta(&e.name, owner, mtime) {
        Err(err) if sys::is_owner_refusal(&err) => {
            ctx.owner_refused();
            out.set_symlink_meta(&e.name, None, mtime)?;
        }
        res => res.with_context(|| {
            format!(
                "cannot set metadata of symlink {} in staging",
                c_style(path)
            )
        })?,
    }
    Ok(())
}

/// A file: hardlinked from the live generation where the plan says so and
/// the link checks out, else copied from its source and hashed. The bytes
/// copied that the reporter was not told of while they were
/// (`Reporter::copying`); `None` for a hardlink follower, left for the
/// second pass.
fn stage_file(
    ctx: &Ctx<'_>,
    e: &mut Entry,
    srcs: &[Option<&DirFd>],
    live: Option<&DirFd>,
    out: &DirFd,
    path: &[u8],
) -> Result<Option<u64>> {
    let Node::File(f) = &e.node else {
        unreachable!("stage_file is given files")
    };
    if let Some(g) = f.group {
        if ctx.leaders.get(&g).is_some_and(|l| l != path) {
            return Ok(None);
        }
    }
    let granularity = ctx.job.caps.granularity_ns;
    if f.reuse
        && live.is_some_and(|l| {
            matches!(
                reuse(l, out, &e.name, &e.meta, granularity, ctx.job.owners),
                Ok(Some(_))
            )
        })
    {
        ctx.reused.fetch_add(1, Ordering::Relaxed);
        return Ok(Some(0));
    }
    let i = f.src as usize;
    let (hash, shown) = fetch_file(ctx, i, srcs[i], out, e, path)?;
    if let Node::File(f) = &mut e.node {
        f.hash = Some(hash);
        f.reuse = false;
    }
    ctx.copied.fetch_add(1, Ordering::Relaxed);
    ctx.copied_bytes.fetch_add(e.meta.size, Ordering::Relaxed);
    Ok(Some(e.meta.size - shown))
}

/// The bytes of file `e` of source `i` into staging: moved from a source
/// whose files are private to this sync (a spool), with the hash its
/// stream gave, else copied and hashed (`copy_file`). The hash, and the
/// bytes the reporter was told of as they were copied.
fn fetch_file(
    ctx: &Ctx<'_>,
    i: usize,
    dir: Option<&DirFd>,
    out: &DirFd,
    e: &Entry,
    path: &[u8],
) -> Result<([u8; 32], u64)> {
    let hash = match &e.node {
        Node::File(f) => f.hash,
        _ => None,
    };
    match (ctx.job.sources[i].owns_root(), dir, hash) {
        (true, Some(dir), Some(hash)) => move_file(ctx, i, dir, out, e, path).map(|()| (hash, 0)),
        _ => copy_file(ctx, i, dir, out, e, path),
    }
}

/// Hardlink `name` from the live generation, then check what was linked:
/// a regular file with the expected size, mode and mtime; its inode when it
/// is. Anything else (a symlink swapped in, a file edited in place) is
/// unlinked and `None` returned, so the caller copies from the source
/// instead.
fn reuse(
    live: &DirFd,
    out: &DirFd,
    name: &[u8],
    meta: &Meta,
    granularity_ns: u64,
    owners: bool,
) -> io::Result<Option<u64>> {
    if live.link(name, out, name).is_err() {
        return Ok(None);
    }
    let st = out.stat(name)?;
    let ok = sys::kind_of(&st) == sys::StatKind::File
        && st.st_size as u64 == meta.size
        && st.st_mode & 0o7777 == meta.mode
        && (!owners || (st.st_uid, st.st_gid) == (meta.uid, meta.gid))
        && crate::plan::mtime_eq(meta.mtime, sys::mtime_of(&st).into(), granularity_ns);
    if !ok {
        out.unlink(name)?;
    }
    Ok(ok.then_some(st.st_ino))
}

/// `--checksum`: the file just hardlinked from the live generation as
/// `e`'s name in `out` kept only where its bytes and the source's (SOURCE
/// `i`, `dir` its handle on the directory, else by `path`) have the same
/// SHA-256, read now: that hash; else the link is undone (`None`), and the
/// caller copies.
fn checked_link(
    ctx: &Ctx<'_>,
    i: usize,
    dir: Option<&DirFd>,
    out: &DirFd,
    e: &Entry,
    path: &[u8],
) -> Result<Option<[u8; 32]>> {
    let src = ctx.job.sources[i];
    let shown = || crate::escape::display(src.label(), path);
    let open = source::open_in(src, dir, &e.name, path);
    let want = crate::scan::digest(open, e.meta.size, &shown)?;
    let n = e.meta.size;
    let live = out
        .open_read(&e.name)
        .and_then(|fd| crate::scan::hash_fd(fd.as_fd()))
        .with_context(|| format!("cannot read the live copy of {}", shown()))?;
    if live == (want, n) {
        return Ok(Some(want));
    }
    out.unlink(&e.name)
        .with_context(|| format!("cannot unlink {} in staging", shown()))?;
    Ok(None)
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
    set_meta(ctx, fd, owner, Some(meta.mode), meta)
}

/// `sys::set_meta_fd`; a refused owner is counted and the rest set without
/// it. Then the extended attributes (after the owner, whose change would
/// clear `security.capability`); one the volume refuses is counted.
fn set_meta(
    ctx: &Ctx<'_>,
    fd: BorrowedFd<'_>,
    owner: Option<(u32, u32)>,
    mode: Option<u32>,
    meta: &Meta,
) -> io::Result<()> {
    match sys::set_meta_fd(fd, owner, mode, meta.mtime.pair()) {
        Err(e) if owner.is_some() && sys::is_owner_refusal(&e) => {
            ctx.owner_refused();
            sys::set_meta_fd(fd, None, Some(meta.mode), meta.mtime.pair())?;
        }
        res => res?,
    }
    if !meta.xattrs.is_empty() {
        for (name, value) in meta.xattrs.pairs().iter() {
            match sys::set_xattr_fd(fd, name, value) {
                Err(e) if sys::is_xattr_refusal(&e) => ctx.xattr_refused(name.to_vec(), e),
                res => res?,
            }
        }
    }
    Ok(())
}

/// Copy file `e` of source `i` into staging, hashing its content; fails if
/// the source changed or vanished while it was copied. `dir`: the source's
/// handle on the file's directory, where it has one. The hash, and the
/// bytes the reporter was told of as they were copied (a large file's, a
/// chunk at a time: `Reporter::copying`).
fn copy_file(
    ctx: &Ctx<'_>,
    i: usize,
    dir: Option<&DirFd>,
    out: &DirFd,
    e: &Entry,
    path: &[u8],
) -> Result<([u8; 32], u64)> {
    let source = ctx.job.sources[i];
    let shown = display(source.label(), path);
    let changed = || {
        anyhow::anyhow!(
            "{shown} changed while being copied; run the sync again once the source is stable"
        )
    };
    let src = source::open_in(source, dir, &e.name, path)
        .with_context(|| format!("cannot read {shown}"))?;
    // Swapped for another file, a FIFO or a device since the scan: do not read it.
    if !source
        .unchanged(src.as_fd(), e)
        .with_context(|| format!("cannot stat {shown}"))?
    {
        return Err(changed());
    }
    sys::pause_point("copy-file");
    let dst = out
        .create_excl(&e.name)
        .with_context(|| format!("cannot create {shown} in staging"))?;
    let meta = &e.meta;
    let told = AtomicU64::new(0);
    let copied = if meta.size <= SMALL {
        copy_small(src.as_fd(), dst.as_fd(), meta.size)
    } else {
        let report = |n| {
            told.fetch_add(n, Ordering::Relaxed);
            ctx.job.reporter.copying(n);
        };
        copy_large(
            src.as_fd(),
            dst.as_fd(),
            ctx.job.caps.flush.durable(),
            &report,
        )
    };
    // A copy cut short by SIGINT/SIGTERM is an interruption, not an I/O error.
    check_signal()?;
    let (hash, n) = copied.with_context(|| format!("cannot copy {shown} into staging"))?;
    if n != meta.size
        || !source
            .unchanged(src.as_fd(), e)
            .with_context(|| format!("cannot stat {shown}"))?
    {
        return Err(changed());
    }
    // A new file is ours already: chown only when the owner differs.
    let owner = (ctx.job.owners && (meta.uid, meta.gid) != (sys::euid(), sys::egid()))
        .then_some((meta.uid, meta.gid));
    let mode = (meta.mode != 0o600 || owner.is_some()).then_some(meta.mode);
    set_meta(ctx, dst.as_fd(), owner, mode, meta)
        .with_context(|| format!("cannot set metadata of {shown} in staging"))?;
    ctx.flush(dst.as_fd())
        .with_context(|| format!("cannot flush {shown} in staging"))?;
    sys::crash_point("copied-file");
    Ok((hash, told.into_inner().min(meta.size)))
}

/// A file of a source whose files are private to this sync (a spool):
/// moved into the staged tree by one rename, no byte copied, then given
/// its owner, mode and times through a descriptor, as a copy is. The
/// content hash is the one the source computed as the file streamed in.
fn move_file(
    ctx: &Ctx<'_>,
    i: usize,
    dir: &DirFd,
    out: &DirFd,
    e: &Entry,
    path: &[u8],
) -> Result<()> {
    let shown = display(ctx.job.sources[i].label(), path);
    dir.rename(&e.name, out, &e.name)
        .with_context(|| format!("cannot move {shown} into staging"))?;
    let fd = out
        .open_read(&e.name)
        .with_context(|| format!("cannot open {shown} in staging"))?;
    let meta = &e.meta;
    let owner = (ctx.job.owners && (meta.uid, meta.gid) != (sys::euid(), sys::egid()))
        .then_some((meta.uid, meta.gid));
    set_meta(ctx, fd.as_fd(), owner, Some(meta.mode), meta)
        .with_context(|| format!("cannot set metadata of {shown} in staging"))?;
    ctx.flush(fd.as_fd())
        .with_context(|| format!("cannot flush {shown} in staging"))?;
    sys::crash_point("copied-file");
    Ok(())
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
/// the disk works while the next chunk is read and hashed. `report` is
/// told the bytes of each chunk once it is copied and hashed (one atomic
/// add a chunk: a 2 GiB file shows its progress).
fn copy_large(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    durable: bool,
    report: &dyn Fn(u64),
) -> io::Result<([u8; 32], u64)> {
    BUF.with(|b| {
        let mut buf = b.borrow_mut();
        if buf.len() < BUF_MAX {
            buf.resize(BUF_MAX, 0);
        }
        copy_large_with(src, dst, durable, &mut buf[..BUF_MAX], report)
    })
}

/// `copy_large` with the thread's buffer.
fn copy_large_with(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    durable: bool,
    buf: &mut [u8],
    report: &dyn Fn(u64),
) -> io::Result<([u8; 32], u64)> {
    let mut h = Sha256::new();
    if sys::ficlone(dst, src).is_ok() {
        let size = sys::fstat(src)?.st_size as u64;
        // Hashed a chunk at a time, each one reported.
        let mut n = 0u64;
        loop {
            let got = hash_range(src, &mut h, buf, n, CHUNK)?;
            n += got;
            report(got);
            if got < CHUNK {
                break;
            }
        }
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
                report(n);
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
        report(n as u64);
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

/// Second pass, both ways of staging: link every hardlink follower to its
/// leader (`links`: their staged paths, follower first), then set the
/// metadata of the directories that hold followers (`late`: linking changed
/// their mtime; the root is its caller's), deepest first: setting a
/// directory's metadata does not touch its parent's, and a parent made
/// unwritable or unsearchable last keeps nothing below it from being done.
fn link_followers(
    ctx: &Ctx<'_>,
    out: &DirFd,
    links: &[(Vec<u8>, Vec<u8>)],
    mut late: Vec<(Vec<u8>, Meta)>,
) -> Result<()> {
    for (path, leader) in links {
        let (dir, name) = path.rsplit_once_byte(b'/').unwrap_or((&[], path));
        let (ldir, lname) = leader.rsplit_once_byte(b'/').unwrap_or((&[], leader));
        let dfd = open_staged(out, dir)?;
        open_staged(out, ldir)?
            .link(lname, &dfd, name)
            .with_context(|| {
                format!(
                    "cannot hardlink {} to {} in staging",
                    c_style(path),
                    c_style(leader)
                )
            })?;
        ctx.job.reporter.advance(0);
    }
    late.sort_by(|a, b| b.0.cmp(&a.0));
    for (dir, meta) in late {
        let dfd = open_staged(out, &dir)?;
        apply_meta(ctx, dfd.as_fd(), &meta)
            .with_context(|| format!("cannot set metadata of staged {}", c_style(&dir)))?;
        ctx.flush(dfd.as_fd())
            .with_context(|| format!("cannot flush staged directory {}", c_style(&dir)))?;
    }
    Ok(())
}

/// The metadata of the directory at `path` in `tree`.
fn find_dir(tree: &Tree, path: &[u8]) -> Option<Meta> {
    let mut entries = &tree.entries[..];
    let mut meta = tree.root;
    for part in path.split(|&b| b == b'/').filter(|p| !p.is_empty()) {
        let i = entries.binary_search_by(|e| (*e.name).cmp(part)).ok()?;
        match &entries[i].node {
            Node::Dir(d) => {
                meta = entries[i].meta;
                entries = &d.entries;
            }
            _ => return None,
        }
    }
    Some(meta)
}

/// A staged directory by its path, never through a symlink.
fn open_staged(out: &DirFd, path: &[u8]) -> Result<DirFd> {
    out.open_beneath(path)
        .with_context(|| format!("cannot open staged {}", c_style(path)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter::Filter;
    use crate::report::Collected;
    use crate::source::Dir;
    use std::path::Path;

    /// A source that is not a directory on disk: no `root`, so the stage
    /// must open every file through `open_file`, as an archive's would be.
    struct Rootless(Dir);

    impl Source for Rootless {
        fn label(&self) -> &str {
            self.0.label()
        }
        fn path(&self) -> Option<&Path> {
            None
        }
        fn identity(&self) -> String {
            self.0.identity()
        }
        fn scan(&self, src: u16, filter: &Filter, r: &dyn Reporter) -> Result<Tree> {
            self.0.scan(src, filter, r)
        }
        fn root(&self) -> Option<&DirFd> {
            None
        }
        fn open_file(&self, path: &[u8]) -> io::Result<std::os::fd::OwnedFd> {
            self.0.open_file(path)
        }
    }

    fn stage(sources: &[&dyn Source], flush: Flush) -> (tempfile::TempDir, Staged, Tree) {
        let mut tree =
            crate::scan::run(sources, &Filter::default(), &Collected::default()).expect("scan");
        let vol = tempfile::tempdir().unwrap();
        let staging = DirFd::open_path(vol.path()).unwrap();
        let reporter = Collected::default();
        let job = Job {
            sources,
            live: None,
            owners: false,
            reporter: &reporter,
            caps: Caps {
                flush,
                ..Caps::default()
            },
            heartbeat: None,
        };
        let staged = run(&job, &mut tree, &staging).expect("stage");
        (vol, staged, tree)
    }

    fn source_tree() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("a/b")).unwrap();
        std::fs::write(t.path().join("a/b/f"), "from the first").unwrap();
        std::fs::write(t.path().join("top"), vec![7u8; (SMALL + 5) as usize]).unwrap();
        std::os::unix::fs::symlink("b/f", t.path().join("a/l")).unwrap();
        t
    }

    #[test]
    fn a_source_without_a_directory_is_staged_through_open_file() {
        let (one, two) = (source_tree(), tempfile::tempdir().unwrap());
        std::fs::create_dir(two.path().join("a")).unwrap();
        std::fs::write(two.path().join("a/only-two"), "second").unwrap();
        let first = Dir::new(DirFd::open_path(one.path()).unwrap(), "one");
        let second = Rootless(Dir::new(DirFd::open_path(two.path()).unwrap(), "two"));
        let (vol, staged, tree) = stage(&[&first, &second], Flush::Nothing);
        let out = vol.path().join("tree");
        assert_eq!(std::fs::read(out.join("a/b/f")).unwrap(), b"from the first");
        assert_eq!(std::fs::read(out.join("a/only-two")).unwrap(), b"second");
        assert_eq!(
            std::fs::read(out.join("top")).unwrap().len() as u64,
            SMALL + 5
        );
        assert_eq!(
            std::fs::read_link(out.join("a/l")).unwrap(),
            Path::new("b/f")
        );
        assert_eq!((staged.copied, staged.reused), (3, 0));
        let mut hashed = 0;
        tree.for_each(&mut |_, e| {
            if let Node::File(f) = &e.node {
                assert!(f.hash.is_some());
                hashed += 1;
            }
        });
        assert_eq!(hashed, 3);
    }

    #[test]
    fn a_file_written_to_after_the_scan_is_not_staged() {
        let src = source_tree();
        let dir = Dir::new(DirFd::open_path(src.path()).unwrap(), "src");
        let sources: [&dyn Source; 1] = [&dir];
        let mut tree =
            crate::scan::run(&sources, &Filter::default(), &Collected::default()).unwrap();
        std::fs::write(src.path().join("a/b/f"), "from the first!").unwrap();
        let vol = tempfile::tempdir().unwrap();
        let staging = DirFd::open_path(vol.path()).unwrap();
        let reporter = Collected::default();
        let job = Job {
            sources: &sources,
            live: None,
            owners: false,
            reporter: &reporter,
            caps: Caps::default(),
            heartbeat: None,
        };
        let err = run(&job, &mut tree, &staging).unwrap_err();
        assert!(
            format!("{err:#}").contains("src/a/b/f changed while being copied"),
            "{err:#}"
        );
    }

    /// Counts what a stage reports: entries, bytes with them, bytes while copying.
    #[derive(Default)]
    struct Counting {
        entries: AtomicU64,
        with_entries: AtomicU64,
        copying: AtomicU64,
        copying_calls: AtomicU64,
    }

    impl Reporter for Counting {
        fn begin(&self, _: u64, _: u64) {}
        fn advance(&self, bytes: u64) {
            self.entries.fetch_add(1, Ordering::Relaxed);
            self.with_entries.fetch_add(bytes, Ordering::Relaxed);
        }
        fn finish(&self) {}
        fn warn(&self, _: &str) {}
        fn copying(&self, bytes: u64) {
            self.copying.fetch_add(bytes, Ordering::Relaxed);
            self.copying_calls.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn a_large_file_is_reported_a_chunk_at_a_time_and_counted_once() {
        let t = tempfile::tempdir().unwrap();
        let big = 2 * CHUNK + 5;
        std::fs::write(t.path().join("big"), vec![3u8; big as usize]).unwrap();
        std::fs::write(t.path().join("small"), "small").unwrap();
        let dir = Dir::new(DirFd::open_path(t.path()).unwrap(), "src");
        let sources: [&dyn Source; 1] = [&dir];
        let mut tree =
            crate::scan::run(&sources, &Filter::default(), &Collected::default()).unwrap();
        let vol = tempfile::tempdir().unwrap();
        let staging = DirFd::open_path(vol.path()).unwrap();
        let reporter = Counting::default();
        let job = Job {
            sources: &sources,
            live: None,
            owners: false,
            reporter: &reporter,
            caps: Caps::default(),
            heartbeat: None,
        };
        run(&job, &mut tree, &staging).unwrap();
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        // The big file's bytes while it copied, in chunks; the small one's with its entry.
        assert_eq!(n(&reporter.copying), big);
        assert!(
            n(&reporter.copying_calls) >= 3,
            "{}",
            n(&reporter.copying_calls)
        );
        assert_eq!(n(&reporter.with_entries), 5);
        assert_eq!(n(&reporter.entries), 2);
    }
}
