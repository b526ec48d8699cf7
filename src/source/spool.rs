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
//! are kept here by inode, directories' metadata by path, and the scan of
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

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::OnceLock;

use anyhow::{anyhow, bail, Context, Result};
use sha2::{Digest, Sha256};

use crate::error::check_signal;
use crate::escape::c_style;
use crate::filter::Filter;
use crate::report::Reporter;
use crate::sys::{self, DirFd, StatKind};
use crate::tree::{Entry, Meta, Name, Node, Time, Tree};
use crate::xattr::Set;

use super::tar::{self, Kind};
use super::{Dir, Source};

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

/// A file's metadata and content hash, as its entry gave them.
#[derive(Clone, Copy, Debug)]
struct FileMeta {
    hash: [u8; 32],
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: Time,
    xattrs: Set,
}

/// Every spooled file's metadata and hash, kept on disk beside the spool
/// (`spool/<name>.meta` in this writer's staging directory) as records of
/// `RECORD` bytes, not in memory, so that a spool of any size costs no
/// memory per file. A file's record is the one whose number the file
/// carries as its mtime in the spool (whole seconds, which every volume
/// keeps; the stage gives it its real times), and names the file's inode:
/// a record of another inode is no record of it.
struct Metas {
    /// The records' file, written in order and read at offsets.
    fd: OwnedFd,
    read: OwnedFd,
    next: u64,
    /// Records not written yet (`flush`: at `BATCH`, and when the spool is
    /// filled, before any is read).
    pending: Vec<u8>,
}

/// Bytes of records written, or read for one directory, at once.
const BATCH: usize = 64 * 1024;

const RECORD: usize = 72;

impl Metas {
    fn new(at: &DirFd, name: &[u8]) -> Result<Metas> {
        let mut file = name.to_vec();
        file.extend_from_slice(b".meta");
        let fd = at
            .create_excl(&file)
            .with_context(|| format!("cannot create the spool's record {}", c_style(&file)))?;
        let read = at
            .open_read(&file)
            .with_context(|| format!("cannot open the spool's record {}", c_style(&file)))?;
        Ok(Metas {
            fd,
            read,
            next: 0,
            pending: Vec::new(),
        })
    }

    /// Record `m` for the spooled file `file` (open), and number it.
    fn put(&mut self, file: BorrowedFd<'_>, m: &FileMeta) -> io::Result<()> {
        let ino = sys::fstat(file)?.st_ino;
        let mut r = [0u8; RECORD];
        r[0..8].copy_from_slice(&ino.to_le_bytes());
        r[8..40].copy_from_slice(&m.hash);
        r[40..44].copy_from_slice(&m.mode.to_le_bytes());
        r[44..48].copy_from_slice(&m.uid.to_le_bytes());
        r[48..52].copy_from_slice(&m.gid.to_le_bytes());
        r[52..60].copy_from_slice(&m.mtime.s.to_le_bytes());
        r[60..64].copy_from_slice(&m.mtime.ns.to_le_bytes());
        r[64..68].copy_from_slice(&m.xattrs.number().to_le_bytes());
        self.pending.extend_from_slice(&r);
        if self.pending.len() >= BATCH {
            self.flush()?;
        }
        let n = i64::try_from(self.next).map_err(|_| io::Error::other("too many files"))?;
        sys::set_meta_fd(file, None, None, (n, 0))?;
        self.next += 1;
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        sys::write_all(self.fd.as_fd(), &self.pending)?;
        self.pending.clear();
        Ok(())
    }

    /// The number a file whose mtime in the spool is `at` carries.
    fn number(&self, at: Time) -> Option<u64> {
        u64::try_from(at.s)
            .ok()
            .filter(|&n| n < self.next && at.ns == 0)
    }

