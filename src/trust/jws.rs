//! Compact JWS (RFC 7515), the form of a JWT: `header.payload.signature`,
//! each part unpadded base64url. `verify` checks one against the pinned
//! keys and gives back the payload only once a key has verified it; it
//! knows nothing of what the payload means (`opa.rs` does).
//!
//! Refused before any key is tried: `alg` `none` and every `HS*` (a shared
//! secret is not a pinned public key: the classic confusion is an HS256
//! token whose secret is the public key's PEM), any other unknown `alg`, a
//! `crit` header (no extension is understood, so none may be required),
//! and a token longer than `MAX_TOKEN`.

use base64::Engine;

use super::key::{Alg, EcdsaForm, Key, Refusal};

/// Longest token taken (as `.signatures.json` is bounded, `opa.rs`).
pub const MAX_TOKEN: usize = 16 << 20;

/// A parsed token, not yet verified.
#[derive(Debug)]
pub struct Token<'a> {
    pub alg: Alg,
    /// The header's `kid`, if it names one.
    pub kid: Option<String>,
    /// `header.payload`, the bytes the signature covers.
    signing_input: &'a [u8],
    payload: Vec<u8>,
    signature: Vec<u8>,
}

impl Token<'_> {
    /// The payload, not yet verified: only for hints (which key first).
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }
}

/// What a verified token gives: the key that verified it and the payload.
#[derive(Debug)]
pub struct Verified<'k> {
    pub key: &'k Key,
    pub payload: Vec<u8>,
}

fn b64(part: &str, what: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|e| format!("the JWT's {what} is not base64url: {e}"))
}

/// Split and decode `token`; the algorithm is checked, the signature not.
pub fn parse(token: &str) -> Result<Token<'_>, String> {
    if token.len() > MAX_TOKEN {
        return Err(format!(
            "the JWT is {} bytes long (at most {MAX_TOKEN})",
            token.len()
        ));
    }
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("the JWT is not three dot-separated parts (compact JWS)".into());
    };
    let header: serde_json::Value = serde_json::from_slice(&b64(h, "header")?)
        .map_err(|e| format!("the JWT header is not JSON: {e}"))?;
    let header = header
        .as_object()
        .ok_or("the JWT header is not a JSON object")?;
    let alg = match header.get("alg") {
        Some(serde_json::Value::String(a)) => a.as_str(),
        _ => return Err("the JWT header names no alg".into()),
    };
    let alg = Alg::from_jws(alg).ok_or_else(|| {
        format!(
            "the JWT's alg {alg:?} is refused (only ES256, ES384, EdDSA, RS256, RS384, RS512, PS256, PS384, PS512 with a --verify-key)"
        )
    })?;
    if header.contains_key("crit") {
        return Err("the JWT header has crit extensions, which are not supported".into());
    }
    let kid = header
        .get("kid")
        .and_then(|k| k.as_str())
        .map(str::to_string);
    Ok(Token {
        alg,
        kid,
        signing_input: &token.as_bytes()[..h.len() + 1 + p.len()],
        payload: b64(p, "payload")?,
        signature: b64(s, "signature")?,
    })
}

/// `token` checked against `keys`: those that `hint` (the `kid`, else a
/// key id found elsewhere) names first, then the rest; one must verify.
pub fn verify<'k>(
    token: &str,
    keys: &'k [Key],
    hint: Option<&str>,
) -> Result<Verified<'k>, String> {
    let t = parse(token)?;
    let hint = t.kid.as_deref().or(hint).unwrap_or("");
    let mut order: Vec<&Key> = keys.iter().filter(|k| k.named(hint)).collect();
    order.extend(keys.iter().filter(|k| !k.named(hint)));
    let fitting: Vec<&Key> = order.into_iter().filter(|k| k.fits(t.alg)).collect();
    if fitting.is_empty() {
        let kinds: Vec<String> = keys
            .iter()
            .map(|k| format!("{} {}", k.kind(), k.fingerprint))
            .collect();
        return Err(format!(
            "signed with {}, and no --verify-key is a key of that type (given: {})",
            t.alg.name(),
            kinds.join(", ")
        ));
    }
    for k in &fitting {
        match k.verify(t.alg, t.signing_input, &t.signature, EcdsaForm::Raw) {
            Ok(()) => {
                return Ok(Verified {
                    key: k,
                    payload: t.payload,
                })
            }
            Err(Refusal::Bad | Refusal::WrongType) => {}
        }
    }
    let tried: Vec<&str> = fitting.iter().map(|k| k.fingerprint.as_str()).collect();
    Err(format!(
        "the {} signature verifies with none of the keys (tried {}): signed by another key, or altered",
        t.alg.name(),
        tried.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(b: &[u8]) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
    }

    fn token(header: &str, payload: &str, sig: &[u8]) -> String {
        format!(
            "{}.{}.{}",
            enc(header.as_bytes()),
            enc(payload.as_bytes()),
            enc(sig)
        )
    }

    #[test]
    fn parses_the_three_parts_and_the_signed_bytes() {
        let t = token(r#"{"alg":"ES256","kid":"k1"}"#, r#"{"files":[]}"#, &[1, 2]);
        let p = parse(&t).unwrap();
        assert_eq!(p.alg, Alg::Es256);
        assert_eq!(p.kid.as_deref(), Some("k1"));
        assert_eq!(p.payload, br#"{"files":[]}"#);
        assert_eq!(p.signature, [1, 2]);
        assert_eq!(p.signing_input, t.rsplit_once('.').unwrap().0.as_bytes());
    }

    #[test]
    fn refuses_none_hmac_crit_and_malformed_tokens() {
        for alg in ["none", "HS256", "HS384", "HS512", "ES512", "", "es256"] {
            let t = token(&format!(r#"{{"alg":"{alg}"}}"#), "{}", b"x");
            assert!(parse(&t).unwrap_err().contains("refused"), "{alg}");
        }
        let crit = token(r#"{"alg":"EdDSA","crit":["b64"],"b64":false}"#, "{}", b"x");
        assert!(parse(&crit).unwrap_err().contains("crit"));
        assert!(parse("a.b").unwrap_err().contains("three"));
        assert!(parse("a.b.c.d").unwrap_err().contains("three"));
        assert!(parse("!!.e30.e30").unwrap_err().contains("base64url"));
        // Padding is not base64url as JWS writes it.
        let padded = format!("{}=.e30.", enc(br#"{"alg":"EdDSA"}"#));
        assert!(parse(&padded).is_err());
        let arr = token(r#"["alg"]"#, "{}", b"");
        assert!(parse(&arr).unwrap_err().contains("object"));
        assert!(parse(&"a".repeat(MAX_TOKEN + 1))
            .unwrap_err()
            .contains("long"));
    }

    #[test]
    fn a_token_is_verified_by_a_fitting_key_only() {
        let ed = Key::from_pem(
            std::path::Path::new("ed.pem"),
            "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n-----END PUBLIC KEY-----\n",
        )
        .unwrap();
        let keys = [ed];
        let t = token(r#"{"alg":"ES256"}"#, "{}", &[0; 64]);
        assert!(verify(&t, &keys, None)
            .unwrap_err()
            .contains("no --verify-key"));
        let t = token(r#"{"alg":"EdDSA"}"#, "{}", &[0; 64]);
        assert!(verify(&t, &keys, None)
            .unwrap_err()
            .contains("none of the keys"));
    }
}
