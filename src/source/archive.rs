//! The archive kind (a `.tar`, `.tar.gz`, `.tar.zst` FILE), and how any
//! stream's format is told from its first bytes: gzip (`1f 8b`), zstd
//! (`28 b5 2f fd`, or a skippable frame `5? 2a 4d 18` as pzstd writes
//! first), else tar (the ustar magic, or an old v7 header's checksum). Names do not matter: `bundle.tgz`, `layer` and `x.tar.gz`
//! are read by what they hold.
//!
//! Opening a FILE only sniffs it (exit 2 if it is no archive); its bytes are
//! read once, when the sync spools it (`spool.rs`), and hashed on the way:
//! the identity a generation records is the SHA-256 of the file as read.

use std::io::{self, BufRead, Read};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

use crate::error;
use crate::report::Reporter;
use crate::sys;

use super::spool::{Spool, Stream};
use super::tar;

/// What a stream holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Gzip,
    Zstd,
    Tar,
}

impl Format {
    /// The format of a stream starting with `head` (at least 4 bytes
    /// where the stream has them). Anything that is not gzip or zstd is
    /// taken for tar: the tar reader checks its first header.
    pub fn sniff(head: &[u8]) -> Format {
        if head.starts_with(&[0x1f, 0x8b]) {
            Format::Gzip
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd])
            || (head.len() >= 4 && head[0] & 0xf0 == 0x50 && head[1..4] == [0x2a, 0x4d, 0x18])
        {
            Format::Zstd
        } else {
            Format::Tar
        }
    }
}

/// How far the buffers reach: 64 KiB between the stream, the decoder and
/// the tar reader.
const BUF: usize = 64 << 10;

/// The decompressed bytes of `r`, in whichever format it turns out to be
/// (plain tar passes through).
pub fn decoded<'a>(r: &'a mut dyn Read) -> io::Result<(Format, Box<dyn Read + 'a>)> {
    let mut head = [0u8; 4];
    let mut got = 0;
    while got < head.len() {
        match r.read(&mut head[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let format = Format::sniff(&head[..got]);
    let chained = io::BufReader::with_capacity(BUF, io::Cursor::new(head[..got].to_vec()).chain(r));
    let out: Box<dyn Read + 'a> = match format {
        // Every member of a multi-member file (pigz, concatenated .gz).
        Format::Gzip => Box::new(Gzip::new(chained)),
        Format::Zstd => Box::new(Zstd::new(chained)),
        Format::Tar => Box::new(chained),
    };
    Ok((format, out))
}

/// A buffered reader that counts the bytes consumed from it.
struct Counted<R> {
    r: R,
    consumed: u64,
}

impl<R: BufRead> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.r.read(buf)?;
        self.consumed += n as u64;
        Ok(n)
    }
}

impl<R: BufRead> BufRead for Counted<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        self.r.fill_buf()
    }

    fn consume(&mut self, n: usize) {
        self.consumed += n as u64;
        self.r.consume(n)
    }
}

/// Every gzip member of a stream in turn (pigz, concatenated `.gz`), each
/// member's CRC and length checked. After the last member only NUL
/// padding may follow (tape blocks; GNU tar and bsdtar read past it too);
/// anything else is "data after the last gzip member at byte N".
pub struct Gzip<R: BufRead> {
    dec: Option<flate2::bufread::GzDecoder<Counted<R>>>,
}

impl<R: BufRead> Gzip<R> {
    pub fn new(r: R) -> Gzip<R> {
        let r = Counted { r, consumed: 0 };
        Gzip {
            dec: Some(flate2::bufread::GzDecoder::new(r)),
        }
    }
}

impl<R: BufRead> Read for Gzip<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            let Some(dec) = self.dec.as_mut() else {
                return Ok(0);
            };
            let n = dec.read(buf)?;
            if n > 0 {
                return Ok(n);
            }
            // One member ended: another, padding, or the end.
            let mut r = self.dec.take().expect("a decoder").into_inner();
            let next = r.fill_buf()?;
            match next.first() {
                None => return Ok(0),
                Some(0x1f) => self.dec = Some(flate2::bufread::GzDecoder::new(r)),
                Some(_) => {
                    let end = r.consumed;
                    loop {
                        let rest = r.fill_buf()?;
                        if rest.is_empty() {
                            return Ok(0);
                        }
                        if rest.iter().any(|&b| b != 0) {
                            return Err(io::Error::new(
                                io::ErrorKind::InvalidData,
                                format!("data after the last gzip member at byte {end}"),
                            ));
                        }
                        let n = rest.len();
                        r.consume(n);
                    }
                }
            }
        }
    }
}

/// Every zstd frame of a stream in turn (skippable frames skipped), each
/// frame's checksum checked where it has one.
pub struct Zstd<R> {
    r: R,
    dec: ruzstd::decoding::FrameDecoder,
    in_frame: bool,
}

