//! Scan: read the sources into one `Tree` (each source yields its entries:
//! `source::Source::scan`), overlaid in order; which paths a scan leaves
//! out (`Filter`); and file contents hashed on demand (`--checksum`,
//! `verify`), read through each entry's source.
//!
//! Scanning never writes. Special files are reported through
//! `Reporter::skipped` and left out.

use std::os::fd::{AsFd, BorrowedFd};

use anyhow::{Context, Result};
use rayon::prelude::*;
use sha2::{Digest, Sha256};

use crate::report::Reporter;
use crate::source::{self, Source};
use crate::sys::{self, DirFd};
use crate::tree::{Entry, Meta, Node, Tree};

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

/// Scan every source and overlay them in order: a later source wins a path
/// two provide; each entry keeps the index of the source it came from, and
/// hardlinks inside a source become groups.
pub fn run(sources: &[&dyn Source], filter: &Filter, reporter: &dyn Reporter) -> Result<Tree> {
    let mut tree = Tree::default();
    for (i, s) in sources.iter().enumerate() {
        let t = s.scan(i as u16, filter, reporter)?;
        if i == 0 {
            tree = t;
        } else {
            tree.overlay(t);
        }
    }
    tree.assign_groups();
    Ok(tree)
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
            let shown = || display(sources[i].label(), &path);
            let fd = source::open_in(sources[i], dirs[i], &e.name, &path)
                .with_context(|| format!("cannot read {}", shown()))?;
            let (h, n) = hash_fd(fd.as_fd()).with_context(|| format!("cannot read {}", shown()))?;
            if n != meta_size {
                anyhow::bail!(
                    "{} changed while being read (size {} now {})",
                    shown(),
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
