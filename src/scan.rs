//! Scan: read the sources into one `Tree` (each source yields its entries:
//! `source::Source::scan`), overlaid in order, leaving out what the
//! `filter::Filter` says; and file contents hashed on demand (`--checksum`,
//! `verify`), read through each entry's source.
//!
//! `compare_live` compares the sources with the live generation a
//! directory at a time instead, without building either tree.
//!
//! Scanning never writes. Special files are reported through
//! `Reporter::skipped` and left out.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use anyhow::{Context, Result};
use rayon::prelude::*;
use sha2::{Digest, Sha256};

use crate::escape::display;
use crate::filter::Filter;
use crate::plan::{self, Compare};
use crate::report::Reporter;
use crate::source::{self, Source};
use crate::sys::{self, DirFd};
use crate::tree::{meta_of, Entry, Kind, Meta, Node, Tree};
use crate::walk::{Sub, Visit, Visited};

/// Scan every source and overlay them in order: a later source wins a path
/// two provide; each entry keeps the index of the source it came from, and
/// hardlinks inside a source become groups.
pub fn run(sources: &[&dyn Source], filter: &Filter, reporter: &dyn Reporter) -> Result<Tree> {
    run_each(sources, filter, reporter, &|_, _, _| Ok(()))
}

/// `run`, with `each` called on every source's own tree (its index, the
/// source, its tree) before it is overlaid: a failure there ends the scan.
pub fn run_each(
    sources: &[&dyn Source],
    filter: &Filter,
    reporter: &dyn Reporter,
    each: &(dyn Fn(usize, &dyn Source, &Tree) -> Result<()> + Sync),
) -> Result<Tree> {
    let mut tree = Tree::default();
    for (i, s) in sources.iter().enumerate() {
        let t = s.scan(i as u16, filter, reporter)?;
        each(i, *s, &t)?;
        if i == 0 {
            tree = t;
        } else {
            tree.overlay(t);
        }
    }
    tree.assign_groups();
    Ok(tree)
}

/// SHA-256 of everything readable from `fd` from its current offset.
pub fn hash_fd(fd: BorrowedFd<'_>) -> std::io::Result<([u8; 32], u64)> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    loop {
        let n = sys::read(fd, &mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        total += n as u64;
    }
    Ok((h.finalize().into(), total))
}

/// The SHA-256 of a file just opened for reading (`open`), which must
/// still have the `size` its listing gave: else one line naming it
/// (`shown`) and the cause.
pub fn digest(
    open: std::io::Result<std::os::fd::OwnedFd>,
    size: u64,
    shown: &dyn Fn() -> String,
) -> Result<[u8; 32]> {
    let fd = open.with_context(|| format!("cannot read {}", shown()))?;
    let (h, n) = hash_fd(fd.as_fd()).with_context(|| format!("cannot read {}", shown()))?;
    if n != size {
        anyhow::bail!("{} changed while being read (size {size} now {n})", shown());
    }
    Ok(h)
}

/// Hash the source files of one directory that are compared by content
/// (`Compare::by_content`: a spooled source, whose stream hashed them
/// already, or every source under `--set-mtime`, which gives every file
/// one mtime) and still have no hash, where the other side (`other`, the
/// live listing or the recorded entries of the same directory, sorted by
/// name) has a file of the same size: the only ones whose content decides
/// anything, as the whole-tree path picks them. `srcs`: each source's
/// handle on the directory at `rel`.
pub fn hash_by_content(
    sources: &[&dyn Source],
    srcs: &[Option<&DirFd>],
    rel: &[u8],
    merged: &mut [Entry],
    other: &[Entry],
    c: &Compare,
) -> Result<()> {
    if c.by_content == 0 {
        return Ok(());
    }
    let mut want = vec![false; merged.len()];
    let mut j = 0;
    for (i, e) in merged.iter().enumerate() {
        while j < other.len() && other[j].name < e.name {
            j += 1;
        }
        let Some(o) = other.get(j).filter(|o| o.name == e.name) else {
            continue;
        };
        if let (Node::File(f), Node::File(_)) = (&e.node, &o.node) {
            want[i] = f.hash.is_none()
                && e.meta.size == o.meta.size
                && c.by_content & 1u64.checked_shl(f.src.into()).unwrap_or(0) != 0;
        }
    }
    merged
        .par_iter_mut()
        .zip(want)
        .filter(|(_, w)| *w)
        .try_for_each(|(e, _)| -> Result<()> {
            let size = e.meta.size;
            let Node::File(f) = &mut e.node else {
                return Ok(());
            };
            let i = f.src as usize;
            let dir = srcs.get(i).copied().flatten();
            let path = crate::tree::join(rel, &e.name);
            let open = source::open_in(sources[i], dir, &e.name, &path);
            f.hash = Some(digest(open, size, &|| display(sources[i].label(), &path))?);
            Ok(())
        })
}

/// Fill in `hash` for every file `want` selects, reading each from the
/// source its entry names (`sources`, by index; the live tree has one).
pub fn hash(
    tree: &mut Tree,
    sources: &[&dyn Source],
    want: &(dyn Fn(&Entry) -> bool + Sync),
) -> Result<()> {
    let roots: Vec<Option<&DirFd>> = sources.iter().map(|s| s.root()).collect();
    hash_dir(&mut tree.entries, sources, &roots, &[], want)
}

fn hash_dir(
    entries: &mut [Entry],
    sources: &[&dyn Source],
    dirs: &[Option<&DirFd>],
    rel: &[u8],
    want: &(dyn Fn(&Entry) -> bool + Sync),
) -> Result<()> {
    entries.par_iter_mut().try_for_each(|e| -> Result<()> {
        let mut path = rel.to_vec();
        if !path.is_empty() {
            path.push(b'/');
        }
        path.extend_from_slice(&e.name);
        if let Node::Dir(d) = &mut e.node {
            if !d
                .entries
                .iter()
                .any(|c| matches!(c.node, Node::Dir(_)) || want(c))
            {
                return Ok(());
            }
            let subs = source::open_dirs(sources, dirs, d.srcs, &e.name, &path)?;
            return hash_dir(&mut d.entries, sources, &source::borrow(&subs), &path, want);
        }
        if !want(e) {
            return Ok(());
        }
        let meta_size = e.meta.size;
        if let Node::File(f) = &mut e.node {
            let i = f.src as usize;
            let open = source::open_in(sources[i], dirs[i], &e.name, &path);
            f.hash = Some(digest(open, meta_size, &|| {
                display(sources[i].label(), &path)
            })?);
        }
        Ok(())
    })
}

