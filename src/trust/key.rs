//! Public keys the operator pins (`--verify-key FILE`): read from PEM once,
//! each with its fingerprint, and the one call that checks a signature with
//! one of them (`Key::verify`). JWS (`jws.rs`) and, later, image signatures
//! use only this; nothing here knows about bundles or tokens.

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Result};
use base64::Engine;
use sha2::{Digest, Sha256, Sha384, Sha512};

/// Longest key file read: a PEM RSA-16384 key is under 3 KiB.
const MAX_KEY_FILE: u64 = 64 << 10;
/// RSA moduli shorter than this are refused (exit 2).
pub const MIN_RSA_BITS: usize = 2048;

/// A signature algorithm, as JWS names them (RFC 7518; EdDSA from RFC 8037).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alg {
    Es256,
    Es384,
    EdDsa,
    Rs256,
    Rs384,
    Rs512,
    Ps256,
    Ps384,
    Ps512,
}

impl Alg {
    /// The algorithm a JWS header names; `None` for anything else (`none`,
    /// every `HS*`: a shared secret is not a pinned public key).
    pub fn from_jws(name: &str) -> Option<Alg> {
        Some(match name {
            "ES256" => Alg::Es256,
            "ES384" => Alg::Es384,
            "EdDSA" => Alg::EdDsa,
            "RS256" => Alg::Rs256,
            "RS384" => Alg::Rs384,
            "RS512" => Alg::Rs512,
            "PS256" => Alg::Ps256,
            "PS384" => Alg::Ps384,
            "PS512" => Alg::Ps512,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Alg::Es256 => "ES256",
            Alg::Es384 => "ES384",
            Alg::EdDsa => "EdDSA",
            Alg::Rs256 => "RS256",
            Alg::Rs384 => "RS384",
            Alg::Rs512 => "RS512",
            Alg::Ps256 => "PS256",
            Alg::Ps384 => "PS384",
            Alg::Ps512 => "PS512",
        }
    }
}

/// How an ECDSA signature is laid out: JWS writes `r || s` (RFC 7518
/// 3.4), cosign and X.509 write ASN.1 DER.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EcdsaForm {
    Raw,
    Der,
}

#[derive(Clone)]
enum Public {
    P256(p256::ecdsa::VerifyingKey),
    P384(p384::ecdsa::VerifyingKey),
    Ed25519(ed25519_dalek::VerifyingKey),
    Rsa(rsa::RsaPublicKey),
}

/// One pinned public key.
#[derive(Clone)]
pub struct Key {
    /// The file it was read from, as given.
    pub file: PathBuf,
    /// `SHA256:` and the unpadded base64 of the SHA-256 of its DER
    /// SubjectPublicKeyInfo.
    pub fingerprint: String,
    public: Public,
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({} {})", self.kind(), self.fingerprint)
    }
}

/// Why a signature was not accepted by a key.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The key is of another type than the algorithm needs.
    WrongType,
    /// The signature does not verify (another key's, or altered).
    Bad,
}

impl Key {
    /// Read a PEM public key from `path`. Any failure is one line naming
    /// the file and the cause (the caller makes it exit 2).
    pub fn load(path: &Path) -> Result<Key> {
        let shown = path.display();
        let text = crate::sys::read_text_bounded(path, MAX_KEY_FILE)
            .map_err(|e| anyhow!("{shown}: cannot read --verify-key: {e}"))?;
        Key::from_pem(path, &text).map_err(|e| anyhow!("{shown}: bad --verify-key: {e:#}"))
    }

