//! The live generation's manifest, indexed by directory, for a sync that
//! stages an update a directory at a time (`stage::stream`): one pass over
//! the manifest records where each directory's entry lines are (a few runs
//! of lines, as pre-order puts a directory's subdirectories' trees between
//! its entries), how many entries lie below it, and the hash of each
//! hardlink group (kept on its first path only). The lines themselves stay
//! in the manifest and are read back a directory at a time: what is held
//! for the whole tree is one record per directory and one per hardlink
//! group, never one per file.
//!
//! The manifest was read from the volume: it is parsed as hostile. Every
//! line is parsed in the first pass, and the order must be strict pre-order
//! with every parent a directory listed before its entries; anything else
//! is an error, and the caller then compares whole trees instead.

use std::collections::HashMap;
use std::io::{BufRead, Seek};
use std::os::fd::{AsFd, OwnedFd};

use anyhow::{bail, Context, Result};

use crate::manifest::{cmp_preorder, parse_entry};
use crate::sys;
#[cfg(test)]
use crate::tree::File;
use crate::tree::{Entry, Meta, Node};

/// A manifest line longer than this is not one packsync writes.
const MAX_LINE: usize = 1 << 20;

/// One directory: its path (in `Index::paths`), its runs of entry lines
/// (in `Index::runs`), and what lies below it. 20 bytes and its path (a
/// manifest whose directories' paths or entries pass 2^32 is refused).
#[derive(Debug, Default, Clone, Copy)]
struct Dir {
    path_at: u32,
    path_len: u32,
    /// Its runs: `Index::runs[runs_at..runs_at + runs_len]`.
    runs_at: u32,
    runs_len: u32,
    /// Entries below it, at any depth.
    below: u32,
}

/// Where one run of a directory's entry lines is: offset (high and low
/// halves) and length. 12 bytes.
#[derive(Debug, Clone, Copy)]
struct Run([u32; 3]);

impl Run {
    fn new(off: u64, len: u32) -> Run {
        Run([(off >> 32) as u32, off as u32, len])
    }

    fn off(&self) -> u64 {
        (self.0[0] as u64) << 32 | self.0[1] as u64
    }

    fn len(&self) -> u32 {
        self.0[2]
    }
}

/// Where the manifest's bytes are read again, by offset: its file on the
/// volume (`OwnedFd`), or bytes in memory (the fuzz target).
pub trait At: Send + Sync {
    fn read_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<usize>;
}

impl At for OwnedFd {
    fn read_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
        sys::pread(self.as_fd(), buf, off)
    }
}

impl At for Vec<u8> {
    fn read_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
        let rest = self.get(off as usize..).unwrap_or_default();
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        Ok(n)
    }
}

/// The live manifest by directory (see the module's comment).
pub struct Index {
    file: Box<dyn At>,
    /// Shown in errors.
    shown: String,
    /// Every directory's path, one after another.
    paths: Vec<u8>,
    /// The directories in pre-order (the root first), as the manifest lists
    /// them: sorted, so found by binary search.
    dirs: Vec<Dir>,
    /// Each directory's runs of lines, one directory after another.
    runs: Vec<Run>,
    /// Hardlink group → its hash.
    groups: HashMap<u32, [u8; 32]>,
    /// Hardlink group → how many paths it records.
    group_paths: HashMap<u32, u32>,
    /// The root's metadata.
    pub root: Meta,
    /// Entries below the root, and bytes of file content (each group once).
    pub entries: u64,
    pub bytes: u64,
}

impl Index {
    /// Index the manifest `r` reads (positioned after its header; `file` is
    /// the same open file, read again by offset later).
    pub fn build<R: BufRead + Seek>(r: R, file: Box<dyn At>, shown: String) -> Result<Index> {
        Index::build_each(r, file, shown, &mut |_, _| ())
    }

