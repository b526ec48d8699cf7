//! Entry points for the fuzz targets under `fuzz/`: each takes what a volume
//! or a user hands packsync (bytes, text), runs it through the parser the
//! binary uses, and panics when an invariant that the rest of packsync relies
//! on does not hold. "Does not crash" is the least of it: a manifest that
//! parses must write back to one that parses the same, a label ordering must
//! be a total order, and so on.
//!
//! Not an interface: hidden from the docs, thin, and the only thing the
//! targets call, so the parsers can move between modules without touching
//! `fuzz/`. No I/O here; a parser that needs a file gets its text.

use std::cmp::Ordering;
use std::time::{Duration, Instant, SystemTime};

use crate::manifest::{Entries, Manifest};
use crate::tree::{Entry, Node, Tree};

/// `index::Index`, on a manifest body (the lines after `---`) read from a
/// volume: where it indexes, reading it back a directory at a time gives
/// every line, in order, as reading it line by line does, and the counts
/// agree; an index never panics, however hostile the lines.
pub fn manifest_index(data: &[u8]) {
    use crate::index::Index;
    let Ok(ix) = Index::build(
        std::io::Cursor::new(data),
        Box::new(data.to_vec()),
        "fuzz".into(),
    ) else {
        return;
    };
    let mut walked: Vec<(Vec<u8>, Entry)> = Vec::new();
    ix.walk(&mut |p, e| walked.push((p.to_vec(), e.clone())))
        .expect("an index reads back what it indexed");
    let mut lines: Vec<(Vec<u8>, Entry)> = Vec::new();
    let mut r = data;
    let mut entries = Entries::new(&mut r);
    while let Some((p, e)) = entries.next_entry().expect("indexed lines parse") {
        if p != b"." {
            lines.push((p, e));
        }
    }
    assert_eq!(walked.len() as u64, ix.entries);
    assert_eq!(walked.len(), lines.len());
    for ((wp, we), (lp, le)) in walked.iter().zip(&lines) {
        assert_eq!(wp, lp);
        assert_eq!(we.name, le.name);
        assert_eq!(we.meta, le.meta);
        assert_eq!(we.kind(), le.kind());
    }
    assert_eq!(ix.below(b""), ix.entries);
}

/// `Manifest::read`, `read_header` and `Entries`, on bytes read from a
/// volume. A manifest that parses describes a tree packsync could have
/// written (every name one path component, siblings in strictly increasing
/// byte order, modes within `0o7777`, times with nanoseconds below 10^9),
/// writes back to text that parses to the same manifest, and streams
/// (header, then entries one at a time) to the same entries in the same
/// order; one whose digest matches line by line reads whole and checks.
pub fn manifest(data: &[u8]) {
    // Checked a line at a time (`verify`, `rollback`), never more lenient
    // than checked whole.
    let mut r = data;
    if let Ok(header) = Manifest::read_header(&mut r) {
        if header.digest_matches(&mut r) {
            assert!(
                Manifest::read_checked(&mut &data[..]).is_ok(),
                "its digest matches line by line, not whole"
            );
        }
    }
    let Ok(mut m) = Manifest::read(&mut &data[..]) else {
        return;
    };
    check_tree(&m.tree);
    assert!(m.created.1 < 1_000_000_000, "created {:?}", m.created);

    let text = m.seal();
    let back = Manifest::parse(&text)
        .unwrap_or_else(|e| panic!("a written manifest does not parse: {e:#}\n{text}"));
    assert_eq!(back, m, "manifest changed through write and read\n{text}");
    assert_eq!(m.seal(), text, "sealing twice gave different text");

    // The streaming reader the sync uses sees the same entries, in order.
    let mut r = text.as_bytes();
    let header = Manifest::read_header(&mut r).expect("header of a written manifest");
    assert_eq!(header.digest, m.digest);
    let mut want: Vec<(Vec<u8>, Entry)> = Vec::new();
    m.tree
        .for_each(&mut |p, e| want.push((p.to_vec(), shallow(e))));
    let mut entries = Entries::new(&mut r);
    let (root, _) = entries.next_entry().unwrap().expect("the root line");
    assert_eq!(root, b".");
    for (path, e) in want {
        let (p, got) = entries
            .next_entry()
            .unwrap()
            .expect("an entry per tree entry");
        assert_eq!((p, got), (path, e));
    }
    assert!(entries.next_entry().unwrap().is_none(), "entries left over");
}

/// An entry as `Entries` yields it: without its children.
fn shallow(e: &Entry) -> Entry {
    let mut e = e.clone();
    if let Node::Dir(d) = &mut e.node {
        d.entries.clear();
    }
    e
}

fn check_tree(tree: &Tree) {
    fn walk(es: &[Entry]) {
        for w in es.windows(2) {
            assert!(w[0].name < w[1].name, "siblings out of order or twice");
        }
        for e in es {
            let n: &[u8] = &e.name;
            assert!(
                !n.is_empty() && n != b"." && n != b".." && !n.contains(&b'/') && !n.contains(&0),
                "{:?} is not one path component",
                String::from_utf8_lossy(n)
            );
            assert!(e.meta.mode <= 0o7777, "mode {:o}", e.meta.mode);
            assert!(e.meta.mtime.ns < 1_000_000_000, "mtime {:?}", e.meta.mtime);
            if let Node::Dir(d) = &e.node {
                walk(&d.entries);
            }
        }
    }
    assert!(tree.root.mode <= 0o7777, "root mode {:o}", tree.root.mode);
    walk(&tree.entries);
}