/// What `compare_live` compares: the sources with the live generation.
pub struct Against<'a> {
    /// Every SOURCE, in order; each `lists_by_directory` (else nothing is
    /// compared: `same` is false).
    pub sources: &'a [&'a dyn Source],
    /// The live generation's root, and how messages name it.
    pub live: &'a DirFd,
    pub live_label: &'a str,
    pub filter: &'a Filter,
    /// Where skipped entries (of either side) are reported.
    pub reporter: &'a dyn Reporter,
    /// What the sync does to a source entry's owner and mode before it is
    /// staged (`--chown`, `--chmod`, dropping setuid without root).
    pub adjust: &'a (dyn Fn(&mut Meta, Kind) + Sync),
    pub compare: Compare,
    /// Compare the live generation with its own manifest instead of the
    /// sources (`sources` then unused): the drift check of sources that
    /// are unchanged since it (`Source::unchanged_since`).
    pub recorded: Option<&'a crate::index::Index>,
    /// `--checksum`: files equal by their metadata are read on both sides
    /// and equal only with the same SHA-256.
    pub hash: bool,
    /// The live manifest's index, and how its entries are matched with the
    /// listing's: each live entry still as recorded gets the extended
    /// attributes and the hash recorded for it (a listing shows neither).
    /// Where the live tree has attributes, or files are compared by
    /// content; not beside `recorded`.
    pub as_recorded: Option<(&'a crate::index::Index, Compare)>,
}

/// What `compare_live` found.
#[derive(Debug, Default)]
pub struct Compared {
    /// The sources, overlaid, equal the live generation entry by entry,
    /// hardlinks included (only decided where the walk went to the end).
    pub same: bool,
    /// Entries below the root, and bytes of file content (each inode once):
    /// the sources' when `same`.
    pub entries: u64,
    pub bytes: u64,
    /// The names at the top of the tree, for the layout's check.
    pub top: Vec<Vec<u8>>,
}

/// Compare the sources with the live generation a directory at a time, in
/// parallel across directories, holding only the directories being
/// compared (one list of each side's entries, plus the names of their
/// subdirectories while those are walked): never a whole tree. The walk
/// stops at the first difference. Decides whether a sync is up to date
/// without scanning anything into a `Tree`; sources that do not
/// `lists_by_directory` are not compared this way (`same` false).
pub fn compare_live(a: &Against<'_>) -> Result<Compared> {
    let mut roots = Vec::with_capacity(a.sources.len());
    let mut root_meta = a.recorded.map(|ix| ix.root).unwrap_or_default();
    for s in a.sources.iter().filter(|_| a.recorded.is_none()) {
        let Some(r) = s.root().filter(|_| s.lists_by_directory()) else {
            return Ok(Compared::default());
        };
        root_meta = s.root_meta(a.filter)?;
        roots.push(Some(r));
    }
    (a.adjust)(&mut root_meta, Kind::Dir);
    let st = a
        .live
        .fstat()
        .with_context(|| format!("cannot stat {}", a.live_label))?;
    let dir_entry = |meta| Entry {
        name: Default::default(),
        meta,
        node: Node::Dir(Default::default()),
    };
    let mut live_root = meta_of(&st, 0);
    if let Some((ix, c)) = &a.as_recorded {
        if plan::same_entry(&dir_entry(ix.root), &dir_entry(live_root), c) {
            live_root.xattrs = ix.root.xattrs;
        }
    }
    if !plan::same_entry(&dir_entry(root_meta), &dir_entry(live_root), &a.compare) {
        return Ok(Compared::default());
    }
    let walk = Paired {
        a,
        differs: AtomicBool::new(false),
        entries: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        links: Mutex::new(plan::Links::default()),
        top: Mutex::new(Vec::new()),
    };
    crate::walk::run(&walk, a.sources, &roots, a.live)?;
    let same = !walk.differs.into_inner() && walk.links.into_inner().unwrap().consistent();
    Ok(Compared {
        same,
        entries: walk.entries.into_inner(),
        bytes: walk.bytes.into_inner(),
        top: walk.top.into_inner().unwrap(),
    })
}

/// The state of one `compare_live` walk, shared by its threads.
struct Paired<'a> {
    a: &'a Against<'a>,
    /// A difference was found: every thread stops.
    differs: AtomicBool,
    entries: AtomicU64,
    bytes: AtomicU64,
    links: Mutex<plan::Links>,
    top: Mutex<Vec<Vec<u8>>>,
}

impl Paired<'_> {
    /// Whether every file of the directory at `rel` (`merged`, equal by
    /// name to the live directory's entries) has the live file's SHA-256.
    /// `srcs`: each source's handle on the directory; `live`: the live one.
    /// A file that cannot be read, or changes size as it is, is a
    /// difference: the whole-tree path reads it again and says why.
    fn same_bytes(&self, srcs: &[Option<&DirFd>], live: &DirFd, merged: &[Entry]) -> bool {
        let digest = |dir: Option<&DirFd>, e: &Entry| -> Option<[u8; 32]> {
            let fd = dir?.open_read(&e.name).ok()?;
            let (h, n) = hash_fd(fd.as_fd()).ok()?;
            (n == e.meta.size).then_some(h)
        };
        merged.iter().all(|e| {
            let Node::File(f) = &e.node else {
                return true;
            };
            // A signal ends the walk (it checks before each directory).
            if self.stopped() || sys::signals::pending().is_some() {
                return false;
            }
            let src = srcs.get(f.src as usize).copied().flatten();
            match (digest(src, e), digest(Some(live), e)) {
                (Some(a), Some(b)) => a == b,
                _ => false,
            }
        })
    }
}

