//! Archives mean what every reference reader says they mean. A generator
//! writes tar archives byte by byte (ustar, GNU, PAX, Solaris `X`, v7,
//! base-256 numbers; gzip and zstd framings; hostile ones); each is
//! extracted by GNU tar and by bsdtar and synced by packsync, which must
//! refuse it (exit 1 or 2, one line, the volume unchanged) or publish a tree
//! equal to one of the two extractions. Random and mutated archives are
//! listed by Python's tarfile and must list as packsync publishes them, or
//! be refused.
//!
//! Trees are compared entry by entry: paths, kinds, bytes, symlink targets,
//! mode bits, owners (as root), hardlink groups, and mtimes to the
//! nanosecond (GNU tar, bsdtar and packsync all keep a PAX time's fraction).
//! A directory the archive does not name has the time and mode its
//! extractor gave it: only its kind is compared.
//!
//! `PACKSYNC_TAR_CORPUS=DIR` runs the same comparison on every file in DIR
//! (archives from elsewhere, never committed here).

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::faults::Rng;
use crate::fixture::{is_root, Fixture, Run};

// ---------------------------------------------------------------------------
// The generator.

/// The mtime most entries get (2023), far from the time of a test run.
const T0: i64 = 1_690_000_000;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Magic {
    /// POSIX `ustar\0` `00`.
    Ustar,
    /// GNU `ustar  \0`.
    Gnu,
    /// None: an old v7 header.
    V7,
}

/// One header block as written: every field settable, so that headers no
/// well-behaved writer makes can be made.
#[derive(Clone)]
struct H {
    name: Vec<u8>,
    mode: i64,
    uid: i64,
    gid: i64,
    size: i64,
    mtime: i64,
    flag: u8,
    link: Vec<u8>,
    magic: Magic,
    prefix: Vec<u8>,
    /// uid, gid, size and mtime in GNU base-256, whatever their value.
    base256: bool,
}

fn h(name: &str, flag: u8) -> H {
    H {
        name: name.as_bytes().to_vec(),
        mode: if flag == b'5' { 0o755 } else { 0o644 },
        uid: 1000,
        gid: 1000,
        size: 0,
        mtime: T0,
        flag,
        link: Vec::new(),
        magic: Magic::Ustar,
        prefix: Vec::new(),
        base256: false,
    }
}

/// `v` in a numeric field: octal digits and a NUL, or base-256 (first byte
/// 0x80, or 0xff and two's complement for a negative number) when asked or
/// when octal cannot hold it.
fn num(field: &mut [u8], v: i64, base256: bool) {
    let w = field.len();
    let octal = format!("{v:0width$o}", width = w - 1);
    if !base256 && v >= 0 && octal.len() < w {
        field[..w - 1].copy_from_slice(octal.as_bytes());
        field[w - 1] = 0;
        return;
    }
    let bytes = (v as i128).to_be_bytes();
    field.copy_from_slice(&bytes[16 - w..]);
    if v >= 0 {
        assert_eq!(field[0], 0, "{v} does not fit a {w}-byte field");
        field[0] = 0x80;
    } else {
        field[0] = 0xff;
    }
}

fn put(field: &mut [u8], v: &[u8]) {
    assert!(
        v.len() <= field.len(),
        "{:?} too long",
        String::from_utf8_lossy(v)
    );
    field[..v.len()].copy_from_slice(v);
}

