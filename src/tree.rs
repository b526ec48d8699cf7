//! Tree, Entry, Node: the plain data every stage passes on. No I/O here.
//!
//! A tree is the root directory's metadata plus its children, each directory
//! holding its entries sorted by name (byte order), so two trees are compared
//! by one merge walk. Names are raw bytes: a pack may hold any name Linux allows.

/// Metadata packsync mirrors for every entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Meta {
    /// Permission bits including setuid, setgid and sticky (`mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Bytes for files, target length for symlinks, 0 for directories.
    pub size: u64,
    pub mtime: Time,
    /// Extended attributes (`xattr::Set`: an interned id; empty for most).
    pub xattrs: crate::xattr::Set,
}

/// The metadata a stat gives, with `size` (0 for a directory).
pub fn meta_of(st: &crate::sys::Stat, size: u64) -> Meta {
    Meta {
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        size,
        mtime: crate::sys::mtime_of(st).into(),
        xattrs: Default::default(),
    }
}

/// Seconds and nanoseconds since the epoch, packed into 12 bytes (every
/// entry holds one: a tuple would take 16).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
#[repr(C, packed(4))]
pub struct Time {
    pub s: i64,
    pub ns: u32,
}

impl Time {
    pub fn pair(self) -> (i64, u32) {
        (self.s, self.ns)
    }

    /// Seconds as a decimal, the way PAX `mtime` records and `touch -d @`
    /// read it: (-2, 0.75 s) is `-1.250000000`, not `-2.750000000`.
    pub fn decimal(self) -> String {
        let (s, ns) = self.pair();
        match ns {
            0 => s.to_string(),
            ns if s < 0 => format!("-{}.{:09}", -(s + 1), 1_000_000_000 - ns),
            ns => format!("{s}.{ns:09}"),
        }
    }
}

impl From<(i64, u32)> for Time {
    fn from((s, ns): (i64, u32)) -> Time {
        Time { s, ns }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub name: Name,
    pub meta: Meta,
    pub node: Node,
}

/// Bytes of a name held inside the entry; longer names go to the heap.
const INLINE: usize = 22;

/// An entry's name. Most names are short, so they are kept inside the entry
/// (24 bytes, the size of a boxed slice plus a word) rather than in a heap
/// allocation of their own: a tree of 10^6 entries saves a million
/// allocations and about 32 bytes per entry.
#[derive(Clone)]
pub enum Name {
    Inline(u8, [u8; INLINE]),
    Heap(Box<[u8]>),
}

impl Name {
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Name::Inline(n, b) => &b[..*n as usize],
            Name::Heap(b) => b,
        }
    }
}

impl Default for Name {
    fn default() -> Name {
        Name::Inline(0, [0; INLINE])
    }
}

