//! Plan: compare the source tree with the live one and decide, per entry,
//! what the new generation needs. Pure: no I/O, so the mirror's logic is
//! tested here cheaply.
//!
//! The plan marks each source file that may be hardlinked from the live
//! generation (`File::reuse`, taking the live hash with it) and lists the
//! changes a user sees with `--itemize`: `+` added, `~` changed, `-` deleted.

use std::collections::HashMap;

use crate::distinct::Distinct;

use crate::tree::{Entry, Kind, Meta, Node, Time, Tree};

/// How "unchanged" is judged.
#[derive(Clone, Copy, Debug)]
pub struct Compare {
    /// Compare uid/gid (owners are mirrored: root or `--chown`).
    pub owners: bool,
    /// Compare file content by SHA-256 (both sides hashed) instead of size+mtime.
    pub checksum: bool,
    /// The live volume keeps mtimes to this many nanoseconds (sshfs: 1 s).
    pub granularity_ns: u64,
    /// Compare a symlink's own mtime and owner (not where the volume could
    /// not set them: the manifest's `linkmeta 0`).
    pub link_meta: bool,
    /// Bit i set: SOURCE i is streamed and hashed every file as it arrived
    /// (an archive, an image), so its files are compared by content, never
    /// by the quick check alone.
    pub by_content: u64,
    /// Compare extended attributes: false where one side is a listing of
    /// the volume, which does not read them (a drift check; copying the
    /// manifest's onto a listing), so that the manifest's are trusted as
    /// its hashes are.
    pub xattrs: bool,
    /// A live group of hardlinks is one inode on the volume (the live
    /// manifest's `hardlinks 1`). False where the volume does not show
    /// hardlinks (`hardlinks 0`, sshfs): a live file's group is the one
    /// its manifest records, and its inode tells nothing of it.
    pub hardlinks: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Add,
    Change,
    Delete,
}