impl Visit for Paired<'_> {
    /// The live generation's handle on the directory.
    type Dir = DirFd;
    type Keep = ();

    /// Compare the directory at `rel`: `srcs` holds each source's handle on
    /// it (where that source provides it), `live` the live generation's.
    fn visit(&self, srcs: &[Option<&DirFd>], live: &DirFd, rel: &[u8]) -> Result<Visited<()>> {
        let a = self.a;
        let mut merged = match a.recorded {
            Some(ix) => recorded_entries(ix, rel)?,
            None => source::list_merged(a.sources, srcs, rel, a.filter, a.reporter)?,
        };
        let mut live_entries =
            source::Dir::list(live, rel, a.live_label, 0, &Filter::default(), a.reporter)?;
        if let Some((ix, c)) = &a.as_recorded {
            attach_recorded(&mut live_entries, &ix.entries(rel)?, c);
        }
        for e in merged.iter_mut() {
            let kind = e.kind();
            (a.adjust)(&mut e.meta, kind);
        }
        if a.recorded.is_some() && !a.compare.hardlinks {
            // The volume shows no hardlinks: its files are in the groups
            // the manifest records for them (its entries here, `merged`).
            attach_recorded(&mut live_entries, &merged, &a.compare);
        }
        if a.recorded.is_none() {
            hash_by_content(a.sources, srcs, rel, &mut merged, &live_entries, &a.compare)?;
        }
        let same = same_here(&merged, &live_entries, &a.compare, &self.links)
            .filter(|_| !a.hash || self.same_bytes(srcs, live, &merged));
        let Some(bytes) = same else {
            self.differs.store(true, Ordering::Relaxed);
            return Ok((0, Vec::new()));
        };
        self.entries
            .fetch_add(merged.len() as u64, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        if rel.is_empty() {
            *self.top.lock().unwrap() = merged.iter().map(|e| e.name.to_vec()).collect();
        }
        // Only the subdirectories' names and sources are held while they are walked.
        Ok((0, crate::walk::subdirs(merged)))
    }

    fn enter(&self, live: &DirFd, _: &(), name: &[u8], path: &[u8]) -> Result<DirFd> {
        crate::walk::open_sub(live, name, self.a.live_label, path)
    }

    fn stopped(&self) -> bool {
        self.differs.load(Ordering::Relaxed)
    }
}

/// Whether one directory's entries equal the other side's, name by name,
/// by content where `c.by_content` says, and their hardlinks with what
/// `links` saw so far: the bytes of content counted here (each inode
/// once), or `None` at a difference.
fn same_here(
    src: &[Entry],
    other: &[Entry],
    c: &Compare,
    links: &Mutex<plan::Links>,
) -> Option<u64> {
    if !plan::same_dir(src, other, c)
        || !src
            .iter()
            .zip(other)
            .all(|(s, o)| plan::same_content(s, o, c))
    {
        return None;
    }
    let mut bytes = 0;
    let mut links = links.lock().unwrap();
    for (s, o) in src.iter().zip(other) {
        if let (Node::File(sf), Node::File(of)) = (&s.node, &o.node) {
            if links.pair(sf, of) {
                bytes += s.meta.size;
            }
        }
    }
    (!links.broken()).then_some(bytes)
}

/// Whether the sources hold what the live manifest `ix` records, entry by
/// entry (metadata exactly, as the manifest keeps what the sources gave),
/// by content where `compare.by_content` says (a spooled source's files
/// carry the hashes their stream gave), hardlinks included: a directory
/// at a time, stopping at the first difference. The sources of a sync
/// whose archive or image changed its bytes but not its tree are found
/// unchanged this way, as the whole-tree plan finds them.
pub fn same_as_recorded(
    sources: &[&dyn Source],
    filter: &Filter,
    reporter: &dyn Reporter,
    adjust: &(dyn Fn(&mut Meta, Kind) + Sync),
    ix: &crate::index::Index,
    compare: Compare,
) -> Result<bool> {
    let mut root = Meta::default();
    for s in sources {
        root = s.root_meta(filter)?;
    }
    adjust(&mut root, Kind::Dir);
    let dir = |meta| Entry {
        name: Default::default(),
        meta,
        node: Node::Dir(Default::default()),
    };
    if !plan::same_entry(&dir(root), &dir(ix.root), &compare) {
        return Ok(false);
    }
    let v = Recorded {
        sources,
        filter,
        reporter,
        adjust,
        ix,
        compare,
        differs: AtomicBool::new(false),
        links: Mutex::new(plan::Links::default()),
    };
    let roots: Vec<Option<&DirFd>> = sources.iter().map(|s| s.root()).collect();
    crate::walk::run(&v, sources, &roots, &())?;
    Ok(!v.differs.into_inner() && v.links.into_inner().unwrap().consistent())
}

/// One `same_as_recorded` walk, shared by its threads.
struct Recorded<'a> {
    sources: &'a [&'a dyn Source],
    filter: &'a Filter,
    reporter: &'a dyn Reporter,
    adjust: &'a (dyn Fn(&mut Meta, Kind) + Sync),
    ix: &'a crate::index::Index,
    compare: Compare,
    differs: AtomicBool,
    links: Mutex<plan::Links>,
}

impl Visit for Recorded<'_> {
    type Dir = ();
    type Keep = ();

    fn visit(&self, srcs: &[Option<&DirFd>], _: &(), rel: &[u8]) -> Result<Visited<()>> {
        let mut merged = source::list_merged(self.sources, srcs, rel, self.filter, self.reporter)?;
        for e in merged.iter_mut() {
            let kind = e.kind();
            (self.adjust)(&mut e.meta, kind);
        }
        let recorded = recorded_entries(self.ix, rel)?;
        hash_by_content(
            self.sources,
            srcs,
            rel,
            &mut merged,
            &recorded,
            &self.compare,
        )?;
        if same_here(&merged, &recorded, &self.compare, &self.links).is_none() {
            self.differs.store(true, Ordering::Relaxed);
            return Ok((0, Vec::new()));
        }
        Ok((0, crate::walk::subdirs(merged)))
    }

    fn enter(&self, _: &(), _: &(), _: &[u8], _: &[u8]) -> Result<()> {
        Ok(())
    }

    fn stopped(&self) -> bool {
        self.differs.load(Ordering::Relaxed)
    }
}

