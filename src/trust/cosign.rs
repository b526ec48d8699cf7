//! Image signatures as cosign writes them with a key (its
//! `specs/SIGNATURE_SPEC.md`, tag-based discovery): for the image manifest
//! digest `sha256:HEX`, the signature is the image manifest tagged
//! `sha256-HEX.sig` in the same repository (a registry's
//! `/v2/NAME/manifests/sha256-HEX.sig`; a layout's or an `oci-archive:`'s
//! `index.json` entry whose `org.opencontainers.image.ref.name` is that
//! tag). Each of its layers of media type
//! `application/vnd.dev.cosign.simplesigning.v1+json` is a payload blob,
//! its signature (base64) in the layer's `dev.cosignproject.cosign/signature`
//! annotation: ECDSA (DER) over the payload hashed with SHA-256, as
//! `cosign verify --key` hashes for every curve (P-384 over SHA-384 is
//! taken too), Ed25519 over the payload, RSA PKCS#1 v1.5 (or PSS) with
//! SHA-256. The payload is simple signing JSON whose
//! `critical.image.docker-manifest-digest` must be the digest published
//! and whose `critical.type` is `cosign container image signature`.
//! One payload verified by one of the keys is enough.
//!
//! A `docker-archive:` FILE has no tags of that form: there is nowhere to
//! look, and `--verify-key` refuses it (exit 6). Nothing here writes; this
//! runs right after the manifest digest is resolved, before any layer is
//! fetched.

use base64::Engine;
use serde::Deserialize;

use super::key::{signed_by, Key};
use crate::error;
use crate::source::oci_ref::valid_digest;
use crate::source::store::{read_bounded, Descriptor, Store};

/// The media type of a simple signing payload layer.
pub const SIMPLESIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The layer annotation that holds the base64 signature.
pub const SIGNATURE: &str = "dev.cosignproject.cosign/signature";
/// The `critical.type` of a cosign image signature.
pub const SIGNATURE_TYPE: &str = "cosign container image signature";
/// Largest payload blob read.
pub const MAX_PAYLOAD: u64 = 1 << 20;
/// Most signature layers one `.sig` manifest may hold.
pub const MAX_SIGNATURES: usize = 64;
/// Longest base64 signature annotation (RSA-16384 is under 3 KiB).
const MAX_SIGNATURE_TEXT: usize = 16 << 10;

/// cosign's tag for the signature of `digest` (`sha256:HEX` →
/// `sha256-HEX.sig`).
pub fn sig_tag(digest: &str) -> String {
    format!("{}.sig", digest.replacen(':', "-", 1))
}

#[derive(Deserialize)]
struct SigManifest {
    #[serde(rename = "schemaVersion")]
    schema_version: Option<u32>,
    #[serde(default)]
    layers: Vec<Descriptor>,
}

/// The signature layers of a `.sig` manifest (`bytes`): each a payload
/// descriptor and its signature. Pure; fuzzed (`fuzzing::cosign_manifest`).
pub fn signature_layers(bytes: &[u8]) -> Result<Vec<(Descriptor, Vec<u8>)>, String> {
    let m: SigManifest = serde_json::from_slice(bytes)
        .map_err(|e| format!("the signature manifest is not an image manifest: {e}"))?;
    if m.schema_version != Some(2) {
        return Err("the signature manifest is not schemaVersion 2".into());
    }
    let layers: Vec<Descriptor> = m
        .layers
        .into_iter()
        .filter(|l| l.media_type == SIMPLESIGNING)
        .collect();
    if layers.is_empty() {
        return Err(format!(
            "the signature manifest has no layer of type {SIMPLESIGNING}"
        ));
    }
    if layers.len() > MAX_SIGNATURES {
        return Err(format!(
            "the signature manifest has {} signatures (at most {MAX_SIGNATURES})",
            layers.len()
        ));
    }
    let mut out = Vec::with_capacity(layers.len());
    for l in layers {
        if !valid_digest(&l.digest) {
            return Err(format!(
                "a signature layer's digest {:?} is not sha256",
                l.digest
            ));
        }
        if l.size > MAX_PAYLOAD {
            return Err(format!(
                "a signature payload of {} bytes (at most {MAX_PAYLOAD})",
                l.size
            ));
        }
        let text = l
            .annotations
            .as_ref()
            .and_then(|a| a.get(SIGNATURE))
            .ok_or_else(|| format!("payload {} has no {SIGNATURE} annotation", short(&l.digest)))?;
        if text.len() > MAX_SIGNATURE_TEXT {
            return Err(format!(
                "payload {}: its signature is too long",
                short(&l.digest)
            ));
        }
        let sig = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|e| {
                format!(
                    "payload {}: the signature is not base64: {e}",
                    short(&l.digest)
                )
            })?;
        out.push((l, sig));
    }
    Ok(out)
}

