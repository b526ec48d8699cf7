//! OPA bundle signatures, checked as OPA's `bundle/verify.go` and
//! `bundle/bundle.go` check them: `/.signatures.json` is
//! `{"signatures": ["<JWT>"]}` with exactly one token; its payload lists
//! `files: [{name, hash, algorithm}]`; every file of the bundle but
//! `.signatures.json` must be listed under its path from the bundle root
//! (no leading `/`) with a matching hex hash, and every listed file must
//! be there. `data.json`, `data.yaml` and `.manifest` are hashed in OPA's
//! canonical JSON form (`canon.rs`), everything else as raw bytes.
//!
//! Where this is stricter than OPA, on purpose: only the root
//! `.signatures.json` is the signature (OPA skips every path ending in
//! `signatures.json` from the check, so such a file elsewhere would be
//! published unverified); a symlink in a signed bundle is refused (it is
//! published, and no hash covers it); a name listed twice is refused.
//! `scope`: OPA requires the token's scope to equal the configured one,
//! and packsync configures none, so it must be absent or empty. `keyid`
//! (or the header's `kid`) only orders the keys tried.

use std::io::Read;
use std::os::fd::OwnedFd;

use rayon::prelude::*;
use serde::Deserialize;

use super::canon;
use super::jws;
use super::key::Key;
use crate::filter::Filter;
use crate::source::Source;
use crate::tree::{Node, Tree};

/// The signature file at the bundle root.
pub const SIGNATURES: &[u8] = b".signatures.json";
/// Longest `.signatures.json` read.
pub const MAX_SIGNATURES_FILE: u64 = 16 << 20;
/// Most files a signature may list.
pub const MAX_FILES: usize = 1_000_000;
/// Largest structured file (`data.json`, …) read whole to hash its canonical form.
pub const MAX_STRUCTURED: u64 = 1 << 30;

#[derive(Deserialize)]
struct SignaturesFile {
    #[serde(default)]
    signatures: Vec<String>,
    #[serde(default)]
    plugin: String,
}

#[derive(Deserialize)]
struct Payload {
    #[serde(default)]
    files: Vec<FileInfo>,
    #[serde(default)]
    keyid: String,
    #[serde(default)]
    scope: String,
}

#[derive(Deserialize)]
struct FileInfo {
    name: String,
    #[serde(default)]
    hash: String,
    #[serde(default)]
    algorithm: String,
}

/// What the signature of a bundle says, once its token verified.
pub struct Signed<'k> {
    pub key: &'k Key,
    files: std::collections::HashMap<String, FileInfo>,
}

/// Parse `.signatures.json` (`text`) and verify its token with `keys`.
pub fn signed<'k>(text: &[u8], keys: &'k [Key]) -> Result<Signed<'k>, String> {
    let sf: SignaturesFile = serde_json::from_slice(text)
        .map_err(|e| format!("/.signatures.json is not {{\"signatures\": [JWT]}}: {e}"))?;
    if !sf.plugin.is_empty() {
        return Err(format!(
            "/.signatures.json names verifier plugin {:?}, which packsync does not have",
            sf.plugin
        ));
    }
    let token = match sf.signatures.as_slice() {
        [one] => one,
        [] => return Err("/.signatures.json holds no JWT (expected exactly one)".into()),
        _ => return Err("/.signatures.json holds several JWTs (expected exactly one)".into()),
    };
    // The deprecated `keyid` claim is read from the payload before it is
    // verified only to order the keys.
    let hint = jws::parse(token)
        .ok()
        .and_then(|t| t.kid.is_none().then_some(t))
        .and_then(|t| serde_json::from_slice::<Payload>(t.payload()).ok())
        .map(|p| p.keyid);
    let v = jws::verify(token, keys, hint.as_deref())?;
    let p: Payload = serde_json::from_slice(&v.payload)
        .map_err(|e| format!("the signed payload is not OPA's {{\"files\": [...]}}: {e}"))?;
    if !p.scope.is_empty() {
        return Err(format!(
            "the signature has scope {:?}; packsync, like OPA without a configured scope, takes only an empty scope",
            p.scope
        ));
    }
    if p.files.len() > MAX_FILES {
        return Err(format!(
            "the signature lists {} files (at most {MAX_FILES})",
            p.files.len()
        ));
    }
    let mut files = std::collections::HashMap::with_capacity(p.files.len());
    for f in p.files {
        if let Some(old) = files.insert(f.name.clone(), f) {
            return Err(format!("the signature lists {:?} twice", old.name));
        }
    }
    Ok(Signed { key: v.key, files })
}