/// The entries of the directory `rel` as the manifest `ix` records them,
/// each file of a hardlink group given the group for its inode (and a
/// second link), so that `plan::Links` pairs them with the live inodes as
/// it pairs a source's.
fn recorded_entries(ix: &crate::index::Index, rel: &[u8]) -> Result<Vec<Entry>> {
    let mut entries = ix.entries(rel)?;
    entries.iter_mut().for_each(group_identity);
    Ok(entries)
}

/// What a sync would delete from the live generation `ix` records,
/// counted as `stage::stream` counts while it stages: the sources listed a
/// directory at a time beside the recorded entries of the same directory,
/// in parallel across directories. For `--max-delete`, which refuses
/// before anything is written.
pub fn count_deleted(
    sources: &[&dyn Source],
    filter: &Filter,
    ix: &crate::index::Index,
) -> Result<u64> {
    let c = Counting {
        sources,
        filter,
        ix,
    };
    let roots: Vec<Option<&DirFd>> = sources.iter().map(|s| s.root()).collect();
    crate::walk::run(&c, sources, &roots, &())
}

/// One `count_deleted` walk, shared by its threads.
struct Counting<'a> {
    sources: &'a [&'a dyn Source],
    filter: &'a Filter,
    ix: &'a crate::index::Index,
}

impl Visit for Counting<'_> {
    type Dir = ();
    type Keep = ();

    /// What goes at the directory at `rel` (not below it: the walk sums those).
    fn visit(&self, srcs: &[Option<&DirFd>], _: &(), rel: &[u8]) -> Result<Visited<()>> {
        // Names and kinds decide what goes: no stat where the listing tells the kind.
        let mut entries = source::kinds_merged(self.sources, srcs, rel, self.filter)?;
        let live = self.ix.entries(rel)?;
        let mut deleted = 0;
        let mut subdirs = Vec::new();
        crate::index::pair(&mut entries, &live, |e, l| {
            if let Some(l) = l {
                deleted += self.ix.gone(rel, l, e.as_deref());
            }
            if let (Some(e), Some(l)) = (e, l) {
                if let (Node::Dir(d), Node::Dir(_)) = (&e.node, &l.node) {
                    subdirs.push(Sub {
                        name: e.name.clone(),
                        srcs: d.srcs,
                        keep: (),
                    });
                }
            }
        });
        Ok((deleted, subdirs))
    }

    fn enter(&self, _: &(), _: &(), _: &[u8], _: &[u8]) -> Result<()> {
        Ok(())
    }
}

/// What `plan_live` compares: the sources with the live generation, as
/// a dry run sees them.
pub struct Survey<'a> {
    /// Every SOURCE, in order; each `lists_by_directory`.
    pub sources: &'a [&'a dyn Source],
    pub filter: &'a Filter,
    /// Where skipped entries (of either side) are reported.
    pub reporter: &'a dyn Reporter,
    /// What the sync does to a source entry's owner and mode.
    pub adjust: &'a (dyn Fn(&mut Meta, Kind) + Sync),
    pub compare: Compare,
    /// The live generation (none on a first sync).
    pub live: Option<LiveSide<'a>>,
    /// List the changes (`--itemize`), not only count them.
    pub list: bool,
    /// What an earlier plan of this round found drifted in the live tree's
    /// hardlinks: those files' groups are taken from their inodes, as a
    /// listing's are.
    pub drifted: Option<&'a LinksDrift>,
}

/// What a plan found drifted in the live tree's hardlinks since its
/// manifest was written: live inodes that more paths share than it
/// records (`inode_key`s: files joined), and recorded groups not found
/// whole on one inode (split, or a path gone). A plan made again with it
/// (`Survey::drifted`) groups those files by their inodes, as the
/// whole-tree plan groups every file, and trusts the manifest for the
/// rest; the stage then avoids them (`Surveyed::avoid`).
#[derive(Debug, Default)]
pub struct LinksDrift {
    keys: Vec<u64>,
    groups: Vec<u32>,
}

/// Group numbers given to live files grouped by inode where their
/// recorded group drifted: counted down from here, far above any group a
/// manifest numbers.
const BY_INODE: u32 = u32::MAX;

/// The live tree as a dry run compares with it: its listing, with the
/// hashes, attributes and hardlink groups its manifest records for entries
/// the listing still shows as recorded (how the whole-tree path attaches
/// them); or its listing alone, where there is no manifest to read (a live
/// generation whose manifest is missing, a DEST that is a plain directory
/// to take over): no hash (nothing is reused), hardlink groups by inode.
#[derive(Clone, Copy)]
pub struct LiveSide<'a> {
    pub root: &'a DirFd,
    pub label: &'a str,
    /// The live manifest's index, and how its entries are matched with the
    /// listing's; `None`: the listing alone.
    pub recorded: Option<(&'a crate::index::Index, Compare)>,
    /// Where what the live listing skips (a FIFO) is reported: no stage
    /// lists the live tree again to say it.
    pub reporter: &'a dyn Reporter,
    /// Files `verify` found damaged: compared as changed.
    pub damaged: Option<&'a crate::damage::Damaged>,
}

/// What `plan_live` found.
pub struct Surveyed {
    pub plan: plan::Plan,
    /// The sources' entries below the root, and bytes of file content.
    pub entries: u64,
    pub bytes: u64,
    /// The names at the top of the sources, and of the live listing.
    pub top: Vec<Vec<u8>>,
    pub live_top: Vec<Vec<u8>>,
    /// Planned with `Survey::drifted`: what the stage must not hardlink
    /// from the live tree (the joined inodes, the drifted groups).
    pub avoid: Option<crate::plan::Drifted>,
    /// Planned against a live listing (no manifest): the inodes, by
    /// (device, inode), that two of its paths or more are on, sorted. Its
    /// hardlink groups as the whole-tree path numbers them, for a stage
    /// that lists the live tree again (`stage::Against::Listed`).
    pub shared: Vec<(u64, u64)>,
}