    /// `build`, handing `each` every entry read (the root's `.` first), in
    /// the manifest's order: what a reader that checks the manifest as it
    /// indexes it needs (`verify::against_manifest`).
    pub fn build_each<R: BufRead + Seek>(
        mut r: R,
        file: Box<dyn At>,
        shown: String,
        each: &mut dyn FnMut(&[u8], &Entry),
    ) -> Result<Index> {
        let mut off = r
            .stream_position()
            .with_context(|| format!("cannot read {shown}"))?;
        let mut ix = Index {
            file,
            shown,
            paths: Vec::new(),
            dirs: vec![Dir::default()],
            runs: Vec::new(),
            groups: HashMap::new(),
            group_paths: HashMap::new(),
            root: Meta::default(),
            entries: 0,
            bytes: 0,
        };
        // The directories open in pre-order: each entry's parent is on top.
        let mut open: Vec<u32> = vec![0];
        // (directory, offset, length) of each run, in the manifest's order.
        let mut runs: Vec<(u32, u64, u32)> = Vec::new();
        let mut prev: Option<Vec<u8>> = None;
        let mut line = Vec::new();
        let mut n = 0u64;
        let mut seen_groups = std::collections::HashSet::new();
        loop {
            line.clear();
            let len = std::io::Read::take(&mut r, MAX_LINE as u64 + 1)
                .read_until(b'\n', &mut line)
                .with_context(|| format!("cannot read {}", ix.shown))?;
            if len == 0 {
                break;
            }
            n += 1;
            let at = off;
            off += len as u64;
            let bad = |why: &str| format!("{}: line {n}: {why}", ix.shown);
            if len > MAX_LINE || line.last() != Some(&b'\n') {
                bail!(bad("too long, or cut short"));
            }
            let text = std::str::from_utf8(&line[..len - 1]).with_context(|| bad("not text"))?;
            let (path, e) = parse_entry(text).with_context(|| bad("bad entry"))?;
            each(&path, &e);
            if path == b"." {
                if n != 1 {
                    bail!(bad("the root after other entries"));
                }
                ix.root = e.meta;
                continue;
            }
            if prev
                .as_ref()
                .is_some_and(|p| cmp_preorder(p, &path) != std::cmp::Ordering::Less)
            {
                bail!(bad("out of order"));
            }
            let parent = path
                .iter()
                .rposition(|&b| b == b'/')
                .map_or(&path[..0], |i| &path[..i]);
            // Close the directories this entry is not in; the root stays open.
            let d = loop {
                let top = *open.last().expect("the root");
                if ix.path(top) == parent {
                    break top;
                }
                if open.len() == 1 {
                    bail!(bad("its directory is not listed before it"));
                }
                open.pop();
                let below = ix.dirs[top as usize].below;
                ix.dirs[*open.last().expect("the root") as usize].below += below;
            };
            ix.dirs[d as usize].below += 1;
            match runs.last_mut() {
                Some((rd, o, l))
                    if *rd == d
                        && *o + *l as u64 == at
                        && (*l as u64 + len as u64) < u32::MAX as u64 =>
                {
                    *l += len as u32
                }
                _ => runs.push((d, at, len as u32)),
            }
            ix.entries += 1;
            if ix.entries >= u64::from(u32::MAX) {
                bail!(bad("too many entries"));
            }
            if let Node::File(f) = &e.node {
                if let Some(g) = f.group {
                    *ix.group_paths.entry(g).or_default() += 1;
                }
            }
            match &e.node {
                Node::Dir(_) => {
                    let id = u32::try_from(ix.dirs.len())
                        .with_context(|| bad("too many directories"))?;
                    if ix.paths.len() + path.len() > u32::MAX as usize {
                        bail!(bad("too many directories"));
                    }
                    let path_at = ix.paths.len() as u32;
                    ix.dirs.push(Dir {
                        path_at,
                        path_len: path.len() as u32,
                        ..Dir::default()
                    });
                    ix.paths.extend_from_slice(&path);
                    open.push(id);
                }
                Node::File(f) => match (f.group, f.hash) {
                    (Some(g), Some(h)) => {
                        ix.groups.insert(g, h);
                        if seen_groups.insert(g) {
                            ix.bytes += e.meta.size;
                        }
                    }
                    (Some(g), None) => {
                        if seen_groups.insert(g) {
                            ix.bytes += e.meta.size;
                        }
                    }
                    (None, _) => ix.bytes += e.meta.size,
                },
                Node::Symlink(_) => {}
            }
            prev = Some(path);
        }
        while let Some(done) = open.pop() {
            let below = ix.dirs[done as usize].below;
            if let Some(&up) = open.last() {
                ix.dirs[up as usize].below += below;
            }
        }
        if n == 0 {
            bail!("{}: no entries (not even its root): cut short", ix.shown);
        }
        // Each directory's runs together, in order.
        runs.sort_by_key(|&(d, o, _)| (d, o));
        let mut i = 0;
        while i < runs.len() {
            let d = runs[i].0 as usize;
            let start = i;
            while i < runs.len() && runs[i].0 as usize == d {
                i += 1;
            }
            ix.dirs[d].runs_at = start as u32;
            ix.dirs[d].runs_len = (i - start) as u32;
        }
        ix.runs = runs.iter().map(|&(_, o, l)| Run::new(o, l)).collect();
        drop(runs);
        ix.dirs.shrink_to_fit();
        ix.paths.shrink_to_fit();
        Ok(ix)
    }