    /// The key in `text` (one PEM block; text around it is ignored).
    pub fn from_pem(path: &Path, text: &str) -> Result<Key> {
        let begin = text
            .find("-----BEGIN ")
            .ok_or_else(|| anyhow!("no PEM block (-----BEGIN PUBLIC KEY-----)"))?;
        let rest = &text[begin..];
        let end = rest
            .find("-----END ")
            .and_then(|at| {
                rest[at..]
                    .find('\n')
                    .map(|nl| at + nl + 1)
                    .or(Some(rest.len()))
            })
            .ok_or_else(|| anyhow!("PEM block without its -----END line"))?;
        let (label, der) = pem_rfc7468::decode_vec(&rest.as_bytes()[..end])
            .map_err(|e| anyhow!("malformed PEM: {e}"))?;
        let (public, spki) = match label {
            "PUBLIC KEY" => (from_spki(&der)?, der),
            "RSA PUBLIC KEY" => {
                use rsa::pkcs1::DecodeRsaPublicKey;
                use rsa::pkcs8::EncodePublicKey;
                let k = rsa::RsaPublicKey::from_pkcs1_der(&der)
                    .map_err(|e| anyhow!("malformed PKCS#1 RSA public key: {e}"))?;
                let spki = k
                    .to_public_key_der()
                    .map_err(|e| anyhow!("cannot encode the RSA key: {e}"))?;
                (Public::Rsa(k), spki.as_bytes().to_vec())
            }
            l if l.contains("PRIVATE KEY") => {
                bail!("a private key ({l}): give its public key (openssl pkey -in KEY -pubout)")
            }
            "CERTIFICATE" => {
                bail!("a certificate: give its public key (openssl x509 -in CERT -pubkey -noout)")
            }
            l => bail!("PEM block {l:?} is not a PUBLIC KEY"),
        };
        if let Public::Rsa(k) = &public {
            use rsa::traits::PublicKeyParts;
            let bits = k.n().bits();
            if bits < MIN_RSA_BITS {
                bail!("RSA key of {bits} bits: at least {MIN_RSA_BITS} are needed");
            }
        }
        Ok(Key {
            file: path.to_path_buf(),
            fingerprint: fingerprint(&spki),
            public,
        })
    }

    /// The key a DER SubjectPublicKeyInfo holds (a trusted root's log
    /// key, a certificate's), named by `path` (where it was read).
    pub fn from_spki_der(path: &Path, der: &[u8]) -> Result<Key> {
        let public = from_spki(der)?;
        if let Public::Rsa(k) = &public {
            use rsa::traits::PublicKeyParts;
            let bits = k.n().bits();
            if bits < MIN_RSA_BITS {
                bail!("RSA key of {bits} bits: at least {MIN_RSA_BITS} are needed");
            }
        }
        Ok(Key {
            file: path.to_path_buf(),
            fingerprint: fingerprint(der),
            public,
        })
    }