/// `plan_live`, and where the live tree's hardlinks drifted from its
/// manifest, once more with what drifted (`Survey::drifted`). `None` where
/// the second plan finds drift too (the live tree changed in between, or
/// a drift only whole trees tell): the whole trees decide then.
pub fn plan_live_or_drifted(s: &Survey<'_>) -> Result<Option<Surveyed>> {
    match plan_live(s)? {
        Ok(planned) => Ok(Some(planned)),
        Err(drift) if s.drifted.is_none() && s.compare.hardlinks => {
            let again = Survey {
                drifted: Some(&drift),
                ..*s
            };
            Ok(plan_live(&again)?.ok())
        }
        Err(_) => Ok(None),
    }
}

/// The plan of a sync, made a directory at a time (`plan::dir` on each
/// directory's listings, in parallel across directories) with no tree
/// held whole: only the changes are kept, and only where they are listed.
///
/// Hardlinks are decided as the whole-tree plan decides them
/// (`plan::broken_links`), from what is held for the files that may share
/// an inode: each source file of more than one link (its inode, counted),
/// and each live file its manifest records in a group. The live listing's
/// groups are taken to be the manifest's, which is checked: every path of
/// a recorded group is there, on one inode, and no other live file (a
/// few bits each, `distinct::Distinct`) is on it or on another's. What
/// drifted where that does not hold (`LinksDrift`): the walk goes on to
/// its end to name it all. On a volume that does not show
/// hardlinks (`hardlinks 0`) the inodes say nothing: a group is on one
/// inode by its recorded number (`attach_recorded`), and every path of it
/// must still be there as recorded.
pub fn plan_live(s: &Survey<'_>) -> Result<Result<Surveyed, LinksDrift>> {
    let mut root = Meta::default();
    for src in s.sources {
        root = src.root_meta(s.filter)?;
    }
    (s.adjust)(&mut root, Kind::Dir);
    let mut plan = plan::Plan::new(s.list);
    let live_root = match &s.live {
        Some(l) => {
            let st = l
                .root
                .fstat()
                .with_context(|| format!("cannot stat {}", l.label))?;
            let mut m = meta_of(&st, 0);
            let dir = |meta| Entry {
                name: Default::default(),
                meta,
                node: Node::Dir(Default::default()),
            };
            if let Some((ix, c)) = &l.recorded {
                if plan::same_entry(&dir(ix.root), &dir(m), c) {
                    m.xattrs = ix.root.xattrs;
                }
            }
            Some(m)
        }
        None => None,
    };
    plan::root(&mut plan, root, live_root, &s.compare);
    let v = Surveying {
        s,
        plan: Mutex::new(plan),
        entries: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        top: Mutex::new([Vec::new(), Vec::new()]),
        drifted: Mutex::new(Vec::new()),
        src_links: Mutex::new(HashMap::new()),
        live_groups: Mutex::new(HashMap::new()),
        live_inodes: Mutex::new(crate::distinct::Distinct::collecting()),
        listed_links: Mutex::new(HashMap::new()),
        by_inode: Mutex::new(Vec::new()),
        by_inode_reused: Mutex::new(Vec::new()),
        kept: Mutex::new(Vec::new()),
    };
    let roots: Vec<Option<&DirFd>> = s.sources.iter().map(|src| src.root()).collect();
    let live = s.live.as_ref().map(|l| l.root.try_clone()).transpose()?;
    crate::walk::run(&v, s.sources, &roots, &live)?;
    // The live groups are the manifest's: each whole, on an inode of its
    // own (but those grouped by inode, a listing's). A listing's are its
    // inodes of two paths or more.
    let live_groups = v.live_groups.into_inner().unwrap();
    let index = s.live.as_ref().and_then(|l| l.recorded.as_ref());
    let listed_groups: Option<HashSet<u32>> = match index {
        Some((ix, _)) => {
            let mut drifted = v.drifted.into_inner().unwrap();
            let mut apart = v.live_inodes.into_inner().unwrap();
            let mut listed = HashSet::new();
            let by_inode = BY_INODE - v.listed_links.lock().unwrap().len() as u32;
            for (g, (ino, n)) in live_groups {
                apart.insert(ino);
                if g > by_inode {
                    if n > 1 {
                        listed.insert(g);
                    }
                    continue;
                }
                listed.insert(g);
                if n < 2 || n != u64::from(ix.group_paths(g)) {
                    drifted.push(g);
                }
            }
            let keys = apart.twice();
            if !keys.is_empty() || !drifted.is_empty() {
                drifted.sort_unstable();
                drifted.dedup();
                return Ok(Err(LinksDrift {
                    keys,
                    groups: drifted,
                }));
            }
            s.drifted.map(|_| listed)
        }
        None => Some(
            live_groups
                .into_iter()
                .filter(|(_, (_, n))| *n > 1)
                .map(|(g, _)| g)
                .collect(),
        ),
    };
    let mut shared: Vec<(u64, u64)> = match (index, &listed_groups) {
        (None, Some(groups)) => v
            .listed_links
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, g)| groups.contains(g))
            .map(|(&inode, _)| inode)
            .collect(),
        _ => Vec::new(),
    };
    shared.sort_unstable();
    let mut plan = v.plan.into_inner().unwrap();
    let mut bytes = v.bytes.into_inner();
    // A source inode of two paths or more is a group: its bytes once.
    let mut src_paths: HashMap<u32, u64> = HashMap::new();
    for i in v.src_links.into_inner().unwrap().into_values() {
        if i.paths > 1 {
            src_paths.insert(i.id, i.paths);
            bytes -= (i.paths - 1) * i.size;
        }
    }
    let kept: Vec<(KeptFile, bool, u64)> = v
        .kept
        .into_inner()
        .unwrap()
        .into_iter()
        .map(|((path, sg, lg, outside), reused, size)| {
            let sg = sg.filter(|g| src_paths.contains_key(g));
            let lg = lg.filter(|g| listed_groups.as_ref().is_none_or(|l| l.contains(g)));
            ((path, sg, lg, outside), reused, size)
        })
        .filter(|((_, sg, lg, _), ..)| sg.is_some() || lg.is_some())
        .collect();
    let pairs: Vec<plan::Kept<u32>> = kept
        .iter()
        .map(|((_, sg, lg, o), ..)| (*sg, *lg, *o))
        .collect();
    let broken = plan::broken_links(&pairs, |g| src_paths.get(g).copied().unwrap_or(0) as usize);
    let mut by_inode_reused: HashSet<Vec<u8>> = v
        .by_inode_reused
        .into_inner()
        .unwrap()
        .into_iter()
        .collect();
    for (((path, ..), reused, size), broken) in kept.iter().zip(broken) {
        if broken {
            plan.apart(path, *reused, *size);
            by_inode_reused.remove(path.as_slice());
        }
    }
    // The stage that follows copies every file grouped by inode (it does
    // not see inodes a listing's way): where the plan reuses one, the
    // whole trees decide, so the two agree.
    if !by_inode_reused.is_empty() {
        return Ok(Err(LinksDrift::default()));
    }
    plan.sort();
    let [top, live_top] = v.top.into_inner().unwrap();
    let avoid = s.drifted.map(|d| {
        let mut joined = v.by_inode.into_inner().unwrap();
        joined.sort_unstable();
        joined.dedup();
        crate::plan::Drifted::new(joined, d.groups.clone())
    });
    Ok(Ok(Surveyed {
        plan,
        entries: v.entries.into_inner(),
        bytes,
        top,
        live_top,
        avoid,
        shared,
    }))
}

