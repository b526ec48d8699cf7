//! Sources: where a sync reads the tree it mirrors. A source yields its
//! entries (`scan`) and opens the bytes of each file; plan, stage and commit
//! see only the `Tree` and these calls, never what kind of source it is.
//!
//! `open` is the one place that decides the kind of a SOURCE argument: a
//! directory (`dir.rs`), a FILE holding an archive (`archive.rs`, told by
//! its content; `tar.rs` reads it), an image (`oci.rs`: in a registry, a
//! layout directory, or an image archive FILE, `oci_archive.rs`), a URL. A kind whose content arrives as a stream
//! (an archive, an image's layers) implements `spool::Stream`: before the
//! scan, `spool_all` materialises it into a private spool inside this
//! writer's staging directory (`spool.rs`), which is then scanned like a
//! directory, with the content hashes the stream gave, and whose files the
//! stage moves into the staged tree rather than copies (`owns_root`). A
//! source never writes, but for a stream into its spool.

mod archive;
pub(crate) mod chunked;
mod decode;
mod dir;
mod http;
pub(crate) mod oci;
mod oci_archive;
pub(crate) mod oci_artifact;
pub(crate) mod oci_fetch;
pub(crate) mod oci_image;
pub(crate) mod oci_ref;
pub mod spool;
pub(crate) mod store;
pub mod tar;

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::config::Remote;
use crate::error;
use crate::filter::Filter;
use crate::report::Reporter;
use crate::sys::{self, DirFd};
use crate::tree::{Entry, Meta, Tree};

pub use archive::Archive;
pub use decode::decoded;
pub use dir::Dir;
// The layer API the remote kinds (an image's layers, a URL's body) fill a spool with.
#[allow(unused_imports)]
pub use spool::{Base, LayerStats, Scratch, Spool, Spooled, Stream, Streamed};

