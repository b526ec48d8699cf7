//! Image archives: a FILE that is a tar of an image, as `podman save`,
//! `skopeo copy … oci-archive:F` and `docker save` write it.
//! `oci-archive:FILE[:TAG][//PATH]` is a tar of an OCI image layout;
//! `docker-archive:FILE[:NAME:TAG|:@N][//PATH]` holds `manifest.json`, each
//! image's config and its layer tars (the legacy `docker save` form, or
//! the one Docker 25 writes beside an OCI layout).
//!
//! The outer tar is never unpacked: its members are indexed once by
//! offset (headers only, one `pread` each: `Members`), and each document
//! or layer is then read from its offset through the same descriptor, its
//! size and digest checked as any image's blob is (`oci_fetch::Checked`).
//! A docker-archive's layers have no descriptors: a layer is checked
//! against the digest its member name carries (`blobs/sha256/HEX`,
//! `HEX.tar`), else against its config's `rootfs.diff_ids`, and the image
//! is named by its config's digest (the image ID `podman images` shows).
//!
//! `image_hint` tells a plain FILE SOURCE that is such an archive, so that
//! it is not unpacked as a tar of `blobs/`.

use std::collections::HashMap;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use super::oci_fetch::{self, check_document, sha256_of};
use super::oci_image::DOCKER_MANIFEST;
use super::oci_ref::{split_subpath, valid_digest, valid_tag};
use super::store::{short, Descriptor, Store};
use super::tar::{self, Kind};
use crate::error;
use crate::sys;

/// More members than any image archive holds (each layer is one to four).
const MAX_MEMBERS: usize = 1 << 16;
/// The names of all members together, at most (a hostile tar's 64 KiB
/// names would otherwise add up to gigabytes).
const MAX_NAME_BYTES: usize = 16 << 20;
/// How many symlinks one member name may go through.
const MAX_HOPS: usize = 8;

/// A member of the outer tar: where its data is, or what it links to.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Member {
    File {
        offset: u64,
        size: u64,
    },
    Dir,
    /// A symlink (relative to the member's directory) or a hardlink
    /// (a name in the archive).
    Symlink(Vec<u8>),
    Hardlink(Vec<u8>),
}

/// A tar's member names, `./` and `/` stripped, each to its member (a
/// later one of the same name replaces an earlier one, as tar does).
struct Members {
    fd: Arc<OwnedFd>,
    by_name: HashMap<Vec<u8>, Member>,
}

/// `a/./b/` → `a/b`; `None` for a `..` that leaves the archive.
fn clean(path: &[u8]) -> Option<Vec<u8>> {
    let mut parts: Vec<&[u8]> = Vec::new();
    for c in path.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                parts.pop()?;
            }
            c => parts.push(c),
        }
    }
    Some(parts.join(&b'/'))
}

/// Reads a file from an offset on, by `pread`, never moving the
/// descriptor's own offset; at most up to `end`.
struct At {
    fd: Arc<OwnedFd>,
    pos: u64,
    end: u64,
}

