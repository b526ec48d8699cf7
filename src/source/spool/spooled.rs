//! A filled spool as a `Source` (`Spooled`): scanned whole, or listed a
//! directory at a time with the metadata and hashes its stream gave; and
//! `Streamed`, which makes a `Stream` (a kind read as a stream) a `Source`.

use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::OnceLock;

use anyhow::{anyhow, Context, Result};

use crate::escape::c_style;
use crate::filter::Filter;
use crate::report::Reporter;
use crate::sys::DirFd;
use crate::tree::{Entry, Meta, Node, Time, Tree};

use super::super::{Dir, Source};
use super::records::{DirMetas, FileMeta, Metas};
use super::seed::{Lent, BORROWED_DEV};
use super::{components, join, Spool};

/// A filled spool: a directory whose files are private to this sync (the
/// stage moves them into the staged tree instead of copying), scanned with
/// the metadata and hashes its entries gave.
pub struct Spooled {
    pub(super) root: DirFd,
    /// The `//PATH` taken, as a path from the spool's root.
    pub(super) prefix: Vec<u8>,
    pub(super) files: Metas,
    /// The number each file of several links carries (`numbered`), by inode.
    pub(super) linked: std::sync::Mutex<HashMap<u64, Time>>,
    pub(super) dirs: DirMetas,
    pub(super) newest: Time,
    pub(super) label: String,
    pub(super) identity: String,
    /// The borrowed files (`Spool::seed`, `Spool::lend`), listed with the
    /// spool's own a directory at a time.
    pub(super) lent: Option<Lent>,
    pub(super) incomplete: bool,
    /// Why a seeded spool is incomplete, where a layer said.
    pub(super) why: Option<String>,
    pub(super) seeded: bool,
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
    fn root_of(&self) -> Result<Meta> {
        let given = self
            .dirs
            .get(&self.full(b""))
            .with_context(|| format!("{}: cannot read the spool's records", self.label))?;
        Ok(given.unwrap_or(Meta {
            mode: 0o755,
            mtime: self.newest,
            ..Meta::default()
        }))
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
            Node::Dir(_) => match self.dirs.get(&self.full(p)) {
                Ok(Some(m)) => e.meta = m,
                Ok(None) => {}
                Err(_) => return false,
            },
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
    pub fn root_given(&self) -> std::io::Result<bool> {
        Ok(self.dirs.get(&self.prefix)?.is_some())
    }

    /// Whether the spool was seeded (`Spool::seed`).
    pub fn seeded(&self) -> bool {
        self.seeded
    }

    /// Whether a layer needed what a seeded spool does not hold (a
    /// hardlink to a borrowed file it could not take from the live
    /// generation): only applying every layer gives the tree.
    pub fn incomplete(&self) -> bool {
        self.incomplete
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
        &self,
        entries: &mut Vec<Entry>,
        key: &mut Vec<u8>,
        rel: &mut Vec<u8>,
        src: u16,
        filter: &Filter,
    ) -> Result<()> {
        for e in entries.iter_mut() {
            if let Node::Dir(d) = &mut e.node {
                let (k, r) = (key.len(), rel.len());
                for (p, at) in [(&mut *key, k), (&mut *rel, r)] {
                    if at > 0 {
                        p.push(b'/');
                    }
                    p.extend_from_slice(&e.name);
                }
                self.lend(&mut d.entries, key, rel, src, filter)?;
                key.truncate(k);
                rel.truncate(r);
            }
        }
        self.lend_here(entries, key, rel, src, filter)
    }

    /// Put the borrowed files of one directory (`key` from the spool's
    /// root, `rel` from the scan's) among its listed `entries`.
    fn lend_here(
        &self,
        entries: &mut Vec<Entry>,
        key: &[u8],
        rel: &[u8],
        src: u16,
        filter: &Filter,
    ) -> Result<()> {
        let Some(lent) = &self.lent else {
            return Ok(());
        };
        let mut files = lent.of(key)?;
        files.retain_mut(|e| {
            if let Node::File(f) = &mut e.node {
                f.src = src;
            }
            !filter.excludes(&crate::tree::join(rel, &e.name), false)
        });
        if files.is_empty() {
            return Ok(());
        }
        // Both sides are sorted by name; a name on disk (made by a later
        // layer, over the borrowed one) wins.
        let disk = std::mem::take(entries);
        let mut out = Vec::with_capacity(disk.len() + files.len());
        let (mut a, mut b) = (disk.into_iter().peekable(), files.into_iter().peekable());
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
        tree.root = self.root_of()?;
        let mut missing = None;
        tree.for_each_mut(&mut |p, e| {
            if !self.given(p, e) {
                missing = Some(p.to_vec());
            }
        });
        if let Some(p) = missing {
            return Err(self.not_written(&p));
        }
        let mut key = self.prefix.clone();
        self.lend(&mut tree.entries, &mut key, &mut Vec::new(), src, filter)?;
        Ok(tree)
    }

    /// A spool lists a directory at a time: its entries then carry what
    /// the stream gave, and the borrowed files are among them, as `scan`
    /// gives them.
    fn lists_by_directory(&self) -> bool {
        true
    }

    fn list(
        &self,
        fd: &DirFd,
        rel: &[u8],
        src: u16,
        filter: &Filter,
        reporter: &dyn Reporter,
    ) -> Result<Vec<Entry>> {
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
        self.lend_here(&mut entries, &self.full(rel), rel, src, filter)?;
        Ok(entries)
    }

    fn root_meta(&self, _: &Filter) -> Result<Meta> {
        self.root_of()
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

    fn root_meta(&self, filter: &Filter) -> Result<Meta> {
        self.spooled()?.root_meta(filter)
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
