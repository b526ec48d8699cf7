//! A tar reader for hostile input: ustar, old v7, GNU long names and links
//! (`L`/`K`), PAX extended headers (`x`, and Solaris/star `X`, which GNU
//! tar, bsdtar and Python's tarfile read as `x`: `path`, `linkpath`,
//! `size`, `mtime` with its fraction, `uid`, `gid`, `SCHILY.xattr.*`) and
//! PAX global headers (`g`: their `mtime`, `uid`, `gid` apply to every
//! later entry that does not set its own, as POSIX, GNU tar and tarfile
//! do; a global `path`, `linkpath` or `size` is refused, since the
//! reference readers disagree on it). It parses headers and hands out each
//! entry's data as a bounded stream; it never touches the filesystem and
//! never holds more than one header's extensions in memory.
//!
//! What an entry holds is what every reference reader extracts from it,
//! and where they disagree the archive is refused. A directory, symlink,
//! device or FIFO header carries no data whatever its ustar size field
//! says (GNU tar, bsdtar and tarfile all extract it so), nor does a
//! hardlink header in an archive without PAX headers. Refused: a PAX
//! `size` on any of those, and a sized hardlink once the archive has PAX
//! headers (bsdtar then reads data after it, the others do not). An entry
//! of an unknown type is a regular file, as GNU tar and bsdtar extract it;
//! a `M` continuation or a Solaris ACL `A`, which they do not agree on, is
//! refused. (`tar -t` differs: GNU tar's listing skips a sized symlink's
//! "data", its extraction does not.)
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
    /// A device or FIFO: skipped.
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
    /// Extended attributes (`SCHILY.xattr.NAME`), in the archive's order.
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// The type flag of an entry of an unknown type, read as a file.
    pub unknown_type: Option<u8>,
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
    /// What PAX global headers set so far.
    global: Pax,
    /// Whether a PAX header (`x`, `X` or `g`) came before: bsdtar then
    /// reads a sized hardlink's data.
    seen_pax: bool,
}