/// The checksum of a header, its own field counted as spaces.
fn seal(b: &mut [u8]) {
    b[148..156].copy_from_slice(b"        ");
    let sum: u32 = b[..512].iter().map(|&x| x as u32).sum();
    b[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
}

impl H {
    fn block(&self) -> [u8; 512] {
        let mut b = [0u8; 512];
        put(&mut b[0..100], &self.name);
        num(&mut b[100..108], self.mode, false);
        num(&mut b[108..116], self.uid, self.base256);
        num(&mut b[116..124], self.gid, self.base256);
        num(&mut b[124..136], self.size, self.base256);
        num(&mut b[136..148], self.mtime, self.base256);
        b[156] = self.flag;
        put(&mut b[157..257], &self.link);
        match self.magic {
            Magic::Ustar => {
                b[257..263].copy_from_slice(b"ustar\0");
                b[263..265].copy_from_slice(b"00");
            }
            Magic::Gnu => b[257..265].copy_from_slice(b"ustar  \0"),
            Magic::V7 => {}
        }
        if self.magic != Magic::V7 {
            put(&mut b[345..500], &self.prefix);
        }
        seal(&mut b);
        b
    }
}

/// A PAX record: `LEN KEY=VALUE\n`, LEN counting itself.
fn record(key: &str, value: &[u8]) -> Vec<u8> {
    let body = key.len() + value.len() + 3;
    let mut len = body + 1;
    while format!("{len}").len() + body != len {
        len += 1;
    }
    let mut r = format!("{len} {key}=").into_bytes();
    r.extend_from_slice(value);
    r.push(b'\n');
    r
}

/// An archive being written, with the offset of every entry's own header
/// block (extension headers not counted).
#[derive(Default)]
struct Tar {
    out: Vec<u8>,
    headers: Vec<usize>,
}

impl Tar {
    /// A header and `data` (padded), whatever the header's size says.
    fn raw(&mut self, h: &H, data: &[u8]) -> &mut Tar {
        if !b"xgXLK".contains(&h.flag) {
            self.headers.push(self.out.len());
        }
        self.out.extend_from_slice(&h.block());
        self.out.extend_from_slice(data);
        self.out.resize(self.out.len().div_ceil(512) * 512, 0);
        self
    }

    fn entry(&mut self, mut h: H, data: &[u8]) -> &mut Tar {
        h.size = data.len() as i64;
        self.raw(&h, data)
    }

    fn file(&mut self, name: &str, data: &[u8]) -> &mut Tar {
        self.entry(h(name, b'0'), data)
    }

    fn dir(&mut self, name: &str) -> &mut Tar {
        self.entry(h(name, b'5'), b"")
    }

    fn symlink(&mut self, name: &str, target: &str) -> &mut Tar {
        let mut e = h(name, b'2');
        e.mode = 0o777;
        e.link = target.as_bytes().to_vec();
        self.entry(e, b"")
    }

    fn hardlink(&mut self, name: &str, target: &str) -> &mut Tar {
        let mut e = h(name, b'1');
        e.link = target.as_bytes().to_vec();
        self.entry(e, b"")
    }

    /// An extended header (`x`, `g` or Solaris `X`) holding `records`.
    fn ext(&mut self, flag: u8, records: &[(&str, &[u8])]) -> &mut Tar {
        let data: Vec<u8> = records.iter().flat_map(|(k, v)| record(k, v)).collect();
        let mut e = h("./PaxHeaders/x", flag);
        e.mtime = 0;
        e.uid = 0;
        e.gid = 0;
        self.entry(e, &data)
    }

    /// A GNU long name (`L`) or long link target (`K`).
    fn long(&mut self, flag: u8, name: &[u8]) -> &mut Tar {
        let mut e = h("././@LongLink", flag);
        e.magic = Magic::Gnu;
        e.uid = 0;
        e.gid = 0;
        e.mtime = 0;
        let mut data = name.to_vec();
        data.push(0);
        self.entry(e, &data)
    }

    /// The end-of-archive marker (two zero blocks) and the bytes.
    fn end(&mut self) -> Vec<u8> {
        self.out.extend_from_slice(&[0u8; 1024]);
        std::mem::take(&mut self.out)
    }
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn zstd(data: &[u8]) -> Vec<u8> {
    ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
}

/// A zstd skippable frame (magic 0x184D2A50 + `nibble`) holding `payload`.
fn skippable(nibble: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = (0x184D_2A50u32 + nibble as u32).to_le_bytes().to_vec();
    f.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    f.extend_from_slice(payload);
    f
}

/// What `pzstd` writes: each frame preceded by a skippable frame holding
/// the frame's compressed size.
fn pzstd_like(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in parts {
        let frame = zstd(p);
        out.extend(skippable(0, &(frame.len() as u32).to_le_bytes()));
        out.extend(frame);
    }
    out
}

/// What packsync may do with a test archive.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// Refuse it, or publish what GNU tar or bsdtar extracts.
    Either,
    /// Publish what GNU tar or bsdtar extracts: an archive every reader
    /// reads, with no reason to refuse it.
    Publish,
    /// Refuse it, or publish what this extractor gives (the other one
    /// reads it another way: bsdtar ignores PAX global headers).
    Like(&'static str),
    /// Refuse it with this in the line, whatever the extractors do.
    Refuse(&'static str),
}

/// A test archive: its file name (the suffix for the extractors), bytes,
/// and what packsync may do with it.
struct Case {
    name: String,
    bytes: Vec<u8>,
    expect: Expect,
}

fn case(name: &str, bytes: Vec<u8>, expect: Expect) -> Case {
    Case {
        name: name.into(),
        bytes,
        expect,
    }
}

/// Issue item 1: directory, symlink and hardlink headers carry no data,
/// whatever their size field says.
fn sizes_on_entries_without_data() -> Vec<Case> {
    let mut v = Vec::new();
    // CPython's testtar.tar: `ustar/dirtype-with-size` has size 255 and no
    // data; the hardlink after it is what a reader that skips loses.
    let mut t = Tar::default();
    t.dir("ustar/").file("ustar/regtype", b"regular file\n");
    t.dir("ustar/dirtype/");
    let mut d = h("ustar/dirtype-with-size/", b'5');
    d.size = 255;
    t.raw(&d, b"")
        .hardlink("ustar/lnktype", "ustar/regtype")
        .file("ustar/after", b"after\n");
    v.push(case("dirtype-with-size.tar", t.end(), Expect::Publish));

    // libarchive's test_compat_tar_directory_1.tar: v7 headers, a directory
    // as a regular-file header whose name ends in `/`, size 1, no data.
    let mut t = Tar::default();
    let mut d1 = h("directory1/", 0);
    d1.magic = Magic::V7;
    d1.size = 1;
    d1.mode = 0o755;
    let mut d2 = h("directory2/", 0);
    d2.magic = Magic::V7;
    d2.mode = 0o755;
    t.raw(&d1, b"").raw(&d2, b"");
    v.push(case("compat-tar-directory-1.tar", t.end(), Expect::Publish));

    // The same in a ustar `0` or `7` header: a directory to GNU tar and
    // bsdtar (Python's tarfile reads 5 bytes of data and loses `after`).
    for flag in [b'0', b'7'] {
        let mut t = Tar::default();
        let mut d = h("x/", flag);
        d.size = 5;
        d.mode = 0o755;
        t.raw(&d, b"").file("after", b"after\n");
        let name = format!("regular-header-with-slash-{}.tar", flag as char);
        v.push(case(&name, t.end(), Expect::Publish));
    }

    // A `d/` whose size (1024) covers the next entry's header and data.
    let mut t = Tar::default();
    let mut d = h("d/", b'5');
    d.size = 1024;
    t.raw(&d, b"")
        .file("d/secret", b"the scanner never sees this\n")
        .file("d/after", b"after\n");
    v.push(case("dir-size-1024.tar", t.end(), Expect::Publish));

    let mut t = Tar::default();
    let mut l = h("sym", b'2');
    l.mode = 0o777;
    l.link = b"target".to_vec();
    l.size = 512;
    t.file("target", b"t\n")
        .raw(&l, b"")
        .file("hidden", b"behind the symlink's size\n")
        .file("after", b"after\n");
    v.push(case("symlink-with-size.tar", t.end(), Expect::Publish));

    let mut t = Tar::default();
    let mut l = h("hard", b'1');
    l.link = b"target".to_vec();
    l.size = 9;
    t.file("target", b"t\n")
        .raw(&l, b"")
        .file("hidden", b"behind the hardlink's size\n")
        .file("after", b"after\n");
    v.push(case("hardlink-with-size.tar", t.end(), Expect::Publish));
    v
}

/// Issue items 2 and 4: Solaris `X` headers, PAX global `g` headers.
fn extended_headers() -> Vec<Case> {
    let mut v = Vec::new();
    let mut t = Tar::default();
    t.ext(
        b'X',
        &[("path", b"sun/long-name-from-X"), ("mtime", b"1500000000")],
    )
    .file("sun/ustar-name", b"solaris\n")
    .file("sun/plain", b"plain\n");
    v.push(case("solaris-X.tar", t.end(), Expect::Publish));

    // A global header, then an entry of its own, then a local `x` over it.
    let mut t = Tar::default();
    t.ext(b'g', &[("mtime", b"1400000000"), ("uid", b"4242")])
        .file("g/one", b"one\n")
        .ext(b'x', &[("mtime", b"1600000000.25"), ("uid", b"77")])
        .file("g/two", b"two\n")
        .file("g/three", b"three\n");
    v.push(case("pax-global.tar", t.end(), Expect::Like("tar")));

    // What `git archive` writes: a global comment only.
    let mut t = Tar::default();
    t.ext(
        b'g',
        &[("comment", b"0123456789abcdef0123456789abcdef01234567")],
    )
    .dir("repo/")
    .file("repo/README", b"readme\n");
    v.push(case("git-archive-comment.tar", t.end(), Expect::Publish));

    // PAX path, linkpath, size and times with a fraction.
    let long = format!("pax/{}/file", "p".repeat(150));
    let target = format!("../{}", "t".repeat(120));
    let mut t = Tar::default();
    t.ext(
        b'x',
        &[
            ("path", long.as_bytes()),
            ("mtime", b"1650000000.123456789"),
        ],
    )
    .file("pax/short", b"pax long path\n")
    .ext(b'x', &[("linkpath", target.as_bytes())])
    .symlink("pax/link", "short-target")
    .ext(b'x', &[("size", b"5")]);
    let mut f = h("pax/sized", b'0');
    f.size = 0;
    t.raw(&f, b"12345");
    v.push(case("pax-records.tar", t.end(), Expect::Publish));
    v
}

/// Issue item 3 and the gzip framings.
fn framings() -> Vec<Case> {
    let mut t = Tar::default();
    t.dir("z/")
        .file("z/one", &[b'1'; 3000])
        .file("z/two", b"two\n");
    let plain = t.end();
    let cut = 512 * 8; // after z/one's data: a block boundary
    let cat = |parts: &[Vec<u8>]| parts.concat();
    let mut v = vec![
        case(
            "skippable-first.tar.zst",
            cat(&[skippable(0xa, b"metadata before the frame"), zstd(&plain)]),
            Expect::Publish,
        ),
        case(
            "pzstd-like.tar.zst",
            pzstd_like(&[&plain[..cut], &plain[cut..]]),
            Expect::Publish,
        ),
        case(
            "zstd-two-frames.tar.zst",
            cat(&[zstd(&plain[..cut]), zstd(&plain[cut..])]),
            Expect::Publish,
        ),
        case(
            "multi-member.tar.gz",
            cat(&[gzip(&plain[..cut]), gzip(&plain[cut..])]),
            Expect::Publish,
        ),
        // gzip(1) ignores zeros after the last member (tape padding).
        case(
            "gzip-trailing-zeros.tar.gz",
            cat(&[gzip(&plain), vec![0u8; 1000]]),
            Expect::Either,
        ),
        case(
            "gzip-trailing-garbage.tar.gz",
            cat(&[gzip(&plain), b"this is not a gzip member\n".to_vec()]),
            Expect::Refuse("data after the last gzip member at byte"),
        ),
        // Every reader stops at the end-of-archive blocks.
        case(
            "tar-trailing-garbage.tar",
            cat(&[plain.clone(), b"after the end-of-archive blocks\n".to_vec()]),
            Expect::Publish,
        ),
    ];
    if let Some(z) = tool_output("pzstd", &["-q", "-c", "-p", "2"], &plain) {
        v.push(case("pzstd.tar.zst", z, Expect::Publish));
    }
    v
}

/// Name forms and numbers: GNU long names, ustar prefix, base-256, v7.
fn forms() -> Vec<Case> {
    let mut v = Vec::new();
    let long_name = format!("gnu/{}/{}", "n".repeat(90), "file-with-a-long-name");
    let long_target = format!("/{}", "k".repeat(140));
    let long_hard = format!("gnu/{}", "h".repeat(110));
    let mut t = Tar::default();
    let mut f = h("gnu/cut-name", b'0');
    f.magic = Magic::Gnu;
    t.long(b'L', long_name.as_bytes())
        .entry(f, b"gnu long name\n")
        .long(b'L', b"gnu/sym")
        .long(b'K', long_target.as_bytes());
    let mut s = h("gnu/cut", b'2');
    s.magic = Magic::Gnu;
    s.mode = 0o777;
    t.entry(s, b"").long(b'L', long_hard.as_bytes());
    let mut l = h("gnu/cut", b'1');
    l.magic = Magic::Gnu;
    t.long(b'K', long_name.as_bytes()).entry(l, b"");
    v.push(case("gnu-long-names.tar", t.end(), Expect::Publish));

    let mut t = Tar::default();
    let mut f = h("file-below-a-prefix", b'0');
    f.prefix = format!("prefix/{}", "q".repeat(120)).into_bytes();
    let mut d = h("dir", b'5');
    d.prefix = b"prefix".to_vec();
    d.mode = 0o750;
    t.entry(d, b"").entry(f, b"ustar prefix\n");
    v.push(case("ustar-prefix.tar", t.end(), Expect::Publish));

    let mut t = Tar::default();
    let mut f = h("b256/small", b'0');
    f.base256 = true;
    f.magic = Magic::Gnu;
    t.entry(f, b"sized in base-256\n");
    let mut f = h("b256/big-uid", b'0');
    f.magic = Magic::Gnu;
    f.uid = 3_000_000_000;
    f.gid = 2_500_000;
    f.mtime = 9_000_000_000; // year 2255: past octal's 11 digits
    t.entry(f, b"big numbers\n");
    let mut f = h("b256/before-1970", b'0');
    f.magic = Magic::Gnu;
    f.mtime = -86_400 * 365;
    t.entry(f, b"1969\n");
    v.push(case("base-256.tar", t.end(), Expect::Publish));

    let mut t = Tar::default();
    let mut f = h("v7/file", 0);
    f.magic = Magic::V7;
    let mut d = h("v7/dir/", 0);
    d.magic = Magic::V7;
    d.mode = 0o711;
    let mut l = h("v7/link", b'1');
    l.magic = Magic::V7;
    l.link = b"v7/file".to_vec();
    let mut s = h("v7/sym", b'2');
    s.magic = Magic::V7;
    s.link = b"file".to_vec();
    s.mode = 0o777;
    t.entry(d, b"")
        .entry(f, b"version 7\n")
        .entry(l, b"")
        .entry(s, b"");
    v.push(case("v7.tar", t.end(), Expect::Publish));

    // A type no reader knows: GNU tar and bsdtar make it a regular file.
    let mut t = Tar::default();
    t.entry(h("unknown-type", b'Q'), b"data of an unknown type\n")
        .file("after", b"after\n");
    v.push(case("unknown-type.tar", t.end(), Expect::Either));
    v
}

/// What any release tarball holds.
fn ordinary() -> Vec<Case> {
    let mut v = Vec::new();
    let mut t = Tar::default();
    t.dir("pkg/").dir("pkg/bin/").dir("pkg/etc/");
    let mut x = h("pkg/bin/tool", b'0');
    x.mode = 0o755;
    x.mtime = T0 + 7;
    t.entry(x, b"#!/bin/sh\necho tool\n");
    let mut s = h("pkg/bin/suid", b'0');
    s.mode = 0o4755;
    s.uid = 0;
    s.gid = 0;
    t.entry(s, b"setuid\n");
    let mut p = h("pkg/etc/private", b'0');
    p.mode = 0o600;
    p.uid = 33;
    p.gid = 44;
    t.entry(p, b"secret\n");
    let mut z = h("pkg/etc/none", b'0');
    z.mode = 0;
    t.entry(z, b"mode 0\n");
    let mut ro = h("pkg/ro/", b'5');
    ro.mode = 0o555;
    t.entry(ro, b"");
    // pkg/ro/ is read-only to its owner: its file comes after it.
    t.file("pkg/ro/inside", b"below a read-only directory\n")
        .file("pkg/empty", b"")
        .symlink("pkg/current", "bin")
        .symlink("pkg/dangling", "../nowhere")
        .symlink("pkg/abs", "/etc/passwd")
        .hardlink("pkg/bin/tool-again", "pkg/bin/tool")
        .hardlink("pkg/third", "pkg/bin/tool");
    let deep: String = (0..24).map(|i| format!("d{i}/")).collect();
    t.file(&format!("pkg/{deep}leaf"), b"deep\n")
        .file("/abs/leading-slash", b"a leading slash is stripped\n")
        .file("./dot/slash", b"./ prefix\n");
    t.file("pkg/big", &vec![b'b'; 70_000]);
    v.push(case("release.tar", t.end(), Expect::Publish));

    // The same name again: the later entry wins.
    let mut t = Tar::default();
    t.file("same", b"first\n").file("other", b"o\n");
    let mut second = h("same", b'0');
    second.mode = 0o640;
    second.mtime = T0 + 100;
    t.entry(second, b"second, longer\n")
        .file("turns-symlink", b"a file first\n")
        .symlink("turns-symlink", "same")
        .symlink("turns-file", "x")
        .file("turns-file", b"a file now\n");
    let mut d = h("dir-twice/", b'5');
    d.mode = 0o700;
    t.dir("dir-twice/")
        .file("dir-twice/kept", b"kept\n")
        .entry(d, b"");
    v.push(case("later-entry-wins.tar", t.end(), Expect::Publish));

    // Hardlinks whose group changes: the target is replaced afterwards.
    let mut t = Tar::default();
    t.file("a", b"version one\n")
        .hardlink("b", "a")
        .file("a", b"version two\n");
    v.push(case("hardlink-then-replace.tar", t.end(), Expect::Publish));

    // Files without directory entries: the directories are implied.
    let mut t = Tar::default();
    t.file("implied/x/y/z", b"z\n").file("implied/x/w", b"w\n");
    v.push(case("implied-directories.tar", t.end(), Expect::Publish));
    v
}

/// Archives whose entries leave the tree: packsync refuses them.
fn leaving_the_tree() -> Vec<Case> {
    let t = |f: fn(&mut Tar) -> &mut Tar| {
        let mut t = Tar::default();
        t.file("fine", b"fine\n");
        f(&mut t);
        t.end()
    };
    let dotdot = Expect::Refuse("\"..\" component");
    let through = Expect::Refuse("is reached through the symlink");
    vec![
        case("dotdot.tar", t(|t| t.file("../escape", b"x\n")), dotdot),
        case(
            "dotdot-deep.tar",
            t(|t| t.file("a/b/../../../escape", b"x\n")),
            dotdot,
        ),
        case(
            "dotdot-pax.tar",
            t(|t| t.ext(b'x', &[("path", b"../pax")]).file("innocent", b"x\n")),
            dotdot,
        ),
        case(
            "dotdot-gnu-long.tar",
            t(|t| t.long(b'L', b"../../gnu").file("innocent", b"x\n")),
            dotdot,
        ),
        case(
            "through-symlink.tar",
            t(|t| t.symlink("l", "/tmp").file("l/packsync-escape", b"x\n")),
            through,
        ),
        case(
            "through-relative-symlink.tar",
            t(|t| t.symlink("up", "..").file("up/escape", b"x\n")),
            through,
        ),
        case(
            "hardlink-out.tar",
            t(|t| t.hardlink("h", "../../etc/passwd")),
            Expect::Refuse("its target leaves the tree"),
        ),
        case(
            "hardlink-absolute.tar",
            t(|t| t.hardlink("h", "/etc/passwd")),
            Expect::Refuse("not an earlier file of the archive"),
        ),
    ]
}

/// Archives that are broken. A reader may warn, stop and keep what it read;
/// a sync may not publish a part of an archive, so packsync refuses each.
fn broken() -> Vec<Case> {
    let mut t = Tar::default();
    t.file("one", b"one\n").file("two", &[b'2'; 2000]);
    let good = t.end();
    let mut bad_sum = good.clone();
    bad_sum[512 * 2] ^= 1;
    let mut t = Tar::default();
    t.file("one", b"one\n").hardlink("h", "missing");
    let missing = t.end();
    let mut t = Tar::default();
    t.file("one", b"one\n").hardlink("h", "");
    let empty_target = t.end();
    let mut t = Tar::default();
    t.hardlink("./self", "self").file("after", b"after\n");
    let to_itself = t.end();
    let mut t = Tar::default();
    t.file("one", b"one\n")
        .ext(b'x', &[("mtime", b"12x34")])
        .file("two", b"two\n");
    let bad_pax = t.end();
    vec![
        case(
            "cut-in-data.tar",
            good[..512 * 3].to_vec(),
            Expect::Refuse("truncated inside an entry's data"),
        ),
        case(
            "cut-in-header.tar",
            good[..512 * 2 + 100].to_vec(),
            Expect::Refuse("truncated inside the header"),
        ),
        case(
            "no-end-marker.tar",
            good[..good.len() - 1024].to_vec(),
            Expect::Refuse("without its end-of-archive block"),
        ),
        case(
            "bad-checksum.tar",
            bad_sum,
            Expect::Refuse("bad header checksum at byte 1024"),
        ),
        case(
            "hardlink-missing.tar",
            missing,
            Expect::Refuse("not an earlier file of the archive"),
        ),
        case(
            "hardlink-empty.tar",
            empty_target,
            Expect::Refuse("to '' refused"),
        ),
        // GNU tar: "Cannot hard link"; bsdtar: "Skipping hardlink pointing to itself".
        case(
            "hardlink-to-itself.tar",
            to_itself,
            Expect::Refuse("hardlink"),
        ),
        case("bad-pax-mtime.tar", bad_pax, Expect::Refuse("mtime=12x34")),
        case(
            "cut.tar.gz",
            {
                let g = gzip(&good);
                g[..g.len() - 20].to_vec()
            },
            Expect::Refuse("cut.tar.gz"),
        ),
    ]
}

/// What `tool ARGS` writes for `input` on stdin; `None` when it is absent.
fn tool_output(tool: &str, args: &[&str], input: &[u8]) -> Option<Vec<u8>> {
    let mut child = Command::new(tool)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let mut stdin = child.stdin.take().unwrap();
    let data = input.to_vec();
    let feed = std::thread::spawn(move || stdin.write_all(&data));
    let out = child.wait_with_output().unwrap();
    feed.join().unwrap().unwrap();
    assert!(out.status.success(), "{tool} failed");
    Some(out.stdout)
}

// ---------------------------------------------------------------------------
// Trees, and how two are compared.

/// One entry of an extracted tree.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Ent {
    /// `d`, `f SIZE SHA256` or `l TARGET`.
    what: String,
    mode: u32,
    mtime: (i64, i64),
    owner: (u32, u32),
}

/// A tree below a root (the root itself left out), and its hardlink groups.
struct Snap {
    ents: BTreeMap<String, Ent>,
    links: Vec<Vec<String>>,
}

fn hex(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}

/// The SHA-256 of a file, streamed; of its first MiB only past 64 MiB
/// (archives from elsewhere hold sparse files of many GiB).
fn digest_of(file: fs::File, size: u64) -> String {
    use sha2::Digest;
    use std::io::Read;
    let mut h = sha2::Sha256::new();
    let limit = if size > 64 << 20 { 1 << 20 } else { u64::MAX };
    std::io::copy(&mut file.take(limit), &mut h).unwrap();
    hex(&h.finalize())
}

fn file_digest(path: &Path, size: u64) -> String {
    digest_of(fs::File::open(path).unwrap(), size)
}

/// How deep `snap` reads (a handle a level).
const MAX_DEPTH: usize = 4096;

/// The tree below `root`, read one name at a time from directory handles
/// (no path is resolved: trees deeper than PATH_MAX are read, to
/// `MAX_DEPTH`).
fn snap(root: &Path) -> Snap {
    use rustix::fs::{openat, readlinkat, statat, AtFlags, Dir, FileType, Mode, OFlags};
    fn walk(
        dir: &std::os::fd::OwnedFd,
        prefix: &str,
        depth: usize,
        ents: &mut BTreeMap<String, Ent>,
        inodes: &mut BTreeMap<u64, Vec<String>>,
    ) {
        if depth == MAX_DEPTH {
            // node-tar's excessively-deep.tar goes 222371 levels down.
            let deeper = Ent {
                what: format!("deeper than {MAX_DEPTH} levels"),
                mode: 0,
                mtime: (0, 0),
                owner: (0, 0),
            };
            ents.insert(format!("{prefix}…"), deeper);
            return;
        }
        let mut names = Vec::new();
        for e in Dir::read_from(dir).unwrap() {
            let name = e.unwrap().file_name().to_owned();
            if name.as_bytes() != b"." && name.as_bytes() != b".." {
                names.push(name);
            }
        }
        for name in names {
            let m = statat(dir, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW).unwrap();
            let rel = format!("{prefix}{}", name.to_string_lossy());
            let kind = FileType::from_raw_mode(m.st_mode);
            let open = |flags| {
                openat(
                    dir,
                    name.as_c_str(),
                    flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .unwrap()
            };
            let what = match kind {
                FileType::Symlink => {
                    let t = readlinkat(dir, name.as_c_str(), Vec::new()).unwrap();
                    format!("l {}", t.to_string_lossy())
                }
                FileType::Directory => "d".into(),
                FileType::RegularFile => {
                    if m.st_nlink > 1 {
                        inodes.entry(m.st_ino).or_default().push(rel.clone());
                    }
                    let size = m.st_size as u64;
                    let file = fs::File::from(open(OFlags::RDONLY));
                    format!("f {size} {}", digest_of(file, size))
                }
                other => format!("special {other:?}"),
            };
            let mode = if kind == FileType::Symlink {
                0
            } else {
                m.st_mode & 0o7777
            };
            ents.insert(
                rel.clone(),
                Ent {
                    what,
                    mode,
                    mtime: (m.st_mtime, m.st_mtime_nsec as i64),
                    owner: (m.st_uid, m.st_gid),
                },
            );
            if kind == FileType::Directory {
                let sub = open(OFlags::RDONLY | OFlags::DIRECTORY);
                walk(&sub, &format!("{rel}/"), depth + 1, ents, inodes);
            }
        }
    }
    // A handle a level: as many as the hard limit allows.
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        let _ = setrlimit(Resource::Nofile, limit);
    }
    let mut ents = BTreeMap::new();
    let mut inodes = BTreeMap::new();
    let top = openat(
        rustix::fs::CWD,
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .unwrap();
    walk(&top, "", 0, &mut ents, &mut inodes);
    let mut links: Vec<Vec<String>> = inodes
        .into_values()
        .filter(|g| g.len() > 1)
        .map(|mut g| {
            g.sort();
            g
        })
        .collect();
    links.sort();
    Snap { ents, links }
}

/// How `got` differs from the reference `want`, one line a difference. A
/// directory of `want` whose mtime is `since` or later was made by its
/// extractor, not named by the archive: only its kind counts. Devices and
/// FIFOs of `want` may be missing from `got`.
fn differences(got: &Snap, want: &Snap, since: i64) -> Vec<String> {
    let mut out = Vec::new();
    let mut paths: Vec<&String> = got.ents.keys().chain(want.ents.keys()).collect();
    paths.sort();
    paths.dedup();
    for p in paths {
        match (got.ents.get(p), want.ents.get(p)) {
            // Devices and FIFOs are skipped with a warning, as in a directory.
            (None, Some(w)) if w.what.starts_with("special") => {}
            (None, Some(w)) => out.push(format!("missing {p:?} ({})", short(&w.what))),
            (Some(g), None) => out.push(format!("extra {p:?} ({})", short(&g.what))),
            (Some(g), Some(w)) => {
                if g.what != w.what {
                    out.push(format!(
                        "{p:?} is {} instead of {}",
                        short(&g.what),
                        short(&w.what)
                    ));
                    continue;
                }
                if w.what == "d" && w.mtime.0 >= since {
                    continue;
                }
                if g.mode != w.mode {
                    out.push(format!("{p:?} mode {:o} instead of {:o}", g.mode, w.mode));
                }
                if g.mtime != w.mtime {
                    out.push(format!(
                        "{p:?} mtime {}.{:09} instead of {}.{:09}",
                        g.mtime.0, g.mtime.1, w.mtime.0, w.mtime.1
                    ));
                }
                if is_root() && g.owner != w.owner {
                    out.push(format!(
                        "{p:?} owner {:?} instead of {:?}",
                        g.owner, w.owner
                    ));
                }
            }
            (None, None) => unreachable!(),
        }
    }
    if got.links != want.links {
        out.push(format!(
            "hardlink groups {:?} instead of {:?}",
            got.links, want.links
        ));
    }
    out
}

/// An entry's kind with a digest cut short, for messages.
fn short(what: &str) -> String {
    match what.strip_prefix("f ") {
        Some(rest) => {
            let (size, digest) = rest.split_once(' ').unwrap_or((rest, ""));
            format!("file of {size} bytes {}", &digest[..digest.len().min(12)])
        }
        None => what.to_string(),
    }
}

// ---------------------------------------------------------------------------
// The differential.

/// Whether GNU tar and bsdtar are here; else one line, or a failure under CI.
fn have_extractors() -> bool {
    let missing: Vec<&str> = ["tar", "bsdtar"]
        .into_iter()
        .filter(|t| {
            !Command::new(t)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .collect();
    if missing.is_empty() {
        return true;
    }
    let why = format!(
        "needs {} (apt-get install tar libarchive-tools)",
        missing.join(", ")
    );
    crate::fixture::skip(&format!("tar corpus {why}"));
    false
}

/// One reference extraction: its tree, or how the extractor failed.
struct Reference {
    tool: &'static str,
    tree: Result<Snap, String>,
}

/// `tool -xf ARCHIVE -C INTO --numeric-owner` (owners and modes as the
/// archive says when run as root, as both tools do by default).
fn extract(tool: &'static str, archive: &Path, into: &Path) -> Reference {
    fs::create_dir(into).unwrap();
    // Its messages to a file: an extractor may print without end.
    let log = into.with_extension("log");
    let status = Command::new(tool)
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(into)
        .arg("--numeric-owner")
        .env("LC_ALL", "C.UTF-8")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap())
        .status()
        .unwrap();
    let tree = if status.success() {
        Ok(snap(into))
    } else {
        use std::io::Read;
        let mut err = Vec::new();
        fs::File::open(&log)
            .unwrap()
            .take(4096)
            .read_to_end(&mut err)
            .unwrap();
        let err = String::from_utf8_lossy(&err);
        Err(format!(
            "exit {:?}: {}",
            status.code(),
            err.lines().take(2).collect::<Vec<_>>().join(" / ")
        ))
    };
    Reference { tool, tree }
}

/// Run one archive through the extractors and packsync; `Err` says how
/// packsync broke the rule.
fn differential(name: &str, bytes: &[u8], expect: Expect) -> Result<String, String> {
    let f = Fixture::new();
    let archive = f.path(name);
    fs::write(&archive, bytes).unwrap();
    // A second early: a filesystem stamps times from a coarse clock (ext4:
    // a tick of up to 4 ms), which may read the second before this one.
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
        - 1;
    let refs = [
        extract("tar", &archive, &f.path("gnu")),
        extract("bsdtar", &archive, &f.path("bsd")),
    ];
    let said: Vec<String> = refs
        .iter()
        .map(|r| match &r.tree {
            Ok(s) => format!("{}: {} entries", r.tool, s.ents.len()),
            Err(e) => format!("{}: {e}", r.tool),
        })
        .collect();
    let said = said.join("; ");

    // A live generation first, so that "unchanged" means something.
    let mut seed = Tar::default();
    seed.file("seed", b"the generation before\n");
    fs::write(f.path("seed.tar"), seed.end()).unwrap();
    f.packsync(&[
        "sync",
        "--grace",
        "0",
        "--no-fsync",
        "seed.tar",
        "vol/packs",
    ])
    .ok();
    let before = f.volume_but_staging();
    let run: Run = f.packsync(&["sync", "--grace", "0", "--no-fsync", name, "vol/packs"]);
    // An archive of nothing: the guard against an empty source refuses it
    // (exit 3), which is right when the references extract nothing too.
    let published = match run.code {
        0 => Some(snap(&f.dest())),
        3 if run.stderr.contains("empty source") && f.volume_but_staging() == before => {
            Some(Snap {
                ents: BTreeMap::new(),
                links: Vec::new(),
            })
        }
        _ => None,
    };
    match run.code {
        0 | 3 if published.is_some() => {
            if let Expect::Refuse(_) = expect {
                return Err(format!("published an archive it must refuse ({said})"));
            }
            let got = published.unwrap();
            let mut why = Vec::new();
            for r in &refs {
                if matches!(expect, Expect::Like(tool) if tool != r.tool) {
                    continue;
                }
                match &r.tree {
                    Ok(want) => {
                        let d = differences(&got, want, since);
                        if d.is_empty() {
                            return Ok(format!("published what {} extracts ({said})", r.tool));
                        }
                        why.push(format!("against {}: {}", r.tool, d.join("; ")));
                    }
                    Err(e) => why.push(format!("{} fails ({e})", r.tool)),
                }
            }
            Err(format!(
                "published a tree no reference gives: {}",
                why.join(" | ")
            ))
        }
        1 | 2 => {
            let line = run.stderr.trim();
            let lines = run.stderr.trim_end().lines().count();
            if lines != 1 {
                return Err(format!("refused with {lines} lines on stderr: {line:?}"));
            }
            if !run.stderr.contains(name) {
                return Err(format!("the error does not name the archive: {line}"));
            }
            if f.volume_but_staging() != before {
                return Err(format!("refused, but the volume changed: {line}"));
            }
            match expect {
                Expect::Publish => Err(format!(
                    "refused an archive every reader reads: {line} ({said})"
                )),
                Expect::Refuse(needle) if !line.contains(needle) => {
                    Err(format!("refused, but the line lacks {needle:?}: {line}"))
                }
                _ => Ok(format!("refused (exit {}): {line} ({said})", run.code)),
            }
        }
        c => Err(format!("exit {c}: {}", run.stderr.trim())),
    }
}

/// Every case through `differential`; one failure listing every case that broke the rule.
fn run_corpus(what: &str, cases: Vec<Case>) {
    if !have_extractors() {
        return;
    }
    // Trees are walked recursively: a deep one (node-tar's
    // excessively-deep.tar) needs more than a test thread's stack.
    let bad = std::thread::scope(|s| {
        std::thread::Builder::new()
            .stack_size(256 << 20)
            .spawn_scoped(s, || {
                let mut bad = Vec::new();
                for c in &cases {
                    match differential(&c.name, &c.bytes, c.expect) {
                        Ok(how) => eprintln!("{what}: {}: {how}", c.name),
                        Err(why) => bad.push(format!("{}: {why}", c.name)),
                    }
                }
                bad
            })
            .unwrap()
            .join()
            .unwrap()
    });
    assert!(
        bad.is_empty(),
        "{what}: {} of {} archives break the rule:\n{}",
        bad.len(),
        cases.len(),
        bad.join("\n")
    );
}

#[test]
fn sizes_on_directories_and_links_are_ignored_as_tar_and_bsdtar_ignore_them() {
    run_corpus("no-data entries", sizes_on_entries_without_data());
}

#[test]
fn solaris_and_global_extended_headers_read_as_tar_and_bsdtar_read_them() {
    run_corpus("extended headers", extended_headers());
}

#[test]
fn zstd_and_gzip_framings_read_as_tar_and_bsdtar_read_them() {
    let pzstd = Command::new("pzstd")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !pzstd {
        crate::fixture::skip("the pzstd case needs pzstd (apt-get install zstd)");
    }
    run_corpus("framings", framings());
}

#[test]
fn long_names_prefixes_base_256_and_v7_read_as_tar_and_bsdtar_read_them() {
    run_corpus("forms", forms());
}

#[test]
fn ordinary_archives_publish_what_tar_and_bsdtar_extract() {
    run_corpus("ordinary", ordinary());
}

#[test]
fn archives_that_leave_the_tree_or_are_broken_are_refused() {
    let mut cases = leaving_the_tree();
    cases.extend(broken());
    run_corpus("hostile", cases);
}

/// `PACKSYNC_TAR_CORPUS=DIR`: every file in DIR (other projects' test
/// archives, fetched by hand: none is committed), compared the same way.
#[test]
#[ignore = "needs PACKSYNC_TAR_CORPUS=DIR of outside archives: run by hand"]
fn archives_from_elsewhere_publish_what_tar_or_bsdtar_extracts() {
    let dir = std::env::var_os("PACKSYNC_TAR_CORPUS")
        .expect("PACKSYNC_TAR_CORPUS=DIR: a directory of archives to compare");
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    let cases = files
        .iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            case(&name, fs::read(p).unwrap(), Expect::Either)
        })
        .collect();
    run_corpus("corpus", cases);
}

// ---------------------------------------------------------------------------
// Random archives against Python's tarfile.

/// A random archive of a few entries: files, directories (some with a size
/// field and no data), symlinks, hardlinks to earlier files, PAX and GNU
/// names, global and Solaris headers; then, for some, a mutation (a byte
/// of an entry's header changed and the header resealed, a size field
/// rewritten, a cut). Extension headers are left whole: tarfile reads
/// them unlike every other reader (it stops at a bad mode field of an `x`
/// header, which GNU tar, bsdtar and packsync never read; it takes a GNU
/// long name to the first NUL of its block, past the record's size).
fn random_archive(rng: &mut Rng) -> (Vec<u8>, bool) {
    // Directories and leaves from different names, so that most archives
    // have no file in the way of a directory (some still do: `.`, reuse).
    const DIRS: [&str; 4] = ["d", "x y", "e", "."];
    const LEAVES: [&str; 4] = ["f", "long-component", "g", "h i"];
    let pick = |rng: &mut Rng, from: &[&'static str]| from[rng.below(from.len() as u64) as usize];
    let mut t = Tar::default();
    let mut files: Vec<String> = Vec::new();
    for _ in 0..1 + rng.below(7) {
        let mut flag = [b'0', b'0', b'5', b'2', b'1', 0][rng.below(6) as usize];
        if flag == b'1' && files.is_empty() {
            flag = b'0';
        }
        let mut parts: Vec<&str> = (0..rng.below(3)).map(|_| pick(rng, &DIRS)).collect();
        parts.push(pick(rng, if flag == b'5' { &DIRS } else { &LEAVES }));
        if rng.below(12) == 0 {
            parts.insert(0, "");
        }
        let mut name = parts.join("/");
        if name.trim_matches(['/', '.']).is_empty() {
            name = "d".into();
        }
        if rng.below(10) == 0 {
            name = format!("{}/{name}", "w".repeat(100 + rng.below(60) as usize));
        }
        let data: Vec<u8> = (0..rng.below(1300)).map(|_| rng.next() as u8).collect();
        let mut e = h("placeholder", flag);
        e.mtime = T0 + rng.below(1000) as i64;
        e.mode = [0o644, 0o755, 0o600, 0o4711][rng.below(4) as usize];
        match flag {
            b'5' => {
                name.push('/');
                if rng.below(3) == 0 {
                    e.size = [1, 255, 512, 1024][rng.below(4) as usize];
                }
            }
            b'2' => {
                e.link = pick(rng, &LEAVES).as_bytes().to_vec();
                if rng.below(4) == 0 {
                    e.size = 700;
                }
            }
            b'1' => {
                let target = &files[rng.below(files.len() as u64) as usize];
                e.link = target.as_bytes()[..target.len().min(100)].to_vec();
            }
            _ => e.size = data.len() as i64,
        }
        let data: &[u8] = if matches!(flag, b'0' | 0) { &data } else { b"" };
        // The name the entry ends up with: whole where an extension or the
        // prefix carries it, else cut to the 100 bytes of the name field.
        let mut full = name.clone();
        match rng.below(8) {
            0 => {
                t.ext(b'x', &[("path", name.as_bytes())]);
            }
            1 => {
                t.long(b'L', name.as_bytes());
            }
            2 => {
                t.ext(
                    b'X',
                    &[("mtime", b"1234567890.5"), ("path", name.as_bytes())],
                );
            }
            3 => {
                t.ext(b'g', &[("mtime", b"1300000000")]);
                full.truncate(100);
            }
            4 if name.len() > 100 => {
                let cut = name[..name.len() - 1].rfind('/').unwrap_or(0);
                if cut > 0 && cut <= 155 && name.len() - cut - 1 <= 100 {
                    e.prefix = name.as_bytes()[..cut].to_vec();
                    name = name[cut + 1..].to_string();
                } else {
                    full.truncate(100);
                }
            }
            _ => full.truncate(100),
        }
        e.name = name.as_bytes()[..name.len().min(100)].to_vec();
        if flag == b'0' || flag == 0 {
            files.push(full);
        }
        t.raw(&e, data);
    }
    let headers = t.headers.clone();
    let mut out = t.end();
    let mutated = match rng.below(5) {
        0 => {
            // One header byte changed, the checksum made right again.
            let at = headers[rng.below(headers.len() as u64) as usize];
            let field = [0usize, 100, 124, 136, 156, 157, 257, 345][rng.below(8) as usize];
            let i = at + field + rng.below(12) as usize;
            out[i] = [0u8, b'/', b'.', b'0', b'7', b'5', b'x', 0x80, 0xff][rng.below(9) as usize];
            seal(&mut out[at..at + 512]);
            true
        }
        1 => {
            let at = headers[rng.below(headers.len() as u64) as usize];
            let size = [0i64, 1, 511, 512, 513, 1536][rng.below(6) as usize];
            num(&mut out[at + 124..at + 136], size, false);
            seal(&mut out[at..at + 512]);
            true
        }
        2 if rng.below(3) == 0 => {
            let cut = rng.below(out.len() as u64) as usize;
            out.truncate(cut);
            true
        }
        _ => false,
    };
    (out, mutated)
}

/// Python's tarfile on each archive: the tree an extraction makes of its
/// listing (hex path → kind, size, content digest or hex link target); or
/// why packsync must refuse it (a name that leaves the tree, a hardlink to
/// no earlier file); or that tarfile stopped before the end-of-archive
/// block (`stops`) or failed (`error`); or why there is no verdict
/// (`unsure`).
const ORACLE: &str = r#"
import hashlib, json, os, sys, tarfile

class Refuse(Exception): pass
class Unsure(Exception): pass

def parts(name):
    ps = [p for p in name.split('/') if p not in ('', '.')]
    if '..' in ps: raise Refuse('.. in ' + name)
    if any('\0' in p for p in ps): raise Unsure('NUL in a name')
    return ps

def verdict(path):
    tree = {}
    def put(ps, node):
        for i in range(1, len(ps)):
            q = '/'.join(ps[:i])
            k = tree.get(q)
            if k is None: tree[q] = ['d']
            elif k[0] == 'l': raise Refuse('through the symlink ' + q)
            elif k[0] != 'd': raise Unsure('below the file ' + q)
        p = '/'.join(ps)
        old = tree.get(p)
        if old is not None and (old[0] == 'd') != (node[0] == 'd'):
            raise Unsure('a directory and a non-directory at ' + p)
        if old is not None and old[0] == 'd': return
        tree[p] = node
    with open(path, 'rb') as raw:
        size = os.fstat(raw.fileno()).st_size
        t = tarfile.open(fileobj=raw, mode='r:')
        for m in t:
            ps = parts(m.name)
            if not ps:
                if m.isdir(): continue
                raise Unsure('an entry without a name')
            if m.isdir(): put(ps, ['d'])
            elif m.isreg() and m.name.endswith('/'):
                # A directory to GNU tar and bsdtar, a file to tarfile.
                raise Unsure('a regular-file header named ' + m.name)
            elif m.isreg():
                data = t.extractfile(m).read()
                put(ps, ['f', len(data), hashlib.sha256(data).hexdigest()])
            elif m.issym(): put(ps, ['l', os.fsencode(m.linkname).hex()])
            elif m.islnk():
                tp = '/'.join(parts(m.linkname))
                node = tree.get(tp)
                if node is None or node[0] != 'f': raise Refuse('hardlink to no earlier file: ' + m.linkname)
                if tp == '/'.join(ps): raise Unsure('hardlink to itself')
                put(ps, list(node))
            else: raise Unsure('type %r' % m.type)
        end = t.offset
        raw.seek(end)
        if raw.read(512) != b'\0' * 512:
            return {'stops': 'tarfile stops at byte %d, before any end-of-archive block' % end}
    return {'tree': {os.fsencode(p).hex(): v for p, v in tree.items()}}

def text(e):
    return str(e).encode('utf-8', 'backslashreplace').decode()

out = {}
for path in sys.argv[1:]:
    try: out[os.path.basename(path)] = verdict(path)
    except Refuse as e: out[os.path.basename(path)] = {'refuse': text(e)}
    except Unsure as e: out[os.path.basename(path)] = {'unsure': text(e)}
    except Exception as e: out[os.path.basename(path)] = {'error': type(e).__name__ + ': ' + text(e)}
json.dump(out, sys.stdout)
"#;

/// The tree packsync published, as the oracle writes one.
fn listing(root: &Path) -> BTreeMap<String, serde_json::Value> {
    let mut out = BTreeMap::new();
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, serde_json::Value>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap();
            let rel = hex(p.strip_prefix(root).unwrap().as_os_str().as_bytes());
            let v = if m.file_type().is_symlink() {
                let t = fs::read_link(&p).unwrap();
                serde_json::json!(["l", hex(t.as_os_str().as_bytes())])
            } else if m.is_dir() {
                walk(root, &p, out);
                serde_json::json!(["d"])
            } else {
                serde_json::json!(["f", m.len(), file_digest(&p, m.len())])
            };
            out.insert(rel, v);
        }
    }
    walk(root, root, &mut out);
    out
}

#[test]
fn random_archives_list_as_python_tarfile_lists_them() {
    let mut rng = Rng::new("random archives");
    let f = Fixture::new();
    let dir = f.path("archives");
    fs::create_dir(&dir).unwrap();
    const N: usize = 160;
    let mut names = Vec::new();
    let mut mutated = std::collections::HashSet::new();
    for i in 0..N {
        let name = format!("r{i:03}.tar");
        let (bytes, changed) = random_archive(&mut rng);
        fs::write(dir.join(&name), bytes).unwrap();
        if changed {
            mutated.insert(name.clone());
        }
        names.push(name);
    }
    let out = Command::new("python3")
        .arg("-c")
        .arg(ORACLE)
        .args(names.iter().map(|n| dir.join(n)))
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "the oracle failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let verdicts: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (mut judged, mut refused, mut bad) = (0, 0, Vec::new());
    for name in &names {
        let v = &verdicts[name];
        let g = Fixture::new();
        fs::copy(dir.join(name), g.path(name)).unwrap();
        let run = g.packsync(&["sync", "--grace", "0", "--no-fsync", name, "vol/packs"]);
        let keep = || {
            let _ = fs::copy(
                dir.join(name),
                std::env::temp_dir().join(format!("packsync-{name}")),
            );
        };
        if run.code != 0 {
            if run.code != 1 && run.code != 2 || run.stderr.trim_end().lines().count() != 1 {
                keep();
                bad.push(format!("{name}: exit {}: {}", run.code, run.stderr));
            }
            refused += 1;
            continue;
        }
        if let Some(why) = v.get("refuse") {
            keep();
            bad.push(format!("{name}: published, but tarfile says {why}"));
            continue;
        }
        // tarfile parses every field of every header, also those a PAX
        // record overrides and GNU tar and bsdtar skip: on a mutated
        // archive its failure is no verdict, on a generated one it is.
        if let Some(why) = v.get("error").or(v.get("stops")) {
            if !mutated.contains(name) {
                keep();
                bad.push(format!("{name}: published, but tarfile says {why}"));
            }
            continue;
        }
        let Some(tree) = v.get("tree") else { continue };
        judged += 1;
        let want: BTreeMap<String, serde_json::Value> =
            serde_json::from_value(tree.clone()).unwrap();
        let got = listing(&g.dest());
        if got != want {
            keep();
            let show = |m: &BTreeMap<String, serde_json::Value>| -> Vec<String> {
                m.iter()
                    .map(|(k, v)| {
                        let bytes: Vec<u8> = (0..k.len())
                            .step_by(2)
                            .map(|i| u8::from_str_radix(&k[i..i + 2], 16).unwrap())
                            .collect();
                        format!("{:?} {v}", String::from_utf8_lossy(&bytes))
                    })
                    .collect()
            };
            bad.push(format!(
                "{name}: packsync published {:?}, tarfile lists {:?}",
                show(&got),
                show(&want)
            ));
        }
    }
    eprintln!("random archives: {judged} compared, {refused} refused, of {N}");
    assert!(
        bad.is_empty(),
        "{} of {N} random archives differ (kept as {}/packsync-rNNN.tar):\n{}",
        bad.len(),
        std::env::temp_dir().display(),
        bad.join("\n")
    );
}
