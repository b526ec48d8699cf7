//! Plan: compare the source tree with the live one and decide, per entry,
//! what the new generation needs. Pure: no I/O, so the mirror's logic is
//! tested here cheaply.
//!
//! The plan marks each source file that may be hardlinked from the live
//! generation (`File::reuse`, taking the live hash with it) and lists the
//! changes a user sees with `--itemize`: `+` added, `~` changed, `-` deleted.

use std::collections::HashMap;

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
    /// Files to hardlink from the live generation, and their bytes.
    pub reused: u64,
    pub reused_bytes: u64,
    /// Files to copy from a source, and their bytes.
    pub copied: u64,
    pub copied_bytes: u64,
}

impl Plan {
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

/// Equal mtimes on a volume that keeps them to `g` nanoseconds.
pub fn mtime_eq(a: Time, b: Time, g: u64) -> bool {
    if g <= 1 {
        return a == b;
    }
    let ns = |t: Time| t.s as i128 * 1_000_000_000 + t.ns as i128;
    (ns(a) - ns(b)).abs() < g as i128
}

fn meta_eq(a: &Meta, b: &Meta, kind: Kind, c: &Compare) -> bool {
    let own_meta = kind != Kind::Symlink || c.link_meta;
    (kind == Kind::Symlink || a.mode == b.mode)
        && (kind != Kind::File || a.size == b.size)
        && (!c.owners || !own_meta || (a.uid == b.uid && a.gid == b.gid))
        && (!own_meta || mtime_eq(a.mtime, b.mtime, c.granularity_ns))
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
    let mut plan = Plan {
        listed: list,
        ..Plan::default()
    };
    let empty = Vec::new();
    let live_entries = live.map(|l| &l.entries).unwrap_or(&empty);
    if let Some(l) = live {
        let root_src = Entry {
            name: Default::default(),
            meta: src.root,
            node: Node::Dir(Default::default()),
        };
        let root_live = Entry {
            name: Default::default(),
            meta: l.root,
            node: Node::Dir(Default::default()),
        };
        if !same_entry(&root_src, &root_live, c) {
            plan.changed += 1;
            plan.note(Op::Change, Kind::Dir, b".");
        }
    } else {
        plan.note(Op::Add, Kind::Dir, b".");
    }
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

/// (path, source group, live group) of every file kept equal, to check hardlinks.
type Pair = (Vec<u8>, Option<u32>, Option<u32>);

fn diff(
    src: &mut [Entry],
    live: &[Entry],
    prefix: &mut Vec<u8>,
    c: &Compare,
    plan: &mut Plan,
    pairs: &mut Vec<Pair>,
) {
    let mut li = 0;
    for s in src.iter_mut() {
        while li < live.len() && live[li].name < s.name {
            deleted(&live[li], prefix, plan);
            li += 1;
        }
        let base = prefix.len();
        if base > 0 {
            prefix.push(b'/');
        }
        prefix.extend_from_slice(&s.name);
        let l = (li < live.len() && live[li].name == s.name).then(|| {
            li += 1;
            &live[li - 1]
        });
        match l {
            None => added(s, prefix, plan),
            Some(l) if l.kind() != s.kind() => {
                // A file became a directory or the like: the old one goes, the new one comes.
                if let Node::Dir(d) = &l.node {
                    for child in &d.entries {
                        deleted(child, prefix, plan);
                    }
                }
                plan.changed += 1;
                plan.note(Op::Change, s.kind(), prefix);
                if let Node::Dir(d) = &mut s.node {
                    for child in d.entries.iter_mut() {
                        let b2 = prefix.len();
                        prefix.push(b'/');
                        prefix.extend_from_slice(&child.name);
                        added(child, prefix, plan);
                        prefix.truncate(b2);
                    }
                } else {
                    count_copy(s, plan);
                }
            }
            Some(l) => {
                let same = same_entry(s, l, c);
                if !same {
                    plan.changed += 1;
                    plan.note(Op::Change, s.kind(), prefix);
                }
                match (&mut s.node, &l.node) {
                    (Node::Dir(sd), Node::Dir(ld)) => {
                        diff(&mut sd.entries, &ld.entries, prefix, c, plan, pairs)
                    }
                    (Node::File(sf), Node::File(lf)) => {
                        if same && lf.hash.is_some() && (!c.checksum || sf.hash == lf.hash) {
                            sf.reuse = true;
                            sf.hash = lf.hash;
                            plan.reused += 1;
                            plan.reused_bytes += s.meta.size;
                        } else {
                            count_copy(s, plan);
                        }
                        if same {
                            if let (Node::File(sf), Node::File(lf)) = (&s.node, &l.node) {
                                if sf.group.is_some() || lf.group.is_some() {
                                    pairs.push((prefix.clone(), sf.group, lf.group));
                                }
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        prefix.truncate(base);
    }
    for l in &live[li..] {
        deleted(l, prefix, plan);
    }
}

fn count_copy(e: &Entry, plan: &mut Plan) {
    if let Node::File(_) = e.node {
        plan.copied += 1;
        plan.copied_bytes += e.meta.size;
    }
}

fn added(e: &mut Entry, path: &mut Vec<u8>, plan: &mut Plan) {
    plan.added += 1;
    plan.note(Op::Add, e.kind(), path);
    count_copy(e, plan);
    if let Node::Dir(d) = &mut e.node {
        for child in d.entries.iter_mut() {
            let base = path.len();
            path.push(b'/');
            path.extend_from_slice(&child.name);
            added(child, path, plan);
            path.truncate(base);
        }
    }
}

fn deleted(e: &Entry, prefix: &[u8], plan: &mut Plan) {
    let mut path = prefix.to_vec();
    if !path.is_empty() {
        path.push(b'/');
    }
    path.extend_from_slice(&e.name);
    if let Node::Dir(d) = &e.node {
        for child in &d.entries {
            deleted(child, &path, plan);
        }
    }
    plan.deleted += 1;
    plan.note(Op::Delete, e.kind(), &path);
}

/// Files equal one by one may still differ in which of them share an inode:
/// the partition into hardlink groups must match too.
fn check_groups(src: &mut Tree, pairs: &[Pair], plan: &mut Plan) {
    let mut s2l: HashMap<u32, Option<u32>> = HashMap::new();
    let mut l2s: HashMap<u32, Option<u32>> = HashMap::new();
    let mut bad_src = std::collections::HashSet::new();
    let mut bad_live = std::collections::HashSet::new();
    for (_, sg, lg) in pairs {
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
    let mut src_sizes: HashMap<u32, usize> = HashMap::new();
    src.for_each(&mut |_, e| {
        if let Node::File(f) = &e.node {
            if let Some(g) = f.group {
                *src_sizes.entry(g).or_default() += 1;
            }
        }
    });
    let mut paired: HashMap<u32, usize> = HashMap::new();
    for (_, sg, _) in pairs {
        if let Some(s) = sg {
            *paired.entry(*s).or_default() += 1;
        }
    }
    for (g, n) in &src_sizes {
        if paired.get(g).copied().unwrap_or(0) != *n && paired.contains_key(g) {
            bad_src.insert(*g);
        }
    }
    let mut broken_paths = std::collections::HashSet::new();
    for (path, sg, lg) in pairs {
        let broken = sg.is_some_and(|s| bad_src.contains(&s) || s2l.get(&s) == Some(&None))
            || lg.is_some_and(|l| bad_live.contains(&l) || l2s.get(&l) == Some(&None));
        if broken {
            plan.changed += 1;
            plan.note(Op::Change, Kind::File, path);
            broken_paths.insert(path.as_slice());
        }
    }
    // Hardlinking such a file from the live tree would carry the live grouping
    // into the new generation (two separate files joined on one inode): copy it.
    if !broken_paths.is_empty() {
        src.for_each_mut(&mut |path, e| {
            let size = e.meta.size;
            if let Node::File(f) = &mut e.node {
                if f.reuse && broken_paths.contains(path) {
                    f.reuse = false;
                    plan.reused -= 1;
                    plan.reused_bytes -= size;
                    plan.copied += 1;
                    plan.copied_bytes += size;
                }
            }
        });
    }
    if plan.changes.len() > 1 {
        plan.changes
            .sort_by(|a, b| a.path.cmp(&b.path).then((a.op as u8).cmp(&(b.op as u8))));
        plan.changes
            .dedup_by(|a, b| a.path == b.path && a.op == b.op);
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
    }

    #[test]
    fn first_sync_adds_everything() {
        let mut src = t(vec![d("a", vec![f("x", 1, 1)])]);
        let p = build(&mut src, None, &C);
        assert_eq!(itemized(&p), vec!["+ .", "+ a", "+ a/x"]);
        assert_eq!(p.copied, 1);
    }
}