    /// How many directories it lists (the root too), and the bytes of their
    /// paths: what the new tree's spool index will hold, near enough.
    pub fn dirs_and_path_bytes(&self) -> (usize, usize) {
        (self.dirs.len(), self.paths.len())
    }

    /// The path of directory `d`.
    fn path(&self, d: u32) -> &[u8] {
        let d = &self.dirs[d as usize];
        &self.paths[d.path_at as usize..d.path_at as usize + d.path_len as usize]
    }

    /// The directory at `path`, where the manifest lists one.
    fn find(&self, path: &[u8]) -> Option<&Dir> {
        Some(&self.dirs[self.place(path)?])
    }

    /// Where the directory at `path` is in `dirs`.
    fn place(&self, path: &[u8]) -> Option<usize> {
        self.dirs
            .binary_search_by(|d| {
                let p = &self.paths[d.path_at as usize..d.path_at as usize + d.path_len as usize];
                if p.is_empty() || path.is_empty() {
                    // The root sorts first.
                    return p.len().cmp(&path.len());
                }
                cmp_preorder(p, path)
            })
            .ok()
    }

    /// A number of its own for the directory at `path` (its place in the
    /// index), where the manifest lists one.
    pub fn dir_id(&self, path: &[u8]) -> Option<u32> {
        u32::try_from(self.place(path)?).ok()
    }

    /// Entries below the directory at `path`, at any depth (0 if none).
    pub fn below(&self, path: &[u8]) -> u64 {
        self.find(path).map_or(0, |d| u64::from(d.below))
    }

    /// The entries of the directory at `path` as the manifest records them,
    /// in name order, each file with its hash (a hardlink group's from its
    /// first path); empty where the manifest lists no such directory.
    pub fn entries(&self, path: &[u8]) -> Result<Vec<Entry>> {
        let Some(d) = self.find(path) else {
            return Ok(Vec::new());
        };
        let bad = || format!("{}: changed while it was read", self.shown);
        let mut out: Vec<Entry> = Vec::new();
        let runs = &self.runs[d.runs_at as usize..(d.runs_at + d.runs_len) as usize];
        for run in runs {
            let (off, len) = (run.off(), run.len());
            let mut buf = vec![0u8; len as usize];
            let mut got = 0;
            while got < buf.len() {
                let n = self
                    .file
                    .read_at(&mut buf[got..], off + got as u64)
                    .with_context(|| format!("cannot read {}", self.shown))?;
                if n == 0 {
                    bail!(bad());
                }
                got += n;
            }
            for raw in buf.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
                let text = std::str::from_utf8(raw).with_context(bad)?;
                let (p, mut e) = parse_entry(text).with_context(bad)?;
                let parent = p
                    .iter()
                    .rposition(|&b| b == b'/')
                    .map_or(&p[..0], |i| &p[..i]);
                if parent != path || out.last().is_some_and(|l| l.name >= e.name) {
                    bail!(bad());
                }
                if let Node::File(f) = &mut e.node {
                    if f.hash.is_none() {
                        f.hash = f.group.and_then(|g| self.groups.get(&g).copied());
                    }
                }
                out.push(e);
            }
        }
        Ok(out)
    }

    /// Every entry in pre-order, with its path, read back a directory at
    /// a time as a streamed update reads them (for the fuzz target).
    pub fn walk(&self, f: &mut dyn FnMut(&[u8], &Entry)) -> Result<()> {
        fn dir(ix: &Index, rel: &[u8], f: &mut dyn FnMut(&[u8], &Entry)) -> Result<()> {
            for e in ix.entries(rel)? {
                let p = crate::tree::join(rel, &e.name);
                f(&p, &e);
                if let Node::Dir(_) = e.node {
                    dir(ix, &p, f)?;
                }
            }
            Ok(())
        }
        dir(self, b"", f)
    }

    /// How many paths the manifest records in hardlink group `g`.
    pub fn group_paths(&self, g: u32) -> u32 {
        self.group_paths.get(&g).copied().unwrap_or(0)
    }

    /// The names at the top of the tree.
    pub fn top(&self) -> Result<Vec<Vec<u8>>> {
        Ok(self
            .entries(b"")?
            .into_iter()
            .map(|e| e.name.to_vec())
            .collect())
    }
}

/// Walk one directory's entries from the sources and as recorded, both in
/// name order, side by side: `f` gets each name's entry on either side.
pub fn pair(
    src: &mut [Entry],
    live: &[Entry],
    mut f: impl FnMut(Option<&mut Entry>, Option<&Entry>),
) {
    let mut li = 0;
    for e in src.iter_mut() {
        while li < live.len() && live[li].name < e.name {
            f(None, Some(&live[li]));
            li += 1;
        }
        match live.get(li).filter(|l| l.name == e.name) {
            Some(l) => {
                li += 1;
                f(Some(e), Some(l))
            }
            None => f(Some(e), None),
        }
    }
    for l in &live[li..] {
        f(None, Some(l));
    }
}