/// A file kept equal that is hardlinked on either side (`plan::Pair`).
type KeptFile = plan::Pair;

/// A source inode of more than one link: an id (its group, if it turns
/// out to be one), the paths found on it, its size.
struct SrcInode {
    id: u32,
    paths: u64,
    size: u64,
}

/// One `plan_live` walk, shared by its threads.
struct Surveying<'a> {
    s: &'a Survey<'a>,
    plan: Mutex<plan::Plan>,
    entries: AtomicU64,
    bytes: AtomicU64,
    /// The names at the top: the sources', the live listing's.
    top: Mutex<[Vec<Vec<u8>>; 2]>,
    /// Each recorded group a path of which is on another inode than the
    /// group's (split on the volume since).
    drifted: Mutex<Vec<u32>>,
    /// Each source inode of more than one link, by (device, inode).
    src_links: Mutex<HashMap<(u64, u64), SrcInode>>,
    /// Each recorded live group: (its inode, the paths found on it).
    live_groups: Mutex<HashMap<u32, (u64, u64)>>,
    /// The inodes of the other live files: none may be two paths'.
    live_inodes: Mutex<crate::distinct::Distinct>,
    /// A live listing without a manifest: each live inode of more than one
    /// link, by (device, inode), and the group id it is given. With a
    /// manifest, planned with `Survey::drifted`: the same for the files
    /// grouped by inode, numbered down from `BY_INODE`.
    listed_links: Mutex<HashMap<(u64, u64), u32>>,
    /// Planned with `Survey::drifted`: the inode numbers of the live files
    /// on a joined inode.
    by_inode: Mutex<Vec<u64>>,
    /// Planned with `Survey::drifted`: the paths of the files grouped by
    /// inode that the plan marked for reuse (all but those whose
    /// hardlinks turn out broken are reused).
    by_inode_reused: Mutex<Vec<Vec<u8>>>,
    /// Files kept equal that are hardlinked on either side (with a
    /// source inode's id as its group for now), whether each was to be
    /// reused, and its size.
    kept: Mutex<Vec<(KeptFile, bool, u64)>>,
}

/// What only the live manifest knows, given to a live directory's listing
/// (`listed`) from the same directory's recorded entries (`recorded`,
/// sorted by name): each file its recorded hardlink group, and each entry
/// still as recorded (matched by `c`, as the whole-tree path attaches
/// them) its recorded extended attributes and hash.
///
/// Where the volume does not show hardlinks (`c.hardlinks` false), the
/// groups are only the manifest's: a file still as recorded takes its
/// recorded group, and with it the identity `group_identity` gives, so
/// that the group's paths share an inode as `plan::Links` sees them; any
/// other file is a file of one link.
fn attach_recorded(listed: &mut [Entry], recorded: &[Entry], c: &Compare) {
    for e in listed.iter_mut() {
        let me = recorded
            .binary_search_by(|r| r.name.cmp(&e.name))
            .ok()
            .map(|i| &recorded[i]);
        let same = me.is_some_and(|me| plan::same_entry(me, e, c));
        if let (Node::File(f), Some(Node::File(mf))) = (&mut e.node, me.map(|me| &me.node)) {
            f.group = mf.group.filter(|_| c.hardlinks || same);
        }
        if !c.hardlinks {
            group_identity(e);
        }
        let Some(me) = me.filter(|_| same) else {
            continue;
        };
        e.meta.xattrs = me.meta.xattrs;
        if let (Node::File(f), Node::File(mf)) = (&mut e.node, &me.node) {
            f.hash = mf.hash;
        }
    }
}

/// A file's identity as its recorded hardlink group gives it: the paths
/// of group `g` on one inode (on a device no volume has, numbered down
/// from the last inode number, far from any a filesystem hands out), a
/// file of no group of one link (on the inode it has). For the entries of
/// a manifest (`recorded_entries`), and for a listing of a volume that
/// does not show hardlinks once each file has its recorded group
/// (`attach_recorded`).
fn group_identity(e: &mut Entry) {
    if let Node::File(f) = &mut e.node {
        match f.group {
            Some(g) => (f.dev, f.ino, f.nlink) = (u64::MAX, u64::MAX - u64::from(g), 2),
            None => f.nlink = 1,
        }
    }
}

