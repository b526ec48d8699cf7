//! A tar reader for hostile input: ustar, old v7, GNU long names and links
//! (`L`/`K`), PAX extended headers (`path`, `linkpath`, `size`, `mtime`
//! with its fraction, `uid`, `gid`). It parses headers and hands out each
//! entry's data as a bounded stream; it never touches the filesystem and
//! never holds more than one header's extensions in memory.
//!
//! Every size is bounded before anything is allocated or read (`MAX_*`),
//! every header's checksum is checked, and a stream that ends anywhere but
//! after the end-of-archive block (inside a header, inside data, or after
//! the last entry without the end marker: a download cut at an entry's
//! boundary) is an error. Names are returned as the archive spells them:
//! the caller decides what a safe name is (`spool.rs`).

use std::io::{self, Read};

/// A tar block.
pub const BLOCK: usize = 512;
/// The longest name or link target accepted (GNU `L`/`K`, PAX `path`).
pub const MAX_NAME: usize = 64 << 10;
/// The largest PAX extended header accepted (local or global).
pub const MAX_PAX: u64 = 1 << 20;
/// The largest file accepted: far above any bundle or image layer, far
/// below what would overflow an offset.
pub const MAX_SIZE: u64 = 1 << 40;

/// What an entry is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink(Vec<u8>),
    /// A hard link to an earlier entry, by its name in the archive.
    Hardlink(Vec<u8>),
    /// A device, FIFO or an entry type packsync does not mirror: skipped.
    Other(&'static str),
}

/// One entry's header, extensions applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub path: Vec<u8>,
    pub kind: Kind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: (i64, u32),
    /// Bytes of data that follow (only a `File`'s are content).
    pub size: u64,
}

/// Whether `block` (at least `BLOCK` bytes) starts a tar archive: the
/// ustar magic, or a valid header checksum (old v7 archives).
pub fn looks_like_tar(block: &[u8]) -> bool {
    if block.len() < BLOCK {
        return false;
    }
    let b = &block[..BLOCK];
    if &b[257..262] == b"ustar" {
        return true;
    }
    !b.iter().all(|&x| x == 0) && checksum_ok(b)
}

/// Reads a tar stream entry by entry: `next` gives a header, then
/// `read_data` its data (what is left unread is skipped by the next `next`).
pub struct Reader<R> {
    r: R,
    /// Data bytes of the current entry not read yet, then its padding.
    left: u64,
    pad: u64,
    done: bool,
    /// Bytes consumed from `r`, for messages.
    offset: u64,
}

impl<R: Read> Reader<R> {
    pub fn new(r: R) -> Reader<R> {
        Reader {
            r,
            left: 0,
            pad: 0,
            done: false,
            offset: 0,
        }
    }

    pub fn into_inner(self) -> R {
        self.r
    }

