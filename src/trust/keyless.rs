//! Keyless Sigstore signatures, verified offline against a pinned
//! `trusted_root.json` (`--trusted-root FILE`, protobuf-specs
//! `sigstore_trustroot.proto` in JSON): the certificate authorities
//! (Fulcio) whose certificates may sign, and the transparency logs (Rekor)
//! whose entries prove when.
//!
//! A keyless bundle's `verificationMaterial` holds a short-lived leaf
//! certificate (`certificate.rawBytes`, or the first of
//! `x509CertificateChain.certificates`) and its transparency log entries
//! (`tlogEntries`). What is checked, nothing online:
//!
//! * the log entry: its `canonicalizedBody` (Rekor's `dsse` or
//!   `hashedrekord` kind, version 0.0.1) names this signature, this
//!   certificate (or key) and the signed payload's (or message's) hash; its
//!   `logId` is a log of the trusted root whose key was valid at the entry's
//!   `integratedTime`; then its RFC 6962 inclusion proof (leaf
//!   `SHA256(0x00 || body)`, nodes `SHA256(0x01 || left || right)`) leads to
//!   the root hash of its checkpoint, a signed note (`origin`, size, base64
//!   root, a blank line, `— NAME base64(keyhint || signature)`) signed by
//!   that log's key; where there is no proof, the `inclusionPromise`'s
//!   signed entry timestamp over the canonical JSON
//!   `{"body","integratedTime","logID","logIndex"}` (both, where both are);
//! * the certificate: signed by the first certificate of a CA's chain in
//!   the trusted root (each of which is signed by the next), each
//!   certificate valid at the integrated time, as is the CA's `validFor`;
//!   the leaf has the codeSigning extended key usage;
//! * the identity: a SAN (email or URI) equal to `--certificate-identity`,
//!   and the Fulcio OIDC issuer extension (1.3.6.1.4.1.57264.1.8, a DER
//!   UTF8String; else the legacy 1.3.6.1.4.1.57264.1.1, raw bytes) equal to
//!   `--certificate-oidc-issuer`, exactly;
//! * the signature: by the leaf's key (the caller says over what).
//!
//! Not checked: certificate transparency SCTs, RFC 3161 timestamps, Rekor
//! v2 (`0.0.2`) entries. Every size read from a root or a bundle is bounded.
//! Nothing here writes.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine;
use serde::Deserialize;
use sha2::{Digest, Sha256, Sha384, Sha512};
use x509_cert::der::{Decode, Encode};

use super::key::{Alg, EcdsaForm, Key};

/// The largest `trusted_root.json` read (the public one is about 8 KiB).
pub const MAX_TRUSTED_ROOT: u64 = 1 << 20;
/// The most logs or certificate authorities a trusted root may list.
pub const MAX_AUTHORITIES: usize = 64;
/// The most certificates in one chain (a CA's, or a bundle's).
pub const MAX_CHAIN: usize = 8;
/// The largest certificate or key taken (DER).
pub const MAX_CERT: usize = 16 << 10;
/// The most log entries a bundle may hold.
pub const MAX_TLOG_ENTRIES: usize = 16;
/// The most hashes of an inclusion proof (a tree of 2^64 leaves needs 64).
pub const MAX_PROOF_HASHES: usize = 64;
/// The largest checkpoint (a signed note) taken.
pub const MAX_CHECKPOINT: usize = 8 << 10;
/// The most signature lines of a checkpoint.
pub const MAX_NOTE_SIGNATURES: usize = 16;
/// The largest canonicalized log entry body taken (decoded).
pub const MAX_BODY: usize = 256 << 10;

const EKU_CODE_SIGNING: &str = "1.3.6.1.5.5.7.3.3";
const OID_SAN: &str = "2.5.29.17";
const OID_EKU: &str = "2.5.29.37";
const OID_BASIC: &str = "2.5.29.19";
const OID_ISSUER_V2: &str = "1.3.6.1.4.1.57264.1.8";
const OID_ISSUER_V1: &str = "1.3.6.1.4.1.57264.1.1";

/// A time span, in seconds since the epoch (either end open).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Window {
    pub start: Option<i64>,
    pub end: Option<i64>,
}

impl Window {
    pub fn covers(&self, t: i64) -> bool {
        self.start.is_none_or(|s| s <= t) && self.end.is_none_or(|e| t <= e)
    }
}

/// One transparency log of the trusted root.
#[derive(Clone, Debug)]
pub struct Tlog {
    /// `logId.keyId`: Rekor's is the SHA-256 of its key's DER SPKI.
    pub log_id: Vec<u8>,
    pub key: Key,
    pub window: Window,
}

/// One certificate authority of the trusted root: its chain, the
/// certificate that signs leaves first, the root last.
#[derive(Clone, Debug)]
pub struct Ca {
    chain: Vec<Cert>,
    pub window: Window,
}

/// A parsed `trusted_root.json`.
#[derive(Clone, Debug)]
pub struct TrustedRoot {
    /// The file it was read from, as given.
    pub file: PathBuf,
    pub tlogs: Vec<Tlog>,
    pub cas: Vec<Ca>,
}

/// `--trusted-root` with, for keyless signatures, `--certificate-identity`
/// and `--certificate-oidc-issuer`.
#[derive(Clone, Debug)]
pub struct Keyless {
    pub root: Arc<TrustedRoot>,
    /// `(identity, issuer)`; None: the root only checks keyed bundles' log entries.
    pub who: Option<(String, String)>,
}

impl Keyless {
    /// What a keyless verification records (the manifest's `verified`
    /// line, `status`): `keyless:ISSUER:IDENTITY`.
    pub fn label(&self) -> Option<String> {
        self.who
            .as_ref()
            .map(|(id, iss)| format!("keyless:{iss}:{id}"))
    }
}

#[derive(Deserialize)]
struct RootJson {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    #[serde(default)]
    tlogs: Vec<TlogJson>,
    #[serde(rename = "certificateAuthorities", default)]
    cas: Vec<CaJson>,
}

#[derive(Deserialize)]
struct TlogJson {
    #[serde(rename = "publicKey")]
    public_key: PublicKeyJson,
    #[serde(rename = "logId")]
    log_id: KeyIdJson,
}

#[derive(Deserialize)]
struct PublicKeyJson {
    #[serde(rename = "rawBytes")]
    raw: String,
    #[serde(rename = "validFor")]
    valid_for: Option<ValidFor>,
}

