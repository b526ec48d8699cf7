//! The spool: a stream (an archive, an image's layers) materialised into a
//! private directory inside this writer's staging directory
//! (`stage/<me>/spool/<i>`), so that it is read once, in its own order,
//! and then scanned, planned and staged like a directory. The staging
//! guard (`staging::Stage`) removes it with everything else, on success,
//! error or signal; a killed writer's is collected with its staging.
//!
//! Every entry is made with `DirFd` one-component calls: no path is
//! resolved and no symlink followed. A name with a `..` component, a name
//! reached through a symlink (or through a file), a hardlink whose target
//! is not an earlier regular file of the tree: refused, and nothing is
//! published. A leading `/` is stripped. Devices, FIFOs and sockets are
//! skipped through `Reporter::skipped`, as a directory's are.
//!
//! The spool holds content only. Files are made 0600 and stay so; their
//! mode, owner, mtime and SHA-256 (computed as they stream, no second read)
//! are kept by inode, directories' metadata by path, both on disk beside
//! the spool (`records.rs`: nothing held per entry), and the scan of
//! the spool (`Spooled`) puts them on its tree. So a file of mode 0 or a
//! directory of mode 0500 can still be written, read and moved, and a
//! directory's mtime is the archive's, not the time it was filled.
//!
//! A spool may also start from the live generation instead of the lower
//! layers it was made from (`Spool::seed`, an image update that only adds
//! layers on top): its directories and symlinks are made again, its files
//! are only listed (`Borrowed`), never linked or copied into the spool.
//! Later layers replace, white out or make opaque those entries as they
//! would the lower layers' files, and the scan puts the files still listed
//! on the tree with the metadata and hashes the manifest recorded, marked
//! (`BORROWED_DEV`) so that `Spooled::intact` can tell whether the plan
//! reuses every one of them from the live generation. Nothing in the spool
//! is a link to a live inode: a listed file that is not reused after all
//! has nothing to move, and the sync fails rather than stage a wrong file.
//! A later layer that hardlinks to a listed file gets a copy of it read
//! from the live generation and checked against the manifest's hash
//! (`materialise`), with the rest of its hardlink group linked to it.
//!
//! `Stream` is what a kind that is read as a stream implements (`archive.rs`
//! here; remote kinds too): `Streamed` turns it into a `Source`.
//!
//! This file applies tar streams to the spool; `seed.rs` starts a spool
//! from the live generation; `spooled.rs` is the filled spool as a source
//! (`Spooled`, `Streamed`); `records.rs` keeps each file's metadata and
//! hash, and each directory's metadata, on disk beside the spool.

use std::collections::{HashMap, HashSet};
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd};

use anyhow::{anyhow, bail, Context, Result};
use sha2::{Digest, Sha256};

use crate::error::check_signal;
use crate::escape::c_style;
use crate::report::Reporter;
use crate::sys::{self, DirFd, StatKind};
use crate::tree::{Entry, Meta, Name, Time};
use crate::xattr::Set;

use super::tar::{self, Kind};
use super::Source;

mod records;
mod seed;
mod spooled;

use records::{DirMetas, FileMeta, Metas};
pub use seed::{Base, BORROWED_DEV};
use seed::{Borrowed, Taken};
pub use spooled::{Spooled, Stream, Streamed};

/// What one `apply` read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerStats {
    /// Entries applied (files, directories, links), whiteouts not counted.
    pub entries: u64,
    pub files: u64,
    /// Bytes of file content written.
    pub bytes: u64,
    /// Devices, FIFOs, sockets and unknown entry types left out.
    pub skipped: u64,
    /// Whiteouts and opaque markers applied.
    pub whiteouts: u64,
    /// Entries that carried extended attributes.
    pub xattrs: u64,
}

/// What the layer being applied made: its regular files by the number each
/// carries (`first` and above, but for a lower layer's file made a file of
/// the spool meanwhile, `Spool::taken`), the rest by path (directories,
/// symlinks, hardlinks, files listed from the live generation: few), but
/// for directories, told by their records.
struct Made {
    first: u64,
    /// The directory records' end when the layer began: its directories
    /// are those an entry named since (`DirMetas::named_since`).
    first_dir: u64,
    paths: HashSet<Vec<u8>>,
}

/// A private directory being filled from one or more tar streams.
pub struct Spool {
    root: DirFd,
    /// On disk, by the number each file carries as its mtime: every link
    /// of a hardlinked file shares it.
    files: Metas,
    /// On disk, by path from the spool's root (`""`: the root itself).
    dirs: DirMetas,
    /// The newest mtime seen: the root's, where no entry gives one.
    newest: Time,
    /// The directory the last entry went into (path, handle): entries of
    /// one directory come together, so most entries open nothing.
    cached: Option<(Vec<u8>, DirFd)>,
    /// Keep owners on symlinks (only root can give them away).
    owners: bool,
    buf: Vec<u8>,
    /// The staging directory holding the spool, and when it was last touched.
    staging: DirFd,
    last_beat: std::time::Instant,
    /// The live generation's files this spool started from (`seed`).
    borrowed: Option<Borrowed>,
    /// Entries read so far, over every layer (`--max-entries`).
    headers: u64,
    /// The first entry of this archive or layer with extended attributes,
    /// and the first attribute's name (for the warning).
    first_xattr: Option<(Vec<u8>, Vec<u8>)>,
    /// `apply_within`: the directory every entry must lie in.
    within: Option<Vec<u8>>,
    /// Files the next layer holds that the live generation has at the same
    /// path with the same content and metadata (`Spool::lend`): listed as
    /// borrowed when their entry comes, their content not written.
    lent: HashMap<Vec<u8>, Entry>,
    lent_count: u64,
    /// Numbers of lower layers' files copied in from the live generation
    /// (`materialise`).
    taken: HashSet<u64>,
}

/// `a/b/c` → (`a/b`, `c`); `c` → (``, `c`).
fn split(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|&b| b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&[], path),
    }
}

/// The parts of an entry name: a leading `/` stripped, empty and `.`
/// components dropped; a `..` component (or a NUL) refused.
pub fn components(path: &[u8]) -> Result<Vec<&[u8]>> {
    let mut out = Vec::new();
    for c in path.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => bail!(
                "entry {} has a \"..\" component (refused: it would leave the tree)",
                c_style(path)
            ),
            c if c.contains(&0) => bail!("entry {} has a NUL in its name", c_style(path)),
            c => out.push(c),
        }
    }
    Ok(out)
}