/// The image digest a simple signing payload names
/// (`critical.image.docker-manifest-digest`), once its `critical.type` is
/// cosign's. Keys match as Go's `encoding/json` matches them (any case);
/// a key given twice in different cases is refused. Pure; fuzzed.
pub fn payload_digest(payload: &[u8]) -> Result<String, String> {
    let v: serde_json::Value = serde_json::from_slice(payload)
        .map_err(|e| format!("the signed payload is not JSON: {e}"))?;
    let critical = field(&v, "critical")?.ok_or("the signed payload has no \"critical\"")?;
    let ty = field(critical, "type")?.and_then(|t| t.as_str());
    if ty != Some(SIGNATURE_TYPE) {
        return Err(format!(
            "the signed payload's critical.type is {ty:?}, not {SIGNATURE_TYPE:?}"
        ));
    }
    let image = field(critical, "image")?.ok_or("the signed payload has no critical.image")?;
    field(image, "docker-manifest-digest")?
        .and_then(|d| d.as_str())
        .map(str::to_string)
        .ok_or_else(|| "the signed payload has no critical.image.docker-manifest-digest".into())
}

fn field<'v>(
    v: &'v serde_json::Value,
    name: &str,
) -> Result<Option<&'v serde_json::Value>, String> {
    let Some(obj) = v.as_object() else {
        return Ok(None);
    };
    let mut found = obj.iter().filter(|(k, _)| k.eq_ignore_ascii_case(name));
    let first = found.next();
    if found.next().is_some() {
        return Err(format!("the signed payload names {name:?} twice"));
    }
    Ok(first.map(|(_, v)| v))
}

/// Check the cosign signature of the image `digest` held in `store`
/// (`root`: what its reference names, an index where it chose a platform;
/// the same digest otherwise): the fingerprint of the key that verified
/// it. A signature is looked for at `root` first (what `cosign sign
/// IMAGE:TAG` signs: an index pins its manifests by digest), then at
/// `digest`; at each, cosign's legacy tag `sha256-HEX.sig`, then the
/// Sigstore bundles that refer to it (`sigstore.rs`). One that verifies is
/// enough, and must name the digest it was found for. What is missing or
/// wrong is exit 6 naming the source; a store that cannot be read (a
/// registry down, a blob gone) is its own error.
pub fn check(
    store: &dyn Store,
    root: &str,
    digest: &str,
    by: super::sigstore::Signers,
) -> anyhow::Result<String> {
    let label = store.label();
    let untrusted = |m: String| error::untrusted(format!("{label}: {m}"));
    let mut tried: Vec<(&str, String)> = Vec::new();
    let mut failed = Vec::new();
    for d in [root, digest] {
        if tried.iter().any(|(t, _)| *t == d) {
            continue;
        }
        let tag = sig_tag(d);
        let Some(found) = store.by_tag(&tag) else {
            return Err(untrusted(format!(
                "no cosign signature (tag {tag}) can be looked up: a docker-archive holds no \
                 tags of that form; --verify-key refuses it (save the image and its signature \
                 as oci-archive: or oci-layout:)"
            )));
        };
        if let Some(bytes) = found? {
            match verify(store, d, &tag, &bytes, by.keys)? {
                Ok(fp) => return Ok(fp),
                Err(m) => failed.push(m),
            }
        }
        match super::sigstore::look(store, d, by)? {
            Ok(fp) => return Ok(fp),
            Err(m) => failed.extend(m),
        }
        tried.push((d, tag));
    }
    if !failed.is_empty() {
        return Err(untrusted(failed.join("; ")));
    }
    let fallback = |d: &str| super::sigstore::fallback_tag(d);
    let places = match tried.as_slice() {
        [(d, one)] => format!(
            "tag {one}) nor Sigstore bundle (referrers of {}, tag {})",
            short(d),
            fallback(d)
        ),
        [(i, index), (d, image)] => format!(
            "tag {index} for the index, nor {image} for the platform's image) nor Sigstore \
             bundle (referrers of either, tags {}, {})",
            fallback(i),
            fallback(d)
        ),
        _ => unreachable!("one or two digests"),
    };
    Err(untrusted(format!(
        "no cosign signature ({places} {}",
        store.tags_where()
    )))
}

/// Verify the `.sig` manifest `bytes` found at `tag` for `digest`: the
/// outer error is the store's, the inner what was wrong.
fn verify(
    store: &dyn Store,
    digest: &str,
    tag: &str,
    bytes: &[u8],
    keys: &[Key],
) -> anyhow::Result<Result<String, String>> {
    let layers = match signature_layers(bytes) {
        Ok(l) => l,
        Err(m) => return Ok(Err(format!("{tag}: {m}"))),
    };
    let mut other_digest = None;
    for (desc, sig) in &layers {
        let payload = match read_bounded(store, desc, MAX_PAYLOAD)? {
            Ok(p) => p,
            Err(m) => return Ok(Err(format!("{tag}: payload {}: {m}", short(&desc.digest)))),
        };
        let Some(key) = keys.iter().find(|k| signed_by(k, &payload, sig)) else {
            continue;
        };
        match payload_digest(&payload) {
            Ok(d) if d == digest => return Ok(Ok(key.fingerprint.clone())),
            Ok(d) => other_digest = Some((key, d)),
            Err(m) => other_digest = other_digest.or(Some((key, m))),
        }
    }
    Ok(Err(match other_digest {
        Some((key, d)) if valid_digest(&d) => format!(
            "{tag}: the signature by {} names image {d}, not the published {digest}",
            key.fingerprint
        ),
        Some((key, m)) => format!("{tag}: signed by {}, but {m}", key.fingerprint),
        None => format!(
            "{tag}: none of its {} signature(s) is by a --verify-key (signed by another key, or altered)",
            layers.len()
        ),
    }))
}