impl Read for At {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let room = (self.end - self.pos).min(buf.len() as u64) as usize;
        if room == 0 {
            return Ok(0);
        }
        let n = sys::pread(self.fd.as_fd(), &mut buf[..room], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// Whether `head` starts a compressed stream (gzip or zstd).
fn compressed(head: &[u8]) -> bool {
    !matches!(
        super::decode::Format::sniff(head),
        super::decode::Format::Tar
    )
}

impl Members {
    /// Index the tar `fd` holds, reading its headers only: `visit` sees
    /// each member name as it comes and may stop the walk (`false`), which
    /// is then no error. A truncated or malformed tar is an error.
    fn walk(fd: &Arc<OwnedFd>, mut visit: impl FnMut(&[u8], &Member) -> bool) -> Result<()> {
        let len = sys::fstat(fd.as_fd())?.st_size as u64;
        let mut at = 0u64;
        let mut count = 0usize;
        loop {
            let mut r = tar::Reader::new(At {
                fd: fd.clone(),
                pos: at,
                end: len,
            });
            let Some(h) = r.next_entry()? else {
                return Ok(());
            };
            let data = r.into_inner().pos;
            count += 1;
            if count > MAX_MEMBERS {
                bail!("more than {MAX_MEMBERS} members");
            }
            let (member, carried) = match h.kind {
                Kind::File | Kind::Other(_) => (
                    Member::File {
                        offset: data,
                        size: h.size,
                    },
                    h.size,
                ),
                Kind::Dir => (Member::Dir, 0),
                Kind::Symlink(t) => (Member::Symlink(t), 0),
                Kind::Hardlink(t) => (Member::Hardlink(t), 0),
            };
            if data.checked_add(carried).is_none_or(|e| e > len) {
                bail!(
                    "truncated inside member {}",
                    crate::escape::c_style(&h.path)
                );
            }
            if let Some(name) = clean(&h.path) {
                if !visit(&name, &member) {
                    return Ok(());
                }
            }
            at = data + carried.div_ceil(tar::BLOCK as u64) * tar::BLOCK as u64;
        }
    }

    /// Every member of the tar at `fd` (uncompressed: its members are read
    /// by offset).
    fn index(fd: OwnedFd) -> Result<Members> {
        let mut head = [0u8; 4];
        let n = sys::pread(fd.as_fd(), &mut head, 0)?;
        if compressed(&head[..n]) {
            bail!("the archive is compressed: an image archive is read as a plain tar (decompress it first)");
        }
        let fd = Arc::new(fd);
        let mut by_name = HashMap::new();
        let mut bytes = 0usize;
        Members::walk(&fd, |name, m| {
            bytes += name.len()
                + match m {
                    Member::Symlink(t) | Member::Hardlink(t) => t.len(),
                    _ => 0,
                };
            by_name.insert(name.to_vec(), m.clone());
            bytes <= MAX_NAME_BYTES
        })?;
        if bytes > MAX_NAME_BYTES {
            bail!("member names longer than {MAX_NAME_BYTES} bytes in all");
        }
        Ok(Members { fd, by_name })
    }

    /// The regular file `name` names, through symlinks and hardlinks of
    /// the archive: (offset, size).
    fn find(&self, name: &[u8]) -> Option<(u64, u64)> {
        let mut name = clean(name)?;
        for _ in 0..MAX_HOPS {
            match self.by_name.get(&name)? {
                Member::File { offset, size } => return Some((*offset, *size)),
                Member::Dir => return None,
                Member::Hardlink(t) => name = clean(t)?,
                Member::Symlink(t) => {
                    let mut p = match name.iter().rposition(|&b| b == b'/') {
                        Some(i) if !t.starts_with(b"/") => name[..=i].to_vec(),
                        _ => Vec::new(),
                    };
                    p.extend_from_slice(t);
                    name = clean(&p)?;
                }
            }
        }
        None
    }

    /// The member `name` as it streams.
    fn open(&self, name: &[u8]) -> Option<(At, u64)> {
        let (offset, size) = self.find(name)?;
        let r = At {
            fd: self.fd.clone(),
            pos: offset,
            end: offset + size,
        };
        Some((r, size))
    }

    /// The member `name`, whole (a document: at most `MAX_DOCUMENT` bytes).
    fn read(&self, label: &str, name: &str) -> Result<Vec<u8>> {
        let Some((mut r, size)) = self.open(name.as_bytes()) else {
            bail!("{label}: the archive has no {name}");
        };
        if size > crate::net::MAX_DOCUMENT {
            bail!(
                "{label}: {name} is larger than {} bytes",
                crate::net::MAX_DOCUMENT
            );
        }
        let mut out = Vec::with_capacity(size as usize);
        r.read_to_end(&mut out)
            .with_context(|| format!("{label}: cannot read {name}"))?;
        Ok(out)
    }
}

/// What a plain FILE SOURCE is when it is an image archive: the line that
/// says which SOURCE form reads it. Only the headers of an uncompressed
/// tar are read, and only while every member looks like one of an image
/// archive's (`oci-layout`, `index.json`, `manifest.json`, `repositories`,
/// `blobs/sha256/HEX`, `HEX.json`, `HEX.tar`, `ID/layer.tar`…): a bundle
/// or a release tarball stops the walk at its first member.
pub fn image_hint(file: &Path, shown: &str) -> Option<String> {
    let fd = Arc::new(sys::open_file_path(file).ok()?);
    let mut head = [0u8; 4];
    let n = sys::pread(fd.as_fd(), &mut head, 0).ok()?;
    if compressed(&head[..n]) {
        return None;
    }
    let hex = |s: &[u8]| s.len() == 64 && s.iter().all(|b| b.is_ascii_hexdigit());
    let (mut layout, mut index, mut docker, mut shaped) = (false, false, false, true);
    let walked = Members::walk(&fd, |name, _| {
        let parts: Vec<&[u8]> = name.split(|&b| b == b'/').collect();
        let fits = match parts.as_slice() {
            [b"oci-layout"] => {
                layout = true;
                true
            }
            [b"index.json"] => {
                index = true;
                true
            }
            [b"manifest.json"] => {
                docker = true;
                true
            }
            [b""] | [b"repositories"] | [b"blobs"] | [b"blobs", b"sha256"] => true,
            [b"blobs", b"sha256", h] => hex(h),
            [f] => {
                f.strip_suffix(b".json")
                    .or(f.strip_suffix(b".tar"))
                    .is_some_and(hex)
                    || hex(f)
            }
            [id, rest] => hex(id) && matches!(*rest, b"VERSION" | b"json" | b"layer.tar"),
            _ => false,
        };
        shaped &= fits;
        shaped
    });
    if walked.is_err() || !shaped {
        return None;
    }
    if layout && index {
        Some(format!(
            "{shown} is an OCI image archive: use oci-archive:{shown}"
        ))
    } else if docker {
        Some(format!(
            "{shown} is a Docker image archive (docker save): use docker-archive:{shown}"
        ))
    } else {
        None
    }
}

/// `PREFIX:FILE[:REF][//PATH]` split: FILE is the longest part before a
/// `:` that names a regular file (a FILE may hold colons), REF what
/// follows it. A FILE that does not exist is a usage error.
fn split_file(arg: &str, prefix: &str) -> Result<(PathBuf, Option<String>, Option<Vec<u8>>)> {
    let rest = arg
        .strip_prefix(prefix)
        .expect("the caller matched the prefix");
    let (main, subpath) = split_subpath(rest, 0)?;
    let is_file = |p: &str| {
        sys::stat_path(Path::new(p)).is_ok_and(|st| sys::kind_of(&st) == sys::StatKind::File)
    };
    if main.is_empty() {
        bail!("no file ({prefix}FILE)");
    }
    if is_file(main) {
        return Ok((PathBuf::from(main), None, subpath));
    }
    let cut = main
        .char_indices()
        .filter(|&(_, c)| c == ':')
        .map(|(i, _)| i)
        .find(|&i| is_file(&main[..i]));
    match cut {
        Some(i) => Ok((
            PathBuf::from(&main[..i]),
            Some(main[i + 1..].to_string()),
            subpath,
        )),
        None => bail!("{main}: no such file"),
    }
}

/// An image archive FILE, opened and indexed (a usage error, exit 2, when
/// it is not a tar).
struct Opened {
    members: Members,
    path: PathBuf,
    reference: Option<String>,
    subpath: Option<Vec<u8>>,
}

fn open(arg: &str, prefix: &str) -> Result<Opened> {
    let usage = |e: anyhow::Error| error::usage(format!("{arg}: {e:#}"));
    let (file, reference, subpath) = split_file(arg, prefix).map_err(usage)?;
    let fd = sys::open_file_path(&file)
        .map_err(|e| usage(anyhow::anyhow!("cannot read source: {e}")))?;
    let members = Members::index(fd).map_err(|e| usage(e.context("not an image archive")))?;
    let path = sys::canonicalize(&file).unwrap_or(file);
    Ok(Opened {
        members,
        path,
        reference,
        subpath,
    })
}

/// What `oci::Image` needs of an archive: its store, the `base` its
/// identity starts with, the `//PATH`, where the FILE is.
pub struct Parts {
    pub store: Box<dyn Store>,
    pub base: String,
    pub subpath: Option<Vec<u8>>,
    pub path: PathBuf,
}

// ---------------------------------------------------------------- oci-archive

/// A tar of an OCI image layout.
struct OciArchive {
    members: Members,
    tag: Option<String>,
    label: String,
}

/// `oci-archive:FILE[:TAG][//PATH]`.
pub fn open_oci(arg: &str) -> Result<Parts> {
    let o = open(arg, "oci-archive:")?;
    if let Some(t) = &o.reference {
        if !valid_tag(t) {
            return Err(error::usage(format!(
                "{arg}: {t:?} is not a tag (letters, digits, '_', '.', '-', at most 128)"
            )));
        }
    }
    for name in ["oci-layout", "index.json"] {
        if o.members.find(name.as_bytes()).is_none() {
            return Err(error::usage(format!(
                "{arg}: not an OCI image archive (no {name})"
            )));
        }
    }
    Ok(Parts {
        base: format!("oci-archive:{}", o.path.display()),
        subpath: o.subpath,
        path: o.path,
        store: Box::new(OciArchive {
            members: o.members,
            tag: o.reference,
            label: arg.to_string(),
        }),
    })
}

impl OciArchive {
    fn blob_name(digest: &str) -> String {
        format!(
            "blobs/sha256/{}",
            digest.strip_prefix("sha256:").expect("a checked digest")
        )
    }
}

impl Store for OciArchive {
    fn label(&self) -> &str {
        &self.label
    }

    fn root(&self) -> Result<(Vec<u8>, Option<String>, Descriptor)> {
        let index = self.members.read(&self.label, "index.json")?;
        let chosen = oci_fetch::tagged(&self.label, &index, self.tag.as_deref())?;
        let (bytes, ctype) = self.document(&chosen)?;
        Ok((bytes, ctype, chosen))
    }

    fn document(&self, desc: &Descriptor) -> Result<(Vec<u8>, Option<String>)> {
        let bytes = self
            .members
            .read(&self.label, &OciArchive::blob_name(&desc.digest))?;
        check_document(&self.label, &bytes, desc)?;
        let ctype = Some(desc.media_type.clone()).filter(|t| !t.is_empty());
        Ok((bytes, ctype))
    }

    fn blob(&self, desc: &Descriptor) -> Result<(Box<dyn Read + Send + '_>, crate::net::Stop)> {
        let name = OciArchive::blob_name(&desc.digest);
        let Some((r, _)) = self.members.open(name.as_bytes()) else {
            bail!(
                "{}: the archive has no blob {}",
                self.label,
                short(&desc.digest)
            );
        };
        Ok((
            Box::new(io::BufReader::with_capacity(256 << 10, r)),
            crate::net::Stop::default(),
        ))
    }

    fn by_tag(&self, tag: &str) -> Option<Result<Option<Vec<u8>>>> {
        Some((|| {
            let index = self.members.read(&self.label, "index.json")?;
            match oci_fetch::in_index(&self.label, &index, tag)? {
                Some(d) => Ok(Some(self.document(&d)?.0)),
                None => Ok(None),
            }
        })())
    }

    fn referrers(&self, digest: &str) -> Option<Result<Option<Vec<super::store::Referrer>>>> {
        Some(
            self.members
                .read(&self.label, "index.json")
                .and_then(|ix| crate::trust::sigstore::in_layout(self, &ix, digest).map(Some)),
        )
    }

    fn tags_where(&self) -> String {
        "in the archive's index.json".into()
    }
}

// ---------------------------------------------------------------- docker-archive

/// One image of a docker-archive's `manifest.json`.
#[derive(Deserialize)]
struct Saved {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "RepoTags", default)]
    repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers")]
    layers: Vec<String>,
}

