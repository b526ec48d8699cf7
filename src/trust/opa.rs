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
use crate::tree::{Entry, Node, Tree};

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
    files: Files,
    #[serde(default)]
    scope: String,
}

/// The payload's `keyid` alone (its files are not kept).
#[derive(Deserialize)]
struct Hint {
    #[serde(default)]
    keyid: String,
}

/// The payload's `files`, read straight into a map by name (no list of
/// them is held beside it): the first name listed twice, and how many
/// were listed (past `MAX_FILES`, no more are kept).
#[derive(Default)]
struct Files {
    by_name: std::collections::HashMap<String, FileInfo>,
    twice: Option<String>,
    listed: usize,
}

/// One file as the payload lists it, its strings borrowed from the
/// payload where they need no unescaping.
#[derive(Deserialize)]
struct Listed<'a> {
    name: String,
    #[serde(default, borrow)]
    hash: std::borrow::Cow<'a, str>,
    #[serde(default, borrow)]
    algorithm: std::borrow::Cow<'a, str>,
}

/// What the signature lists for one file, kept small (a signature lists
/// every file of the bundle): its hash decoded where it is hex, and its
/// algorithm.
struct FileInfo {
    hash: SignedHash,
    algorithm: Algorithm,
}

/// A listed hash: a SHA-256's 32 bytes in place, another hex digest's
/// bytes, or, where it is not hex, as written (for the line that says so).
enum SignedHash {
    Sha256([u8; 32]),
    Bytes(Box<[u8]>),
    NotHex(Box<str>),
}

impl SignedHash {
    fn of(text: &str) -> SignedHash {
        match decode_hex(text) {
            Some(b) => match <[u8; 32]>::try_from(b.as_slice()) {
                Ok(h) => SignedHash::Sha256(h),
                Err(_) => SignedHash::Bytes(b.into_boxed_slice()),
            },
            None => SignedHash::NotHex(text.into()),
        }
    }
}

/// A listed hashing algorithm: OPA's default, or any other name as given.
enum Algorithm {
    Sha256,
    Named(Box<str>),
}

impl Algorithm {
    fn of(name: &str) -> Algorithm {
        match name {
            "SHA-256" => Algorithm::Sha256,
            other => Algorithm::Named(other.into()),
        }
    }

    fn name(&self) -> &str {
        match self {
            Algorithm::Sha256 => "SHA-256",
            Algorithm::Named(n) => n,
        }
    }
}

impl<'de> Deserialize<'de> for Files {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Files, D::Error> {
        struct Each;
        impl<'de> serde::de::Visitor<'de> for Each {
            type Value = Files;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a sequence")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Files, A::Error> {
                let mut files = Files::default();
                use std::collections::hash_map::Entry;
                while let Some(l) = seq.next_element::<Listed>()? {
                    files.listed += 1;
                    if files.listed > MAX_FILES {
                        continue;
                    }
                    let info = FileInfo {
                        hash: SignedHash::of(&l.hash),
                        algorithm: Algorithm::of(&l.algorithm),
                    };
                    match files.by_name.entry(l.name) {
                        Entry::Vacant(v) => {
                            v.insert(info);
                        }
                        Entry::Occupied(o) => {
                            files.twice.get_or_insert_with(|| o.key().clone());
                        }
                    }
                }
                Ok(files)
            }
        }
        d.deserialize_seq(Each)
    }
}

/// What the signature of a bundle says, once its token verified.
pub struct Signed<'k> {
    pub key: &'k Key,
    files: std::collections::HashMap<String, FileInfo>,
}