impl Op {
    pub fn symbol(self) -> char {
        match self {
            Op::Add => '+',
            Op::Change => '~',
            Op::Delete => '-',
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub op: Op,
    pub kind: Kind,
    /// Relative path; `.` is the root directory.
    pub path: Vec<u8>,
}

#[derive(Debug, Default)]
pub struct Plan {
    /// The changes in path order, when they are listed (`build`; not with
    /// `build_counted`, which saves a path per entry on a first sync).
    pub changes: Vec<Change>,
    /// Whether `changes` is filled in.
    listed: bool,
    /// Changes found, listed or not.
    found: u64,
    pub added: u64,
    pub changed: u64,
    pub deleted: u64,
    /// Files to hardlink from the live generation.
    pub reused: u64,
    /// Files to copy from a source, and their bytes.
    pub copied: u64,
    pub copied_bytes: u64,
}

impl Plan {
    /// An empty plan that lists its changes (`list`) or only counts them.
    pub fn new(list: bool) -> Plan {
        Plan {
            listed: list,
            ..Plan::default()
        }
    }

    /// Add what `other` found (a plan of other directories).
    pub fn absorb(&mut self, other: Plan) {
        self.changes.extend(other.changes);
        self.found += other.found;
        self.added += other.added;
        self.changed += other.changed;
        self.deleted += other.deleted;
        self.reused += other.reused;
        self.copied += other.copied;
        self.copied_bytes += other.copied_bytes;
    }

    /// The file at `path`, kept equal, must not be hardlinked from the live
    /// tree after all, as its hardlinks differ (`broken_links`): a change,
    /// and a copy where it was to be reused (`reused`; `size` its bytes).
    pub fn apart(&mut self, path: &[u8], reused: bool, size: u64) {
        self.changed += 1;
        self.note(Op::Change, Kind::File, path);
        if reused {
            self.reused -= 1;
            self.copied += 1;
            self.copied_bytes += size;
        }
    }

    /// The changes in path order, each once: what `--itemize` shows, however
    /// the directories were compared.
    pub fn sort(&mut self) {
        if self.changes.len() > 1 {
            self.changes
                .sort_by(|a, b| a.path.cmp(&b.path).then((a.op as u8).cmp(&(b.op as u8))));
            self.changes
                .dedup_by(|a, b| a.path == b.path && a.op == b.op);
        }
    }

    /// Nothing to do: the live tree already equals the source.
    pub fn up_to_date(&self) -> bool {
        self.found == 0
    }

    fn note(&mut self, op: Op, kind: Kind, path: &[u8]) {
        self.found += 1;
        if self.listed {
            self.changes.push(Change {
                op,
                kind,
                path: path.to_vec(),
            });
        }
    }
}

/// Whether a time read from a volume that keeps mtimes to `g` nanoseconds
/// (sshfs: 1 s, a FAT-like volume: 2 s) equals a source time: it must be
/// the source time truncated down to a multiple of `g`, never merely within
/// `g` of it (61.9 s and 62.0 s are different times). Only the source time
/// is truncated: a volume time that is not a multiple of `g` is not what
/// such a volume stores, so it equals no source time but its own.
pub fn mtime_eq(source: Time, volume: Time, g: u64) -> bool {
    truncate(source, g) == volume
}

/// `t` as a volume keeping `g` nanoseconds stores it: the multiple of `g`
/// at or below it (also before the epoch).
fn truncate(t: Time, g: u64) -> Time {
    if g <= 1 {
        return t;
    }
    const GIGA: i128 = 1_000_000_000;
    let ns = t.s as i128 * GIGA + t.ns as i128;
    let kept = ns - ns.rem_euclid(g as i128);
    Time {
        s: kept.div_euclid(GIGA) as i64,
        ns: kept.rem_euclid(GIGA) as u32,
    }
}

fn meta_eq(a: &Meta, b: &Meta, kind: Kind, c: &Compare) -> bool {
    let own_meta = kind != Kind::Symlink || c.link_meta;
    (kind == Kind::Symlink || a.mode == b.mode)
        && (kind != Kind::File || a.size == b.size)
        && (!c.owners || !own_meta || (a.uid == b.uid && a.gid == b.gid))
        && (!own_meta || mtime_eq(a.mtime, b.mtime, c.granularity_ns))
        && (!c.xattrs || a.xattrs == b.xattrs)
}

/// Whether a live entry equals its source entry, the children of directories aside.
pub fn same_entry(src: &Entry, live: &Entry, c: &Compare) -> bool {
    if src.kind() != live.kind() || !meta_eq(&src.meta, &live.meta, src.kind(), c) {
        return false;
    }
    match (&src.node, &live.node) {
        (Node::Symlink(a), Node::Symlink(b)) => a == b,
        (Node::File(a), Node::File(b)) => !c.checksum || (a.hash.is_some() && a.hash == b.hash),
        _ => true,
    }
}

/// A file of a streamed source (`Compare::by_content`: it hashed every
/// file as it arrived) is the live one only if the live file's hash is
/// known and equal: never by size and mtime alone, as reproducible
/// builds give every file one mtime and a same-size edit would go stale.
pub fn same_content(src: &Entry, live: &Entry, c: &Compare) -> bool {
    match (&src.node, &live.node) {
        (Node::File(a), Node::File(b))
            if c.by_content & 1u64.checked_shl(a.src.into()).unwrap_or(0) != 0 =>
        {
            a.hash.is_some() && a.hash == b.hash
        }
        _ => true,
    }
}

/// Whether the entries of one directory equal the live directory's, name by
/// name (`same_entry`): how a walk that holds one directory at a time
/// (`scan::compare_live`) compares. The children of subdirectories are
/// compared when the walk reaches them; hardlinks through `Links`.
pub fn same_dir(src: &[Entry], live: &[Entry], c: &Compare) -> bool {
    src.len() == live.len()
        && src
            .iter()
            .zip(live)
            .all(|(s, l)| s.name == l.name && same_entry(s, l, c))
}

/// The hardlink half of a compare made a directory at a time: whether the
/// files that share an inode in the source are exactly those that share
/// one in the live tree. Pairs whose source file has more than one link
/// are remembered in 12 bytes each (the live inode and an id for the source
/// inode), plus one map entry per multiply-linked source inode. A source
/// file of one link whose live file has more (after an update, nearly every
/// file: its other link is in the previous generation) only needs its live
/// inode to be no other path's: those are told apart in a few bits each
/// (`Distinct`).
#[derive(Default)]
pub struct Links {
    /// Source inodes with more than one link, (dev, ino) → id.
    ids: HashMap<(u64, u64), u32>,
    /// (live inode high, low, source id) of each pair of such a file.
    grouped: Vec<[u32; 3]>,
    /// The live inodes of source files of one link.
    singles: Distinct,
}

impl Links {
    /// Note a source file and the live file at its path (equal one by one).
    /// Whether the source file's content is counted here for the first
    /// time: false for the second and later links of one inode.
    pub fn pair(&mut self, src: &crate::tree::File, live: &crate::tree::File) -> bool {
        if src.nlink <= 1 && live.nlink <= 1 {
            return true;
        }
        if src.nlink <= 1 {
            self.singles.insert(live.ino);
            return true;
        }
        let next = self.ids.len() as u32;
        let id = *self.ids.entry((src.dev, src.ino)).or_insert(next);
        self.grouped
            .push([(live.ino >> 32) as u32, live.ino as u32, id]);
        id == next
    }

    /// Already known not to be consistent: the walk may stop.
    pub fn broken(&self) -> bool {
        self.singles.seen_twice()
    }

    /// The two partitions into inodes are the same: each live inode holds
    /// the paths of one source inode, and each source inode those of one
    /// live inode.
    pub fn consistent(mut self) -> bool {
        let one_to_one =
            |pairs: &[[u32; 3]], key: fn(&[u32; 3]) -> u64, val: fn(&[u32; 3]) -> u64| {
                pairs
                    .chunk_by(|a, b| key(a) == key(b))
                    .all(|run| run.iter().all(|p| val(p) == val(&run[0])))
            };
        let live = |p: &[u32; 3]| (p[0] as u64) << 32 | p[1] as u64;
        let src = |p: &[u32; 3]| p[2] as u64;
        self.grouped.sort_unstable();
        if !one_to_one(&self.grouped, live, src) {
            return false;
        }
        // Each group's live inode is no single file's.
        for run in self.grouped.chunk_by(|a, b| live(a) == live(b)) {
            self.singles.insert(live(&run[0]));
        }
        self.grouped.sort_unstable_by_key(|p| (p[2], p[0], p[1]));
        one_to_one(&self.grouped, src, live) && self.singles.all_distinct()
    }
}

/// Compare `src` with `live` (absent on a first sync), marking reusable files
/// in `src`, and list the changes (`--itemize`).
pub fn build(src: &mut Tree, live: Option<&Tree>, c: &Compare) -> Plan {
    build_with(src, live, c, true)
}

/// The same, counting the changes without listing them.
pub fn build_counted(src: &mut Tree, live: Option<&Tree>, c: &Compare) -> Plan {
    build_with(src, live, c, false)
}

fn build_with(src: &mut Tree, live: Option<&Tree>, c: &Compare, list: bool) -> Plan {
    let mut plan = Plan::new(list);
    let empty = Vec::new();
    let live_entries = live.map(|l| &l.entries).unwrap_or(&empty);
    root(&mut plan, src.root, live.map(|l| l.root), c);
    let mut pairs = Vec::new();
    diff(
        &mut src.entries,
        live_entries,
        &mut Vec::new(),
        c,
        &mut plan,
        &mut pairs,
    );
    check_groups(src, &pairs, &mut plan);
    plan
}

/// The root directory's change: its metadata against the live root's, or
/// added where nothing is live.
pub fn root(plan: &mut Plan, src: Meta, live: Option<Meta>, c: &Compare) {
    let dir = |meta| Entry {
        name: Default::default(),
        meta,
        node: Node::Dir(Default::default()),
    };
    match live {
        Some(l) if !same_entry(&dir(src), &dir(l), c) => {
            plan.changed += 1;
            plan.note(Op::Change, Kind::Dir, b".");
        }
        Some(_) => {}
        None => plan.note(Op::Add, Kind::Dir, b"."),
    }
}

/// (path, source group, live group, the source inode where the file has
/// links outside the tree) of every file kept equal, to check hardlinks.
pub type Pair = (Vec<u8>, Option<u32>, Option<u32>, Option<(u64, u64)>);

/// The whole trees compared: `dir` at every directory, folded.
fn diff(
    src: &mut [Entry],
    live: &[Entry],
    prefix: &mut Vec<u8>,
    c: &Compare,
    plan: &mut Plan,
    pairs: &mut Vec<Pair>,
) {
    for below in dir(src, live, prefix, c, plan, pairs) {
        let base = prefix.len();
        let name = match below.src {
            Some(i) => &src[i].name,
            None => &live[below.live.expect("one side")].name,
        };
        if base > 0 {
            prefix.push(b'/');
        }
        prefix.extend_from_slice(name);
        let live_children = match below.live.map(|i| &live[i].node) {
            Some(Node::Dir(d)) => &d.entries[..],
            _ => &[],
        };
        let src_children = match below.src.map(|i| &mut src[i].node) {
            Some(Node::Dir(d)) => &mut d.entries[..],
            _ => &mut [],
        };
        diff(src_children, live_children, prefix, c, plan, pairs);
        prefix.truncate(base);
    }
}

/// A subdirectory one `dir` leaves to compare: its index among the
/// source entries where the sources hold it as a directory (its children
/// are then added or compared), among the live entries where the live
/// tree does (its children are then deleted or compared).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Below {
    pub src: Option<usize>,
    pub live: Option<usize>,
}

/// Compare one directory: the sources' entries `src` (sorted by name)
/// with the live tree's `live` at the same path (`prefix`, empty at the
/// root), their children aside. Counts and notes each change in `plan`,
/// marks the files to reuse from the live tree (`File::reuse`, taking its
/// hash), keeps in `pairs` the files kept equal that are hardlinked on
/// either side, and returns the subdirectories to compare next. The one
/// comparer: the whole-tree plan folds it over both trees (`diff`); a walk
/// a directory at a time calls it on each directory's listings
/// (`scan::plan_live`).
pub fn dir(
    src: &mut [Entry],
    live: &[Entry],
    prefix: &[u8],
    c: &Compare,
    plan: &mut Plan,
    pairs: &mut Vec<Pair>,
) -> Vec<Below> {
    let mut below = Vec::new();
    let mut path = prefix.to_vec();
    let base = path.len();
    let at = |path: &mut Vec<u8>, name: &[u8]| {
        path.truncate(base);
        if base > 0 {
            path.push(b'/');
        }
        path.extend_from_slice(name);
    };
    let is_dir = |e: &Entry| matches!(e.node, Node::Dir(_));
    let mut li = 0;
    for (si, s) in src.iter_mut().enumerate() {
        while li < live.len() && live[li].name < s.name {
            at(&mut path, &live[li].name);
            deleted(&live[li], &path, plan);
            if is_dir(&live[li]) {
                below.push(Below {
                    src: None,
                    live: Some(li),
                });
            }
            li += 1;
        }
        at(&mut path, &s.name);
        let l = (li < live.len() && live[li].name == s.name).then(|| {
            li += 1;
            (li - 1, &live[li - 1])
        });
        match l {
            None => {
                added(s, &path, plan);
                if is_dir(s) {
                    below.push(Below {
                        src: Some(si),
                        live: None,
                    });
                }
            }
            Some((lj, l)) if l.kind() != s.kind() => {
                // A file became a directory or the like: the old one goes
                // (its children below), the new one comes.
                plan.changed += 1;
                plan.note(Op::Change, s.kind(), &path);
                count_copy(s, plan);
                if is_dir(s) || is_dir(l) {
                    below.push(Below {
                        src: is_dir(s).then_some(si),
                        live: is_dir(l).then_some(lj),
                    });
                }
            }
            Some((lj, l)) => {
                let same = same_entry(s, l, c) && same_content(s, l, c);
                if !same {
                    plan.changed += 1;
                    plan.note(Op::Change, s.kind(), &path);
                }
                match (&mut s.node, &l.node) {
                    (Node::Dir(_), Node::Dir(_)) => below.push(Below {
                        src: Some(si),
                        live: Some(lj),
                    }),
                    (Node::File(sf), Node::File(lf)) => {
                        if same && lf.hash.is_some() && (!c.checksum || sf.hash == lf.hash) {
                            sf.reuse = true;
                            sf.hash = lf.hash;
                            plan.reused += 1;
                        } else {
                            count_copy(s, plan);
                        }
                        if same {
                            if let (Node::File(sf), Node::File(lf)) = (&s.node, &l.node) {
                                if sf.group.is_some() || lf.group.is_some() {
                                    let outside = (sf.nlink > 1).then_some((sf.dev, sf.ino));
                                    pairs.push((path.clone(), sf.group, lf.group, outside));
                                }
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    for (lj, l) in live.iter().enumerate().skip(li) {
        at(&mut path, &l.name);
        deleted(l, &path, plan);
        if is_dir(l) {
            below.push(Below {
                src: None,
                live: Some(lj),
            });
        }
    }
    below
}

fn count_copy(e: &Entry, plan: &mut Plan) {
    if let Node::File(_) = e.node {
        plan.copied += 1;
        plan.copied_bytes += e.meta.size;
    }
}

/// `e` at `path` is new (its children are compared as `dir` says).
fn added(e: &Entry, path: &[u8], plan: &mut Plan) {
    plan.added += 1;
    plan.note(Op::Add, e.kind(), path);
    count_copy(e, plan);
}

/// The live `e` at `path` goes (its children are compared as `dir` says).
fn deleted(e: &Entry, path: &[u8], plan: &mut Plan) {
    plan.deleted += 1;
    plan.note(Op::Delete, e.kind(), path);
}

/// A file kept equal to the live one (`same_entry`) that is hardlinked on
/// either side: its source group (`None`: no other path of the tree
/// shares its inode), its live group, and the source inode where the file
/// has more than one link (other links outside the tree included).
pub type Kept<G> = (Option<G>, Option<u32>, Option<(u64, u64)>);

/// Which of the files kept equal (`kept`) must not be hardlinked from the
/// live tree after all, as their hardlinks differ: a source group whose
/// paths are not all kept, or kept with different live groups or with
/// files apart; a live group kept for more than one source inode, or for
/// files apart (unless they are one source inode with links outside the
/// tree). `group_size`: the paths of a source group in the whole tree.
/// The whole-tree plan (`check_groups`) and the streamed stage
/// (`stage::stream`, its groups keyed by source inode) decide with this.
pub fn broken_links<G: Copy + Eq + std::hash::Hash>(
    kept: &[Kept<G>],
    group_size: impl Fn(&G) -> usize,
) -> Vec<bool> {
    let mut s2l: HashMap<G, Option<u32>> = HashMap::new();
    let mut l2s: HashMap<u32, Option<G>> = HashMap::new();
    let mut bad_src = std::collections::HashSet::new();
    let mut bad_live = std::collections::HashSet::new();
    for (sg, lg, _) in kept {
        if let Some(s) = sg {
            if *s2l.entry(*s).or_insert(*lg) != *lg {
                bad_src.insert(*s);
            }
        }
        if let Some(l) = lg {
            if *l2s.entry(*l).or_insert(*sg) != *sg {
                bad_live.insert(*l);
            }
        }
    }
    // A group with members that are not all kept equal is broken too.
    let mut paired: HashMap<G, usize> = HashMap::new();
    for (sg, _, _) in kept {
        if let Some(s) = sg {
            *paired.entry(*s).or_default() += 1;
        }
    }
    for (g, n) in &paired {
        if group_size(g) != *n {
            bad_src.insert(*g);
        }
    }
    // A live group whose paths are kept as files apart in the tree is
    // reused where they are one source inode with links outside the tree
    // (an image layer rewrote the group's other paths: overlayfs copies
    // one path up alone): its inode then holds no other source inode's
    // paths. A file of one link never takes a live group's inode.
    let mut apart_ok: HashMap<u32, Option<(u64, u64)>> = HashMap::new();
    for (_, lg, outside) in kept {
        if let Some(l) = lg {
            let slot = apart_ok.entry(*l).or_insert(*outside);
            if *slot != *outside {
                *slot = None;
            }
        }
    }
    let apart = |l: &u32| l2s.get(l) == Some(&None) && apart_ok.get(l).copied().flatten().is_none();
    kept.iter()
        .map(|(sg, lg, _)| {
            sg.is_some_and(|s| bad_src.contains(&s) || s2l.get(&s) == Some(&None))
                || lg.is_some_and(|l| bad_live.contains(&l) || apart(&l))
        })
        .collect()
}

/// Files equal one by one may still differ in which of them share an inode:
/// the partition into hardlink groups must match too.
fn check_groups(src: &mut Tree, pairs: &[Pair], plan: &mut Plan) {
    let mut src_sizes: HashMap<u32, usize> = HashMap::new();
    src.for_each(&mut |_, e| {
        if let Node::File(f) = &e.node {
            if let Some(g) = f.group {
                *src_sizes.entry(g).or_default() += 1;
            }
        }
    });
    let kept: Vec<Kept<u32>> = pairs.iter().map(|(_, sg, lg, o)| (*sg, *lg, *o)).collect();
    let broken = broken_links(&kept, |g| src_sizes.get(g).copied().unwrap_or(0));
    let broken_paths: std::collections::HashSet<&[u8]> = pairs
        .iter()
        .zip(broken)
        .filter_map(|((path, ..), broken)| broken.then_some(path.as_slice()))
        .collect();
    // Hardlinking such a file from the live tree would carry the live grouping
    // into the new generation (two separate files joined on one inode): copy it.
    if !broken_paths.is_empty() {
        src.for_each_mut(&mut |path, e| {
            let size = e.meta.size;
            if let Node::File(f) = &mut e.node {
                if broken_paths.contains(path) {
                    plan.apart(path, f.reuse, size);
                    f.reuse = false;
                }
            }
        });
    }
    plan.sort();
}

/// What a streamed stage found drifted in the live tree's hardlinks since
/// its manifest was written: live inodes that two paths it hardlinked
/// turned out to share (joined on the volume), and recorded groups whose
/// paths it found on more than one inode (split). A stage that avoids
/// them copies those paths, counting each a change, as the whole-tree
/// plan, which sees the inodes, copies them.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Drifted {
    /// Inode numbers, sorted.
    joined: Vec<u64>,
    /// Recorded group numbers, sorted.
    split: Vec<u32>,
}

impl Drifted {
    /// `joined`: inode numbers; `split`: recorded group numbers.
    pub fn new(mut joined: Vec<u64>, mut split: Vec<u32>) -> Drifted {
        joined.sort_unstable();
        joined.dedup();
        split.sort_unstable();
        split.dedup();
        Drifted { joined, split }
    }

    pub fn joined(&self, ino: u64) -> bool {
        self.joined.binary_search(&ino).is_ok()
    }

    pub fn split(&self, group: u32) -> bool {
        self.split.binary_search(&group).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::{Dir, File};

    const C: Compare = Compare {
        owners: true,
        checksum: false,
        granularity_ns: 1,
        link_meta: true,
        by_content: 0,
        xattrs: true,
        hardlinks: true,
    };

    fn f(name: &str, size: u64, mtime: i64) -> Entry {
        Entry {
            name: name.as_bytes().into(),
            meta: Meta {
                mode: 0o644,
                size,
                mtime: (mtime, 0).into(),
                ..Default::default()
            },
            node: Node::File(File {
                hash: Some([size as u8; 32]),
                ..Default::default()
            }),
        }
    }
    fn d(name: &str, entries: Vec<Entry>) -> Entry {
        Entry {
            name: name.as_bytes().into(),
            meta: Meta {
                mode: 0o755,
                ..Default::default()
            },
            node: Node::Dir(Dir { srcs: 1, entries }),
        }
    }
    fn t(entries: Vec<Entry>) -> Tree {
        Tree {
            root: Meta {
                mode: 0o755,
                ..Default::default()
            },
            root_srcs: 1,
            entries,
        }
    }
    fn itemized(p: &Plan) -> Vec<String> {
        p.changes
            .iter()
            .map(|c| format!("{} {}", c.op.symbol(), String::from_utf8_lossy(&c.path)))
            .collect()
    }

    /// One directory compared alone: its own changes counted and listed
    /// with their paths, and what is left to compare below it: a
    /// directory on both sides, one the sources add (its children added),
    /// one that goes (its children deleted), and a file that became a
    /// directory or the other way round (one change, the directory side
    /// walked).
    #[test]
    fn one_directory_says_its_changes_and_what_to_compare_below() {
        let mut src = vec![
            d("both", vec![]),
            d("file-to-dir", vec![]),
            d("new", vec![]),
            f("same", 2, 2),
        ];
        let live = vec![
            d("both", vec![]),
            f("file-to-dir", 1, 1),
            d("gone", vec![]),
            f("same", 2, 2),
        ];
        let mut plan = Plan::new(true);
        let mut pairs = Vec::new();
        let below = dir(&mut src, &live, b"top", &C, &mut plan, &mut pairs);
        let at = |s: Option<usize>, l: Option<usize>| Below { src: s, live: l };
        assert_eq!(
            below,
            [
                at(Some(0), Some(0)),
                at(Some(1), None),
                at(None, Some(2)),
                at(Some(2), None)
            ]
        );
        plan.sort();
        assert_eq!(
            itemized(&plan),
            ["~ top/file-to-dir", "- top/gone", "+ top/new"]
        );
        assert_eq!((plan.added, plan.changed, plan.deleted), (1, 1, 1));
        // The file kept equal is reused, taking the live hash.
        assert_eq!((plan.reused, plan.copied), (1, 0));
        assert!(matches!(&src[3].node, Node::File(f) if f.reuse));
    }

    #[test]
    fn links_match_only_when_both_sides_share_the_same_inodes() {
        let file = |ino: u64, nlink: u32| File {
            dev: 1,
            ino,
            nlink,
            ..Default::default()
        };
        let check = |pairs: &[(File, File)]| {
            let mut l = Links::default();
            let firsts: Vec<bool> = pairs.iter().map(|(s, v)| l.pair(s, v)).collect();
            (l.consistent(), firsts)
        };
        // a, b one inode on both sides; c alone on both.
        let both = [
            (file(7, 2), file(70, 2)),
            (file(7, 2), file(70, 2)),
            (file(8, 1), file(80, 1)),
        ];
        assert_eq!(check(&both), (true, vec![true, false, true]));
        // Linked in the source, two files live.
        let split = [(file(7, 2), file(70, 1)), (file(7, 2), file(71, 1))];
        assert!(!check(&split).0);
        // Two files in the source, one inode live.
        let joined = [(file(7, 1), file(70, 2)), (file(8, 1), file(70, 2))];
        assert!(!check(&joined).0);
        // Other links outside either tree (a previous generation) are no group.
        let outside = [(file(7, 3), file(70, 2)), (file(8, 1), file(71, 2))];
        assert_eq!(check(&outside), (true, vec![true, true]));
        // A group of two live, one more path on that inode that the source has apart.
        let more = [
            (file(7, 2), file(70, 3)),
            (file(7, 2), file(70, 3)),
            (file(9, 1), file(70, 3)),
        ];
        assert!(!check(&more).0);
        // After an update: every live file has a second link elsewhere,
        // 30,000 of them, apart; then two of them joined far apart in the walk.
        let mut after: Vec<(File, File)> = (0..30_000)
            .map(|i| (file(i, 1), file(1_000_000 + 3 * i, 2)))
            .collect();
        assert!(check(&after).0);
        after.push((file(99_999, 1), file(1_000_000 + 3 * 17, 2)));
        assert!(!check(&after).0);
    }

    #[test]
    fn identical_trees_are_up_to_date_and_reuse_everything() {
        let live = t(vec![d("a", vec![f("x", 1, 1)]), f("y", 2, 2)]);
        let mut src = live.clone();
        let p = build(&mut src, Some(&live), &C);
        assert!(p.up_to_date(), "{:?}", itemized(&p));
        assert_eq!((p.reused, p.copied), (2, 0));
    }

    #[test]
    fn counting_without_listing_finds_the_same_plan() {
        let live = t(vec![
            d("a", vec![f("x", 1, 1), f("gone", 1, 1)]),
            f("y", 2, 2),
        ]);
        for src in [
            live.clone(),
            t(vec![d("a", vec![f("x", 1, 9)]), d("y", vec![])]),
            t(vec![]),
        ] {
            for l in [Some(&live), None] {
                let listed = build(&mut src.clone(), l, &C);
                let counted = build_counted(&mut src.clone(), l, &C);
                assert!(counted.changes.is_empty());
                assert_eq!(counted.up_to_date(), listed.up_to_date());
                assert_eq!(
                    (
                        counted.added,
                        counted.changed,
                        counted.deleted,
                        counted.reused
                    ),
                    (listed.added, listed.changed, listed.deleted, listed.reused)
                );
            }
        }
        assert!(build_counted(&mut live.clone(), Some(&live), &C).up_to_date());
        assert!(!build_counted(&mut t(vec![]), None, &C).up_to_date());
    }

    #[test]
    fn lists_adds_changes_and_deletes() {
        let live = t(vec![
            d("a", vec![f("x", 1, 1), f("gone", 1, 1)]),
            f("y", 2, 2),
            d("old", vec![f("z", 1, 1)]),
        ]);
        let mut src = t(vec![
            d("a", vec![f("new", 1, 1), f("x", 1, 9)]),
            d("y", vec![f("w", 3, 3)]),
        ]);
        let p = build(&mut src, Some(&live), &C);
        assert_eq!(
            itemized(&p),
            vec!["- a/gone", "+ a/new", "~ a/x", "- old", "- old/z", "~ y", "+ y/w"]
        );
        assert_eq!((p.added, p.changed, p.deleted), (2, 2, 3));
        assert_eq!((p.reused, p.copied), (0, 3));
    }

    #[test]
    fn mode_only_and_owner_only_changes_are_changes() {
        let live = t(vec![f("x", 1, 1)]);
        let mut src = live.clone();
        src.entries[0].meta.mode = 0o755;
        assert_eq!(itemized(&build(&mut src, Some(&live), &C)), vec!["~ x"]);
        let mut src = live.clone();
        src.entries[0].meta.uid = 5;
        assert_eq!(itemized(&build(&mut src, Some(&live), &C)), vec!["~ x"]);
        let no_owners = Compare { owners: false, ..C };
        assert!(build(&mut src, Some(&live), &no_owners).up_to_date());
    }

    #[test]
    fn coarse_volume_mtimes_still_compare_equal() {
        let live = t(vec![f("x", 1, 100)]);
        let mut src = live.clone();
        src.entries[0].meta.mtime = (100, 900_000_000).into();
        assert!(!build(&mut src.clone(), Some(&live), &C).up_to_date());
        let sshfs = Compare {
            granularity_ns: 1_000_000_000,
            ..C
        };
        assert!(build(&mut src, Some(&live), &sshfs).up_to_date());
    }

    const NS: u64 = 1;
    const US: u64 = 1_000;
    const SEC: u64 = 1_000_000_000;

    /// (source time, volume time, granularity, equal?)
    type Case = ((i64, u32), (i64, u32), u64, bool);

    #[test]
    fn a_volume_time_equals_the_source_time_truncated_never_one_within_g() {
        let cases: [Case; 21] = [
            // 1 ns: exact.
            ((61, 5), (61, 5), NS, true),
            ((61, 5), (61, 4), NS, false),
            ((61, 999_999_999), (62, 0), NS, false),
            // 1 µs: the nanoseconds below it are dropped, never rounded.
            ((61, 1_999), (61, 1_000), US, true),
            ((61, 999), (61, 1_000), US, false),
            ((61, 999_999_999), (61, 999_999_000), US, true),
            ((61, 999_999_999), (62, 0), US, false),
            // 1 s (sshfs): x.999999999 is x, not x+1; equal after truncation.
            ((61, 999_999_999), (62, 0), SEC, false),
            ((61, 999_999_999), (61, 0), SEC, true),
            ((61, 120_000_000), (62, 0), SEC, false),
            ((61, 900_000_000), (62, 0), SEC, false),
            ((62, 0), (62, 0), SEC, true),
            ((62, 0), (61, 0), SEC, false),
            // Before the epoch, truncation still goes down: -0.5 s is kept as -1 s.
            ((-1, 500_000_000), (-1, 0), SEC, true),
            ((-1, 500_000_000), (0, 0), SEC, false),
            // 2 s (FAT-like): the volume keeps even seconds.
            ((61, 500_000_000), (60, 0), 2 * SEC, true),
            ((61, 500_000_000), (62, 0), 2 * SEC, false),
            ((59, 999_999_999), (60, 0), 2 * SEC, false),
            ((63, 0), (62, 0), 2 * SEC, true),
            ((64, 0), (62, 0), 2 * SEC, false),
            // A volume time finer than G is not one such a volume stores.
            ((61, 5), (61, 5), SEC, false),
        ];
        for (src, vol, g, want) in cases {
            assert_eq!(
                mtime_eq(src.into(), vol.into(), g),
                want,
                "source {src:?} volume {vol:?} at {g} ns"
            );
        }
    }

    #[test]
    fn a_file_one_second_apart_on_a_whole_second_volume_is_copied_not_reused() {
        // The live generation was made from another source: 62.0 s on sshfs.
        let mut live = t(vec![f("x", 1, 62)]);
        live.root.mtime = (62, 0).into();
        let sshfs = Compare {
            granularity_ns: SEC,
            ..C
        };
        let mut src = t(vec![f("x", 1, 61)]);
        src.root.mtime = (62, 0).into();
        src.entries[0].meta.mtime = (61, 120_000_000).into();
        let p = build(&mut src, Some(&live), &sshfs);
        assert_eq!(itemized(&p), vec!["~ x"]);
        assert_eq!((p.reused, p.copied), (0, 1));
        assert!(matches!(&src.entries[0].node, Node::File(f) if !f.reuse));
        // 62.7 s in the source is kept as 62 s: that one is up to date.
        let mut src = live.clone();
        src.entries[0].meta.mtime = (62, 700_000_000).into();
        let p = build(&mut src, Some(&live), &sshfs);
        assert!(p.up_to_date(), "{:?}", itemized(&p));
        assert_eq!(p.reused, 1);
    }

    #[test]
    fn symlink_times_and_owners_count_only_where_the_volume_kept_them() {
        let link = |mtime, uid| Entry {
            name: b"l".as_slice().into(),
            meta: Meta {
                mode: 0o777,
                size: 1,
                uid,
                mtime: (mtime, 0).into(),
                ..Default::default()
            },
            node: Node::Symlink(b"x".as_slice().into()),
        };
        let live = t(vec![link(1, 0), f("x", 1, 1)]);
        let mut src = t(vec![link(7, 5), f("x", 1, 1)]);
        assert_eq!(
            itemized(&build(&mut src.clone(), Some(&live), &C)),
            vec!["~ l"]
        );
        let fuse = Compare {
            link_meta: false,
            ..C
        };
        assert!(build(&mut src.clone(), Some(&live), &fuse).up_to_date());
        // A file's times still count, and so does a link's target.
        src.entries[1].meta.mtime = (2, 0).into();
        src.entries[0].node = Node::Symlink(b"y".as_slice().into());
        assert_eq!(
            itemized(&build(&mut src, Some(&live), &fuse)),
            vec!["~ l", "~ x"]
        );
    }

    #[test]
    fn checksum_sees_same_size_same_mtime_edits() {
        let live = t(vec![f("x", 1, 1)]);
        let mut src = live.clone();
        if let Node::File(file) = &mut src.entries[0].node {
            file.hash = Some([9; 32]);
        }
        assert!(build(&mut src.clone(), Some(&live), &C).up_to_date());
        let p = build(
            &mut src,
            Some(&live),
            &Compare {
                checksum: true,
                ..C
            },
        );
        assert_eq!(itemized(&p), vec!["~ x"]);
        assert_eq!(p.reused, 0);
    }

    #[test]
    fn a_streamed_source_sees_same_size_same_mtime_edits_without_checksum() {
        let live = t(vec![f("x", 1, 1), f("y", 2, 1)]);
        let mut src = live.clone();
        if let Node::File(file) = &mut src.entries[0].node {
            file.hash = Some([9; 32]); // edited: same size, same mtime
        }
        let streamed = Compare { by_content: 1, ..C };
        let p = build(&mut src, Some(&live), &streamed);
        assert_eq!(itemized(&p), vec!["~ x"]);
        assert_eq!((p.copied, p.reused), (1, 1), "y is reused, x copied");
        let reuse: Vec<bool> = src
            .entries
            .iter()
            .map(|e| matches!(&e.node, Node::File(f) if f.reuse))
            .collect();
        assert_eq!(reuse, vec![false, true]);
        // A live file whose hash is unknown is never taken for the same.
        let mut unknown = live.clone();
        if let Node::File(file) = &mut unknown.entries[1].node {
            file.hash = None;
        }
        let mut src = live.clone();
        let p = build(&mut src, Some(&unknown), &streamed);
        assert_eq!(itemized(&p), vec!["~ y"]);
        // Another source's files keep the quick check.
        let mut src = live.clone();
        if let Node::File(file) = &mut src.entries[0].node {
            file.hash = Some([9; 32]);
        }
        let other = Compare { by_content: 2, ..C };
        assert!(build(&mut src, Some(&live), &other).up_to_date());
    }

    #[test]
    fn a_broken_hardlink_group_is_a_change() {
        let grouped = |g: Option<u32>| {
            let mut e = f("x", 1, 1);
            if let Node::File(file) = &mut e.node {
                file.group = g;
            }
            e
        };
        let mut a = grouped(Some(0));
        a.name = b"a".as_slice().into();
        let mut b = grouped(Some(0));
        b.name = b"b".as_slice().into();
        let live = t(vec![a.clone(), b.clone()]);
        let mut src = live.clone();
        assert!(build(&mut src, Some(&live), &C).up_to_date());
        let mut b1 = b.clone();
        if let Node::File(file) = &mut b1.node {
            file.group = None;
        }
        let mut a1 = a.clone();
        if let Node::File(file) = &mut a1.node {
            file.group = None;
        }
        let mut src = t(vec![a1, b1]);
        let p = build(&mut src, Some(&live), &C);
        assert_eq!(itemized(&p), vec!["~ a", "~ b"]);
        // Linking both from the live inode would join them again: they are copied.
        let reused: Vec<bool> = src
            .entries
            .iter()
            .map(|e| matches!(&e.node, Node::File(f) if f.reuse))
            .collect();
        assert_eq!(reused, vec![false, false]);
        assert_eq!((p.reused, p.copied), (0, 2));

        // One path of the live group kept as a file apart, the other
        // rewritten (an image layer writing one path of a hardlinked
        // file): the kept one is reused, nothing is joined.
        let mut a2 = a.clone();
        if let Node::File(file) = &mut a2.node {
            file.group = None;
            // Its other link is outside the tree (a seeded spool's, the
            // group's count): one link would never take a live group's inode.
            file.nlink = 2;
        }
        let mut b2 = f("b", 9, 9);
        if let Node::File(file) = &mut b2.node {
            file.group = None;
        }
        let mut src = t(vec![a2.clone(), b2.clone()]);
        let p = build(&mut src, Some(&live), &C);
        assert_eq!(itemized(&p), vec!["~ b"]);
        assert!(matches!(&src.entries[0].node, Node::File(f) if f.reuse));
        assert_eq!((p.reused, p.copied), (1, 1));
        // The same file of one link: copied, as the streamed stage does.
        if let Node::File(file) = &mut a2.node {
            file.nlink = 1;
        }
        let mut src = t(vec![a2, b2]);
        let p = build(&mut src, Some(&live), &C);
        assert_eq!(itemized(&p), vec!["~ a", "~ b"]);
        assert_eq!((p.reused, p.copied), (0, 2));
    }

    #[test]
    fn first_sync_adds_everything() {
        let mut src = t(vec![d("a", vec![f("x", 1, 1)])]);
        let p = build(&mut src, None, &C);
        assert_eq!(itemized(&p), vec!["+ .", "+ a", "+ a/x"]);
        assert_eq!(p.copied, 1);
    }

    // ---- the plan against a model of the volume, on random trees ----

    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// Every granularity a volume is known to keep: exact, µs, sshfs, FAT.
    const GRANULARITIES: [u64; 4] = [NS, US, SEC, 2 * SEC];

    /// An entry as generated. Names come from a three-letter alphabet, and
    /// each field from a few values, so that source and live entries collide
    /// and often agree: reuse is then a real choice.
    #[derive(Clone, Debug)]
    enum Gen {
        File {
            meta: Meta,
            content: u8,
            group: Option<u32>,
        },
        Link {
            meta: Meta,
            target: u8,
        },
        Dir {
            meta: Meta,
            children: BTreeMap<u8, Gen>,
        },
    }

    fn time() -> impl Strategy<Value = Time> {
        // Whole seconds one apart, and nanoseconds at both ends of each unit.
        let ns = [0, 1, 999, 1_000, 500_000_000, 999_999_000, 999_999_999];
        (60i64..63, prop::sample::select(ns.to_vec())).prop_map(Time::from)
    }

    fn meta(modes: &'static [u32]) -> impl Strategy<Value = Meta> {
        (prop::sample::select(modes), 0u32..2, time()).prop_map(|(mode, uid, mtime)| Meta {
            mode,
            uid,
            gid: uid + 10,
            size: 0,
            mtime,
            xattrs: Default::default(),
        })
    }

    fn entry() -> impl Strategy<Value = Gen> {
        let file = (
            meta(&[0o644, 0o755]),
            0u64..3,
            0u8..3,
            prop::option::of(0u32..2),
        )
            .prop_map(|(mut meta, size, content, group)| {
                meta.size = size;
                Gen::File {
                    meta,
                    content,
                    group,
                }
            });
        let link = (meta(&[0o777]), 0u8..2).prop_map(|(mut meta, target)| {
            meta.size = 1;
            Gen::Link { meta, target }
        });
        prop_oneof![3 => file, 1 => link].prop_recursive(3, 24, 3, |inner| {
            (
                meta(&[0o755, 0o700]),
                prop::collection::btree_map(0u8..3, inner, 0..3),
            )
                .prop_map(|(meta, children)| Gen::Dir { meta, children })
        })
    }

    fn tree() -> impl Strategy<Value = Tree> {
        (
            meta(&[0o755, 0o700]),
            prop::collection::btree_map(0u8..3, entry(), 0..4),
        )
            .prop_map(|(root, children)| {
                let mut t = Tree {
                    root,
                    root_srcs: 1,
                    entries: entries(children),
                };
                one_inode_per_group(&mut t);
                t
            })
    }

    fn entries(children: BTreeMap<u8, Gen>) -> Vec<Entry> {
        children
            .into_iter()
            .map(|(n, g)| {
                let name = [b'a' + n];
                let (meta, node) = match g {
                    Gen::File {
                        meta,
                        content,
                        group,
                    } => (
                        meta,
                        Node::File(File {
                            hash: Some([content; 32]),
                            group,
                            ..Default::default()
                        }),
                    ),
                    Gen::Link { meta, target } => (meta, Node::Symlink(vec![b'p' + target].into())),
                    Gen::Dir { meta, children } => (
                        meta,
                        Node::Dir(Dir {
                            srcs: 1,
                            entries: entries(children),
                        }),
                    ),
                };
                Entry {
                    name: name.as_slice().into(),
                    meta,
                    node,
                }
            })
            .collect()
    }

    /// The paths of a hardlink group are one inode: the same metadata and
    /// content for all (the first one's); a group of one is a plain file.
    fn one_inode_per_group(t: &mut Tree) {
        let mut first: HashMap<u32, (Meta, Option<[u8; 32]>, usize)> = HashMap::new();
        t.for_each(&mut |_, e| {
            if let Node::File(f) = &e.node {
                if let Some(g) = f.group {
                    first.entry(g).or_insert((e.meta, f.hash, 0)).2 += 1;
                }
            }
        });
        t.for_each_mut(&mut |_, e| {
            if let Node::File(f) = &mut e.node {
                if let Some((meta, hash, n)) = f.group.and_then(|g| first.get(&g)) {
                    if *n < 2 {
                        f.group = None;
                    } else {
                        e.meta = *meta;
                        f.hash = *hash;
                    }
                }
            }
        });
    }

    /// What a volume that keeps times to `g` stores for `t`: the multiple of
    /// `g` at or below it.
    fn stored(t: Time, g: u64) -> Time {
        let (g, giga) = (g as i128, 1_000_000_000i128);
        let ns = t.s as i128 * giga + t.ns as i128;
        let kept = ns.div_euclid(g) * g;
        Time::from((kept.div_euclid(giga) as i64, kept.rem_euclid(giga) as u32))
    }

    /// The live generation as read back from a volume of granularity `c`'s:
    /// times as the volume stored them (a symlink's own are whatever the
    /// volume gave it where it cannot set them), a hash where the manifest
    /// still describes the file (not for content 2).
    fn on_volume(made_from: &Tree, c: &Compare) -> Tree {
        let mut t = made_from.clone();
        t.root.mtime = stored(t.root.mtime, c.granularity_ns);
        t.for_each_mut(&mut |_, e| {
            if e.kind() != Kind::Symlink || c.link_meta {
                e.meta.mtime = stored(e.meta.mtime, c.granularity_ns);
            } else {
                e.meta.mtime = (99, 7).into();
                e.meta.uid = 99;
            }
            if let Node::File(f) = &mut e.node {
                if f.hash == Some([2; 32]) {
                    f.hash = None;
                }
            }
        });
        t
    }

    /// Every entry by path (`.` for the root), children left out.
    fn by_path(t: &Tree) -> BTreeMap<Vec<u8>, Entry> {
        let mut m = BTreeMap::new();
        let root = Entry {
            name: Default::default(),
            meta: t.root,
            node: Node::Dir(Dir::default()),
        };
        m.insert(b".".to_vec(), root);
        t.for_each(&mut |p, e| {
            let mut e = e.clone();
            if let Node::Dir(d) = &mut e.node {
                d.entries.clear();
            }
            m.insert(p.to_vec(), e);
        });
        m
    }

    /// The spec's "unchanged", written out apart from the plan: a volume
    /// entry holds the source entry when type, mode, size, link target,
    /// owner (where compared), content (with `--checksum`) are the same
    /// and its time is the source time as the volume stores it.
    fn holds(src: &Entry, vol: &Entry, c: &Compare) -> bool {
        let link = src.kind() == Kind::Symlink;
        let own_meta = !link || c.link_meta;
        src.kind() == vol.kind()
            && (link || src.meta.mode == vol.meta.mode)
            && (src.kind() != Kind::File || src.meta.size == vol.meta.size)
            && (!c.owners
                || !own_meta
                || (src.meta.uid, src.meta.gid) == (vol.meta.uid, vol.meta.gid))
            && (!own_meta || vol.meta.mtime == stored(src.meta.mtime, c.granularity_ns))
            && match (&src.node, &vol.node) {
                (Node::Symlink(a), Node::Symlink(b)) => a == b,
                (Node::File(a), Node::File(b)) => {
                    !c.checksum || (b.hash.is_some() && a.hash == b.hash)
                }
                _ => true,
            }
    }

    fn compare() -> impl Strategy<Value = Compare> {
        (
            any::<bool>(),
            any::<bool>(),
            prop::sample::select(GRANULARITIES.to_vec()),
            any::<bool>(),
        )
            .prop_map(|(owners, checksum, granularity_ns, link_meta)| Compare {
                owners,
                checksum,
                granularity_ns,
                link_meta,
                by_content: 0,
                xattrs: true,
                hardlinks: true,
            })
    }

    /// (source, live generation as the volume shows it, comparison). The
    /// source is a tree of its own, or the live one's source with another
    /// tree laid over it, or the live one's source with new times on some
    /// entries (the near misses: one nanosecond, one unit of the volume).
    fn case() -> impl Strategy<Value = (Tree, Option<Tree>, Compare)> {
        let retime = prop::collection::vec(prop::option::weighted(0.5, time()), 8);
        (tree(), tree(), 0u8..3, retime, 0u8..8, compare()).prop_map(
            |(before, other, how, retime, first, c)| {
                let mut src = match how {
                    0 => other,
                    1 => {
                        let mut s = before.clone();
                        s.overlay(other);
                        s
                    }
                    _ => {
                        let mut s = before.clone();
                        let mut i = 0;
                        s.for_each_mut(&mut |_, e| {
                            if let Some(t) = retime[i % retime.len()] {
                                e.meta.mtime = t;
                            }
                            i += 1;
                        });
                        s
                    }
                };
                one_inode_per_group(&mut src);
                if !c.checksum {
                    // Without --checksum no source file is hashed before the plan.
                    src.for_each_mut(&mut |_, e| {
                        if let Node::File(f) = &mut e.node {
                            f.hash = None;
                        }
                    });
                }
                let live = (first != 0).then(|| on_volume(&before, &c));
                (src, live, c)
            },
        )
    }

    fn reused(t: &Tree) -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        t.for_each(&mut |p, e| {
            if matches!(&e.node, Node::File(f) if f.reuse) {
                v.push(p.to_vec());
            }
        });
        v
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

        /// The plan applied in memory to the live tree yields the source, as
        /// the volume can hold it, hardlink groups included; counting finds
        /// what listing finds.
        #[test]
        fn the_plan_applied_to_the_live_tree_yields_the_source((src, live, c) in case()) {
            let mut planned = src.clone();
            let plan = build(&mut planned, live.as_ref(), &c);
            let mut counted_tree = src.clone();
            let counted = build_counted(&mut counted_tree, live.as_ref(), &c);
            prop_assert_eq!(
                (counted.up_to_date(), counted.added, counted.changed, counted.deleted),
                (plan.up_to_date(), plan.added, plan.changed, plan.deleted)
            );
            prop_assert_eq!(
                (counted.reused, counted.copied, counted.copied_bytes),
                (plan.reused, plan.copied, plan.copied_bytes)
            );
            prop_assert!(counted.changes.is_empty());
            prop_assert_eq!(&counted_tree, &planned, "the same files marked for reuse");
            prop_assert_eq!(plan.up_to_date(), plan.changes.is_empty());

            let want = by_path(&src);
            let mut got = live.as_ref().map(by_path).unwrap_or_default();
            let mut touched = std::collections::HashSet::new();
            for ch in &plan.changes {
                let p = &ch.path;
                touched.insert(p.clone());
                match ch.op {
                    Op::Delete => {
                        let gone = got.remove(p);
                        prop_assert!(gone.is_some_and(|e| e.kind() == ch.kind), "{:?}", ch);
                    }
                    Op::Add => {
                        prop_assert!(!got.contains_key(p), "{:?} added over an entry", ch);
                        prop_assert_eq!(want[p].kind(), ch.kind);
                        got.insert(p.clone(), want[p].clone());
                    }
                    Op::Change => {
                        prop_assert!(got.contains_key(p), "{:?} changes nothing", ch);
                        prop_assert_eq!(want[p].kind(), ch.kind);
                        got.insert(p.clone(), want[p].clone());
                    }
                }
            }
            prop_assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>());
            for (p, e) in &got {
                prop_assert!(
                    touched.contains(p) || holds(&want[p], e, &c),
                    "{:?} left as {:?}, source has {:?}", String::from_utf8_lossy(p), e, want[p]
                );
            }
            let reuse = reused(&planned);
            prop_assert_eq!(plan.reused as usize, reuse.len());
            for p in &reuse {
                prop_assert!(!touched.contains(p), "{:?} reused and changed", p);
            }

            // Hardlink groups, as staging makes them: a group's first path is
            // linked from the live inode (when reused) or copied, the others
            // are linked to it; a file on its own is linked or copied alone.
            let live_inode = |p: &[u8]| -> String {
                let live = by_path(live.as_ref().unwrap());
                match &live[p].node {
                    Node::File(File { group: Some(g), .. }) => format!("live group {g}"),
                    _ => format!("live {p:?}"),
                }
            };
            let mut inode_of: BTreeMap<Vec<u8>, String> = BTreeMap::new();
            let mut leader: HashMap<u32, Vec<u8>> = HashMap::new();
            let mut files = Vec::new();
            planned.for_each(&mut |p, e| {
                if let Node::File(f) = &e.node {
                    files.push((p.to_vec(), f.group, f.reuse));
                }
            });
            for (p, group, reuse) in &files {
                let inode = match group.map(|g| leader.entry(g).or_insert_with(|| p.clone()).clone()) {
                    Some(l) if l != *p => inode_of[&l].clone(),
                    _ if *reuse => live_inode(p),
                    _ => format!("new {p:?}"),
                };
                inode_of.insert(p.clone(), inode);
            }
            for (a, ga, _) in &files {
                for (b, gb, _) in &files {
                    let linked = a == b || ga.is_some() && ga == gb;
                    prop_assert_eq!(
                        inode_of[a] == inode_of[b], linked,
                        "{:?} and {:?}: {:?}", String::from_utf8_lossy(a), String::from_utf8_lossy(b), inode_of
                    );
                }
            }
        }

        /// Reuse is chosen only where the live entry's metadata is what the
        /// new generation's manifest says for it: a reused file keeps the
        /// live inode, so its mode, size, owner, content and its time (the
        /// manifest's, as this volume stores it) must already be right.
        #[test]
        fn a_reused_file_has_exactly_the_metadata_its_manifest_records(
            (src, live, c) in case(),
        ) {
            let mut manifest = src.clone();
            build(&mut manifest, live.as_ref(), &c);
            let recorded = by_path(&manifest);
            let sources = by_path(&src);
            for p in reused(&manifest) {
                let live = by_path(live.as_ref().expect("reuse needs a live tree"));
                let (m, l) = (&recorded[&p], &live[&p]);
                let (Node::File(mf), Node::File(lf)) = (&m.node, &l.node) else {
                    return Err(TestCaseError::fail(format!("{p:?} reused from a non-file")));
                };
                prop_assert!(lf.hash.is_some(), "{:?}: reused without a known hash", p);
                prop_assert_eq!(mf.hash, lf.hash, "{:?}: the manifest's hash", p);
                prop_assert_eq!(
                    (m.meta.mode, m.meta.size),
                    (l.meta.mode, l.meta.size),
                    "{:?}", p
                );
                if c.owners {
                    prop_assert_eq!((m.meta.uid, m.meta.gid), (l.meta.uid, l.meta.gid));
                }
                prop_assert_eq!(
                    stored(m.meta.mtime, c.granularity_ns),
                    l.meta.mtime,
                    "{:?} at {} ns: manifest {:?}, live inode {:?}",
                    String::from_utf8_lossy(&p), c.granularity_ns, m.meta.mtime, l.meta.mtime
                );
                if c.checksum {
                    let Node::File(sf) = &sources[&p].node else { unreachable!() };
                    prop_assert_eq!(sf.hash, lf.hash, "--checksum: the same content");
                }
            }
        }
    }
}