impl std::ops::Deref for Name {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl AsRef<[u8]> for Name {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl From<&[u8]> for Name {
    fn from(b: &[u8]) -> Name {
        if b.len() <= INLINE {
            let mut a = [0; INLINE];
            a[..b.len()].copy_from_slice(b);
            Name::Inline(b.len() as u8, a)
        } else {
            Name::Heap(b.into())
        }
    }
}

impl From<Vec<u8>> for Name {
    fn from(v: Vec<u8>) -> Name {
        if v.len() <= INLINE {
            Name::from(v.as_slice())
        } else {
            Name::Heap(v.into_boxed_slice())
        }
    }
}

impl From<Box<[u8]>> for Name {
    fn from(b: Box<[u8]>) -> Name {
        if b.len() <= INLINE {
            Name::from(&*b)
        } else {
            Name::Heap(b)
        }
    }
}

impl PartialEq for Name {
    fn eq(&self, other: &Name) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Name {}

impl PartialOrd for Name {
    fn partial_cmp(&self, other: &Name) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Name {
    fn cmp(&self, other: &Name) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl std::hash::Hash for Name {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.as_bytes().hash(h)
    }
}

impl std::fmt::Debug for Name {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(self.as_bytes()))
    }
}

/// `rel/name`, or `name` at the root (`rel` empty): an entry's path below
/// the tree's root, as every walk builds it.
pub fn join(rel: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(rel.len() + 1 + name.len());
    p.extend_from_slice(rel);
    if !rel.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    File(File),
    Dir(Dir),
    Symlink(Box<[u8]>),
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct File {
    /// Which SOURCE (index) it comes from; the live tree uses 0.
    pub src: u16,
    /// Identity where it was scanned, to find hardlinks and check reuse.
    pub dev: u64,
    pub ino: u64,
    pub nlink: u32,
    /// The change and modification times when scanned, folded into one
    /// number (`sys::change_stamp`): a copy that sees another one was
    /// raced. Kept apart from `Meta::mtime`, which `--set-mtime` replaces.
    pub stamp: u64,
    /// SHA-256 of the content, once known.
    pub hash: Option<[u8; 32]>,
    /// Hardlink group, shared by every path of one inode (`None`: a single link).
    pub group: Option<u32>,
    /// Set by the plan: an identical file is live and may be hardlinked.
    pub reuse: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Dir {
    /// Bit i set: SOURCE i provides this directory (overlaid sources).
    pub srcs: u64,
    pub entries: Vec<Entry>,
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Tree {
    pub root: Meta,
    pub root_srcs: u64,
    pub entries: Vec<Entry>,
}

/// What an entry is, for messages and comparisons.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
}

impl Kind {
    pub fn letter(self) -> char {
        match self {
            Kind::File => 'f',
            Kind::Dir => 'd',
            Kind::Symlink => 'l',
        }
    }
}

impl Entry {
    pub fn kind(&self) -> Kind {
        match self.node {
            Node::File(_) => Kind::File,
            Node::Dir(_) => Kind::Dir,
            Node::Symlink(_) => Kind::Symlink,
        }
    }
}

impl Tree {
    /// Entries in the whole tree, the root excluded.
    pub fn count(&self) -> u64 {
        fn walk(es: &[Entry]) -> u64 {
            es.iter()
                .map(|e| {
                    1 + if let Node::Dir(d) = &e.node {
                        walk(&d.entries)
                    } else {
                        0
                    }
                })
                .sum()
        }
        walk(&self.entries)
    }

    /// Whether any entry, the root included, carries extended attributes.
    pub fn has_xattrs(&self) -> bool {
        let mut any = !self.root.xattrs.is_empty();
        self.for_each(&mut |_, e| any |= !e.meta.xattrs.is_empty());
        any
    }

    /// Bytes of regular file content, each hardlink group counted once.
    pub fn bytes(&self) -> u64 {
        let mut total = 0;
        let mut seen = std::collections::HashSet::new();
        self.for_each(&mut |_, e| {
            if let Node::File(f) = &e.node {
                if f.group.is_none_or(|g| seen.insert(g)) {
                    total += e.meta.size;
                }
            }
        });
        total
    }

    /// Visit every entry in pre-order with its path relative to the root.
    pub fn for_each(&self, f: &mut dyn FnMut(&[u8], &Entry)) {
        fn walk(prefix: &mut Vec<u8>, es: &[Entry], f: &mut dyn FnMut(&[u8], &Entry)) {
            for e in es {
                let len = prefix.len();
                if len > 0 {
                    prefix.push(b'/');
                }
                prefix.extend_from_slice(&e.name);
                f(prefix, e);
                if let Node::Dir(d) = &e.node {
                    walk(prefix, &d.entries, f);
                }
                prefix.truncate(len);
            }
        }
        walk(&mut Vec::new(), &self.entries, f)
    }

    pub fn for_each_mut(&mut self, f: &mut dyn FnMut(&[u8], &mut Entry)) {
        fn walk(prefix: &mut Vec<u8>, es: &mut [Entry], f: &mut dyn FnMut(&[u8], &mut Entry)) {
            for e in es {
                let len = prefix.len();
                if len > 0 {
                    prefix.push(b'/');
                }
                prefix.extend_from_slice(&e.name);
                f(prefix, e);
                if let Node::Dir(d) = &mut e.node {
                    walk(prefix, &mut d.entries, f);
                }
                prefix.truncate(len);
            }
        }
        walk(&mut Vec::new(), &mut self.entries, f)
    }

    /// Give every path of a hardlink group the hash that one of them has
    /// (a manifest keeps it on the group's first path only): one inode,
    /// one content.
    pub fn share_group_hashes(&mut self) {
        let mut hashes = std::collections::HashMap::new();
        self.for_each(&mut |_, e| {
            if let Node::File(File {
                group: Some(g),
                hash: Some(h),
                ..
            }) = &e.node
            {
                hashes.entry(*g).or_insert(*h);
            }
        });
        if hashes.is_empty() {
            return;
        }
        self.for_each_mut(&mut |_, e| {
            if let Node::File(f) = &mut e.node {
                if let (Some(g), None) = (f.group, f.hash) {
                    f.hash = hashes.get(&g).copied();
                }
            }
        });
    }

    /// Keep the hash on the first path (in pre-order) of each hardlink group
    /// only, as a manifest records it (`manifest::assemble`): one tree gives
    /// one digest whichever way it was staged.
    pub fn keep_hashes_on_leaders(&mut self) {
        let mut leaders = std::collections::HashSet::new();
        self.for_each_mut(&mut |_, e| {
            if let Node::File(f) = &mut e.node {
                if f.group.is_some_and(|g| !leaders.insert(g)) {
                    f.hash = None;
                }
            }
        });
    }

    /// Whether no entry at all (an empty source).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Number hardlink groups from (dev, ino) of files with more than one
    /// link *inside this tree*, in pre-order: the first path of a group is its
    /// leader. A file whose other links are outside the tree stays single.
    pub fn assign_groups(&mut self) {
        self.number_groups(true)
    }

    /// The same for a tree read back from the volume: names showing one
    /// inode form a group whatever their link count says (another client of
    /// a network filesystem may show a stale count).
    pub fn assign_groups_by_inode(&mut self) {
        self.number_groups(false)
    }

    fn number_groups(&mut self, trust_nlink: bool) {
        // Sorting (dev, ino, pre-order number) finds the inodes seen more
        // than once with 24 bytes per candidate file and no hashing.
        let mut keys: Vec<(u64, u64, u32)> = Vec::new();
        let mut n = 0u32;
        self.for_each(&mut |_, e| {
            if let Node::File(f) = &e.node {
                if f.nlink > 1 || !trust_nlink {
                    keys.push((f.dev, f.ino, n));
                }
                n += 1;
            }
        });
        keys.sort_unstable();
        // (file number, its leader's: the group's first file in pre-order)
        let mut members: Vec<(u32, u32)> = Vec::new();
        for run in keys.chunk_by(|a, b| (a.0, a.1) == (b.0, b.1)) {
            if run.len() > 1 {
                members.extend(run.iter().map(|k| (k.2, run[0].2)));
            }
        }
        drop(keys);
        members.sort_unstable();
        let mut ids = vec![0u32; members.len()];
        let (mut next, mut j, mut n) = (0u32, 0usize, 0u32);
        self.for_each_mut(&mut |_, e| {
            if let Node::File(f) = &mut e.node {
                f.group = None;
                if members.get(j).is_some_and(|m| m.0 == n) {
                    let (me, leader) = members[j];
                    ids[j] = if me == leader {
                        next += 1;
                        next - 1
                    } else {
                        // The leader came earlier in pre-order: its id is set.
                        ids[members.partition_point(|m| m.0 < leader)]
                    };
                    f.group = Some(ids[j]);
                    j += 1;
                }
                n += 1;
            }
        });
    }

    /// Overlay `upper` on `self`: a path both provide takes `upper`'s entry,
    /// except that two directories merge, taking `upper`'s metadata.
    pub fn overlay(&mut self, upper: Tree) {
        self.root = upper.root;
        self.root_srcs |= upper.root_srcs;
        merge_entries(&mut self.entries, upper.entries);
    }
}

/// Overlay one directory's `upper` entries on its `lower` ones (`Tree::overlay`).
pub fn merge_entries(lower: &mut Vec<Entry>, upper: Vec<Entry>) {
    let old = std::mem::take(lower);
    let mut out = Vec::with_capacity(old.len().max(upper.len()));
    let mut a = old.into_iter().peekable();
    let mut b = upper.into_iter().peekable();
    loop {
        let ord = match (a.peek(), b.peek()) {
            (None, None) => break,
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (Some(x), Some(y)) => x.name.cmp(&y.name),
        };
        match ord {
            std::cmp::Ordering::Less => out.push(a.next().unwrap()),
            std::cmp::Ordering::Greater => out.push(b.next().unwrap()),
            std::cmp::Ordering::Equal => {
                let mut x = a.next().unwrap();
                let y = b.next().unwrap();
                match (&mut x.node, y.node) {
                    (Node::Dir(dx), Node::Dir(dy)) => {
                        dx.srcs |= dy.srcs;
                        merge_entries(&mut dx.entries, dy.entries);
                        x.meta = y.meta;
                        out.push(x);
                    }
                    (_, node) => out.push(Entry {
                        name: y.name,
                        meta: y.meta,
                        node,
                    }),
                }
            }
        }
    }
    *lower = out;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_before_the_epoch_is_written_as_its_distance_from_it() {
        let t = |s, ns| Time::from((s, ns)).decimal();
        assert_eq!(t(1_700_000_000, 0), "1700000000");
        assert_eq!(t(5, 250_000_000), "5.250000000");
        assert_eq!(t(-2, 750_000_000), "-1.250000000");
        assert_eq!(t(-1, 500_000_000), "-0.500000000");
        assert_eq!(t(-3, 0), "-3");
    }

    fn file(name: &str, src: u16) -> Entry {
        Entry {
            name: name.as_bytes().into(),
            meta: Meta::default(),
            node: Node::File(File {
                src,
                ..Default::default()
            }),
        }
    }

    fn dir(name: &str, src: u16, entries: Vec<Entry>) -> Entry {
        Entry {
            name: name.as_bytes().into(),
            meta: Meta::default(),
            node: Node::Dir(Dir {
                srcs: 1 << src,
                entries,
            }),
        }
    }

    #[test]
    fn overlay_later_source_wins_and_directories_merge() {
        let mut a = Tree {
            entries: vec![dir("d", 0, vec![file("x", 0), file("y", 0)]), file("f", 0)],
            ..Default::default()
        };
        let b = Tree {
            entries: vec![
                dir("d", 1, vec![file("y", 1), file("z", 1)]),
                dir("f", 1, vec![]),
            ],
            ..Default::default()
        };
        a.overlay(b);
        let mut seen = Vec::new();
        a.for_each(&mut |p, e| {
            let src = match &e.node {
                Node::File(f) => f.src as i32,
                Node::Dir(d) => d.srcs as i32 * 10,
                _ => -1,
            };
            seen.push((String::from_utf8(p.to_vec()).unwrap(), src));
        });
        assert_eq!(
            seen,
            vec![
                ("d".into(), 30),
                ("d/x".into(), 0),
                ("d/y".into(), 1),
                ("d/z".into(), 1),
                ("f".into(), 20)
            ]
        );
    }

    #[test]
    fn groups_only_count_links_inside_the_tree() {
        let mut f1 = file("a", 0);
        let mut f2 = file("b", 0);
        let mut f3 = file("c", 0);
        for (e, ino) in [(&mut f1, 7), (&mut f2, 7), (&mut f3, 9)] {
            if let Node::File(f) = &mut e.node {
                f.ino = ino;
                f.nlink = 2;
            }
        }
        let mut t = Tree {
            entries: vec![f1, f2, f3],
            ..Default::default()
        };
        t.assign_groups();
        let groups: Vec<_> = t
            .entries
            .iter()
            .map(|e| {
                if let Node::File(f) = &e.node {
                    f.group
                } else {
                    None
                }
            })
            .collect();
        assert_eq!(groups, vec![Some(0), Some(0), None]);
        // Read back from a volume, the inode decides even with a stale count.
        if let Node::File(f) = &mut t.entries[1].node {
            f.nlink = 1;
        }
        t.assign_groups();
        assert!(matches!(&t.entries[0].node, Node::File(f) if f.group.is_none()));
        t.assign_groups_by_inode();
        let g: Vec<_> = t
            .entries
            .iter()
            .map(|e| match &e.node {
                Node::File(f) => f.group,
                _ => None,
            })
            .collect();
        assert_eq!(g, vec![Some(0), Some(0), None]);
    }

    #[test]
    fn interleaved_groups_are_numbered_in_the_order_they_first_appear() {
        let mut es: Vec<Entry> = ["a", "b", "c", "d", "e", "f"]
            .iter()
            .map(|n| file(n, 0))
            .collect();
        for (e, (dev, ino)) in es
            .iter_mut()
            .zip([(1, 9), (1, 5), (1, 9), (2, 9), (1, 5), (2, 9)])
        {
            if let Node::File(f) = &mut e.node {
                (f.dev, f.ino, f.nlink) = (dev, ino, 2);
            }
        }
        let mut t = Tree {
            entries: vec![
                dir("x", 0, es.split_off(3)),
                es[0].clone(),
                es[1].clone(),
                es[2].clone(),
            ],
            ..Default::default()
        };
        t.assign_groups();
        let mut seen = Vec::new();
        t.for_each(&mut |p, e| {
            if let Node::File(f) = &e.node {
                seen.push((String::from_utf8(p.to_vec()).unwrap(), f.group));
            }
        });
        // Pre-order: x/d, x/e, x/f, a, b, c.
        assert_eq!(
            seen,
            vec![
                ("x/d".into(), Some(0)),
                ("x/e".into(), Some(1)),
                ("x/f".into(), Some(0)),
                ("a".into(), Some(2)),
                ("b".into(), Some(1)),
                ("c".into(), Some(2)),
            ]
        );
    }

    #[test]
    fn names_compare_as_bytes_whether_inline_or_not() {
        let long = [b'z'; INLINE + 1];
        let names: Vec<Name> = [&b""[..], b"a", &long[..INLINE], &long[..], b"\xff"]
            .iter()
            .map(|b| Name::from(*b))
            .collect();
        assert!(matches!(names[2], Name::Inline(..)));
        assert!(matches!(names[3], Name::Heap(_)));
        for (n, b) in names
            .iter()
            .zip([&b""[..], b"a", &long[..INLINE], &long[..], b"\xff"])
        {
            assert_eq!(&**n, b);
            assert_eq!(Name::from(b.to_vec()), *n);
        }
        let mut sorted = names.clone();
        sorted.sort();
        let mut bytes: Vec<&[u8]> = names.iter().map(|n| &**n).collect();
        bytes.sort();
        assert_eq!(sorted.iter().map(|n| &**n).collect::<Vec<_>>(), bytes);
    }
}
