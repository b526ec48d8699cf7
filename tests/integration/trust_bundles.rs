//! `--verify-key` on OPA bundles: signatures made here by the `openssl`
//! command line (keys: ECDSA P-256, Ed25519, RSA-2048) and a JWT put
//! together by a small python3 signer, as `opa sign` lays it out
//! (`{"signatures": [JWT]}`, the payload's `files` with SHA-256 hashes,
//! `data.json` and `.manifest` hashed in OPA's canonical JSON form). A user
//! checks: a signed bundle lands with `.signatures.json` in it and `status`
//! names the key's fingerprint (the one `openssl` computes from the key's
//! DER); every way a bundle can be unsigned, signed by another key,
//! altered or hostile is exit 6 with one line, the volume untouched.

use std::fs;
use std::path::Path;
use std::process::Command;

use crate::fixture::{openssl, Fixture, Run};
use crate::source_http::Server;
use crate::source_oci::have;
use crate::trust_images::live_key;

/// `sign.py BUNDLE KEY ALG [HEADER_JSON [PAYLOAD_EXTRA_JSON]]`: writes
/// BUNDLE/.signatures.json over every file of BUNDLE. ALG: ES256, EdDSA,
/// RS256, PS256 (signed by openssl with KEY), `none` (no signature),
/// `HS256` (HMAC with the bytes of KEY as the secret).
pub(crate) const SIGN_PY: &str = r#"
import base64, hashlib, hmac, json, os, subprocess, sys
root, key, alg = sys.argv[1], sys.argv[2], sys.argv[3]
header = json.loads(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[4] else {}
extra = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
def b64(b): return base64.urlsafe_b64encode(b).rstrip(b"=").decode()
files = []
for d, _, names in os.walk(root):
    for n in sorted(names):
        p = os.path.join(d, n)
        rel = os.path.relpath(p, root)
        if rel == ".signatures.json": continue
        data = open(p, "rb").read()
        if n in ("data.json", ".manifest"):
            data = json.dumps(json.loads(data), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        files.append({"name": rel, "hash": hashlib.sha256(data).hexdigest(), "algorithm": "SHA-256"})
payload = {"files": files}
payload.update(extra)
h = {"alg": alg}
h.update(header)
signing = (b64(json.dumps(h).encode()) + "." + b64(json.dumps(payload).encode())).encode()
def der_to_raw(der, n):
    # SEQUENCE { INTEGER r, INTEGER s }
    assert der[0] == 0x30
    i = 2 if der[1] < 0x80 else 2 + (der[1] & 0x7f)
    out = b""
    for _ in range(2):
        assert der[i] == 0x02
        l = der[i + 1]
        v = der[i + 2:i + 2 + l].lstrip(b"\0")
        out += v.rjust(n, b"\0")
        i += 2 + l
    return out
def openssl(args):
    return subprocess.run(["openssl"] + args, input=signing, capture_output=True, check=True).stdout
if alg == "ES256":
    sig = der_to_raw(openssl(["dgst", "-sha256", "-sign", key]), 32)
elif alg == "RS256":
    sig = openssl(["dgst", "-sha256", "-sign", key])
elif alg == "PS256":
    sig = openssl(["dgst", "-sha256", "-sign", key, "-sigopt", "rsa_padding_mode:pss", "-sigopt", "rsa_pss_saltlen:digest"])
elif alg == "EdDSA":
    tmp = os.path.join(os.path.dirname(key), "signing-input")
    open(tmp, "wb").write(signing)
    sig = subprocess.run(["openssl", "pkeyutl", "-sign", "-inkey", key, "-rawin", "-in", tmp], capture_output=True, check=True).stdout
elif alg == "HS256":
    sig = hmac.new(open(key, "rb").read(), signing, hashlib.sha256).digest()
else:
    sig = b""
json.dump({"signatures": [signing.decode() + "." + b64(sig)]}, open(os.path.join(root, ".signatures.json"), "w"))
"#;

/// `sync --grace 0 --verify-key KEY SOURCE vol/packs`.
pub(crate) fn keyed<'a>(key: &'a str, source: &'a str) -> [&'a str; 7] {
    [
        "sync",
        "--grace",
        "0",
        "--verify-key",
        key,
        source,
        "vol/packs",
    ]
}

/// A key pair in `dir`: `NAME.key` (private) and `NAME.pub` (PEM public).
pub(crate) fn keypair(dir: &Path, name: &str, algorithm: &[&str]) {
    let key = format!("{name}.key");
    let mut args = vec!["genpkey"];
    args.extend_from_slice(algorithm);
    args.extend(["-out", &key]);
    openssl(dir, &args);
    openssl(
        dir,
        &[
            "pkey",
            "-in",
            &key,
            "-pubout",
            "-out",
            &format!("{name}.pub"),
        ],
    );
}

/// The fingerprint as a user computes it: SHA-256 of the DER public key, base64, no padding.
pub(crate) fn openssl_fingerprint(dir: &Path, name: &str) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl pkey -pubin -in {name}.pub -outform DER | openssl dgst -sha256 -binary | base64 | tr -d '=\\n'"
        ))
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success());
    format!("SHA256:{}", String::from_utf8(out.stdout).unwrap())
}

