//! A spool seeded from the live generation (`Spool::seed`: an image update
//! that only adds layers on top) or lent its files (`Spool::lend`: a
//! zstd:chunked layer): the live files it lists without holding them
//! (`Borrowed`: read a directory at a time from the live manifest's index,
//! less what later layers removed), and the copy of one a later layer
//! needs (`materialise`).

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::sync::OnceLock;

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use crate::error::check_signal;
use crate::escape::c_style;
use crate::index::Index;
use crate::sys::{self, DirFd, StatKind};
use crate::tree::{Entry, Name, Node, Time};

use super::records::FileMeta;
use super::{components, join, split, Spool};

/// The device number the scan gives borrowed files: no filesystem has it,
/// so they never share an inode with a file of the spool.
pub const BORROWED_DEV: u64 = u64::MAX;

/// What a spool starts from instead of the lower layers (`Spool::seed`):
/// the live generation's manifest, indexed by directory (its digest
/// checked as it was indexed), hashes kept.
pub struct Base {
    pub index: Index,
    /// The newest mtime the lower layers gave (the root's, where none names it).
    pub newest: Time,
    /// Whether the lower layers gave the root (or the `//PATH`) its metadata.
    pub root_given: bool,
    /// The live generation's root, where a file a new layer links to is
    /// read from (its hash checked against the manifest's): `None` makes
    /// such a link leave the spool incomplete.
    pub live: Option<DirFd>,
}

/// The live generation's files a seeded spool lists without holding them.
#[derive(Default)]
pub(super) struct Borrowed {
    pub(super) lent: Lent,
    /// Something a later layer needed of a borrowed file (a hardlink to
    /// it): the spool is not what the layers give, only a full apply is.
    pub(super) incomplete: bool,
    /// Why, where a layer asked for it (the line the sync shows when it
    /// then applies every layer).
    pub(super) why: Option<String>,
    /// The live generation's root and the spool path it stands for (the
    /// `//PATH` taken): where a borrowed file's bytes are, when a later
    /// layer needs them (`Spool::materialise`).
    pub(super) live: Option<(DirFd, Vec<u8>)>,
    /// The last directory of the manifest looked up (its path and
    /// entries): a layer's entries come a directory at a time.
    cache: RefCell<Option<(Vec<u8>, Vec<Entry>)>>,
}

/// The borrowed files, as a filled spool lists them a directory at a time
/// (`Lent::of`): those listed one by one (`Spool::lend`), and those of the
/// live manifest a seeded spool started from (`Lower`).
#[derive(Default)]
pub(super) struct Lent {
    pub(super) files: Listed,
    pub(super) lower: Option<Lower>,
}

/// The live manifest a spool was seeded from, less what later layers
/// removed: its files are read a directory at a time from its index, and
/// nothing of it is held but what was removed.
pub(super) struct Lower {
    index: Index,
    /// The spool path the manifest's root stands for (the `//PATH`).
    prefix: Vec<u8>,
    /// Spool paths a later layer removed (a whiteout, an entry of another
    /// kind): nothing at or below them is borrowed.
    gone: HashSet<Vec<u8>>,
    /// Directories an opaque whiteout emptied of the lower layers' files.
    emptied: HashSet<Vec<u8>>,
    /// Each hardlink group's spool paths, read from the index in one walk
    /// the first time a later layer links to a file of a group (`group`).
    groups: OnceLock<HashMap<u32, Vec<Vec<u8>>>>,
}

impl Lower {
    /// The spool paths the manifest records for hardlink group `g`, those
    /// a later layer removed among them (`Borrowed::has` tells).
    fn group(&self, g: u32) -> Result<&[Vec<u8>]> {
        if self.groups.get().is_none() {
            let mut groups: HashMap<u32, Vec<Vec<u8>>> = HashMap::new();
            self.index.walk(&mut |p, e| {
                if let Node::File(f) = &e.node {
                    if let Some(g) = f.group {
                        groups
                            .entry(g)
                            .or_default()
                            .push(crate::tree::join(&self.prefix, p));
                    }
                }
            })?;
            let _ = self.groups.set(groups);
        }
        let groups = self.groups.get().expect("set just now");
        Ok(groups.get(&g).map_or(&[], Vec::as_slice))
    }