/// One number for a file's (device, inode), for a `Distinct`: two that
/// collide only send the caller to its whole-tree path.
pub(crate) fn inode_key(dev: u64, ino: u64) -> u64 {
    ino ^ dev.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

impl Surveying<'_> {
    /// The live directory at `rel`, with what its manifest records: each
    /// file as recorded gets the recorded hash and attributes, and every
    /// file the group its manifest gives it. Without a manifest, each file
    /// of more than one link gets its inode's group for now (a group if
    /// two paths turn out to be on it, as the whole-tree path numbers them).
    fn live_entries(&self, live: &DirFd, rel: &[u8]) -> Result<(Vec<Entry>, Vec<Vec<u8>>)> {
        let l = self.s.live.as_ref().expect("a live handle");
        let mut listed = source::Dir::list(live, rel, l.label, 0, &Filter::default(), l.reporter)?;
        let mut by_inode = Vec::new();
        match &l.recorded {
            Some((ix, c)) => {
                attach_recorded(&mut listed, &ix.entries(rel)?, c);
                if let Some(d) = self.s.drifted {
                    by_inode = self.by_inode(d, &mut listed);
                }
            }
            None => {
                let mut links = self.listed_links.lock().unwrap();
                for e in listed.iter_mut() {
                    if let Node::File(f) = &mut e.node {
                        if f.nlink > 1 {
                            let id = links.len() as u32;
                            f.group = Some(*links.entry((f.dev, f.ino)).or_insert(id));
                        }
                    }
                }
            }
        }
        if let Some(d) = l.damaged {
            for e in listed.iter_mut() {
                d.forget(&crate::tree::join(rel, &e.name), e);
            }
        }
        Ok((listed, by_inode))
    }

    /// The live files of one directory whose recorded group drifted, or
    /// whose inode was found joined (`LinksDrift`), grouped by inode as a
    /// listing's files are: a group if two paths turn out to be on it.
    /// Their names.
    fn by_inode(&self, d: &LinksDrift, listed: &mut [Entry]) -> Vec<Vec<u8>> {
        let mut names = Vec::new();
        let mut links = self.listed_links.lock().unwrap();
        for e in listed.iter_mut() {
            let Node::File(f) = &mut e.node else { continue };
            let joined = d.keys.binary_search(&inode_key(f.dev, f.ino)).is_ok();
            let split = f.group.is_some_and(|g| d.groups.binary_search(&g).is_ok());
            if !joined && !split {
                continue;
            }
            if joined {
                self.by_inode.lock().unwrap().push(f.ino);
            }
            f.group = (f.nlink > 1).then(|| {
                let id = BY_INODE - links.len() as u32;
                *links.entry((f.dev, f.ino)).or_insert(id)
            });
            names.push(e.name.to_vec());
        }
        names
    }

    /// `--checksum`: every file of the directory at `rel` whose live file
    /// has its size, read on both sides (a source file's hash where its
    /// stream gave none; the live file's from its bytes, not its
    /// manifest), as the whole-tree path hashes them.
    fn hash_pairs(
        &self,
        srcs: &[Option<&DirFd>],
        live: &DirFd,
        rel: &[u8],
        merged: &mut [Entry],
        live_entries: &mut [Entry],
    ) -> Result<()> {
        let label = self.s.live.as_ref().map_or("", |l| l.label);
        let digest = |dir: &DirFd, label: &str, name: &[u8], size: u64| -> Result<[u8; 32]> {
            let path = crate::tree::join(rel, name);
            digest(dir.open_read(name), size, &|| display(label, &path))
        };
        let mut li = 0;
        for e in merged.iter_mut() {
            while li < live_entries.len() && live_entries[li].name < e.name {
                li += 1;
            }
            let Some(l) = live_entries.get_mut(li).filter(|l| l.name == e.name) else {
                continue;
            };
            let size = e.meta.size;
            let (Node::File(sf), Node::File(lf)) = (&mut e.node, &mut l.node) else {
                continue;
            };
            if size != l.meta.size {
                continue;
            }
            lf.hash = Some(digest(live, label, &l.name, size)?);
            if sf.hash.is_none() {
                let i = sf.src as usize;
                let dir = srcs[i].context("a listed source has its directory")?;
                sf.hash = Some(digest(dir, self.s.sources[i].label(), &e.name, size)?);
            }
        }
        Ok(())
    }

    /// Note the files of one directory that may share an inode: a source
    /// file of more than one link gets its inode's id as its group for
    /// now; a live file in a recorded group must be on the group's inode.
    fn note_links(&self, merged: &mut [Entry], live: &[Entry]) {
        let mut links = self.src_links.lock().unwrap();
        for e in merged.iter_mut() {
            let size = e.meta.size;
            if let Node::File(f) = &mut e.node {
                if f.nlink > 1 {
                    let id = links.len() as u32;
                    let i = links
                        .entry((f.dev, f.ino))
                        .or_insert(SrcInode { id, paths: 0, size });
                    i.paths += 1;
                    f.group = Some(i.id);
                }
            }
        }
        drop(links);
        // A listing's groups are its inodes: nothing to check them against.
        let recorded = self.s.live.as_ref().is_some_and(|l| l.recorded.is_some());
        let mut keys = Vec::new();
        let mut groups = self.live_groups.lock().unwrap();
        for e in live {
            let Node::File(f) = &e.node else { continue };
            let ino = inode_key(f.dev, f.ino);
            match f.group {
                Some(g) => {
                    let (on, n) = groups.entry(g).or_insert((ino, 0));
                    *n += 1;
                    if *on != ino {
                        self.drifted.lock().unwrap().push(g);
                    }
                }
                None if recorded => keys.push(ino),
                None => {}
            }
        }
        drop(groups);
        if !keys.is_empty() {
            let mut d = self.live_inodes.lock().unwrap();
            keys.into_iter().for_each(|k| d.insert(k));
        }
    }
}