/// Whether OPA hashes the file at `path` in its canonical JSON form
/// (`IsStructuredDoc`: by base name).
pub fn structured(path: &[u8]) -> bool {
    let base = path.rsplit(|b| *b == b'/').next().unwrap_or(path);
    matches!(
        base,
        b"data.json" | b"data.yaml" | b"signatures.json" | b".manifest"
    )
}

/// One of OPA's hash algorithms, by the name a signature gives it.
fn hasher(alg: &str) -> Option<Box<dyn sha2::digest::DynDigest + Send>> {
    Some(match alg {
        "MD5" => Box::new(md5::Md5::default()),
        "SHA-1" => Box::new(sha1::Sha1::default()),
        "SHA-224" => Box::new(sha2::Sha224::default()),
        "SHA-256" => Box::new(sha2::Sha256::default()),
        "SHA-384" => Box::new(sha2::Sha384::default()),
        "SHA-512" => Box::new(sha2::Sha512::default()),
        "SHA-512-224" => Box::new(sha2::Sha512_224::default()),
        "SHA-512-256" => Box::new(sha2::Sha512_256::default()),
        _ => return None,
    })
}

/// Check one source's bundle: its tree as scanned (`tree`), its files read
/// through `source`. `filter`: a listed file the operator's `--exclude`
/// leaves out is not asked for. The fingerprint of the key that verified
/// it, or one line saying what is wrong (the caller names the source).
pub fn check(
    source: &dyn Source,
    tree: &Tree,
    keys: &[Key],
    filter: &Filter,
) -> Result<String, String> {
    let sig = tree
        .entries
        .iter()
        .find(|e| &*e.name == SIGNATURES)
        .ok_or("no /.signatures.json (--verify-key needs every source signed)")?;
    if !matches!(sig.node, Node::File(_)) {
        return Err("/.signatures.json is not a regular file".into());
    }
    if sig.meta.size > MAX_SIGNATURES_FILE {
        return Err(format!(
            "/.signatures.json is {} bytes (at most {MAX_SIGNATURES_FILE})",
            sig.meta.size
        ));
    }
    let text = read(source, SIGNATURES, MAX_SIGNATURES_FILE)?;
    let mut signed = signed(&text, keys)?;

    let mut listed: Vec<(Vec<u8>, u64, Option<[u8; 32]>)> = Vec::new();
    let mut problem: Option<String> = None;
    tree.for_each(&mut |path, e| {
        if problem.is_some() || path == SIGNATURES {
            return;
        }
        match &e.node {
            Node::Dir(_) => {}
            Node::Symlink(_) => {
                problem = Some(format!(
                    "{}: a symlink, which a bundle signature cannot cover",
                    shown(path)
                ))
            }
            // The SHA-256 a spool took of the bytes it wrote (not one a
            // manifest claimed for a file borrowed from the live tree).
            Node::File(f) => listed.push((
                path.to_vec(),
                e.meta.size,
                f.hash
                    .filter(|_| f.dev != crate::source::spool::BORROWED_DEV),
            )),
        }
    });
    if let Some(p) = problem {
        return Err(p);
    }
    let mut want = Vec::with_capacity(listed.len());
    for (path, size, known) in listed {
        let info = std::str::from_utf8(&path)
            .ok()
            .and_then(|p| signed.files.remove(p))
            .ok_or_else(|| {
                format!(
                    "{}: not in the signature's file list (added after signing?)",
                    shown(&path)
                )
            })?;
        want.push((path, size, known, info));
    }
    let mut absent: Vec<&String> = signed
        .files
        .keys()
        .filter(|name| !excluded(filter, name.as_bytes()))
        .collect();
    if !absent.is_empty() {
        absent.sort();
        let more = match absent.len() {
            1 => String::new(),
            n => format!(" (and {} more)", n - 1),
        };
        return Err(format!(
            "{}: listed in the signature but absent from the bundle{more}",
            absent[0]
        ));
    }
    // The hashes, in parallel; the first mismatch in path order is told.
    let results: Vec<Result<(), String>> = want
        .par_iter()
        .map(|(path, size, known, info)| check_file(source, path, *size, *known, info))
        .collect();
    results.into_iter().collect::<Result<(), String>>()?;
    Ok(signed.key.fingerprint.clone())
}

/// `known`: the file's SHA-256 if the scan already took it from the bytes
/// that will be staged; then a SHA-256 listing needs no second read.
fn check_file(
    source: &dyn Source,
    path: &[u8],
    size: u64,
    known: Option<[u8; 32]>,
    info: &FileInfo,
) -> Result<(), String> {
    if info.algorithm.is_empty() {
        return Err(format!(
            "{}: no hashing algorithm given for it",
            shown(path)
        ));
    }
    let h = hasher(&info.algorithm).ok_or_else(|| {
        format!(
            "{}: hashing algorithm {:?} is not one OPA has",
            shown(path),
            info.algorithm
        )
    })?;
    let want = decode_hex(&info.hash).ok_or_else(|| {
        format!(
            "{}: the signed hash {:?} is not hex",
            shown(path),
            info.hash
        )
    })?;
    let known = known.filter(|_| info.algorithm == "SHA-256" && !structured(path));
    let got: Box<[u8]> = match known {
        Some(hash) => Box::new(hash),
        None => digest_of(source, path, size, h)?,
    };
    if *got != *want {
        return Err(format!(
            "{}: hash mismatch ({} signed {}, the file has {})",
            shown(path),
            info.algorithm,
            info.hash.to_ascii_lowercase(),
            hex(&got)
        ));
    }
    Ok(())
}

