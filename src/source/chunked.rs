//! Fetching only what changed in a zstd:chunked layer. Such a layer is an
//! ordinary zstd stream (each file's content in frames of its own) that
//! ends in skippable frames holding a table of contents (the "TOC": every
//! entry's metadata, each file's SHA-256 and the byte range of its frames
//! in the blob). The image manifest (checked, and signed where
//! `--verify-key` asks) names the TOC's position and digest in the layer
//! descriptor's annotations: `io.github.containers.zstd-chunked.manifest-*`,
//! or the `io.containers.zstd-chunked.manifest-*` keys older writers
//! (buildah 1.28) use.
//!
//! An eStargz layer (containerd/stargz-snapshotter) is read the same way:
//! a gzip stream of one member per file chunk, whose last tar entry is the
//! TOC (`stargz.index.json`, its SHA-256 annotated as
//! `containerd.io/snapshot/stargz/toc.digest`), in a member of its own
//! that a 51-byte footer places. The footer and the TOC's member are
//! fetched by range and the TOC made to the shape of a zstd:chunked one
//! (`parse_stargz_toc`); from there both formats share everything below,
//! but for how a file's bytes decompress (`Format`).
//!
//! The TOC is fetched with one Range request, checked against the
//! annotated digest, decompressed to a bound and parsed to a bound, its
//! names checked as archive names are. Files whose content the live
//! generation already holds (by SHA-256) are read from there; only the
//! others' byte ranges are fetched (neighbours coalesced, a few requests
//! in flight), each decompressed and checked against its chunk digests and
//! the file's digest as it arrives. The layer is then applied as a tar
//! stream made from the TOC (`Layer`), through the same spool code that
//! applies a downloaded layer, so whiteouts, hardlinks and every refusal
//! stay where they are. Anything that does not check out before the spool
//! is touched (no TOC, a registry that ignores Range, a digest that
//! differs, a hostile name) is one line and the whole layer, as before.
//!
//! Nothing here writes: fetched content is held in memory, to a bound
//! (`MAX_HELD`); a layer needing more is fetched whole.

use std::collections::{HashMap, HashSet};
use std::io::{self, Read};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use anyhow::{anyhow, bail, Result};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::store::{short, Descriptor, Store};
use crate::escape::hex;
use crate::sys::DirFd;
use crate::tree::Node;

/// The annotations that place the TOC: current and older key names.
const POSITION_KEYS: [&str; 2] = [
    "io.github.containers.zstd-chunked.manifest-position",
    "io.containers.zstd-chunked.manifest-position",
];
const CHECKSUM_KEYS: [&str; 2] = [
    "io.github.containers.zstd-chunked.manifest-checksum",
    "io.containers.zstd-chunked.manifest-checksum",
];

/// The most a TOC may take, compressed and decompressed.
pub const MAX_TOC: u64 = 64 << 20;
/// The most fetched content held at once; a layer needing more is fetched whole.
const MAX_HELD: u64 = 256 << 20;
/// Ranges closer than this are fetched as one (the tar headers between files).
const GAP: u64 = 64 << 10;
/// The most one request asks for.
const MAX_REQUEST: u64 = 8 << 20;
/// Requests in flight at once.
const IN_FLIGHT: usize = 4;
/// A layer whose changed files take more than this share of it is fetched
/// whole: one stream is faster than many ranges.
const MOST: f64 = 0.5;

/// Where the TOC is and what digest it must have, from the annotations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Position {
    pub offset: u64,
    pub length: u64,
    pub uncompressed: u64,
    pub digest: String,
}

/// The TOC position a layer descriptor's annotations give: `None` for a
/// layer without them (no line), `Err` for annotations that are malformed
/// (the whole layer, said why).
pub fn position(desc: &Descriptor) -> Option<Result<Position, String>> {
    let a = desc.annotations.as_ref()?;
    let (pos, sum) = POSITION_KEYS
        .iter()
        .zip(CHECKSUM_KEYS)
        .find_map(|(p, c)| Some((a.get(*p)?, a.get(c))))?;
    Some((|| {
        let sum = sum.ok_or("the TOC's position is annotated, its checksum is not")?;
        let f: Vec<&str> = pos.split(':').collect();
        let num = |s: &str| -> Result<u64, String> {
            s.parse()
                .map_err(|_| format!("TOC position {pos:?} is malformed"))
        };
        if f.len() != 4 {
            return Err(format!("TOC position {pos:?} is malformed"));
        }
        if f[3] != "1" {
            return Err(format!("TOC of type {} is not known", f[3]));
        }
        let (offset, length, uncompressed) = (num(f[0])?, num(f[1])?, num(f[2])?);
        if length == 0 || offset.checked_add(length).is_none_or(|e| e > desc.size) {
            return Err(format!("TOC position {pos:?} lies outside the layer"));
        }
        if length > MAX_TOC || uncompressed > MAX_TOC {
            return Err(format!("the TOC is larger than {MAX_TOC} bytes"));
        }
        if !is_sha256(sum) {
            return Err(format!("TOC checksum {sum:?} is not a sha256 digest"));
        }
        Ok(Position {
            offset,
            length,
            uncompressed,
            digest: sum.clone(),
        })
    })())
}

fn is_sha256(s: &str) -> bool {
    s.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

fn sha256_bytes(s: &str) -> Option<[u8; 32]> {
    if !is_sha256(s) {
        return None;
    }
    let h = &s[7..];
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&h[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// What an entry of the TOC is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink(Vec<u8>),
    Hardlink(Vec<u8>),
    /// A device or FIFO: its tar type flag (the spool skips them).
    Special(u8, u64, u64),
}

/// One chunk of a file's content: where it lies in the file and its digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub at: u64,
    pub size: u64,
    pub digest: [u8; 32],
    /// Where its frames start in the blob.
    pub blob: u64,
}

/// One entry of a checked TOC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub name: Vec<u8>,
    pub kind: Kind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: (i64, u32),
    pub size: u64,
    pub xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// The content's SHA-256 (files of some content).
    pub digest: Option<[u8; 32]>,
    /// The compressed bytes of the content in the blob: `start..end`.
    pub range: (u64, u64),
    /// The chunks the content is cut into (none: one).
    pub chunks: Vec<Chunk>,
}

#[derive(Deserialize)]
struct RawToc {
    version: u64,
    entries: Vec<RawEntry>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawEntry {
    #[serde(rename = "type")]
    kind: String,
    name: String,
    #[serde(default)]
    link_name: String,
    #[serde(default)]
    mode: u64,
    #[serde(default)]
    size: u64,
    #[serde(default)]
    uid: u64,
    #[serde(default)]
    gid: u64,
    #[serde(default)]
    modtime: Option<String>,
    #[serde(default)]
    dev_major: u64,
    #[serde(default)]
    dev_minor: u64,
    #[serde(default)]
    xattrs: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default)]
    digest: String,
    #[serde(default)]
    offset: u64,
    #[serde(default)]
    end_offset: u64,
    #[serde(default)]
    chunk_size: u64,
    #[serde(default)]
    chunk_offset: u64,
    #[serde(default)]
    chunk_digest: String,
    #[serde(default)]
    chunk_type: String,
}

