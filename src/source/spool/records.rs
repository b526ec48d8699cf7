//! The spool's records: each spooled file's metadata and SHA-256
//! (`Metas`) and each directory's metadata (`DirMetas`), kept on disk
//! beside the spool, not in memory.

use std::hash::BuildHasher;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use anyhow::{Context, Result};

use crate::escape::c_style;
use crate::sys::{self, DirFd};
use crate::tree::{Meta, Time};
use crate::xattr::Set;

/// A file's metadata and content hash, as its entry gave them.
#[derive(Clone, Copy, Debug)]
pub(super) struct FileMeta {
    pub(super) hash: [u8; 32],
    pub(super) mode: u32,
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) mtime: Time,
    pub(super) xattrs: Set,
}

/// Every spooled file's metadata and hash, kept on disk beside the spool
/// (`spool/<name>.meta` in this writer's staging directory) as records of
/// `RECORD` bytes, not in memory, so that a spool of any size costs no
/// memory per file. A file's record is the one whose number the file
/// carries as its mtime in the spool (whole seconds, which every volume
/// keeps; the stage gives it its real times), and names the file's inode:
/// a record of another inode is no record of it.
pub(super) struct Metas {
    /// The records' file, written in order and read at offsets.
    pub(super) fd: OwnedFd,
    pub(super) read: OwnedFd,
    pub(super) next: u64,
    /// Records not written yet (`flush`: at `BATCH`, and when the spool is
    /// filled, before any is read).
    pub(super) pending: Vec<u8>,
}

/// Bytes of records written, or read for one directory, at once.
const BATCH: usize = 64 * 1024;

const RECORD: usize = 72;

impl Metas {
    pub(super) fn new(at: &DirFd, name: &[u8]) -> Result<Metas> {
        let (fd, read) = records_file(at, name, b".meta")?;
        Ok(Metas {
            fd,
            read,
            next: 0,
            pending: Vec::new(),
        })
    }