#[derive(Deserialize)]
struct KeyIdJson {
    #[serde(rename = "keyId")]
    key_id: String,
}

#[derive(Deserialize)]
struct ValidFor {
    start: Option<String>,
    end: Option<String>,
}

#[derive(Deserialize)]
struct CaJson {
    #[serde(rename = "certChain")]
    chain: ChainJson,
    #[serde(rename = "validFor")]
    valid_for: Option<ValidFor>,
}

#[derive(Deserialize)]
struct ChainJson {
    #[serde(default)]
    certificates: Vec<RawBytes>,
}

#[derive(Deserialize)]
struct RawBytes {
    #[serde(rename = "rawBytes")]
    raw: String,
}

fn b64(text: &str, what: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|e| format!("{what} is not base64: {e}"))
}

fn window(v: Option<&ValidFor>, what: &str) -> Result<Window, String> {
    let t = |s: &Option<String>| -> Result<Option<i64>, String> {
        s.as_deref()
            .map(|s| {
                humantime::parse_rfc3339_weak(s)
                    .map_err(|e| format!("{what}: validFor {s:?} is not an RFC 3339 time: {e}"))
                    .map(unix)
            })
            .transpose()
    };
    Ok(match v {
        None => Window::default(),
        Some(v) => Window {
            start: t(&v.start)?,
            end: t(&v.end)?,
        },
    })
}

fn unix(t: std::time::SystemTime) -> i64 {
    match t.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => d.as_secs().min(i64::MAX as u64) as i64,
        Err(e) => -(e.duration().as_secs().min(i64::MAX as u64) as i64),
    }
}

impl TrustedRoot {
    /// Read `--trusted-root FILE`; any failure is one line naming the file
    /// (the caller makes it exit 2).
    pub fn load(path: &Path) -> anyhow::Result<TrustedRoot> {
        let shown = path.display();
        let text = crate::sys::read_text_bounded(path, MAX_TRUSTED_ROOT)
            .map_err(|e| anyhow::anyhow!("{shown}: cannot read --trusted-root: {e}"))?;
        TrustedRoot::parse(path, text.as_bytes())
            .map_err(|m| anyhow::anyhow!("{shown}: bad --trusted-root: {m}"))
    }