/// `name` as an entry name of the layer: `./` and a trailing `/` dropped;
/// empty, absolute, `..`, NUL or empty components refused.
fn checked_name(name: &str) -> Result<Vec<u8>> {
    let n = name.strip_prefix("./").unwrap_or(name);
    let n = n.strip_suffix('/').unwrap_or(n);
    if n.starts_with('/') {
        bail!("names the absolute path {name:?}");
    }
    if n.is_empty() || n.len() > 4096 {
        bail!("names an empty or overlong path {name:?}");
    }
    for c in n.split('/') {
        match c {
            "" | "." => bail!("names {name:?}, with an empty or \".\" component"),
            ".." => bail!("names {name:?}, which has a \"..\" component"),
            c if c.contains('\0') => bail!("names {name:?}, which holds a NUL"),
            _ => {}
        }
    }
    Ok(n.as_bytes().to_vec())
}

/// RFC 3339 as Go writes a time (`2006-01-02T15:04:05.999999999Z07:00`)
/// → seconds and nanoseconds since the epoch.
pub fn parse_time(t: &str) -> Option<(i64, u32)> {
    let b = t.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let n = |r: std::ops::Range<usize>| -> Option<i64> {
        let s = t.get(r)?;
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    let (y, mo, d, h, mi, s) = (
        n(0..4)?,
        n(5..7)?,
        n(8..10)?,
        n(11..13)?,
        n(14..16)?,
        n(17..19)?,
    );
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let mut rest = &t[19..];
    let mut ns = 0u32;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 9 {
            return None;
        }
        ns = frac[..digits].parse::<u32>().ok()? * 10u32.pow(9 - digits as u32);
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        // Bytes, not `str` ranges: a hostile TOC's offset may hold any
        // character, and a range inside one would panic.
        o if o.len() == 6
            && matches!(o.as_bytes()[0], b'+' | b'-')
            && o.as_bytes()[3] == b':'
            && [1, 2, 4, 5]
                .iter()
                .all(|&i| o.as_bytes()[i].is_ascii_digit()) =>
        {
            let hh: i64 = o.get(1..3)?.parse().ok()?;
            let mm: i64 = o.get(4..6)?.parse().ok()?;
            let v = hh * 3600 + mm * 60;
            if o.starts_with('-') {
                -v
            } else {
                v
            }
        }
        _ => return None,
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let (y2, m2) = if mo <= 2 {
        (y - 1, mo + 9)
    } else {
        (y, mo - 3)
    };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let doy = (153 * m2 + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    Some((days * 86400 + h * 3600 + mi * 60 + s - offset, ns))
}

/// Parse a decompressed TOC, bounded (`max_entries`), every name checked:
/// no absolute name, no `..`, no name reached through a symlink the layer
/// made, chunks that follow their file and tile it, byte ranges inside the
/// blob (`blob_size`). Errors say what is wrong in a few words.
pub fn parse_toc(bytes: &[u8], blob_size: u64, max_entries: u64) -> Result<Vec<Entry>> {
    entries_of(read_raw(bytes, max_entries)?, blob_size)
}

fn read_raw(bytes: &[u8], max_entries: u64) -> Result<RawToc> {
    let raw: RawToc = serde_json::from_slice(bytes).map_err(|e| anyhow!("not a TOC: {e}"))?;
    if raw.version != 1 && raw.version != 2 {
        bail!("TOC version {} is not known", raw.version);
    }
    if raw.entries.len() as u64 > max_entries {
        bail!("the TOC lists more than {max_entries} entries");
    }
    Ok(raw)
}

/// The checked entries of a TOC of either format (eStargz's made to
/// zstd:chunked's shape first, `parse_stargz_toc`).
fn entries_of(raw: RawToc, blob_size: u64) -> Result<Vec<Entry>> {
    let mut out: Vec<Entry> = Vec::with_capacity(raw.entries.len());
    let mut symlinks: HashSet<Vec<u8>> = HashSet::new();
    for r in raw.entries {
        let name = checked_name(&r.name)?;
        if r.kind == "chunk" {
            let Some(file) = out
                .last_mut()
                .filter(|f| f.name == name && f.kind == Kind::File)
            else {
                bail!("a chunk of {:?} follows no entry of that file", r.name);
            };
            add_chunk(file, &r, blob_size)?;
            continue;
        }
        // No part of the name may be a symlink this layer made.
        let mut at = 0;
        while let Some(i) = name[at..].iter().position(|&b| b == b'/') {
            if symlinks.contains(&name[..at + i]) {
                bail!("names {:?}, which lies through a symlink", r.name);
            }
            at += i + 1;
        }
        let link = || -> Result<Vec<u8>> {
            if r.link_name.is_empty() || r.link_name.contains('\0') {
                bail!("{:?} has an empty or invalid link target", r.name);
            }
            Ok(r.link_name.as_bytes().to_vec())
        };
        let kind = match r.kind.as_str() {
            "reg" => Kind::File,
            "dir" => Kind::Dir,
            "symlink" => Kind::Symlink(link()?),
            "hardlink" => Kind::Hardlink(checked_name(&r.link_name)?),
            "char" => Kind::Special(b'3', r.dev_major, r.dev_minor),
            "block" => Kind::Special(b'4', r.dev_major, r.dev_minor),
            "fifo" => Kind::Special(b'6', 0, 0),
            other => bail!("{:?} is of the unknown type {other:?}", r.name),
        };
        if matches!(kind, Kind::Symlink(_)) {
            symlinks.insert(name.clone());
        } else {
            symlinks.remove(&name);
        }
        let mtime = match &r.modtime {
            Some(t) => {
                parse_time(t).ok_or_else(|| anyhow!("{:?} has the bad time {t:?}", r.name))?
            }
            None => (0, 0),
        };
        let xattrs = match &r.xattrs {
            None => Vec::new(),
            Some(m) => m
                .iter()
                .map(|(k, v)| {
                    use base64::Engine;
                    let v = base64::engine::general_purpose::STANDARD
                        .decode(v)
                        .map_err(|_| anyhow!("{:?}: xattr {k:?} is not base64", r.name))?;
                    Ok((k.as_bytes().to_vec(), v))
                })
                .collect::<Result<_>>()?,
        };
        let too_big = |v: u64| v > u32::MAX as u64;
        if too_big(r.uid) || too_big(r.gid) {
            bail!("{:?} has an owner out of range", r.name);
        }
        let mut e = Entry {
            name,
            mode: (r.mode & 0o7777) as u32,
            uid: r.uid as u32,
            gid: r.gid as u32,
            mtime,
            size: 0,
            xattrs,
            digest: None,
            range: (0, 0),
            chunks: Vec::new(),
            kind,
        };
        if e.kind == Kind::File {
            e.size = r.size;
            if r.size > 0 {
                e.digest = Some(
                    sha256_bytes(&r.digest)
                        .ok_or_else(|| anyhow!("{:?} has no sha256 digest", r.name))?,
                );
                if r.offset >= r.end_offset || r.end_offset > blob_size {
                    bail!(
                        "{:?} has the bad byte range {}..{}",
                        r.name,
                        r.offset,
                        r.end_offset
                    );
                }
                e.range = (r.offset, r.end_offset);
                if !r.chunk_digest.is_empty() {
                    add_chunk(&mut e, &r, blob_size)?;
                }
            }
        }
        out.push(e);
    }
    for e in &out {
        if !e.chunks.is_empty() {
            let covered: u64 = e.chunks.iter().map(|c| c.size).sum();
            if covered != e.size {
                bail!(
                    "the chunks of {} cover {covered} of its {} bytes",
                    crate::escape::c_style(&e.name),
                    e.size
                );
            }
        }
    }
    Ok(out)
}

/// Add the chunk `r` describes to `file`: it must start where the last one
/// ended, in the file and in the blob.
fn add_chunk(file: &mut Entry, r: &RawEntry, blob_size: u64) -> Result<()> {
    if !r.chunk_type.is_empty() {
        bail!("{:?} has a chunk of type {:?}", r.name, r.chunk_type);
    }
    let digest = sha256_bytes(&r.chunk_digest)
        .ok_or_else(|| anyhow!("a chunk of {:?} has no sha256 digest", r.name))?;
    let at = file.chunks.last().map_or(0, |c| c.at + c.size);
    if r.chunk_offset != at || r.chunk_size == 0 {
        bail!("the chunks of {:?} do not follow each other", r.name);
    }
    // Older writers give a chunk its start only; newer ones its end too.
    // The content is checked by its digests: the ranges need only lie in
    // order inside the blob.
    let last = file.chunks.last().map(|c| c.blob);
    if last.is_none() && r.offset != file.range.0 {
        bail!(
            "the first chunk of {:?} is not where the file starts",
            r.name
        );
    }
    if last.is_some_and(|b| r.offset <= b || r.offset >= blob_size) {
        bail!("a chunk of {:?} has a bad byte range", r.name);
    }
    if r.end_offset != 0 {
        if r.end_offset <= r.offset || r.end_offset > blob_size {
            bail!("a chunk of {:?} has a bad byte range", r.name);
        }
        file.range.1 = file.range.1.max(r.end_offset);
    }
    if r.offset >= file.range.1 {
        bail!("a chunk of {:?} lies past the file's bytes", r.name);
    }
    file.chunks.push(Chunk {
        at,
        size: r.chunk_size,
        digest,
        blob: r.offset,
    });
    Ok(())
}

/// The eStargz layer annotation naming the SHA-256 of its TOC (the
/// uncompressed `stargz.index.json`).
pub const STARGZ_DIGEST_KEY: &str = "containerd.io/snapshot/stargz/toc.digest";
/// The tar entry an eStargz TOC is, the last of the layer.
pub const STARGZ_TOC_NAME: &[u8] = b"stargz.index.json";
/// An eStargz footer: an empty gzip member whose extra field (subfield
/// `SG`) holds the TOC member's offset as `%016xSTARGZ`.
pub const FOOTER: u64 = 51;

/// Whether a layer descriptor says its layer carries a TOC of either format.
pub fn has_toc(desc: &Descriptor) -> bool {
    position(desc).is_some() || stargz_digest(desc).is_some()
}

fn stargz_digest(desc: &Descriptor) -> Option<&String> {
    desc.annotations.as_ref()?.get(STARGZ_DIGEST_KEY)
}

/// The TOC member's offset an eStargz footer gives; `Err` for anything
/// that is not such a footer.
pub fn parse_footer(b: &[u8]) -> Result<u64, String> {
    let bad = || "the last 51 bytes are not an eStargz footer".to_string();
    if b.len() as u64 != FOOTER {
        return Err(bad());
    }
    // ID1 ID2 CM=deflate FLG=FEXTRA, MTIME, XFL, OS; XLEN=26; SI1 SI2 LEN=22.
    if b[..4] != [0x1f, 0x8b, 8, 4] || b[10..12] != [26, 0] || &b[12..14] != b"SG" {
        return Err(bad());
    }
    if b[14..16] != [22, 0] || &b[32..38] != b"STARGZ" {
        return Err(bad());
    }
    // An empty final stored block, a CRC and size of zero.
    if b[38..43] != [1, 0, 0, 0xff, 0xff] || b[43..].iter().any(|&x| x != 0) {
        return Err(bad());
    }
    let hex = std::str::from_utf8(&b[16..32]).map_err(|_| bad())?;
    if !hex.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(bad());
    }
    u64::from_str_radix(hex, 16).map_err(|_| bad())
}

/// Parse an eStargz TOC (`stargz.index.json`) whose member starts at
/// `toc_offset`: each file's and chunk's gzip member ends where the next
/// one (or the TOC) starts, which the TOC leaves unsaid; a chunk of size 0
/// is the whole file. Then checked as a zstd:chunked TOC is.
pub fn parse_stargz_toc(bytes: &[u8], toc_offset: u64, max_entries: u64) -> Result<Vec<Entry>> {
    let mut raw = read_raw(bytes, max_entries)?;
    let holds = |r: &RawEntry| (r.kind == "reg" && r.size > 0) || r.kind == "chunk";
    let mut starts: Vec<u64> = raw
        .entries
        .iter()
        .filter(|r| holds(r))
        .map(|r| r.offset)
        .collect();
    starts.push(toc_offset);
    starts.sort_unstable();
    starts.dedup();
    for r in raw.entries.iter_mut() {
        if !r.chunk_type.is_empty() || r.end_offset != 0 {
            bail!("{:?} has fields an eStargz TOC does not have", r.name);
        }
        if !holds(r) {
            continue;
        }
        // Past the TOC, no end: the range checks refuse it.
        let next = starts.partition_point(|&o| o <= r.offset);
        r.end_offset = starts.get(next).copied().unwrap_or(u64::MAX);
        if r.kind == "reg" && r.chunk_size == 0 {
            r.chunk_size = r.size;
        }
    }
    entries_of(raw, toc_offset)
}

/// The decompressed TOC member of an eStargz layer: the tar entry
/// `stargz.index.json` and the end of the archive. Returns that entry (the
/// layer's last, published as a full fetch publishes it) and its content.
pub fn stargz_toc_entry(member: &[u8]) -> Result<(Entry, Vec<u8>)> {
    use super::tar::Kind as T;
    let mut r = super::tar::Reader::new(member);
    let h = r
        .next_entry()
        .map_err(|e| anyhow!("the TOC member: {e}"))?
        .ok_or_else(|| anyhow!("the TOC member holds no entry"))?;
    if h.path != STARGZ_TOC_NAME || h.kind != T::File || h.unknown_type.is_some() {
        bail!(
            "the TOC member holds {}, not stargz.index.json",
            crate::escape::c_style(&h.path)
        );
    }
    if h.size > MAX_TOC {
        bail!("the TOC is larger than {MAX_TOC} bytes");
    }
    let mut json = vec![0u8; h.size as usize];
    let mut got = 0;
    while got < json.len() {
        match r.read_data(&mut json[got..]) {
            Ok(0) => bail!("the TOC member ends inside the TOC"),
            Ok(n) => got += n,
            Err(e) => bail!("the TOC member: {e}"),
        }
    }
    if !matches!(r.next_entry(), Ok(None)) {
        bail!("the TOC member holds more than the TOC");
    }
    let e = Entry {
        name: h.path,
        kind: Kind::File,
        mode: h.mode,
        uid: h.uid,
        gid: h.gid,
        mtime: h.mtime,
        size: h.size,
        xattrs: h.xattrs,
        digest: Some(Sha256::digest(&json).into()),
        range: (0, 0),
        chunks: Vec::new(),
    };
    Ok((e, json))
}

/// Decompress `bytes` (gzip members) to exactly `size` bytes; what follows
/// in the last member (tar padding, the next headers) is not read.
fn ungzip(bytes: &[u8], size: u64) -> io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(size.min(MAX_HELD) as usize);
    super::decode::Gzip::new(bytes)
        .take(size)
        .read_to_end(&mut out)?;
    Ok(out)
}

