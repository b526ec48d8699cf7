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
    /// The payload as the token carries it (base64url): read through
    /// `Token::payload`, never decoded whole (a bundle's lists every file).
    payload: &'a str,
    signature: Vec<u8>,
}

impl<'a> Token<'a> {
    /// The payload, not yet verified (only for hints: which key first),
    /// decoded as it is read.
    pub fn payload(&self) -> impl std::io::Read + 'a {
        payload_reader(self.payload)
    }
}

/// `part` (base64url, no padding) decoded as it is read.
fn payload_reader(part: &str) -> impl std::io::Read + '_ {
    base64::read::DecoderReader::new(
        part.as_bytes(),
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
    )
}

/// What a verified token gives: the key that verified it and its payload,
/// decoded as it is read.
#[derive(Debug)]
pub struct Verified<'k, 't> {
    pub key: &'k Key,
    payload: &'t str,
}

impl<'t> Verified<'_, 't> {
    pub fn payload(&self) -> impl std::io::Read + 't {
        payload_reader(self.payload)
    }
}

fn b64(part: &str, what: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|e| format!("the JWT's {what} is not base64url: {e}"))
}

/// `part`, once it is known to decode as base64url (read through a small
/// buffer: nothing decoded is kept).
fn valid_b64<'a>(part: &'a str, what: &str) -> Result<&'a str, String> {
    std::io::copy(&mut payload_reader(part), &mut std::io::sink())
        .map_err(|e| format!("the JWT's {what} is not base64url: {e}"))?;
    Ok(part)
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
        payload: valid_b64(p, "payload")?,
        signature: b64(s, "signature")?,
    })
}

/// `token` checked against `keys`: those that `hint` (the `kid`, else a
/// key id found elsewhere) names first, then the rest; one must verify.
pub fn verify<'k, 't>(
    token: &'t str,
    keys: &'k [Key],
    hint: Option<&str>,
) -> Result<Verified<'k, 't>, String> {
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
        let mut payload = Vec::new();
        std::io::Read::read_to_end(&mut p.payload(), &mut payload).unwrap();
        assert_eq!(payload, br#"{"files":[]}"#);
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

    /// OPA's own RS256 test token and the public key it was signed with,
    /// from open-policy-agent/opa `v1/bundle/verify_test.go`
    /// (`TestVerifyJWTSignature`: `signedTokenRS256`, `publicKeyValid`).
    const OPA_RS256_TOKEN: &str = "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCIsImtpZCI6ImZvbyJ9.eyJmaWxlcyI6W3sibmFtZSI6ImRiL3VhbTIvZW50aXRsZW1lbnRzL2RhdGEuanNvbiIsImhhc2giOiJjMjEzMTU0NGM3MTZhMjVhNWUzMWY1MDQzMDBmNTI0MGU4MjM1Y2FkYjlhNTdmMGJkMWI2ZjRiZDc0YjI2NjEyIiwiYWxnb3JpdGhtIjoic2hhMjU2In0seyJuYW1lIjoiZGIvdWFtMi9wb2xpY3kvb3BhLXBvbGljeS5yZWdvIiwiaGFzaCI6IjQyY2ZlNjc2OGI1N2JiNWY3NTAzYzE2NWMyOGRkMDdhYzViODEzNTU0ZWJjODUwZjJjYzM1ODQzZTcxMzdiMWQifV0sImlhdCI6MTU5MjI1MTQwNiwiaXNzIjoiSldUU2VydmljZSIsInNjb3BlIjoid3JpdGUifQ.UZcX_Qj29o213nwZ5mysiyNcgAp1AOqCkDLkj1KGZ7Cw3l17TbkF8t3FJd654sf762NGcABA0WQ2zxq-labXl_d5TKQmq23lurO3qLHI1cKQPyoxPbddGo78sJpMwWsiMyEYcyyKC9FpNUpa8cT81GPo4q9Zui8TAD0wtHh2YxBL7E8QYLJxcLMJTJxVBgrQGLXFT7vYRc6hJz9Vu-i0SWuLBGxOCmYoHr4DWFfy0IhAbhiUFyLRpukfBPjCJNYY5LgaZdN6LaYivtIEUms5jUuXubBimLJm7KOT5-bgJMXTcUsbrbl2Ma7PwG5IOKjjgyEvH8KVfGFZSzNrpuxKmA";
    const OPA_RS256_KEY: &str = "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA9KaakMv1XKKDaSch3PFR\n3a27oaHp1GNTTNqvb1ZaHZXp+wuhYDwc/MTE67x9GCifvQBWzEGorgTq7aisiOyl\nvKifwz6/wQ+62WHKG/sqKn2Xikp3P63aBIPlZcHbkyyRmL62yeyuzYoGvLEYel+m\nz5SiKGBwviSY0Th2L4e5sGJuk2HOut6emxDi+E2Fuuj5zokFJvIT6Urlq8f3h6+l\nGeR6HUOXqoYVf7ff126GP7dticTVBgibxkkuJFmpvQSW6xmxruT4k6iwjzbZHY7P\nypZ/TdlnuGC1cOpAVyU7k32IJ9CRbt3nwEf5U54LRXLLQjFixWZHwKdDiMTF4ws0\n+wIDAQAB\n-----END PUBLIC KEY-----\n";

    #[test]
    fn the_token_opa_signed_verifies_with_its_key_and_not_once_altered() {
        let key = Key::from_pem(std::path::Path::new("opa.pem"), OPA_RS256_KEY).unwrap();
        let keys = [key];
        let v = verify(OPA_RS256_TOKEN, &keys, None).unwrap();
        let payload: serde_json::Value = serde_json::from_reader(v.payload()).unwrap();
        assert_eq!(
            payload["files"][1]["name"], "db/uam2/policy/opa-policy.rego",
            "{payload}"
        );
        // One byte of the signed payload changed: the signature no longer holds.
        let (head, rest) = OPA_RS256_TOKEN.split_once('.').unwrap();
        let (body, sig) = rest.split_once('.').unwrap();
        let mut bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(body)
            .unwrap();
        let at = bytes.len() - 3;
        bytes[at] ^= 1;
        let altered = format!("{head}.{}.{sig}", enc(&bytes));
        assert!(verify(&altered, &keys, None)
            .unwrap_err()
            .contains("none of the keys"));
    }
}