    /// The spool path `key` as a path of the manifest, where it stands for one.
    fn rel<'a>(&self, key: &'a [u8]) -> Option<&'a [u8]> {
        if self.prefix.is_empty() {
            return Some(key);
        }
        match key.strip_prefix(self.prefix.as_slice())? {
            [] => Some(&[]),
            [b'/', rest @ ..] => Some(rest),
            _ => None,
        }
    }

    /// Whether a later layer removed `path` or a directory above it.
    fn removed(&self, path: &[u8]) -> bool {
        let mut p = path;
        loop {
            if self.gone.contains(p) {
                return true;
            }
            match p.iter().rposition(|&b| b == b'/') {
                Some(i) => p = &p[..i],
                None => return false,
            }
        }
    }

    /// The manifest's entries of the directory `key` (a spool path), as
    /// read, with where the directory is in the index; `None` where no
    /// lower file can be listed there.
    fn raw(&self, key: &[u8]) -> Result<Option<(u32, Vec<Entry>)>> {
        let Some(rel) = self.rel(key) else {
            return Ok(None);
        };
        if self.emptied.contains(key) || (!self.gone.is_empty() && self.removed(key)) {
            return Ok(None);
        }
        let Some(id) = self.index.dir_id(rel) else {
            return Ok(None);
        };
        Ok(Some((id, self.index.entries(rel)?)))
    }

    /// The borrowed files of the directory `key` (a spool path) out of its
    /// manifest entries `raw` (directory `id`), in name order, each as a
    /// scan gives it (`borrowed_as`).
    fn files(&self, key: &[u8], id: u32, raw: Vec<Entry>) -> Vec<Entry> {
        raw.into_iter()
            .enumerate()
            .filter(|(_, e)| matches!(e.node, Node::File(_)))
            .filter(|(_, e)| {
                self.gone.is_empty() || !self.gone.contains(&crate::tree::join(key, &e.name))
            })
            .map(|(k, mut e)| {
                self.borrowed_as(&mut e, id, k);
                e
            })
            .collect()
    }

    /// Give a manifest's file the identity a scan of the spool gives it: on
    /// `BORROWED_DEV`, a hardlink group's number as its inode (its link
    /// count the paths the manifest records), any other file a number of
    /// its own (its directory's place in the index and its own); nothing
    /// to reuse yet.
    fn borrowed_as(&self, e: &mut Entry, id: u32, k: usize) {
        if let Node::File(f) = &mut e.node {
            f.dev = BORROWED_DEV;
            f.reuse = false;
            f.stamp = 0;
            match f.group.take() {
                Some(g) => {
                    f.ino = u64::from(g);
                    f.nlink = self.index.group_paths(g).max(1);
                }
                None => {
                    f.ino = 1 << 63 | u64::from(id) << 31 | (k as u64 & ((1 << 31) - 1));
                    f.nlink = 1;
                }
            }
        }
    }
}

impl Lent {
    /// The borrowed files of the spool directory `key`, in name order:
    /// those lent one by one first, then the lower layers'.
    pub(super) fn of(&self, key: &[u8]) -> Result<Vec<Entry>> {
        let mut out: Vec<Entry> = self
            .files
            .get(key)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default();
        if let Some(lower) = &self.lower {
            if let Some((id, raw)) = lower.raw(key)? {
                let listed = out.len();
                for e in lower.files(key, id, raw) {
                    let named = |o: &Entry| o.name == e.name;
                    if !out[..listed].iter().any(named) {
                        out.push(e);
                    }
                }
                if listed > 0 {
                    out.sort_by(|a, b| a.name.cmp(&b.name));
                }
            }
        }
        Ok(out)
    }
}