impl<R: Read> Reader<R> {
    pub fn new(r: R) -> Reader<R> {
        Reader {
            r,
            left: 0,
            pad: 0,
            done: false,
            offset: 0,
            global: Pax::default(),
            seen_pax: false,
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
                b'x' | b'X' => {
                    self.seen_pax = true;
                    let data = self.small_data(size, MAX_PAX, "PAX header", at)?;
                    pax.parse(&data, at)?;
                    continue;
                }
                b'g' => {
                    // Global defaults (`git archive` writes its commit id
                    // here), applied to every later entry.
                    self.seen_pax = true;
                    let data = self.small_data(size, MAX_PAX, "PAX global header", at)?;
                    let mut g = Pax::default();
                    g.parse(&data, at)?;
                    if let Some(key) = g.per_entry_key() {
                        return Err(bad(format!(
                            "the PAX global header at byte {at} sets {key} for every later \
                             entry (refused: GNU tar renames every entry, bsdtar ignores it)"
                        )));
                    }
                    self.global.overlay(g);
                    continue;
                }
                b'M' => {
                    return Err(bad(format!(
                        "a GNU multi-volume continuation at byte {at} (not supported)"
                    )))
                }
                b'A' => {
                    return Err(bad(format!(
                        "a Solaris ACL entry at byte {at} (not supported)"
                    )))
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
            if pax.sparse || self.global.sparse {
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
            let pax_size = pax.size.take();
            let size = pax_size.unwrap_or(size);
            if size > MAX_SIZE {
                return Err(bad(format!(
                    "the entry at byte {at} claims {size} bytes (at most {MAX_SIZE} accepted)"
                )));
            }
            let mode = (number(&block[100..108], "mode", at)? & 0o7777) as u32;
            let uid = match pax.uid.take().or(self.global.uid) {
                Some(u) => u,
                None => id(number(&block[108..116], "uid", at)?, at)?,
            };
            let gid = match pax.gid.take().or(self.global.gid) {
                Some(g) => g,
                None => id(number(&block[116..124], "gid", at)?, at)?,
            };
            let mtime = match pax.mtime.take().or(self.global.mtime) {
                Some(t) => t,
                None => {
                    let s = number(&block[136..148], "mtime", at)?;
                    let s = i64::try_from(s).map_err(|_| bad(format!("bad mtime at byte {at}")))?;
                    (s, 0)
                }
            };
            let mut unknown_type = None;
            let kind = match flag {
                b'0' | 0 | b'7' if path.ends_with(b"/") => Kind::Dir,
                b'0' | 0 | b'7' => Kind::File,
                b'1' => Kind::Hardlink(link),
                b'2' => Kind::Symlink(link),
                b'3' => Kind::Other("character device"),
                b'4' => Kind::Other("block device"),
                b'5' | b'D' => Kind::Dir,
                b'6' => Kind::Other("FIFO"),
                other => {
                    unknown_type = Some(other);
                    Kind::File
                }
            };
            if path.is_empty() {
                return Err(bad(format!("an entry without a name at byte {at}")));
            }
            // What follows the header: only a file carries data (and a GNU
            // dumpdir `D`, which lists names); other sizes are ignored as
            // GNU tar, bsdtar and tarfile ignore them, or refused where
            // they do not agree.
            let size = match (&kind, flag) {
                (Kind::Dir, b'D') | (Kind::File, _) => size,
                _ if size == 0 => 0,
                (Kind::Hardlink(_), _) if pax_size.is_none() && !self.seen_pax => 0,
                (Kind::Dir | Kind::Symlink(_) | Kind::Other(_), _) if pax_size.is_none() => 0,
                _ => {
                    let what = match &kind {
                        Kind::Dir => "directory",
                        Kind::Hardlink(_) => "hardlink",
                        Kind::Symlink(_) => "symlink",
                        Kind::Other(what) => what,
                        Kind::File => unreachable!(),
                    };
                    return Err(bad(format!(
                        "the {what} entry at byte {at} claims {size} bytes of data (refused: \
                         GNU tar, bsdtar and tarfile disagree on what follows it)"
                    )));
                }
            };
            self.begin_data(size);
            return Ok(Some(Header {
                path,
                kind,
                mode,
                uid,
                gid,
                mtime,
                size,
                xattrs: std::mem::take(&mut pax.xattrs),
                unknown_type,
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
            // Two's complement in the remaining 7 + 8n bits, as GNU tar
            // writes a time before 1970: bit 6 of the first byte is the sign.
            let mut v = (first & 0x7f) as i128;
            if first & 0x40 != 0 {
                v -= 0x80;
            }
            for &b in &field[1..] {
                v = v.checked_mul(256).ok_or_else(invalid)?;
                v = v.checked_add(b as i128).ok_or_else(invalid)?;
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
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// The most extended attributes one entry may carry.
const MAX_XATTRS: usize = 1024;

impl Pax {
    fn any(&self) -> bool {
        self.path.is_some()
            || self.linkpath.is_some()
            || self.size.is_some()
            || self.mtime.is_some()
            || self.uid.is_some()
            || self.gid.is_some()
            || !self.xattrs.is_empty()
    }

    /// A key that names one entry and so cannot be a global default.
    fn per_entry_key(&self) -> Option<&'static str> {
        if self.path.is_some() {
            Some("path")
        } else if self.linkpath.is_some() {
            Some("linkpath")
        } else if self.size.is_some() {
            Some("size")
        } else if !self.xattrs.is_empty() {
            Some("extended attributes")
        } else {
            None
        }
    }

    /// A later global header's keys replace an earlier one's.
    fn overlay(&mut self, later: Pax) {
        self.mtime = later.mtime.or(self.mtime);
        self.uid = later.uid.or(self.uid);
        self.gid = later.gid.or(self.gid);
        self.sparse |= later.sparse;
    }

    /// Records `LEN KEY=VALUE\n`, LEN counting the whole record; an error
    /// names the record that is bad and where the header starts.
    fn parse(&mut self, mut data: &[u8], at: u64) -> io::Result<()> {
        // Writers pad with NULs after the last record.
        while !data.is_empty() && data[0] != 0 {
            let invalid = || {
                let end = data.iter().position(|&c| c == b'\n').unwrap_or(data.len());
                bad(format!(
                    "bad PAX header at byte {at}: {}",
                    shown(&data[..end])
                ))
            };
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
            let invalid = || bad(format!("bad PAX header at byte {at}: {}", shown(record)));
            let eq = record.iter().position(|&c| c == b'=').ok_or_else(invalid)?;
            let (key, value) = (&record[..eq], &record[eq + 1..]);
            // GNU tar and bsdtar refuse a key with a NUL in it.
            if key.contains(&0) {
                return Err(invalid());
            }
            let text = || std::str::from_utf8(value).map_err(|_| invalid());
            match key {
                b"path" => self.path = Some(value.to_vec()),
                b"linkpath" => self.linkpath = Some(value.to_vec()),
                b"size" => self.size = Some(text()?.parse().map_err(|_| invalid())?),
                b"uid" => self.uid = Some(text()?.parse().map_err(|_| invalid())?),
                b"gid" => self.gid = Some(text()?.parse().map_err(|_| invalid())?),
                b"mtime" => self.mtime = Some(pax_time(text()?).ok_or_else(invalid)?),
                k if k.starts_with(b"GNU.sparse.") => self.sparse = true,
                k if k.starts_with(b"SCHILY.xattr.") && k.len() > 13 => {
                    let name = &k[13..];
                    // A later record of the same name wins, as in tar.
                    self.xattrs.retain(|(n, _)| n != name);
                    if self.xattrs.len() >= MAX_XATTRS {
                        return Err(bad(format!(
                            "the PAX header at byte {at} has more than {MAX_XATTRS} extended attributes"
                        )));
                    }
                    self.xattrs.push((name.to_vec(), value.to_vec()));
                }
                _ => {}
            }
            data = &data[len..];
        }
        Ok(())
    }
}

/// A record for an error line: printable, and at most about 64 bytes
/// (`mtime=1350…467a`).
fn shown(record: &[u8]) -> String {
    let text = crate::escape::c_style(record);
    let chars: Vec<char> = text.chars().collect();
    if chars.len() <= 64 {
        return text;
    }
    let head: String = chars[..40].iter().collect();
    let tail: String = chars[chars.len() - 20..].iter().collect();
    format!("{head}…{tail}")
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
    fn base_256_numbers_keep_their_sign() {
        // -1, -2 and -86400 (a day before 1970) as GNU tar writes them.
        let mut minus_one = [0xffu8; 12];
        assert_eq!(number(&minus_one, "mtime", 0).unwrap(), -1);
        minus_one[11] = 0xfe;
        assert_eq!(number(&minus_one, "mtime", 0).unwrap(), -2);
        let day = (-86400i64).to_be_bytes();
        let mut field = [0xffu8; 12];
        field[4..].copy_from_slice(&day);
        field[0] = 0xff;
        assert_eq!(number(&field, "mtime", 0).unwrap(), -86400);
        let mut big = [0u8; 12];
        big[0] = 0x80;
        big[11] = 5;
        assert_eq!(number(&big, "size", 0).unwrap(), 5);
        let mut h = header(b"old", b'0', 0, b"");
        h[136..148].copy_from_slice(&field);
        seal(&mut h);
        let got = read_all(&archive(&[(h, b"")])).unwrap();
        assert_eq!(got[0].0.mtime, (-86400, 0));
    }

    #[test]
    fn a_pax_key_with_a_nul_is_refused() {
        let rec = pax("SCHILY.xattr.null\0", "x");
        let a = archive(&[(header(b"P", b'x', rec.len() as u64, b""), &rec)]);
        assert!(names(&a)
            .unwrap_err()
            .starts_with("bad PAX header at byte 0: "));
    }

    #[test]
    fn pax_times_keep_the_nanosecond_and_the_sign() {
        assert_eq!(pax_time("12"), Some((12, 0)));
        assert_eq!(pax_time("12.5"), Some((12, 500_000_000)));
        assert_eq!(pax_time("1.1234567899"), Some((1, 123_456_789)));
        assert_eq!(pax_time("-1.25"), Some((-2, 750_000_000)));
        assert_eq!(pax_time("x"), None);
        assert_eq!(pax_time("1.x"), None);
        for t in [
            (-2, 750_000_000),
            (-1, 1),
            (0, 999_999_999),
            (7, 5),
            (-9, 0),
        ] {
            let text = crate::tree::Time::from(t).decimal();
            assert_eq!(pax_time(&text), Some(t), "{text}");
        }
    }

    /// The paths read, or the error.
    fn names(bytes: &[u8]) -> Result<Vec<String>, String> {
        read_all(bytes)
            .map(|v| {
                v.iter()
                    .map(|(h, _)| String::from_utf8_lossy(&h.path).into_owned())
                    .collect()
            })
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_directory_or_hardlink_size_field_carries_no_data() {
        // `d/` claims 1024 bytes; what follows is two headers, not data.
        let a = archive(&[
            (header(b"d/", b'5', 1024, b""), b""),
            (header(b"d/secret", b'0', 6, b""), b"SECRET"),
            (header(b"d/link", b'1', 255, b"d/secret"), b""),
            (header(b"d/after", b'0', 3, b""), b"aft"),
        ]);
        let got = read_all(&a).unwrap();
        let paths: Vec<&[u8]> = got.iter().map(|(h, _)| h.path.as_slice()).collect();
        assert_eq!(paths, [&b"d/"[..], b"d/secret", b"d/link", b"d/after"]);
        assert_eq!((got[0].0.size, got[2].0.size), (0, 0));
        assert_eq!(got[1].1, b"SECRET");
    }

    #[test]
    fn sizes_the_reference_readers_disagree_on_are_refused() {
        // A ustar size on a symlink or FIFO: no data, as all three extract.
        let a = archive(&[
            (header(b"s", b'2', 1024, b"t"), b""),
            (header(b"p", b'6', 512, b""), b""),
            (header(b"after", b'0', 1, b""), b"a"),
        ]);
        assert_eq!(names(&a).unwrap(), ["s", "p", "after"]);
        // A PAX size on one: bsdtar reads data after it, the others do not.
        let sz = pax("size", "512");
        let a = archive(&[
            (header(b"P", b'x', sz.len() as u64, b""), &sz),
            (header(b"s", b'2', 0, b"t"), b""),
        ]);
        let e = names(&a).unwrap_err();
        assert!(
            e.contains("symlink entry at byte 1024 claims 512 bytes"),
            "{e}"
        );
        // A sized hardlink after a PAX header: bsdtar reads data there.
        let m = pax("mtime", "1");
        let a = archive(&[
            (header(b"P", b'x', m.len() as u64, b""), &m),
            (header(b"f", b'0', 1, b""), b"1"),
            (header(b"h", b'1', 512, b"f"), b""),
        ]);
        assert!(names(&a)
            .unwrap_err()
            .contains("hardlink entry at byte 2048"));
        // A PAX size on a directory: bsdtar skips it, the others do not.
        let sz = pax("size", "512");
        let a = archive(&[
            (header(b"P", b'x', sz.len() as u64, b""), &sz),
            (header(b"d/", b'5', 0, b""), b""),
        ]);
        assert!(names(&a).unwrap_err().contains("directory entry"));
    }

    #[test]
    fn solaris_x_headers_are_pax_headers() {
        let mut recs = pax("path", "renamed");
        recs.extend(pax("mtime", "1234567890.5"));
        let a = archive(&[
            (header(b"PaxHeaders/x", b'X', recs.len() as u64, b""), &recs),
            (header(b"orig", b'0', 2, b""), b"hi"),
        ]);
        let got = read_all(&a).unwrap();
        assert_eq!(got[0].0.path, b"renamed");
        assert_eq!(got[0].0.mtime, (1_234_567_890, 500_000_000));
    }

    #[test]
    fn global_headers_apply_to_every_later_entry() {
        let mut g = pax("mtime", "1000000000");
        g.extend(pax("uid", "42"));
        g.extend(pax("comment", "a git commit id"));
        let local = pax("mtime", "1500000000");
        let a = archive(&[
            (header(b"pax_global_header", b'g', g.len() as u64, b""), &g),
            (header(b"one", b'0', 1, b""), b"1"),
            (header(b"P/two", b'x', local.len() as u64, b""), &local),
            (header(b"two", b'0', 1, b""), b"2"),
            (header(b"three", b'0', 1, b""), b"3"),
        ]);
        let got: Vec<(i64, u32)> = read_all(&a)
            .unwrap()
            .iter()
            .map(|(h, _)| (h.mtime.0, h.uid))
            .collect();
        assert_eq!(
            got,
            [
                (1_000_000_000, 42),
                (1_500_000_000, 42),
                (1_000_000_000, 42)
            ]
        );
        let gp = pax("path", "everything");
        let a = archive(&[
            (
                header(b"pax_global_header", b'g', gp.len() as u64, b""),
                &gp,
            ),
            (header(b"one", b'0', 1, b""), b"1"),
        ]);
        let e = names(&a).unwrap_err();
        assert!(e.contains("PAX global header at byte 0 sets path"), "{e}");
    }

    #[test]
    fn unknown_types_are_files_and_continuations_are_refused() {
        let a = archive(&[
            (header(b"u", b'Z', 5, b""), b"hello"),
            (header(b"after", b'0', 1, b""), b"a"),
        ]);
        let got = read_all(&a).unwrap();
        assert_eq!(got[0].0.kind, Kind::File);
        assert_eq!(got[0].0.unknown_type, Some(b'Z'));
        assert_eq!(got[0].1, b"hello");
        assert_eq!(got[1].0.path, b"after");
        let m = archive(&[(header(b"u", b'M', 5, b""), b"hello")]);
        assert!(names(&m).unwrap_err().contains("multi-volume"));
    }

    #[test]
    fn a_bad_pax_record_is_named() {
        let bad_time = pax("mtime", "1350244992.023960108467a");
        let a = archive(&[
            (header(b"P", b'x', bad_time.len() as u64, b""), &bad_time),
            (header(b"f", b'0', 0, b""), b""),
        ]);
        assert_eq!(
            names(&a).unwrap_err(),
            "bad PAX header at byte 0: mtime=1350244992.023960108467a"
        );
        let long = pax("uid", &"9".repeat(100));
        let a = archive(&[(header(b"P", b'x', long.len() as u64, b""), &long)]);
        let e = names(&a).unwrap_err();
        assert!(e.starts_with("bad PAX header at byte 0: uid=999"), "{e}");
        assert!(e.ends_with("…99999999999999999999"), "{e}");
        for (record, shown) in [
            (&b"13 no-equals\n"[..], "no-equals"),
            (b"12 no-equals\n", "12 no-equals"),
        ] {
            let a = archive(&[(header(b"P", b'x', record.len() as u64, b""), record)]);
            let e = names(&a).unwrap_err();
            assert_eq!(e, format!("bad PAX header at byte 0: {shown}"));
        }
    }

    #[test]
    fn xattrs_are_read_from_schily_records() {
        let mut recs = pax("SCHILY.xattr.user.note", "one");
        recs.extend(pax("SCHILY.xattr.security.capability", "\u{1}\u{2}"));
        recs.extend(pax("SCHILY.xattr.user.note", "two"));
        let a = archive(&[
            (header(b"P", b'x', recs.len() as u64, b""), &recs),
            (header(b"f", b'0', 0, b""), b""),
            (header(b"g", b'0', 0, b""), b""),
        ]);
        let got = read_all(&a).unwrap();
        assert_eq!(
            got[0].0.xattrs,
            [
                (b"security.capability".to_vec(), vec![1u8, 2]),
                (b"user.note".to_vec(), b"two".to_vec())
            ]
        );
        assert!(got[1].0.xattrs.is_empty());
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