/// Parse `.signatures.json` (`text`) and verify its token with `keys`.
/// Each form of the file list (the text, the token, the signed payload)
/// is let go once the next is made: a signature lists every file.
pub fn signed<'k>(text: Vec<u8>, keys: &'k [Key]) -> Result<Signed<'k>, String> {
    let sf: SignaturesFile = serde_json::from_slice(&text)
        .map_err(|e| format!("/.signatures.json is not {{\"signatures\": [JWT]}}: {e}"))?;
    drop(text);
    if !sf.plugin.is_empty() {
        return Err(format!(
            "/.signatures.json names verifier plugin {:?}, which packsync does not have",
            sf.plugin
        ));
    }
    let mut tokens = sf.signatures;
    let token = match tokens.as_slice() {
        [_] => tokens.pop().expect("one"),
        [] => return Err("/.signatures.json holds no JWT (expected exactly one)".into()),
        _ => return Err("/.signatures.json holds several JWTs (expected exactly one)".into()),
    };
    // The deprecated `keyid` claim is read from the payload before it is
    // verified, only to order the keys, and only where there are several.
    let hint = jws::parse(&token)
        .ok()
        .filter(|t| t.kid.is_none() && keys.len() > 1)
        .and_then(|t| serde_json::from_reader::<_, Hint>(t.payload()).ok())
        .map(|p| p.keyid);
    let v = jws::verify(&token, keys, hint.as_deref())?;
    // Read as it is decoded: the payload is never held whole.
    let p: Payload = serde_json::from_reader(std::io::BufReader::new(v.payload()))
        .map_err(|e| format!("the signed payload is not OPA's {{\"files\": [...]}}: {e}"))?;
    let key = v.key;
    drop(token);
    if !p.scope.is_empty() {
        return Err(format!(
            "the signature has scope {:?}; packsync, like OPA without a configured scope, takes only an empty scope",
            p.scope
        ));
    }
    if p.files.listed > MAX_FILES {
        return Err(format!(
            "the signature lists {} files (at most {MAX_FILES})",
            p.files.listed
        ));
    }
    if let Some(name) = p.files.twice {
        return Err(format!("the signature lists {name:?} twice"));
    }
    Ok(Signed {
        key,
        files: p.files.by_name,
    })
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
    let mut signed = signature(source, &tree.entries, keys)?;

    let mut listed: Vec<(Vec<u8>, u64, Option<[u8; 32]>)> = Vec::new();
    let mut problem: Option<String> = None;
    tree.for_each(&mut |path, e| {
        if problem.is_some() || path == SIGNATURES {
            return;
        }
        match &e.node {
            Node::Dir(_) => {}
            Node::Symlink(_) => problem = Some(symlink_line(path)),
            Node::File(f) => listed.push((path.to_vec(), e.meta.size, spooled_hash(f))),
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
            .ok_or_else(|| unlisted_line(&path))?;
        want.push((path, size, known, info));
    }
    none_absent(&signed.files, filter)?;
    // The hashes, in parallel; the first mismatch in path order is told.
    let results: Vec<Result<(), String>> = want
        .par_iter()
        .map(|(path, size, known, info)| check_file(source, path, *size, *known, info))
        .collect();
    results.into_iter().collect::<Result<(), String>>()?;
    Ok(signed.key.fingerprint.clone())
}

/// `check`, for a source that lists a directory at a time (a directory,
/// or a spool once it is filled: `Source::lists_by_directory`), reached a
/// directory at a time (`walk::run`) with no tree held: what is held is
/// the signature's list of files, each taken off it as the walk meets the
/// file, and what is wrong. The verdict and its line are `check`'s: a
/// symlink, then a file the signature does not list, then one it lists
/// that is absent, then a hash that does not match, each the first in the
/// tree's order.
pub fn check_listed(
    source: &dyn Source,
    keys: &[Key],
    filter: &Filter,
    reporter: &dyn crate::report::Reporter,
) -> anyhow::Result<Result<String, String>> {
    let Some(root) = source.root().filter(|_| source.lists_by_directory()) else {
        anyhow::bail!("{}: is not listed a directory at a time", source.label());
    };
    let top = source.list(root, b"", 0, filter, reporter)?;
    let signed = match signature(source, &top, keys) {
        Ok(s) => s,
        Err(m) => return Ok(Err(m)),
    };
    drop(top);
    let key = signed.key;
    let v = Checking {
        source,
        filter,
        reporter,
        files: std::sync::Mutex::new(signed.files),
        symlink: std::sync::Mutex::new(None),
        unlisted: std::sync::Mutex::new(None),
        mismatch: std::sync::Mutex::new(None),
    };
    crate::walk::run(&v, &[source], &[Some(root)], &())?;
    for slot in [v.symlink, v.unlisted] {
        if let Some((_, m)) = slot.into_inner().expect("not poisoned") {
            return Ok(Err(m));
        }
    }
    if let Err(m) = none_absent(&v.files.into_inner().expect("not poisoned"), filter) {
        return Ok(Err(m));
    }
    if let Some((_, m)) = v.mismatch.into_inner().expect("not poisoned") {
        return Ok(Err(m));
    }
    Ok(Ok(key.fingerprint.clone()))
}

/// One `check_listed` walk, shared by its threads.
struct Checking<'a> {
    source: &'a dyn Source,
    filter: &'a Filter,
    reporter: &'a dyn crate::report::Reporter,
    /// What the signature lists and the walk has not met yet.
    files: std::sync::Mutex<std::collections::HashMap<String, FileInfo>>,
    /// The first symlink (in the tree's order) and its line; the same for
    /// a file that is not listed, and for a file whose hash differs.
    symlink: std::sync::Mutex<Option<(Vec<u8>, String)>>,
    unlisted: std::sync::Mutex<Option<(Vec<u8>, String)>>,
    mismatch: std::sync::Mutex<Option<(Vec<u8>, String)>>,
}

