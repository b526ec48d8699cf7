//! The one parallel directory recursion: the sources (each a handle per
//! directory, where it provides that directory) walked a directory at a
//! time, in parallel across directories on rayon's pool, with a visitor
//! that decides what each directory means. The compare that finds a sync
//! up to date, the count of what `--max-delete` would delete and the
//! streamed stage are visitors of this walk; none recurses on its own.
//!
//! The walk owns what every such recursion needs the same way: the fan-out
//! (a directory's subdirectories walked in parallel, each holding only its
//! own listing while its children are walked, so memory follows the depth
//! and the pool's threads, never the tree), each source's handle on a
//! subdirectory opened below its handle on the parent (one `openat` per
//! directory and source, no path resolved again), a stop a visitor may ask
//! for (a compare that found a difference), and the signal checks.

use anyhow::Result;
use rayon::prelude::*;

use crate::error::check_signal;
use crate::source::{self, Source};
use crate::sys::DirFd;
use crate::tree::{join, Entry, Name, Node};

/// A subdirectory to walk: its name, which sources hold it (a bit per
/// source index, as `DirNode::srcs`), and what the visitor keeps of it
/// while it is walked.
pub struct Sub<N> {
    pub name: Name,
    pub srcs: u64,
    pub keep: N,
}

/// The subdirectories among one directory's `entries`, to walk with
/// nothing kept of them but their names and sources.
pub fn subdirs(entries: Vec<Entry>) -> Vec<Sub<()>> {
    entries
        .into_iter()
        .filter_map(|e| match e.node {
            Node::Dir(d) => Some(Sub {
                name: e.name,
                srcs: d.srcs,
                keep: (),
            }),
            _ => None,
        })
        .collect()
}

/// The subdirectory `name` of `dir` (at `path` below the root `label`
/// names), opened for a visitor's `enter`: the one message a failure gives.
pub fn open_sub(dir: &DirFd, name: &[u8], label: &str, path: &[u8]) -> Result<DirFd> {
    use anyhow::Context;
    dir.open_dir(name).with_context(|| {
        format!(
            "cannot open directory {}",
            crate::escape::display(label, path)
        )
    })
}

/// What a visit of one directory gives: its own number and the
/// subdirectories to walk.
pub type Visited<K> = (u64, Vec<Sub<K>>);

/// What the walk asks of a visitor, a directory at a time.
pub trait Visit: Sync {
    /// What the visitor holds open for one directory besides the sources'
    /// handles (the live generation's handle on it, the staged one).
    type Dir: Send + Sync;
    /// What it keeps of a subdirectory between `visit` and `leave` (its
    /// metadata, to set once its entries are in).
    type Keep: Send;

    /// The directory at `rel`: `srcs` holds each source's handle on it,
    /// `dir` the visitor's own. Returns a number of its own (summed over
    /// the walk, and handed to `leave`) and the subdirectories to walk.
    fn visit(
        &self,
        srcs: &[Option<&DirFd>],
        dir: &Self::Dir,
        rel: &[u8],
    ) -> Result<Visited<Self::Keep>>;

    /// The visitor's `Dir` for the subdirectory `name` of `parent` (at
    /// `path`), on the thread that walks it.
    fn enter(
        &self,
        parent: &Self::Dir,
        keep: &Self::Keep,
        name: &[u8],
        path: &[u8],
    ) -> Result<Self::Dir>;

    /// The subdirectory at `path` is walked: `own` is what its `visit` returned.
    fn leave(&self, dir: Self::Dir, keep: Self::Keep, path: &[u8], own: u64) -> Result<()> {
        let _ = (dir, keep, path, own);
        Ok(())
    }

    /// Whether the walk may stop here (a difference found): directories
    /// not yet visited are left, and count nothing.
    fn stopped(&self) -> bool {
        false
    }
}

/// Walk `sources` from their roots (`roots`: each one's handle on its
/// root, where it has one), the visitor's root `dir` beside them. Returns
/// the sum of every directory's own number.
pub fn run<V: Visit>(
    v: &V,
    sources: &[&dyn Source],
    roots: &[Option<&DirFd>],
    dir: &V::Dir,
) -> Result<u64> {
    Ok(walk(v, sources, roots, dir, &[])?.1)
}

/// The directory at `rel` and everything below it: (its own number, the
/// sum over all of them).
fn walk<V: Visit>(
    v: &V,
    sources: &[&dyn Source],
    srcs: &[Option<&DirFd>],
    dir: &V::Dir,
    rel: &[u8],
) -> Result<(u64, u64)> {
    check_signal()?;
    if v.stopped() {
        return Ok((0, 0));
    }
    let (own, subs) = v.visit(srcs, dir, rel)?;
    let below = subs
        .into_par_iter()
        .map(|sub| -> Result<u64> {
            check_signal()?;
            if v.stopped() {
                return Ok(0);
            }
            let path = join(rel, &sub.name);
            let handles = source::open_dirs(sources, srcs, sub.srcs, &sub.name, &path)?;
            let d = v.enter(dir, &sub.keep, &sub.name, &path)?;
            let (own, total) = walk(v, sources, &source::borrow(&handles), &d, &path)?;
            drop(handles);
            v.leave(d, sub.keep, &path, own)?;
            Ok(total)
        })
        .try_reduce(|| 0, |a, b| Ok(a + b))?;
    Ok((own, own + below))
}