/// The digest `h` takes of the file at `path` (of a JSON or YAML file, of
/// its canonical form), read through `source`.
fn digest_of(
    source: &dyn Source,
    path: &[u8],
    size: u64,
    mut h: Box<dyn sha2::digest::DynDigest + Send>,
) -> Result<Box<[u8]>, String> {
    if structured(path) {
        let bytes = read(source, path, MAX_STRUCTURED)?;
        let c = canon::canonical(&bytes).map_err(|m| format!("{}: {m}", shown(path)))?;
        h.update(&c);
        return Ok(h.finalize());
    }
    let fd = open(source, path).map_err(|m| format!("{}: cannot read: {m}", shown(path)))?;
    let mut f = std::fs::File::from(fd);
    let mut buf = vec![0; 256 << 10];
    let mut n_all = 0u64;
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|m| format!("{}: cannot read: {m}", shown(path)))?;
        if n == 0 {
            break;
        }
        n_all += n as u64;
        h.update(&buf[..n]);
    }
    if n_all != size {
        return Err(format!("{}: changed while being read", shown(path)));
    }
    Ok(h.finalize())
}

/// Whether `--exclude` leaves `name` (or a directory above it) out.
fn excluded(filter: &Filter, name: &[u8]) -> bool {
    let mut at = 0;
    while let Some(i) = name[at..].iter().position(|b| *b == b'/') {
        if filter.excludes(&name[..at + i], true) {
            return true;
        }
        at += i + 1;
    }
    filter.excludes(name, false)
}

fn open(source: &dyn Source, path: &[u8]) -> std::io::Result<OwnedFd> {
    match source.root() {
        Some(root) => match path.iter().rposition(|b| *b == b'/') {
            Some(i) => root.open_beneath(&path[..i])?.open_read(&path[i + 1..]),
            None => root.open_read(path),
        },
        None => source.open_file(path),
    }
}

/// The whole file at `path`, refused past `max` bytes.
fn read(source: &dyn Source, path: &[u8], max: u64) -> Result<Vec<u8>, String> {
    let fd = open(source, path).map_err(|m| format!("{}: cannot read: {m}", shown(path)))?;
    let mut bytes = Vec::new();
    std::fs::File::from(fd)
        .take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|m| format!("{}: cannot read: {m}", shown(path)))?;
    if bytes.len() as u64 > max {
        return Err(format!("{}: longer than {max} bytes", shown(path)));
    }
    Ok(bytes)
}

fn shown(path: &[u8]) -> String {
    format!("/{}", crate::escape::c_style(path))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Go's `hex.DecodeString`: either case, an even count of digits.
fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structured_files_are_opas_by_base_name() {
        for p in ["data.json", "a/b/data.json", ".manifest", "x/data.yaml"] {
            assert!(structured(p.as_bytes()), "{p}");
        }
        for p in [
            "plan.json",
            "x.json",
            "data.yml",
            "a/data.json.bak",
            "policy.rego",
        ] {
            assert!(!structured(p.as_bytes()), "{p}");
        }
    }

    #[test]
    fn hashes_by_opas_names_and_hex_either_case() {
        assert!(hasher("SHA-512-256").is_some() && hasher("MD5").is_some());
        assert!(hasher("sha-256").is_none() && hasher("SHA3-256").is_none());
        assert_eq!(decode_hex("0aFf"), Some(vec![10, 255]));
        assert_eq!(decode_hex("0"), None);
        assert_eq!(decode_hex("zz"), None);
        assert_eq!(decode_hex("+1"), None);
    }

    #[test]
    fn the_signatures_file_must_hold_exactly_one_token() {
        let e = |t: &str| signed(t.as_bytes(), &[]).err().unwrap();
        assert!(e("3").contains("not {"));
        assert!(e(r#"{"signatures": []}"#).contains("no JWT"));
        assert!(e(r#"{"signatures": ["a", "b"]}"#).contains("several"));
        assert!(e(r#"{"signatures": ["x"], "plugin": "p"}"#).contains("plugin"));
        assert!(e(r#"{"signatures": ["a.b"]}"#).contains("three"));
    }
}