/// `--chmod RULES` applied to `mode` (any `u32`: the type bits of `st_mode`
/// included). The result is within `0o7777`, the same for a file and a
/// directory wherever no rule can tell them apart, and applying the rules
/// again changes nothing wherever `X` cannot see a difference: on a
/// directory, or with no `X` at all. (packsync decides a file's `X` from the
/// mode the rules have made so far, as chmod(1) does; rsync decides it once,
/// from the mode before the rules. An integration test pins packsync's way.)
pub fn chmod(rules: &str, mode: u32) {
    let Ok(r) = crate::chmod::parse(rules) else {
        return;
    };
    for is_dir in [false, true] {
        let once = r.mode(mode, is_dir);
        assert!(once <= 0o7777, "{rules:?} on {mode:o}: {once:o}");
        if is_dir || !rules.contains('X') {
            let twice = r.mode(once, is_dir);
            assert_eq!(
                twice, once,
                "{rules:?} on {mode:o} (dir: {is_dir}): {once:o}, then {twice:o}"
            );
        }
    }
    let typed = rules.contains(['D', 'F', 'X', '=']);
    if !typed {
        assert_eq!(
            r.mode(mode, false),
            r.mode(mode, true),
            "{rules:?} on {mode:o}"
        );
    }
}

/// The `--label` ordering of two labels: antisymmetric, consistent with
/// equality, and what the downgrade guard decides.
pub fn label(a: &str, b: &str) {
    use crate::label::{check, parse, Verdict};
    let (Some(va), Some(vb)) = (parse(a), parse(b)) else {
        if let Some(va) = parse(a) {
            assert_eq!(check(Some(&va), Some(b)), Verdict::Unordered);
        }
        return;
    };
    let ab = va.cmp(&vb);
    assert_eq!(ab, vb.cmp(&va).reverse(), "{a:?} vs {b:?}");
    assert_eq!(va == vb, ab == Ordering::Equal, "{a:?} vs {b:?}");
    assert_eq!(va.cmp(&va), Ordering::Equal, "{a:?}");
    let downgrade = check(Some(&va), Some(b)) == Verdict::Downgrade;
    assert_eq!(downgrade, ab == Ordering::Less, "{a:?} over {b:?}");
}

/// The `--label` ordering of three labels is transitive (with `label` on
/// each pair, a total order: sorting labels by it is well defined).
pub fn labels(a: &str, b: &str, c: &str) {
    use crate::label::parse;
    label(a, b);
    label(b, c);
    label(a, c);
    let (Some(va), Some(vb), Some(vc)) = (parse(a), parse(b), parse(c)) else {
        return;
    };
    let le = |x: &crate::label::Version, y: &crate::label::Version| x <= y;
    if le(&va, &vb) && le(&vb, &vc) {
        assert!(
            le(&va, &vc),
            "{a:?} <= {b:?} <= {c:?} but not {a:?} <= {c:?}"
        );
    }
    if va == vb {
        assert_eq!(
            va.cmp(&vc),
            vb.cmp(&vc),
            "{a:?} == {b:?} but not against {c:?}"
        );
    }
}

/// A duration flag's value (`--grace`, `--timeout`). One that parses can
/// be added to the clocks the commands add it to, so no command panics on it.
pub fn duration(s: &str) {
    let Ok(d) = crate::config::parse_duration(s) else {
        return;
    };
    check_duration(s, d);
}

fn check_duration(s: &str, d: Duration) {
    assert!(
        Instant::now().checked_add(d).is_some(),
        "{s:?} parses to {d:?}, which overflows a deadline"
    );
    assert!(
        SystemTime::now().checked_add(d).is_some(),
        "{s:?} parses to {d:?}, which overflows the wall clock"
    );
}

/// The bytes of an `--exclude-from FILE`, through the reader the sync uses
/// and the filter it builds. Building never panics, and the user's last
/// word wins: a pattern naming an exact path (escaped) appended after the
/// file's lines excludes that path, and the same pattern with `!` includes it.
pub fn exclude_from(data: &[u8]) {
    // The sync reads the file as UTF-8 text and refuses it otherwise.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let rules: Vec<String> = crate::cli::exclude_lines(text)
        .map(str::to_string)
        .collect();
    let Ok(filter) = crate::filter::Filter::new(&rules) else {
        return;
    };
    let mut probes: Vec<Vec<u8>> = Vec::new();
    for r in rules.iter().take(3) {
        let name = r.trim_start_matches(['!', '/']).trim_end_matches('/');
        if let Some(name) = name.split('/').find(|n| !n.is_empty()) {
            probes.push(name.as_bytes().to_vec());
        }
    }
    for p in probes {
        for is_dir in [false, true] {
            let _ = filter.excludes(&p, is_dir);
        }
        let Some(exact) = literal(&p) else {
            continue;
        };
        for (line, excluded) in [(exact.clone(), true), (format!("!{exact}"), false)] {
            let mut more = rules.clone();
            more.push(line.clone());
            let f = crate::filter::Filter::new(&more)
                .unwrap_or_else(|e| panic!("{line:?} after the file's rules: {e:#}"));
            for is_dir in [false, true] {
                assert_eq!(
                    f.excludes(&p, is_dir),
                    excluded,
                    "{line:?} last, {:?} (dir: {is_dir})",
                    String::from_utf8_lossy(&p)
                );
            }
        }
    }
}

