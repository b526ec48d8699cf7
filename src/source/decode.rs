//! How any stream's format is told from its first bytes, and its bytes
//! decompressed: gzip (`1f 8b`, every member of a multi-member file), zstd
//! (`28 b5 2f fd`, or a skippable frame `5? 2a 4d 18` as pzstd writes
//! first, each frame's checksum checked), else tar, passed through. A leaf
//! of `source/`: archives, layers and spooled streams all read through it.

use std::io::{self, BufRead, Read};

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