impl Checking<'_> {
    /// Keep `(path, m)` in `slot` where it comes first in the tree's order.
    fn note(slot: &std::sync::Mutex<Option<(Vec<u8>, String)>>, path: Vec<u8>, m: String) {
        let mut s = slot.lock().expect("not poisoned");
        let first = s.as_ref().is_none_or(|(p, _)| {
            crate::manifest::cmp_preorder(&path, p) == std::cmp::Ordering::Less
        });
        if first {
            *s = Some((path, m));
        }
    }
}

impl crate::walk::Visit for Checking<'_> {
    type Dir = ();
    type Keep = ();

    fn visit(
        &self,
        srcs: &[Option<&crate::sys::DirFd>],
        _: &(),
        rel: &[u8],
    ) -> anyhow::Result<crate::walk::Visited<()>> {
        let fd = srcs[0].expect("the one source holds every directory it lists");
        let entries = self.source.list(fd, rel, 0, self.filter, self.reporter)?;
        let mut want = Vec::new();
        for e in &entries {
            let path = crate::tree::join(rel, &e.name);
            match &e.node {
                Node::Dir(_) => {}
                Node::Symlink(_) => Self::note(&self.symlink, path.clone(), symlink_line(&path)),
                Node::File(_) if path == SIGNATURES => {}
                Node::File(f) => {
                    let info = std::str::from_utf8(&path)
                        .ok()
                        .and_then(|p| self.files.lock().expect("not poisoned").remove(p));
                    let known = spooled_hash(f);
                    match info {
                        Some(info) => want.push((path, e.meta.size, known, info)),
                        None => Self::note(&self.unlisted, path.clone(), unlisted_line(&path)),
                    }
                }
            }
        }
        want.par_iter().for_each(|(path, size, known, info)| {
            if let Err(m) = check_file(self.source, path, *size, *known, info) {
                Self::note(&self.mismatch, path.clone(), m);
            }
        });
        Ok((0, crate::walk::subdirs(entries)))
    }

    fn enter(&self, _: &(), _: &(), _: &[u8], _: &[u8]) -> anyhow::Result<()> {
        Ok(())
    }
}

/// The bundle's signature, found among the entries at its top (`top`),
/// read through `source` and verified with `keys`.
fn signature<'k>(
    source: &dyn Source,
    top: &[Entry],
    keys: &'k [Key],
) -> Result<Signed<'k>, String> {
    let sig = top
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
    signed(read(source, SIGNATURES, MAX_SIGNATURES_FILE)?, keys)
}

