//! Scan: read a directory tree into a `Tree`, through directory handles, in
//! parallel, stat'ing each entry once and never following a symlink below
//! the root. Also hashes file contents on demand (`--checksum`, `verify`).
//!
//! Scanning never writes. Special files are reported through `warn` and left
//! out; a filter may leave out excluded paths.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Mutex;

use anyhow::{Context, Result};
use rayon::prelude::*;
use sha2::{Digest, Sha256};

use crate::sys::{self, StatKind};
use crate::tree::{Dir, Entry, File, Meta, Name, Node, Tree};

/// Which paths a scan leaves out (gitignore rules, in command-line order).
#[derive(Default)]
pub struct Filter {
    rules: Option<ignore::gitignore::Gitignore>,
}

impl Filter {
    /// `rules`: gitignore lines; `!pattern` re-includes.
    pub fn new(rules: &[String]) -> Result<Filter> {
        if rules.is_empty() {
            return Ok(Filter::default());
        }
        let mut b = ignore::gitignore::GitignoreBuilder::new("/");
        for r in rules {
            b.add_line(None, r)
                .with_context(|| format!("bad pattern {r:?}"))?;
        }
        Ok(Filter {
            rules: Some(b.build().context("bad exclude/include patterns")?),
        })
    }

    pub fn excludes(&self, rel: &[u8], is_dir: bool) -> bool {
        match &self.rules {
            None => false,
            Some(g) => g
                .matched(std::path::Path::new(sys::os(rel)), is_dir)
                .is_ignore(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_none()
    }
}

/// Things a scan tells the user about without failing.
#[derive(Default)]
pub struct Warnings(pub Mutex<Vec<String>>);

impl Warnings {
    pub fn push(&self, w: String) {
        self.0.lock().unwrap().push(w);
    }
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// Scan the tree below `root` (an open directory). `label` names the root in
/// messages; `src` is recorded in every entry for the overlay.
pub fn run(
    root: BorrowedFd<'_>,
    label: &str,
    src: u16,
    filter: &Filter,
    warn: &Warnings,
) -> Result<Tree> {
    let st = sys::fstat(root).with_context(|| format!("cannot stat {label}"))?;
    let entries = scan_dir(root, &mut Vec::new(), label, src, filter, warn)?;
    Ok(Tree {
        root: meta_of(&st, 0),
        root_srcs: 1 << src,
        entries,
    })
}

pub fn meta_of(st: &sys::Stat, size: u64) -> Meta {
    Meta {
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        size,
        mtime: sys::mtime_of(st).into(),
    }
}

/// `label/rel` for messages, with unprintable bytes escaped.
pub fn display(label: &str, rel: &[u8]) -> String {
    if rel.is_empty() {
        label.to_string()
    } else {
        format!(
            "{}/{}",
            label.trim_end_matches('/'),
            crate::report::escape(rel)
        )
    }
}

fn scan_dir(
    dir: BorrowedFd<'_>,
    rel: &mut Vec<u8>,
    label: &str,
    src: u16,
    filter: &Filter,
    warn: &Warnings,
) -> Result<Vec<Entry>> {
    let listed = sys::list_dir(dir)
        .with_context(|| format!("cannot read directory {}", display(label, rel)))?;
    let mut entries = Vec::with_capacity(listed.len());
    let mut subdirs: Vec<(usize, OwnedFd, Vec<u8>)> = Vec::new();
    for l in listed {
        let base = rel.len();
        if base > 0 {
            rel.push(b'/');
        }
        rel.extend_from_slice(&l.name);
        let res = scan_entry(
            dir,
            l.name,
            rel,
            label,
            src,
            filter,
            warn,
            &mut entries,
            &mut subdirs,
        );
        rel.truncate(base);
        res?;
    }
    // Subdirectories in parallel; each owns its handle until it is read.
    let results: Vec<Result<(usize, Vec<Entry>)>> = subdirs
        .into_par_iter()
        .map(|(i, fd, mut sub_rel)| {
            Ok((
                i,
                scan_dir(fd.as_fd(), &mut sub_rel, label, src, filter, warn)?,
            ))
        })
        .collect();
    for r in results {
        let (i, children) = r?;
        if let Node::Dir(d) = &mut entries[i].node {
            d.entries = children;
        }
    }
    entries.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

#[allow(clippy::too_many_arguments)]
fn scan_entry(
    dir: BorrowedFd<'_>,
    name: Vec<u8>,
    rel: &[u8],
    label: &str,
    src: u16,
    filter: &Filter,
    warn: &Warnings,
    entries: &mut Vec<Entry>,
    subdirs: &mut Vec<(usize, OwnedFd, Vec<u8>)>,
) -> Result<()> {
    let st = match sys::stat_at(dir, &name) {
        Ok(st) => st,
        // Vanished between listing and stat: it is simply not part of the tree.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("cannot stat {}", display(label, rel))),
    };
    let kind = sys::kind_of(&st);
    if !filter.is_empty() && filter.excludes(rel, kind == StatKind::Dir) {
        return Ok(());
    }
    let name: Name = name.into();
    let node = match kind {
        StatKind::File => Node::File(File {
            src,
            dev: st.st_dev,
            ino: st.st_ino,
            nlink: st.st_nlink as u32,
            ctime: sys::ctime_of(&st),
            ..Default::default()
        }),
        StatKind::Symlink => {
            let target = sys::readlink_at(dir, &name)
                .with_context(|| format!("cannot read symlink {}", display(label, rel)))?;
            let meta = Meta {
                size: target.len() as u64,
                ..meta_of(&st, 0)
            };
            entries.push(Entry {
                name,
                meta,
                node: Node::Symlink(target.into()),
            });
            return Ok(());
        }
        StatKind::Dir => {
            let fd = sys::open_dir_at(dir, &name)
                .with_context(|| format!("cannot open directory {}", display(label, rel)))?;
            subdirs.push((entries.len(), fd, rel.to_vec()));
            Node::Dir(Dir {
                srcs: 1 << src,
                entries: Vec::new(),
            })
        }
        StatKind::Other(what) => {
            warn.push(format!("skipping {what} {}", display(label, rel)));
            return Ok(());
        }
    };
    let size = if kind == StatKind::File {
        st.st_size as u64
    } else {
        0
    };
    entries.push(Entry {
        name,
        meta: meta_of(&st, size),
        node,
    });
    Ok(())
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

/// Fill in `hash` for every file `want` selects, reading through the
/// directory handles `roots` (one per source index; the live tree has one).
pub fn hash(
    tree: &mut Tree,
    roots: &[Option<OwnedFd>],
    label: &[String],
    want: &(dyn Fn(&Entry) -> bool + Sync),
) -> Result<()> {
    let fds: Vec<Option<BorrowedFd<'_>>> = roots
        .iter()
        .map(|r| r.as_ref().map(|f| f.as_fd()))
        .collect();
    hash_dir(&mut tree.entries, &fds, &[], label, want)
}

fn hash_dir(
    entries: &mut [Entry],
    dirs: &[Option<BorrowedFd<'_>>],
    rel: &[u8],
    label: &[String],
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
            let mut subs: Vec<Option<OwnedFd>> = Vec::with_capacity(dirs.len());
            for (i, parent) in dirs.iter().enumerate() {
                subs.push(match parent {
                    Some(p) if d.srcs & (1 << i) != 0 => {
                        Some(sys::open_dir_at(*p, &e.name).with_context(|| {
                            format!("cannot open directory {}", display(&label[i], &path))
                        })?)
                    }
                    _ => None,
                });
            }
            let fds: Vec<Option<BorrowedFd<'_>>> =
                subs.iter().map(|s| s.as_ref().map(|f| f.as_fd())).collect();
            return hash_dir(&mut d.entries, &fds, &path, label, want);
        }
        if !want(e) {
            return Ok(());
        }
        let meta_size = e.meta.size;
        if let Node::File(f) = &mut e.node {
            let i = f.src as usize;
            let dir = dirs[i].expect("a file's source directory is open");
            let fd = sys::open_read_at(dir, &e.name)
                .with_context(|| format!("cannot read {}", display(&label[i], &path)))?;
            let (h, n) = hash_fd(fd.as_fd())
                .with_context(|| format!("cannot read {}", display(&label[i], &path)))?;
            if n != meta_size {
                anyhow::bail!(
                    "{} changed while being read (size {} now {})",
                    display(&label[i], &path),
                    meta_size,
                    n
                );
            }
            f.hash = Some(h);
        }
        Ok(())
    })
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
}