    /// The trusted root in `bytes`. Pure; fuzzed (`fuzzing::trusted_root`).
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<TrustedRoot, String> {
        let r: RootJson = serde_json::from_slice(bytes)
            .map_err(|e| format!("not a Sigstore trusted_root.json: {e}"))?;
        if !r.media_type.is_empty()
            && !r
                .media_type
                .starts_with("application/vnd.dev.sigstore.trustedroot")
        {
            return Err(format!(
                "mediaType {:?} is not a trusted root's",
                r.media_type
            ));
        }
        if r.tlogs.len() > MAX_AUTHORITIES || r.cas.len() > MAX_AUTHORITIES {
            return Err(format!(
                "{} logs and {} certificate authorities (at most {MAX_AUTHORITIES} each)",
                r.tlogs.len(),
                r.cas.len()
            ));
        }
        let mut tlogs = Vec::new();
        for (i, t) in r.tlogs.iter().enumerate() {
            let what = format!("tlogs[{i}]");
            let der = b64(&t.public_key.raw, &format!("{what}.publicKey.rawBytes"))?;
            if der.len() > MAX_CERT {
                return Err(format!("{what}: a key of {} bytes", der.len()));
            }
            let key =
                Key::from_spki_der(path, &der).map_err(|e| format!("{what}.publicKey: {e:#}"))?;
            let log_id = b64(&t.log_id.key_id, &format!("{what}.logId.keyId"))?;
            if log_id.is_empty() || log_id.len() > 64 {
                return Err(format!("{what}.logId.keyId is {} bytes", log_id.len()));
            }
            tlogs.push(Tlog {
                log_id,
                key,
                window: window(t.public_key.valid_for.as_ref(), &what)?,
            });
        }
        let mut cas = Vec::new();
        for (i, c) in r.cas.iter().enumerate() {
            let what = format!("certificateAuthorities[{i}]");
            let n = c.chain.certificates.len();
            if n == 0 || n > MAX_CHAIN {
                return Err(format!(
                    "{what}: {n} certificates in its chain (1 to {MAX_CHAIN})"
                ));
            }
            let chain = c
                .chain
                .certificates
                .iter()
                .enumerate()
                .map(|(j, raw)| {
                    let w = format!("{what}.certChain.certificates[{j}]");
                    Cert::parse(&b64(&raw.raw, &w)?).map_err(|m| format!("{w}: {m}"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            cas.push(Ca {
                chain,
                window: window(c.valid_for.as_ref(), &what)?,
            });
        }
        if tlogs.is_empty() {
            return Err("no transparency log (tlogs is empty)".into());
        }
        Ok(TrustedRoot {
            file: path.to_path_buf(),
            tlogs,
            cas,
        })
    }
}

/// One certificate, parsed, with the DER it came as.
#[derive(Clone)]
pub struct Cert {
    der: Vec<u8>,
    tbs: Vec<u8>,
    cert: x509_cert::Certificate,
}

impl std::fmt::Debug for Cert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cert({})", self.cert.tbs_certificate.subject)
    }
}

impl Cert {
    /// A DER certificate (strict: it must encode back to the same bytes,
    /// so the signed part is what was signed). Pure; fuzzed.
    pub fn parse(der: &[u8]) -> Result<Cert, String> {
        if der.len() > MAX_CERT {
            return Err(format!(
                "a certificate of {} bytes (at most {MAX_CERT})",
                der.len()
            ));
        }
        let cert = x509_cert::Certificate::from_der(der)
            .map_err(|e| format!("not an X.509 certificate: {e}"))?;
        if cert.to_der().ok().as_deref() != Some(der) {
            return Err("the certificate is not in DER".into());
        }
        let tbs = cert
            .tbs_certificate
            .to_der()
            .map_err(|e| format!("cannot encode the certificate: {e}"))?;
        Ok(Cert {
            der: der.to_vec(),
            tbs,
            cert,
        })
    }

    fn validity(&self) -> Window {
        let v = &self.cert.tbs_certificate.validity;
        let s = |t: x509_cert::time::Time| t.to_unix_duration().as_secs() as i64;
        Window {
            start: Some(s(v.not_before)),
            end: Some(s(v.not_after)),
        }
    }

    /// The certificate's public key.
    pub fn key(&self, path: &Path) -> Result<Key, String> {
        let spki = self
            .cert
            .tbs_certificate
            .subject_public_key_info
            .to_der()
            .map_err(|e| format!("cannot encode the certificate's key: {e}"))?;
        Key::from_spki_der(path, &spki).map_err(|e| format!("the certificate's key: {e:#}"))
    }

    fn extension(&self, oid: &str) -> Option<&[u8]> {
        self.cert
            .tbs_certificate
            .extensions
            .as_ref()?
            .iter()
            .find(|e| e.extn_id.to_string() == oid)
            .map(|e| e.extn_value.as_bytes())
    }

    fn is_ca(&self) -> bool {
        self.extension(OID_BASIC)
            .and_then(|b| x509_cert::ext::pkix::BasicConstraints::from_der(b).ok())
            .is_some_and(|b| b.ca)
    }

    /// Whether `issuer`'s key signed this certificate, and it names
    /// `issuer` as its issuer.
    fn signed_by(&self, issuer: &Cert, path: &Path) -> bool {
        if self.cert.tbs_certificate.issuer != issuer.cert.tbs_certificate.subject {
            return false;
        }
        let Ok(key) = issuer.key(path) else {
            return false;
        };
        let Some(sig) = self.cert.signature.as_bytes() else {
            return false;
        };
        let alg = self.cert.signature_algorithm.oid.to_string();
        let tbs = &self.tbs;
        match alg.as_str() {
            "1.2.840.10045.4.3.2" => key.verify_ecdsa_prehash(&Sha256::digest(tbs), sig).is_ok(),
            "1.2.840.10045.4.3.3" => key.verify_ecdsa_prehash(&Sha384::digest(tbs), sig).is_ok(),
            "1.2.840.10045.4.3.4" => key.verify_ecdsa_prehash(&Sha512::digest(tbs), sig).is_ok(),
            "1.2.840.113549.1.1.11" => key.verify(Alg::Rs256, tbs, sig, EcdsaForm::Der).is_ok(),
            "1.2.840.113549.1.1.12" => key.verify(Alg::Rs384, tbs, sig, EcdsaForm::Der).is_ok(),
            "1.2.840.113549.1.1.13" => key.verify(Alg::Rs512, tbs, sig, EcdsaForm::Der).is_ok(),
            "1.3.101.112" => key.verify(Alg::EdDsa, tbs, sig, EcdsaForm::Raw).is_ok(),
            _ => false,
        }
    }

    /// The SAN's emails and URIs.
    pub fn identities(&self) -> Vec<String> {
        use x509_cert::ext::pkix::name::GeneralName;
        let Some(san) = self
            .extension(OID_SAN)
            .and_then(|b| x509_cert::ext::pkix::SubjectAltName::from_der(b).ok())
        else {
            return Vec::new();
        };
        san.0
            .iter()
            .filter_map(|n| match n {
                GeneralName::Rfc822Name(s) | GeneralName::UniformResourceIdentifier(s) => {
                    Some(s.to_string())
                }
                _ => None,
            })
            .collect()
    }

    /// The Fulcio OIDC issuer extension (the DER one, else the legacy raw one).
    pub fn oidc_issuer(&self) -> Option<String> {
        if let Some(b) = self.extension(OID_ISSUER_V2) {
            return x509_cert::der::asn1::Utf8StringRef::from_der(b)
                .ok()
                .map(|s| s.as_str().to_string());
        }
        self.extension(OID_ISSUER_V1)
            .and_then(|b| std::str::from_utf8(b).ok())
            .map(str::to_string)
    }

    fn code_signing(&self) -> bool {
        self.extension(OID_EKU)
            .and_then(|b| x509_cert::ext::pkix::ExtendedKeyUsage::from_der(b).ok())
            .is_some_and(|e| e.0.iter().any(|o| o.to_string() == EKU_CODE_SIGNING))
    }
}

/// A bundle's `verificationMaterial` (the parts read here).
#[derive(Deserialize, Default)]
pub struct Material {
    certificate: Option<RawBytes>,
    #[serde(rename = "x509CertificateChain")]
    chain: Option<ChainJson>,
    #[serde(rename = "tlogEntries", default)]
    tlog_entries: Vec<TlogEntry>,
}

impl Material {
    /// Whether it holds a certificate (a keyless signature).
    pub fn has_certificate(&self) -> bool {
        self.certificate.is_some() || self.chain.is_some()
    }

    /// The leaf certificate.
    fn leaf(&self) -> Result<Cert, String> {
        let raw = match (&self.certificate, &self.chain) {
            (Some(c), _) => c,
            (None, Some(ch)) => {
                if ch.certificates.len() > MAX_CHAIN {
                    return Err(format!(
                        "the bundle's certificate chain has {} certificates (at most {MAX_CHAIN})",
                        ch.certificates.len()
                    ));
                }
                ch.certificates
                    .first()
                    .ok_or("the bundle's certificate chain is empty")?
            }
            (None, None) => return Err("the bundle holds no certificate".into()),
        };
        Cert::parse(&b64(&raw.raw, "the bundle's certificate")?)
            .map_err(|m| format!("the bundle's certificate: {m}"))
    }
}

/// An int64 as protobuf's JSON writes it (a string), or a number.
#[derive(Deserialize, Clone)]
#[serde(untagged)]
enum Int {
    S(String),
    N(i64),
}

impl Int {
    fn get(&self, what: &str) -> Result<i64, String> {
        match self {
            Int::N(n) => Ok(*n),
            Int::S(s) => s
                .parse()
                .map_err(|_| format!("{what} {s:?} is not an integer")),
        }
    }
}

#[derive(Deserialize, Clone)]
struct TlogEntry {
    #[serde(rename = "logIndex")]
    log_index: Int,
    #[serde(rename = "logId")]
    log_id: KeyIdJson2,
    #[serde(rename = "integratedTime")]
    integrated_time: Option<Int>,
    #[serde(rename = "inclusionPromise")]
    promise: Option<Promise>,
    #[serde(rename = "inclusionProof")]
    proof: Option<ProofJson>,
    #[serde(rename = "canonicalizedBody")]
    body: String,
}

#[derive(Deserialize, Clone)]
struct KeyIdJson2 {
    #[serde(rename = "keyId")]
    key_id: String,
}

#[derive(Deserialize, Clone)]
struct Promise {
    #[serde(rename = "signedEntryTimestamp")]
    set: String,
}

#[derive(Deserialize, Clone)]
struct ProofJson {
    #[serde(rename = "logIndex")]
    log_index: Int,
    #[serde(rename = "rootHash")]
    root_hash: String,
    #[serde(rename = "treeSize")]
    tree_size: Int,
    #[serde(default)]
    hashes: Vec<String>,
    checkpoint: Option<CheckpointJson>,
}

#[derive(Deserialize, Clone)]
struct CheckpointJson {
    envelope: String,
}

/// What the bundle's signature is over.
pub enum Signed<'a> {
    /// A DSSE envelope: its payload and one of its signatures (over PAE).
    Dsse { payload: &'a [u8], sig: &'a [u8] },
    /// A `messageSignature`: the message's SHA-256 and the signature over it.
    Message { digest: [u8; 32], sig: &'a [u8] },
}

/// Who made the signature, as a log entry names its verifier.
pub enum Signer<'a> {
    Cert(&'a [u8]),
    Key(&'a Key),
}

/// A Rekor entry body (`canonicalizedBody`), the kinds taken.
#[derive(Deserialize)]
struct Body {
    kind: String,
    #[serde(rename = "apiVersion")]
    api_version: String,
    spec: serde_json::Value,
}

#[derive(Deserialize)]
struct HashJson {
    algorithm: String,
    value: String,
}

#[derive(Deserialize)]
struct DsseSpec {
    #[serde(rename = "payloadHash")]
    payload_hash: HashJson,
    #[serde(default)]
    signatures: Vec<DsseSig>,
}

#[derive(Deserialize)]
struct DsseSig {
    signature: String,
    verifier: String,
}

#[derive(Deserialize)]
struct RekordSpec {
    data: RekordData,
    signature: RekordSig,
}

#[derive(Deserialize)]
struct RekordData {
    hash: HashJson,
}

#[derive(Deserialize)]
struct RekordSig {
    content: String,
    #[serde(rename = "publicKey")]
    public_key: RekordKey,
}

#[derive(Deserialize)]
struct RekordKey {
    content: String,
}

/// Whether a log entry's `verifier` (base64 of a PEM certificate or
/// public key) is `signer`.
fn same_signer(verifier: &str, signer: &Signer) -> bool {
    let Ok(pem) = b64(verifier, "the verifier") else {
        return false;
    };
    let Ok((label, der)) = pem_rfc7468::decode_vec(&pem) else {
        return false;
    };
    match signer {
        Signer::Cert(c) => label == "CERTIFICATE" && der == *c,
        Signer::Key(k) => label == "PUBLIC KEY" && super::key::fingerprint(&der) == k.fingerprint,
    }
}

fn sha256_is(h: &HashJson, want: &[u8], what: &str) -> Result<(), String> {
    if h.algorithm != "sha256" {
        return Err(format!("its {what} hash is {:?}, not sha256", h.algorithm));
    }
    if !h.value.eq_ignore_ascii_case(&crate::escape::hex(want)) {
        return Err(format!("its {what} hash is not this signature's"));
    }
    Ok(())
}

/// Whether the entry body `body` (decoded `canonicalizedBody`) describes
/// `signed` by `signer`. Pure; fuzzed.
pub fn body_describes(body: &[u8], signed: &Signed, signer: &Signer) -> Result<(), String> {
    let b: Body =
        serde_json::from_slice(body).map_err(|e| format!("its body is not a Rekor entry: {e}"))?;
    let bad = |e: serde_json::Error| format!("its {} body is malformed: {e}", b.kind);
    match (b.kind.as_str(), b.api_version.as_str(), signed) {
        ("dsse", "0.0.1", Signed::Dsse { payload, sig }) => {
            let s: DsseSpec = Deserialize::deserialize(&b.spec).map_err(bad)?;
            sha256_is(&s.payload_hash, &Sha256::digest(payload), "payload")?;
            if s.signatures.len() > 64 {
                return Err("its body lists more than 64 signatures".into());
            }
            let listed = s.signatures.iter().any(|x| {
                b64(&x.signature, "").is_ok_and(|d| d == *sig) && same_signer(&x.verifier, signer)
            });
            if !listed {
                return Err("its body names another signature or signer".into());
            }
            Ok(())
        }
        ("hashedrekord", "0.0.1", Signed::Message { digest, sig }) => {
            let s: RekordSpec = Deserialize::deserialize(&b.spec).map_err(bad)?;
            sha256_is(&s.data.hash, digest, "message")?;
            if b64(&s.signature.content, "").ok().as_deref() != Some(*sig)
                || !same_signer(&s.signature.public_key.content, signer)
            {
                return Err("its body names another signature or signer".into());
            }
            Ok(())
        }
        (kind, version, _) => Err(format!(
            "its body is a {kind:?} {version} entry, not the {} 0.0.1 this signature needs",
            match signed {
                Signed::Dsse { .. } => "dsse",
                Signed::Message { .. } => "hashedrekord",
            }
        )),
    }
}

fn node(left: &[u8; 32], right: &[u8; 32]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update([1u8]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// RFC 6962's leaf hash of an entry body.
pub fn leaf_hash(body: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update([0u8]);
    h.update(body);
    h.finalize().into()
}

/// The root an RFC 6962 inclusion proof leads to (RFC 9162 2.1.3.2), or
/// None where the proof does not fit the index and size.
pub fn proof_root(index: u64, size: u64, leaf: [u8; 32], proof: &[[u8; 32]]) -> Option<[u8; 32]> {
    if index >= size {
        return None;
    }
    let (mut f, mut s, mut r) = (index, size - 1, leaf);
    for p in proof {
        if s == 0 {
            return None;
        }
        if f & 1 == 1 || f == s {
            r = node(p, &r);
            if f & 1 == 0 {
                while f & 1 == 0 && f != 0 {
                    f >>= 1;
                    s >>= 1;
                }
            }
        } else {
            r = node(&r, p);
        }
        f >>= 1;
        s >>= 1;
    }
    (s == 0).then_some(r)
}

/// A checkpoint (a signed note), parsed.
#[derive(Debug, PartialEq, Eq)]
pub struct Checkpoint {
    pub origin: String,
    pub size: u64,
    pub root: Vec<u8>,
    /// What the signatures are over: the note's text up to and with the
    /// newline before the blank line.
    pub text: String,
    /// Each signature line's name and its bytes after the 4-byte key hint.
    pub signatures: Vec<(String, [u8; 4], Vec<u8>)>,
}

/// Parse a checkpoint `envelope`. Pure; fuzzed (`fuzzing::checkpoint`).
pub fn parse_checkpoint(envelope: &str) -> Result<Checkpoint, String> {
    if envelope.len() > MAX_CHECKPOINT {
        return Err(format!(
            "the checkpoint is {} bytes (at most {MAX_CHECKPOINT})",
            envelope.len()
        ));
    }
    let at = envelope
        .find("\n\n")
        .ok_or("the checkpoint has no blank line before its signatures")?;
    let text = &envelope[..at + 1];
    let mut lines = text.lines();
    let origin = lines.next().unwrap_or("").to_string();
    let size = lines
        .next()
        .and_then(|l| l.parse::<u64>().ok())
        .ok_or("the checkpoint's second line is not a tree size")?;
    let root = lines
        .next()
        .and_then(|l| base64::engine::general_purpose::STANDARD.decode(l).ok())
        .ok_or("the checkpoint's third line is not a base64 root hash")?;
    if origin.is_empty() {
        return Err("the checkpoint has no origin line".into());
    }
    let mut signatures = Vec::new();
    for line in envelope[at + 2..].lines() {
        if line.is_empty() {
            continue;
        }
        if signatures.len() == MAX_NOTE_SIGNATURES {
            return Err(format!(
                "the checkpoint has more than {MAX_NOTE_SIGNATURES} signatures"
            ));
        }
        let rest = line
            .strip_prefix("\u{2014} ")
            .ok_or("a checkpoint signature line does not start with \"— \"")?;
        let (name, sig) = rest
            .rsplit_once(' ')
            .ok_or("a checkpoint signature line has no signature")?;
        let sig = base64::engine::general_purpose::STANDARD
            .decode(sig)
            .map_err(|_| "a checkpoint signature is not base64")?;
        if sig.len() < 5 {
            return Err("a checkpoint signature is too short".into());
        }
        let hint = [sig[0], sig[1], sig[2], sig[3]];
        signatures.push((name.to_string(), hint, sig[4..].to_vec()));
    }
    if signatures.is_empty() {
        return Err("the checkpoint is not signed".into());
    }
    Ok(Checkpoint {
        origin,
        size,
        root,
        text: text.to_string(),
        signatures,
    })
}

/// Check one log entry: it describes `signed` by `signer`, it is in a log
/// of `root`, its inclusion is proven (or promised). Its integrated time.
fn check_entry(
    root: &TrustedRoot,
    e: &TlogEntry,
    signed: &Signed,
    signer: &Signer,
) -> Result<Logged, String> {
    let body = b64(&e.body, "the log entry's canonicalizedBody")?;
    if body.len() > MAX_BODY {
        return Err(format!("the log entry's body is {} bytes", body.len()));
    }
    body_describes(&body, signed, signer).map_err(|m| format!("the log entry: {m}"))?;
    let log_id = b64(&e.log_id.key_id, "the log entry's logId")?;
    let log = root
        .tlogs
        .iter()
        .find(|t| t.log_id == log_id)
        .ok_or_else(|| {
            format!(
                "the log entry's logId {} is not a log of the trusted root {}",
                crate::escape::hex(&log_id),
                root.file.display()
            )
        })?;
    let time = e
        .integrated_time
        .as_ref()
        .ok_or("the log entry has no integratedTime")?
        .get("the log entry's integratedTime")?;
    if !log.window.covers(time) {
        return Err(format!(
            "time: the log's key was not valid at the entry's integrated time {time}"
        ));
    }
    let index = e.log_index.get("the log entry's logIndex")?;
    if e.proof.is_none() && e.promise.is_none() {
        return Err("the log entry has neither an inclusion proof nor a promise".into());
    }
    if let Some(p) = &e.proof {
        let n = p.hashes.len();
        if n > MAX_PROOF_HASHES {
            return Err(format!(
                "inclusion proof: {n} hashes (at most {MAX_PROOF_HASHES})"
            ));
        }
        let hashes = p
            .hashes
            .iter()
            .map(|h| {
                b64(h, "an inclusion proof hash")?
                    .try_into()
                    .map_err(|_| "inclusion proof: a hash is not 32 bytes".to_string())
            })
            .collect::<Result<Vec<[u8; 32]>, String>>()?;
        let pi = p.log_index.get("the inclusion proof's logIndex")?;
        let size = p.tree_size.get("the inclusion proof's treeSize")?;
        let (Ok(pi), Ok(size)) = (u64::try_from(pi), u64::try_from(size)) else {
            return Err("inclusion proof: a negative index or size".into());
        };
        let claimed = b64(&p.root_hash, "the inclusion proof's rootHash")?;
        let got = proof_root(pi, size, leaf_hash(&body), &hashes).ok_or_else(|| {
            format!("inclusion proof: {n} hashes do not fit index {pi} of a tree of {size}")
        })?;
        if got[..] != claimed[..] {
            return Err("inclusion proof: its hashes do not lead to its root hash".into());
        }
        // An older bundle's proof may have no checkpoint: its signed entry
        // timestamp (checked below) is then what the log signed.
        let cp = match (&p.checkpoint, &e.promise) {
            (Some(cp), _) => cp,
            (None, Some(_)) => return check_promise(log, e, &log_id, time, index),
            (None, None) => {
                return Err("inclusion proof without a checkpoint (and no promise)".into())
            }
        };
        let cp = parse_checkpoint(&cp.envelope).map_err(|m| format!("checkpoint: {m}"))?;
        if cp.size != size || cp.root != claimed {
            return Err(
                "checkpoint: its tree size or root hash is not the inclusion proof's".into(),
            );
        }
        let signed_by_log = cp
            .signatures
            .iter()
            .any(|(_, _, sig)| super::key::signed_by(&log.key, cp.text.as_bytes(), sig));
        if !signed_by_log {
            return Err(format!(
                "checkpoint signature: not by the key of log {} (signed by another key, or altered)",
                cp.origin
            ));
        }
    }
    check_promise(log, e, &log_id, time, index)
}

/// The entry's signed entry timestamp, where it has one, by `log`'s key
/// over the canonical JSON of its body, time, log id and index.
fn check_promise(
    log: &Tlog,
    e: &TlogEntry,
    log_id: &[u8],
    time: i64,
    index: i64,
) -> Result<Logged, String> {
    if let Some(pr) = &e.promise {
        let set = b64(&pr.set, "the signed entry timestamp")?;
        let canon = format!(
            "{{\"body\":{},\"integratedTime\":{time},\"logID\":\"{}\",\"logIndex\":{index}}}",
            serde_json::to_string(&e.body).expect("a string"),
            crate::escape::hex(log_id)
        );
        if !super::key::signed_by(&log.key, canon.as_bytes(), &set) {
            return Err(
                "inclusion promise: the signed entry timestamp is not by the log's key".into(),
            );
        }
    }
    Ok(Logged {
        time,
        time_signed: e.promise.is_some(),
    })
}

/// A log entry that checked: its integrated time, and whether the log
/// signed that time (a signed entry timestamp covers it; an inclusion
/// proof and its checkpoint do not).
#[derive(Clone, Copy, Debug)]
pub struct Logged {
    pub time: i64,
    pub time_signed: bool,
}

/// The integrated time of the first of the bundle's log entries that
/// checks (`check_entry`), or what was wrong with the first.
pub fn check_tlog(
    root: &TrustedRoot,
    m: &Material,
    signed: &Signed,
    signer: &Signer,
) -> Result<Logged, String> {
    if m.tlog_entries.is_empty() {
        return Err("the bundle has no transparency log entry".into());
    }
    if m.tlog_entries.len() > MAX_TLOG_ENTRIES {
        return Err(format!(
            "the bundle has {} log entries (at most {MAX_TLOG_ENTRIES})",
            m.tlog_entries.len()
        ));
    }
    let mut first = None;
    for e in &m.tlog_entries {
        match check_entry(root, e, signed, signer) {
            Ok(t) => return Ok(t),
            Err(msg) => first = first.or(Some(msg)),
        }
    }
    Err(first.expect("one entry at least"))
}

/// The leaf's key, once `leaf` chains to a CA of `root` valid at `time`.
fn check_chain(root: &TrustedRoot, leaf: &Cert, time: i64) -> Result<Key, String> {
    let w = leaf.validity();
    if !w.covers(time) {
        return Err(format!(
            "time: the certificate is valid from {} to {}, not at the log entry's integrated time {}",
            show_time(w.start),
            show_time(w.end),
            show_time(Some(time))
        ));
    }
    if !leaf.code_signing() {
        return Err("the certificate has no codeSigning extended key usage".into());
    }
    let chains = |ca: &Ca| {
        ca.window.covers(time)
            && leaf.signed_by(&ca.chain[0], &root.file)
            && ca
                .chain
                .iter()
                .all(|c| c.is_ca() && c.validity().covers(time))
            && ca
                .chain
                .windows(2)
                .all(|p| p[0].signed_by(&p[1], &root.file))
    };
    if !root.cas.iter().any(chains) {
        return Err(format!(
            "chain: the certificate (issued by {}) does not chain to a certificate authority of \
             the trusted root {} valid at {}",
            leaf.cert.tbs_certificate.issuer,
            root.file.display(),
            show_time(Some(time))
        ));
    }
    leaf.key(&root.file)
}

fn show_time(t: Option<i64>) -> String {
    match t.and_then(|t| u64::try_from(t).ok()) {
        Some(t) => humantime::format_rfc3339_seconds(
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(t),
        )
        .to_string(),
        None => "?".into(),
    }
}

/// Verify a keyless signature: the log entry, the chain at its integrated
/// time, the identity and issuer, and `signed` by the leaf's key. The
/// identity recorded (`Keyless::label`), or what was wrong.
pub fn verify(k: &Keyless, m: &Material, signed: &Signed) -> Result<String, String> {
    let Some((identity, issuer)) = &k.who else {
        return Err("a certificate, and no --certificate-identity to check it against".into());
    };
    let leaf = m.leaf()?;
    let logged = check_tlog(&k.root, m, signed, &Signer::Cert(&leaf.der))?;
    // A certificate lives minutes: what says it was valid when it signed
    // is the time the log signed, never a time the bundle merely states.
    if !logged.time_signed {
        return Err(
            "time: the log entry's integrated time is not signed (no signed entry timestamp), \
             so the certificate's validity at signing cannot be checked"
                .into(),
        );
    }
    let key = check_chain(&k.root, &leaf, logged.time)?;
    let ids = leaf.identities();
    if !ids.iter().any(|i| i == identity) {
        return Err(format!(
            "identity: the certificate is for {}, not --certificate-identity {identity}",
            if ids.is_empty() {
                "no email or URI".to_string()
            } else {
                ids.join(", ")
            }
        ));
    }
    match leaf.oidc_issuer() {
        Some(i) if i == *issuer => {}
        other => {
            return Err(format!(
            "issuer: the certificate's OIDC issuer is {}, not --certificate-oidc-issuer {issuer}",
            other.as_deref().unwrap_or("missing")
        ))
        }
    }
    let ok = match signed {
        Signed::Dsse { payload, sig } => {
            super::key::signed_by(&key, &super::dsse::pae(super::dsse::IN_TOTO, payload), sig)
        }
        Signed::Message { digest, sig } => key.verify_sha256_digest(digest, sig).is_ok(),
    };
    if !ok {
        return Err(format!(
            "the signature does not verify with the certificate of {identity} (altered)"
        ));
    }
    Ok(k.label().expect("who is set"))
}

#[cfg(test)]
mod tests {
    use super::*;

    // A published vector, used as facts: sigstore-python's test assets
    // (github.com/sigstore/sigstore-python, Apache-2.0), `test/assets/bundle_v3.txt`
    // and its bundle `bundle_v3.txt.sigstore` (a messageSignature with a
    // hashedrekord entry in the staging Rekor), verified there against the
    // staging trusted root (`sigstore/_store/…sigstage.dev/trusted_root.json`)
    // for identity william@yossarian.net, issuer https://github.com/login/oauth
    // (test/unit/verify/test_verifier.py, test/integration/cli/test_verify.py).
    const ROOT: &[u8] = include_bytes!("testdata/staging_trusted_root.json");
    const BUNDLE: &[u8] = include_bytes!("testdata/bundle_v3.txt.sigstore");
    const ARTIFACT: &[u8] = include_bytes!("testdata/bundle_v3.txt");
    // And `test/assets/bundle.txt` with `bundle.txt.sigstore`: a v0.1 bundle
    // whose certificate is an `x509CertificateChain`, for a@tny.town and the
    // same issuer (test/unit/verify/test_policy.py).
    const BUNDLE_V1: &[u8] = include_bytes!("testdata/bundle.txt.sigstore");
    const ARTIFACT_V1: &[u8] = include_bytes!("testdata/bundle.txt");
    const IDENTITY: &str = "william@yossarian.net";
    const ISSUER: &str = "https://github.com/login/oauth";

    #[derive(Deserialize)]
    struct VectorBundle {
        #[serde(rename = "verificationMaterial")]
        material: Material,
        #[serde(rename = "messageSignature")]
        message: VectorMessage,
    }

    #[derive(Deserialize)]
    struct VectorMessage {
        signature: String,
    }

    fn keyless(root: &[u8]) -> Keyless {
        keyless_for(root, IDENTITY)
    }

    fn keyless_for(root: &[u8], identity: &str) -> Keyless {
        Keyless {
            root: Arc::new(TrustedRoot::parse(Path::new("trusted_root.json"), root).unwrap()),
            who: Some((identity.into(), ISSUER.into())),
        }
    }

    fn check(k: &Keyless, bundle: &[u8], artifact: &[u8]) -> Result<String, String> {
        let b: VectorBundle = serde_json::from_slice(bundle).map_err(|e| e.to_string())?;
        let sig = b64(&b.message.signature, "sig")?;
        let signed = Signed::Message {
            digest: Sha256::digest(artifact).into(),
            sig: &sig,
        };
        verify(k, &b.material, &signed)
    }

    #[test]
    fn sigstore_pythons_bundle_verifies_and_one_byte_changed_does_not() {
        let k = keyless(ROOT);
        assert!(k.root.tlogs.len() >= 2 && !k.root.cas.is_empty());
        let v1 = keyless_for(ROOT, "a@tny.town");
        for (k, bundle, artifact) in [(&k, BUNDLE, ARTIFACT), (&v1, BUNDLE_V1, ARTIFACT_V1)] {
            let (id, _) = k.who.as_ref().unwrap();
            assert_eq!(
                check(k, bundle, artifact).unwrap(),
                format!("keyless:{ISSUER}:{id}")
            );
            let mut a = artifact.to_vec();
            a[3] ^= 0x20;
            assert!(check(k, bundle, &a).unwrap_err().contains("log entry"));
        }
        assert!(check(&k, BUNDLE_V1, ARTIFACT_V1)
            .unwrap_err()
            .starts_with("identity: the certificate is for a@tny.town"));
        // The artifact with one byte changed: the log entry names another hash.
        let mut a = ARTIFACT.to_vec();
        a[0] ^= 1;
        assert!(check(&k, BUNDLE, &a).unwrap_err().contains("log entry"));
        // Another identity, another issuer.
        let other = |who: (&str, &str)| Keyless {
            who: Some((who.0.into(), who.1.into())),
            ..k.clone()
        };
        assert!(check(&other(("a@b.c", ISSUER)), BUNDLE, ARTIFACT)
            .unwrap_err()
            .starts_with("identity:"));
        assert!(check(
            &other((IDENTITY, "https://accounts.google.com")),
            BUNDLE,
            ARTIFACT
        )
        .unwrap_err()
        .starts_with("issuer:"));
    }

    /// The bundle's text with the first base64 value of `field` (a JSON
    /// key) having one byte changed at `at` (decoded), re-encoded.
    fn altered(field: &str, at: usize) -> Vec<u8> {
        let mut v: serde_json::Value = serde_json::from_slice(BUNDLE).unwrap();
        fn walk(v: &mut serde_json::Value, field: &str, at: usize) -> bool {
            match v {
                serde_json::Value::Object(m) => {
                    if let Some(serde_json::Value::Array(a)) = m.get_mut(field) {
                        return walk(&mut a[0], "", at);
                    }
                    if let Some(serde_json::Value::String(s)) = m.get_mut(field) {
                        let e = &base64::engine::general_purpose::STANDARD;
                        let mut d = e.decode(&*s).unwrap();
                        let i = at.min(d.len() - 1);
                        d[i] ^= 1;
                        *s = e.encode(d);
                        return true;
                    }
                    m.values_mut().any(|x| walk(x, field, at))
                }
                serde_json::Value::Array(a) => a.iter_mut().any(|x| walk(x, field, at)),
                serde_json::Value::String(s) if field.is_empty() => {
                    let e = &base64::engine::general_purpose::STANDARD;
                    let mut d = e.decode(&*s).unwrap();
                    let i = at.min(d.len() - 1);
                    d[i] ^= 1;
                    *s = e.encode(d);
                    true
                }
                _ => false,
            }
        }
        assert!(walk(&mut v, field, at), "{field}");
        serde_json::to_vec(&v).unwrap()
    }

    #[test]
    fn sigstore_pythons_bundle_altered_anywhere_is_refused() {
        let k = keyless(ROOT);
        let e = |field: &str, at: usize| check(&k, &altered(field, at), ARTIFACT).unwrap_err();
        // The signature (the body names the original one).
        assert!(
            e("signature", 40).contains("log entry"),
            "{}",
            e("signature", 40)
        );
        // The certificate's signature by Fulcio (its last bytes) or its
        // public key: the body names the original certificate.
        assert!(e("rawBytes", 700).contains("log entry"));
        // The entry's body: its leaf hash is another, so is the promise's.
        let body = e("canonicalizedBody", 0);
        assert!(body.contains("log entry"), "{body}");
        // One hash of the inclusion proof, the root hash, the checkpoint.
        let h = e("hashes", 3);
        assert!(h.starts_with("inclusion proof"), "{h}");
        assert!(e("rootHash", 3).starts_with("inclusion proof"));
        let set = e("signedEntryTimestamp", 20);
        assert!(set.starts_with("inclusion promise"), "{set}");
        assert!(e("keyId", 5).contains("not a log of the trusted root"));
    }

    #[test]
    fn a_proof_without_its_checkpoint_needs_the_promise() {
        let k = keyless(ROOT);
        let mut v: serde_json::Value = serde_json::from_slice(BUNDLE).unwrap();
        let e = &mut v["verificationMaterial"]["tlogEntries"][0];
        e["inclusionProof"]
            .as_object_mut()
            .unwrap()
            .remove("checkpoint");
        assert!(check(&k, &serde_json::to_vec(&v).unwrap(), ARTIFACT).is_ok());
        let e = &mut v["verificationMaterial"]["tlogEntries"][0];
        e.as_object_mut().unwrap().remove("inclusionPromise");
        assert!(check(&k, &serde_json::to_vec(&v).unwrap(), ARTIFACT)
            .unwrap_err()
            .contains("without a checkpoint"));
        let e = &mut v["verificationMaterial"]["tlogEntries"][0];
        e.as_object_mut().unwrap().remove("inclusionProof");
        assert!(check(&k, &serde_json::to_vec(&v).unwrap(), ARTIFACT)
            .unwrap_err()
            .contains("neither an inclusion proof nor a promise"));
    }

    #[test]
    fn sigstore_pythons_bundle_needs_its_ca_and_its_log() {
        let mut root: serde_json::Value = serde_json::from_slice(ROOT).unwrap();
        let full = root.clone();
        root["certificateAuthorities"] = serde_json::json!([]);
        let k = keyless(&serde_json::to_vec(&root).unwrap());
        assert!(check(&k, BUNDLE, ARTIFACT)
            .unwrap_err()
            .starts_with("chain:"));
        let mut root = full;
        let logs = root["tlogs"].as_array_mut().unwrap();
        let first = logs.remove(0);
        let k = keyless(&serde_json::to_vec(&root).unwrap());
        assert!(check(&k, BUNDLE, ARTIFACT)
            .unwrap_err()
            .contains("not a log of the trusted root"));
        // That log's key under another log's id: nothing verifies.
        let mut swapped = root.clone();
        swapped["tlogs"][0]["logId"] = first["logId"].clone();
        let k = keyless(&serde_json::to_vec(&swapped).unwrap());
        let m = check(&k, BUNDLE, ARTIFACT).unwrap_err();
        assert!(
            m.starts_with("checkpoint signature") || m.starts_with("time"),
            "{m}"
        );
    }

    #[test]
    fn an_inclusion_proof_is_rfc_6962s() {
        // A tree of 5 leaves, built here: every leaf's proof leads to the root.
        let leaves: Vec<[u8; 32]> = (0..5u8).map(|i| leaf_hash(&[i])).collect();
        fn root(l: &[[u8; 32]]) -> [u8; 32] {
            if l.len() == 1 {
                return l[0];
            }
            let k = l.len().next_power_of_two() / 2;
            node(&root(&l[..k]), &root(&l[k..]))
        }
        fn path(l: &[[u8; 32]], i: usize) -> Vec<[u8; 32]> {
            if l.len() == 1 {
                return Vec::new();
            }
            let k = l.len().next_power_of_two() / 2;
            if i < k {
                let mut p = path(&l[..k], i);
                p.push(root(&l[k..]));
                p
            } else {
                let mut p = path(&l[k..], i - k);
                p.push(root(&l[..k]));
                p
            }
        }
        let r = root(&leaves);
        for i in 0..5 {
            let p = path(&leaves, i);
            assert_eq!(proof_root(i as u64, 5, leaves[i], &p), Some(r), "{i}");
            assert_ne!(proof_root(((i + 1) % 5) as u64, 5, leaves[i], &p), Some(r));
            let mut bad = p.clone();
            if let Some(h) = bad.first_mut() {
                h[0] ^= 1;
                assert_ne!(proof_root(i as u64, 5, leaves[i], &bad), Some(r));
            }
        }
        assert_eq!(proof_root(5, 5, leaves[0], &[]), None);
    }

    #[test]
    fn a_checkpoint_is_a_signed_note() {
        let c = parse_checkpoint("log - 1\n12\nAAEC\n\n\u{2014} log AAAAAAEC\n").unwrap();
        assert_eq!(
            (c.origin.as_str(), c.size, c.root.as_slice()),
            ("log - 1", 12, &[0u8, 1, 2][..])
        );
        assert_eq!(c.text, "log - 1\n12\nAAEC\n");
        assert_eq!(
            c.signatures,
            [("log".to_string(), [0, 0, 0, 0], vec![1, 2])]
        );
        assert!(parse_checkpoint("log\n12\nAAEC\n").is_err());
        assert!(parse_checkpoint("log\nx\nAAEC\n\n\u{2014} log AAAAAAEC\n").is_err());
        assert!(parse_checkpoint("log\n12\nAAEC\n\n- log AAAAAAEC\n").is_err());
        assert!(parse_checkpoint("log\n12\nAAEC\n\n").is_err());
        assert!(parse_checkpoint(&"x".repeat(MAX_CHECKPOINT + 1)).is_err());
    }

    #[test]
    fn a_trusted_root_is_bounded_and_refuses_what_is_malformed() {
        let p = Path::new("r.json");
        assert!(TrustedRoot::parse(p, b"{}")
            .unwrap_err()
            .contains("no transparency log"));
        assert!(TrustedRoot::parse(p, b"[").is_err());
        let mut root: serde_json::Value = serde_json::from_slice(ROOT).unwrap();
        root["tlogs"][0]["publicKey"]["rawBytes"] = "AAAA".into();
        assert!(TrustedRoot::parse(p, &serde_json::to_vec(&root).unwrap())
            .unwrap_err()
            .contains("tlogs[0].publicKey"));
        let mut root: serde_json::Value = serde_json::from_slice(ROOT).unwrap();
        root["certificateAuthorities"][0]["certChain"]["certificates"][0]["rawBytes"] =
            "AAAA".into();
        assert!(TrustedRoot::parse(p, &serde_json::to_vec(&root).unwrap())
            .unwrap_err()
            .contains("certificateAuthorities[0]"));
        let mut root: serde_json::Value = serde_json::from_slice(ROOT).unwrap();
        root["tlogs"] =
            serde_json::Value::Array(vec![root["tlogs"][0].clone(); MAX_AUTHORITIES + 1]);
        assert!(TrustedRoot::parse(p, &serde_json::to_vec(&root).unwrap())
            .unwrap_err()
            .contains("at most"));
    }
}