/// An image's `--verify-key` (or keyless, `--trusted-root`) check, and
/// the key (or identity) that passed it.
#[derive(Default)]
pub struct Trust {
    keys: Vec<Key>,
    keyless: Option<super::keyless::Keyless>,
    pub verified: std::sync::Mutex<Option<String>>,
}

impl Trust {
    pub fn of(remote: &crate::config::Remote) -> Trust {
        Trust {
            keys: remote.verify_keys.clone(),
            keyless: remote.keyless.clone(),
            verified: Default::default(),
        }
    }

    /// Check the signature of `digest` (nothing without keys or an identity).
    pub fn check(&self, store: &dyn Store, root: &str, digest: &str) -> anyhow::Result<()> {
        let keyless = self.keyless.as_ref();
        if self.keys.is_empty() && keyless.is_none_or(|k| k.who.is_none()) {
            return Ok(());
        }
        let by = super::sigstore::Signers {
            keys: &self.keys,
            keyless,
        };
        let fp = check(store, root, digest, by)?;
        *self.verified.lock().unwrap() = Some(fp);
        Ok(())
    }
}

fn short(d: &str) -> &str {
    crate::source::store::short(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(sig: &str) -> String {
        format!(
            r#"{{"schemaVersion":2,"layers":[{{"mediaType":"{SIMPLESIGNING}","size":3,"digest":"sha256:{}","annotations":{{"{SIGNATURE}":"{sig}"}}}}]}}"#,
            "a".repeat(64)
        )
    }

    #[test]
    fn the_tag_is_cosigns() {
        assert_eq!(
            sig_tag(&format!("sha256:{}", "0f".repeat(32))),
            format!("sha256-{}.sig", "0f".repeat(32))
        );
    }

    #[test]
    fn signature_layers_are_read_and_bounded() {
        let l = signature_layers(layer("AAEC").as_bytes()).unwrap();
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].1, vec![0, 1, 2]);
        assert!(signature_layers(layer("!!").as_bytes())
            .unwrap_err()
            .contains("base64"));
        assert!(signature_layers(b"{\"schemaVersion\":2,\"layers\":[]}")
            .unwrap_err()
            .contains("no layer"));
        let big = layer("AAEC").replace("\"size\":3", "\"size\":2000000");
        assert!(signature_layers(big.as_bytes())
            .unwrap_err()
            .contains("at most"));
        let one = format!(
            r#"{{"mediaType":"{SIMPLESIGNING}","size":3,"digest":"sha256:{}","annotations":{{"{SIGNATURE}":"AA=="}}}}"#,
            "b".repeat(64)
        );
        let many = format!(
            r#"{{"schemaVersion":2,"layers":[{}]}}"#,
            vec![one; MAX_SIGNATURES + 1].join(",")
        );
        assert!(signature_layers(many.as_bytes())
            .unwrap_err()
            .contains("65 signatures"));
    }

    #[test]
    fn the_payload_names_its_digest() {
        let p = |critical: &str| format!(r#"{{"critical":{critical},"optional":null}}"#);
        let good = p(&format!(
            r#"{{"identity":{{"docker-reference":"r"}},"image":{{"docker-manifest-digest":"sha256:{}"}},"type":"{SIGNATURE_TYPE}"}}"#,
            "c".repeat(64)
        ));
        assert_eq!(
            payload_digest(good.as_bytes()).unwrap(),
            format!("sha256:{}", "c".repeat(64))
        );
        let upper = good.replace("docker-manifest-digest", "Docker-manifest-digest");
        assert!(payload_digest(upper.as_bytes()).is_ok());
        let twice = good.replace(
            "\"docker-manifest-digest\"",
            "\"Docker-Manifest-Digest\":\"x\",\"docker-manifest-digest\"",
        );
        assert!(payload_digest(twice.as_bytes())
            .unwrap_err()
            .contains("twice"));
        let other = good.replace(SIGNATURE_TYPE, "atomic container signature");
        assert!(payload_digest(other.as_bytes())
            .unwrap_err()
            .contains("critical.type"));
        assert!(payload_digest(b"[]").is_err());
        assert!(payload_digest(b"{").is_err());
    }
}