/// What a source may start from (`Source::resume`, `Source::lend`): the
/// live generation's manifest, indexed by directory and checked against
/// its digest, and its root; read only when asked.
pub type LiveBase<'a> = dyn Fn() -> Option<(crate::index::Index, Option<DirFd>)> + 'a;

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

    /// The entries of the directory at `rel`, `fd` this source's handle on
    /// it, as `scan` gives them (each directory without its children), for
    /// a kind that `lists_by_directory`.
    fn list(
        &self,
        fd: &DirFd,
        rel: &[u8],
        src: u16,
        filter: &Filter,
        reporter: &dyn Reporter,
    ) -> Result<Vec<Entry>> {
        Dir::list(fd, rel, self.label(), src, filter, reporter)
    }

    /// The metadata of the tree's root, as `scan` gives it (its extended
    /// attributes where `filter` says), for a kind that `lists_by_directory`.
    fn root_meta(&self, filter: &Filter) -> Result<Meta> {
        let root = self
            .root()
            .with_context(|| format!("{}: has no directory to list", self.label()))?;
        Dir::meta_of_root(root, self.label(), filter)
    }

    /// Whether `fd` still holds the file the scan saw as `seen`: checked
    /// when it is opened and after it is read, so that a file replaced or
    /// written to meanwhile is never staged. Content a stream delivers and
    /// checks against its digest does not change: such kinds keep the default.
    fn unchanged(&self, fd: BorrowedFd<'_>, seen: &Entry) -> io::Result<bool> {
        let _ = (fd, seen);
        Ok(true)
    }

    /// Whether the content arrives as a stream that must be spooled
    /// (`spool`) before `scan`: the sync then makes its staging directory
    /// first (`spool_all`).
    fn streamed(&self) -> bool {
        false
    }

    /// Read the stream into a new private spool `spool/<name>` inside
    /// `staging` (this writer's staging directory: `Spool::new`), once,
    /// before `scan`.
    fn spool(&self, staging: &DirFd, name: &[u8], reporter: &dyn Reporter) -> Result<()> {
        let _ = (staging, name, reporter);
        Ok(())
    }

    /// Files under `root()` are private to this sync (a spool) and may be
    /// moved into the staged tree, not copied.
    fn owns_root(&self) -> bool {
        false
    }

    /// `--semver`: the tag chosen and the image manifest digest it names,
    /// for a source that chooses one (resolving it: the tag listing and one
    /// manifest request, once per sync). `None` for any other.
    fn chosen(&self) -> Result<Option<(String, String)>> {
        Ok(None)
    }

    /// `--label auto`: the version the content names (an image's
    /// `org.opencontainers.image.version`, a bundle's `.manifest`
    /// `revision`), found before anything is fetched but documents.
    /// `None` where it names none, or where only the spool could tell.
    fn version(&self) -> Result<Option<String>> {
        Ok(None)
    }

    /// Whether `version` can tell only once the source is spooled (an
    /// archive's or a URL's bundle `.manifest`): before that it says `None`.
    fn version_in_spool(&self) -> bool {
        false
    }

    /// Whether the source still holds what `recorded` (the live
    /// generation's identity for it) names, found out without fetching it:
    /// a tag that resolves to the same image digest, a URL answering 304.
    /// Then the sync is up to date after that one request (unless the live
    /// tree drifted). A kind that cannot tell says no.
    fn unchanged_since(&self, recorded: &str) -> Result<bool> {
        let _ = recorded;
        Ok(false)
    }

    /// What the generation's manifest keeps (a `layers` line) so that a
    /// later sync can start from it (`resume`): an image's layer digests,
    /// in order, and what shaped its tree. `shape` names the options that
    /// shaped the tree besides the source (owners, `--chmod`). After the
    /// spool; `None` for kinds that cannot resume.
    fn record(&self, shape: &str) -> Option<String> {
        let _ = shape;
        None
    }

    /// Before the spool, after `unchanged_since` said no: whether the
    /// source can start from the live generation, whose manifest kept
    /// `record` for it, under the same `shape` (an image whose layers
    /// begin with the recorded ones: only the rest are fetched). `base`
    /// reads the live tree as its manifest records it. Then the spool
    /// lists the live files instead of fetching them, and after the plan
    /// `intact` must hold, else the sync starts again without this.
    fn resume(&self, record: &str, shape: &str, base: &LiveBase<'_>) -> Result<bool> {
        let _ = (record, shape, base);
        Ok(false)
    }

    /// Before the spool, where the sync did not `resume`: the live
    /// generation's files, by content, for a source that can take a file's
    /// bytes from there instead of fetching them (a zstd:chunked layer).
    /// `base` reads the live tree as its manifest records it, and its root.
    /// With `borrow`, files whose path, content and metadata are the live
    /// ones may be listed from there instead of spooled (then `intact`
    /// must hold after the plan, as for `resume`).
    fn lend(&self, base: &LiveBase<'_>, borrow: bool) -> Result<()> {
        let _ = (base, borrow);
        Ok(())
    }

    /// After the plan of a resumed sync: whether the spool held everything
    /// the layers gave and every file taken from the live generation is
    /// reused from it (`Spooled::intact`). True for any other source.
    fn intact(&self, tree: &Tree) -> bool {
        let _ = tree;
        true
    }

    /// Once spooled, before any plan: whether the spool holds everything
    /// the layers gave (a seeded spool: no new layer needed a borrowed
    /// file's bytes it could not take; `why_not_intact` says why). True
    /// for any other source.
    fn holds_all(&self) -> bool {
        true
    }

    /// Where `intact` said no because of what a new layer holds (not
    /// drift): one line saying why every layer is fetched after all.
    fn why_not_intact(&self) -> Option<String> {
        None
    }

    /// Under `--verify-key`, an image's: the fingerprint of the key its
    /// cosign signature was verified with when its digest was resolved.
    fn verified_by(&self) -> Option<String> {
        None
    }
}