/// How a TOC layer's content is compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// zstd:chunked: a file's frames hold exactly its content.
    Zstd,
    /// eStargz: a file's gzip members start with its content.
    Gzip,
}

/// Decompress `bytes` (zstd frames) to at most `max` bytes.
fn unzstd(bytes: &[u8], max: u64) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    super::decode::Zstd::new(bytes)
        .take(max + 1)
        .read_to_end(&mut out)?;
    if out.len() as u64 > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("decompresses to more than {max} bytes"),
        ));
    }
    Ok(out)
}

/// The live generation's files by content: where each SHA-256 is found.
pub struct Donor {
    live: DirFd,
    by_hash: HashMap<[u8; 32], Vec<u8>>,
    /// Where the spool may list live files instead of holding them
    /// (`Spool::lend`): the live single-link files by path, and the spool
    /// path the live root stands for (the `//PATH`). `None`: every file's
    /// bytes go into the spool.
    lend: Option<(ByPath, Vec<u8>)>,
}

/// Live files by path.
type ByPath = HashMap<Vec<u8>, crate::tree::Entry>;

impl Donor {
    /// From the live tree (as its manifest records it) and its root; with
    /// `lend` (the spool path the live root stands for), files may be
    /// listed from there instead of copied (`Plan::lent`).
    pub fn of(index: &crate::index::Index, live: DirFd, lend: Option<&[u8]>) -> Result<Donor> {
        let mut by_hash = HashMap::new();
        let mut by_path = HashMap::new();
        index.walk(&mut |path, e| {
            if let Node::File(f) = &e.node {
                if let Some(h) = f.hash {
                    by_hash.entry(h).or_insert_with(|| path.to_vec());
                    if lend.is_some() && f.group.is_none() {
                        by_path.insert(path.to_vec(), e.clone());
                    }
                }
            }
        })?;
        let lend = lend.map(|p| {
            let p: Vec<&[u8]> = p
                .split(|&b| b == b'/')
                .filter(|c| !c.is_empty() && *c != b".")
                .collect();
            (by_path, p.join(&b'/'))
        });
        Ok(Donor {
            live,
            by_hash,
            lend,
        })
    }