    /// The next entry, or `None` after the end-of-archive block.
    pub fn next_entry(&mut self) -> io::Result<Option<Header>> {
        if self.done {
            return Ok(None);
        }
        self.skip_rest()?;
        let mut long_name: Option<Vec<u8>> = None;
        let mut long_link: Option<Vec<u8>> = None;
        let mut pax = Pax::default();
        loop {
            let mut block = [0u8; BLOCK];
            let at = self.offset;
            match self.fill(&mut block)? {
                0 => return Err(bad("the archive ends without its end-of-archive block")),
                n if n < BLOCK => {
                    return Err(bad(format!(
                        "the archive is truncated inside the header at byte {at}"
                    )))
                }
                _ => {}
            }
            if block.iter().all(|&b| b == 0) {
                if long_name.is_some() || long_link.is_some() || pax.any() {
                    return Err(bad(format!(
                        "an extended header at byte {at} is followed by the end of the archive"
                    )));
                }
                self.done = true;
                return Ok(None);
            }
            if !checksum_ok(&block) {
                return Err(bad(format!("bad header checksum at byte {at}")));
            }
            let size = number(&block[124..136], "size", at)?;
            if size > MAX_SIZE as i128 || size < 0 {
                return Err(bad(format!(
                    "the entry at byte {at} claims {size} bytes (at most {MAX_SIZE} accepted)"
                )));
            }
            let size = size as u64;
            let flag = block[156];
            match flag {
                b'L' | b'K' => {
                    let data = self.small_data(size, MAX_NAME as u64, "long name", at)?;
                    let name = until_nul(&data).to_vec();
                    if flag == b'L' {
                        long_name = Some(name);
                    } else {
                        long_link = Some(name);
                    }
                    continue;
                }
                b'x' => {
                    let data = self.small_data(size, MAX_PAX, "PAX header", at)?;
                    pax.parse(&data, at)?;
                    continue;
                }
                b'g' => {
                    // Global defaults (`git archive` writes its commit id
                    // here): checked for form, not applied.
                    let data = self.small_data(size, MAX_PAX, "PAX global header", at)?;
                    Pax::default().parse(&data, at)?;
                    continue;
                }
                b'V' => {
                    // A GNU volume label: not an entry.
                    self.begin_data(size);
                    self.skip_rest()?;
                    continue;
                }
                b'S' => return Err(bad(format!("GNU sparse file at byte {at} (not supported)"))),
                _ => {}
            }
            if pax.sparse {
                return Err(bad(format!("PAX sparse file at byte {at} (not supported)")));
            }
            let ustar = &block[257..263] == b"ustar\0";
            let path = match (pax.path.take(), long_name.take()) {
                (Some(p), _) | (None, Some(p)) => p,
                (None, None) => {
                    let name = until_nul(&block[0..100]);
                    let prefix = until_nul(&block[345..500]);
                    if ustar && !prefix.is_empty() {
                        let mut p = prefix.to_vec();
                        p.push(b'/');
                        p.extend_from_slice(name);
                        p
                    } else {
                        name.to_vec()
                    }
                }
            };
            let link = match (pax.linkpath.take(), long_link.take()) {
                (Some(l), _) | (None, Some(l)) => l,
                (None, None) => until_nul(&block[157..257]).to_vec(),
            };
            if path.len() > MAX_NAME || link.len() > MAX_NAME {
                return Err(bad(format!(
                    "the entry at byte {at} has a name longer than {MAX_NAME} bytes"
                )));
            }
            let size = pax.size.take().unwrap_or(size);
            if size > MAX_SIZE {
                return Err(bad(format!(
                    "the entry at byte {at} claims {size} bytes (at most {MAX_SIZE} accepted)"
                )));
            }
            let mode = (number(&block[100..108], "mode", at)? & 0o7777) as u32;
            let uid = match pax.uid.take() {
                Some(u) => u,
                None => id(number(&block[108..116], "uid", at)?, at)?,
            };
            let gid = match pax.gid.take() {
                Some(g) => g,
                None => id(number(&block[116..124], "gid", at)?, at)?,
            };
            let mtime = match pax.mtime.take() {
                Some(t) => t,
                None => {
                    let s = number(&block[136..148], "mtime", at)?;
                    let s = i64::try_from(s).map_err(|_| bad(format!("bad mtime at byte {at}")))?;
                    (s, 0)
                }
            };
            let kind = match flag {
                b'0' | 0 | b'7' if path.ends_with(b"/") => Kind::Dir,
                b'0' | 0 | b'7' => Kind::File,
                b'1' => Kind::Hardlink(link),
                b'2' => Kind::Symlink(link),
                b'3' => Kind::Other("character device"),
                b'4' => Kind::Other("block device"),
                b'5' | b'D' => Kind::Dir,
                b'6' => Kind::Other("FIFO"),
                _ => Kind::Other("tar entry of an unknown type"),
            };
            if path.is_empty() {
                return Err(bad(format!("an entry without a name at byte {at}")));
            }
            self.begin_data(size);
            return Ok(Some(Header {
                path,
                kind,
                mode,
                uid,
                gid,
                mtime,
                size,
            }));
        }
    }

    /// Read the current entry's data; `Ok(0)` once it is all read. A
    /// stream that ends before is an error.
    pub fn read_data(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 || buf.is_empty() {
            return Ok(0);
        }
        let want = (buf.len() as u64).min(self.left) as usize;
        let n = loop {
            match self.r.read(&mut buf[..want]) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        };
        if n == 0 {
            return Err(bad(format!(
                "the archive is truncated inside an entry's data at byte {}",
                self.offset
            )));
        }
        self.left -= n as u64;
        self.offset += n as u64;
        Ok(n)
    }