/// A gitignore line that matches exactly `name` at the top, or `None` for a
/// name no line can hold (gitignore trims trailing whitespace other than an
/// escaped space, and a line cannot hold a line break).
fn literal(name: &[u8]) -> Option<String> {
    let name = std::str::from_utf8(name).ok()?;
    if name.is_empty()
        || name.contains(['\n', '\r', '/'])
        || name.ends_with(|c: char| c.is_whitespace() && c != ' ')
    {
        return None;
    }
    let mut line = String::from("/");
    for c in name.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\' | '{' | '}' | ' ') {
            line.push('\\');
        }
        line.push(c);
    }
    Some(line)
}

/// `oci://` and `oci-layout:` references (`source::oci_ref`), as a user
/// writes them. One that parses has a lowercase host and repository of
/// valid components, a tag or digest of the allowed shapes, a `//PATH`
/// of plain components; written back, it parses to the same reference.
pub fn oci_reference(s: &str) {
    use crate::source::oci_ref::{parse, parse_layout, valid_digest, valid_tag};
    if let Ok(r) = parse(s) {
        assert!(!r.host.is_empty() && r.host == r.host.to_ascii_lowercase());
        assert!(!r.repo.is_empty() && r.repo == r.repo.to_ascii_lowercase());
        assert!(r.tag.as_deref().is_none_or(valid_tag), "{:?}", r.tag);
        assert!(
            r.digest.as_deref().is_none_or(valid_digest),
            "{:?}",
            r.digest
        );
        check_subpath(r.subpath.as_deref());
        let mut back = format!("oci://{}/{}", r.host, r.repo);
        if let Some(t) = &r.tag {
            back.push_str(&format!(":{t}"));
        }
        if let Some(d) = &r.digest {
            back.push_str(&format!("@{d}"));
        }
        if let Some(p) = &r.subpath {
            back.push_str(&format!("//{}", String::from_utf8_lossy(p)));
        }
        assert_eq!(parse(&back).ok(), Some(r), "{back}");
    }
    if let Ok(l) = parse_layout(s) {
        assert!(!l.dir.is_empty() && !l.dir.contains("//"), "{:?}", l.dir);
        assert!(l.tag.as_deref().is_none_or(valid_tag), "{:?}", l.tag);
        check_subpath(l.subpath.as_deref());
    }
}

fn check_subpath(p: Option<&[u8]>) {
    if let Some(p) = p {
        for c in p.split(|&b| b == b'/') {
            assert!(
                !c.is_empty() && c != b"." && c != b".." && !c.contains(&0),
                "{p:?}"
            );
        }
    }
}

/// An image manifest or index (`source::oci_image`) as a registry or a
/// layout hands it over. One that parses names only `sha256:<hex>`
/// digests (they become URLs and file names) and bounded sizes, only
/// layer media types that are tar streams; the platform choice picks a
/// manifest of the index, for any platform, or says none fits.
pub fn oci_manifest(data: &[u8], content_type: Option<&str>) {
    use crate::source::oci_image::{
        choose, normalised, parse, running_platform, Document, MAX_BLOB,
    };
    use crate::source::oci_ref::valid_digest;
    let Ok(doc) = parse(data, content_type) else {
        return;
    };
    let descs = match &doc {
        Document::Index(ms) | Document::Image(ms) => ms,
    };
    for d in descs {
        assert!(valid_digest(&d.digest), "{:?}", d.digest);
        assert!(d.size <= MAX_BLOB);
    }
    if let Document::Image(layers) = &doc {
        // What an artifact publishes: every name one the spool takes, none
        // leaving the tree; layers only of the selected types.
        use crate::source::oci_artifact::{plan, Use};
        let tgz = "application/vnd.oci.image.layer.v1.tar+gzip".to_string();
        for select in [vec![], vec![tgz.clone()]] {
            let Ok(planned) = plan(layers, &select) else {
                continue;
            };
            assert!(!planned.is_empty());
            for p in &planned {
                assert!(
                    select.is_empty()
                        || select.iter().any(|t| p
                            .desc
                            .media_type
                            .to_ascii_lowercase()
                            .starts_with(t.as_str()))
                );
                if let Use::File(name) | Use::Dir(name) = &p.how {
                    let parts =
                        crate::source::spool::components(name).expect("a name the spool takes");
                    assert!(!parts.is_empty() && !name.starts_with(b"/"));
                    assert!(parts.iter().all(|c| *c != b".."));
                }
            }
        }
    }
    if let Document::Index(ms) = &doc {
        let mut want = running_platform();
        for variant in [None, Some("v8".to_string())] {
            want.variant = variant;
            if let Ok(m) = choose(ms, &want) {
                assert!(ms.contains(m));
                let p = m
                    .platform
                    .as_ref()
                    .expect("a chosen manifest has a platform");
                // The same platform once both are normalised (`liNux` is
                // `linux`, as containerd's matcher has it).
                let (os, arch, _) = normalised(&p.os, &p.architecture, None);
                let (wos, warch, _) = normalised(&want.os, &want.arch, None);
                assert_eq!((os, arch), (wos, warch));
            }
        }
    }
}