impl<R: BufRead> Zstd<R> {
    pub fn new(r: R) -> Zstd<R> {
        Zstd {
            r,
            dec: ruzstd::decoding::FrameDecoder::new(),
            in_frame: false,
        }
    }
}

fn zstd_error(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("corrupt zstd data: {e}"),
    )
}

impl<R: BufRead> Read for Zstd<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use ruzstd::decoding::errors::{FrameDecoderError, ReadFrameHeaderError};
        use ruzstd::decoding::BlockDecodingStrategy;
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if !self.in_frame {
                if self.r.fill_buf()?.is_empty() {
                    return Ok(0);
                }
                match self.dec.reset(&mut self.r) {
                    Ok(()) => self.in_frame = true,
                    Err(FrameDecoderError::ReadFrameHeaderError(
                        ReadFrameHeaderError::SkipFrame { length, .. },
                    )) => {
                        let skipped =
                            io::copy(&mut (&mut self.r).take(length as u64), &mut io::sink())?;
                        if skipped < length as u64 {
                            return Err(zstd_error("truncated skippable frame"));
                        }
                        continue;
                    }
                    Err(e) => return Err(zstd_error(e)),
                }
            }
            while self.dec.can_collect() == 0 && !self.dec.is_finished() {
                self.dec
                    .decode_blocks(&mut self.r, BlockDecodingStrategy::UptoBlocks(1))
                    .map_err(zstd_error)?;
            }
            let n = self.dec.read(buf)?;
            if n > 0 {
                return Ok(n);
            }
            if self.dec.is_finished() && self.dec.can_collect() == 0 {
                if let Some(want) = self.dec.get_checksum_from_data() {
                    if self.dec.get_calculated_checksum() != Some(want) {
                        return Err(zstd_error("checksum mismatch"));
                    }
                }
                self.in_frame = false;
            }
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_told_by_their_first_bytes() {
        assert_eq!(Format::sniff(&[0x1f, 0x8b, 8, 0]), Format::Gzip);
        assert_eq!(Format::sniff(&[0x28, 0xb5, 0x2f, 0xfd]), Format::Zstd);
        assert_eq!(Format::sniff(b"data"), Format::Tar);
        assert_eq!(Format::sniff(b""), Format::Tar);
    }

    #[test]
    fn concatenated_gzip_members_are_one_stream() {
        use std::io::Write;
        let mut all = Vec::new();
        for part in [&b"first "[..], b"second"] {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(part).unwrap();
            all.extend(e.finish().unwrap());
        }
        let mut r: &[u8] = &all;
        let (f, mut d) = decoded(&mut r).unwrap();
        assert_eq!(f, Format::Gzip);
        let mut out = String::new();
        d.read_to_string(&mut out).unwrap();
        assert_eq!(out, "first second");
    }

    fn gz(part: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(part).unwrap();
        e.finish().unwrap()
    }

    fn all(bytes: &[u8]) -> io::Result<Vec<u8>> {
        let mut r: &[u8] = bytes;
        let (_, mut d) = decoded(&mut r)?;
        let mut out = Vec::new();
        d.read_to_end(&mut out)?;
        Ok(out)
    }

    #[test]
    fn data_after_the_last_gzip_member_is_named() {
        let member = gz(b"tar bytes");
        let mut garbage = member.clone();
        garbage.extend_from_slice(b"garbage\n");
        let e = all(&garbage).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("data after the last gzip member at byte {}", member.len())
        );
        // Tape padding (NULs) after the last member is read past.
        let mut padded = member.clone();
        padded.extend_from_slice(&[0u8; 10240]);
        assert_eq!(all(&padded).unwrap(), b"tar bytes");
    }

    #[test]
    fn a_zstd_stream_may_start_with_a_skippable_frame() {
        let frame = ruzstd::encoding::compress_to_vec(
            &b"tar bytes"[..],
            ruzstd::encoding::CompressionLevel::Fastest,
        );
        // What pzstd writes first: a skippable frame of 4 bytes.
        let mut s = vec![0x50, 0x2a, 0x4d, 0x18, 4, 0, 0, 0, 9, 0, 0, 0];
        s.extend_from_slice(&frame);
        assert_eq!(Format::sniff(&s), Format::Zstd);
        assert_eq!(all(&s).unwrap(), b"tar bytes");
        for magic in [0x5f, 0x55] {
            assert_eq!(Format::sniff(&[magic, 0x2a, 0x4d, 0x18]), Format::Zstd);
        }
        assert_eq!(Format::sniff(&[0x60, 0x2a, 0x4d, 0x18]), Format::Tar);
    }

    #[test]
    fn a_corrupt_gzip_stream_is_an_error() {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(&[5u8; 10000]).unwrap();
        let mut gz = e.finish().unwrap();
        let n = gz.len();
        gz[n - 6] ^= 0xff; // the CRC
        let mut r: &[u8] = &gz;
        let (_, mut d) = decoded(&mut r).unwrap();
        assert!(io::copy(&mut d, &mut io::sink()).is_err());
    }
}