    /// The live root, for `Spool::lend`.
    pub fn live(&self) -> &DirFd {
        &self.live
    }

    /// The spool path the live root stands for, where files may be lent.
    pub fn prefix(&self) -> Option<&[u8]> {
        self.lend.as_ref().map(|(_, p)| &p[..])
    }

    /// The live entry at the spool path of `e`, where its content and
    /// metadata are the layer's: the spool may list it instead of holding it.
    fn same_at_path(&self, e: &Entry) -> Option<crate::tree::Entry> {
        let (by_path, prefix) = self.lend.as_ref()?;
        let rel = if prefix.is_empty() {
            &e.name[..]
        } else {
            e.name.strip_prefix(&prefix[..])?.strip_prefix(b"/")?
        };
        let live = by_path.get(rel)?;
        let Node::File(f) = &live.node else {
            return None;
        };
        let m = &live.meta;
        let same = f.hash == e.digest
            && m.size == e.size
            && m.mode == e.mode
            && (m.uid, m.gid) == (e.uid, e.gid)
            && (m.mtime.s, m.mtime.ns) == e.mtime
            && m.xattrs.is_empty()
            && e.xattrs.is_empty();
        same.then(|| live.clone())
    }

    fn has(&self, hash: &[u8; 32]) -> bool {
        self.by_hash.contains_key(hash)
    }

    /// The live file with `hash`, open, and its path; `None` where it is gone.
    fn open(&self, hash: &[u8; 32]) -> Option<(std::fs::File, &[u8])> {
        let path = self.by_hash.get(hash)?;
        let (dir, name) = match path.iter().rposition(|&b| b == b'/') {
            Some(i) => (self.live.open_beneath(&path[..i]).ok()?, &path[i + 1..]),
            None => (self.live.try_clone().ok()?, &path[..]),
        };
        let fd = dir.open_read(name).ok()?;
        Some((crate::sys::reader(fd), path))
    }

    /// The content of the live file with `hash`, checked: `None` where it
    /// is gone or differs now (it is fetched then).
    fn read(&self, hash: &[u8; 32], size: u64) -> Option<Vec<u8>> {
        let (file, _) = self.open(hash)?;
        let mut out = Vec::with_capacity(size.min(MAX_HELD) as usize);
        file.take(size + 1).read_to_end(&mut out).ok()?;
        (out.len() as u64 == size && Sha256::digest(&out)[..] == hash[..]).then_some(out)
    }
}

/// What a layer with a checked TOC costs: its entries, what is fetched.
pub struct Plan {
    pub entries: Vec<Entry>,
    pub format: Format,
    /// Content in hand already, by entry index.
    pub held: HashMap<usize, Vec<u8>>,
    /// Entry indexes whose content is fetched.
    pub fetch: Vec<usize>,
    /// Files the spool lists from the live generation (`Spool::lend`), by
    /// spool path, and their entry indexes (the layer sends zeros for them).
    pub lent: HashMap<Vec<u8>, crate::tree::Entry>,
    pub lent_at: HashSet<usize>,
    /// Bytes of content read from the live generation.
    pub reused_bytes: u64,
}

/// Why a layer is fetched whole after all: `quiet` where that is the
/// ordinary case (no TOC, little to reuse), else one line.
pub struct Whole {
    pub why: Option<String>,
}

fn whole(why: impl Into<String>) -> Whole {
    Whole {
        why: Some(why.into()),
    }
}

/// A checked TOC: its entries, how their content is compressed, and the
/// content of entries already in hand (eStargz's own TOC entry).
struct Toc {
    entries: Vec<Entry>,
    format: Format,
    held: HashMap<usize, Vec<u8>>,
}

