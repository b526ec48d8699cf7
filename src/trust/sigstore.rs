//! Image signatures as cosign v2.4+ (`--new-bundle-format`) and v3 write
//! them: a Sigstore bundle (protobuf-specs `sigstore_bundle.proto`, JSON)
//! attached to the image manifest as an OCI 1.1 referrer. The referrer is
//! an image manifest whose `subject` is the image, whose `artifactType` is
//! `application/vnd.dev.sigstore.bundle.v0.3+json` (v0.2 and v0.1,
//! `application/vnd.dev.sigstore.bundle+json;version=0.x`, are taken too),
//! and whose one layer is the bundle.
//!
//! Where they are found: a registry's referrers API (`GET
//! /v2/NAME/referrers/sha256:HEX`, an image index), or where it answers
//! 404, the tag fallback `sha256-HEX` (an index of the referrers); an OCI
//! layout's or `oci-archive:`'s `index.json` entries whose manifest has the
//! image as `subject`, and the same tag fallback.
//!
//! What is verified, keyed: the bundle's `dsseEnvelope` holds an
//! in-toto statement (`payloadType` `application/vnd.in-toto+json`,
//! `predicateType` cosign's `https://sigstore.dev/cosign/sign/v1`), one of
//! whose `subject[].digest.sha256` must be the published digest, signed
//! over DSSE's PAE (`DSSEv1 SP len(type) SP type SP len(body) SP body`) by
//! one of the `--verify-key` keys, as cosign signs (ECDSA DER over SHA-256,
//! Ed25519 over the PAE, RSA). A `messageSignature` bundle is taken where
//! its `messageDigest` (SHA2_256) is the image manifest digest and an ECDSA
//! key signed that digest. `verificationMaterial` (a public key hint, a
//! certificate) does not choose the key: every `--verify-key` is tried.
//! With `--trusted-root` (`keyless.rs`): a bundle holding a certificate is
//! verified keyless against `--certificate-identity` and
//! `--certificate-oidc-issuer`, and a keyed bundle's transparency log entry
//! must be in one of the root's logs. Timestamps are not checked. Nothing
//! here writes.

use base64::Engine;
use serde::Deserialize;

use super::dsse::{pae, IN_TOTO};
use super::key::Key;
use super::keyless::{self, Keyless};
use crate::source::oci_image;
use crate::source::oci_ref::valid_digest;
use crate::source::store::{read_bounded, Descriptor, Referrer, Store};

/// The bundle media types taken (as a referrer's `artifactType` and as the
/// bundle's own `mediaType`).
pub const BUNDLE_TYPES: [&str; 3] = [
    "application/vnd.dev.sigstore.bundle.v0.3+json",
    "application/vnd.dev.sigstore.bundle+json;version=0.2",
    "application/vnd.dev.sigstore.bundle+json;version=0.1",
];
/// The predicate type of cosign's image signature statement.
pub const COSIGN_SIGN: &str = "https://sigstore.dev/cosign/sign/v1";
/// The in-toto statement types taken.
const STATEMENTS: [&str; 2] = [
    "https://in-toto.io/Statement/v1",
    "https://in-toto.io/Statement/v0.1",
];
/// The most referrers one image may list.
pub const MAX_REFERRERS: usize = 256;
/// The largest bundle read.
pub const MAX_BUNDLE: u64 = 1 << 20;
/// The most signatures one DSSE envelope may hold.
const MAX_DSSE_SIGNATURES: usize = 64;

impl Referrer {
    fn is_bundle(&self) -> bool {
        BUNDLE_TYPES.contains(&self.artifact_type.as_str())
    }
}

/// cosign's referrers tag fallback for `digest` (`sha256:HEX` → `sha256-HEX`).
pub fn fallback_tag(digest: &str) -> String {
    digest.replacen(':', "-", 1)
}

#[derive(Deserialize)]
struct Listed {
    #[serde(flatten)]
    desc: Descriptor,
    #[serde(rename = "artifactType", default)]
    artifact_type: Option<String>,
}

#[derive(Deserialize)]
struct ReferrerIndex {
    #[serde(rename = "schemaVersion")]
    schema_version: Option<u32>,
    #[serde(default)]
    manifests: Vec<Listed>,
}

