//! The spool's records: each spooled file's metadata and SHA-256, kept on
//! disk beside the spool, not in memory (`Metas`).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use anyhow::{Context, Result};

use crate::escape::c_style;
use crate::sys::{self, DirFd};
use crate::tree::Time;
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
