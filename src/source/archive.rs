//! The archive kind (a `.tar`, `.tar.gz`, `.tar.zst` FILE), told by what it
//! holds (`decode.rs`; the ustar magic, or an old v7 header's checksum, for
//! tar). Names do not matter: `bundle.tgz`, `layer` and `x.tar.gz` are read
//! by what they hold.
//!
//! Opening a FILE only sniffs it (exit 2 if it is no archive); its bytes are
//! read once, when the sync spools it (`spool.rs`), and hashed on the way:
//! the identity a generation records is the SHA-256 of the file as read.

use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

use crate::error;
use crate::report::Reporter;
use crate::sys;

use super::decode::{decoded, Format};
use super::spool::{Spool, Stream};
use super::tar;

/// A reader that hashes what passes through it.
pub struct Hashing<R> {
    pub inner: R,
    pub hash: Sha256,
    pub bytes: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}

/// A FILE holding an archive, sniffed when opened and read when spooled.
pub struct Archive {
    label: String,
    path: PathBuf,
    /// The file as opened (and sniffed): what is spooled is what was checked.
    file: std::sync::Mutex<Option<OwnedFd>>,
    subpath: Option<Vec<u8>>,
}

impl Archive {
    /// The archive `arg` names (`shown`: the SOURCE as written, `//PATH`
    /// included); exit 2 if it is not one.
    pub fn open(arg: &Path, shown: String, subpath: Option<Vec<u8>>) -> Result<Archive> {
        let usage = |why: String| error::usage(format!("{shown}: {why}"));
        let fd = sys::open_file_path(arg).map_err(|e| usage(format!("cannot read source: {e}")))?;
        // Enough for a compressed stream's first block to decompress.
        let mut head = vec![0u8; SNIFF];
        let mut got = 0;
        while got < head.len() {
            match sys::pread(std::os::fd::AsFd::as_fd(&fd), &mut head[got..], got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) => return Err(usage(format!("cannot read source: {e}"))),
            }
        }
        head.truncate(got);
        if !recognisable(&head) {
            return Err(usage(
                "source is not a directory or a recognisable archive".into(),
            ));
        }
        let path = sys::canonicalize(arg).with_context(|| format!("cannot resolve {shown}"))?;
        Ok(Archive {
            label: shown,
            path,
            file: std::sync::Mutex::new(Some(fd)),
            subpath,
        })
    }

    /// What a generation records for the archive whose SHA-256 is `hex`,
    /// and the `//PATH` taken (as an image's identity names it).
    fn identity_of(&self, hex: &str) -> String {
        match &self.subpath {
            Some(p) => format!(
                "{}@sha256:{hex}//{}",
                self.path.display(),
                crate::escape::percent(p)
            ),
            None => format!("{}@sha256:{hex}", self.path.display()),
        }
    }

    /// Whether the file holds the archive `recorded` names (the identity
    /// `fill` gives): its SHA-256, read through the descriptor opened,
    /// without unpacking anything. The sync is then up to date but for
    /// the drift check, as for an image tag on the same digest.
    pub fn unchanged_since(&self, recorded: &str) -> Result<bool> {
        if !recorded.starts_with(&format!("{}@sha256:", self.path.display())) {
            return Ok(false);
        }
        let file = self
            .file
            .lock()
            .map_err(|_| anyhow::anyhow!("{}: poisoned", self.label))?;
        let Some(fd) = file.as_ref() else {
            return Ok(false);
        };
        let mut hash = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut at = 0u64;
        loop {
            let n = sys::pread(std::os::fd::AsFd::as_fd(fd), &mut buf, at)
                .with_context(|| format!("{}: cannot read source", self.label))?;
            if n == 0 {
                break;
            }
            if let Some(sig) = sys::signals::pending() {
                return Err(error::Failure::Interrupted(sig).into());
            }
            hash.update(&buf[..n]);
            at += n as u64;
        }
        Ok(self.identity_of(&crate::escape::hex(&hash.finalize())) == recorded)
    }
}

/// How much of a FILE is read to tell what it holds.
const SNIFF: usize = 64 << 10;

/// Whether `head` (the start of a file) starts an archive: a tar
/// header, or a gzip/zstd stream whose first block decompresses to one.
fn recognisable(head: &[u8]) -> bool {
    match Format::sniff(head) {
        // A ustar magic in a file cut inside its first header: an archive,
        // truncated (the spool says so, exit 1).
        Format::Tar => tar::looks_like_tar(head) || head.get(257..262) == Some(b"ustar"),
        _ => {
            let mut r: &[u8] = head;
            let Ok((_, mut d)) = decoded(&mut r) else {
                return false;
            };
            let mut block = vec![0u8; tar::BLOCK];
            let mut got = 0;
            while got < block.len() {
                match d.read(&mut block[got..]) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got += n,
                }
            }
            // A first block that does not decompress from the bytes read
            // (a frame of one large block) is left for the spool to judge.
            got < tar::BLOCK || tar::looks_like_tar(&block)
        }
    }
}

impl Stream for Archive {
    fn label(&self) -> &str {
        &self.label
    }

    fn path(&self) -> Option<&Path> {
        Some(&self.path)
    }

    fn subpath(&self) -> Option<&[u8]> {
        self.subpath.as_deref()
    }

    fn fill(&self, spool: &mut Spool, reporter: &dyn Reporter) -> Result<String> {
        let fd = self
            .file
            .lock()
            .map_err(|_| anyhow::anyhow!("{}: spooled twice", self.label))?
            .take()
            .with_context(|| format!("{}: spooled twice", self.label))?;
        // A std::fs::File only as a reader of the descriptor sys opened.
        let mut r = Hashing {
            inner: std::fs::File::from(fd),
            hash: Sha256::new(),
            bytes: 0,
        };
        // Decompressed on a thread of its own while the spool writes, as a
        // bundle over HTTP is; the rest of the file is read to the end for
        // its hash.
        super::oci_fetch::pipelined(
            &mut r,
            &self.label,
            |h| std::io::copy(h, &mut std::io::sink()).map(|_| ()),
            |plain| spool.apply(plain, false, &self.label, reporter).map(|_| ()),
        )?;
        Ok(self.identity_of(&crate::escape::hex(&r.hash.finalize())))
    }
}