/// A Docker `config.json` / `.dockerconfigjson` (`net::auth`), and a
/// `WWW-Authenticate` challenge and a token answer: what a mounted Secret
/// or a registry hands packsync. Credentials found make a Basic value
/// that decodes back to them; a challenge's scheme and parameter names
/// are lowercase; a token is a header value (no control characters).
pub fn docker_config(data: &[u8]) {
    use crate::net::auth::{choose, credentials_for, parse_challenge, parse_token};
    use crate::net::helper::parse_helper_reply;
    use base64::Engine;
    let _ = choose(data, "registry.example:5000");
    if let Ok(r) = parse_helper_reply(data) {
        assert!(!r.secret.is_empty() && !r.user.contains(':'));
    }
    if let Ok(Some(c)) = credentials_for(data, "registry.example:5000") {
        let basic = c.basic();
        let b64 = basic.strip_prefix("Basic ").expect("a Basic value");
        let raw = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .expect("base64");
        assert_eq!(raw, format!("{}:{}", c.user, c.password).into_bytes());
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Some(ch) = parse_challenge(text) {
            assert!(!ch.scheme.is_empty() && ch.scheme == ch.scheme.to_ascii_lowercase());
            for (k, _) in &ch.params {
                assert!(!k.is_empty() && *k == k.to_ascii_lowercase(), "{k:?}");
            }
        }
    }
    if let Ok(t) = parse_token(data) {
        assert!(!t.is_empty() && t.bytes().all(|b| (0x21..0x7f).contains(&b)));
    }
}

/// The tar reader (`source::tar`) behind the decompressors that sniff the
/// stream (`source::decoded`: gzip, zstd, plain), on bytes an archive or a
/// registry hands packsync. Every header it returns is bounded (name,
/// size, mode, nanoseconds), each entry yields exactly its size in data,
/// and the names the spool would make are single components. Memory stays
/// bounded by the limits in `source::tar`, not by what a header claims.
pub fn tar(data: &[u8]) {
    use crate::source::tar::{Kind, Reader, MAX_NAME, MAX_SIZE};
    let mut input = data;
    let Ok((_, decoded)) = crate::source::decoded(&mut input) else {
        return;
    };
    let mut r = Reader::new(decoded);
    let mut buf = vec![0u8; 4096];
    for _ in 0..10_000 {
        let h = match r.next_entry() {
            Ok(Some(h)) => h,
            Ok(None) | Err(_) => return,
        };
        assert!(
            !h.path.is_empty() && h.path.len() <= MAX_NAME,
            "{:?}",
            h.path.len()
        );
        assert!(h.size <= MAX_SIZE && h.mode <= 0o7777 && h.mtime.1 < 1_000_000_000);
        if let Kind::Symlink(t) | Kind::Hardlink(t) = &h.kind {
            assert!(t.len() <= MAX_NAME);
        }
        // What every reference reader agrees on: only files (and GNU
        // dumpdirs) carry data; the reader refuses the rest.
        if matches!(
            h.kind,
            Kind::Symlink(_) | Kind::Hardlink(_) | Kind::Other(_)
        ) {
            assert_eq!(h.size, 0, "a {:?} entry carries no data", h.kind);
        }
        if let Ok(parts) = crate::source::spool::components(&h.path) {
            for p in parts {
                assert!(
                    !p.is_empty()
                        && p != b"."
                        && p != b".."
                        && !p.contains(&b'/')
                        && !p.contains(&0),
                    "{p:?} is not a single name"
                );
            }
        }
        let mut n = 0u64;
        loop {
            match r.read_data(&mut buf) {
                Ok(0) => break,
                Ok(k) => n += k as u64,
                Err(_) => return,
            }
        }
        assert_eq!(n, h.size, "an entry's data is its size");
    }
}

/// `source::oci::Record::parse`, on the record a generation's manifest (a
/// volume) keeps for an image: one that parses writes back to text that
/// parses to the same record, with every layer a digest.
pub fn oci_record(text: &str) {
    use crate::source::oci::Record;
    let Some(r) = Record::parse(text) else {
        return;
    };
    let written = r.to_string();
    let back = Record::parse(&written)
        .unwrap_or_else(|| panic!("a written record does not parse: {written:?}"));
    assert_eq!(
        back, r,
        "record changed through write and read: {written:?}"
    );
    assert_eq!(back.to_string(), written);
    for l in &r.layers {
        assert!(l.contains(':'), "layer {l:?} is no digest");
    }
    assert!(r.newest.ns < 1_000_000_000);
}

/// `trust::opa::signed`, on a bundle's `/.signatures.json` (and the
/// compact JWS inside it), checked against a fixed Ed25519 key: bytes the
/// fuzzer makes never verify, and refusing them never panics.
pub fn opa_signatures(data: &[u8]) {
    use crate::trust::{opa, Key};
    const ED: &str = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n-----END PUBLIC KEY-----\n";
    let key = Key::from_pem(std::path::Path::new("fuzz.pem"), ED).expect("the fixed key");
    assert!(
        opa::signed(data.to_vec(), std::slice::from_ref(&key)).is_err(),
        "unsigned bytes verified"
    );
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = crate::trust::jws::parse(text);
    }
}