pub(crate) fn sign(bundle: &Path, key: &Path, alg: &str, header: &str, extra: &str) {
    let out = Command::new("python3")
        .arg("-c")
        .arg(SIGN_PY)
        .arg(bundle)
        .arg(key)
        .arg(alg)
        .arg(header)
        .arg(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "sign.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `tar -czf OUT -C DIR .`: the bundle as a tar.gz.
fn tar_gz(dir: &Path, out: &Path) {
    let ok = Command::new("tar")
        .arg("-czf")
        .arg(out)
        .arg("-C")
        .arg(dir)
        .arg(".")
        .status()
        .unwrap();
    assert!(ok.success());
}

/// A fixture with keys `ec` (P-256), `ed` (Ed25519), `rsa` (RSA-2048) and
/// `other` (P-256) in keys/, and an OPA bundle in src/.
fn setup() -> Option<Fixture> {
    if !have(&["openssl", "python3"]) {
        return None;
    }
    let f = Fixture::new();
    let keys = f.path("keys");
    fs::create_dir(&keys).unwrap();
    let ec = ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"];
    keypair(&keys, "ec", &ec);
    keypair(&keys, "other", &ec);
    keypair(&keys, "ed", &["-algorithm", "ed25519"]);
    keypair(
        &keys,
        "rsa",
        &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
    );
    f.file(".manifest", r#"{"revision": "r1", "roots": ["authz"]}"#);
    f.file(
        "authz/data.json",
        r#"{"admins": ["ann", "bob"], "limits": {"max": 10, "min": 1}}"#,
    );
    f.file(
        "authz/policy.rego",
        "package authz\ndefault allow := false\n",
    );
    Some(f)
}

fn sign_src(f: &Fixture, key: &str, alg: &str) {
    sign(&f.src(), &f.path(&format!("keys/{key}.key")), alg, "", "{}");
}

fn key_arg(f: &Fixture, name: &str) -> String {
    f.path(&format!("keys/{name}.pub"))
        .to_str()
        .unwrap()
        .to_string()
}

/// A first generation published without keys, so DEST is there to keep.
fn published_unverified(f: &Fixture) {
    f.sync(&[]).ok();
}

#[test]
fn a_signed_directory_bundle_lands_and_status_names_the_key() {
    let Some(f) = setup() else { return };
    sign_src(&f, "ec", "ES256");
    let fp = openssl_fingerprint(&f.path("keys"), "ec");
    let ec = key_arg(&f, "ec");
    let ed = key_arg(&f, "ed");
    f.sync(&["--verify-key", &ed, "--verify-key", &ec]).ok();
    let dest = f.dest();
    assert!(dest.join("authz/policy.rego").is_file());
    // .signatures.json is published as it is: the consumer may verify again.
    assert!(dest.join(".signatures.json").is_file());
    let status = f.packsync(&["status", "vol/packs"]).ok();
    assert!(status.stdout.contains(&fp), "{}", status.stdout);
    let json = f.packsync(&["status", "--json", "vol/packs"]).ok();
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(
        v["live"]["verified"][0]["key"].as_str(),
        Some(fp.as_str()),
        "{v}"
    );
    // The same keys, the same bundle: up to date, nothing written.
    let again = f.unchanged_but_staging(|| f.sync(&["--verify-key", &ec]).ok());
    assert!(again.stdout.contains("up to date"), "{}", again.stdout);
}

#[test]
fn a_signed_tar_gz_bundle_with_an_rsa_key_lands() {
    let Some(f) = setup() else { return };
    sign_src(&f, "rsa", "RS256");
    tar_gz(&f.src(), &f.path("bundle.tar.gz"));
    let rsa = key_arg(&f, "rsa");
    f.packsync(&["sync", "--verify-key", &rsa, "bundle.tar.gz", "vol/packs"])
        .ok();
    assert!(f.dest().join("authz/data.json").is_file());
    let status = f.packsync(&["status", "vol/packs"]).ok();
    assert!(
        status
            .stdout
            .contains(&openssl_fingerprint(&f.path("keys"), "rsa")),
        "{}",
        status.stdout
    );
    // PSS with the same key verifies too.
    sign_src(&f, "rsa", "PS256");
    f.sync(&["--verify-key", &rsa]).ok();
}

#[test]
fn a_signed_bundle_over_http_lands_and_an_altered_one_does_not() {
    let Some(f) = setup() else { return };
    sign_src(&f, "ed", "EdDSA");
    let server = Server::start(&f);
    let tgz = server.www.join("bundle.tar.gz");
    let tar = |out: &Path| tar_gz(&f.src(), out);
    tar(&tgz);
    let url = server.url("/bundle.tar.gz");
    let ed = key_arg(&f, "ed");
    f.packsync(&["sync", "--verify-key", &ed, &url, "vol/packs"])
        .ok();
    assert!(f.dest().join("authz/policy.rego").is_file());
    // The server now serves the bundle with a policy changed after signing.
    f.file(
        "authz/policy.rego",
        "package authz\ndefault allow := true\n",
    );
    tar(&tgz);
    // The spool lives in this writer's staging directory, removed again.
    f.unchanged_but_staging(|| {
        f.packsync(&keyed(&ed, &url))
            .fails(6, "/authz/policy.rego: hash mismatch")
    });
    assert!(fs::read_to_string(f.dest().join("authz/policy.rego"))
        .unwrap()
        .contains("false"));
}

#[test]
fn an_unsigned_source_with_a_key_is_refused_and_nothing_changes() {
    let Some(f) = setup() else { return };
    published_unverified(&f);
    let ec = key_arg(&f, "ec");
    f.sync_refused(
        &["--verify-key", &ec],
        6,
        "src: no /.signatures.json (--verify-key needs every source signed)",
    );
    // The first sync, with nothing on the volume yet, leaves nothing either.
    let g = setup().unwrap();
    g.sync_refused(
        &["--verify-key", &key_arg(&g, "ec")],
        6,
        "no /.signatures.json",
    );
    // --json: the error is JSON too.
    let j = f.sync(&["--json", "--verify-key", &ec]);
    assert_eq!(j.code, 6);
    assert!(
        j.stdout.contains("no /.signatures.json") || j.stderr.contains("no /.signatures.json"),
        "{} {}",
        j.stdout,
        j.stderr
    );
}

#[test]
fn a_valid_signature_by_an_unlisted_key_is_refused() {
    let Some(f) = setup() else { return };
    sign_src(&f, "other", "ES256");
    published_unverified(&f);
    f.sync_refused(
        &["--verify-key", &key_arg(&f, "ec")],
        6,
        "verifies with none of the keys (tried SHA256:",
    );
    // A key of another type than the token's alg is not tried at all.
    f.sync_refused(
        &["--verify-key", &key_arg(&f, "ed")],
        6,
        "signed with ES256, and no --verify-key is a key of that type",
    );
}

#[test]
fn files_added_changed_or_removed_after_signing_are_refused_by_name() {
    let Some(f) = setup() else { return };
    sign_src(&f, "ec", "ES256");
    published_unverified(&f);
    let ec = key_arg(&f, "ec");
    let k = ["--verify-key", ec.as_str()];
    f.file("authz/extra.rego", "package authz\nallow := true\n");
    f.sync_refused(&k, 6, "/authz/extra.rego: not in the signature's file list");
    fs::remove_file(f.src().join("authz/extra.rego")).unwrap();
    f.file(
        "authz/policy.rego",
        "package authz\ndefault allow := true\n",
    );
    f.sync_refused(&k, 6, "/authz/policy.rego: hash mismatch (SHA-256 signed");
    fs::remove_file(f.src().join("authz/policy.rego")).unwrap();
    f.sync_refused(
        &k,
        6,
        "authz/policy.rego: listed in the signature but absent from the bundle",
    );
    // Left out by --exclude: not asked for.
    f.file(
        "authz/policy.rego",
        "package authz\ndefault allow := false\n",
    );
    f.sync(&["--verify-key", &ec, "--exclude", "*.rego"]).ok();
    assert!(!f.dest().join("authz/policy.rego").exists());
}

#[test]
fn alg_none_and_hs256_keyed_with_the_public_key_are_refused() {
    let Some(f) = setup() else { return };
    published_unverified(&f);
    let ec = key_arg(&f, "ec");
    sign(&f.src(), &f.path("keys/ec.key"), "none", "", "{}");
    f.sync_refused(&["--verify-key", &ec], 6, "alg \"none\" is refused");
    // The confusion attack: HMAC keyed with the public key's PEM bytes.
    sign(&f.src(), &f.path("keys/ec.pub"), "HS256", "", "{}");
    f.sync_refused(&["--verify-key", &ec], 6, "alg \"HS256\" is refused");
}

#[test]
fn a_reformatted_data_json_still_verifies_a_changed_value_does_not() {
    let Some(f) = setup() else { return };
    sign_src(&f, "ec", "ES256");
    let ec = key_arg(&f, "ec");
    // Other whitespace, other key order, an escape for a plain letter.
    f.file(
        "authz/data.json",
        "{\n  \"limits\": {\"min\": 1, \"max\": 10},\n  \"admins\": [\"\\u0061nn\", \"bob\"]\n}\n",
    );
    f.file(
        ".manifest",
        "{ \"roots\" : [ \"authz\" ] , \"revision\" : \"r1\" }",
    );
    f.sync(&["--verify-key", &ec]).ok();
    f.file(
        "authz/data.json",
        r#"{"admins": ["ann", "bob", "eve"], "limits": {"max": 10, "min": 1}}"#,
    );
    f.sync_refused(&["--verify-key", &ec], 6, "/authz/data.json: hash mismatch");
    // A number written otherwise is another value to OPA's hash (json.Number).
    f.file(
        "authz/data.json",
        r#"{"admins": ["ann", "bob"], "limits": {"max": 10.0, "min": 1}}"#,
    );
    f.sync_refused(&["--verify-key", &ec], 6, "/authz/data.json: hash mismatch");
}

#[test]
fn an_enormous_signatures_file_a_scope_and_two_tokens_are_refused() {
    let Some(f) = setup() else { return };
    published_unverified(&f);
    let ec = key_arg(&f, "ec");
    let big = format!("{{\"signatures\": [\"{}\"]}}", "a".repeat(17 << 20));
    fs::write(f.src().join(".signatures.json"), big).unwrap();
    f.sync_refused(&["--verify-key", &ec], 6, "bytes (at most 16777216)");
    fs::write(
        f.src().join(".signatures.json"),
        r#"{"signatures": ["a.b.c", "d.e.f"]}"#,
    )
    .unwrap();
    f.sync_refused(&["--verify-key", &ec], 6, "several JWTs");
    sign(
        &f.src(),
        &f.path("keys/ec.key"),
        "ES256",
        "",
        r#"{"scope": "write"}"#,
    );
    f.sync_refused(&["--verify-key", &ec], 6, "scope \"write\"");
}

#[test]
fn keyid_orders_the_keys_but_any_given_key_may_verify() {
    let Some(f) = setup() else { return };
    sign(
        &f.src(),
        &f.path("keys/ec.key"),
        "ES256",
        r#"{"kid": "other"}"#,
        "{}",
    );
    let (ec, other) = (key_arg(&f, "ec"), key_arg(&f, "other"));
    f.sync(&["--verify-key", &other, "--verify-key", &ec]).ok();
    let status = f.packsync(&["status", "vol/packs"]).ok();
    assert!(status
        .stdout
        .contains(&openssl_fingerprint(&f.path("keys"), "ec")));
}

#[test]
fn bad_key_files_are_usage_errors_naming_the_file() {
    let Some(f) = setup() else { return };
    sign_src(&f, "ec", "ES256");
    fs::write(f.path("keys/junk.pub"), "not a key\n").unwrap();
    f.sync_refused(
        &["--verify-key", "keys/junk.pub"],
        2,
        "keys/junk.pub: bad --verify-key: no PEM block",
    );
    f.sync_refused(
        &["--verify-key", "keys/absent.pub"],
        2,
        "keys/absent.pub: cannot read --verify-key",
    );
    f.sync_refused(
        &["--verify-key", "keys/ec.key"],
        2,
        "keys/ec.key: bad --verify-key: a private key",
    );
    keypair(
        &f.path("keys"),
        "small",
        &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:1024"],
    );
    f.sync_refused(
        &["--verify-key", "keys/small.pub"],
        2,
        "keys/small.pub: bad --verify-key: RSA key of 1024 bits",
    );
    // PACKSYNC_VERIFY_KEY: one path a line.
    let out = f
        .command(&["sync", "--grace", "0", "src", "vol/packs"])
        .env(
            "PACKSYNC_VERIFY_KEY",
            format!("{}\n{}\n", key_arg(&f, "ed"), key_arg(&f, "ec")),
        )
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn without_a_key_a_signed_bundle_is_ordinary_files() {
    let Some(f) = setup() else { return };
    sign_src(&f, "ec", "ES256");
    f.sync(&[]).ok();
    assert!(f.dest().join(".signatures.json").is_file());
    let status = f.packsync(&["status", "vol/packs"]).ok();
    assert!(!status.stdout.contains("SHA256:"), "{}", status.stdout);
}

#[test]
fn a_verified_bundle_answering_304_is_up_to_date_only_for_the_keys_that_verified_it() {
    let Some(f) = setup() else { return };
    sign_src(&f, "ed", "EdDSA");
    let server = Server::start(&f);
    tar_gz(&f.src(), &server.www.join("bundle.tar.gz"));
    let url = server.url("/bundle.tar.gz");
    let (ed, other) = (key_arg(&f, "ed"), key_arg(&f, "other"));
    let fp = openssl_fingerprint(&f.path("keys"), "ed");
    f.packsync(&keyed(&ed, &url)).ok();
    // The same key: one conditional request, a 304, nothing written, and
    // the record of who verified it kept.
    let again = f.unchanged_by(|| f.packsync(&keyed(&ed, &url)).ok());
    assert!(again.stdout.contains("up to date"), "{}", again.stdout);
    let reqs = server.requests();
    assert_eq!(reqs.len(), 2, "{reqs:?}");
    assert!(
        reqs[1].starts_with("/bundle.tar.gz if-none-match=\""),
        "{reqs:?}"
    );
    let json = f.packsync(&["status", "--json", "vol/packs"]).ok();
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(v["live"]["verified"][0]["key"].as_str(), Some(fp.as_str()));
    // The key replaced by one that did not sign it: a 304 proves nothing
    // about the new key, so the bundle is fetched again, checked, refused.
    f.unchanged_but_staging(|| {
        f.packsync(&keyed(&other, &url)).fails(
            6,
            "signed with EdDSA, and no --verify-key is a key of that type",
        )
    });
    let reqs = server.requests();
    assert_eq!(reqs.len(), 3, "{reqs:?}");
    assert!(reqs[2].ends_with("if-none-match=None"), "{reqs:?}");
    // Both keys, the one that verified it among them: up to date on a 304.
    let both = f
        .packsync(&[
            "sync",
            "--grace",
            "0",
            "--verify-key",
            &other,
            "--verify-key",
            &ed,
            &url,
            "vol/packs",
        ])
        .ok();
    assert!(both.stdout.contains("up to date"), "{}", both.stdout);
    assert!(server.requests()[3].contains("if-none-match=\""));
}

/// A sync without keys publishes what it did not verify: its generation
/// claims no key, so a keyed sync answered 304 for it checks the bundle
/// again, and refuses it when the key never signed it.
#[test]
fn a_generation_made_without_keys_claims_no_verification_it_did_not_make() {
    let Some(f) = setup() else { return };
    sign_src(&f, "ed", "EdDSA");
    let server = Server::start(&f);
    let bundle = server.www.join("bundle.tar.gz");
    tar_gz(&f.src(), &bundle);
    let url = server.url("/bundle.tar.gz");
    let ed = key_arg(&f, "ed");
    f.packsync(&keyed(&ed, &url)).ok();
    assert!(live_key(&f).1.is_some());
    // The bundle changed after signing; synced without a key it lands as
    // ordinary files, and nothing says the key verified them. Two live
    // files joined by hand (one inode) send `--itemize` to the whole trees.
    f.file(
        "authz/policy.rego",
        "package authz\ndefault allow := true\n",
    );
    tar_gz(&f.src(), &bundle);
    let live = f.dest();
    fs::remove_file(live.join("authz/data.json")).unwrap();
    fs::hard_link(live.join(".manifest"), live.join("authz/data.json")).unwrap();
    let plain = f
        .packsync(&["sync", "--grace", "0", "--itemize", &url, "vol/packs"])
        .ok();
    assert!(plain.stdout.contains("synced"), "{}", plain.stdout);
    assert_eq!(live_key(&f).1, None);
    // With the key again: the server answers 304, which proves nothing
    // here; the bundle is fetched and checked, and refused by name.
    f.unchanged_but_staging(|| f.packsync(&keyed(&ed, &url)).fails(6, "authz/policy.rego"));
}

/// The refusals of `files_added_changed_or_removed_after_signing_are_refused_by_name`,
/// for a bundle that comes as an archive: its signature is checked over
/// its spool a directory at a time, before anything is staged, with the
/// same lines; a symlink is refused before a file the signature lacks.
/// Then the bundle as signed lands, names the key, and is up to date.
#[test]
fn an_archived_bundle_is_checked_over_its_spool_with_the_same_refusals() {
    let Some(f) = setup() else { return };
    sign_src(&f, "ec", "ES256");
    published_unverified(&f);
    let ec = key_arg(&f, "ec");
    let bundle = f.path("bundle.tar.gz");
    let args = [
        "sync",
        "--grace",
        "0",
        "--verify-key",
        &ec,
        "bundle.tar.gz",
        "vol/packs",
    ];
    let refused = |needle: &str| {
        tar_gz(&f.src(), &bundle);
        f.unchanged_but_staging(|| f.packsync(&args).fails(6, needle));
    };
    f.file("authz/deep/extra.rego", "package authz\nallow := true\n");
    refused("bundle.tar.gz: /authz/deep/extra.rego: not in the signature's file list");
    std::os::unix::fs::symlink("policy.rego", f.src().join("authz/zlink")).unwrap();
    refused("/authz/zlink: a symlink, which a bundle signature cannot cover");
    fs::remove_file(f.src().join("authz/zlink")).unwrap();
    fs::remove_dir_all(f.src().join("authz/deep")).unwrap();
    f.file(
        "authz/policy.rego",
        "package authz\ndefault allow := true\n",
    );
    refused("/authz/policy.rego: hash mismatch (SHA-256 signed");
    fs::remove_file(f.src().join("authz/policy.rego")).unwrap();
    refused("authz/policy.rego: listed in the signature but absent from the bundle");
    fs::remove_file(f.src().join(".signatures.json")).unwrap();
    refused("no /.signatures.json (--verify-key needs every source signed)");
    sign_src(&f, "ec", "ES256");
    f.file(
        "authz/policy.rego",
        "package authz\ndefault allow := false\n",
    );
    sign_src(&f, "ec", "ES256");
    tar_gz(&f.src(), &bundle);
    f.packsync(&args).ok();
    assert_eq!(
        fs::read_to_string(f.dest().join("authz/policy.rego")).unwrap(),
        "package authz\ndefault allow := false\n"
    );
    let fp = openssl_fingerprint(&f.path("keys"), "ec");
    let json = f.packsync(&["status", "--json", "vol/packs"]).ok();
    assert!(json.stdout.contains(&fp), "{}", json.stdout);
    let again = f.packsync(&args).ok();
    assert!(again.stdout.contains("up to date"), "{}", again.stdout);
}

/// A bundle in a directory: published without keys first, then with one (a
/// generation of its own, naming the key), up to date with the key and
/// without it.
#[test]
fn a_directory_bundle_published_unverified_then_verified_is_two_generations() {
    let Some(f) = setup() else { return };
    sign_src(&f, "ec", "ES256");
    published_unverified(&f);
    let (plain, none) = live_key(&f);
    assert_eq!(none, None);
    let ec = key_arg(&f, "ec");
    f.sync(&["--verify-key", &ec]).ok();
    let (verified, key) = live_key(&f);
    assert_ne!(verified, plain);
    let fp = openssl_fingerprint(&f.path("keys"), "ec");
    assert_eq!(key.as_deref(), Some(fp.as_str()));
    for flags in [&["--verify-key", ec.as_str()][..], &[]] {
        let again = f.unchanged_but_staging(|| f.sync(flags).ok());
        assert!(
            again.stdout.contains("up to date"),
            "{flags:?}: {}",
            again.stdout
        );
    }
    assert_eq!(live_key(&f), (verified, Some(fp)));
}

/// A bundle in a directory is checked over its listing, then planned and
/// staged a directory at a time: a file changed after the check (here
/// while the sync waits before its stage copies anything) is caught over
/// the staged tree, before anything is published: exit 6, the line of a
/// hash mismatch, the volume as it was (on a first sync too).
#[test]
fn a_directory_bundle_changed_after_its_check_is_refused_over_the_staged_tree() {
    let Some(f) = setup() else { return };
    sign_src(&f, "ec", "ES256");
    let ec = key_arg(&f, "ec");
    f.sync(&["--verify-key", &ec]).ok();
    let (live, _) = live_key(&f);
    let published = fs::read_to_string(f.dest().join("authz/policy.rego")).unwrap();
    // The next version, signed; then, under the paused sync, changed again.
    f.file(
        "authz/policy.rego",
        "package authz\ndefault allow := false\n",
    );
    sign_src(&f, "ec", "ES256");
    let before = f.volume_but_staging();
    planted_while_paused(&f);
    assert_eq!(f.volume_but_staging(), before);
    assert_eq!(live_key(&f).0, live);
    assert_eq!(
        fs::read_to_string(f.dest().join("authz/policy.rego")).unwrap(),
        published
    );
    // Signed as it is now, it lands.
    sign_src(&f, "ec", "ES256");
    f.sync(&["--verify-key", &ec]).ok();
    assert!(fs::read_to_string(f.dest().join("authz/policy.rego"))
        .unwrap()
        .contains("planted"));
    // A first sync refused so leaves nothing on the volume either.
    let g = setup().unwrap();
    sign_src(&g, "ec", "ES256");
    let before = g.volume();
    planted_while_paused(&g);
    assert_eq!(g.volume(), before);
}

/// `sync --verify-key` (the key `ec`) of `src/`, paused before its stage
/// copies anything while `authz/policy.rego` is changed: refused as a hash
/// mismatch.
fn planted_while_paused(f: &Fixture) {
    let ec = key_arg(f, "ec");
    let resume = f.path("resume");
    let mut cmd = f.command(&[
        "sync",
        "--grace",
        "0",
        "--verify-key",
        &ec,
        "src",
        "vol/packs",
    ]);
    let child = crate::faults::start_paused(&mut cmd, "staging", &resume);
    f.file(
        "authz/policy.rego",
        "package authz\ndefault allow := true # planted\n",
    );
    fs::write(&resume, "").unwrap();
    let run = Run::wait(child);
    assert_eq!(run.code, 6, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("authz/policy.rego: hash mismatch (SHA-256 signed"),
        "{}",
        run.stderr
    );
}