    /// Records `from..to` read at once (`None` where the file is short).
    fn read(&self, from: u64, to: u64) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; ((to - from) as usize) * RECORD];
        let mut got = 0;
        while got < buf.len() {
            match sys::pread(
                self.read.as_fd(),
                &mut buf[got..],
                from * RECORD as u64 + got as u64,
            ) {
                Ok(0) | Err(_) => return None,
                Ok(k) => got += k,
            }
        }
        Some(buf)
    }

    /// The record of the file whose mtime in the spool is `at`, if it
    /// names inode `ino`.
    fn get(&self, at: Time, ino: u64) -> Option<FileMeta> {
        let n = self.number(at)?;
        decode(&self.read(n, n + 1)?, ino)
    }

    /// `get` for each of one directory's files (`None` for an entry that
    /// is no file), their records read in one piece where they lie
    /// together, as the files of one directory of an archive do.
    fn get_all(&self, wants: &[Option<(Time, u64)>]) -> Vec<Option<FileMeta>> {
        let numbers: Vec<Option<u64>> = wants
            .iter()
            .map(|w| w.and_then(|(at, _)| self.number(at)))
            .collect();
        let (lo, hi) = numbers
            .iter()
            .flatten()
            .fold((u64::MAX, 0), |(lo, hi), &n| (lo.min(n), hi.max(n + 1)));
        let together = lo < hi && ((hi - lo) as usize) * RECORD <= BATCH;
        let block = together.then(|| self.read(lo, hi)).flatten();
        wants
            .iter()
            .zip(&numbers)
            .map(|(w, n)| {
                let ((at, ino), n) = (w.as_ref()?, (*n)?);
                match &block {
                    Some(b) => {
                        let i = ((n - lo) as usize) * RECORD;
                        decode(&b[i..i + RECORD], *ino)
                    }
                    None => self.get(*at, *ino),
                }
            })
            .collect()
    }
}

/// One record, if it names inode `ino`.
fn decode(r: &[u8], ino: u64) -> Option<FileMeta> {
    let u32_at = |i: usize| u32::from_le_bytes(r[i..i + 4].try_into().expect("4 bytes"));
    if u64::from_le_bytes(r[0..8].try_into().expect("8 bytes")) != ino {
        return None;
    }
    Some(FileMeta {
        hash: r[8..40].try_into().expect("32 bytes"),
        mode: u32_at(40),
        uid: u32_at(44),
        gid: u32_at(48),
        mtime: Time {
            s: i64::from_le_bytes(r[52..60].try_into().expect("8 bytes")),
            ns: u32_at(60),
        },
        xattrs: Set::from_number(u32_at(64))?,
    })
}

/// What the layer being applied made: its regular files by the number each
/// carries (`first` and above, but for a lower layer's file made a file of
/// the spool meanwhile, `Spool::taken`), the rest by path (directories,
/// symlinks, hardlinks, files listed from the live generation: few).
struct Made {
    first: u64,
    paths: HashSet<Vec<u8>>,
}

/// A private directory being filled from one or more tar streams.
pub struct Spool {
    root: DirFd,
    /// On disk, by the number each file carries as its mtime: every link
    /// of a hardlinked file shares it.
    files: Metas,
    /// By path from the spool's root (`""`: the root itself).
    dirs: BTreeMap<Vec<u8>, Meta>,
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

/// The device number the scan gives borrowed files: no filesystem has it,
/// so they never share an inode with a file of the spool.
pub const BORROWED_DEV: u64 = u64::MAX;

/// What a spool starts from instead of the lower layers (`Spool::seed`):
/// the live generation's tree as its manifest records it, hashes kept.
pub struct Base {
    pub tree: Tree,
    /// The newest mtime the lower layers gave (the root's, where none names it).
    pub newest: Time,
    /// Whether the lower layers gave the root (or the `//PATH`) its metadata.
    pub root_given: bool,
    /// The live generation's root, where a file a new layer links to is
    /// read from (its hash checked against the manifest's): `None` makes
    /// such a link leave the spool incomplete.
    pub live: Option<DirFd>,
}

/// The live generation's files a seeded spool lists without holding them:
/// by parent directory (a path from the spool's root), then by name.
#[derive(Default)]
struct Borrowed {
    files: Listed,
    /// Something a later layer needed of a borrowed file (a hardlink to
    /// it): the spool is not what the layers give, only a full apply is.
    incomplete: bool,
    /// Why, where a layer asked for it (the line the sync shows when it
    /// then applies every layer).
    why: Option<String>,
    /// The live generation's root and the spool path it stands for (the
    /// `//PATH` taken): where a borrowed file's bytes are, when a later
    /// layer needs them (`Spool::materialise`).
    live: Option<(DirFd, Vec<u8>)>,
}

impl Borrowed {
    /// Forget the borrowed file at `path` (parent `dir`, `name`), if any.
    fn forget(&mut self, dir: &[u8], name: &[u8]) -> bool {
        match self.files.get_mut(dir) {
            Some(m) => m.remove(&Name::from(name)).is_some(),
            None => false,
        }
    }

    fn has(&self, path: &[u8]) -> bool {
        let (dir, name) = split(path);
        self.files
            .get(dir)
            .is_some_and(|m| m.contains_key(&Name::from(name)))
    }