    fn begin_data(&mut self, size: u64) {
        self.left = size;
        self.pad = (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64;
    }

    /// Skip what is left of the current entry's data and its padding.
    fn skip_rest(&mut self) -> io::Result<()> {
        let mut sink = [0u8; 8192];
        while self.left > 0 {
            self.read_data(&mut sink)?;
        }
        while self.pad > 0 {
            let want = self.pad.min(sink.len() as u64) as usize;
            let n = self.fill(&mut sink[..want])?;
            if n < want {
                return Err(bad(format!(
                    "the archive is truncated inside padding at byte {}",
                    self.offset
                )));
            }
            self.pad -= n as u64;
        }
        Ok(())
    }

    /// The data of an extension header, at most `max` bytes.
    fn small_data(&mut self, size: u64, max: u64, what: &str, at: u64) -> io::Result<Vec<u8>> {
        if size > max {
            return Err(bad(format!(
                "the {what} at byte {at} claims {size} bytes (at most {max} accepted)"
            )));
        }
        self.begin_data(size);
        let mut data = vec![0u8; size as usize];
        let mut got = 0;
        while got < data.len() {
            got += self.read_data(&mut data[got..])?;
        }
        self.skip_rest()?;
        Ok(data)
    }

    /// Fill `buf` as far as the stream goes; the bytes read.
    fn fill(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut got = 0;
        while got < buf.len() {
            match self.r.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.offset += got as u64;
        Ok(got)
    }
}

/// Whether `e` says a block is no tar header (its checksum is wrong).
pub fn is_bad_header(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::InvalidData && e.to_string().starts_with("bad header checksum")
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

fn until_nul(b: &[u8]) -> &[u8] {
    match b.iter().position(|&c| c == 0) {
        Some(i) => &b[..i],
        None => b,
    }
}

/// The unsigned sum of the header with its checksum field as spaces
/// equals the field (some old writers summed signed bytes: also accepted).
fn checksum_ok(b: &[u8]) -> bool {
    let Ok(want) = number(&b[148..156], "checksum", 0) else {
        return false;
    };
    let (mut unsigned, mut signed) = (0i128, 0i128);
    for (i, &x) in b[..BLOCK].iter().enumerate() {
        let x = if (148..156).contains(&i) { b' ' } else { x };
        unsigned += x as i128;
        signed += x as i8 as i128;
    }
    want == unsigned || want == signed
}

/// A numeric field: octal text (spaces and NULs around it), or GNU's
/// base-256 (first byte 0x80, or 0xff for a negative number).
fn number(field: &[u8], what: &str, at: u64) -> io::Result<i128> {
    let invalid = || bad(format!("bad {what} field in the header at byte {at}"));
    if let Some(&first) = field.first() {
        if first & 0x80 != 0 {
            let negative = first == 0xff;
            let mut v: i128 = if negative { -1 } else { 0 };
            let mut bytes = field.iter().copied();
            let top = bytes.next().unwrap_or(0) & 0x7f;
            if !negative {
                v = top as i128;
            }
            for b in bytes {
                v = v.checked_mul(256).ok_or_else(invalid)?;
                v = if negative {
                    v.checked_add(b as i128 - 255).ok_or_else(invalid)?
                } else {
                    v.checked_add(b as i128).ok_or_else(invalid)?
                };
                if v.unsigned_abs() > u64::MAX as u128 {
                    return Err(invalid());
                }
            }
            return Ok(v);
        }
    }
    let text = until_nul(field);
    let text = trim(text);
    let mut v: i128 = 0;
    for &c in text {
        if !(b'0'..=b'7').contains(&c) {
            return Err(invalid());
        }
        v = v * 8 + (c - b'0') as i128;
    }
    Ok(v)
}

fn trim(mut b: &[u8]) -> &[u8] {
    while let [b' ', rest @ ..] = b {
        b = rest;
    }
    while let [rest @ .., b' ' | 0] = b {
        b = rest;
    }
    b
}

fn id(v: i128, at: u64) -> io::Result<u32> {
    u32::try_from(v).map_err(|_| bad(format!("bad owner id in the header at byte {at}")))
}

/// The keys of one PAX extended header that packsync uses.
#[derive(Default)]
struct Pax {
    path: Option<Vec<u8>>,
    linkpath: Option<Vec<u8>>,
    size: Option<u64>,
    mtime: Option<(i64, u32)>,
    uid: Option<u32>,
    gid: Option<u32>,
    sparse: bool,
}

impl Pax {
    fn any(&self) -> bool {
        self.path.is_some()
            || self.linkpath.is_some()
            || self.size.is_some()
            || self.mtime.is_some()
            || self.uid.is_some()
            || self.gid.is_some()
    }

    /// Records `LEN KEY=VALUE\n`, LEN counting the whole record.
    fn parse(&mut self, mut data: &[u8], at: u64) -> io::Result<()> {
        let invalid = || bad(format!("bad PAX header at byte {at}"));
        // Writers pad with NULs after the last record.
        while !data.is_empty() && data[0] != 0 {
            let sp = data
                .iter()
                .position(|&c| c == b' ')
                .filter(|&i| i > 0 && i <= 20)
                .ok_or_else(invalid)?;
            let len: usize = std::str::from_utf8(&data[..sp])
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(invalid)?;
            if len <= sp + 1 || len > data.len() || data[len - 1] != b'\n' {
                return Err(invalid());
            }
            let record = &data[sp + 1..len - 1];
            let eq = record.iter().position(|&c| c == b'=').ok_or_else(invalid)?;
            let (key, value) = (&record[..eq], &record[eq + 1..]);
            let text = || std::str::from_utf8(value).map_err(|_| invalid());
            match key {
                b"path" => self.path = Some(value.to_vec()),
                b"linkpath" => self.linkpath = Some(value.to_vec()),
                b"size" => self.size = Some(text()?.parse().map_err(|_| invalid())?),
                b"uid" => self.uid = Some(text()?.parse().map_err(|_| invalid())?),
                b"gid" => self.gid = Some(text()?.parse().map_err(|_| invalid())?),
                b"mtime" => self.mtime = Some(pax_time(text()?).ok_or_else(invalid)?),
                k if k.starts_with(b"GNU.sparse.") => self.sparse = true,
                _ => {}
            }
            data = &data[len..];
        }
        Ok(())
    }
}

/// `SECONDS[.FRACTION]`, possibly negative, to the nanosecond.
fn pax_time(s: &str) -> Option<(i64, u32)> {
    let (neg, s) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    if whole.is_empty() || !whole.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    if !frac.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let secs: i64 = whole.parse().ok()?;
    let mut ns: u32 = 0;
    for (i, c) in frac.bytes().take(9).enumerate() {
        ns += (c - b'0') as u32 * 10u32.pow(8 - i as u32);
    }
    if !neg {
        return Some((secs, ns));
    }
    // -1.25 is 1.25 s before the epoch: (-2, 0.75 s).
    if ns == 0 {
        Some((secs.checked_neg()?, 0))
    } else {
        Some((secs.checked_neg()?.checked_sub(1)?, 1_000_000_000 - ns))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A ustar header for `name` (a builder for hand-made, hostile archives).
    pub fn header(name: &[u8], flag: u8, size: u64, link: &[u8]) -> [u8; BLOCK] {
        let mut b = [0u8; BLOCK];
        b[..name.len()].copy_from_slice(name);
        b[100..107].copy_from_slice(b"0000644");
        b[108..115].copy_from_slice(b"0001750");
        b[116..123].copy_from_slice(b"0001750");
        let sz = format!("{size:011o}");
        b[124..124 + sz.len()].copy_from_slice(sz.as_bytes());
        b[136..147].copy_from_slice(b"14000000000");
        b[156] = flag;
        b[157..157 + link.len()].copy_from_slice(link);
        b[257..263].copy_from_slice(b"ustar\0");
        b[263..265].copy_from_slice(b"00");
        seal(&mut b);
        b
    }

    /// Write the header's checksum.
    pub fn seal(b: &mut [u8; BLOCK]) {
        b[148..156].copy_from_slice(b"        ");
        let sum: u32 = b.iter().map(|&x| x as u32).sum();
        let s = format!("{sum:06o}\0 ");
        b[148..156].copy_from_slice(s.as_bytes());
    }

    /// One PAX record, `LEN KEY=VALUE\n`.
    pub fn pax(k: &str, v: &str) -> Vec<u8> {
        let base = k.len() + v.len() + 3;
        let mut len = base + 1;
        while len != base + len.to_string().len() {
            len = base + len.to_string().len();
        }
        format!("{len} {k}={v}\n").into_bytes()
    }

    /// An archive of (header, data) pairs and the end blocks.
    pub fn archive(entries: &[([u8; BLOCK], &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (h, data) in entries {
            out.extend_from_slice(h);
            out.extend_from_slice(data);
            out.resize(out.len().div_ceil(BLOCK) * BLOCK, 0);
        }
        out.extend_from_slice(&[0u8; 2 * BLOCK]);
        out
    }

    fn read_all(bytes: &[u8]) -> io::Result<Vec<(Header, Vec<u8>)>> {
        let mut r = Reader::new(bytes);
        let mut out = Vec::new();
        while let Some(h) = r.next_entry()? {
            let mut data = Vec::new();
            let mut buf = [0u8; 100];
            loop {
                let n = r.read_data(&mut buf)?;
                if n == 0 {
                    break;
                }
                data.extend_from_slice(&buf[..n]);
            }
            out.push((h, data));
        }
        Ok(out)
    }

    #[test]
    fn entries_and_their_data_are_read_in_order() {
        let a = archive(&[
            (header(b"d/", b'5', 0, b""), b""),
            (header(b"d/f", b'0', 5, b""), b"hello"),
            (header(b"d/l", b'2', 0, b"f"), b""),
            (header(b"d/h", b'1', 0, b"d/f"), b""),
            (header(b"fifo", b'6', 0, b""), b""),
        ]);
        let got = read_all(&a).unwrap();
        assert_eq!(got.len(), 5);
        assert_eq!(got[0].0.kind, Kind::Dir);
        assert_eq!(
            (got[1].0.path.as_slice(), got[1].1.as_slice()),
            (&b"d/f"[..], &b"hello"[..])
        );
        assert_eq!(got[1].0.mode, 0o644);
        assert_eq!(got[1].0.uid, 1000);
        assert_eq!(got[1].0.mtime, (0o14000000000, 0));
        assert_eq!(got[2].0.kind, Kind::Symlink(b"f".to_vec()));
        assert_eq!(got[3].0.kind, Kind::Hardlink(b"d/f".to_vec()));
        assert_eq!(got[4].0.kind, Kind::Other("FIFO"));
    }

    #[test]
    fn pax_and_gnu_long_names_override_the_header() {
        let long = vec![b'n'; 300];
        let mut recs = Vec::new();
        recs.extend(pax("path", &("p/".to_string() + &"x".repeat(200))));
        recs.extend(pax("mtime", "1700000000.123456789"));
        recs.extend(pax("uid", "4000000000"));
        let a = archive(&[
            (
                header(b"././@LongLink", b'L', long.len() as u64, b""),
                &long,
            ),
            (header(b"short", b'0', 1, b""), b"1"),
            (header(b"pax", b'x', recs.len() as u64, b""), &recs),
            (header(b"ignored", b'0', 2, b""), b"22"),
        ]);
        let got = read_all(&a).unwrap();
        assert_eq!(got[0].0.path, long);
        assert_eq!(
            got[1].0.path,
            ("p/".to_string() + &"x".repeat(200)).as_bytes()
        );
        assert_eq!(got[1].0.mtime, (1_700_000_000, 123_456_789));
        assert_eq!(got[1].0.uid, 4_000_000_000);
        assert_eq!(got[1].1, b"22");
    }

    #[test]
    fn the_ustar_prefix_is_joined() {
        let mut h = header(b"name", b'0', 0, b"");
        h[345..351].copy_from_slice(b"prefix");
        seal(&mut h);
        let got = read_all(&archive(&[(h, b"")])).unwrap();
        assert_eq!(got[0].0.path, b"prefix/name");
    }

    #[test]
    fn hostile_streams_are_errors() {
        let good = archive(&[(header(b"f", b'0', 600, b""), &[7u8; 600])]);
        // Cut inside the header, inside the data, before the end blocks.
        for cut in [100, 512 + 10, 512 + 1024] {
            let e = read_all(&good[..cut]).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{cut}: {e}");
        }
        let mut bad_sum = header(b"f", b'0', 0, b"");
        bad_sum[0] = b'g';
        assert!(read_all(&archive(&[(bad_sum, b"")]))
            .unwrap_err()
            .to_string()
            .contains("checksum"));
        let mut huge = header(b"f", b'0', 0, b"");
        huge[124..136].copy_from_slice(&[0x80, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0, 0]);
        seal(&mut huge);
        let e = read_all(&archive(&[(huge, b"")])).unwrap_err();
        assert!(
            e.to_string().contains("claims 1152921504606846976 bytes"),
            "{e}"
        );
        let long = archive(&[(header(b"L", b'L', 1 << 30, b""), b"")]);
        assert!(read_all(&long)
            .unwrap_err()
            .to_string()
            .contains("long name"));
    }

    #[test]
    fn pax_times_keep_the_nanosecond_and_the_sign() {
        assert_eq!(pax_time("12"), Some((12, 0)));
        assert_eq!(pax_time("12.5"), Some((12, 500_000_000)));
        assert_eq!(pax_time("1.1234567899"), Some((1, 123_456_789)));
        assert_eq!(pax_time("-1.25"), Some((-2, 750_000_000)));
        assert_eq!(pax_time("x"), None);
        assert_eq!(pax_time("1.x"), None);
    }

    #[test]
    fn detection_needs_a_header() {
        let a = archive(&[(header(b"f", b'0', 0, b""), b"")]);
        assert!(looks_like_tar(&a));
        let mut v7 = header(b"f", b'0', 0, b"");
        v7[257..265].fill(0);
        seal(&mut v7);
        assert!(looks_like_tar(&v7));
        assert!(!looks_like_tar(&[0u8; BLOCK]));
        assert!(!looks_like_tar(&[b'x'; BLOCK]));
    }
}