#[derive(Deserialize)]
struct Config {
    rootfs: Option<RootFs>,
}

#[derive(Deserialize)]
struct RootFs {
    #[serde(default)]
    diff_ids: Vec<String>,
}

/// A `docker save` archive.
struct DockerArchive {
    members: Members,
    reference: Option<String>,
    label: String,
    /// Each layer's digest → its member name, once `root` read them.
    layers: Mutex<HashMap<String, String>>,
}

/// `docker-archive:FILE[:NAME:TAG|:@N][//PATH]`.
pub fn open_docker(arg: &str) -> Result<Parts> {
    let o = open(arg, "docker-archive:")?;
    if o.members.find(b"manifest.json").is_none() {
        return Err(error::usage(format!(
            "{arg}: not a Docker image archive (no manifest.json)"
        )));
    }
    Ok(Parts {
        base: format!("docker-archive:{}", o.path.display()),
        subpath: o.subpath,
        path: o.path,
        store: Box::new(DockerArchive {
            members: o.members,
            reference: o.reference,
            label: arg.to_string(),
            layers: Mutex::new(HashMap::new()),
        }),
    })
}

/// The digest a member name carries: `blobs/sha256/HEX`, `HEX.tar`, `HEX.json`, `HEX`.
fn named_digest(name: &str) -> Option<String> {
    let last = name.rsplit('/').next()?;
    let hex = last
        .strip_suffix(".tar")
        .or(last.strip_suffix(".json"))
        .unwrap_or(last);
    let d = format!("sha256:{hex}");
    valid_digest(&d).then_some(d)
}