impl Index {
    /// What a sync deletes of the recorded entry `l` of the directory at
    /// `rel` when the sources have `e` there (counted as `plan` counts):
    /// with nothing there, `l` and everything below it; where the kind
    /// changed, what was below `l` (the entry itself is a change).
    pub fn gone(&self, rel: &[u8], l: &Entry, e: Option<&Entry>) -> u64 {
        let below = match l.node {
            Node::Dir(_) => self.below(&crate::tree::join(rel, &l.name)),
            _ => 0,
        };
        match e {
            None => 1 + below,
            Some(e) if e.kind() != l.kind() => below,
            Some(_) => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::Manifest;
    use crate::tree::{Dir as TDir, Tree};

    fn file(name: &str, size: u64, hash: u8, group: Option<u32>) -> Entry {
        Entry {
            name: name.as_bytes().into(),
            meta: Meta {
                mode: 0o644,
                size,
                ..Default::default()
            },
            node: Node::File(File {
                hash: Some([hash; 32]),
                group,
                ..Default::default()
            }),
        }
    }

    fn dir(name: &str, entries: Vec<Entry>) -> Entry {
        Entry {
            name: name.as_bytes().into(),
            meta: Meta {
                mode: 0o755,
                ..Default::default()
            },
            node: Node::Dir(TDir { srcs: 1, entries }),
        }
    }

    fn index_of(tree: Tree) -> (tempfile::TempDir, Index) {
        let m = Manifest {
            tree,
            ..Manifest::default()
        };
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("m");
        let mut out = Vec::new();
        let mut m = m;
        m.write(&mut out).unwrap();
        std::fs::write(&path, &out).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let mut r = std::io::BufReader::new(f.try_clone().unwrap());
        Manifest::read_header(&mut r).unwrap();
        let ix = Index::build(r, Box::new(OwnedFd::from(f)), "m".into()).unwrap();
        (tmp, ix)
    }

    #[test]
    fn every_directory_gets_its_own_entries_between_its_subtrees() {
        let tree = Tree {
            root: Meta::default(),
            root_srcs: 1,
            entries: vec![
                file("a", 1, 1, Some(0)),
                dir(
                    "b",
                    vec![file("x", 2, 2, None), dir("y", vec![file("z", 3, 3, None)])],
                ),
                {
                    // A group's later path carries no hash in a manifest.
                    let mut c = file("c", 1, 0, Some(0));
                    if let Node::File(f) = &mut c.node {
                        f.hash = None;
                    }
                    c
                },
                dir("d", vec![]),
            ],
        };
        let (_t, ix) = index_of(tree);
        let names = |p: &[u8]| -> Vec<String> {
            ix.entries(p)
                .unwrap()
                .iter()
                .map(|e| String::from_utf8_lossy(&e.name).into_owned())
                .collect()
        };
        assert_eq!(names(b""), ["a", "b", "c", "d"]);
        assert_eq!(names(b"b"), ["x", "y"]);
        assert_eq!(names(b"b/y"), ["z"]);
        assert!(names(b"d").is_empty() && names(b"a").is_empty());
        assert_eq!(
            (ix.entries, ix.below(b""), ix.below(b"b"), ix.below(b"d")),
            (7, 7, 3, 0)
        );
        // The index gives it the group's.
        let c = ix.entries(b"").unwrap().remove(2);
        assert!(matches!(c.node, Node::File(File { hash: Some(h), .. }) if h == [1; 32]));
        // Each group's content once: 1 + 2 + 3.
        assert_eq!(ix.bytes, 6);
    }

    #[test]
    fn a_manifest_out_of_pre_order_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let lines = [
            "d 755 0 0 0 0 - - .",
            "d 755 0 0 0 0 - - a",
            "d 755 0 0 0 0 - - b",
            "f 644 0 0 1 0 - - a/x",
        ];
        for (i, body) in [lines.join("\n"), [lines[0], lines[3]].join("\n")]
            .iter()
            .enumerate()
        {
            let path = tmp.path().join(format!("m{i}"));
            std::fs::write(&path, format!("{body}\n")).unwrap();
            let f = std::fs::File::open(&path).unwrap();
            let r = std::io::BufReader::new(f.try_clone().unwrap());
            let err = Index::build(r, Box::new(OwnedFd::from(f)), "m".into())
                .err()
                .unwrap();
            let want = [
                "line 4: out of order",
                "line 2: its directory is not listed before it",
            ];
            assert!(format!("{err:#}").contains(want[i]), "{err:#}");
        }
    }
}
