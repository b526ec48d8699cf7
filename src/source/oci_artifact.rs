//! OCI artifacts: what an image manifest's layers publish, and how.
//!
//! * Without `--layer-media-type`: a layer titled by
//!   `org.opencontainers.image.title` (what `oras push FILE` writes) is the
//!   file of that name, its bytes as they are (never decompressed), mode
//!   0644, owner 0:0, mtime the manifest's `org.opencontainers.image.created`
//!   (else 0: so the same manifest digest always makes the same tree and
//!   the same generation name). A title is checked as a tar entry name is,
//!   and more strictly: not empty, not absolute, no `..` component, no NUL;
//!   a `/` inside makes directories, as `oras pull` does. A titled layer
//!   with `io.deis.oras.content.unpack: true` (`oras push DIR`) is a
//!   tar(+gzip) whose entries are all below the title (what oras writes):
//!   unpacked there, any entry outside refused. An untitled layer of an
//!   image layer type (tar, tar+gzip, tar+zstd) is unpacked with whiteouts,
//!   as images are.
//! * With `--layer-media-type TYPE...`, only the layers of those media
//!   types count (Flux's `layerSelector.mediaType`). One of a tar type (the
//!   subtype has a `tar` part: `vnd.oci.image.layer.v1.tar+gzip`,
//!   `vnd.cncf.flux.content.v1.tar+gzip`) is unpacked at the root, title or
//!   not (Flux's `extract`, and what OPA does with an `oci` bundle: its
//!   files become the tree); another is its titled file.
//! * A layer that is none of these is refused, naming it; a manifest with
//!   nothing to publish lists the media types it has.
//!
//! Pure (the spool does the writing).

use std::io::{self, Read};

use anyhow::{bail, Result};

use super::oci_image::{is_layer_type, TITLE, UNPACK};
use super::store::Descriptor;
use crate::escape::percent;

/// How one layer is published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Use {
    /// A tar stream applied at the root (with OCI whiteouts or not).
    Layer { whiteouts: bool },
    /// The blob as the file of this name.
    File(Vec<u8>),
    /// A tar stream whose entries all lie below this directory.
    Dir(Vec<u8>),
}

/// A layer and how it is published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    pub desc: Descriptor,
    pub how: Use,
}

/// The longest title taken.
const MAX_TITLE: usize = 4096;

/// A media type without its parameters, lowercased.
fn bare(t: &str) -> String {
    t.split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// Whether a media type names a tar stream (compressed or not).
fn tarlike(t: &str) -> bool {
    let t = bare(t);
    is_layer_type(&t)
        || t.split_once('/')
            .is_some_and(|(_, sub)| sub.split(['.', '+', '-']).any(|p| p == "tar"))
}

/// A title as a name in the tree: refused where a tar entry name would be,
/// and where absolute or empty.
pub fn check_title(title: &str) -> Result<Vec<u8>> {
    let shown = || percent(title.as_bytes());
    if title.is_empty() || title.len() > MAX_TITLE {
        bail!("the title {:?} is empty or too long", shown());
    }
    if title.starts_with('/') {
        bail!("the title {} is absolute (refused)", shown());
    }
    let parts = super::spool::components(title.as_bytes())?;
    if parts.is_empty() {
        bail!("the title {} names no file", shown());
    }
    Ok(parts.join(&b'/'))
}

/// What `layers` publish, in order; `select`: `--layer-media-type` (sorted,
/// lowercased; empty: every layer that can be).
pub fn plan(layers: &[Descriptor], select: &[String]) -> Result<Vec<Planned>> {
    let mut out = Vec::new();
    let mut titles: Vec<Vec<u8>> = Vec::new();
    let mut kept = 0;
    for (i, l) in layers.iter().enumerate() {
        let mt = bare(&l.media_type);
        if !select.is_empty() && !select.contains(&mt) {
            continue;
        }
        kept += 1;
        let ann = |k: &str| l.annotations.as_ref().and_then(|a| a.get(k));
        let title = ann(TITLE);
        let how = if !select.is_empty() && tarlike(&mt) {
            Use::Layer {
                whiteouts: is_layer_type(&mt),
            }
        } else if let Some(t) = title {
            let name = check_title(t)
                .map_err(|e| anyhow::anyhow!("layer {} ({}): {e:#}", i + 1, short(&l.digest)))?;
            if titles.contains(&name) {
                bail!("two layers are titled {}", percent(&name));
            }
            titles.push(name.clone());
            if ann(UNPACK).is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
                Use::Dir(name)
            } else {
                Use::File(name)
            }
        } else if select.is_empty() && is_layer_type(&mt) {
            Use::Layer { whiteouts: true }
        } else {
            if select.is_empty() && layers.iter().all(|l| !publishable(l)) {
                break;
            }
            bail!(
                "layer {} ({}) of media type {} has no {TITLE} and is not a tar layer{}",
                i + 1,
                short(&l.digest),
                shown(&l.media_type),
                if select.is_empty() {
                    " (choose the layers to publish with --layer-media-type)"
                } else {
                    ""
                }
            );
        };
        out.push(Planned {
            desc: l.clone(),
            how,
        });
    }
    if out.is_empty() {
        let types = listed(layers);
        if select.is_empty() || kept > 0 {
            bail!("nothing to publish: layers are {types}; use --layer-media-type");
        }
        bail!(
            "nothing to publish: no layer is of --layer-media-type {}; layers are {types}",
            select.join(", ")
        );
    }
    Ok(out)
}

