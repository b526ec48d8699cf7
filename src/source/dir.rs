//! The directory kind: a tree read through directory handles, in parallel,
//! stat'ing each entry once and never following a symlink below the root.
//! Also how the live generation and a tree being verified are read.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rayon::prelude::*;

use crate::error;
use crate::escape::display;
use crate::filter::Filter;
use crate::report::Reporter;
use crate::sys::{self, DirFd, StatKind};
use crate::tree::join;
use crate::tree::meta_of;
use crate::tree::{Dir as DirNode, Entry, File, Meta, Name, Node, Tree};
use crate::xattr::Set;

use super::Source;

/// A directory tree, held by a handle on its root.
pub struct Dir {
    root: DirFd,
    label: String,
    path: Option<PathBuf>,
}

impl Dir {
    /// The directory a SOURCE argument names (symlinks in `arg` followed:
    /// the user named it). `shown` is `arg` as given.
    pub fn open(arg: &Path, shown: String) -> Result<Dir> {
        let unreadable = |e: io::Error| error::usage(format!("{shown}: cannot read source: {e}"));
        let root = DirFd::open_path(arg).map_err(unreadable)?;
        // A listing on a handle of its own: the one kept must start at offset 0.
        DirFd::open_path(arg)
            .and_then(|probe| probe.list())
            .map_err(unreadable)?;
        let path = sys::canonicalize(arg).with_context(|| format!("cannot resolve {shown}"))?;
        Ok(Dir {
            root,
            label: shown,
            path: Some(path),
        })
    }

    /// A directory already open (the live generation, a tree to verify);
    /// `label` names it in messages.
    pub fn new(root: DirFd, label: impl Into<String>) -> Dir {
        Dir {
            root,
            label: label.into(),
            path: None,
        }
    }

    /// The metadata of a tree's root `root` (its extended attributes
    /// where `filter` says), named `label` in messages.
    pub fn meta_of_root(root: &DirFd, label: &str, filter: &Filter) -> Result<Meta> {
        let st = root
            .fstat()
            .with_context(|| format!("cannot stat {label}"))?;
        let mut meta = meta_of(&st, 0);
        if filter.xattrs {
            let pairs = root
                .xattrs_self()
                .with_context(|| format!("cannot read the extended attributes of {label}"))?;
            meta.xattrs = Set::of(pairs);
        }
        Ok(meta)
    }

    /// One directory of a tree walked a directory at a time (`scan::Walk`):
    /// the entries of `dir`, at `rel` below the root of the tree `label`
    /// names, as `scan` gives them, each directory without its children.
    pub fn list(
        dir: &DirFd,
        rel: &[u8],
        label: &str,
        src: u16,
        filter: &Filter,
        reporter: &dyn Reporter,
    ) -> Result<Vec<Entry>> {
        let walk = Walk {
            label,
            src,
            filter,
            reporter,
        };
        walk.list(dir, &mut rel.to_vec())
    }

    /// The names and kinds alone of what `list` gives, with no stat where
    /// the listing tells the kind (`d_type`; a filesystem that answers
    /// "unknown" is asked with a stat): what decides whether a recorded
    /// entry goes (`scan::count_deleted`). Metadata is left empty, symlink
    /// targets unread, and what `list` skips is left out without a word
    /// (`list` reports it when the sync reads the directory).
    pub fn kinds(
        dir: &DirFd,
        rel: &[u8],
        label: &str,
        src: u16,
        filter: &Filter,
    ) -> Result<Vec<Entry>> {
        let listed = dir
            .list()
            .with_context(|| format!("cannot read directory {}", display(label, rel)))?;
        let mut entries = Vec::with_capacity(listed.len());
        for l in listed {
            let kind = match sys::kind_listed(&l) {
                Some(k) => k,
                None => match dir.stat(&l.name) {
                    Ok(st) => sys::kind_of(&st),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => {
                        return Err(e).with_context(|| {
                            format!("cannot stat {}", display(label, &join(rel, &l.name)))
                        })
                    }
                },
            };
            if !filter.is_empty() && filter.excludes(&join(rel, &l.name), kind == StatKind::Dir) {
                continue;
            }
            let node = match kind {
                StatKind::File => Node::File(File {
                    src,
                    ..Default::default()
                }),
                StatKind::Symlink => Node::Symlink(Default::default()),
                StatKind::Dir => Node::Dir(DirNode {
                    srcs: 1 << src,
                    entries: Vec::new(),
                }),
                StatKind::Other(_) => continue,
            };
            entries.push(Entry {
                name: l.name.into(),
                meta: Meta::default(),
                node,
            });
        }
        entries.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        Ok(entries)
    }
}

impl Source for Dir {
    fn label(&self) -> &str {
        &self.label
    }

    fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    fn identity(&self) -> String {
        match &self.path {
            Some(p) => p.display().to_string(),
            None => self.label.clone(),
        }
    }