    /// What kind of key this is, for messages.
    pub fn kind(&self) -> &'static str {
        match self.public {
            Public::P256(_) => "ECDSA P-256",
            Public::P384(_) => "ECDSA P-384",
            Public::Ed25519(_) => "Ed25519",
            Public::Rsa(_) => "RSA",
        }
    }

    /// Whether this key can check signatures made with `alg`.
    pub fn fits(&self, alg: Alg) -> bool {
        matches!(
            (&self.public, alg),
            (Public::P256(_), Alg::Es256)
                | (Public::P384(_), Alg::Es384)
                | (Public::Ed25519(_), Alg::EdDsa)
                | (
                    Public::Rsa(_),
                    Alg::Rs256 | Alg::Rs384 | Alg::Rs512 | Alg::Ps256 | Alg::Ps384 | Alg::Ps512
                )
        )
    }

    /// Check `signature` over `message` made with `alg` by this key. ECDSA
    /// hashes `message` with the algorithm's hash (SHA-256 for ES256, as
    /// cosign signs a payload); `form` says how its signature is laid out.
    pub fn verify(
        &self,
        alg: Alg,
        message: &[u8],
        signature: &[u8],
        form: EcdsaForm,
    ) -> Result<(), Refusal> {
        use p256::ecdsa::signature::Verifier;
        if !self.fits(alg) {
            return Err(Refusal::WrongType);
        }
        let ok = match &self.public {
            Public::P256(k) => {
                let sig = match form {
                    EcdsaForm::Raw => p256::ecdsa::Signature::from_slice(signature),
                    EcdsaForm::Der => p256::ecdsa::Signature::from_der(signature),
                };
                sig.is_ok_and(|s| k.verify(message, &s).is_ok())
            }
            Public::P384(k) => {
                let sig = match form {
                    EcdsaForm::Raw => p384::ecdsa::Signature::from_slice(signature),
                    EcdsaForm::Der => p384::ecdsa::Signature::from_der(signature),
                };
                sig.is_ok_and(|s| k.verify(message, &s).is_ok())
            }
            Public::Ed25519(k) => ed25519_dalek::Signature::from_slice(signature)
                .is_ok_and(|s| k.verify_strict(message, &s).is_ok()),
            Public::Rsa(k) => rsa_verify(k, alg, message, signature),
        };
        if ok {
            Ok(())
        } else {
            Err(Refusal::Bad)
        }
    }

    /// Check an ECDSA signature (DER) over a SHA-256 digest computed
    /// elsewhere: P-256, or P-384 as `cosign verify --key` checks one (it
    /// hashes with SHA-256 whatever the curve).
    pub fn verify_sha256_digest(&self, digest: &[u8; 32], der: &[u8]) -> Result<(), Refusal> {
        use p256::ecdsa::signature::hazmat::PrehashVerifier;
        match &self.public {
            Public::P256(k) => {
                let sig = p256::ecdsa::Signature::from_der(der).map_err(|_| Refusal::Bad)?;
                k.verify_prehash(digest, &sig).map_err(|_| Refusal::Bad)
            }
            Public::P384(k) => {
                let sig = p384::ecdsa::Signature::from_der(der).map_err(|_| Refusal::Bad)?;
                k.verify_prehash(digest, &sig).map_err(|_| Refusal::Bad)
            }
            _ => Err(Refusal::WrongType),
        }
    }

    /// Check an ECDSA signature (DER) over a digest computed elsewhere
    /// (an X.509 signature: SHA-256 or SHA-384 of the signed part, either
    /// curve).
    pub fn verify_ecdsa_prehash(&self, prehash: &[u8], der: &[u8]) -> Result<(), Refusal> {
        use p256::ecdsa::signature::hazmat::PrehashVerifier;
        match &self.public {
            Public::P256(k) => {
                let sig = p256::ecdsa::Signature::from_der(der).map_err(|_| Refusal::Bad)?;
                k.verify_prehash(prehash, &sig).map_err(|_| Refusal::Bad)
            }
            Public::P384(k) => {
                let sig = p384::ecdsa::Signature::from_der(der).map_err(|_| Refusal::Bad)?;
                k.verify_prehash(prehash, &sig).map_err(|_| Refusal::Bad)
            }
            _ => Err(Refusal::WrongType),
        }
    }

    /// Whether a JWS `kid` (or OPA's `keyid`) names this key: its
    /// fingerprint, its file name, or that name without its extension.
    pub fn named(&self, kid: &str) -> bool {
        let name = self.file.file_name().and_then(|n| n.to_str());
        let stem = self.file.file_stem().and_then(|n| n.to_str());
        !kid.is_empty() && (kid == self.fingerprint || Some(kid) == name || Some(kid) == stem)
    }
}

fn rsa_verify(k: &rsa::RsaPublicKey, alg: Alg, message: &[u8], sig: &[u8]) -> bool {
    use rsa::{Pkcs1v15Sign, Pss};
    let r = match alg {
        Alg::Rs256 => k.verify(Pkcs1v15Sign::new::<Sha256>(), &Sha256::digest(message), sig),
        Alg::Rs384 => k.verify(Pkcs1v15Sign::new::<Sha384>(), &Sha384::digest(message), sig),
        Alg::Rs512 => k.verify(Pkcs1v15Sign::new::<Sha512>(), &Sha512::digest(message), sig),
        Alg::Ps256 => k.verify(Pss::new::<Sha256>(), &Sha256::digest(message), sig),
        Alg::Ps384 => k.verify(Pss::new::<Sha384>(), &Sha384::digest(message), sig),
        Alg::Ps512 => k.verify(Pss::new::<Sha512>(), &Sha512::digest(message), sig),
        _ => return false,
    };
    r.is_ok()
}