fn join(parts: &[&[u8]]) -> Vec<u8> {
    parts.join(&b'/')
}

/// `--max-entries`, set once a round by `app` (the spool is made deep in a
/// source's `fill`, which knows nothing of the configuration).
static MAX_ENTRIES: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(crate::config::DEFAULT_MAX_ENTRIES);

/// `--max-entries`, as `limit_entries` set it.
pub fn max_entries() -> u64 {
    MAX_ENTRIES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Refuse a source of more than `n` entries (`--max-entries`).
pub fn limit_entries(n: u64) {
    MAX_ENTRIES.store(n, std::sync::atomic::Ordering::Relaxed);
}

impl Spool {
    /// Make the spool `spool/<name>` (private, 0700) inside `staging`:
    /// this writer's staging directory, on the volume's filesystem, whose
    /// mtime the spool refreshes every `staging::HEARTBEAT` while it reads
    /// (a long download must not look like a dead writer's staging).
    pub fn new(staging: &DirFd, name: &[u8]) -> Result<Spool> {
        let at = staging
            .ensure_dir(b"spool", 0o700)
            .context("cannot create the spool in the staging directory")?;
        at.mkdir(name, 0o700)
            .with_context(|| format!("cannot create the spool {}", c_style(name)))?;
        let root = at
            .open_dir(name)
            .with_context(|| format!("cannot open the spool {}", c_style(name)))?;
        let files = Metas::new(&at, name)?;
        let dirs = DirMetas::new(&at, name)?;
        Ok(Spool {
            root,
            files,
            dirs,
            newest: Time::default(),
            cached: None,
            owners: sys::euid() == 0,
            buf: Vec::new(),
            staging: staging.try_clone()?,
            last_beat: std::time::Instant::now(),
            borrowed: None,
            headers: 0,
            first_xattr: None,
            within: None,
            lent: HashMap::new(),
            lent_count: 0,
            taken: HashSet::new(),
        })
    }

    /// Touch the staging directory if `HEARTBEAT` has passed.
    fn beat(&mut self) {
        if self.last_beat.elapsed() >= crate::staging::HEARTBEAT {
            let _ = self.staging.touch_self();
            self.last_beat = std::time::Instant::now();
        }
    }

    /// Apply one tar stream (gzip, zstd or plain: told by its first bytes)
    /// onto the spool, in order: a later entry replaces an earlier one of
    /// the same name. `whiteouts`: OCI semantics (`.wh.NAME` removes NAME
    /// of earlier layers, `.wh..wh..opq` empties the directory of earlier
    /// layers' entries); false for archives, where a `.wh.` file is an
    /// ordinary file. `what` names the stream in errors. The stream is read
    /// to its end (a digest-checking reader below sees every byte), and
    /// any error leaves the spool unfit for use: drop it.
    pub fn apply(
        &mut self,
        r: &mut dyn Read,
        whiteouts: bool,
        what: &str,
        reporter: &dyn Reporter,
    ) -> Result<LayerStats> {
        let res = self.apply_stream(r, whiteouts, what, reporter);
        self.cached = None;
        let stats = res.with_context(|| what.to_string())?;
        if let Some((path, attr)) = self.first_xattr.take() {
            // A symlink has no descriptor to set them through: said once
            // per archive or layer, never silently.
            reporter.warn(&format!(
                "{what}: extended attributes on symlinks are not mirrored (first: {} on {})",
                c_style(&attr),
                c_style(&path)
            ));
        }
        Ok(stats)
    }

    /// `apply` (no whiteouts) of a tar whose entries must all lie below
    /// `dir` (a path of the spool, checked by the caller): an `oras push
    /// DIR` layer. An entry elsewhere is refused.
    pub fn apply_within(
        &mut self,
        r: &mut dyn Read,
        dir: &[u8],
        what: &str,
        reporter: &dyn Reporter,
    ) -> Result<LayerStats> {
        self.within = Some(dir.to_vec());
        let res = self.apply(r, false, what, reporter);
        self.within = None;
        res
    }

    fn apply_stream(
        &mut self,
        r: &mut dyn Read,
        whiteouts: bool,
        what: &str,
        reporter: &dyn Reporter,
    ) -> Result<LayerStats> {
        let mut stats = LayerStats::default();
        {
            let (format, decoded) = super::decode::decoded(&mut *r)?;
            let mut reader = tar::Reader::new(decoded);
            let mut layer = Made {
                first: self.files.next,
                first_dir: self.dirs.end(),
                paths: HashSet::new(),
            };
            let mut first = true;
            loop {
                check_signal()?;
                self.beat();
                let h = match reader.next_entry() {
                    Ok(Some(h)) => h,
                    Ok(None) => break,
                    // No valid first header: say what the stream is not.
                    Err(e) if first && tar::is_bad_header(&e) => match format {
                        super::decode::Format::Tar => bail!("not a tar archive ({e})"),
                        _ => bail!("corrupt, or no tar archive inside ({e})"),
                    },
                    Err(e) => return Err(e.into()),
                };
                self.headers += 1;
                let max = MAX_ENTRIES.load(std::sync::atomic::Ordering::Relaxed);
                if self.headers > max {
                    bail!(
                        "holds more than {max} entries (refused by --max-entries {max}; raise it if this is expected)"
                    );
                }
                self.entry(
                    &mut reader,
                    h,
                    whiteouts,
                    what,
                    &mut layer,
                    &mut stats,
                    reporter,
                )?;
                if first {
                    sys::pause_point("spooling");
                }
                first = false;
            }
            // The rest of the stream: a compressed stream's checksum comes
            // at its end, and a digest check below needs every byte.
            io::copy(&mut reader.into_inner(), &mut io::sink())?;
        }
        io::copy(r, &mut io::sink())?;
        Ok(stats)
    }

    /// Apply one entry.
    #[allow(clippy::too_many_arguments)]
    fn entry<R: Read>(
        &mut self,
        reader: &mut tar::Reader<R>,
        h: tar::Header,
        whiteouts: bool,
        what: &str,
        layer: &mut Made,
        stats: &mut LayerStats,
        reporter: &dyn Reporter,
    ) -> Result<()> {
        let parts = components(&h.path)?;
        if let Some(dir) = &self.within {
            let path = join(&parts);
            let inside =
                path.starts_with(dir) && (path.len() == dir.len() || path[dir.len()] == b'/');
            if !inside {
                bail!(
                    "entry {} is not below {} (the layer unpacks as that directory)",
                    c_style(&h.path),
                    c_style(dir)
                );
            }
        }
        let mtime = Time::from(h.mtime);
        if (mtime.s, mtime.ns) > (self.newest.s, self.newest.ns) {
            self.newest = mtime;
        }
        let Some((&name, parents)) = parts.split_last() else {
            // `./` or `/`: the root's own metadata.
            if h.kind == Kind::Dir {
                return self.record_dir(b"", &meta_of(&h), true);
            }
            bail!("entry {} has no name", c_style(&h.path));
        };
        let path = join(&parts);
        if whiteouts && name.starts_with(b".wh.") {
            // Below a directory no layer made, a whiteout hides nothing.
            let Some(dir) = self.existing(parents)? else {
                stats.whiteouts += 1;
                return Ok(());
            };
            let res = if name == b".wh..wh..opq" {
                self.opaque(&dir, &join(parents), layer)
            } else {
                let gone = &name[4..];
                let mut target = join(parents);
                if !target.is_empty() {
                    target.push(b'/');
                }
                target.extend_from_slice(gone);
                match self.made_here(layer, &dir, gone, &target) {
                    Ok(true) => Ok(()),
                    Ok(false) => self.remove(&dir, gone, &target),
                    Err(e) => Err(e),
                }
            };
            self.put_back(parents, dir);
            stats.whiteouts += 1;
            return res;
        }
        if let Kind::Other(kind) = h.kind {
            reporter.skipped(what, &path, kind);
            stats.skipped += 1;
            return Ok(());
        }
        if let Some(flag) = h.unknown_type {
            reporter.warn(&format!(
                "{what}: {}: tar entry of the unknown type {}, read as a regular file (as GNU tar and bsdtar do)",
                c_style(&path),
                c_style(&[b'\'', flag, b'\''])
            ));
        }
        if let Some((attr, _)) = h.xattrs.first() {
            stats.xattrs += 1;
            if matches!(h.kind, Kind::Symlink(_)) && self.first_xattr.is_none() {
                self.first_xattr = Some((path.clone(), attr.clone()));
            }
        }
        let dir = self.parent(parents, mtime)?;
        self.forget(&path);
        // A file this layer writes is told by its number; a listed one
        // (`lend`) has no file to carry it.
        let numbered = h.kind == Kind::File && !self.lent.contains_key(&path);
        let res = self.make(&dir, name, &path, &h, reader, stats);
        self.put_back(parents, dir);
        res?;
        // What this layer made, which its own whiteouts leave alone: an
        // archive has none, so keeps no list; a directory has its record.
        if whiteouts && !numbered && h.kind != Kind::Dir {
            layer.paths.insert(path);
        }
        stats.entries += 1;
        Ok(())
    }

    /// Make `name` in `dir` as the header says, replacing what was there.
    fn make<R: Read>(
        &mut self,
        dir: &DirFd,
        name: &[u8],
        path: &[u8],
        h: &tar::Header,
        reader: &mut tar::Reader<R>,
        stats: &mut LayerStats,
    ) -> Result<()> {
        let shown = || c_style(path);
        match &h.kind {
            Kind::File if self.lent.contains_key(path) => {
                let e = self.lent.remove(path).expect("present");
                match dir.stat(name) {
                    Ok(_) => self.remove(dir, name, path)?,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(e)
                            .with_context(|| format!("cannot stat {} in the spool", shown()))
                    }
                }
                let (parent, file) = split(path);
                let b = self.borrowed.as_mut().expect("lent files are borrowed");
                b.lent
                    .files
                    .entry(parent.to_vec())
                    .or_default()
                    .insert(Name::from(file), e);
                stats.files += 1;
            }
            Kind::File => {
                let fd = match dir.create_excl(name) {
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        self.remove(dir, name, path)?;
                        dir.create_excl(name)
                    }
                    other => other,
                }
                .with_context(|| format!("cannot create {} in the spool", shown()))?;
                let (hash, n) = self.write_data(reader, fd.as_fd())?;
                let meta = FileMeta {
                    hash,
                    mode: h.mode,
                    uid: h.uid,
                    gid: h.gid,
                    mtime: h.mtime.into(),
                    xattrs: Set::of(h.xattrs.clone()),
                };
                self.files
                    .put(fd.as_fd(), &meta)
                    .with_context(|| format!("cannot record {} in the spool", shown()))?;
                stats.files += 1;
                stats.bytes += n;
            }
            Kind::Dir => {
                match dir.mkdir(name, 0o700) {
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        let st = dir.stat(name)?;
                        if sys::kind_of(&st) != StatKind::Dir {
                            self.remove(dir, name, path)?;
                            dir.mkdir(name, 0o700)
                        } else {
                            Ok(())
                        }
                    }
                    other => other,
                }
                .with_context(|| format!("cannot create directory {} in the spool", shown()))?;
                self.record_dir(path, &meta_of(h), true)?;
            }
            Kind::Symlink(target) => {
                if target.is_empty() || target.contains(&0) {
                    bail!("symlink {} has an empty or invalid target", shown());
                }
                match dir.symlink(target, name) {
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                        self.remove(dir, name, path)?;
                        dir.symlink(target, name)
                    }
                    other => other,
                }
                .with_context(|| format!("cannot create symlink {} in the spool", shown()))?;
                let owner = self.owners.then_some((h.uid, h.gid));
                dir.set_symlink_meta(name, owner, h.mtime)
                    .with_context(|| format!("cannot set the times of symlink {}", shown()))?;
            }
            Kind::Hardlink(target) => self.hardlink(dir, name, path, target)?,
            Kind::Other(_) => unreachable!("skipped by the caller"),
        }
        Ok(())
    }

    /// A hard link to an earlier regular file of the tree, never through a
    /// symlink and never out of it.
    fn hardlink(&mut self, dir: &DirFd, name: &[u8], path: &[u8], target: &[u8]) -> Result<()> {
        let refused = |why: &str| {
            anyhow!(
                "hardlink '{}' to '{}' refused: {why}",
                c_style(path),
                c_style(target)
            )
        };
        let tparts = components(target).map_err(|_| refused("its target leaves the tree"))?;
        let Some((&tname, tdirs)) = tparts.split_last() else {
            return Err(refused("its target is not a file"));
        };
        if join(&tparts) == path {
            // A link to itself: the file an earlier entry made stays; with
            // no earlier file, GNU tar and bsdtar fail on it too.
            return match dir.stat(name) {
                Ok(st) if sys::kind_of(&st) == StatKind::File => Ok(()),
                _ => Err(refused("its target is not an earlier file of the archive")),
            };
        }
        let taken = match self.is_borrowed(&join(&tparts)) {
            true => self.materialise(&join(&tparts))?,
            false => Taken::Yes,
        };
        if taken != Taken::Yes {
            // Its bytes are in the live generation and could not be taken
            // from there (drift is repaired without a word, as any is):
            // the sync then applies every layer.
            if let Some(b) = &mut self.borrowed {
                b.incomplete = true;
                if taken == Taken::NoLive {
                    b.why.get_or_insert_with(|| {
                        format!(
                            "{} in a new layer is a hardlink to {} of a lower layer, whose \
                             bytes the live generation cannot give: fetching every layer",
                            c_style(path),
                            c_style(target)
                        )
                    });
                }
            }
            return Ok(());
        }
        let mut tdir = self.root.try_clone()?;
        for c in tdirs {
            tdir = tdir
                .open_dir(c)
                .map_err(|_| refused("its target is not an earlier file of the archive"))?;
        }
        match tdir.stat(tname) {
            Ok(st) if sys::kind_of(&st) == StatKind::File => {}
            _ => return Err(refused("its target is not an earlier file of the archive")),
        }
        match tdir.link(tname, dir, name) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                self.remove(dir, name, path)?;
                tdir.link(tname, dir, name)
            }
            other => other,
        }
        .with_context(|| format!("cannot link {} in the spool", c_style(path)))?;
        Ok(())
    }

    /// Stream the current entry's data into `fd`, hashing it.
    fn write_data<R: Read>(
        &mut self,
        reader: &mut tar::Reader<R>,
        fd: BorrowedFd<'_>,
    ) -> Result<([u8; 32], u64)> {
        if self.buf.len() < 64 << 10 {
            self.buf.resize(64 << 10, 0);
        }
        let mut h = Sha256::new();
        let mut n = 0u64;
        loop {
            let got = reader.read_data(&mut self.buf)?;
            if got == 0 {
                break;
            }
            h.update(&self.buf[..got]);
            sys::write_all(fd, &self.buf[..got]).context("cannot write into the spool")?;
            n += got as u64;
            if n & ((8 << 20) - 1) < got as u64 {
                check_signal()?;
                self.beat();
            }
        }
        Ok((h.finalize().into(), n))
    }

    /// Remove `name` (at `path`) from `dir`, whatever it is, and forget
    /// the metadata of what was below it.
    fn remove(&mut self, dir: &DirFd, name: &[u8], path: &[u8]) -> Result<()> {
        self.cached = None;
        dir.remove_tree(name)
            .with_context(|| format!("cannot remove {} from the spool", c_style(path)))?;
        if let Some(b) = &mut self.borrowed {
            b.forget_tree(path);
        }
        // The records of what was below stay, never read again: a
        // directory made at one of those paths gets a newer one.
        Ok(())
    }

    /// Record the metadata of the directory at `path`, just made (or
    /// named again by an entry).
    fn record_dir(&mut self, path: &[u8], meta: &Meta, named: bool) -> Result<()> {
        self.dirs
            .put(path, meta, named)
            .with_context(|| format!("cannot record {} in the spool", c_style(path)))
    }

    /// Whether the layer being applied made `name` in `dir` (at `path`):
    /// its whiteouts hide lower layers' entries only.
    fn made_here(&self, layer: &Made, dir: &DirFd, name: &[u8], path: &[u8]) -> Result<bool> {
        if layer.paths.contains(path) {
            return Ok(true);
        }
        Ok(match dir.stat(name) {
            Ok(st) if sys::kind_of(&st) == StatKind::File => {
                let at: Time = sys::mtime_of(&st).into();
                u64::try_from(at.s).is_ok_and(|n| {
                    at.ns == 0
                        && n >= layer.first
                        && n < self.files.next
                        && !self.taken.contains(&n)
                })
            }
            Ok(st) if sys::kind_of(&st) == StatKind::Dir => self
                .dirs
                .named_since(path, layer.first_dir)
                .with_context(|| format!("cannot read the record of {}", c_style(path)))?,
            _ => false,
        })
    }

    /// `.wh..wh..opq` in `dir` (at `path`): remove what earlier layers put there.
    fn opaque(&mut self, dir: &DirFd, path: &[u8], layer: &Made) -> Result<()> {
        let listed = dir
            .list()
            .with_context(|| format!("cannot list {} in the spool", c_style(path)))?;
        for l in listed {
            let p = crate::tree::join(path, &l.name);
            if !self.made_here(layer, dir, &l.name, &p)? {
                self.remove(dir, &l.name, &p)?;
            }
        }
        // Borrowed files here came from the layers below (this layer's
        // own entries were made on disk, and forgot theirs).
        if let Some(b) = &mut self.borrowed {
            b.empty(path);
        }
        Ok(())
    }

    /// The directory `parents` leads to, made where missing (with the
    /// metadata a directory the archive does not list gets: 0755, the
    /// entry's mtime). Never through a symlink or a file.
    fn parent(&mut self, parents: &[&[u8]], mtime: Time) -> Result<DirFd> {
        let path = join(parents);
        if let Some((p, _)) = &self.cached {
            if *p == path {
                return Ok(self.cached.take().expect("checked").1);
            }
        }
        let mut dir = self.root.try_clone()?;
        for (i, c) in parents.iter().enumerate() {
            dir = match dir.open_dir(c) {
                Ok(sub) => sub,
                Err(e)
                    if e.kind() == io::ErrorKind::NotFound
                        && self.is_borrowed(&join(&parents[..=i])) =>
                {
                    bail!(
                        "entry {}/… is reached through the non-directory {} (refused)",
                        c_style(&path),
                        c_style(&join(&parents[..=i]))
                    );
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    dir.mkdir(c, 0o700)?;
                    let default = Meta {
                        mode: 0o755,
                        mtime,
                        ..Meta::default()
                    };
                    self.record_dir(&join(&parents[..=i]), &default, false)?;
                    dir.open_dir(c)?
                }
                Err(e) if sys::is_not_dir(&e) => {
                    let what = match dir.stat(c).map(|st| sys::kind_of(&st)) {
                        Ok(StatKind::Symlink) => "the symlink",
                        _ => "the non-directory",
                    };
                    bail!(
                        "entry {}/… is reached through {what} {} (refused)",
                        c_style(&path),
                        c_style(&join(&parents[..=i]))
                    );
                }
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!(
                            "cannot open {} in the spool",
                            c_style(&join(&parents[..=i]))
                        )
                    })
                }
            };
        }
        Ok(dir)
    }

    /// Keep `dir` as the directory the next entry most likely goes into.
    /// (An entry only ever removes what is below its own directory, so
    /// `dir` is still there; `remove` forgets a cached handle that may not be.)
    /// The directory `parents` leads to if it exists (never through a
    /// symlink or a file: those are refused as in `parent`).
    fn existing(&mut self, parents: &[&[u8]]) -> Result<Option<DirFd>> {
        let mut dir = self.root.try_clone()?;
        for (i, c) in parents.iter().enumerate() {
            dir = match dir.open_dir(c) {
                Ok(sub) => sub,
                Err(e)
                    if e.kind() == io::ErrorKind::NotFound
                        && !self.is_borrowed(&join(&parents[..=i])) =>
                {
                    return Ok(None)
                }
                Err(_) => bail!(
                    "whiteout in {} is reached through something that is not a directory (refused)",
                    c_style(&join(&parents[..=i]))
                ),
            };
        }
        Ok(Some(dir))
    }

    fn put_back(&mut self, parents: &[&[u8]], dir: DirFd) {
        self.cached = Some((join(parents), dir));
    }

    /// The spool, filled, as what a scan reads: `subpath` (a `//PATH`)
    /// takes one directory of it as the root; absent, it is an error.
    pub fn finish(
        self,
        label: String,
        identity: String,
        subpath: Option<&[u8]>,
    ) -> Result<Spooled> {
        let incomplete = self.incomplete();
        let mut files = self.files;
        files
            .flush()
            .context("cannot write the spool's records in staging")?;
        let mut dirs = self.dirs;
        dirs.flush()
            .context("cannot write the spool's records in staging")?;
        let seeded = self.borrowed.is_some();
        let why = self.borrowed.as_ref().and_then(|b| b.why.clone());
        let (root, prefix) = match subpath {
            None => (self.root, Vec::new()),
            Some(p) => {
                let parts = components(p)?;
                let prefix = join(&parts);
                let dir = self.root.open_beneath(&prefix).map_err(|e| {
                    if e.kind() == io::ErrorKind::NotFound {
                        anyhow!("{label}: //{} is not in the source", c_style(&prefix))
                    } else {
                        anyhow!(
                            "{label}: //{} is not a directory in the source",
                            c_style(&prefix)
                        )
                    }
                })?;
                (dir, prefix)
            }
        };
        Ok(Spooled {
            root,
            prefix,
            files,
            linked: Default::default(),
            dirs,
            newest: self.newest,
            label,
            identity,
            lent: self.borrowed.map(|b| b.lent),
            incomplete,
            why,
            seeded,
        })
    }

    /// `finish`, as a `Source` of its own (for a kind that spools without
    /// `Streamed`).
    #[allow(dead_code)]
    pub fn into_source(
        self,
        label: String,
        identity: String,
        subpath: Option<&[u8]>,
    ) -> Result<Box<dyn Source>> {
        Ok(Box::new(self.finish(label, identity, subpath)?))
    }
}