/// The referrers an image index lists (the referrers API's answer, or the
/// tag fallback's index), at most `MAX_REFERRERS`, each digest sha256.
/// Pure; fuzzed (`fuzzing::cosign_signature`).
pub fn parse_referrers(bytes: &[u8]) -> Result<Vec<Referrer>, String> {
    let ix: ReferrerIndex = serde_json::from_slice(bytes)
        .map_err(|e| format!("the referrers list is not an image index: {e}"))?;
    if ix.schema_version != Some(2) {
        return Err("the referrers list is not schemaVersion 2".into());
    }
    if ix.manifests.len() > MAX_REFERRERS {
        return Err(format!(
            "the image has {} referrers (at most {MAX_REFERRERS})",
            ix.manifests.len()
        ));
    }
    ix.manifests
        .into_iter()
        .map(|l| {
            if !valid_digest(&l.desc.digest) {
                return Err(format!(
                    "a referrer's digest {:?} is not sha256",
                    l.desc.digest
                ));
            }
            Ok(Referrer {
                artifact_type: l.artifact_type.unwrap_or_default(),
                desc: l.desc,
            })
        })
        .collect()
}

#[derive(Deserialize)]
struct Subject {
    digest: String,
}

#[derive(Deserialize)]
struct Config {
    #[serde(rename = "mediaType", default)]
    media_type: String,
}

#[derive(Deserialize)]
struct ReferrerManifest {
    #[serde(rename = "artifactType", default)]
    artifact_type: Option<String>,
    config: Option<Config>,
    subject: Option<Subject>,
    #[serde(default)]
    layers: Vec<Descriptor>,
}

/// The manifests of a layout's `index.json` (`index`) that have `digest`
/// as their subject (read from `store`, each checked against its
/// descriptor), at most `MAX_REFERRERS`. The artifact type is the
/// manifest's `artifactType`, else its config's media type (OCI 1.1).
pub fn in_layout(store: &dyn Store, index: &[u8], digest: &str) -> anyhow::Result<Vec<Referrer>> {
    let label = store.label();
    let oci_image::Document::Index(ms) = oci_image::parse(index, Some(oci_image::OCI_INDEX))
        .map_err(|e| anyhow::anyhow!("{label}: index.json: {e:#}"))?
    else {
        anyhow::bail!("{label}: index.json is not an image index");
    };
    let mut out = Vec::new();
    for d in ms {
        if d.media_type != oci_image::OCI_MANIFEST || d.digest == digest {
            continue;
        }
        let (bytes, _) = store.document(&d)?;
        let Ok(m) = serde_json::from_slice::<ReferrerManifest>(&bytes) else {
            continue;
        };
        if m.subject.as_ref().map(|s| s.digest.as_str()) != Some(digest) {
            continue;
        }
        if out.len() == MAX_REFERRERS {
            anyhow::bail!("{label}: the image has more than {MAX_REFERRERS} referrers");
        }
        let artifact_type = m
            .artifact_type
            .or(m.config.map(|c| c.media_type))
            .unwrap_or_default();
        out.push(Referrer {
            desc: d,
            artifact_type,
        });
    }
    Ok(out)
}

/// Whether a referrer manifest's artifact type (`artifactType`, else its
/// config's media type) is a Sigstore bundle's.
fn manifest_is_bundle(bytes: &[u8]) -> bool {
    serde_json::from_slice::<ReferrerManifest>(bytes).is_ok_and(|m| {
        let t = m.artifact_type.or(m.config.map(|c| c.media_type));
        t.is_some_and(|t| BUNDLE_TYPES.contains(&t.as_str()))
    })
}

/// The bundle layer of a referrer manifest (`bytes`): its one layer,
/// within `MAX_BUNDLE`. Pure; fuzzed.
pub fn bundle_layer(bytes: &[u8]) -> Result<Descriptor, String> {
    let m: ReferrerManifest = serde_json::from_slice(bytes)
        .map_err(|e| format!("the referrer is not an image manifest: {e}"))?;
    let [layer] = <[Descriptor; 1]>::try_from(m.layers)
        .map_err(|l| format!("the referrer has {} layers, not the one bundle", l.len()))?;
    if !valid_digest(&layer.digest) {
        return Err(format!(
            "the bundle layer's digest {:?} is not sha256",
            layer.digest
        ));
    }
    if layer.size > MAX_BUNDLE {
        return Err(format!(
            "a bundle of {} bytes (at most {MAX_BUNDLE})",
            layer.size
        ));
    }
    Ok(layer)
}