    fn version(&self) -> Result<Option<String>> {
        super::bundle_revision(&self.root, &self.label)
    }

    fn scan(&self, src: u16, filter: &Filter, reporter: &dyn Reporter) -> Result<Tree> {
        let root = Dir::meta_of_root(&self.root, &self.label, filter)?;
        let walk = Walk {
            label: &self.label,
            src,
            filter,
            reporter,
        };
        let entries = walk.dir(&self.root, &mut Vec::new())?;
        Ok(Tree {
            root,
            root_srcs: 1 << src,
            entries,
        })
    }

    fn root(&self) -> Option<&DirFd> {
        Some(&self.root)
    }

    fn lists_by_directory(&self) -> bool {
        true
    }

    fn open_file(&self, path: &[u8]) -> io::Result<OwnedFd> {
        let (dir, name) = match path.iter().rposition(|&b| b == b'/') {
            Some(i) => (&path[..i], &path[i + 1..]),
            None => (&b""[..], path),
        };
        if dir.is_empty() {
            return self.root.open_read(name);
        }
        self.root.open_beneath(dir)?.open_read(name)
    }

    /// Still a regular file with the inode, size, ctime and mtime scanned:
    /// neither swapped for another file (or a FIFO, a device) nor written to.
    fn unchanged(&self, fd: BorrowedFd<'_>, seen: &Entry) -> io::Result<bool> {
        let Node::File(f) = &seen.node else {
            return Ok(false);
        };
        let st = sys::fstat(fd)?;
        Ok(sys::kind_of(&st) == StatKind::File
            && st.st_ino == f.ino
            && st.st_size as u64 == seen.meta.size
            && sys::change_stamp(&st) == f.stamp)
    }
}

/// What every directory of one scan shares.
struct Walk<'a> {
    label: &'a str,
    src: u16,
    filter: &'a Filter,
    reporter: &'a dyn Reporter,
}