/// A private directory outside the volume to spool into when nothing may
/// be written on the volume (`--dry-run`): below the system's temporary
/// directory, removed when dropped.
pub struct Scratch {
    parent: DirFd,
    name: Vec<u8>,
    dir: DirFd,
}

impl Scratch {
    pub fn new() -> Result<Scratch> {
        let tmp = std::env::temp_dir();
        let parent = DirFd::open_path(&tmp)
            .with_context(|| format!("cannot open {} to read the archive into", tmp.display()))?;
        let name = format!("packsync-{}", crate::volume::unique_name()).into_bytes();
        parent
            .mkdir(&name, 0o700)
            .with_context(|| format!("cannot create a directory in {}", tmp.display()))?;
        let dir = parent.open_dir(&name);
        let dir = match dir {
            Ok(d) => d,
            Err(e) => {
                let _ = parent.remove_tree(&name);
                return Err(e)
                    .with_context(|| format!("cannot open a directory in {}", tmp.display()));
            }
        };
        Ok(Scratch { parent, name, dir })
    }

    pub fn dir(&self) -> &DirFd {
        &self.dir
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = self.parent.remove_tree(&self.name);
    }
}

fn meta_of(h: &tar::Header) -> Meta {
    Meta {
        mode: h.mode,
        uid: h.uid,
        gid: h.gid,
        size: 0,
        mtime: h.mtime.into(),
        xattrs: Set::of(h.xattrs.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tar::tests::{archive, header};
    use super::*;
    use crate::filter::Filter;
    use crate::report::Collected;
    use crate::tree::Node;

    fn spool() -> (tempfile::TempDir, Spool) {
        let t = tempfile::tempdir().unwrap();
        let s = Spool::new(&DirFd::open_path(t.path()).unwrap(), b"0").unwrap();
        (t, s)
    }

    fn apply(s: &mut Spool, bytes: &[u8], whiteouts: bool) -> Result<LayerStats> {
        let mut r: &[u8] = bytes;
        s.apply(&mut r, whiteouts, "x.tar", &Collected::default())
    }

    fn paths(s: Spool) -> Vec<(String, Option<[u8; 32]>, u32)> {
        let src = s.finish("x.tar".into(), "id".into(), None).unwrap();
        let tree = src
            .scan(0, &Filter::default(), &Collected::default())
            .unwrap();
        let mut out = Vec::new();
        tree.for_each(&mut |p, e| {
            let hash = match &e.node {
                Node::File(f) => f.hash,
                _ => None,
            };
            out.push((String::from_utf8_lossy(p).into_owned(), hash, e.meta.mode));
        });
        out
    }

    fn sha(b: &[u8]) -> [u8; 32] {
        Sha256::digest(b).into()
    }

    #[test]
    fn entries_land_with_their_metadata_and_hashes() {
        let (_t, mut s) = spool();
        let mut secret = header(b"/d/secret", b'0', 2, b"");
        secret[100..107].copy_from_slice(b"0000000");
        super::super::tar::tests::seal(&mut secret);
        let a = archive(&[
            (header(b"/data.json", b'0', 2, b""), b"{}"),
            (secret, b"no"),
            (header(b"d/h", b'1', 0, b"/d/secret"), b""),
            (header(b"d/l", b'2', 0, b"/etc"), b""),
            (header(b"fifo", b'6', 0, b""), b""),
        ]);
        let stats = apply(&mut s, &a, false).unwrap();
        assert_eq!((stats.files, stats.skipped, stats.entries), (2, 1, 4));
        assert_eq!(
            paths(s),
            vec![
                ("d".into(), None, 0o755),
                ("d/h".into(), Some(sha(b"no")), 0),
                ("d/l".into(), None, 0o777),
                ("d/secret".into(), Some(sha(b"no")), 0),
                ("data.json".into(), Some(sha(b"{}")), 0o644),
            ]
        );
    }

    #[test]
    fn hostile_names_are_refused() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (
                archive(&[(header(b"../x", b'0', 0, b""), b"")]),
                "\"..\" component",
            ),
            (
                archive(&[(header(b"a/../../x", b'0', 0, b""), b"")]),
                "\"..\" component",
            ),
            (
                archive(&[
                    (header(b"l", b'2', 0, b"/etc"), b""),
                    (header(b"l/passwd", b'0', 1, b""), b"x"),
                ]),
                "reached through the symlink l",
            ),
            (
                archive(&[(header(b"h", b'1', 0, b"../../etc/x"), b"")]),
                "its target leaves the tree",
            ),
            (
                archive(&[(header(b"h", b'1', 0, b"nothing"), b"")]),
                "not an earlier file",
            ),
            (
                archive(&[
                    (header(b"l", b'2', 0, b"/etc"), b""),
                    (header(b"h", b'1', 0, b"l/passwd"), b""),
                ]),
                "not an earlier file",
            ),
        ];
        for (bytes, needle) in cases {
            let (t, mut s) = spool();
            let e = format!("{:#}", apply(&mut s, &bytes, false).unwrap_err());
            assert!(e.starts_with("x.tar: "), "{e}");
            assert!(e.contains(needle), "{e} lacks {needle}");
            drop(s);
            assert!(!t.path().join("x").exists());
        }
    }

    #[test]
    fn whiteouts_remove_earlier_layers_entries_only_when_asked() {
        let (_t, mut s) = spool();
        let lower = archive(&[
            (header(b"a/keep", b'0', 1, b""), b"k"),
            (header(b"a/gone", b'0', 1, b""), b"g"),
            (header(b"o/old", b'0', 1, b""), b"o"),
            (header(b"linked", b'0', 1, b""), b"l"),
            (header(b"link", b'1', 0, b"linked"), b""),
        ]);
        apply(&mut s, &lower, true).unwrap();
        let upper = archive(&[
            (header(b"a/.wh.gone", b'0', 0, b""), b""),
            (header(b"o/new", b'0', 1, b""), b"n"),
            (header(b"o/.wh..wh..opq", b'0', 0, b""), b""),
            (header(b".wh.linked", b'0', 0, b""), b""),
        ]);
        let stats = apply(&mut s, &upper, true).unwrap();
        assert_eq!(stats.whiteouts, 3);
        // A whiteout below a directory no layer made makes nothing.
        let ghost = archive(&[(header(b"ghost/.wh.x", b'0', 0, b""), b"")]);
        apply(&mut s, &ghost, true).unwrap();
        let got: Vec<String> = paths(s).into_iter().map(|p| p.0).collect();
        assert_eq!(got, vec!["a", "a/keep", "link", "o", "o/new"]);
        // Without whiteouts a `.wh.` file is a file.
        let (_t, mut s) = spool();
        apply(&mut s, &upper, false).unwrap();
        let got: Vec<String> = paths(s).into_iter().map(|p| p.0).collect();
        assert!(got.contains(&"a/.wh.gone".to_string()), "{got:?}");
    }

    #[test]
    fn a_layers_own_whiteouts_leave_what_it_made() {
        let (_t, mut s) = spool();
        let lower = archive(&[
            (header(b"x/low", b'0', 1, b""), b"l"),
            (header(b"lowlinked", b'0', 1, b""), b"k"),
        ]);
        apply(&mut s, &lower, true).unwrap();
        // A file, a directory, a symlink and a hardlink to a lower file,
        // each made by the layer that then whites it out, stay (whiteouts
        // hide lower layers' entries); the lower file below `x` goes.
        let upper = archive(&[
            (header(b"up/file", b'0', 1, b""), b"f"),
            (header(b"up/dir/", b'5', 0, b""), b""),
            (header(b"up/sym", b'2', 0, b"file"), b""),
            (header(b"hl", b'1', 0, b"lowlinked"), b""),
            (header(b"x/mine", b'0', 1, b""), b"m"),
            (header(b"up/.wh.file", b'0', 0, b""), b""),
            (header(b"up/.wh.dir", b'0', 0, b""), b""),
            (header(b"up/.wh.sym", b'0', 0, b""), b""),
            (header(b".wh.hl", b'0', 0, b""), b""),
            (header(b"x/.wh..wh..opq", b'0', 0, b""), b""),
        ]);
        let stats = apply(&mut s, &upper, true).unwrap();
        assert_eq!(stats.whiteouts, 5);
        let got: Vec<String> = paths(s).into_iter().map(|p| p.0).collect();
        let want = [
            "hl",
            "lowlinked",
            "up",
            "up/dir",
            "up/file",
            "up/sym",
            "x",
            "x/mine",
        ];
        assert_eq!(got, want);
    }

    /// A directory's metadata is the newest its path was given: a
    /// directory named again takes the new mode, one whited out and made
    /// again as a parent gets the default, never the removed one's.
    #[test]
    fn a_directory_made_again_has_the_metadata_given_last() {
        let dir = |name: &[u8], mode: &[u8; 7]| {
            let mut h = header(name, b'5', 0, b"");
            h[100..107].copy_from_slice(mode);
            super::super::tar::tests::seal(&mut h);
            h
        };
        let (_t, mut s) = spool();
        let lower = archive(&[
            (dir(b"kept/", b"0000700"), b""),
            (dir(b"gone/", b"0000711"), b""),
            (dir(b"gone/sub/", b"0000701"), b""),
            (dir(b"renamed/", b"0000700"), b""),
        ]);
        apply(&mut s, &lower, true).unwrap();
        let upper = archive(&[
            (header(b".wh.gone", b'0', 0, b""), b""),
            (header(b"gone/sub/f", b'0', 1, b""), b"f"),
            (dir(b"renamed/", b"0000750"), b""),
        ]);
        apply(&mut s, &upper, true).unwrap();
        let got: Vec<(String, u32)> = paths(s).into_iter().map(|p| (p.0, p.2)).collect();
        let want = [
            ("gone", 0o755),
            ("gone/sub", 0o755),
            ("gone/sub/f", 0o644),
            ("kept", 0o700),
            ("renamed", 0o750),
        ];
        let want: Vec<(String, u32)> = want.iter().map(|(p, m)| (p.to_string(), *m)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_later_entry_replaces_an_earlier_one() {
        let (_t, mut s) = spool();
        let a = archive(&[
            (header(b"x", b'0', 1, b""), b"1"),
            (header(b"x/", b'5', 0, b""), b""),
            (header(b"x/y", b'0', 1, b""), b"2"),
            (header(b"x", b'0', 1, b""), b"3"),
        ]);
        apply(&mut s, &a, false).unwrap();
        assert_eq!(paths(s), vec![("x".into(), Some(sha(b"3")), 0o644)]);
    }

    /// Every entry of a scanned spool as a user sees it: path, kind,
    /// metadata, content hash, symlink target (no inode numbers).
    fn seen(src: &Spooled) -> Vec<String> {
        let mut tree = src
            .scan(0, &Filter::default(), &Collected::default())
            .unwrap();
        tree.assign_groups();
        let mut out = vec![format!("root {:?}", tree.root)];
        tree.for_each(&mut |p, e| {
            let what = match &e.node {
                Node::File(f) => format!("f {:?} {:?}", f.hash.map(|h| h[0]), f.group.is_some()),
                Node::Dir(_) => "d".into(),
                Node::Symlink(t) => format!("l {}", c_style(t)),
            };
            out.push(format!("{} {what} {:?}", c_style(p), e.meta));
        });
        out
    }

    /// The lower layers spooled and scanned, as the base a seeded spool starts from.
    fn base_of(lower: &[&[u8]], prefix: Option<&[u8]>) -> Base {
        let (_t, mut s) = spool();
        for l in lower {
            apply(&mut s, l, true).unwrap();
        }
        let src = s.finish("x".into(), "id".into(), prefix).unwrap();
        let mut tree = src
            .scan(0, &Filter::default(), &Collected::default())
            .unwrap();
        tree.assign_groups();
        // The live generation's manifest, as the sync indexes it.
        let mut text = Vec::new();
        let mut m = crate::manifest::Manifest {
            tree,
            ..Default::default()
        };
        m.write(&mut text).unwrap();
        let mut r = std::io::Cursor::new(text.clone());
        crate::manifest::Manifest::read_header(&mut r).unwrap();
        let index = crate::index::Index::build(r, Box::new(text), "m".into()).unwrap();
        Base {
            index,
            newest: src.newest(),
            root_given: src.root_given().unwrap(),
            live: None,
        }
    }

    fn lower_layers() -> Vec<Vec<u8>> {
        vec![
            archive(&[
                (header(b"app/", b'5', 0, b""), b""),
                (header(b"app/lib/a", b'0', 1, b""), b"a"),
                (header(b"app/lib/b", b'0', 1, b""), b"b"),
                (header(b"app/h", b'0', 1, b""), b"h"),
                (header(b"app/h2", b'1', 0, b"app/h"), b""),
                (header(b"app/cache/old", b'0', 1, b""), b"o"),
                (header(b"app/l", b'2', 0, b"lib/a"), b""),
                (header(b"etc/motd", b'0', 2, b""), b"hi"),
            ]),
            archive(&[
                (header(b"app/gone", b'0', 1, b""), b"g"),
                (header(b"app/file-then-dir", b'0', 1, b""), b"f"),
            ]),
        ]
    }

    #[test]
    fn a_seeded_spool_gives_what_applying_every_layer_gives() {
        // `clear`: the file `app/file-then-dir` whited out first; without
        // that, `app/file-then-dir/x` goes through a file and is refused below.
        let upper_layer = |clear: bool| {
            let mut entries = vec![
                (header(b"app/lib/b", b'0', 2, b""), &b"b2"[..]),
                (header(b"app/lib/new", b'0', 1, b""), b"n"),
                (header(b"app/.wh.gone", b'0', 0, b""), b""),
                (header(b"app/cache/.wh..wh..opq", b'0', 0, b""), b""),
                (header(b"app/cache/fresh", b'0', 1, b""), b"f"),
                (header(b"app/file-then-dir/x", b'0', 1, b""), b"x"),
                (header(b"etc/.wh.motd", b'0', 0, b""), b""),
            ];
            if clear {
                entries.insert(5, (header(b"app/.wh.file-then-dir", b'0', 0, b""), b""));
            }
            archive(&entries)
        };
        let (upper, upper_ok) = (upper_layer(false), upper_layer(true));
        let lower = lower_layers();
        let lower: Vec<&[u8]> = lower.iter().map(Vec::as_slice).collect();
        for prefix in [None, Some(&b"app"[..])] {
            let (_t, mut full) = spool();
            for l in &lower {
                apply(&mut full, l, true).unwrap();
            }
            apply(&mut full, &upper_ok, true).unwrap();
            let want = seen(&full.finish("x".into(), "id".into(), prefix).unwrap());

            let (_t, mut seeded) = spool();
            seeded
                .seed(base_of(&lower, prefix), prefix.unwrap_or_default())
                .unwrap();
            apply(&mut seeded, &upper_ok, true).unwrap();
            assert!(!seeded.incomplete());
            let got = seeded.finish("x".into(), "id".into(), prefix).unwrap();
            assert!(got.seeded());
            assert_eq!(seen(&got), want, "prefix {prefix:?}");

            // Through a borrowed file: refused, as it is over the file itself.
            let (_t, mut seeded) = spool();
            seeded
                .seed(base_of(&lower, prefix), prefix.unwrap_or_default())
                .unwrap();
            let e = format!("{:#}", apply(&mut seeded, &upper, true).unwrap_err());
            assert!(
                e.contains("reached through the non-directory app/file-then-dir"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_hardlink_to_a_borrowed_file_leaves_the_spool_incomplete() {
        let lower = lower_layers();
        let lower: Vec<&[u8]> = lower.iter().map(Vec::as_slice).collect();
        let (_t, mut s) = spool();
        s.seed(base_of(&lower, None), b"").unwrap();
        let upper = archive(&[(header(b"app/again", b'1', 0, b"app/lib/a"), b"")]);
        apply(&mut s, &upper, true).unwrap();
        assert!(s.incomplete());
        let src = s.finish("x".into(), "id".into(), None).unwrap();
        let why = src.why_incomplete().unwrap();
        assert!(
            why.starts_with("app/again in a new layer is a hardlink to app/lib/a of a lower layer"),
            "{why}"
        );
        let tree = src
            .scan(0, &Filter::default(), &Collected::default())
            .unwrap();
        assert!(!src.intact(&tree), "only a full apply can make it");
    }

    #[test]
    fn a_hardlink_to_a_borrowed_file_copies_it_from_the_live_tree() {
        let lower = lower_layers();
        let lower: Vec<&[u8]> = lower.iter().map(Vec::as_slice).collect();
        // New paths linked to a file apart and to a member of a group,
        // each twice (the second finds the copy the first made).
        let upper = archive(&[
            (header(b"app/again", b'1', 0, b"app/lib/a"), b""),
            (header(b"app/h3", b'1', 0, b"app/h2"), b""),
            (header(b"app/again2", b'1', 0, b"app/lib/a"), b""),
            (header(b"app/h4", b'1', 0, b"app/h"), b""),
        ]);
        let (_t, mut full) = spool();
        for l in &lower {
            apply(&mut full, l, true).unwrap();
        }
        apply(&mut full, &upper, true).unwrap();
        let want = seen(&full.finish("x".into(), "id".into(), None).unwrap());
        // The live generation: the lower layers' tree on disk.
        let (_live_t, mut live) = spool();
        for l in &lower {
            apply(&mut live, l, true).unwrap();
        }
        let live = live.finish("x".into(), "id".into(), None).unwrap();
        for drifted in [false, true] {
            if drifted {
                let fd = live
                    .root
                    .open_dir(b"app")
                    .unwrap()
                    .open_dir(b"lib")
                    .unwrap();
                fd.unlink(b"a").unwrap();
                let f = fd.create_excl(b"a").unwrap();
                sys::write_all(f.as_fd(), b"A").unwrap();
            }
            let (_t, mut s) = spool();
            let mut base = base_of(&lower, None);
            base.live = Some(live.root.try_clone().unwrap());
            s.seed(base, b"").unwrap();
            apply(&mut s, &upper, true).unwrap();
            // Drift: the live file is not what the manifest says.
            assert_eq!(s.incomplete(), drifted);
            let got = s.finish("x".into(), "id".into(), None).unwrap();
            if !drifted {
                assert_eq!(seen(&got), want);
                assert!(got.why_incomplete().is_none());
            }
        }
    }

    #[test]
    fn a_seeded_spool_is_intact_only_when_every_borrowed_file_is_reused() {
        let lower = lower_layers();
        let lower: Vec<&[u8]> = lower.iter().map(Vec::as_slice).collect();
        let (_t, mut s) = spool();
        s.seed(base_of(&lower, None), b"").unwrap();
        let src = s.finish("x".into(), "id".into(), None).unwrap();
        let mut tree = src
            .scan(0, &Filter::default(), &Collected::default())
            .unwrap();
        tree.assign_groups();
        assert!(!src.intact(&tree), "nothing reused yet");
        let mut leaders = std::collections::HashSet::new();
        tree.for_each_mut(&mut |_, e| {
            if let Node::File(f) = &mut e.node {
                assert_eq!(f.dev, BORROWED_DEV);
                // The stage links the other paths of a group to its first.
                f.reuse = f.group.is_none_or(|g| leaders.insert(g));
            }
        });
        assert!(src.intact(&tree));
        // Listed files are nowhere on disk: nothing to move by mistake.
        assert!(src.open_file(b"app/lib/a").is_err());
        // Listed a directory at a time (as a streamed sync lists it), the
        // spool gives what its scan gives, borrowed files and all.
        let scanned = src
            .scan(0, &Filter::default(), &Collected::default())
            .unwrap();
        let files = |es: &[Entry]| -> Vec<String> {
            es.iter()
                .map(|e| match &e.node {
                    Node::File(f) => format!(
                        "{} {:?} {} {} {} {:?}",
                        c_style(&e.name),
                        e.meta,
                        f.dev,
                        f.ino,
                        f.nlink,
                        f.hash.map(|h| h[0])
                    ),
                    _ => format!("{} {}", c_style(&e.name), e.kind() as u8),
                })
                .collect()
        };
        let app = scanned.entries.iter().find(|e| &*e.name == b"app").unwrap();
        let Node::Dir(d) = &app.node else {
            panic!("app is a directory")
        };
        let fd = src.root().unwrap().open_dir(b"app").unwrap();
        let listed = src
            .list(&fd, b"app", 0, &Filter::default(), &Collected::default())
            .unwrap();
        assert_eq!(files(&listed), files(&d.entries));
        assert!(
            listed.iter().any(|e| &*e.name == b"h2"),
            "{:?}",
            files(&listed)
        );
    }

    #[test]
    fn a_subpath_becomes_the_root_and_must_exist() {
        let (_t, mut s) = spool();
        apply(
            &mut s,
            &archive(&[(header(b"p/q/f", b'0', 1, b""), b"f")]),
            false,
        )
        .unwrap();
        let e = format!(
            "{:#}",
            s.finish("x.tar".into(), "id".into(), Some(b"p/nope"))
                .err()
                .unwrap()
        );
        assert_eq!(e, "x.tar: //p/nope is not in the source");
        let (_t, mut s) = spool();
        apply(
            &mut s,
            &archive(&[(header(b"p/q/f", b'0', 1, b""), b"f")]),
            false,
        )
        .unwrap();
        let src = s.finish("x.tar".into(), "id".into(), Some(b"/p/")).unwrap();
        let tree = src
            .scan(0, &Filter::default(), &Collected::default())
            .unwrap();
        assert_eq!(&*tree.entries[0].name, b"q");
    }
}