#[derive(Deserialize)]
struct Bundle {
    #[serde(rename = "mediaType")]
    media_type: Option<String>,
    #[serde(rename = "dsseEnvelope")]
    dsse: Option<Envelope>,
    #[serde(rename = "messageSignature")]
    message: Option<MessageSignature>,
    #[serde(rename = "verificationMaterial")]
    material: Option<keyless::Material>,
}

#[derive(Deserialize)]
struct Envelope {
    payload: String,
    #[serde(rename = "payloadType")]
    payload_type: String,
    #[serde(default)]
    signatures: Vec<DsseSignature>,
}

#[derive(Deserialize)]
struct DsseSignature {
    sig: String,
}

#[derive(Deserialize)]
struct MessageSignature {
    #[serde(rename = "messageDigest")]
    digest: Option<HashOutput>,
    signature: String,
}

#[derive(Deserialize)]
struct HashOutput {
    algorithm: String,
    digest: String,
}

#[derive(Deserialize)]
struct Statement {
    #[serde(rename = "_type")]
    ty: String,
    #[serde(rename = "predicateType")]
    predicate_type: String,
    #[serde(default)]
    subject: Vec<StatementSubject>,
}

#[derive(Deserialize)]
struct StatementSubject {
    #[serde(default)]
    digest: std::collections::BTreeMap<String, String>,
}

fn b64(text: &str, what: &str) -> Result<Vec<u8>, String> {
    let t = text.trim();
    base64::engine::general_purpose::STANDARD
        .decode(t)
        .or_else(|_| base64::engine::general_purpose::URL_SAFE.decode(t))
        .map_err(|e| format!("{what} is not base64: {e}"))
}

/// The image digests (`sha256:HEX`) an in-toto statement names, once it
/// is cosign's signature statement. Pure; fuzzed.
pub fn statement_digests(payload: &[u8]) -> Result<Vec<String>, String> {
    let s: Statement = serde_json::from_slice(payload)
        .map_err(|e| format!("the signed payload is not an in-toto statement: {e}"))?;
    if !STATEMENTS.contains(&s.ty.as_str()) {
        return Err(format!("the statement's _type is {:?}", s.ty));
    }
    if s.predicate_type != COSIGN_SIGN {
        return Err(format!(
            "the statement's predicateType is {:?}, not cosign's signature {COSIGN_SIGN:?}",
            s.predicate_type
        ));
    }
    Ok(s.subject
        .iter()
        .filter_map(|x| x.digest.get("sha256"))
        .map(|h| format!("sha256:{}", h.to_ascii_lowercase()))
        .collect())
}

/// Whom a bundle may be signed by: the `--verify-key` keys, and with
/// `--trusted-root` the keyless identity (and the log that keyed bundles'
/// entries must be in).
#[derive(Clone, Copy)]
pub struct Signers<'a> {
    pub keys: &'a [Key],
    pub keyless: Option<&'a Keyless>,
}

/// What a verified signature names, checked against the published digest.
fn names(named: Result<Vec<String>, String>, by: &str, digest: &str) -> Result<String, String> {
    let named = named.map_err(|m| format!("signed by {by}, but {m}"))?;
    if named.iter().any(|d| d == digest) {
        return Ok(by.to_string());
    }
    Err(format!(
        "the statement signed by {by} names image {}, not the published {digest}",
        if named.is_empty() {
            "none".to_string()
        } else {
            named.join(", ")
        }
    ))
}