/// `name:tag` as `podman save` and `docker save` write a `RepoTags` entry
/// equals `want` (`localhost/` and `docker.io/library/` prefixes aside,
/// `:latest` where no tag is given).
fn same_tag(have: &str, want: &str) -> bool {
    let norm = |s: &str| {
        let s = s
            .strip_prefix("docker.io/library/")
            .or(s.strip_prefix("localhost/"))
            .unwrap_or(s);
        let last = s.rsplit('/').next().unwrap_or(s);
        if last.contains(':') {
            s.to_string()
        } else {
            format!("{s}:latest")
        }
    };
    norm(have) == norm(want)
}

impl DockerArchive {
    fn chosen(&self, images: Vec<Saved>) -> Result<Saved> {
        let tags = |images: &[Saved]| {
            let t: Vec<String> = images
                .iter()
                .flat_map(|i| i.repo_tags.clone().unwrap_or_default())
                .collect();
            if t.is_empty() {
                "none".to_string()
            } else {
                t.join(", ")
            }
        };
        let n = images.len();
        match self.reference.as_deref() {
            None if n == 1 => Ok(images.into_iter().next().expect("one")),
            None => bail!(
                "{}: the archive holds {n} images: name one as SOURCE:NAME:TAG or SOURCE:@N (tags: {})",
                self.label,
                tags(&images)
            ),
            Some(r) => {
                if let Some(i) = r.strip_prefix('@') {
                    let i: usize = i
                        .parse()
                        .map_err(|_| anyhow::anyhow!("{}: {r:?} is not @N", self.label))?;
                    if i >= n {
                        bail!("{}: no image @{i} in the archive (it holds {n})", self.label);
                    }
                    return Ok(images.into_iter().nth(i).expect("checked"));
                }
                let listed = tags(&images);
                images
                    .into_iter()
                    .find(|s| {
                        s.repo_tags
                            .iter()
                            .flatten()
                            .any(|t| same_tag(t, r))
                    })
                    .ok_or_else(|| {
                        anyhow::anyhow!("{}: no image {r} in the archive (it has {listed})", self.label)
                    })
            }
        }
    }
}