/// `len` bytes of `layer` from `at`, with one Range request.
fn read_range(
    store: &dyn Store,
    layer: &Descriptor,
    at: u64,
    len: u64,
    fetched: &(dyn Fn(u64) + Sync),
    what: &str,
) -> Result<Vec<u8>, Whole> {
    let raw = match store.blob_range(layer, at, len) {
        Ok(Some(r)) => r,
        Ok(None) => return Err(whole("the registry does not answer Range requests")),
        Err(e) => return Err(whole(format!("{e:#}"))),
    };
    let mut out = Vec::new();
    if let Err(e) = raw.take(len).read_to_end(&mut out) {
        return Err(whole(format!("reading {what}: {e}")));
    }
    fetched(out.len() as u64);
    if out.len() as u64 != len {
        return Err(whole(format!("{what} is cut short")));
    }
    Ok(out)
}

/// The TOC of a zstd:chunked layer, where `pos` places it.
fn zstd_toc(
    store: &dyn Store,
    layer: &Descriptor,
    pos: Position,
    max_entries: u64,
    fetched: &(dyn Fn(u64) + Sync),
) -> Result<Toc, Whole> {
    let compressed = read_range(store, layer, pos.offset, pos.length, fetched, "the TOC")?;
    let got = format!("sha256:{}", hex(&Sha256::digest(&compressed)));
    if got != pos.digest {
        return Err(whole(format!(
            "the TOC's digest is {}, the annotation says {}",
            short(&got),
            short(&pos.digest)
        )));
    }
    let toc = unzstd(&compressed, MAX_TOC).map_err(|e| whole(format!("the TOC: {e}")))?;
    if toc.len() as u64 != pos.uncompressed {
        return Err(whole(format!(
            "the TOC is {} bytes, the annotation says {}",
            toc.len(),
            pos.uncompressed
        )));
    }
    let entries =
        parse_toc(&toc, layer.size, max_entries).map_err(|e| whole(format!("the TOC {e:#}")))?;
    Ok(Toc {
        entries,
        format: Format::Zstd,
        held: HashMap::new(),
    })
}

/// The TOC of an eStargz layer: the footer (the last 51 bytes) places the
/// TOC's gzip member, which runs to the footer; its content must have
/// the annotated digest.
fn stargz_toc(
    store: &dyn Store,
    layer: &Descriptor,
    digest: &str,
    max_entries: u64,
    fetched: &(dyn Fn(u64) + Sync),
) -> Result<Toc, Whole> {
    if !is_sha256(digest) {
        return Err(whole(format!(
            "TOC digest {digest:?} is not a sha256 digest"
        )));
    }
    let Some(footer_at) = layer.size.checked_sub(FOOTER) else {
        return Err(whole("the layer is too small to end in an eStargz footer"));
    };
    let footer = read_range(store, layer, footer_at, FOOTER, fetched, "the footer")?;
    let at = parse_footer(&footer).map_err(whole)?;
    if at >= footer_at {
        return Err(whole(format!(
            "the footer places the TOC at {at}, outside the layer's {footer_at} bytes before it"
        )));
    }
    let len = footer_at - at;
    if len > MAX_TOC {
        return Err(whole(format!("the TOC is larger than {MAX_TOC} bytes")));
    }
    let member = read_range(store, layer, at, len, fetched, "the TOC")?;
    let mut plain = Vec::new();
    let read = super::decode::Gzip::new(&member[..])
        .take(MAX_TOC + 4096)
        .read_to_end(&mut plain);
    if let Err(e) = read {
        return Err(whole(format!("the TOC: {e}")));
    }
    let (entry, json) = stargz_toc_entry(&plain).map_err(|e| whole(format!("{e:#}")))?;
    let got = format!("sha256:{}", hex(&Sha256::digest(&json)));
    if got != digest {
        return Err(whole(format!(
            "the TOC's digest is {}, the annotation says {}",
            short(&got),
            short(digest)
        )));
    }
    let mut entries =
        parse_stargz_toc(&json, at, max_entries).map_err(|e| whole(format!("the TOC {e:#}")))?;
    if entries.iter().any(|e| e.name == STARGZ_TOC_NAME) {
        return Err(whole("the TOC names stargz.index.json itself"));
    }
    entries.push(entry);
    let held = HashMap::from([(entries.len() - 1, json)]);
    Ok(Toc {
        entries,
        format: Format::Gzip,
        held,
    })
}

/// Read and check the TOC of `layer`, and decide what to fetch.
pub fn plan(
    store: &dyn Store,
    layer: &Descriptor,
    donor: &Donor,
    max_entries: u64,
    fetched: &(dyn Fn(u64) + Sync),
) -> Result<Plan, Whole> {
    let toc = match (position(layer), stargz_digest(layer)) {
        (None, None) => return Err(Whole { why: None }),
        _ if !store.serves_ranges() => return Err(Whole { why: None }),
        (Some(Err(why)), _) => return Err(whole(why)),
        (Some(Ok(p)), _) => zstd_toc(store, layer, p, max_entries, fetched)?,
        (None, Some(d)) => stargz_toc(store, layer, d, max_entries, fetched)?,
    };
    let Toc {
        entries,
        format,
        held,
    } = toc;
    let mut fetch = Vec::new();
    let (mut lent, mut lent_at) = (HashMap::new(), HashSet::new());
    let mut seen: HashSet<&[u8]> = HashSet::new();
    let (mut fetch_bytes, mut reused_bytes, mut content) = (0u64, 0u64, 0u64);
    for (i, e) in entries.iter().enumerate() {
        let first = seen.insert(&e.name);
        let Some(d) = e.digest.as_ref() else { continue };
        content += e.size;
        if held.contains_key(&i) {
            continue;
        }
        if let Some(live) = first.then(|| donor.same_at_path(e)).flatten() {
            reused_bytes += e.size;
            lent.insert(e.name.clone(), live);
            lent_at.insert(i);
        } else if donor.has(d) {
            reused_bytes += e.size;
        } else {
            fetch.push(i);
            fetch_bytes += e.range.1 - e.range.0;
        }
    }
    let holding: u64 = fetch.iter().map(|&i| entries[i].size).sum();
    if reused_bytes == 0 || fetch_bytes as f64 > MOST * layer.size as f64 || holding > MAX_HELD {
        let _ = content;
        return Err(Whole { why: None });
    }
    Ok(Plan {
        entries,
        format,
        held,
        fetch,
        lent,
        lent_at,
        reused_bytes,
    })
}

/// Runs of neighbouring entries fetched with one request each:
/// `(start, end, entry indexes)`.
fn coalesce(entries: &[Entry], wanted: &[usize]) -> Vec<(u64, u64, Vec<usize>)> {
    let mut order: Vec<usize> = wanted.to_vec();
    order.sort_by_key(|&i| entries[i].range.0);
    let mut runs: Vec<(u64, u64, Vec<usize>)> = Vec::new();
    for i in order {
        let (a, b) = entries[i].range;
        match runs.last_mut() {
            Some(r) if a >= r.1 && a - r.1 <= GAP && b - r.0 <= MAX_REQUEST => {
                r.1 = b;
                r.2.push(i);
            }
            _ => runs.push((a, b, vec![i])),
        }
    }
    runs
}