/// Verify the bundle `bytes` for the image `digest`: the fingerprint of the
/// key that signed it (or the keyless identity, `keyless:ISSUER:IDENTITY`),
/// or what was wrong.
pub fn verify_bundle(bytes: &[u8], digest: &str, by: Signers) -> Result<String, String> {
    let b: Bundle =
        serde_json::from_slice(bytes).map_err(|e| format!("not a Sigstore bundle: {e}"))?;
    match b.media_type.as_deref() {
        Some(t) if BUNDLE_TYPES.contains(&t) => {}
        other => {
            return Err(format!(
                "the bundle's mediaType {other:?} is not a Sigstore bundle's"
            ))
        }
    }
    let material = b.material.unwrap_or_default();
    // A certificate, and an identity to check it against: keyless.
    let keyless = by
        .keyless
        .filter(|k| k.who.is_some() && material.has_certificate());
    if keyless.is_none() && by.keys.is_empty() {
        return Err(if material.has_certificate() {
            "the bundle holds a certificate, and no --certificate-identity was given".into()
        } else {
            "the bundle is signed with a key, not a certificate, and no --verify-key was given"
                .into()
        });
    }
    // With --trusted-root, a keyed signature's log entry is checked too.
    let logged = |signed: &keyless::Signed, key: &Key| -> Result<(), String> {
        match by.keyless {
            Some(k) => keyless::check_tlog(&k.root, &material, signed, &keyless::Signer::Key(key))
                .map(|_| ())
                .map_err(|m| format!("signed by {}, but {m}", key.fingerprint)),
            None => Ok(()),
        }
    };
    if let Some(env) = b.dsse {
        if env.payload_type != IN_TOTO {
            return Err(format!(
                "the DSSE payloadType is {:?}, not {IN_TOTO:?}",
                env.payload_type
            ));
        }
        if env.signatures.is_empty() || env.signatures.len() > MAX_DSSE_SIGNATURES {
            return Err(format!(
                "the DSSE envelope has {} signatures (1 to {MAX_DSSE_SIGNATURES})",
                env.signatures.len()
            ));
        }
        let payload = b64(&env.payload, "the DSSE payload")?;
        if let Some(k) = keyless {
            let mut first = None;
            for s in &env.signatures {
                let sig = b64(&s.sig, "a DSSE signature")?;
                let signed = keyless::Signed::Dsse {
                    payload: &payload,
                    sig: &sig,
                };
                match keyless::verify(k, &material, &signed) {
                    Ok(who) => return names(statement_digests(&payload), &who, digest),
                    Err(m) => first = first.or(Some(m)),
                }
            }
            return Err(first.expect("one signature at least"));
        }
        let signed = pae(&env.payload_type, &payload);
        let mut key = None;
        for s in &env.signatures {
            let sig = b64(&s.sig, "a DSSE signature")?;
            if let Some(k) = by
                .keys
                .iter()
                .find(|k| super::key::signed_by(k, &signed, &sig))
            {
                key = Some((k, sig));
                break;
            }
        }
        let Some((key, sig)) = key else {
            return Err(format!(
                "none of its {} DSSE signature(s) is by a --verify-key (signed by another key, or altered)",
                env.signatures.len()
            ));
        };
        let fp = names(statement_digests(&payload), &key.fingerprint, digest)?;
        logged(
            &keyless::Signed::Dsse {
                payload: &payload,
                sig: &sig,
            },
            key,
        )?;
        return Ok(fp);
    }
    if let Some(m) = b.message {
        let h = m
            .digest
            .ok_or("the message signature has no messageDigest")?;
        if h.algorithm != "SHA2_256" {
            return Err(format!(
                "the message digest is {:?}, not SHA2_256",
                h.algorithm
            ));
        }
        let d: [u8; 32] = b64(&h.digest, "the message digest")?
            .try_into()
            .map_err(|_| "the message digest is not 32 bytes".to_string())?;
        let sig = b64(&m.signature, "the message signature")?;
        let named = format!("sha256:{}", crate::escape::hex(&d));
        let signed = keyless::Signed::Message {
            digest: d,
            sig: &sig,
        };
        let who = match keyless {
            Some(k) => keyless::verify(k, &material, &signed)?,
            None => {
                let Some(key) = by
                    .keys
                    .iter()
                    .find(|k| k.verify_sha256_digest(&d, &sig).is_ok())
                else {
                    return Err(
                        "its message signature is not by a --verify-key (signed by another key, or altered)"
                            .into(),
                    );
                };
                logged(&signed, key)?;
                key.fingerprint.clone()
            }
        };
        if named == digest {
            return Ok(who);
        }
        return Err(format!(
            "the message signature by {who} is over {named}, not the published {digest}"
        ));
    }
    Err("the bundle has neither a dsseEnvelope nor a messageSignature".into())
}