/// Whether a layer publishes without `--layer-media-type`.
fn publishable(l: &Descriptor) -> bool {
    l.annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(TITLE))
        || is_layer_type(&bare(&l.media_type))
}

/// A media type for a message: escaped, and cut where absurdly long.
fn shown(t: &str) -> String {
    let t = if t.is_empty() { "(none)" } else { t };
    let cut: String = t.chars().take(128).collect();
    percent(cut.as_bytes())
}

/// `a (2), b`: the media types of `layers` in the order they come.
fn listed(layers: &[Descriptor]) -> String {
    let mut seen: Vec<(String, usize)> = Vec::new();
    for l in layers {
        let t = shown(&l.media_type);
        match seen.iter_mut().find(|(s, _)| *s == t) {
            Some((_, n)) => *n += 1,
            None => {
                if seen.len() == 16 {
                    continue;
                }
                seen.push((t, 1));
            }
        }
    }
    if seen.is_empty() {
        return "none".to_string();
    }
    seen.iter()
        .map(|(t, n)| match n {
            1 => t.clone(),
            n => format!("{t} ({n})"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn short(d: &str) -> &str {
    super::store::short(d)
}

/// A blob as a one-file tar stream, for the spool to apply: a PAX header
/// (the name, the mtime, the size) then the entry, mode 0644, owner 0:0,
/// then the blob's bytes read through (so a digest-checking reader below
/// sees all of them and its end), padding and the end of the archive. The
/// stream begins with the PAX header's name, so it is never taken for a
/// compressed one.
pub struct FileTar<R> {
    head: Vec<u8>,
    at: usize,
    inner: R,
    left: u64,
    tail: Vec<u8>,
    tail_at: usize,
    ended: bool,
}

impl<R: Read> FileTar<R> {
    pub fn new(name: &[u8], size: u64, mtime: i64, inner: R) -> FileTar<R> {
        let mut recs = Vec::new();
        record(&mut recs, b"path", name);
        record(&mut recs, b"mtime", mtime.to_string().as_bytes());
        record(&mut recs, b"size", size.to_string().as_bytes());
        let mut head = header(b"././@PaxHeader", b'x', recs.len() as u64, 0o644, 0);
        head.extend_from_slice(&recs);
        pad(&mut head);
        let octal_size = if size < 0o77777777777 { size } else { 0 };
        head.extend(header(
            b"artifact",
            b'0',
            octal_size,
            0o644,
            mtime.max(0) as u64,
        ));
        let mut tail = vec![0; ((512 - size % 512) % 512) as usize];
        tail.extend_from_slice(&[0; 1024]);
        FileTar {
            head,
            at: 0,
            inner,
            left: size,
            tail,
            tail_at: 0,
            ended: false,
        }
    }
}

fn pad(v: &mut Vec<u8>) {
    while !v.len().is_multiple_of(512) {
        v.push(0);
    }
}

/// One PAX record: `LEN KEY=VALUE\n`, LEN counting itself.
fn record(out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    let body = key.len() + value.len() + 3;
    let mut len = body + 1;
    while len != body + len.to_string().len() {
        len = body + len.to_string().len();
    }
    out.extend_from_slice(len.to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(key);
    out.push(b'=');
    out.extend_from_slice(value);
    out.push(b'\n');
}

/// A ustar header block.
fn header(name: &[u8], kind: u8, size: u64, mode: u32, mtime: u64) -> Vec<u8> {
    let mut h = vec![0u8; 512];
    let octal = |h: &mut [u8], at: usize, width: usize, v: u64| {
        let s = format!("{v:0w$o}", w = width - 1);
        h[at..at + width - 1].copy_from_slice(s.as_bytes());
    };
    h[..name.len()].copy_from_slice(name);
    octal(&mut h, 100, 8, mode as u64);
    octal(&mut h, 108, 8, 0);
    octal(&mut h, 116, 8, 0);
    octal(&mut h, 124, 12, size);
    octal(&mut h, 136, 12, mtime.min(0o77777777777));
    h[156] = kind;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| b as u32).sum();
    let s = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(s.as_bytes());
    h
}

impl<R: Read> Read for FileTar<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.at < self.head.len() {
            let n = buf.len().min(self.head.len() - self.at);
            buf[..n].copy_from_slice(&self.head[self.at..self.at + n]);
            self.at += n;
            return Ok(n);
        }
        if self.left > 0 {
            let room = buf.len().min(self.left.min(usize::MAX as u64) as usize);
            let n = self.inner.read(&mut buf[..room])?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the blob ended before its size",
                ));
            }
            self.left -= n as u64;
            return Ok(n);
        }
        if !self.ended {
            // The blob's own end: where a checking reader compares digests.
            let mut probe = [0u8; 1];
            if self.inner.read(&mut probe)? != 0 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "the blob is longer than its descriptor says",
                ));
            }
            self.ended = true;
        }
        let n = buf.len().min(self.tail.len() - self.tail_at);
        buf[..n].copy_from_slice(&self.tail[self.tail_at..self.tail_at + n]);
        self.tail_at += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn l(mt: &str, title: Option<&str>, n: u8) -> Descriptor {
        Descriptor {
            media_type: mt.into(),
            digest: format!("sha256:{}", format!("{n:02x}").repeat(32)),
            size: 1,
            platform: None,
            annotations: title.map(|t| BTreeMap::from([(TITLE.to_string(), t.to_string())])),
        }
    }

    const TGZ: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

    #[test]
    fn titles_tars_and_selections() {
        let hows = |layers: &[Descriptor], sel: &[&str]| {
            let sel: Vec<String> = sel.iter().map(|s| s.to_string()).collect();
            plan(layers, &sel).map(|p| p.into_iter().map(|p| p.how).collect::<Vec<_>>())
        };
        let mixed = [
            l("text/plain", Some("a.txt"), 1),
            l(TGZ, None, 2),
            l("application/x.foo", Some("dir/b.bin"), 3),
        ];
        assert_eq!(
            hows(&mixed, &[]).unwrap(),
            [
                Use::File(b"a.txt".to_vec()),
                Use::Layer { whiteouts: true },
                Use::File(b"dir/b.bin".to_vec())
            ]
        );
        assert_eq!(
            hows(&mixed, &[TGZ]).unwrap(),
            [Use::Layer { whiteouts: true }]
        );
        assert_eq!(
            hows(&mixed, &["text/plain"]).unwrap(),
            [Use::File(b"a.txt".to_vec())]
        );
        let flux = [l("application/vnd.cncf.flux.content.v1.tar+gzip", None, 1)];
        assert_eq!(
            hows(&flux, &["application/vnd.cncf.flux.content.v1.tar+gzip"]).unwrap(),
            [Use::Layer { whiteouts: false }]
        );
        let e = hows(&flux, &[]).unwrap_err().to_string();
        assert_eq!(
            e,
            "nothing to publish: layers are application/vnd.cncf.flux.content.v1.tar+gzip; use --layer-media-type"
        );
        let foo = [
            l("application/x.foo", None, 1),
            l("application/x.foo", None, 2),
            l("application/vnd.bar", None, 3),
        ];
        assert_eq!(
            hows(&foo, &[]).unwrap_err().to_string(),
            "nothing to publish: layers are application/x.foo (2), application/vnd.bar; use --layer-media-type"
        );
        let e = hows(&foo, &["text/plain"]).unwrap_err().to_string();
        assert!(
            e.contains(
                "no layer is of --layer-media-type text/plain; layers are application/x.foo (2)"
            ),
            "{e}"
        );
        let e = hows(&[l(TGZ, None, 1), l("application/x.foo", None, 2)], &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("layer 2 (sha256:020202020202) of media type application/x.foo has no"),
            "{e}"
        );
    }

    #[test]
    fn hostile_titles_are_refused() {
        for bad in [
            "../x",
            "a/../../x",
            "/etc/passwd",
            "",
            "a\0b",
            ".",
            "./",
            "a/..",
        ] {
            assert!(
                plan(&[l("text/plain", Some(bad), 1)], &[]).is_err(),
                "{bad:?}"
            );
        }
        assert!(plan(
            &[
                l("text/plain", Some("a"), 1),
                l("text/plain", Some("./a"), 2)
            ],
            &[]
        )
        .is_err());
        assert_eq!(check_title("./a//b").unwrap(), b"a/b");
    }

    #[test]
    fn a_file_tar_reads_back_as_one_file() {
        let data = b"hello, world".repeat(100);
        let mut t = FileTar::new(b"dir/notes.txt", data.len() as u64, -5, &data[..]);
        let mut all = Vec::new();
        t.read_to_end(&mut all).unwrap();
        assert_eq!(all.len() % 512, 0);
        let mut r = crate::source::tar::Reader::new(&all[..]);
        let h = r.next_entry().unwrap().unwrap();
        assert_eq!(h.path, b"dir/notes.txt");
        assert_eq!((h.mode & 0o7777, h.mtime.0), (0o644, -5));
        let mut got = Vec::new();
        let mut buf = [0u8; 100];
        loop {
            match r.read_data(&mut buf).unwrap() {
                0 => break,
                n => got.extend_from_slice(&buf[..n]),
            }
        }
        assert_eq!(got, data);
        assert!(r.next_entry().unwrap().is_none());
        let mut short = FileTar::new(b"x", 10, 0, &b"abc"[..]);
        assert!(short.read_to_end(&mut Vec::new()).is_err());
        let mut long = FileTar::new(b"x", 2, 0, &b"abc"[..]);
        assert!(long.read_to_end(&mut Vec::new()).is_err());
    }
}