    /// Record `m` for the spooled file `file` (open), and number it.
    pub(super) fn put(&mut self, file: BorrowedFd<'_>, m: &FileMeta) -> io::Result<()> {
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

    pub(super) fn flush(&mut self) -> io::Result<()> {
        sys::write_all(self.fd.as_fd(), &self.pending)?;
        self.pending.clear();
        Ok(())
    }

    /// The number a file whose mtime in the spool is `at` carries.
    pub(super) fn number(&self, at: Time) -> Option<u64> {
        u64::try_from(at.s)
            .ok()
            .filter(|&n| n < self.next && at.ns == 0)
    }

    /// Records `from..to` read at once (`None` where the file is short).
    pub(super) fn read(&self, from: u64, to: u64) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; ((to - from) as usize) * RECORD];
        let got = read_at(self.read.as_fd(), &mut buf, from * RECORD as u64).ok()?;
        (got == buf.len()).then_some(buf)
    }

    /// The record of the file whose mtime in the spool is `at`, if it
    /// names inode `ino`.
    pub(super) fn get(&self, at: Time, ino: u64) -> Option<FileMeta> {
        let n = self.number(at)?;
        decode(&self.read(n, n + 1)?, ino)
    }

    /// `get` for each of one directory's files (`None` for an entry that
    /// is no file), their records read in one piece where they lie
    /// together, as the files of one directory of an archive do.
    pub(super) fn get_all(&self, wants: &[Option<(Time, u64)>]) -> Vec<Option<FileMeta>> {
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

/// Every spooled directory's metadata (as its entry gave it, or the
/// default a directory no entry names gets), kept on disk beside the spool
/// (`spool/<name>.dirs`) as records of its path and metadata, written in
/// order: a path's newest record is the one that holds. Every directory
/// the spool makes gets a record as it is made, so a directory removed
/// and made again never reads its old one. In memory only where each
/// path's newest record lies, by a hash of the path (`index`), and the
/// paths whose hash another path took first (`collided`): a record is
/// read back only with its path equal to the one asked for.
pub(super) struct DirMetas {
    fd: OwnedFd,
    read: OwnedFd,
    /// Bytes written to `fd`; `pending` follows them.
    written: u64,
    pending: Vec<u8>,
    hasher: std::hash::RandomState,
    index: std::collections::HashMap<u64, u64>,
    collided: std::collections::BTreeMap<Vec<u8>, u64>,
    /// Every path given one hash, so that `collided` is tried.
    #[cfg(test)]
    one_hash: bool,
}

/// A directory's record: path length, mode, uid, gid, size, mtime (s,
/// ns), extended attributes, whether an entry named it; then the path.
const DIR_HEAD: usize = 41;

impl DirMetas {
    pub(super) fn new(at: &DirFd, name: &[u8]) -> Result<DirMetas> {
        let (fd, read) = records_file(at, name, b".dirs")?;
        Ok(DirMetas {
            fd,
            read,
            written: 0,
            pending: Vec::new(),
            hasher: std::hash::RandomState::new(),
            index: Default::default(),
            collided: Default::default(),
            #[cfg(test)]
            one_hash: false,
        })
    }

    fn hash(&self, path: &[u8]) -> u64 {
        #[cfg(test)]
        if self.one_hash {
            return 7;
        }
        self.hasher.hash_one(path)
    }

    /// Where the next record goes: a layer's records are those from here
    /// on (`made_since`).
    pub(super) fn end(&self) -> u64 {
        self.written + self.pending.len() as u64
    }

    /// Record `m` for the directory at `path`; `named`: an entry gave it
    /// (not made as the parent of one).
    pub(super) fn put(&mut self, path: &[u8], m: &Meta, named: bool) -> io::Result<()> {
        let at = self.end();
        let len = u32::try_from(path.len()).map_err(|_| io::Error::other("path too long"))?;
        let mut r = [0u8; DIR_HEAD];
        r[0..4].copy_from_slice(&len.to_le_bytes());
        r[4..8].copy_from_slice(&m.mode.to_le_bytes());
        r[8..12].copy_from_slice(&m.uid.to_le_bytes());
        r[12..16].copy_from_slice(&m.gid.to_le_bytes());
        r[16..24].copy_from_slice(&m.size.to_le_bytes());
        r[24..32].copy_from_slice(&m.mtime.s.to_le_bytes());
        r[32..36].copy_from_slice(&m.mtime.ns.to_le_bytes());
        r[36..40].copy_from_slice(&m.xattrs.number().to_le_bytes());
        r[40] = named.into();
        let h = self.hash(path);
        if let Some(o) = self.collided.get_mut(path) {
            *o = at;
        } else {
            match self.index.get(&h).copied() {
                None => {
                    self.index.insert(h, at);
                }
                Some(o) if self.record(o)?.0 == path => {
                    self.index.insert(h, at);
                }
                Some(_) => {
                    self.collided.insert(path.to_vec(), at);
                }
            }
        }
        self.pending.extend_from_slice(&r);
        self.pending.extend_from_slice(path);
        if self.pending.len() >= BATCH {
            self.flush()?;
        }
        Ok(())
    }

    pub(super) fn flush(&mut self) -> io::Result<()> {
        sys::write_all(self.fd.as_fd(), &self.pending)?;
        self.written += self.pending.len() as u64;
        self.pending.clear();
        Ok(())
    }

    /// The record at `at`: its path, metadata and whether an entry named it.
    fn record(&self, at: u64) -> io::Result<(Vec<u8>, Meta, bool)> {
        let short = || io::Error::other("the spool's directory records are short");
        let mut buf;
        let r: &[u8] = if at >= self.written {
            let i = usize::try_from(at - self.written).map_err(|_| short())?;
            self.pending.get(i..).ok_or_else(short)?
        } else {
            // The head and most paths in one read.
            buf = vec![0u8; DIR_HEAD + 256];
            let got = read_at(self.read.as_fd(), &mut buf, at)?;
            if got < DIR_HEAD {
                return Err(short());
            }
            let len = u32::from_le_bytes(buf[0..4].try_into().expect("4 bytes")) as usize;
            let want = DIR_HEAD + len;
            if got < want {
                buf.resize(want, 0);
                if read_at(self.read.as_fd(), &mut buf[got..], at + got as u64)? < want - got {
                    return Err(short());
                }
            }
            &buf
        };
        let u32_at = |i: usize| u32::from_le_bytes(r[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(r[i..i + 8].try_into().expect("8 bytes"));
        if r.len() < DIR_HEAD || r.len() < DIR_HEAD + u32_at(0) as usize {
            return Err(short());
        }
        let meta = Meta {
            mode: u32_at(4),
            uid: u32_at(8),
            gid: u32_at(12),
            size: u64_at(16),
            mtime: Time {
                s: u64_at(24) as i64,
                ns: u32_at(32),
            },
            xattrs: Set::from_number(u32_at(36)).ok_or_else(short)?,
        };
        let path = r[DIR_HEAD..DIR_HEAD + u32_at(0) as usize].to_vec();
        Ok((path, meta, r[40] != 0))
    }

    /// The newest record of `path` (where it lies, the metadata, whether
    /// an entry named it), if it has one.
    fn newest(&self, path: &[u8]) -> io::Result<Option<(u64, Meta, bool)>> {
        let at = match self.collided.get(path) {
            Some(&o) => o,
            None => match self.index.get(&self.hash(path)) {
                Some(&o) => o,
                None => return Ok(None),
            },
        };
        let (p, meta, named) = self.record(at)?;
        Ok((p == path).then_some((at, meta, named)))
    }

    /// The metadata of the directory at `path`, if it has a record.
    pub(super) fn get(&self, path: &[u8]) -> io::Result<Option<Meta>> {
        Ok(self.newest(path)?.map(|(_, m, _)| m))
    }

    /// Whether an entry named the directory at `path` at or after the
    /// record `since` (`end` when a layer began).
    pub(super) fn named_since(&self, path: &[u8], since: u64) -> io::Result<bool> {
        Ok(self
            .newest(path)?
            .is_some_and(|(at, _, named)| named && at >= since))
    }
}

/// The records' file `<name><suffix>` made in `at` (the spool's parent),
/// and opened again to be read at offsets.
fn records_file(at: &DirFd, name: &[u8], suffix: &[u8]) -> Result<(OwnedFd, OwnedFd)> {
    let mut file = name.to_vec();
    file.extend_from_slice(suffix);
    let fd = at
        .create_excl(&file)
        .with_context(|| format!("cannot create the spool's record {}", c_style(&file)))?;
    let read = at
        .open_read(&file)
        .with_context(|| format!("cannot open the spool's record {}", c_style(&file)))?;
    Ok((fd, read))
}

/// `pread` until `buf` is full or the file ends: the bytes read.
fn read_at(fd: BorrowedFd<'_>, buf: &mut [u8], at: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match sys::pread(fd, &mut buf[got..], at + got as u64)? {
            0 => break,
            k => got += k,
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(mode: u32, s: i64) -> Meta {
        Meta {
            mode,
            uid: 3,
            gid: 4,
            mtime: Time { s, ns: 5 },
            ..Meta::default()
        }
    }

    /// The newest record of each path, whether written or still pending,
    /// and whether the paths' hashes differ or are all one.
    #[test]
    fn a_path_reads_its_newest_record_only() {
        for one_hash in [false, true] {
            let t = tempfile::tempdir().unwrap();
            let mut d = DirMetas::new(&DirFd::open_path(t.path()).unwrap(), b"0").unwrap();
            d.one_hash = one_hash;
            let long = vec![b'x'; 600];
            d.put(b"", &meta(0o700, 1), true).unwrap();
            d.put(b"a", &meta(0o755, 2), false).unwrap();
            d.put(&long, &meta(0o711, 3), true).unwrap();
            d.flush().unwrap();
            let layer = d.end();
            d.put(b"a", &meta(0o750, 4), true).unwrap();
            d.put(b"a/b", &meta(0o755, 5), false).unwrap();
            for pending in [true, false] {
                if !pending {
                    d.flush().unwrap();
                }
                assert_eq!(d.get(b"").unwrap(), Some(meta(0o700, 1)));
                assert_eq!(d.get(b"a").unwrap(), Some(meta(0o750, 4)));
                assert_eq!(d.get(&long).unwrap(), Some(meta(0o711, 3)));
                assert_eq!(d.get(b"a/b").unwrap(), Some(meta(0o755, 5)));
                assert_eq!(d.get(b"c").unwrap(), None);
                assert!(d.named_since(b"a", layer).unwrap());
                assert!(!d.named_since(b"a/b", layer).unwrap(), "made as a parent");
                assert!(!d.named_since(&long, layer).unwrap(), "named before");
                assert!(!d.named_since(b"c", 0).unwrap());
            }
            assert_eq!(d.collided.len(), if one_hash { 3 } else { 0 });
        }
    }
}
