//! What an image's documents and blobs are read through: the `Store` trait
//! (a registry, an OCI layout, an archive of either implements it), the
//! `Descriptor` a document names a blob by, a `Referrer` listed for an image,
//! a blob read within a bound and checked against its descriptor, and how a
//! digest is shown. A leaf of `source/`: the image kinds implement `Store`
//! and `trust` reads signatures through it, so neither names the other.

use std::collections::BTreeMap;
use std::io::Read;

use anyhow::{bail, Result};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::escape::hex;
use crate::net;

/// Where an image's blobs are read from.
pub trait Store: Send + Sync {
    /// The document the reference itself names, with its digest.
    fn root(&self) -> Result<(Vec<u8>, Option<String>, Descriptor)>;
    /// A document (manifest, index) a descriptor names, checked.
    fn document(&self, desc: &Descriptor) -> Result<(Vec<u8>, Option<String>)>;
    /// A layer as it streams (checked by the caller), and how to end its
    /// transfer from another thread.
    fn blob(&self, desc: &Descriptor) -> Result<(Box<dyn Read + Send + '_>, net::Stop)>;
    /// `what` for messages: `oci://host/repo:tag`.
    fn label(&self) -> &str;
    /// The bytes `start..start+len` of a layer (an HTTP Range request),
    /// exactly that many (a shorter body is a read error): `Ok(None)`
    /// where the store does not serve parts (a server that answered 200,
    /// ignoring `Range`), and the caller reads the blob whole.
    fn blob_range(
        &self,
        desc: &Descriptor,
        start: u64,
        len: u64,
    ) -> Result<Option<Box<dyn Read + Send + '_>>> {
        let _ = (desc, start, len);
        Ok(None)
    }
    /// Whether `blob_range` can serve parts at all (a registry, a layout
    /// directory); where not, a layer's TOC is not asked for.
    fn serves_ranges(&self) -> bool {
        false
    }
    /// The manifest tagged `tag` beside the image (cosign's
    /// `sha256-HEX.sig`), not checked against anything: `Some(Ok(None))`
    /// where there is no such tag, `None` where this store holds no tags
    /// of that form (a docker-archive).
    fn by_tag(&self, tag: &str) -> Option<Result<Option<Vec<u8>>>> {
        let _ = tag;
        None
    }
    /// The manifests that have `digest` as their OCI 1.1 `subject`, each
    /// with its artifact type: `Some(Ok(None))` where the store cannot list
    /// them (a registry answering 404 to the referrers API: the caller
    /// reads the tag fallback `sha256-HEX` with `by_tag`), `None` where it
    /// holds none (a docker-archive).
    fn referrers(&self, digest: &str) -> Option<Result<Option<Vec<Referrer>>>> {
        let _ = digest;
        None
    }
    /// Where `by_tag` looked, for messages: `in REPO`, `in index.json`.
    fn tags_where(&self) -> String {
        String::new()
    }
    /// Every tag the store holds (`--semver`), bounded (`MAX_TAGS`).
    fn tags(&self) -> Result<Vec<String>> {
        bail!(
            "{}: --semver cannot list the tags of this kind of source",
            self.label()
        )
    }
    /// `root`, for `tag` instead of what the reference names.
    fn root_tagged(&self, tag: &str) -> Result<(Vec<u8>, Option<String>, Descriptor)> {
        let _ = tag;
        self.root()
    }
}

/// A content descriptor: what a blob is, its digest and its size.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Descriptor {
    #[serde(rename = "mediaType", default)]
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default)]
    pub platform: Option<DescPlatform>,
    #[serde(default)]
    pub annotations: Option<BTreeMap<String, String>>,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct DescPlatform {
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub variant: Option<String>,
}

/// A manifest that refers to the image, and what kind of artifact it is.
#[derive(Clone, Debug)]
pub struct Referrer {
    pub desc: Descriptor,
    pub artifact_type: String,
}

/// `sha256:0123456789ab`: enough of a digest for a message.
pub fn short(digest: &str) -> &str {
    &digest[..digest.len().min(19)]
}

/// A blob (a payload, a bundle), read within `max` bytes and checked
/// against its descriptor: the outer error is the store's, the inner a
/// blob that is not the one named.
pub fn read_bounded(
    store: &dyn Store,
    desc: &Descriptor,
    max: u64,
) -> anyhow::Result<Result<Vec<u8>, String>> {
    let (r, _stop) = store.blob(desc)?;
    let mut bytes = Vec::new();
    r.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Ok(Err(format!("longer than {max} bytes")));
    }
    if bytes.len() as u64 != desc.size {
        return Ok(Err(format!(
            "{} bytes, its descriptor says {}",
            bytes.len(),
            desc.size
        )));
    }
    let got = format!("sha256:{}", hex(&Sha256::digest(&bytes)));
    if got != desc.digest {
        return Ok(Err(format!("digest mismatch: the blob is {}", short(&got))));
    }
    Ok(Ok(bytes))
}

/// The range `start..start+len` must lie inside the blob `desc`, and not
/// be empty: what a `blob_range` is asked for is checked before any read.
pub fn check_range(label: &str, desc: &Descriptor, start: u64, len: u64) -> Result<()> {
    if len == 0 || start.checked_add(len).is_none_or(|end| end > desc.size) {
        anyhow::bail!(
            "{label}: bytes {start}+{len} lie outside blob {} of {} bytes",
            short(&desc.digest),
            desc.size
        );
    }
    Ok(())
}