impl Borrowed {
    /// Forget the borrowed file at `path` (parent `dir`, `name`), if any,
    /// where something is about to be made there (a later layer's entry,
    /// or the file itself, `materialise`d): a lower layer's is kept
    /// among the paths removed, so that it is no longer taken for one.
    pub(super) fn forget(&mut self, dir: &[u8], name: &[u8]) -> bool {
        if let Some(m) = self.lent.files.get_mut(dir) {
            if m.remove(&Name::from(name)).is_some() {
                return true;
            }
        }
        let path = crate::tree::join(dir, name);
        let lower = self.lent.lower.is_some() && self.has(&path);
        if let (true, Some(l)) = (lower, &mut self.lent.lower) {
            l.gone.insert(path);
            // `has` just read this directory into the cache: take it off there.
            if let Some((d, files)) = self.cache.get_mut() {
                if d.as_slice() == dir {
                    files.retain(|e| &*e.name != name);
                }
            }
        }
        lower
    }

    /// The borrowed file at `path`, as a scan gives it.
    fn get(&self, path: &[u8]) -> Option<Entry> {
        let (dir, name) = split(path);
        if let Some(e) = self
            .lent
            .files
            .get(dir)
            .and_then(|m| m.get(&Name::from(name)))
        {
            return Some(e.clone());
        }
        let lower = self.lent.lower.as_ref()?;
        let mut cache = self.cache.borrow_mut();
        let hit = matches!(&*cache, Some((d, _)) if d.as_slice() == dir);
        if !hit {
            let (id, raw) = lower.raw(dir).ok().flatten().unwrap_or_default();
            let files = lower.files(dir, id, raw);
            *cache = Some((dir.to_vec(), files));
        }
        let (_, files) = cache.as_ref().expect("filled");
        files
            .binary_search_by(|e| (*e.name).cmp(name))
            .ok()
            .map(|i| files[i].clone())
    }

    pub(super) fn has(&self, path: &[u8]) -> bool {
        self.get(path).is_some()
    }

    /// Forget everything at and below `path`.
    pub(super) fn forget_tree(&mut self, path: &[u8]) {
        let (dir, name) = split(path);
        if let Some(m) = self.lent.files.get_mut(dir) {
            m.remove(&Name::from(name));
        }
        let mut under = path.to_vec();
        under.push(b'/');
        self.lent
            .files
            .retain(|k, _| k.as_slice() != path && !k.starts_with(&under));
        if let Some(lower) = &mut self.lent.lower {
            lower.gone.insert(path.to_vec());
        }
        *self.cache.get_mut() = None;
    }

    /// An opaque whiteout in the directory `path`: no file of the layers
    /// below is listed there.
    pub(super) fn empty(&mut self, path: &[u8]) {
        self.lent.files.remove(path);
        if let Some(lower) = &mut self.lent.lower {
            lower.emptied.insert(path.to_vec());
        }
        *self.cache.get_mut() = None;
    }

    /// The spool paths of the borrowed files on inode `ino` (a hardlink
    /// group's paths, where several are). Only the lower manifest's files
    /// share an inode: a file lent one by one has one of its own and one
    /// link (`Spool::lend`).
    fn members(&self, ino: u64) -> Result<Vec<Vec<u8>>> {
        let (Some(lower), Ok(g)) = (&self.lent.lower, u32::try_from(ino)) else {
            return Ok(Vec::new());
        };
        let paths = lower.group(g)?;
        Ok(paths.iter().filter(|p| self.has(p)).cloned().collect())
    }
}

/// Whether a borrowed file was made a file of the spool (`materialise`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Taken {
    Yes,
    NoLive,
    Drifted,
}