/// Decompress one file's frames and check them: its size, each chunk's
/// digest as it completes, the whole file's digest.
fn check_content(e: &Entry, compressed: &[u8], format: Format) -> Result<Vec<u8>, String> {
    let name = crate::escape::c_style(&e.name);
    let data = match format {
        Format::Zstd => unzstd(compressed, e.size),
        Format::Gzip => ungzip(compressed, e.size),
    }
    .map_err(|err| format!("{name}: {err}"))?;
    if data.len() as u64 != e.size {
        return Err(format!(
            "{name}: its frames hold {} bytes, the TOC says {}",
            data.len(),
            e.size
        ));
    }
    for c in &e.chunks {
        let part = &data[c.at as usize..(c.at + c.size) as usize];
        if Sha256::digest(part)[..] != c.digest[..] {
            return Err(format!(
                "{name}: the chunk at {} does not match its digest",
                c.at
            ));
        }
    }
    if Some(&Sha256::digest(&data)[..]) != e.digest.as_ref().map(|d| &d[..]) {
        return Err(format!("{name}: the content does not match its digest"));
    }
    Ok(data)
}

/// Fetch the content `plan` needs, `IN_FLIGHT` requests at a time, each
/// file checked as its range arrives. The first failure ends the rest.
pub fn fetch(
    store: &dyn Store,
    layer: &Descriptor,
    plan: &Plan,
    fetched: &(dyn Fn(u64) + Sync),
) -> Result<HashMap<usize, Vec<u8>>, Whole> {
    let runs = coalesce(&plan.entries, &plan.fetch);
    let next = AtomicUsize::new(0);
    let failed: Mutex<Option<String>> = Mutex::new(None);
    let got: Mutex<HashMap<usize, Vec<u8>>> = Mutex::new(HashMap::new());
    let bytes = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..IN_FLIGHT.min(runs.len()) {
            s.spawn(|| loop {
                if failed.lock().unwrap().is_some() {
                    return;
                }
                let Some((a, b, which)) = runs.get(next.fetch_add(1, Ordering::SeqCst)) else {
                    return;
                };
                let res = (|| -> Result<(), String> {
                    let mut body = match store.blob_range(layer, *a, b - a) {
                        Ok(Some(r)) => r,
                        Ok(None) => {
                            return Err("the registry stopped answering Range requests".into())
                        }
                        Err(e) => return Err(format!("{e:#}")),
                    };
                    let mut run = Vec::with_capacity((b - a) as usize);
                    (&mut body)
                        .take(b - a)
                        .read_to_end(&mut run)
                        .map_err(|e| format!("bytes {a}-{}: {e}", b - 1))?;
                    fetched(run.len() as u64);
                    bytes.fetch_add(run.len() as u64, Ordering::Relaxed);
                    for &i in which {
                        let e = &plan.entries[i];
                        let part = &run[(e.range.0 - a) as usize..(e.range.1 - a) as usize];
                        let data = check_content(e, part, plan.format)?;
                        got.lock().unwrap().insert(i, data);
                    }
                    Ok(())
                })();
                if let Err(why) = res {
                    failed.lock().unwrap().get_or_insert(why);
                    return;
                }
            });
        }
    });
    if let Some(why) = failed.into_inner().unwrap() {
        return Err(whole(why));
    }
    Ok(got.into_inner().unwrap())
}

/// The layer as a tar stream made from its TOC: headers from the entries,
/// content from what was fetched or from the live generation (checked
/// again as it is read; a live file that changed since is fetched now).
pub struct Layer<'a> {
    plan: Plan,
    got: HashMap<usize, Vec<u8>>,
    donor: &'a Donor,
    store: &'a dyn Store,
    layer: &'a Descriptor,
    fetched: &'a (dyn Fn(u64) + Sync),
    at: usize,
    buf: Vec<u8>,
    pos: usize,
    ended: bool,
    /// Content as it streams (a large live file, or the zeros sent for a
    /// lent one), then its padding.
    streaming: Option<(Box<dyn Read + 'a>, usize)>,
}

/// Content read from the live generation as it streams, checked against
/// its size and SHA-256 at its end (a file this large is not held whole).
struct Streaming {
    file: std::fs::File,
    left: u64,
    hasher: Sha256,
    want: [u8; 32],
    path: Vec<u8>,
}

impl Read for Streaming {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let room = out.len().min(self.left.min(1 << 20) as usize);
        let n = self.file.read(&mut out[..room])?;
        self.left -= n as u64;
        self.hasher.update(&out[..n]);
        let changed = || {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} of the live generation changed while it was read",
                    crate::escape::c_style(&self.path)
                ),
            )
        };
        if n == 0 {
            return Err(changed());
        }
        if self.left == 0 && self.hasher.clone().finalize()[..] != self.want[..] {
            return Err(changed());
        }
        Ok(n)
    }
}

/// Live files larger than this are streamed into the layer, not read first.
const INLINE: u64 = 16 << 20;

impl<'a> Layer<'a> {
    pub fn new(
        plan: Plan,
        got: HashMap<usize, Vec<u8>>,
        donor: &'a Donor,
        store: &'a dyn Store,
        layer: &'a Descriptor,
        fetched: &'a (dyn Fn(u64) + Sync),
    ) -> Layer<'a> {
        let mut plan = plan;
        let mut got = got;
        got.extend(std::mem::take(&mut plan.held));
        Layer {
            plan,
            got,
            donor,
            store,
            layer,
            fetched,
            at: 0,
            buf: Vec::new(),
            pos: 0,
            ended: false,
            streaming: None,
        }
    }

    /// The files the spool is to list from the live generation
    /// (`Spool::lend`), taken once before the layer is applied.
    pub fn take_lent(&mut self) -> HashMap<Vec<u8>, crate::tree::Entry> {
        std::mem::take(&mut self.plan.lent)
    }

    /// A large file's content, streamed from the live generation.
    fn stream(&self, i: usize) -> Option<Streaming> {
        let e = &self.plan.entries[i];
        if e.kind != Kind::File || e.size <= INLINE || self.got.contains_key(&i) {
            return None;
        }
        let want = e.digest?;
        let (file, path) = self.donor.open(&want)?;
        Some(Streaming {
            file,
            left: e.size,
            hasher: Sha256::new(),
            want,
            path: path.to_vec(),
        })
    }

    /// The content of entry `i`.
    fn content(&mut self, i: usize) -> io::Result<Vec<u8>> {
        if let Some(d) = self.got.remove(&i) {
            return Ok(d);
        }
        let e = &self.plan.entries[i];
        let Some(hash) = e.digest else {
            return Ok(Vec::new());
        };
        if let Some(d) = self.donor.read(&hash, e.size) {
            return Ok(d);
        }
        let (a, b) = e.range;
        let bad = |why: String| io::Error::new(io::ErrorKind::InvalidData, why);
        let mut body = self
            .store
            .blob_range(self.layer, a, b - a)
            .map_err(|err| bad(format!("{err:#}")))?
            .ok_or_else(|| bad("the registry stopped answering Range requests".into()))?;
        let mut run = Vec::new();
        (&mut body).take(b - a).read_to_end(&mut run)?;
        (self.fetched)(run.len() as u64);
        check_content(e, &run, self.plan.format).map_err(bad)
    }

    fn fill(&mut self) -> io::Result<()> {
        self.buf.clear();
        self.pos = 0;
        if self.at == self.plan.entries.len() {
            if !self.ended {
                self.buf.resize(1024, 0);
                self.ended = true;
            }
            return Ok(());
        }
        let i = self.at;
        self.at += 1;
        let lent = self.plan.lent_at.contains(&i);
        let stream: Option<Box<dyn Read + 'a>> = match lent {
            true => Some(Box::new(io::repeat(0).take(self.plan.entries[i].size))),
            false => self.stream(i).map(|s| Box::new(s) as Box<dyn Read + 'a>),
        };
        if let Some(s) = stream {
            let e = &self.plan.entries[i];
            write_header(&mut self.buf, e, e.size);
            self.streaming = Some((s, ((512 - e.size % 512) % 512) as usize));
            return Ok(());
        }
        let data = match self.plan.entries[i].kind {
            Kind::File => self.content(i)?,
            _ => Vec::new(),
        };
        write_entry(&mut self.buf, &self.plan.entries[i], &data);
        Ok(())
    }
}