/// `trust::canon::canonical`, OPA's canonical JSON of a bundle's
/// `data.json`: what it writes is canonical already (written again, the
/// same bytes) and is JSON by the grammar (numbers kept as written, as OPA
/// keeps them: `9E976` is JSON, though no f64 holds it).
pub fn opa_canonical(data: &[u8]) {
    let Ok(c) = crate::trust::canon::canonical(data) else {
        return;
    };
    let again = crate::trust::canon::canonical(&c).expect("canonical output parses");
    assert_eq!(again, c, "canonical form is not a fixed point");
    serde_json::from_slice::<serde::de::IgnoredAny>(&c).expect("canonical output is JSON");
}

/// `trust::cosign`: a `.sig` manifest's signature layers and a simple
/// signing payload, as a registry or a layout hands them over; and
/// `trust::sigstore`: a referrers list, a referrer's bundle layer, a
/// Sigstore bundle and its in-toto statement. The first byte picks which; refusing never panics, and every layer taken is
/// within the bounds (count, payload size, a sha256 digest).
pub fn cosign_signature(data: &[u8]) {
    use crate::trust::cosign;
    let Some((&pick, doc)) = data.split_first() else {
        return;
    };
    if pick % 2 == 0 {
        if let Ok(layers) = cosign::signature_layers(doc) {
            assert!(!layers.is_empty() && layers.len() <= cosign::MAX_SIGNATURES);
            for (d, _) in layers {
                assert!(d.size <= cosign::MAX_PAYLOAD);
                assert!(crate::source::oci_ref::valid_digest(&d.digest));
                assert_eq!(d.media_type, cosign::SIMPLESIGNING);
            }
        }
    } else if pick % 4 == 1 {
        let _ = cosign::payload_digest(doc);
    } else if pick % 8 == 3 {
        use crate::trust::sigstore;
        if let Ok(r) = sigstore::parse_referrers(doc) {
            assert!(r.len() <= sigstore::MAX_REFERRERS);
        }
        if let Ok(l) = sigstore::bundle_layer(doc) {
            assert!(l.size <= sigstore::MAX_BUNDLE);
        }
    } else {
        use crate::trust::sigstore;
        let _ = sigstore::statement_digests(doc);
        let by = sigstore::Signers {
            keys: &[],
            keyless: None,
        };
        let _ = sigstore::verify_bundle(doc, "sha256:0", by);
    }
}

/// `--trusted-root`: a Sigstore `trusted_root.json` (first byte even), or
/// one DER certificate as a bundle or a root holds it (odd). Refusing never
/// panics; a root taken has a log and stays within its bounds; a
/// certificate taken gives its identities and issuer without panicking.
pub fn trusted_root(data: &[u8]) {
    use crate::trust::keyless::{self, Cert, TrustedRoot};
    let Some((&pick, doc)) = data.split_first() else {
        return;
    };
    if pick % 2 == 0 {
        if let Ok(r) = TrustedRoot::parse(std::path::Path::new("trusted_root.json"), doc) {
            assert!(!r.tlogs.is_empty() && r.tlogs.len() <= keyless::MAX_AUTHORITIES);
            assert!(r.cas.len() <= keyless::MAX_AUTHORITIES);
        }
    } else if let Ok(c) = Cert::parse(doc) {
        assert!(doc.len() <= keyless::MAX_CERT);
        let _ = (c.identities(), c.oidc_issuer());
    }
}

/// A transparency log entry's proof: a checkpoint (a signed note; first
/// byte 0 mod 3), an RFC 6962 inclusion proof (1: index and size as 8
/// bytes each, then 32-byte hashes), or an entry body checked against a
/// signature (2). Refusing never panics; a checkpoint taken is a prefix of
/// its input up to a newline, with 1 to `MAX_NOTE_SIGNATURES` signatures; a
/// proof of a one-leaf tree without hashes leads to the leaf.
pub fn checkpoint(data: &[u8]) {
    use crate::trust::keyless::{self, Signed, Signer};
    let Some((&pick, doc)) = data.split_first() else {
        return;
    };
    match pick % 3 {
        0 => {
            let Ok(text) = std::str::from_utf8(doc) else {
                return;
            };
            if let Ok(c) = keyless::parse_checkpoint(text) {
                assert!(text.starts_with(&c.text) && c.text.ends_with('\n'));
                assert!(!c.signatures.is_empty());
                assert!(c.signatures.len() <= keyless::MAX_NOTE_SIGNATURES);
            }
        }
        1 => {
            if doc.len() < 16 {
                return;
            }
            let index = u64::from_le_bytes(doc[..8].try_into().expect("8 bytes"));
            let size = u64::from_le_bytes(doc[8..16].try_into().expect("8 bytes"));
            let hashes: Vec<[u8; 32]> = doc[16..]
                .chunks_exact(32)
                .take(keyless::MAX_PROOF_HASHES)
                .map(|c| c.try_into().expect("32 bytes"))
                .collect();
            let leaf = keyless::leaf_hash(doc);
            let _ = keyless::proof_root(index, size, leaf, &hashes);
            assert_eq!(keyless::proof_root(0, 1, leaf, &[]), Some(leaf));
        }
        _ => {
            let dsse = Signed::Dsse {
                payload: b"{}",
                sig: b"s",
            };
            let message = Signed::Message {
                digest: [0; 32],
                sig: b"s",
            };
            for signed in [dsse, message] {
                let _ = keyless::body_describes(doc, &signed, &Signer::Cert(b"c"));
            }
        }
    }
}