/// Files lent one by one, by parent directory, then by name.
pub(super) type Listed = HashMap<Vec<u8>, BTreeMap<Name, Entry>>;

impl Spool {
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
            self.record_dir(&prefix, &base.index.root, true)?;
        }
        let mut seeder = Seeder {
            spool: self,
            index: &base.index,
            incomplete: false,
        };
        let mut path = prefix.clone();
        seeder.dir(&root, &mut Vec::new(), &mut path)?;
        let incomplete = seeder.incomplete;
        self.borrowed = Some(Borrowed {
            live: base.live.map(|d| (d, prefix.clone())),
            incomplete,
            lent: Lent {
                files: Listed::new(),
                lower: Some(Lower {
                    index: base.index,
                    prefix,
                    gone: HashSet::new(),
                    emptied: HashSet::new(),
                    groups: OnceLock::new(),
                }),
            },
            ..Borrowed::default()
        });
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
    pub(super) fn forget(&mut self, path: &[u8]) {
        if let Some(b) = &mut self.borrowed {
            let (dir, name) = split(path);
            b.forget(dir, name);
        }
    }

    pub(super) fn is_borrowed(&self, path: &[u8]) -> bool {
        self.borrowed.as_ref().is_some_and(|b| b.has(path))
    }

    /// Make the borrowed file at `path` (and every borrowed path of its
    /// hardlink group) a file of the spool, its bytes copied from the live
    /// generation and checked against the hash the manifest recorded, so
    /// that a later layer can link to it. Else the spool is left as it
    /// was: no live generation at hand, or the live file is not what its
    /// manifest says (drift).
    pub(super) fn materialise(&mut self, path: &[u8]) -> Result<Taken> {
        let Some(b) = &self.borrowed else {
            return Ok(Taken::NoLive);
        };
        let Some((live, prefix)) = &b.live else {
            return Ok(Taken::NoLive);
        };
        let (_, name) = split(path);
        let Some(e) = b.get(path) else {
            return Ok(Taken::Drifted);
        };
        let Node::File(f) = &e.node else {
            return Ok(Taken::Drifted);
        };
        let (want, meta, ino) = (f.hash, e.meta, f.ino);
        // The group's other borrowed paths (a group keeps one inode number).
        let members = match f.nlink > 1 {
            true => b.members(ino)?,
            false => Vec::new(),
        };
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
}

/// Walks the live manifest into a spool being seeded: its directories and
/// symlinks made, its files left to be listed from the manifest (`Lower`).
pub(super) struct Seeder<'a> {
    spool: &'a mut Spool,
    index: &'a Index,
    /// A file the manifest records without a hash: nothing to compare
    /// it by, only a full apply can tell.
    incomplete: bool,
}

impl Seeder<'_> {
    /// The entries of the manifest's directory `rel`, into the spool's
    /// directory `dir` (at `path` from the spool's root).
    fn dir(&mut self, dir: &DirFd, rel: &mut Vec<u8>, path: &mut Vec<u8>) -> Result<()> {
        for e in self.index.entries(rel)? {
            check_signal()?;
            let (at, r) = (path.len(), rel.len());
            for (p, len) in [(&mut *path, at), (&mut *rel, r)] {
                if len > 0 {
                    p.push(b'/');
                }
                p.extend_from_slice(&e.name);
            }
            let shown = || c_style(path);
            match &e.node {
                Node::Dir(_) => {
                    dir.mkdir(&e.name, 0o700).with_context(|| {
                        format!("cannot create directory {} in the spool", shown())
                    })?;
                    let sub = dir
                        .open_dir(&e.name)
                        .with_context(|| format!("cannot open {} in the spool", shown()))?;
                    self.spool.record_dir(path, &e.meta, true)?;
                    self.dir(&sub, rel, path)?;
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
                Node::File(f) => self.incomplete |= f.hash.is_none(),
            }
            path.truncate(at);
            rel.truncate(r);
        }
        Ok(())
    }
}