/// The key a DER SubjectPublicKeyInfo holds, by its algorithm.
fn from_spki(der: &[u8]) -> Result<Public> {
    use spki::der::asn1::ObjectIdentifier as Oid;
    use spki::DecodePublicKey;
    const EC: Oid = Oid::new_unwrap("1.2.840.10045.2.1");
    const P256: Oid = Oid::new_unwrap("1.2.840.10045.3.1.7");
    const P384: Oid = Oid::new_unwrap("1.3.132.0.34");
    const ED25519: Oid = Oid::new_unwrap("1.3.101.112");
    const RSA: Oid = Oid::new_unwrap("1.2.840.113549.1.1.1");
    let info = spki::SubjectPublicKeyInfoRef::try_from(der)
        .map_err(|e| anyhow!("malformed SubjectPublicKeyInfo: {e}"))?;
    let oid = info.algorithm.oid;
    let bad = |e: &dyn fmt::Display| anyhow!("malformed key: {e}");
    Ok(match oid {
        EC => match info.algorithm.parameters_oid() {
            Ok(P256) => Public::P256(
                p256::ecdsa::VerifyingKey::from_public_key_der(der).map_err(|e| bad(&e))?,
            ),
            Ok(P384) => Public::P384(
                p384::ecdsa::VerifyingKey::from_public_key_der(der).map_err(|e| bad(&e))?,
            ),
            Ok(curve) => bail!("an ECDSA key on curve {curve}: only P-256 and P-384 are taken"),
            Err(e) => bail!("an ECDSA key without its curve: {e}"),
        },
        ED25519 => Public::Ed25519(
            ed25519_dalek::VerifyingKey::from_public_key_der(der).map_err(|e| bad(&e))?,
        ),
        RSA => Public::Rsa(rsa::RsaPublicKey::from_public_key_der(der).map_err(|e| bad(&e))?),
        other => {
            bail!("a key of algorithm {other}: only ECDSA P-256/P-384, Ed25519 and RSA are taken")
        }
    })
}

/// `SHA256:` + unpadded standard base64 of the SHA-256 of `spki` (the DER
/// SubjectPublicKeyInfo), the form `ssh-keygen -l` prints its own in.
pub fn fingerprint(spki: &[u8]) -> String {
    let d = Sha256::digest(spki);
    format!(
        "SHA256:{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(d)
    )
}

/// Whether `key` signed `payload` with `sig`, as cosign signs with a key.
/// `cosign verify --key` hashes with SHA-256 for every key type; a P-384
/// signature over SHA-384 (sigstore's default for that curve) is taken too.
pub(crate) fn signed_by(key: &Key, payload: &[u8], sig: &[u8]) -> bool {
    let d: [u8; 32] = Sha256::digest(payload).into();
    if key.verify_sha256_digest(&d, sig).is_ok() {
        return true;
    }
    [Alg::Es384, Alg::EdDsa, Alg::Rs256, Alg::Ps256]
        .iter()
        .any(|a| key.verify(*a, payload, sig, EcdsaForm::Der).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    // An Ed25519 public key (RFC 8410 section 10.1's example).
    const ED: &str = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n-----END PUBLIC KEY-----\n";

    #[test]
    fn reads_an_ed25519_key_and_names_it_by_its_spki() {
        let k = Key::from_pem(Path::new("k.pem"), ED).unwrap();
        assert_eq!(k.kind(), "Ed25519");
        assert!(k.fingerprint.starts_with("SHA256:"));
        assert!(!k.fingerprint.ends_with('='));
        assert!(k.fits(Alg::EdDsa) && !k.fits(Alg::Es256) && !k.fits(Alg::Rs256));
        assert!(k.named("k") && k.named("k.pem") && k.named(&k.fingerprint) && !k.named(""));
        assert_eq!(
            k.verify(Alg::Rs256, b"m", &[0; 64], EcdsaForm::Raw),
            Err(Refusal::WrongType)
        );
        assert_eq!(
            k.verify(Alg::EdDsa, b"m", &[0; 64], EcdsaForm::Raw),
            Err(Refusal::Bad)
        );
    }

    #[test]
    fn refuses_what_is_not_a_public_key() {
        let e = |t: &str| format!("{:#}", Key::from_pem(Path::new("k"), t).unwrap_err());
        assert!(e("hello").contains("no PEM block"));
        assert!(e("-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEINTuctv5E1hK1bbY8fdp+K06/nwoy/HU++CXqI9EdVhC\n-----END PRIVATE KEY-----\n").contains("private key"));
        assert!(
            e("-----BEGIN PUBLIC KEY-----\n!!!!\n-----END PUBLIC KEY-----\n").contains("malformed")
        );
    }
}