/// The source a SOURCE argument names: the one place where its kind is
/// decided. Anything it cannot read is a usage error (exit 2), before
/// anything is written.
pub fn open(arg: &Path, remote: &Remote) -> Result<Box<dyn Source>> {
    let shown = arg.display().to_string();
    // Kinds named by a prefix get their arms here, before anything is
    // looked up as a path (nothing is fetched yet: that is `spool`).
    if let Some(text) = arg.to_str() {
        if text.starts_with("oci://") {
            return Ok(Box::new(oci::Fetched::new(oci::open_registry(
                text, remote,
            )?)));
        }
        if text.starts_with("oci-layout:") {
            return Ok(Box::new(oci::Fetched::new(oci::open_layout(text, remote)?)));
        }
        if text.starts_with("oci-archive:") || text.starts_with("docker-archive:") {
            return Ok(Box::new(oci::Fetched::new(oci::open_archive(
                text, remote,
            )?)));
        }
        if text.starts_with("https://") || text.starts_with("http://") {
            return Ok(Box::new(oci::Fetched::new(http::open(text, remote)?)));
        }
    }
    let st = match sys::stat_path(arg) {
        Ok(st) => st,
        Err(e) => {
            // `FILE//PATH`: one subtree of an archive.
            if let Some((file, sub)) = split_subpath(arg) {
                return open_file(&file, shown, Some(sub));
            }
            return Err(if e.kind() == io::ErrorKind::NotFound {
                error::usage(format!("{shown}: source does not exist"))
            } else {
                error::usage(format!("{shown}: cannot read source: {e}"))
            });
        }
    };
    match sys::kind_of(&st) {
        sys::StatKind::Dir => Ok(Box::new(Dir::open(arg, shown)?)),
        sys::StatKind::File => open_file(arg, shown, None),
        _ => Err(error::usage(format!(
            "{shown}: source is not a directory or a recognisable archive"
        ))),
    }
}

/// A regular FILE: an archive, or exit 2. Its SHA-256 is its identity:
/// the same file again is up to date without being unpacked
/// (`Source::unchanged_since`). A FILE that is an image archive (`podman
/// save`, `docker save`) is exit 2 with a line naming the SOURCE form
/// that reads it, not unpacked as a tar of `blobs/`.
fn open_file(file: &Path, shown: String, sub: Option<Vec<u8>>) -> Result<Box<dyn Source>> {
    if let Some(hint) = oci_archive::image_hint(file, &shown) {
        return Err(error::usage(hint));
    }
    Ok(Box::new(oci::Fetched::new(Archive::open(
        file, shown, sub,
    )?)))
}

/// `FILE//PATH` split at the first `//` whose left side is a regular file;
/// PATH without leading or trailing `/` (`None` if it has a `..`: the
/// caller then reports the SOURCE as missing).
fn split_subpath(arg: &Path) -> Option<(std::path::PathBuf, Vec<u8>)> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = arg.as_os_str().as_bytes();
    let mut from = 0;
    while let Some(i) = bytes[from..].windows(2).position(|w| w == b"//") {
        let at = from + i;
        let file = Path::new(std::ffi::OsStr::from_bytes(&bytes[..at]));
        if at > 0 && sys::stat_path(file).is_ok_and(|st| sys::kind_of(&st) == sys::StatKind::File) {
            let sub: Vec<&[u8]> = bytes[at + 2..]
                .split(|&b| b == b'/')
                .filter(|c| !c.is_empty() && *c != b".")
                .collect();
            if sub.contains(&&b".."[..]) {
                return None;
            }
            return Some((file.to_path_buf(), sub.join(&b'/')));
        }
        from = at + 1;
    }
    None
}

/// `open` for every SOURCE, in order.
pub fn open_all(args: &[PathBuf], remote: &Remote) -> Result<Vec<Box<dyn Source>>> {
    args.iter().map(|a| open(a, remote)).collect()
}