impl Visit for Surveying<'_> {
    /// The live generation's handle on the directory, where it has one.
    type Dir = Option<DirFd>;
    /// Whether the live generation has the subdirectory.
    type Keep = bool;

    fn visit(
        &self,
        srcs: &[Option<&DirFd>],
        live: &Option<DirFd>,
        rel: &[u8],
    ) -> Result<Visited<bool>> {
        let s = self.s;
        let mut merged = source::list_merged(s.sources, srcs, rel, s.filter, s.reporter)?;
        for e in merged.iter_mut() {
            let kind = e.kind();
            (s.adjust)(&mut e.meta, kind);
        }
        let (mut live_entries, by_inode) = match live {
            Some(fd) => self.live_entries(fd, rel)?,
            None => Default::default(),
        };
        match (s.compare.checksum, live) {
            (true, Some(fd)) => self.hash_pairs(srcs, fd, rel, &mut merged, &mut live_entries)?,
            _ => hash_by_content(s.sources, srcs, rel, &mut merged, &live_entries, &s.compare)?,
        }
        self.note_links(&mut merged, &live_entries);
        let bytes: u64 = merged
            .iter()
            .filter(|e| matches!(e.node, Node::File(_)))
            .map(|e| e.meta.size)
            .sum();
        self.entries
            .fetch_add(merged.len() as u64, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        if rel.is_empty() {
            let names = |es: &[Entry]| es.iter().map(|e| e.name.to_vec()).collect();
            *self.top.lock().unwrap() = [names(&merged), names(&live_entries)];
        }
        let mut here = plan::Plan::new(s.list);
        let mut pairs = Vec::new();
        let below = plan::dir(
            &mut merged,
            &live_entries,
            rel,
            &s.compare,
            &mut here,
            &mut pairs,
        );
        self.plan.lock().unwrap().absorb(here);
        // Files grouped by inode that the plan reuses: the stage, which
        // copies every such file, would not.
        for name in by_inode {
            if let Ok(i) = merged.binary_search_by(|e| (*e.name).cmp(&name)) {
                if matches!(&merged[i].node, Node::File(f) if f.reuse) {
                    let path = crate::tree::join(rel, &name);
                    self.by_inode_reused.lock().unwrap().push(path);
                }
            }
        }
        if !pairs.is_empty() {
            // Each pair's file, by its name: whether it was to be reused, its size.
            let kept = pairs.into_iter().map(|pair| {
                let name = pair.0.rsplit(|&b| b == b'/').next().unwrap_or(&[]);
                let e = merged
                    .binary_search_by(|e| (*e.name).cmp(name))
                    .map(|i| &merged[i]);
                let (reused, size) = match e {
                    Ok(Entry {
                        meta,
                        node: Node::File(f),
                        ..
                    }) => (f.reuse, meta.size),
                    _ => (false, 0),
                };
                (pair, reused, size)
            });
            self.kept.lock().unwrap().extend(kept);
        }
        let subs = below
            .into_iter()
            .map(|b| {
                let (name, srcs) = match b.src.map(|i| &merged[i]) {
                    Some(Entry {
                        name,
                        node: Node::Dir(d),
                        ..
                    }) => (name.clone(), d.srcs),
                    _ => (live_entries[b.live.expect("one side")].name.clone(), 0),
                };
                Sub {
                    name,
                    srcs,
                    keep: b.live.is_some(),
                }
            })
            .collect();
        Ok((0, subs))
    }

    fn enter(
        &self,
        live: &Option<DirFd>,
        keep: &bool,
        name: &[u8],
        path: &[u8],
    ) -> Result<Option<DirFd>> {
        match (live, keep) {
            (Some(fd), true) => {
                let label = self.s.live.as_ref().map_or("", |l| l.label);
                crate::walk::open_sub(fd, name, label, path).map(Some)
            }
            _ => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_follows_gitignore_rules_in_order() {
        let f = Filter::new(&[
            "*.pyc".into(),
            "__pycache__/".into(),
            "!keep.pyc".into(),
            ".git/".into(),
        ])
        .unwrap();
        assert!(f.excludes(b"a/b.pyc", false));
        assert!(!f.excludes(b"a/keep.pyc", false));
        assert!(f.excludes(b"pack/__pycache__", true));
        assert!(!f.excludes(b"pack/__pycache__", false));
        assert!(f.excludes(b".git", true));
        assert!(!f.excludes(b"actions/run.py", false));
    }

    /// A listing of a volume that shows no hardlinks (each path its own
    /// inode, one link) against its manifest's group of `a` and `b`.
    #[test]
    fn a_volume_without_hardlinks_takes_its_groups_from_the_manifest() {
        let file = |name: &str, ino: u64, group: Option<u32>| Entry {
            name: name.as_bytes().into(),
            meta: Meta {
                mode: 0o644,
                size: 1,
                ..Meta::default()
            },
            node: Node::File(crate::tree::File {
                ino,
                nlink: 1,
                group,
                ..Default::default()
            }),
        };
        let recorded = [
            file("a", 0, Some(7)),
            file("b", 0, Some(7)),
            file("c", 0, None),
        ];
        let c = |hardlinks| Compare {
            owners: true,
            checksum: false,
            granularity_ns: 1,
            link_meta: true,
            by_content: 0,
            xattrs: false,
            hardlinks,
        };
        // A source pair: `a` and `b` on one inode, `c` alone.
        let mut src = [file("a", 1, None), file("b", 1, None), file("c", 2, None)];
        for e in src.iter_mut().take(2) {
            if let Node::File(f) = &mut e.node {
                f.nlink = 2;
            }
        }
        let same = |live: &[Entry]| {
            let links = Mutex::new(plan::Links::default());
            same_here(&src, live, &c(false), &links).is_some()
                && links.into_inner().unwrap().consistent()
        };
        let listed = || {
            vec![
                file("a", 10, None),
                file("b", 11, None),
                file("c", 12, None),
            ]
        };
        // As the volume lists them, the pair is two files: not the source's.
        assert!(!same(&listed()));
        // With the manifest's group, one inode: the same.
        let mut live = listed();
        attach_recorded(&mut live, &recorded, &c(false));
        assert!(same(&live), "{live:?}");
        // `b` replaced since (another size): not in the group any more.
        let mut live = listed();
        live[1].meta.size = 2;
        attach_recorded(&mut live, &recorded, &c(false));
        let Node::File(b) = &live[1].node else {
            panic!("a file")
        };
        assert_eq!((b.group, b.nlink), (None, 1));
        // A volume that shows hardlinks keeps its listing's inodes.
        let mut live = listed();
        attach_recorded(&mut live, &recorded, &c(true));
        assert!(!same(&live));
    }
}