/// `--semver`: a RANGE and two tags. A range that parses matches without
/// panicking; a tag that is a version prints back to the same version
/// (`v` and build metadata aside); versions are totally ordered; the tag
/// chosen from the two matches the range and is not below the other
/// matching one.
pub fn semver(range: &str, a: &str, b: &str) {
    use crate::semver::{choose, parse_range, parse_tag};
    let parsed = parse_range(range);
    let (va, vb) = (parse_tag(a), parse_tag(b));
    for v in [&va, &vb].into_iter().flatten() {
        assert_eq!(parse_tag(&v.to_string()).as_ref(), Some(v), "{v}");
    }
    if let (Some(x), Some(y)) = (&va, &vb) {
        assert_eq!(x.cmp(y), y.cmp(x).reverse(), "{x} {y}");
    }
    if let Ok(r) = parsed {
        match choose([a, b], &r, None) {
            Ok(c) => {
                assert!(r.matches(&c.version), "{range:?} chose {}", c.tag);
                for v in [&va, &vb].into_iter().flatten() {
                    assert!(
                        !r.matches(v) || *v <= c.version,
                        "{range:?}: {v} above {}",
                        c.tag
                    );
                }
            }
            Err(none) => {
                for v in [&va, &vb].into_iter().flatten() {
                    assert!(!r.matches(v), "{range:?} matches {v} yet chose nothing");
                }
                assert_eq!(none.tags, 2);
            }
        }
    }
}

/// A registry's tag list page and its `Link` header (the first line):
/// every tag taken is a valid tag; a `next` link is what the header holds
/// between `<` and `>`.
pub fn tag_list(link: &str, page: &[u8]) {
    use crate::source::oci_fetch::{next_link, parse_tag_list};
    if let Ok(tags) = parse_tag_list(page) {
        assert!(tags.iter().all(|t| crate::source::oci_ref::valid_tag(t)));
    }
    if let Some(next) = next_link(link) {
        assert!(link.contains(&format!("<{next}>")), "{link:?}: {next:?}");
    }
}

/// `source::chunked::parse_toc`, on a zstd:chunked layer's TOC (decompressed;
/// what a registry hands packsync): every entry taken has a relative name
/// of plain components, lies through no symlink the TOC made before it,
/// has its bytes inside the blob and its chunks tiling its content; and the
/// tar entry made from it reads back, through the reader the spool uses,
/// as that name, kind, mode and time.
pub fn zstd_toc(data: &[u8]) {
    use crate::source::chunked::{parse_toc, write_entry, Kind};
    const BLOB: u64 = 1 << 30;
    let Ok(entries) = parse_toc(data, BLOB, 100_000) else {
        return;
    };
    let mut links: std::collections::HashSet<Vec<u8>> = Default::default();
    for e in &entries {
        assert!(!e.name.is_empty() && e.name[0] != b'/', "{:?}", e.name);
        for c in e.name.split(|&b| b == b'/') {
            assert!(!matches!(c, b"" | b"." | b".."), "{:?}", e.name);
            assert!(!c.contains(&0));
        }
        for (i, _) in e.name.iter().enumerate().filter(|(_, &b)| b == b'/') {
            assert!(
                !links.contains(&e.name[..i]),
                "through a symlink: {:?}",
                e.name
            );
        }
        match &e.kind {
            Kind::Symlink(_) => {
                links.insert(e.name.clone());
            }
            _ => {
                links.remove(&e.name);
            }
        }
        if e.digest.is_some() {
            assert!(e.range.0 < e.range.1 && e.range.1 <= BLOB);
        }
        if !e.chunks.is_empty() {
            assert_eq!(e.chunks.iter().map(|c| c.size).sum::<u64>(), e.size);
        }
        let content = vec![
            0u8;
            if e.kind == Kind::File {
                e.size.min(4096) as usize
            } else {
                0
            }
        ];
        let mut tar = Vec::new();
        write_entry(&mut tar, e, &content);
        let mut r = crate::source::tar::Reader::new(&tar[..]);
        let h = r
            .next_entry()
            .expect("a written entry reads back")
            .expect("an entry");
        assert_eq!(h.path, e.name);
        assert_eq!(h.mode, e.mode);
        assert_eq!(h.size, content.len() as u64);
        assert_eq!((h.mtime.0, h.mtime.1), e.mtime);
    }
}

/// `source::chunked::parse_footer`, `stargz_toc_entry` and
/// `parse_stargz_toc`, on the tail of an eStargz layer (what a registry
/// hands packsync): the first 51 bytes as a footer (an offset it gives
/// reads back in the footer's hex), the rest as the TOC's decompressed
/// member and, where that holds no tar entry, as the TOC's JSON; every
/// entry taken holds the invariants of `zstd_toc`.
pub fn estargz_toc(data: &[u8]) {
    use crate::source::chunked::{parse_footer, parse_stargz_toc, stargz_toc_entry, FOOTER};
    let (foot, rest) = data.split_at(data.len().min(FOOTER as usize));
    if let Ok(at) = parse_footer(foot) {
        assert_eq!(&foot[16..32], format!("{at:016x}").as_bytes());
    }
    let json = match stargz_toc_entry(rest) {
        Ok((e, json)) => {
            assert_eq!(e.name, b"stargz.index.json");
            assert_eq!(e.size, json.len() as u64);
            json
        }
        Err(_) => rest.to_vec(),
    };
    const AT: u64 = 1 << 30;
    if let Ok(entries) = parse_stargz_toc(&json, AT, 100_000) {
        for e in &entries {
            if e.digest.is_some() {
                assert!(e.range.0 < e.range.1 && e.range.1 <= AT);
            }
        }
        zstd_toc(&json);
    }
}