/// Spool every streamed source, in parallel, each into `spool/<i>` inside
/// `staging` (this writer's staging directory, which removes them with
/// itself; or a `Scratch` directory for a dry run).
pub fn spool_all(sources: &[&dyn Source], staging: &DirFd, reporter: &dyn Reporter) -> Result<()> {
    use rayon::prelude::*;
    sources
        .par_iter()
        .enumerate()
        .filter(|(_, s)| s.streamed())
        .try_for_each(|(i, s)| s.spool(staging, i.to_string().as_bytes(), reporter))
}

/// The entries of the directory at `rel` as the sources give it, overlaid
/// (a later source's entry wins, directories merge): `dirs` holds each
/// source's handle on it, where that source provides it.
pub fn list_merged(
    sources: &[&dyn Source],
    dirs: &[Option<&DirFd>],
    rel: &[u8],
    filter: &Filter,
    reporter: &dyn Reporter,
) -> Result<Vec<Entry>> {
    overlaid(dirs, |i, fd| {
        sources[i].list(fd, rel, i as u16, filter, reporter)
    })
}

/// `list_merged` with names and kinds alone (`Dir::kinds`): no stat where
/// the listing tells the kind.
pub fn kinds_merged(
    sources: &[&dyn Source],
    dirs: &[Option<&DirFd>],
    rel: &[u8],
    filter: &Filter,
) -> Result<Vec<Entry>> {
    overlaid(dirs, |i, fd| {
        Dir::kinds(fd, rel, sources[i].label(), i as u16, filter)
    })
}

/// What `list` gives for each source's handle in `dirs`, overlaid in order.
fn overlaid(
    dirs: &[Option<&DirFd>],
    mut list: impl FnMut(usize, &DirFd) -> Result<Vec<Entry>>,
) -> Result<Vec<Entry>> {
    let mut merged: Vec<Entry> = Vec::new();
    for (i, fd) in dirs.iter().enumerate() {
        let Some(fd) = fd else { continue };
        let listed = list(i, fd)?;
        if merged.is_empty() {
            merged = listed;
        } else {
            crate::tree::merge_entries(&mut merged, listed);
        }
    }
    Ok(merged)
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
                    crate::escape::display(sources[i].label(), path)
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

/// The longest `.manifest` read for its revision: OPA bundles' are a few
/// hundred bytes.
const MAX_BUNDLE_MANIFEST: u64 = 1 << 20;

/// An OPA bundle's `/.manifest` `revision` (`--label auto`), below `root`:
/// `None` without a `.manifest` or without a non-empty string `revision`;
/// an error for a `.manifest` that is not JSON or too large.
pub fn bundle_revision(root: &DirFd, label: &str) -> Result<Option<String>> {
    use std::io::Read;
    let fd = match root.open_read(b".manifest") {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(anyhow::anyhow!("{label}/.manifest: cannot open: {e}")),
    };
    let mut text = Vec::new();
    sys::reader(fd)
        .take(MAX_BUNDLE_MANIFEST + 1)
        .read_to_end(&mut text)
        .with_context(|| format!("{label}/.manifest: cannot read"))?;
    if text.len() as u64 > MAX_BUNDLE_MANIFEST {
        anyhow::bail!("{label}/.manifest: larger than {MAX_BUNDLE_MANIFEST} bytes");
    }
    revision_of(&text).map_err(|e| anyhow::anyhow!("{label}/.manifest: {e}"))
}

/// The `revision` of a bundle's `.manifest` text, if it names one.
pub fn revision_of(text: &[u8]) -> Result<Option<String>, String> {
    let v: serde_json::Value =
        serde_json::from_slice(text).map_err(|e| format!("not JSON: {e}"))?;
    let Some(obj) = v.as_object() else {
        return Err("not a JSON object".into());
    };
    Ok(obj
        .get("revision")
        .and_then(|r| r.as_str())
        .map(str::trim)
        .filter(|r| !r.is_empty() && r.len() <= 256 && !r.chars().any(char::is_control))
        .map(str::to_string))
}
