//! A spool seeded from the live generation (`Spool::seed`: an image update
//! that only adds layers on top) or lent its files (`Spool::lend`: a
//! zstd:chunked layer): the live files it lists without holding them
//! (`Borrowed`), and the copy of one a later layer needs (`materialise`).

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read};
use std::os::fd::AsFd;

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use crate::error::check_signal;
use crate::escape::c_style;
use crate::sys::{self, DirFd, StatKind};
use crate::tree::{Entry, Name, Node, Time, Tree};

use super::records::FileMeta;
use super::{components, join, split, Spool};

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
pub(super) struct Borrowed {
    pub(super) files: Listed,
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
}

impl Borrowed {
    /// Forget the borrowed file at `path` (parent `dir`, `name`), if any.
    pub(super) fn forget(&mut self, dir: &[u8], name: &[u8]) -> bool {
        match self.files.get_mut(dir) {
            Some(m) => m.remove(&Name::from(name)).is_some(),
            None => false,
        }
    }

    pub(super) fn has(&self, path: &[u8]) -> bool {
        let (dir, name) = split(path);
        self.files
            .get(dir)
            .is_some_and(|m| m.contains_key(&Name::from(name)))
    }

    /// Forget everything at and below `path`.
    pub(super) fn forget_tree(&mut self, path: &[u8]) {
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
pub(super) enum Taken {
    Yes,
    NoLive,
    Drifted,
}

/// Borrowed files by parent directory, then by name.
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
}

/// Walks a base tree into a spool being seeded.
pub(super) struct Seeder<'a> {
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