/// What looking for bundles referring to `digest` found: `Ok(fp)` for the
/// first that verified, else every failure (empty: no bundle at all).
/// The outer error is the store's (a registry down, a blob gone).
pub fn look(
    store: &dyn Store,
    digest: &str,
    by: Signers,
) -> anyhow::Result<Result<String, Vec<String>>> {
    let listed = match store.referrers(digest) {
        None => return Ok(Err(Vec::new())),
        Some(r) => match r? {
            Some(list) => list,
            None => match store.by_tag(&fallback_tag(digest)) {
                Some(found) => match found? {
                    Some(bytes) => parse_referrers(&bytes).map_err(|m| {
                        crate::error::untrusted(format!(
                            "{}: tag {}: {m}",
                            store.label(),
                            fallback_tag(digest)
                        ))
                    })?,
                    None => Vec::new(),
                },
                None => Vec::new(),
            },
        },
    };
    let mut failed = Vec::new();
    // A list without artifact types (what a copy through a client that
    // drops the field leaves under the tag fallback): each manifest says.
    for r in listed
        .iter()
        .filter(|r| r.is_bundle() || r.artifact_type.is_empty())
    {
        let what = format!("referrer {}", short(&r.desc.digest));
        let (bytes, _) = store.document(&r.desc)?;
        if r.artifact_type.is_empty() && !manifest_is_bundle(&bytes) {
            continue;
        }
        let layer = match bundle_layer(&bytes) {
            Ok(l) => l,
            Err(m) => {
                failed.push(format!("{what}: {m}"));
                continue;
            }
        };
        let bundle = match read_bounded(store, &layer, MAX_BUNDLE)? {
            Ok(b) => b,
            Err(m) => {
                failed.push(format!("{what}: bundle {}: {m}", short(&layer.digest)));
                continue;
            }
        };
        match verify_bundle(&bundle, digest, by) {
            Ok(fp) => return Ok(Ok(fp)),
            Err(m) => failed.push(format!("{what}: {m}")),
        }
    }
    Ok(Err(failed))
}

fn short(d: &str) -> &str {
    crate::source::store::short(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn referrers_are_bounded() {
        let one = format!(
            r#"{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:{}","size":9,"artifactType":"{}"}}"#,
            "a".repeat(64),
            BUNDLE_TYPES[0]
        );
        let list = |n: usize| {
            format!(
                r#"{{"schemaVersion":2,"manifests":[{}]}}"#,
                vec![one.clone(); n].join(",")
            )
        };
        let r = parse_referrers(list(2).as_bytes()).unwrap();
        assert!(r.len() == 2 && r[0].is_bundle());
        assert!(parse_referrers(list(MAX_REFERRERS + 1).as_bytes())
            .unwrap_err()
            .contains("257 referrers"));
        assert!(parse_referrers(b"{\"manifests\":[]}").is_err());
    }

    #[test]
    fn a_bundle_layer_is_one_and_bounded() {
        let m = |layers: &str| format!(r#"{{"schemaVersion":2,"layers":[{layers}]}}"#);
        let l = |size: u64| {
            format!(
                r#"{{"mediaType":"{}","digest":"sha256:{}","size":{size}}}"#,
                BUNDLE_TYPES[0],
                "b".repeat(64)
            )
        };
        assert_eq!(bundle_layer(m(&l(5)).as_bytes()).unwrap().size, 5);
        assert!(bundle_layer(m(&format!("{},{}", l(5), l(5))).as_bytes())
            .unwrap_err()
            .contains("2 layers"));
        assert!(bundle_layer(m(&l(MAX_BUNDLE + 1)).as_bytes())
            .unwrap_err()
            .contains("at most"));
    }

    #[test]
    fn a_statement_names_its_digests_once_it_is_cosigns() {
        let s = |pt: &str| {
            format!(
                r#"{{"_type":"https://in-toto.io/Statement/v1","subject":[{{"name":"r","digest":{{"sha256":"{}"}}}}],"predicateType":"{pt}","predicate":{{}}}}"#,
                "C".repeat(64)
            )
        };
        assert_eq!(
            statement_digests(s(COSIGN_SIGN).as_bytes()).unwrap(),
            [format!("sha256:{}", "c".repeat(64))]
        );
        assert!(
            statement_digests(s("https://slsa.dev/provenance/v1").as_bytes())
                .unwrap_err()
                .contains("predicateType")
        );
        assert!(verify_bundle(
            b"{\"mediaType\":\"x\"}",
            "sha256:0",
            Signers {
                keys: &[],
                keyless: None
            }
        )
        .unwrap_err()
        .contains("mediaType"));
    }
}