/// No file the signature lists (`left`: those the bundle did not hold) is
/// missing, but those `--exclude` leaves out.
fn none_absent(
    left: &std::collections::HashMap<String, FileInfo>,
    filter: &Filter,
) -> Result<(), String> {
    let mut absent: Vec<&String> = left
        .keys()
        .filter(|name| !excluded(filter, name.as_bytes()))
        .collect();
    if absent.is_empty() {
        return Ok(());
    }
    absent.sort();
    let more = match absent.len() {
        1 => String::new(),
        n => format!(" (and {} more)", n - 1),
    };
    Err(format!(
        "{}: listed in the signature but absent from the bundle{more}",
        absent[0]
    ))
}

/// The SHA-256 a spool took of the bytes it wrote (not one a manifest
/// claimed for a file borrowed from the live tree).
fn spooled_hash(f: &crate::tree::File) -> Option<[u8; 32]> {
    f.hash
        .filter(|_| f.dev != crate::source::spool::BORROWED_DEV)
}

fn symlink_line(path: &[u8]) -> String {
    format!(
        "{}: a symlink, which a bundle signature cannot cover",
        shown(path)
    )
}

fn unlisted_line(path: &[u8]) -> String {
    format!(
        "{}: not in the signature's file list (added after signing?)",
        shown(path)
    )
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
    let algorithm = info.algorithm.name();
    if algorithm.is_empty() {
        return Err(format!(
            "{}: no hashing algorithm given for it",
            shown(path)
        ));
    }
    let h = hasher(algorithm).ok_or_else(|| {
        format!(
            "{}: hashing algorithm {:?} is not one OPA has",
            shown(path),
            algorithm
        )
    })?;
    let want: &[u8] = match &info.hash {
        SignedHash::Sha256(h) => h,
        SignedHash::Bytes(b) => b,
        SignedHash::NotHex(text) => {
            return Err(format!(
                "{}: the signed hash {:?} is not hex",
                shown(path),
                text
            ))
        }
    };
    let known = known.filter(|_| matches!(info.algorithm, Algorithm::Sha256) && !structured(path));
    let got: Box<[u8]> = match known {
        Some(hash) => Box::new(hash),
        None => digest_of(source, path, size, h)?,
    };
    if *got != *want {
        return Err(format!(
            "{}: hash mismatch ({algorithm} signed {}, the file has {})",
            shown(path),
            hex(want),
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
        let e = |t: &str| signed(t.as_bytes().to_vec(), &[]).err().unwrap();
        assert!(e("3").contains("not {"));
        assert!(e(r#"{"signatures": []}"#).contains("no JWT"));
        assert!(e(r#"{"signatures": ["a", "b"]}"#).contains("several"));
        assert!(e(r#"{"signatures": ["x"], "plugin": "p"}"#).contains("plugin"));
        assert!(e(r#"{"signatures": ["a.b"]}"#).contains("three"));
    }

    #[test]
    fn the_payload_files_are_read_into_a_map_with_the_first_name_listed_twice() {
        let p: Payload = serde_json::from_str(
            r#"{"files": [{"name": "a", "hash": "00", "algorithm": "SHA-256"},
                {"name": "b"}, {"name": "a"}, {"name": "b"}], "keyid": "k"}"#,
        )
        .unwrap();
        assert_eq!((p.files.listed, p.files.by_name.len()), (4, 2));
        assert_eq!(p.files.twice.as_deref(), Some("a"));
        assert!(p.files.by_name.contains_key("b"));
        let none: Payload = serde_json::from_str(r#"{"scope": ""}"#).unwrap();
        assert_eq!((none.files.listed, none.files.twice), (0, None));
        for bad in [r#"{"files": null}"#, r#"{"files": [{"hash": "00"}]}"#] {
            assert!(serde_json::from_str::<Payload>(bad).is_err(), "{bad}");
        }
    }
}
