//! Sources: where a sync reads the tree it mirrors. A source yields its
//! entries (`scan`) and opens the bytes of each file; plan, stage and commit
//! see only the `Tree` and these calls, never what kind of source it is.
//!
//! `open` is the one place that decides the kind of a SOURCE argument. Only
//! the directory kind exists (`dir.rs`). A kind that is not a directory (an
//! archive, an image: issue 12) is one more file here implementing `Source`
//! and one more arm in `open`: its `scan` tags each file with the source's
//! index, skips special entries through `Reporter::skipped` as a directory
//! does, and its `open_file` hands out a descriptor the stage reads (a pipe,
//! a spooled file); its `root` is `None`. A source never writes.

mod dir;

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::error;
use crate::report::Reporter;
use crate::scan::Filter;
use crate::sys::{self, DirFd};
use crate::tree::{Entry, Tree};

pub use dir::Dir;

/// One SOURCE: a tree of entries and the bytes of its files.
pub trait Source: Send + Sync {
    /// The SOURCE as the user wrote it: it names the source's entries in
    /// messages (`label/path`).
    fn label(&self) -> &str;

    /// Where the source lives on this host, resolved (symlinks and `..`
    /// gone): DEST must not be inside it. `None` for a kind that is not a
    /// path on this host.
    fn path(&self) -> Option<&Path>;

    /// What a generation's manifest records as this source.
    fn identity(&self) -> String;

    /// Every entry, each directory's entries sorted by name, every file and
    /// directory tagged with `src` (this source's index in the overlay).
    /// Entries the filter excludes are left out; FIFOs, sockets and devices
    /// are left out and reported through `reporter.skipped`.
    fn scan(&self, src: u16, filter: &Filter, reporter: &dyn Reporter) -> Result<Tree>;

    /// The directory holding the source's files, where it is one: the stage
    /// and the hasher then walk it by handle (one `openat` per directory and
    /// per file, no path resolved twice) and copy with reflink or
    /// copy_file_range. `None`: every file is opened with `open_file`.
    fn root(&self) -> Option<&DirFd>;

    /// The bytes of the file at `path` (relative to the source's root), for
    /// a kind without `root`; a directory source opens it beneath its root.
    fn open_file(&self, path: &[u8]) -> io::Result<OwnedFd>;

    /// Whether `root` can be read a directory at a time with
    /// `Dir::list` and give, directory by directory, what `scan` gives (a
    /// directory source): then a no-op is compared and a first sync staged
    /// without a whole `Tree` (`scan::compare_live`, `stage::stream`). A
    /// kind whose `root` is a spool of its own, or that has none, keeps the
    /// default: its tree is scanned whole.
    fn lists_by_directory(&self) -> bool {
        false
    }

    /// Whether `fd` still holds the file the scan saw as `seen`: checked
    /// when it is opened and after it is read, so that a file replaced or
    /// written to meanwhile is never staged. Content a stream delivers and
    /// checks against its digest does not change: such kinds keep the default.
    fn unchanged(&self, fd: BorrowedFd<'_>, seen: &Entry) -> io::Result<bool> {
        let _ = (fd, seen);
        Ok(true)
    }
}

/// The source a SOURCE argument names: the one place where its kind is
/// decided. Anything it cannot read is a usage error (exit 2), before
/// anything is written.
pub fn open(arg: &Path) -> Result<Box<dyn Source>> {
    let shown = arg.display().to_string();
    let st = sys::stat_path(arg).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            error::usage(format!("{shown}: source does not exist"))
        } else {
            error::usage(format!("{shown}: cannot read source: {e}"))
        }
    })?;
    match sys::kind_of(&st) {
        sys::StatKind::Dir => Ok(Box::new(Dir::open(arg, shown)?)),
        _ => Err(error::usage(format!("{shown}: source is not a directory"))),
    }
}

/// `open` for every SOURCE, in order.
pub fn open_all(args: &[PathBuf]) -> Result<Vec<Box<dyn Source>>> {
    args.iter().map(|a| open(a)).collect()
}

/// Each source's handle on the directory `name` (at `path` from the root)
/// below its handle on the parent: for the sources whose entries the
/// directory holds (`srcs`, a bit per source index), `None` for the others
/// and for sources without a root. How stage and hash walk every source at
/// once, one `openat` per directory and source.
pub fn open_dirs(
    sources: &[&dyn Source],
    parents: &[Option<&DirFd>],
    srcs: u64,
    name: &[u8],
    path: &[u8],
) -> Result<Vec<Option<DirFd>>> {
    let mut subs = Vec::with_capacity(parents.len());
    for (i, parent) in parents.iter().enumerate() {
        subs.push(match parent {
            Some(p) if srcs & (1 << i) != 0 => Some(p.open_dir(name).with_context(|| {
                format!(
                    "cannot open directory {}",
                    crate::scan::display(sources[i].label(), path)
                )
            })?),
            _ => None,
        });
    }
    Ok(subs)
}

/// The file `name` (at `path` from the root) of `source`: by one name below
/// the directory handle `dir` where the walk holds one, else `open_file`.
pub fn open_in(
    source: &dyn Source,
    dir: Option<&DirFd>,
    name: &[u8],
    path: &[u8],
) -> io::Result<OwnedFd> {
    match dir {
        Some(d) => d.open_read(name),
        None => source.open_file(path),
    }
}

/// Borrow each handle of `dirs` (as `open_dirs` made them).
pub fn borrow(dirs: &[Option<DirFd>]) -> Vec<Option<&DirFd>> {
    dirs.iter().map(Option::as_ref).collect()
}