impl Store for DockerArchive {
    fn label(&self) -> &str {
        &self.label
    }

    /// An image manifest (Docker schema 2) made from what `manifest.json`
    /// and the config say, named by the config's digest.
    fn root(&self) -> Result<(Vec<u8>, Option<String>, Descriptor)> {
        let label = &self.label;
        let raw = self.members.read(label, "manifest.json")?;
        let images: Vec<Saved> = serde_json::from_slice(&raw)
            .map_err(|e| anyhow::anyhow!("{label}: manifest.json: {e}"))?;
        if images.len() > 1024 {
            bail!("{label}: manifest.json lists {} images", images.len());
        }
        let image = self.chosen(images)?;
        let config = self.members.read(label, &image.config)?;
        let digest = sha256_of(&config);
        if let Some(want) = named_digest(&image.config) {
            if want != digest {
                bail!(
                    "{label}: digest mismatch for the config {}: got {}",
                    image.config,
                    short(&digest)
                );
            }
        }
        let diff_ids = serde_json::from_slice::<Config>(&config)
            .map_err(|e| anyhow::anyhow!("{label}: config {}: {e}", image.config))?
            .rootfs
            .map(|r| r.diff_ids)
            .unwrap_or_default();
        let mut layers = Vec::new();
        let mut by_digest = HashMap::new();
        for (i, name) in image.layers.iter().enumerate() {
            let Some((_, size)) = self.members.find(name.as_bytes()) else {
                bail!("{label}: the archive has no layer {name}");
            };
            let digest = match named_digest(name) {
                Some(d) => d,
                None => match diff_ids.get(i) {
                    Some(d) if valid_digest(d) => d.clone(),
                    _ => bail!("{label}: no digest for layer {name} (none in its name, none in the config)"),
                },
            };
            layers.push(serde_json::json!({
                "mediaType": "application/vnd.docker.image.rootfs.diff.tar",
                "digest": digest,
                "size": size,
            }));
            by_digest.insert(digest, name.clone());
        }
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": DOCKER_MANIFEST,
            "config": {
                "mediaType": "application/vnd.docker.container.image.v1+json",
                "digest": digest,
                "size": config.len(),
            },
            "layers": layers,
        });
        let bytes = serde_json::to_vec(&manifest)?;
        *self.layers.lock().unwrap() = by_digest;
        let desc = Descriptor {
            media_type: DOCKER_MANIFEST.to_string(),
            digest,
            size: bytes.len() as u64,
            platform: None,
            annotations: None,
        };
        Ok((bytes, Some(DOCKER_MANIFEST.to_string()), desc))
    }

    fn document(&self, desc: &Descriptor) -> Result<(Vec<u8>, Option<String>)> {
        bail!(
            "{}: a docker archive names no document {}",
            self.label,
            short(&desc.digest)
        )
    }

    fn blob(&self, desc: &Descriptor) -> Result<(Box<dyn Read + Send + '_>, crate::net::Stop)> {
        let name = self.layers.lock().unwrap().get(&desc.digest).cloned();
        let Some((r, _)) = name.and_then(|n| self.members.open(n.as_bytes())) else {
            bail!(
                "{}: the archive has no layer {}",
                self.label,
                short(&desc.digest)
            );
        };
        Ok((
            Box::new(io::BufReader::with_capacity(256 << 10, r)),
            crate::net::Stop::default(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tar::tests::{archive, header};
    use super::*;

    fn members(bytes: &[u8]) -> Result<Members> {
        let t = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(t.path(), bytes).unwrap();
        Members::index(sys::open_file_path(t.path()).unwrap())
    }

    fn read(m: &Members, name: &str) -> Option<Vec<u8>> {
        let (mut r, _) = m.open(name.as_bytes())?;
        let mut out = Vec::new();
        r.read_to_end(&mut out).unwrap();
        Some(out)
    }

    #[test]
    fn members_are_found_by_offset_through_links() {
        let big = vec![7u8; 1500];
        let m = members(&archive(&[
            (header(b"./blobs/", b'5', 0, b""), b""),
            (header(b"./blobs/sha256/aa", b'0', 1500, b""), &big),
            (header(b"index.json", b'0', 2, b""), b"{}"),
            (header(b"id/layer.tar", b'2', 0, b"../blobs/sha256/aa"), b""),
            (header(b"hard", b'1', 0, b"index.json"), b""),
            (header(b"out", b'2', 0, b"../../etc/passwd"), b""),
            (header(b"loop", b'2', 0, b"loop"), b""),
        ]))
        .unwrap();
        assert_eq!(read(&m, "blobs/sha256/aa").unwrap(), big);
        assert_eq!(read(&m, "id/layer.tar").unwrap(), big);
        assert_eq!(read(&m, "index.json").unwrap(), b"{}");
        assert_eq!(read(&m, "hard").unwrap(), b"{}");
        assert_eq!(read(&m, "./index.json").unwrap(), b"{}");
        for none in ["out", "loop", "blobs", "nothing"] {
            assert!(read(&m, none).is_none(), "{none}");
        }
    }

    #[test]
    fn a_truncated_or_compressed_outer_tar_is_refused() {
        let mut a = archive(&[(header(b"x", b'0', 2000, b""), &[1u8; 2000][..])]);
        a.truncate(1024);
        let e = members(&a).err().unwrap().to_string();
        assert!(e.contains("truncated"), "{e}");
        let e = members(&[0x1f, 0x8b, 8, 0, 0, 0])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("compressed"), "{e}");
    }

    #[test]
    fn member_names_are_bounded_in_all() {
        use super::super::tar::tests::pax;
        // 300 members of 60 KiB names each: 18 MB of names.
        let mut entries: Vec<([u8; 512], Vec<u8>)> = Vec::new();
        for i in 0..300 {
            let rec = pax("path", &format!("{i}{}", "n".repeat(60 << 10)));
            entries.push((header(b"x", b'x', rec.len() as u64, b""), rec));
            entries.push((header(b"f", b'0', 0, b""), Vec::new()));
        }
        let refs: Vec<([u8; 512], &[u8])> = entries.iter().map(|(h, d)| (*h, &d[..])).collect();
        let e = members(&archive(&refs)).err().unwrap().to_string();
        assert!(e.contains("member names longer than"), "{e}");
    }

    #[test]
    fn tags_and_digests_in_names() {
        assert!(same_tag("localhost/app:1.0", "app:1.0"));
        assert!(same_tag("docker.io/library/app:latest", "app"));
        assert!(same_tag(
            "registry.example:5000/a/b:2",
            "registry.example:5000/a/b:2"
        ));
        assert!(!same_tag("app:1.0", "app:2.0"));
        assert!(!same_tag("other/app:1.0", "app:1.0"));
        let hex = "a".repeat(64);
        for name in [
            format!("blobs/sha256/{hex}"),
            format!("{hex}.tar"),
            format!("{hex}.json"),
        ] {
            assert_eq!(named_digest(&name), Some(format!("sha256:{hex}")), "{name}");
        }
        assert_eq!(named_digest("0123/layer.tar"), None);
        assert_eq!(named_digest(&format!("{}.tar", "A".repeat(64))), None);
    }
}