impl Read for Layer<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.pos == self.buf.len() {
            if let Some((s, pad)) = &mut self.streaming {
                let n = s.read(out)?;
                if n > 0 {
                    return Ok(n);
                }
                self.buf.clear();
                self.buf.resize(*pad, 0);
                self.pos = 0;
                self.streaming = None;
            }
        }
        while self.pos == self.buf.len() {
            if self.ended && self.at == self.plan.entries.len() {
                return Ok(0);
            }
            self.fill()?;
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// One PAX record: `LEN KEY=VALUE\n`, LEN counting itself.
fn pax_record(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    let body = key.len() + value.len() + 3;
    let mut len = body + 1;
    while len != body + len.to_string().len() {
        len = body + len.to_string().len();
    }
    out.extend_from_slice(format!("{len} ").as_bytes());
    out.extend_from_slice(key);
    out.push(b'=');
    out.extend_from_slice(value);
    out.push(b'\n');
}

fn octal(field: &mut [u8], v: u64) {
    let s = format!("{:0w$o}", v, w = field.len() - 1);
    let s = s.as_bytes();
    let s = &s[s.len().saturating_sub(field.len() - 1)..];
    field[..s.len()].copy_from_slice(s);
    field[s.len()] = 0;
}

fn header(name: &[u8], flag: u8, size: u64, e: &Entry, link: &[u8]) -> [u8; 512] {
    let mut h = [0u8; 512];
    let n = name.len().min(100);
    h[..n].copy_from_slice(&name[..n]);
    octal(&mut h[100..108], e.mode as u64);
    octal(&mut h[108..116], e.uid.min(0o7777777) as u64);
    octal(&mut h[116..124], e.gid.min(0o7777777) as u64);
    octal(&mut h[124..136], size.min(0o77777777777));
    octal(&mut h[136..148], e.mtime.0.clamp(0, 0o77777777777) as u64);
    h[156] = flag;
    let l = link.len().min(100);
    h[157..157 + l].copy_from_slice(&link[..l]);
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    if let Kind::Special(_, maj, min) = e.kind {
        octal(&mut h[329..337], maj.min(0o7777777));
        octal(&mut h[337..345], min.min(0o7777777));
    }
    h[148..156].fill(b' ');
    let sum: u64 = h.iter().map(|&b| b as u64).sum();
    octal(&mut h[148..155], sum);
    h[155] = b' ';
    h
}

fn pad(out: &mut Vec<u8>) {
    let rem = out.len() % 512;
    if rem != 0 {
        out.resize(out.len() + 512 - rem, 0);
    }
}

/// One entry as tar: a PAX header with everything that a ustar header
/// cannot hold exactly (the name, the link, the time, owners, size,
/// xattrs), then the ustar header and the content.
pub(crate) fn write_entry(out: &mut Vec<u8>, e: &Entry, data: &[u8]) {
    write_header(out, e, data.len() as u64);
    out.extend_from_slice(data);
    pad(out);
}

/// `write_entry` up to the content, which is `size` bytes.
fn write_header(out: &mut Vec<u8>, e: &Entry, size: u64) {
    let (flag, link): (u8, &[u8]) = match &e.kind {
        Kind::File => (b'0', b""),
        Kind::Dir => (b'5', b""),
        Kind::Symlink(t) => (b'2', t),
        Kind::Hardlink(t) => (b'1', t),
        Kind::Special(f, _, _) => (*f, b""),
    };
    let mut pax = Vec::new();
    pax_record(&mut pax, b"path", &e.name);
    if !link.is_empty() {
        pax_record(&mut pax, b"linkpath", link);
    }
    let mtime = crate::tree::Time::from(e.mtime).decimal();
    pax_record(&mut pax, b"mtime", mtime.as_bytes());
    pax_record(&mut pax, b"uid", e.uid.to_string().as_bytes());
    pax_record(&mut pax, b"gid", e.gid.to_string().as_bytes());
    pax_record(&mut pax, b"size", size.to_string().as_bytes());
    for (k, v) in &e.xattrs {
        let mut key = b"SCHILY.xattr.".to_vec();
        key.extend_from_slice(k);
        pax_record(&mut pax, &key, v);
    }
    let plain = Entry {
        mode: 0o644,
        kind: Kind::File,
        ..e.clone()
    };
    out.extend_from_slice(&header(
        b"././@PaxHeader",
        b'x',
        pax.len() as u64,
        &plain,
        b"",
    ));
    out.extend_from_slice(&pax);
    pad(out);
    out.extend_from_slice(&header(&e.name, flag, size, e, link));
}

/// The line saying why a layer is fetched whole.
pub fn whole_line(what: &str, why: &str) -> String {
    format!("{what}: fetching the whole layer: {why}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layer written the way zstd:chunked writers write one, for tests and
    /// the fuzz corpus: each file's content in a zstd frame of its own, the
    /// tar headers in frames between, the TOC in a skippable frame at the end.
    /// Returns the blob and the annotations (current key names) that place it.
    pub fn write_layer(files: &[(&str, &[u8])]) -> (Vec<u8>, String, String) {
        use ruzstd::encoding::{compress_to_vec, CompressionLevel};
        let z = |b: &[u8]| compress_to_vec(b, CompressionLevel::Fastest);
        let mut blob = Vec::new();
        let mut entries = Vec::new();
        for (name, data) in files {
            let e = Entry {
                name: name.as_bytes().to_vec(),
                kind: Kind::File,
                mode: 0o644,
                uid: 0,
                gid: 0,
                mtime: (1_700_000_000, 0),
                size: data.len() as u64,
                xattrs: Vec::new(),
                digest: None,
                range: (0, 0),
                chunks: Vec::new(),
            };
            let mut head = Vec::new();
            write_entry(&mut head, &e, data);
            let head_len = head.len() - data.len().div_ceil(512) * 512;
            blob.extend(z(&head[..head_len]));
            let offset = blob.len();
            if !data.is_empty() {
                blob.extend(z(data));
            }
            let end = blob.len();
            let tail = &head[head_len + data.len()..];
            if !tail.is_empty() {
                blob.extend(z(tail));
            }
            let mut j = serde_json::json!({
                "type": "reg", "name": name, "mode": 0o100644, "size": data.len(),
                "modtime": "2023-11-14T22:13:20Z",
            });
            if !data.is_empty() {
                j["digest"] = format!("sha256:{}", hex(&Sha256::digest(data))).into();
                j["offset"] = offset.into();
                j["endOffset"] = end.into();
            }
            entries.push(j);
        }
        blob.extend(z(&[0u8; 1024]));
        let toc = serde_json::to_vec(&serde_json::json!({"version": 1, "entries": entries}))
            .expect("json");
        let ztoc = z(&toc);
        blob.extend_from_slice(&[0x50, 0x2a, 0x4d, 0x18]);
        blob.extend_from_slice(&(ztoc.len() as u32).to_le_bytes());
        let at = blob.len();
        blob.extend_from_slice(&ztoc);
        let position = format!("{at}:{}:{}:1", ztoc.len(), toc.len());
        let checksum = format!("sha256:{}", hex(&Sha256::digest(&ztoc)));
        (blob, position, checksum)
    }

    #[test]
    fn times_read_as_go_writes_them() {
        assert_eq!(parse_time("1970-01-01T00:00:00Z"), Some((0, 0)));
        assert_eq!(parse_time("2023-11-14T22:13:20Z"), Some((1_700_000_000, 0)));
        assert_eq!(
            parse_time("2023-11-14T23:13:20.5+01:00"),
            Some((1_700_000_000, 500_000_000))
        );
        assert_eq!(parse_time("0001-01-01T00:00:00Z"), Some((-62135596800, 0)));
        for bad in [
            "",
            "2023-13-01T00:00:00Z",
            "2023-11-14 22:13:20Z",
            "2023-11-14T22:13:20",
            "2023-11-14T22:13:20.Z",
            // An offset of six bytes with a character across byte 3 (the
            // fuzzer's find: it panicked on a range inside the character).
            "2023-11-14T22:13:20+0\u{3be}/c",
            "2023-11-14T22:13:20+-1:+2",
        ] {
            assert_eq!(parse_time(bad), None, "{bad}");
        }
    }

    fn toc(entries: &str) -> Result<Vec<Entry>> {
        parse_toc(
            format!(r#"{{"version":1,"entries":[{entries}]}}"#).as_bytes(),
            1 << 20,
            100,
        )
    }

    #[test]
    fn hostile_names_are_refused() {
        let d = format!("sha256:{}", "a".repeat(64));
        for bad in [
            r#"{"type":"reg","name":"../x"}"#.to_string(),
            r#"{"type":"reg","name":"a/../../x"}"#.into(),
            r#"{"type":"reg","name":"/etc/passwd"}"#.into(),
            r#"{"type":"reg","name":""}"#.into(),
            r#"{"type":"symlink","name":"l","linkName":"/etc"},{"type":"reg","name":"l/passwd"}"#
                .into(),
            r#"{"type":"hardlink","name":"h","linkName":"../x"}"#.into(),
            r#"{"type":"weird","name":"w"}"#.into(),
            format!(r#"{{"type":"chunk","name":"c","chunkDigest":"{d}"}}"#),
            r#"{"type":"reg","name":"f","size":5,"digest":"sha256:00","offset":1,"endOffset":9}"#
                .into(),
            format!(
                r#"{{"type":"reg","name":"f","size":5,"digest":"{d}","offset":9,"endOffset":2}}"#
            ),
            format!(
                r#"{{"type":"reg","name":"f","size":5,"digest":"{d}","offset":1,"endOffset":99999999}}"#
            ),
        ] {
            assert!(toc(&bad).is_err(), "{bad}");
        }
        let ok = toc(&format!(
            r#"{{"type":"dir","name":"./a/","mode":16877}},{{"type":"symlink","name":"a/l","linkName":"../b"}},
            {{"type":"reg","name":"a/f","mode":33188,"size":3,"digest":"{d}","offset":10,"endOffset":20,"modtime":"2023-11-14T22:13:20Z"}}"#
        ))
        .unwrap();
        assert_eq!(ok.len(), 3);
        assert_eq!(ok[0].name, b"a");
        assert_eq!(ok[0].mode, 0o755);
        assert_eq!(ok[2].range, (10, 20));
        assert_eq!(ok[2].mtime, (1_700_000_000, 0));
    }

    #[test]
    fn an_estargz_tail_reads_back_through_its_footer_and_toc() {
        let seed =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/estargz_toc/chunked");
        let seed = std::fs::read(seed).unwrap();
        let (foot, member) = seed.split_at(FOOTER as usize);
        assert_eq!(parse_footer(foot), Ok(4096));
        let mut bent = foot.to_vec();
        bent[20] = b'g';
        assert!(parse_footer(&bent).is_err());
        assert!(parse_footer(&foot[1..]).is_err());
        let (e, json) = stargz_toc_entry(member).unwrap();
        assert_eq!(
            (e.name.as_slice(), e.mode, e.size),
            (STARGZ_TOC_NAME, 0o444, json.len() as u64)
        );
        let es = parse_stargz_toc(&json, 4096, 10).unwrap();
        assert_eq!(es.len(), 5);
        // The file's members run from its first chunk's to the TOC's.
        assert_eq!(es[1].range, (512, 4096));
        assert_eq!(es[1].chunks.len(), 2);
        assert_eq!(es[1].chunks[1].blob, 700);
        // A TOC past the members it names leaves them no end.
        assert!(parse_stargz_toc(&json, 600, 10).is_err());
        assert!(stargz_toc_entry(&member[..600]).is_err());
    }

    #[test]
    fn a_written_layer_reads_back_through_its_toc() {
        let (blob, pos, sum) = write_layer(&[("a/x", b"hello"), ("b", b"")]);
        let mut ann = std::collections::BTreeMap::new();
        ann.insert(POSITION_KEYS[0].to_string(), pos);
        ann.insert(CHECKSUM_KEYS[0].to_string(), sum);
        let desc = Descriptor {
            media_type: String::new(),
            digest: String::new(),
            size: blob.len() as u64,
            platform: None,
            annotations: Some(ann),
        };
        let p = position(&desc).unwrap().unwrap();
        let z = &blob[p.offset as usize..(p.offset + p.length) as usize];
        let t = unzstd(z, MAX_TOC).unwrap();
        let es = parse_toc(&t, desc.size, 10).unwrap();
        let (a, b) = es[0].range;
        assert_eq!(
            check_content(&es[0], &blob[a as usize..b as usize], Format::Zstd).unwrap(),
            b"hello"
        );
        let mut wrong = es[0].clone();
        wrong.digest = Some([0; 32]);
        assert!(check_content(&wrong, &blob[a as usize..b as usize], Format::Zstd).is_err());
        // The blob is also a plain zstd stream of the layer's tar.
        let mut plain = Vec::new();
        super::super::decode::Zstd::new(&blob[..])
            .read_to_end(&mut plain)
            .unwrap();
        let mut r = super::super::tar::Reader::new(&plain[..]);
        let h = r.next_entry().unwrap().unwrap();
        assert_eq!(h.path, b"a/x");
    }
}