impl Walk<'_> {
    /// The entries of `dir` (at `rel` below the root), sorted by name;
    /// subdirectories are read in parallel, each owning its handle.
    fn dir(&self, dir: &DirFd, rel: &mut Vec<u8>) -> Result<Vec<Entry>> {
        let mut entries = self.list(dir, rel)?;
        let mut subdirs: Vec<(usize, DirFd, Vec<u8>)> = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            if let Node::Dir(_) = e.node {
                let path = join(rel, &e.name);
                let fd = dir.open_dir(&e.name).with_context(|| {
                    format!("cannot open directory {}", display(self.label, &path))
                })?;
                subdirs.push((i, fd, path));
            }
        }
        let results: Vec<Result<(usize, Vec<Entry>)>> = subdirs
            .into_par_iter()
            .map(|(i, fd, mut sub_rel)| Ok((i, self.dir(&fd, &mut sub_rel)?)))
            .collect();
        for r in results {
            let (i, children) = r?;
            if let Node::Dir(d) = &mut entries[i].node {
                d.entries = children;
            }
        }
        Ok(entries)
    }

    /// The entries of `dir` alone, sorted by name, directories without
    /// their children.
    fn list(&self, dir: &DirFd, rel: &mut Vec<u8>) -> Result<Vec<Entry>> {
        let listed = dir
            .list()
            .with_context(|| format!("cannot read directory {}", display(self.label, rel)))?;
        let mut entries = Vec::with_capacity(listed.len());
        for l in listed {
            let base = rel.len();
            if base > 0 {
                rel.push(b'/');
            }
            rel.extend_from_slice(&l.name);
            let res = self.entry(dir, l.name, rel);
            rel.truncate(base);
            if let Some(e) = res? {
                entries.push(e);
            }
        }
        entries.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        Ok(entries)
    }

    /// Stat one listed name: what it is, or `None` for what the tree leaves out.
    fn entry(&self, dir: &DirFd, name: Vec<u8>, rel: &[u8]) -> Result<Option<Entry>> {
        let shown = || display(self.label, rel);
        let st = match dir.stat(&name) {
            Ok(st) => st,
            // Vanished between listing and stat: it is simply not part of the tree.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("cannot stat {}", shown())),
        };
        let kind = sys::kind_of(&st);
        if !self.filter.is_empty() && self.filter.excludes(rel, kind == StatKind::Dir) {
            return Ok(None);
        }
        let (node, size) = match kind {
            StatKind::File => (
                Node::File(File {
                    src: self.src,
                    dev: st.st_dev,
                    ino: st.st_ino,
                    nlink: st.st_nlink as u32,
                    stamp: sys::change_stamp(&st),
                    ..Default::default()
                }),
                st.st_size as u64,
            ),
            StatKind::Symlink => {
                let target = match dir.readlink(&name) {
                    Ok(t) => t,
                    Err(e) => {
                        // sshfs with contain_symlinks (Debian's default) refuses
                        // links that point outside, absolute ones among them.
                        let hint = if sys::is_not_permitted(&e)
                            && dir.fs_kind().is_ok_and(|k| k == sys::FsKind::Fuse)
                        {
                            " (on sshfs, mount with -o no_contain_symlinks: see the README's limits)"
                        } else {
                            ""
                        };
                        return Err(e)
                            .with_context(|| format!("cannot read symlink {}{hint}", shown()));
                    }
                };
                let size = target.len() as u64;
                (Node::Symlink(target.into()), size)
            }
            StatKind::Dir => {
                let node = Node::Dir(DirNode {
                    srcs: 1 << self.src,
                    entries: Vec::new(),
                });
                (node, 0)
            }
            StatKind::Other(what) => {
                self.reporter.skipped(self.label, rel, what);
                return Ok(None);
            }
        };
        // A symlink has no descriptor to set attributes through: none read.
        let xattrs = match &node {
            Node::File(_) | Node::Dir(_) if self.filter.xattrs => {
                Set::of(dir.xattrs(&name).with_context(|| {
                    format!("cannot read the extended attributes of {}", shown())
                })?)
            }
            _ => Set::default(),
        };
        let name: Name = name.into();
        Ok(Some(Entry {
            name,
            meta: Meta {
                size,
                xattrs,
                ..meta_of(&st, 0)
            },
            node,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Collected;
    use std::os::fd::AsFd;

    fn mkfifo(p: &Path) {
        let ok = std::process::Command::new("mkfifo")
            .arg(p)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mkfifo {}", p.display());
    }

    #[test]
    fn a_skipped_fifo_is_reported_by_its_raw_name() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("sub")).unwrap();
        std::fs::write(t.path().join("sub/a"), "x").unwrap();
        mkfifo(&t.path().join("sub/fi\tfo"));
        let src = Dir::new(DirFd::open_path(t.path()).unwrap(), "src/");
        let seen = Collected::default();
        let tree = src.scan(3, &Filter::default(), &seen).unwrap();
        let Node::Dir(d) = &tree.entries[0].node else {
            panic!("sub is a directory")
        };
        assert_eq!(d.entries.len(), 1, "only the file is in the tree");
        assert!(matches!(d.entries[0].node, Node::File(File { src: 3, .. })));
        let skipped = seen.take_skipped();
        assert_eq!(skipped.len(), 1);
        assert_eq!(skipped[0].path, b"sub/fi\tfo");
        assert_eq!(skipped[0].what, "FIFO");
        // The text for the log is escaped once, for one line.
        assert_eq!(seen.take_warnings(), ["skipping FIFO src/sub/fi\\tfo"]);
    }

    #[test]
    fn verify_reports_a_skipped_fifo_under_its_own_name() {
        let t = tempfile::tempdir().unwrap();
        mkfifo(&t.path().join("fi\tfo"));
        let root = DirFd::open_path(t.path()).unwrap();
        // Against an empty manifest (its root's mode and mtime differ too).
        let diffs = crate::verify::run(&root, "live", &Tree::default(), rules()).unwrap();
        let diffs: Vec<_> = diffs.into_iter().filter(|d| d.path != b".").collect();
        assert_eq!(diffs.len(), 1, "{diffs:?}");
        assert_eq!(diffs[0].what, "extra");
        assert_eq!(diffs[0].path, b"fi\tfo");
        assert_eq!(diffs[0].found.as_deref(), Some("FIFO"));
        assert_eq!(diffs[0].to_string(), "extra fi\\tfo (FIFO)");
    }

    fn rules() -> crate::verify::Rules {
        crate::verify::Rules {
            owners: false,
            granularity_ns: 1,
            link_meta: true,
            hardlinks: true,
        }
    }

    #[test]
    fn a_file_is_opened_beneath_the_root_and_checked_against_its_scan() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("a/b")).unwrap();
        std::fs::write(t.path().join("a/b/f"), "12345").unwrap();
        std::os::unix::fs::symlink("b", t.path().join("a/l")).unwrap();
        let src = Dir::new(DirFd::open_path(t.path()).unwrap(), "src");
        let tree = src
            .scan(0, &Filter::default(), &Collected::default())
            .unwrap();
        let mut seen = None;
        tree.for_each(&mut |p, e| {
            if p == b"a/b/f" {
                seen = Some(e.clone());
            }
        });
        let seen = seen.unwrap();
        let fd = src.open_file(b"a/b/f").unwrap();
        assert!(src.unchanged(fd.as_fd(), &seen).unwrap());
        assert!(src.open_file(b"a/l/f").is_err(), "no symlink is followed");
        assert!(src.open_file(b"a/../a/b/f").is_err(), "no way out");
        std::fs::write(t.path().join("a/b/f"), "1234567").unwrap();
        assert!(!src.unchanged(fd.as_fd(), &seen).unwrap(), "written to");
    }
}