    /// Forget everything at and below `path`.
    fn forget_tree(&mut self, path: &[u8]) {
        let (dir, name) = split(path);
        self.forget(dir, name);
        let mut under = path.to_vec();
        under.push(b'/');
        self.files
            .retain(|k, _| k.as_slice() != path && !k.starts_with(&under));
    }
}

/// Whether a borrowed file was made a file of the spool (`materialise`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Taken {
    Yes,
    NoLive,
    Drifted,
}

/// Borrowed files by parent directory, then by name.
type Listed = HashMap<Vec<u8>, BTreeMap<Name, Entry>>;

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
        Ok(Spool {
            root,
            files,
            dirs: BTreeMap::new(),
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

    /// Start from `base` instead of the layers it was made from: its
    /// directories and symlinks are made below `prefix` (the `//PATH` the
    /// generation took, made too), its files listed (`Borrowed`). Call it
    /// on a new spool, before the first `apply`.
    pub fn seed(&mut self, base: Base, prefix: &[u8]) -> Result<()> {
        let parts = components(prefix)?;
        let prefix = join(&parts);
        let root = self.parent(&parts, base.newest)?;
        self.newest = base.newest;
        if base.root_given {
            self.dirs.insert(prefix.clone(), base.tree.root);
        }
        // Hardlink groups: each keeps one inode number, its link count and
        // the hash its first path carries.
        let mut groups: HashMap<u32, (u32, Option<[u8; 32]>)> = HashMap::new();
        base.tree.for_each(&mut |_, e| {
            if let Node::File(f) = &e.node {
                if let Some(g) = f.group {
                    let slot = groups.entry(g).or_insert((0, f.hash));
                    slot.0 += 1;
                    if slot.1.is_none() {
                        slot.1 = f.hash;
                    }
                }
            }
        });
        let mut borrowed = Borrowed {
            live: base.live.map(|d| (d, prefix.clone())),
            ..Borrowed::default()
        };
        let mut seeder = Seeder {
            spool: self,
            groups: &groups,
            borrowed: &mut borrowed,
            singles: 0,
        };
        let mut path = prefix;
        seeder.dir(&root, base.tree.entries, &mut path)?;
        self.borrowed = Some(borrowed);
        self.cached = None;
        Ok(())
    }

    /// List these files (by spool path) as borrowed from the live
    /// generation (`live`, standing for the spool path `prefix`) when the
    /// next layer's entry for each comes, instead of writing the bytes the
    /// stream carries for it (the caller sends zeros there). Each entry is
    /// the live one, whose content and metadata the caller checked equal
    /// the layer's. The plan must then reuse every one (`Spooled::intact`).
    pub fn lend(
        &mut self,
        files: HashMap<Vec<u8>, Entry>,
        live: &DirFd,
        prefix: &[u8],
    ) -> Result<()> {
        let prefix = join(&components(prefix)?);
        let b = self.borrowed.get_or_insert_with(Borrowed::default);
        if b.live.is_none() {
            b.live = Some((live.try_clone()?, prefix));
        }
        for (path, mut e) in files {
            if let Node::File(f) = &mut e.node {
                self.lent_count += 1;
                f.dev = BORROWED_DEV;
                f.reuse = false;
                f.stamp = 0;
                f.group = None;
                f.ino = 1 << 62 | self.lent_count;
                f.nlink = 1;
                self.lent.insert(path, e);
            }
        }
        Ok(())
    }

    /// Whether a later layer needed something a seeded spool does not hold.
    pub fn incomplete(&self) -> bool {
        self.borrowed.as_ref().is_some_and(|b| b.incomplete)
    }

    /// Forget the borrowed file at `path`, where an entry is about to go.
    fn forget(&mut self, path: &[u8]) {
        if let Some(b) = &mut self.borrowed {
            let (dir, name) = split(path);
            b.forget(dir, name);
        }
    }

    fn is_borrowed(&self, path: &[u8]) -> bool {
        self.borrowed.as_ref().is_some_and(|b| b.has(path))
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
                self.dirs.insert(Vec::new(), meta_of(&h));
                return Ok(());
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
                if self.made_here(layer, &dir, gone, &target) {
                    Ok(())
                } else {
                    self.remove(&dir, gone, &target)
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
        // archive has none, so keeps no list.
        if whiteouts && !numbered {
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
                b.files
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
                self.dirs.insert(path.to_vec(), meta_of(h));
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

    /// Make the borrowed file at `path` (and every borrowed path of its
    /// hardlink group) a file of the spool, its bytes copied from the live
    /// generation and checked against the hash the manifest recorded, so
    /// that a later layer can link to it. Else the spool is left as it
    /// was: no live generation at hand, or the live file is not what its
    /// manifest says (drift).
    fn materialise(&mut self, path: &[u8]) -> Result<Taken> {
        let Some(b) = &self.borrowed else {
            return Ok(Taken::NoLive);
        };
        let Some((live, prefix)) = &b.live else {
            return Ok(Taken::NoLive);
        };
        let (dir, name) = split(path);
        let Some(e) = b.files.get(dir).and_then(|m| m.get(&Name::from(name))) else {
            return Ok(Taken::Drifted);
        };
        let Node::File(f) = &e.node else {
            return Ok(Taken::Drifted);
        };
        let (want, meta, ino) = (f.hash, e.meta, f.ino);
        // The group's other borrowed paths (a group keeps one inode number).
        let mut members: Vec<Vec<u8>> = Vec::new();
        if f.nlink > 1 {
            for (d, files) in &b.files {
                for (n, other) in files {
                    if matches!(&other.node, Node::File(o) if o.ino == ino) {
                        members.push(crate::tree::join(d, n));
                    }
                }
            }
        }
        let rel = match path.strip_prefix(prefix.as_slice()) {
            Some(r) if prefix.is_empty() => r,
            Some(r) if r.first() == Some(&b'/') => &r[1..],
            _ => return Ok(Taken::NoLive),
        };
        let (rdir, rname) = split(rel);
        let opened = live.open_beneath(rdir).and_then(|d| d.open_read(rname));
        let Ok(src) = opened else {
            return Ok(Taken::Drifted);
        };
        if !sys::fstat(src.as_fd()).is_ok_and(|st| sys::kind_of(&st) == StatKind::File) {
            return Ok(Taken::Drifted);
        }
        let parts = components(path)?;
        let (_, parents) = parts.split_last().expect("a file path");
        let at = self.parent(parents, meta.mtime)?;
        let fd = at
            .create_excl(name)
            .with_context(|| format!("cannot create {} in the spool", c_style(path)))?;
        let mut r = sys::reader(src);
        let mut h = Sha256::new();
        let mut n = 0u64;
        if self.buf.len() < 64 << 10 {
            self.buf.resize(64 << 10, 0);
        }
        loop {
            check_signal()?;
            let got = match r.read(&mut self.buf) {
                Ok(0) => break,
                Ok(k) => k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    let _ = at.unlink(name);
                    return Ok(Taken::Drifted);
                }
            };
            h.update(&self.buf[..got]);
            sys::write_all(fd.as_fd(), &self.buf[..got]).context("cannot write into the spool")?;
            n += got as u64;
            if n > meta.size {
                break; // longer than the manifest says: drift
            }
        }
        let hash: [u8; 32] = h.finalize().into();
        if Some(hash) != want || n != meta.size {
            let _ = at.unlink(name);
            return Ok(Taken::Drifted);
        }
        let taken = FileMeta {
            hash,
            mode: meta.mode,
            uid: meta.uid,
            gid: meta.gid,
            mtime: meta.mtime,
            xattrs: meta.xattrs,
        };
        self.files
            .put(fd.as_fd(), &taken)
            .with_context(|| format!("cannot record {} in the spool", c_style(path)))?;
        // A lower layer's file, though numbered now.
        self.taken.insert(self.files.next - 1);
        self.forget(path);
        for m in members.iter().filter(|m| m.as_slice() != path) {
            let mparts = components(m)?;
            let (mname, mdirs) = mparts.split_last().expect("a file path");
            let mdir = self.parent(mdirs, meta.mtime)?;
            at.link(name, &mdir, mname)
                .with_context(|| format!("cannot link {} in the spool", c_style(m)))?;
            self.forget(m);
        }
        self.cached = None;
        Ok(Taken::Yes)
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
        self.dirs.remove(path);
        let mut under = path.to_vec();
        under.push(b'/');
        let gone: Vec<Vec<u8>> = self
            .dirs
            .range(under.clone()..)
            .take_while(|(k, _)| k.starts_with(&under))
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            self.dirs.remove(&k);
        }
        Ok(())
    }

    /// Whether the layer being applied made `name` in `dir` (at `path`):
    /// its whiteouts hide lower layers' entries only.
    fn made_here(&self, layer: &Made, dir: &DirFd, name: &[u8], path: &[u8]) -> bool {
        if layer.paths.contains(path) {
            return true;
        }
        match dir.stat(name) {
            Ok(st) if sys::kind_of(&st) == StatKind::File => {
                let at: Time = sys::mtime_of(&st).into();
                u64::try_from(at.s).is_ok_and(|n| {
                    at.ns == 0
                        && n >= layer.first
                        && n < self.files.next
                        && !self.taken.contains(&n)
                })
            }
            _ => false,
        }
    }

    /// `.wh..wh..opq` in `dir` (at `path`): remove what earlier layers put there.
    fn opaque(&mut self, dir: &DirFd, path: &[u8], layer: &Made) -> Result<()> {
        let listed = dir
            .list()
            .with_context(|| format!("cannot list {} in the spool", c_style(path)))?;
        for l in listed {
            let p = crate::tree::join(path, &l.name);
            if !self.made_here(layer, dir, &l.name, &p) {
                self.remove(dir, &l.name, &p)?;
            }
        }
        // Borrowed files here came from the layers below (this layer's
        // own entries were made on disk, and forgot theirs).
        if let Some(b) = &mut self.borrowed {
            b.files.remove(path);
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
                    let here = join(&parents[..=i]);
                    self.dirs.entry(here).or_insert(Meta {
                        mode: 0o755,
                        mtime,
                        ..Meta::default()
                    });
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
            dirs: self.dirs,
            newest: self.newest,
            label,
            identity,
            borrowed: std::sync::Mutex::new(self.borrowed.map(|b| b.files)),
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

/// A filled spool: a directory whose files are private to this sync (the
/// stage moves them into the staged tree instead of copying), scanned with
/// the metadata and hashes its entries gave.
pub struct Spooled {
    root: DirFd,
    /// The `//PATH` taken, as a path from the spool's root.
    prefix: Vec<u8>,
    files: Metas,
    /// The number each file of several links carries (`numbered`), by inode.
    linked: std::sync::Mutex<HashMap<u64, Time>>,
    dirs: BTreeMap<Vec<u8>, Meta>,
    newest: Time,
    label: String,
    identity: String,
    /// The borrowed files (`Spool::seed`), until the scan puts them on its tree.
    borrowed: std::sync::Mutex<Option<Listed>>,
    incomplete: bool,
    /// Why a seeded spool is incomplete, where a layer said.
    why: Option<String>,
    seeded: bool,
}

impl Spooled {
    /// `p` (from the scan's root) as a path from the spool's root.
    fn full(&self, p: &[u8]) -> Vec<u8> {
        if self.prefix.is_empty() {
            return p.to_vec();
        }
        let mut f = self.prefix.clone();
        if !p.is_empty() {
            f.push(b'/');
            f.extend_from_slice(p);
        }
        f
    }

    /// The root's metadata: what the stream gave it, else 0755 and the
    /// newest mtime of any entry.
    fn root_of(&self) -> Meta {
        self.dirs.get(&self.full(b"")).copied().unwrap_or(Meta {
            mode: 0o755,
            mtime: self.newest,
            ..Meta::default()
        })
    }

    /// Give the entry `e` at `p` (listed from the spool) the metadata and
    /// hash its stream gave; false for a file the spool did not write.
    fn given(&self, p: &[u8], e: &mut Entry) -> bool {
        let read = match &e.node {
            Node::File(f) => self.files.get(self.numbered(f, e.meta.mtime), f.ino),
            _ => None,
        };
        self.given_as(p, e, read)
    }

    /// `given`, with the file's record read already (`Metas::get_all`).
    fn given_as(&self, p: &[u8], e: &mut Entry, read: Option<FileMeta>) -> bool {
        match &mut e.node {
            Node::Dir(_) => {
                if let Some(m) = self.dirs.get(&self.full(p)) {
                    e.meta = *m;
                }
            }
            Node::File(f) => match read {
                Some(m) => {
                    e.meta = Meta {
                        mode: m.mode,
                        uid: m.uid,
                        gid: m.gid,
                        mtime: m.mtime,
                        size: e.meta.size,
                        xattrs: m.xattrs,
                    };
                    f.hash = Some(m.hash);
                }
                None => return false,
            },
            Node::Symlink(_) => {}
        }
        true
    }

    /// The number a file listed with mtime `at` carries: `at`, but for a
    /// file of several links, whose number is the one it had when it was
    /// first listed (a stage that moved one of its links out gave the
    /// inode its real times).
    fn numbered(&self, f: &crate::tree::File, at: Time) -> Time {
        if f.nlink <= 1 {
            return at;
        }
        *self.linked.lock().unwrap().entry(f.ino).or_insert(at)
    }

    fn not_written(&self, p: &[u8]) -> anyhow::Error {
        anyhow!(
            "{}: {} was not written by the spool",
            self.label,
            c_style(p)
        )
    }

    /// The newest mtime any entry gave (what the root gets where none names it).
    pub fn newest(&self) -> Time {
        self.newest
    }

    /// Whether the layers gave the root (or the `//PATH`) its metadata.
    pub fn root_given(&self) -> bool {
        self.dirs.contains_key(&self.prefix)
    }

    /// Whether the spool was seeded (`Spool::seed`).
    pub fn seeded(&self) -> bool {
        self.seeded
    }

    /// Why a seeded spool cannot be published as it is, where a layer
    /// needed what it does not hold (a hardlink to a borrowed file).
    pub fn why_incomplete(&self) -> Option<&str> {
        self.why.as_deref()
    }

    /// For a seeded spool, after the plan: whether it held all the layers
    /// gave and the plan reuses every borrowed file from the live
    /// generation (each hardlink group through its first path, which the
    /// stage links the others to). Else the sync must apply every layer:
    /// a borrowed file has no bytes here to stage.
    pub fn intact(&self, tree: &Tree) -> bool {
        if self.incomplete {
            return false;
        }
        let mut seen = std::collections::HashSet::new();
        let mut ok = true;
        tree.for_each(&mut |_, e| {
            if let Node::File(f) = &e.node {
                if f.dev == BORROWED_DEV && f.group.is_none_or(|g| seen.insert(g)) && !f.reuse {
                    ok = false;
                }
            }
        });
        ok
    }

    /// Put the borrowed files on the scanned tree, each directory's in name
    /// order; `key` is the directory's path from the spool's root, `rel`
    /// from the scan's.
    fn lend(
        entries: &mut Vec<Entry>,
        key: &mut Vec<u8>,
        rel: &mut Vec<u8>,
        borrowed: &mut Listed,
        src: u16,
        filter: &Filter,
    ) {
        for e in entries.iter_mut() {
            if let Node::Dir(d) = &mut e.node {
                let (k, r) = (key.len(), rel.len());
                for (p, at) in [(&mut *key, k), (&mut *rel, r)] {
                    if at > 0 {
                        p.push(b'/');
                    }
                    p.extend_from_slice(&e.name);
                }
                Spooled::lend(&mut d.entries, key, rel, borrowed, src, filter);
                key.truncate(k);
                rel.truncate(r);
            }
        }
        let Some(files) = borrowed.remove(key.as_slice()) else {
            return;
        };
        let mut lent: Vec<Entry> = Vec::with_capacity(files.len());
        for (name, mut e) in files {
            let p = crate::tree::join(rel, &name);
            if filter.excludes(&p, false) {
                continue;
            }
            if let Node::File(f) = &mut e.node {
                f.src = src;
            }
            lent.push(e);
        }
        if lent.is_empty() {
            return;
        }
        // Both sides are sorted by name; a name on disk (made by a later
        // layer, which forgets the borrowed one) wins.
        let disk = std::mem::take(entries);
        let mut out = Vec::with_capacity(disk.len() + lent.len());
        let (mut a, mut b) = (disk.into_iter().peekable(), lent.into_iter().peekable());
        loop {
            match (a.peek(), b.peek()) {
                (Some(x), Some(y)) => match x.name.cmp(&y.name) {
                    std::cmp::Ordering::Less => out.push(a.next().expect("peeked")),
                    std::cmp::Ordering::Greater => out.push(b.next().expect("peeked")),
                    std::cmp::Ordering::Equal => {
                        out.push(a.next().expect("peeked"));
                        b.next();
                    }
                },
                (Some(_), None) => out.push(a.next().expect("peeked")),
                (None, Some(_)) => out.push(b.next().expect("peeked")),
                (None, None) => break,
            }
        }
        *entries = out;
    }
}

/// Walks a base tree into a spool being seeded.
struct Seeder<'a> {
    spool: &'a mut Spool,
    groups: &'a HashMap<u32, (u32, Option<[u8; 32]>)>,
    borrowed: &'a mut Borrowed,
    singles: u64,
}

impl Seeder<'_> {
    /// The entries of the directory `dir` (at `path` from the spool's root).
    fn dir(&mut self, dir: &DirFd, entries: Vec<Entry>, path: &mut Vec<u8>) -> Result<()> {
        let mut files = BTreeMap::new();
        for mut e in entries {
            check_signal()?;
            let at = path.len();
            if at > 0 {
                path.push(b'/');
            }
            path.extend_from_slice(&e.name);
            let shown = || c_style(path);
            match &mut e.node {
                Node::Dir(d) => {
                    dir.mkdir(&e.name, 0o700).with_context(|| {
                        format!("cannot create directory {} in the spool", shown())
                    })?;
                    let sub = dir
                        .open_dir(&e.name)
                        .with_context(|| format!("cannot open {} in the spool", shown()))?;
                    self.spool.dirs.insert(path.clone(), e.meta);
                    let children = std::mem::take(&mut d.entries);
                    self.dir(&sub, children, path)?;
                }
                Node::Symlink(target) => {
                    if target.is_empty() || target.contains(&0) {
                        bail!("symlink {} has an empty or invalid target", shown());
                    }
                    dir.symlink(target, &e.name).with_context(|| {
                        format!("cannot create symlink {} in the spool", shown())
                    })?;
                    let owner = self.spool.owners.then_some((e.meta.uid, e.meta.gid));
                    dir.set_symlink_meta(&e.name, owner, e.meta.mtime.pair())
                        .with_context(|| format!("cannot set the times of symlink {}", shown()))?;
                }
                Node::File(f) => {
                    f.dev = BORROWED_DEV;
                    f.reuse = false;
                    f.stamp = 0;
                    match f
                        .group
                        .take()
                        .and_then(|g| self.groups.get(&g).map(|s| (g, s)))
                    {
                        Some((g, &(n, hash))) => {
                            f.ino = g as u64;
                            f.nlink = n;
                            f.hash = hash;
                        }
                        None => {
                            self.singles += 1;
                            f.ino = 1 << 63 | self.singles;
                            f.nlink = 1;
                        }
                    }
                    if f.hash.is_none() {
                        // Nothing to compare it by: only a full apply can tell.
                        self.borrowed.incomplete = true;
                    }
                    files.insert(e.name.clone(), e);
                }
            }
            path.truncate(at);
        }
        if !files.is_empty() {
            self.borrowed.files.insert(path.clone(), files);
        }
        Ok(())
    }
}

impl Source for Spooled {
    fn label(&self) -> &str {
        &self.label
    }

    fn path(&self) -> Option<&Path> {
        None
    }

    fn identity(&self) -> String {
        self.identity.clone()
    }

    fn scan(&self, src: u16, filter: &Filter, reporter: &dyn Reporter) -> Result<Tree> {
        let dir = Dir::new(self.root.try_clone()?, self.label.clone());
        let mut tree = dir.scan(src, filter, reporter)?;
        tree.root = self.root_of();
        let mut missing = None;
        tree.for_each_mut(&mut |p, e| {
            if !self.given(p, e) {
                missing = Some(p.to_vec());
            }
        });
        if let Some(p) = missing {
            return Err(self.not_written(&p));
        }
        if self.seeded {
            let Some(mut borrowed) = self.borrowed.lock().unwrap().take() else {
                bail!("{}: a seeded spool scanned twice", self.label);
            };
            let mut key = self.prefix.clone();
            Spooled::lend(
                &mut tree.entries,
                &mut key,
                &mut Vec::new(),
                &mut borrowed,
                src,
                filter,
            );
        }
        Ok(tree)
    }

    /// A spool that was not seeded lists a directory at a time: its
    /// entries then carry what the stream gave, as `scan` gives them.
    fn lists_by_directory(&self) -> bool {
        !self.seeded
    }

    fn list(
        &self,
        fd: &DirFd,
        rel: &[u8],
        src: u16,
        filter: &Filter,
        reporter: &dyn Reporter,
    ) -> Result<Vec<Entry>> {
        if self.seeded {
            bail!("{}: a seeded spool is scanned whole", self.label);
        }
        let mut entries = Dir::list(fd, rel, &self.label, src, filter, reporter)?;
        let wants: Vec<Option<(Time, u64)>> = entries
            .iter()
            .map(|e| match &e.node {
                Node::File(f) => Some((self.numbered(f, e.meta.mtime), f.ino)),
                _ => None,
            })
            .collect();
        let read = self.files.get_all(&wants);
        for (e, m) in entries.iter_mut().zip(read) {
            let p = crate::tree::join(rel, &e.name);
            if !self.given_as(&p, e, m) {
                return Err(self.not_written(&p));
            }
        }
        Ok(entries)
    }

    fn root_meta(&self) -> Result<Meta> {
        Ok(self.root_of())
    }

    fn root(&self) -> Option<&DirFd> {
        Some(&self.root)
    }

    fn owns_root(&self) -> bool {
        true
    }

    fn open_file(&self, path: &[u8]) -> io::Result<OwnedFd> {
        let parts = components(path)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let Some((name, dirs)) = parts.split_last() else {
            return Err(io::ErrorKind::InvalidInput.into());
        };
        if dirs.is_empty() {
            return self.root.open_read(name);
        }
        self.root.open_beneath(&join(dirs))?.open_read(name)
    }
}

/// A kind whose content arrives as one or more tar streams: it fills a
/// spool (`fill`: one `Spool::apply` per stream, in order) and says what
/// the generation records as its identity. `Streamed` makes it a `Source`.
pub trait Stream: Send + Sync {
    /// The SOURCE as the user wrote it.
    fn label(&self) -> &str;

    /// Where it lives on this host, if it is a path (DEST must not overlap it).
    fn path(&self) -> Option<&Path> {
        None
    }

    /// The `//PATH` to take, if any.
    fn subpath(&self) -> Option<&[u8]>;

    /// Read the content into `spool`; the identity (a digest, a URL with
    /// its ETag) the manifest records.
    fn fill(&self, spool: &mut Spool, reporter: &dyn Reporter) -> Result<String>;
}

/// A `Stream` as a `Source`: spooled once (`Source::spool`, after the
/// writer's staging directory exists), then scanned like a directory.
pub struct Streamed<S> {
    stream: S,
    spooled: OnceLock<Spooled>,
}

impl<S: Stream> Streamed<S> {
    pub fn new(stream: S) -> Streamed<S> {
        Streamed {
            stream,
            spooled: OnceLock::new(),
        }
    }

    /// The stream itself (a remote kind asks it things before it is spooled).
    pub fn stream(&self) -> &S {
        &self.stream
    }

    /// The filled spool, once `spool` ran.
    pub fn filled(&self) -> Option<&Spooled> {
        self.spooled.get()
    }

    fn spooled(&self) -> Result<&Spooled> {
        self.spooled
            .get()
            .with_context(|| format!("{}: read before it was spooled", self.stream.label()))
    }
}

impl<S: Stream> Source for Streamed<S> {
    fn label(&self) -> &str {
        self.stream.label()
    }

    fn path(&self) -> Option<&Path> {
        self.stream.path()
    }

    fn identity(&self) -> String {
        match self.spooled.get() {
            Some(s) => s.identity.clone(),
            None => self.stream.label().to_string(),
        }
    }

    fn streamed(&self) -> bool {
        true
    }

    fn spool(&self, staging: &DirFd, name: &[u8], reporter: &dyn Reporter) -> Result<()> {
        let mut spool = Spool::new(staging, name)?;
        let identity = self.stream.fill(&mut spool, reporter)?;
        let label = self.stream.label().to_string();
        let done = spool.finish(label, identity, self.stream.subpath())?;
        self.spooled
            .set(done)
            .map_err(|_| anyhow!("{}: spooled twice", self.stream.label()))
    }

    fn scan(&self, src: u16, filter: &Filter, reporter: &dyn Reporter) -> Result<Tree> {
        self.spooled()?.scan(src, filter, reporter)
    }

    fn lists_by_directory(&self) -> bool {
        self.spooled.get().is_some_and(|s| s.lists_by_directory())
    }

    fn list(
        &self,
        fd: &DirFd,
        rel: &[u8],
        src: u16,
        filter: &Filter,
        reporter: &dyn Reporter,
    ) -> Result<Vec<Entry>> {
        self.spooled()?.list(fd, rel, src, filter, reporter)
    }

    fn root_meta(&self) -> Result<Meta> {
        self.spooled()?.root_meta()
    }

    fn root(&self) -> Option<&DirFd> {
        self.spooled.get().map(|s| &s.root)
    }

    fn owns_root(&self) -> bool {
        true
    }

    fn open_file(&self, path: &[u8]) -> io::Result<OwnedFd> {
        match self.spooled.get() {
            Some(s) => s.open_file(path),
            None => Err(io::ErrorKind::NotFound.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tar::tests::{archive, header};
    use super::*;
    use crate::report::Collected;

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
        Base {
            tree,
            newest: src.newest(),
            root_given: src.root_given(),
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
        // New paths linked to a file apart and to a member of a group.
        let upper = archive(&[
            (header(b"app/again", b'1', 0, b"app/lib/a"), b""),
            (header(b"app/h3", b'1', 0, b"app/h2"), b""),
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
        // A second scan would miss them: refused.
        assert!(src
            .scan(0, &Filter::default(), &Collected::default())
            .is_err());
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