/// The fuzz targets, by name: how each turns the fuzzer's bytes into a
/// call of the facade above. `fuzz/fuzz_targets/*.rs` call this, and
/// `cargo test` replays `fuzz/seeds/TARGET/*` through it, so every seed
/// (and every finding added there) stays a regression test. False for a
/// name that is no target.
pub fn target(name: &str, data: &[u8]) -> bool {
    let text = std::str::from_utf8(data).ok();
    match name {
        "chmod" => {
            if let (Some(m), Ok(rules)) = (
                data.get(..4),
                std::str::from_utf8(data.get(4..).unwrap_or_default()),
            ) {
                chmod(rules, u32::from_le_bytes([m[0], m[1], m[2], m[3]]));
            }
        }
        "checkpoint" => checkpoint(data),
        "cosign_signature" => cosign_signature(data),
        "trusted_root" => trusted_root(data),
        "docker_config" => docker_config(data),
        "duration" => text.into_iter().for_each(duration),
        "exclude_from" => exclude_from(data),
        "label" => {
            if let Some(text) = text {
                let mut parts = text.splitn(3, '\n');
                let a = parts.next().unwrap_or("");
                let b = parts.next().unwrap_or("");
                let c = parts.next().unwrap_or("");
                labels(a, b, c);
            }
        }
        "manifest" => manifest(data),
        "manifest_index" => manifest_index(data),
        "oci_manifest" => {
            if let Some((&pick, doc)) = data.split_first() {
                let types = [
                    None,
                    Some("application/vnd.oci.image.index.v1+json"),
                    Some("application/vnd.oci.image.manifest.v1+json"),
                    Some("application/vnd.docker.distribution.manifest.v2+json"),
                    Some(
                        "application/vnd.docker.distribution.manifest.list.v2+json; charset=utf-8",
                    ),
                ];
                oci_manifest(doc, types[pick as usize % types.len()]);
            }
        }
        "oci_record" => text.into_iter().for_each(oci_record),
        "opa_canonical" => opa_canonical(data),
        "opa_signatures" => opa_signatures(data),
        "oci_reference" => text.into_iter().for_each(oci_reference),
        "tar" => tar(data),
        "zstd_toc" => zstd_toc(data),
        "estargz_toc" => estargz_toc(data),
        "semver" => {
            if let Some(text) = text {
                let mut parts = text.splitn(3, '\n');
                let r = parts.next().unwrap_or("");
                let a = parts.next().unwrap_or("");
                let b = parts.next().unwrap_or("");
                semver(r, a, b);
            }
        }
        "tag_list" => {
            let (link, page) = match data.iter().position(|&b| b == b'\n') {
                Some(i) => (&data[..i], &data[i + 1..]),
                None => (data, &[][..]),
            };
            tag_list(&String::from_utf8_lossy(link), page);
        }
        _ => return false,
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every seed of every fuzz target, replayed: a finding added to
    /// `fuzz/seeds/TARGET/` is a regression test from then on.
    #[test]
    fn every_fuzz_seed_replays() {
        let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
        let mut n = 0;
        for dir in std::fs::read_dir(&seeds).unwrap() {
            let dir = dir.unwrap().path();
            let name = dir.file_name().unwrap().to_str().unwrap().to_string();
            for seed in std::fs::read_dir(&dir).unwrap() {
                let seed = seed.unwrap().path();
                let data = std::fs::read(&seed).unwrap();
                assert!(
                    target(&name, &data),
                    "{}: no such fuzz target",
                    dir.display()
                );
                n += 1;
            }
        }
        assert!(n >= 41, "only {n} seeds under {}", seeds.display());
    }

    #[test]
    fn the_remote_parsers_hold_their_invariants_on_examples() {
        use crate::source::oci_ref::{parse, parse_layout};
        // Each example parses (else the checks below would test nothing).
        for (r, valid) in [
            (
                "oci://registry.example:5000/st2/packs:1.4.2//opt/stackstorm/packs",
                true,
            ),
            (
                "oci://[::1]:5000/a@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                true,
            ),
            ("oci-layout:/tmp/img:v1//etc", true),
            ("oci://x/y:z:w", false),
        ] {
            assert_eq!(parse(r).is_ok() || parse_layout(r).is_ok(), valid, "{r}");
            super::oci_reference(r);
        }
        let index = br#"{"schemaVersion":2,"manifests":[]}"#;
        assert!(crate::source::oci_image::parse(index, None).is_ok());
        super::oci_manifest(index, None);
        let d = format!("sha256:{}", "a".repeat(64));
        for title in ["a/b.txt", "../x", "/abs"] {
            let artifact = format!(
                r#"{{"schemaVersion":2,"config":{{"digest":"{d}","size":1}},"layers":[{{"mediaType":"text/plain","digest":"{d}","size":1,"annotations":{{"org.opencontainers.image.title":"{title}"}}}}]}}"#
            );
            super::oci_manifest(artifact.as_bytes(), None);
        }
        let config = br#"{"auths":{"registry.example:5000":{"auth":"YTpi"}}}"#;
        assert!(matches!(
            crate::net::auth::credentials_for(config, "registry.example:5000"),
            Ok(Some(_))
        ));
        super::docker_config(config);
        let challenge = br#"Bearer realm="https://auth.example/token",service="r""#;
        assert!(
            crate::net::auth::parse_challenge(std::str::from_utf8(challenge).unwrap()).is_some()
        );
        super::docker_config(challenge);
    }

    #[test]
    fn the_facade_accepts_what_packsync_writes_and_is_told() {
        let written = b"packsync-manifest 1\n---\nd 0755 0 0 0 1.000000000 - - .\nf 0644 0 0 1 2.000000000 - - a\n";
        assert!(Manifest::read(&mut &written[..]).is_ok());
        manifest(written);
        chmod("D755,F644", 0o100600);
        chmod("u+w,go-w,Da+X", 0o40700);
        labels("v1.9", "v1.10", "1.10.0-rc1");
        duration("15m");
        exclude_from(b"# comment\n*.pyc\n!keep.pyc\n/build/\n");
    }

    /// The body of a manifest after its header, each test's lines below a root.
    fn body(lines: &str) -> Vec<u8> {
        format!("packsync-manifest 1\n---\nd 0755 0 0 0 1.000000000 - - .\n{lines}").into_bytes()
    }

    fn refused(text: &[u8]) -> bool {
        manifest(text);
        Manifest::read(&mut &text[..]).is_err()
    }

    #[test]
    fn chmod_x_sees_the_mode_the_rules_made_so_far_unlike_rsync() {
        // rsync -a --chmod gives 0011 here and 0744 below: it decides X from the
        // source's mode. packsync follows chmod(1) (tests/integration/ops.rs
        // pins the second case), so such rules are not idempotent on files.
        chmod("u-x,g+X,o+x", 0o100);
        let rules = crate::chmod::parse("u-x,g+X,o+x").unwrap();
        assert_eq!(rules.mode(0o100, false), 0o001);
        assert_eq!(rules.mode(0o001, false), 0o011);
        let rules = crate::chmod::parse("D755,F644,Fu+X").unwrap();
        assert_eq!(rules.mode(0o700, false), 0o644);
    }

    #[test]
    fn a_duration_too_large_for_any_clock_is_refused_not_a_panic() {
        for s in [
            "99999999999999999999d",
            "99999999999999999999999999",
            "10000000000000000000s",
        ] {
            duration(s);
            assert!(crate::config::parse_duration(s).is_err(), "{s}");
        }
        duration("11574074074d");
    }

    #[test]
    fn a_manifest_without_its_root_line_is_refused() {
        // Cut right after the header, it read as an empty tree.
        assert!(refused(b"packsync-manifest 1\n---\n"));
        assert!(refused(
            b"packsync-manifest 1\n---\nf 0644 0 0 1 2.000000000 - - a\n"
        ));
        assert!(refused(&body("d 0755 0 0 0 1.000000000 - - .\n")));
    }

    #[test]
    fn a_manifest_path_that_is_not_a_walk_below_the_root_is_refused() {
        for p in ["%00", "a%00b", "..", ".", "d/..", "d//x", "d/"] {
            let text = body(&format!(
                "d 0755 0 0 0 1.0 - - d\nf 0644 0 0 1 2.0 - - {p}\n"
            ));
            assert!(refused(&text), "{p}");
        }
        assert!(!refused(&body(
            "d 0755 0 0 0 1.0 - - d\nf 0644 0 0 1 2.0 - - d/..x\n"
        )));
    }

    #[test]
    fn manifest_siblings_out_of_order_or_twice_are_refused() {
        assert!(refused(&body(
            "f 0644 0 0 1 2.0 - - b\nf 0644 0 0 1 2.0 - - a\n"
        )));
        assert!(refused(&body(
            "f 0644 0 0 1 2.0 - - a\nf 0644 0 0 1 2.0 - - a\n"
        )));
        assert!(!refused(&body(
            "f 0644 0 0 1 2.0 - - a\nf 0644 0 0 1 2.0 - - b\n"
        )));
    }

    #[test]
    fn manifest_fields_out_of_range_are_refused_not_a_panic() {
        // A sha256 of 64 bytes that are not 64 hex digits used to panic on a char boundary.
        let hash = "\u{e9}".repeat(32);
        assert!(refused(&body(&format!("f 0644 0 0 1 2.0 {hash} - a\n"))));
        assert!(refused(&body("f 10644 0 0 1 2.0 - - a\n")));
        assert!(refused(&body("f 0644 0 0 1 2.1000000000 - - a\n")));
        // A fraction is a fraction: `.5` is half a second.
        let m = Manifest::read(&mut &body("f 0644 0 0 1 2.5 - - a\n")[..]).unwrap();
        assert_eq!(m.tree.entries[0].meta.mtime.pair(), (2, 500_000_000));
    }
}
