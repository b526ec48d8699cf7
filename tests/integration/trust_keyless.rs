//! Keyless Sigstore signatures on images, verified offline against
//! `--trusted-root`, with `--certificate-identity` and
//! `--certificate-oidc-issuer`. The tests make their own Sigstore world
//! (`world.py`): a certificate authority (openssl: a P-384 root), a leaf
//! certificate for an identity (P-256, SAN URI and email, codeSigning, the
//! Fulcio issuer extension 1.3.6.1.4.1.57264.1.8 as a DER UTF8String), a
//! transparency log key (P-256), a Merkle tree of log entries computed
//! here with the bundle's entry in it, a checkpoint signed by the log, a
//! signed entry timestamp, and a `trusted_root.json` naming the CA and the
//! log. The bundle (v0.3, DSSE over cosign's in-toto statement for the image
//! manifest digest, a `dsse` 0.0.1 log entry) is attached as a referrer, as
//! `trust_bundle_referrers.rs` attaches keyed ones. A user checks: a bundle
//! for the identity lands and `status --json` names the identity; another
//! identity, another issuer, a certificate of another CA, one expired at
//! the entry's integrated time, a log entry altered, an inclusion proof
//! with a wrong hash, a checkpoint signed by another key, no log entry,
//! a leaf without codeSigning: each exit 6 naming the source and the
//! cause, DEST and its state unchanged. A chain in `x509CertificateChain`
//! and the legacy issuer extension land too.

use std::fs;
use std::path::Path;
use std::process::Command;

use crate::fixture::Fixture;
use crate::source_oci::{have, tree, Auth, Registry, TOOLS};
use crate::trust_images::{layout_src, published_unverified, setup};

const IDENTITY: &str =
    "https://github.com/example/packs/.github/workflows/release.yml@refs/heads/main";
const EMAIL: &str = "release@example.com";
const ISSUER: &str = "https://token.actions.githubusercontent.com";

/// `world.py DIR init`: the CA (`ca`), another CA (`otherca`), the leaf
/// keys and certificates (`leaf` by `ca`, `foreign` by `otherca`), the log
/// key (`log`), another key (`otherlog`), and `trusted_root.json` naming
/// `ca` and `log`.
/// `world.py DIR bundle LAYOUT SUBJECT MODE PLACE`: attach to LAYOUT a
/// keyless bundle for the image manifest SUBJECT. MODE: `good`,
/// `promise` (no inclusion proof: the signed entry timestamp only),
/// `foreign` (the leaf of the other CA), `expired` (integrated two days
/// after the leaf's one day of validity), `body` (the entry's body names
/// another payload hash), `proof` (one proof hash changed), `checkpoint`
/// (signed by the other key), `nolog` (no log entry), `keyed` (signed
/// with `keys/ec.key`, no certificate, the entry naming its public key),
/// `legacy` (a leaf with only the legacy raw issuer extension
/// 1.3.6.1.4.1.57264.1.1, in an `x509CertificateChain` with the CA), `noeku`
/// (a leaf for client auth, not code signing), `nopromise` (the proof and
/// checkpoint without the signed entry timestamp). PLACE: `subject`
/// (an `index.json` entry) or `tag` (the referrers tag fallback, for a push).
const WORLD_PY: &str = r#"
import base64, hashlib, json, os, subprocess, sys, time
d = sys.argv[1]
def run(*a, **k):
    return subprocess.run(list(a), cwd=d, check=True, capture_output=True, **k).stdout
def b64(b):
    return base64.b64encode(b).decode()
def der_of_pem(name):
    return run("openssl", "x509", "-in", name, "-outform", "DER")
def spki(name):
    return run("openssl", "pkey", "-in", name, "-pubout", "-outform", "DER")
def sign(key, data):
    p = os.path.join(d, "tosign")
    open(p, "wb").write(data)
    return run("openssl", "dgst", "-sha256", "-sign", key, "tosign")
if sys.argv[2] == "init":
    for ca in ["ca", "otherca"]:
        run("openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384", "-out", ca + ".key")
        run("openssl", "req", "-x509", "-new", "-key", ca + ".key", "-sha384", "-days", "3650",
            "-subj", "/O=packsync-test/CN=" + ca, "-addext", "basicConstraints=critical,CA:true",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-out", ca + ".pem")
    san = "subjectAltName = critical, URI:%s, email:%s\n" % (sys.argv[3], sys.argv[4])
    issuer = "1.3.6.1.4.1.57264.1.8 = ASN1:UTF8String:%s\n" % sys.argv[5]
    legacy = "1.3.6.1.4.1.57264.1.1 = DER:%s\n" % sys.argv[5].encode().hex()
    usage = "keyUsage = critical, digitalSignature\n"
    open(os.path.join(d, "leaf.cnf"), "w").write(
        "[leaf]\n" + usage + "extendedKeyUsage = codeSigning\n" + san + issuer +
        "[foreign]\n" + usage + "extendedKeyUsage = codeSigning\n" + san + issuer +
        "[legacy]\n" + usage + "extendedKeyUsage = codeSigning\n" + san + legacy +
        "[noeku]\n" + usage + "extendedKeyUsage = clientAuth\n" + san + issuer)
    for leaf, ca in [("leaf", "ca"), ("foreign", "otherca"), ("legacy", "ca"), ("noeku", "ca")]:
        run("openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", leaf + ".key")
        run("openssl", "req", "-new", "-key", leaf + ".key", "-subj", "/O=packsync-test", "-out", leaf + ".csr")
        run("openssl", "x509", "-req", "-in", leaf + ".csr", "-CA", ca + ".pem", "-CAkey", ca + ".key",
            "-set_serial", "7", "-days", "1", "-sha384", "-extfile", "leaf.cnf", "-extensions", leaf,
            "-out", leaf + ".pem")
    for k in ["log", "otherlog"]:
        run("openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", k + ".key")
    root = {"mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
        "tlogs": [{"baseUrl": "https://log.example", "hashAlgorithm": "SHA2_256",
            "publicKey": {"rawBytes": b64(spki("log.key")), "keyDetails": "PKIX_ECDSA_P256_SHA_256",
                "validFor": {"start": "2020-01-01T00:00:00Z"}},
            "logId": {"keyId": b64(hashlib.sha256(spki("log.key")).digest())}}],
        "certificateAuthorities": [{"subject": {"organization": "packsync-test", "commonName": "ca"},
            "uri": "https://ca.example", "certChain": {"certificates": [{"rawBytes": b64(der_of_pem("ca.pem"))}]},
            "validFor": {"start": "2020-01-01T00:00:00Z"}}],
        "ctlogs": [], "timestampAuthorities": []}
    json.dump(root, open(os.path.join(d, "trusted_root.json"), "w"), indent=2)
    sys.exit(0)
layout, subject, mode, place = sys.argv[3:7]
leaf = mode if mode in ["foreign", "legacy", "noeku"] else "leaf"
if mode == "keyed":
    # Signed with the key keys/ec.key; the entry names its public key.
    leaf = "../keys/ec"
    cert_pem = run("openssl", "pkey", "-in", leaf + ".key", "-pubout")
else:
    cert_pem = open(os.path.join(d, leaf + ".pem"), "rb").read()
ptype = "application/vnd.in-toto+json"
payload = json.dumps({"_type": "https://in-toto.io/Statement/v1",
    "subject": [{"name": "127.0.0.1/st2/packs", "digest": {"sha256": subject[7:]}}],
    "predicateType": "https://sigstore.dev/cosign/sign/v1", "predicate": {}}).encode()
pae = b"DSSEv1 %d %s %d " % (len(ptype), ptype.encode(), len(payload)) + payload
sig = sign(leaf + ".key", pae)
envelope = {"payload": b64(payload), "payloadType": ptype, "signatures": [{"sig": b64(sig), "keyid": ""}]}
hashed = hashlib.sha256(payload).hexdigest()
body = json.dumps({"apiVersion": "0.0.1", "kind": "dsse", "spec": {
    "envelopeHash": {"algorithm": "sha256", "value": hashlib.sha256(json.dumps(envelope).encode()).hexdigest()},
    "payloadHash": {"algorithm": "sha256", "value": hashed},
    "signatures": [{"signature": b64(sig), "verifier": b64(cert_pem)}]}}, separators=(",", ":")).encode()
# A tree of 7 entries, this one at index 4.
def H(b):
    return hashlib.sha256(b).digest()
leaves = [H(b"\x00" + (b"entry %d" % i)) for i in range(7)]
index = 4
leaves[index] = H(b"\x00" + body)
def mth(l):
    if len(l) == 1:
        return l[0]
    k = 1
    while k * 2 < len(l):
        k *= 2
    return H(b"\x01" + mth(l[:k]) + mth(l[k:]))
def path(l, i):
    if len(l) == 1:
        return []
    k = 1
    while k * 2 < len(l):
        k *= 2
    if i < k:
        return path(l[:k], i) + [mth(l[k:])]
    return path(l[k:], i - k) + [mth(l[:k])]
root_hash = mth(leaves)
proof = path(leaves, index)
if mode == "proof":
    proof[1] = bytes([proof[1][0] ^ 1]) + proof[1][1:]
log_id = hashlib.sha256(spki("log.key")).digest()
note = "log.example - 1234\n%d\n%s\n" % (len(leaves), b64(root_hash))
note_key = "otherlog.key" if mode == "checkpoint" else "log.key"
checkpoint = note + "\n\u2014 log.example " + b64(log_id[:4] + sign(note_key, note.encode())) + "\n"
now = int(time.time())
integrated = now + 2 * 86400 if mode == "expired" else now
canon = json.dumps({"body": b64(body), "integratedTime": integrated, "logID": log_id.hex(),
    "logIndex": 1000 + index}, sort_keys=True, separators=(",", ":")).encode()
entry = {"logIndex": str(1000 + index), "logId": {"keyId": b64(log_id)},
    "kindVersion": {"kind": "dsse", "version": "0.0.1"}, "integratedTime": str(integrated),
    "inclusionPromise": {"signedEntryTimestamp": b64(sign("log.key", canon))},
    "inclusionProof": {"logIndex": str(index), "rootHash": b64(root_hash), "treeSize": str(len(leaves)),
        "hashes": [b64(h) for h in proof], "checkpoint": {"envelope": checkpoint}},
    "canonicalizedBody": b64(body)}
if mode == "promise":
    del entry["inclusionProof"]
if mode == "nopromise":
    del entry["inclusionPromise"]
if mode == "body":
    entry["canonicalizedBody"] = b64(body.replace(hashed.encode(), b"0" * 64))
BUNDLE = "application/vnd.dev.sigstore.bundle.v0.3+json"
bundle = json.dumps({"mediaType": BUNDLE,
    "verificationMaterial": dict(
        [("publicKey", {"hint": "ec"})] if mode == "keyed" else
        [("x509CertificateChain", {"certificates": [{"rawBytes": b64(der_of_pem(leaf + ".pem"))},
            {"rawBytes": b64(der_of_pem("ca.pem"))}]})] if mode == "legacy" else
        [("certificate", {"rawBytes": b64(der_of_pem(leaf + ".pem"))})],
        tlogEntries=[] if mode == "nolog" else [entry]),
    "dsseEnvelope": envelope}).encode()
def put(data):
    h = hashlib.sha256(data).hexdigest()
    open(os.path.join(layout, "blobs", "sha256", h), "wb").write(data)
    return {"digest": "sha256:" + h, "size": len(data)}
layer = put(bundle)
layer["mediaType"] = BUNDLE
config = put(b"{}")
config["mediaType"] = "application/vnd.oci.empty.v1+json"
size = os.path.getsize(os.path.join(layout, "blobs", "sha256", subject[7:]))
OCI = "application/vnd.oci.image.manifest.v1+json"
m = put(json.dumps({"schemaVersion": 2, "mediaType": OCI, "artifactType": BUNDLE,
    "config": config, "layers": [layer],
    "subject": {"mediaType": OCI, "digest": subject, "size": size}}).encode())
m["mediaType"] = OCI
m["artifactType"] = BUNDLE
index_json = json.load(open(os.path.join(layout, "index.json")))
if place == "tag":
    ix = put(json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [m]}).encode())
    ix["mediaType"] = "application/vnd.oci.image.index.v1+json"
    ix["annotations"] = {"org.opencontainers.image.ref.name": subject.replace(":", "-")}
    index_json["manifests"].append(ix)
else:
    index_json["manifests"].append(m)
json.dump(index_json, open(os.path.join(layout, "index.json"), "w"))
"#;

fn world(f: &Fixture, args: &[&str]) {
    let out = Command::new("python3")
        .arg("-c")
        .arg(WORLD_PY)
        .arg(f.path("world"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "world.py {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The image layout of `trust_images::setup` and a Sigstore world beside it.
fn setup_world() -> Option<(Fixture, String)> {
    let (f, digest) = setup()?;
    fs::create_dir(f.path("world")).unwrap();
    world(&f, &["init", IDENTITY, EMAIL, ISSUER]);
    Some((f, digest))
}

/// A copy of the pristine layout, as `name`, with a bundle made in `mode`.
fn layout_with(f: &Fixture, digest: &str, name: &str, mode: &str) -> String {
    let dir = f.path(name);
    copy_dir(&f.path("layout"), &dir);
    world(
        f,
        &["bundle", dir.to_str().unwrap(), digest, mode, "subject"],
    );
    format!("oci-layout:{}:1.0", dir.display())
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let t = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &t);
        } else {
            fs::copy(e.path(), t).unwrap();
        }
    }
}

fn root_file(f: &Fixture) -> String {
    f.path("world/trusted_root.json")
        .to_str()
        .unwrap()
        .to_string()
}

/// `sync` with the trusted root and an identity and issuer.
fn keyless<'a>(root: &'a str, id: &'a str, iss: &'a str, src: &'a str) -> Vec<&'a str> {
    vec![
        "sync",
        "--grace",
        "0",
        "--trusted-root",
        root,
        "--certificate-identity",
        id,
        "--certificate-oidc-issuer",
        iss,
        src,
        "vol/packs",
    ]
}

#[test]
fn a_keyless_bundle_pushed_to_a_registry_lands_and_status_names_the_identity() {
    if !have(TOOLS) {
        return;
    }
    let Some((f, digest)) = setup_world() else {
        return;
    };
    let reg = Registry::start(Auth::None);
    let layout = f.path("layout");
    world(
        &f,
        &["bundle", layout.to_str().unwrap(), &digest, "good", "tag"],
    );
    reg.push(&layout, "1.0", "st2/packs", None);
    reg.push(
        &layout,
        &format!("sha256-{}", &digest[7..]),
        "st2/packs",
        None,
    );
    let src = format!("oci://{}/st2/packs:1.0", reg.host());
    let root = root_file(&f);
    f.packsync(&keyless(&root, IDENTITY, ISSUER, &src)).ok();
    assert_eq!(tree(&f.dest()), ["packs/", "packs/core.yaml=core v1"]);
    let label = format!("keyless:{ISSUER}:{IDENTITY}");
    let status = f.packsync(&["status", "vol/packs"]).ok();
    assert!(status.stdout.contains(&label), "{}", status.stdout);
    let json = f.packsync(&["status", "--json", "vol/packs"]).ok();
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(
        v["live"]["verified"][0]["key"].as_str(),
        Some(label.as_str()),
        "{v}"
    );
    // The same bundle for the other SAN (the email) verifies too; a second
    // sync is up to date.
    let again = f.packsync(&keyless(&root, IDENTITY, ISSUER, &src)).ok();
    assert!(again.stdout.contains("up to date"), "{}", again.stdout);
    // The flags from the environment, as every other flag.
    let out = f
        .command(&["sync", "--grace", "0", &src, "vol/packs"])
        .env("PACKSYNC_TRUSTED_ROOT", &root)
        .env("PACKSYNC_CERTIFICATE_IDENTITY", EMAIL)
        .env("PACKSYNC_CERTIFICATE_OIDC_ISSUER", ISSUER)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = f.packsync(&["status", "--json", "vol/packs"]).ok();
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(
        v["live"]["verified"][0]["key"].as_str(),
        Some(format!("keyless:{ISSUER}:{EMAIL}").as_str()),
        "{v}"
    );
}

#[test]
fn a_keyless_bundle_with_only_its_signed_entry_timestamp_lands() {
    let Some((f, digest)) = setup_world() else {
        return;
    };
    let src = layout_with(&f, &digest, "promise", "promise");
    f.packsync(&keyless(&root_file(&f), EMAIL, ISSUER, &src))
        .ok();
    assert_eq!(tree(&f.dest()), ["packs/", "packs/core.yaml=core v1"]);
}

#[test]
fn a_certificate_chain_with_the_legacy_issuer_extension_lands() {
    let Some((f, digest)) = setup_world() else {
        return;
    };
    let src = layout_with(&f, &digest, "legacy", "legacy");
    let root = root_file(&f);
    f.refused(
        &keyless(&root, IDENTITY, "https://token.actions.example", &src),
        6,
        &format!("issuer: the certificate's OIDC issuer is {ISSUER}, not"),
    );
    f.packsync(&keyless(&root, IDENTITY, ISSUER, &src)).ok();
    assert_eq!(tree(&f.dest()), ["packs/", "packs/core.yaml=core v1"]);
}

#[test]
fn each_keyless_failure_is_exit_6_and_changes_nothing() {
    let Some((f, digest)) = setup_world() else {
        return;
    };
    published_unverified(&f);
    let root = root_file(&f);
    let good = layout_with(&f, &digest, "good", "good");
    f.refused(
        &keyless(&root, "someone@example.com", ISSUER, &good),
        6,
        &format!("{good}: referrer sha256:"),
    );
    f.refused(
        &keyless(&root, "someone@example.com", ISSUER, &good),
        6,
        &format!("identity: the certificate is for {IDENTITY}, {EMAIL}, not --certificate-identity someone@example.com"),
    );
    f.refused(
        &keyless(&root, IDENTITY, "https://accounts.example", &good),
        6,
        &format!("issuer: the certificate's OIDC issuer is {ISSUER}, not --certificate-oidc-issuer https://accounts.example"),
    );
    let cases = [
        ("foreign", "chain: the certificate (issued by CN=otherca,O=packsync-test) does not chain to a certificate authority of the trusted root"),
        ("expired", "time: the certificate is valid from"),
        ("body", "the log entry: its payload hash is not this signature's"),
        ("proof", "inclusion proof: its hashes do not lead to its root hash"),
        ("checkpoint", "checkpoint signature: not by the key of log log.example - 1234"),
        ("nolog", "the bundle has no transparency log entry"),
        ("noeku", "the certificate has no codeSigning extended key usage"),
        // A proof and its checkpoint, but no signed entry timestamp: the
        // integrated time is the bundle's word only.
        ("nopromise", "time: the log entry's integrated time is not signed"),
    ];
    for (mode, needle) in cases {
        let src = layout_with(&f, &digest, mode, mode);
        let run = f.refused(&keyless(&root, IDENTITY, ISSUER, &src), 6, needle);
        assert!(
            run.stderr.trim().lines().count() == 1 && run.stderr.contains(&src),
            "{mode}: {}",
            run.stderr
        );
    }
    // No bundle at all: where it looked.
    f.refused(
        &keyless(&root, IDENTITY, ISSUER, &layout_src(&f)),
        6,
        "no cosign signature",
    );
}

#[test]
fn a_bad_trusted_root_or_half_an_identity_is_exit_2() {
    let Some((f, _)) = setup_world() else {
        return;
    };
    published_unverified(&f);
    let src = layout_src(&f);
    fs::write(
        f.path("bad.json"),
        "{\"tlogs\": [{\"publicKey\": {\"rawBytes\": \"!!\"}, \"logId\": {\"keyId\": \"AA==\"}}]}",
    )
    .unwrap();
    let bad = f.path("bad.json").to_str().unwrap().to_string();
    f.refused(
        &keyless(&bad, IDENTITY, ISSUER, &src),
        2,
        &format!("{bad}: bad --trusted-root: tlogs[0].publicKey.rawBytes is not base64"),
    );
    let missing = f.path("missing.json").to_str().unwrap().to_string();
    f.refused(
        &keyless(&missing, IDENTITY, ISSUER, &src),
        2,
        &format!("{missing}: cannot read --trusted-root"),
    );
    let root = root_file(&f);
    f.refused(
        &[
            "sync",
            "--trusted-root",
            &root,
            "--certificate-identity",
            IDENTITY,
            &src,
            "vol/packs",
        ],
        2,
        "--certificate-identity needs --certificate-oidc-issuer",
    );
    f.refused(
        &[
            "sync",
            "--certificate-identity",
            IDENTITY,
            "--certificate-oidc-issuer",
            ISSUER,
            &src,
            "vol/packs",
        ],
        2,
        "need --trusted-root FILE",
    );
    f.refused(
        &["sync", "--trusted-root", &root, &src, "vol/packs"],
        2,
        "--trusted-root needs --certificate-identity and --certificate-oidc-issuer",
    );
}

#[test]
fn a_bundle_source_under_keyless_only_is_exit_6() {
    let Some((f, _)) = setup_world() else {
        return;
    };
    f.file("src/a.rego", "package a\n");
    let root = root_file(&f);
    f.refused(
        &keyless(&root, IDENTITY, ISSUER, "src"),
        6,
        "src: keyless verification (--trusted-root) covers image SOURCEs only",
    );
}

#[test]
fn with_the_trusted_root_a_keyed_bundle_needs_its_log_entry() {
    let Some((f, digest)) = setup_world() else {
        return;
    };
    published_unverified(&f);
    let root = root_file(&f);
    let ec = crate::trust_images::key(&f, "ec");
    // A keyed bundle without a log entry: verified by the key alone, but
    // not with the trusted root.
    let bare = f.path("bare");
    copy_dir(&f.path("layout"), &bare);
    crate::trust_bundle_referrers::attach(&f, &bare, &digest, &digest, "ec", "subject");
    let bare = format!("oci-layout:{}:1.0", bare.display());
    let fp = crate::trust_bundles::openssl_fingerprint(&f.path("keys"), "ec");
    f.refused(
        &keyed_with_root(&ec, &root, &bare),
        6,
        &format!("signed by {fp}, but the bundle has no transparency log entry"),
    );
    f.packsync(&crate::trust_bundles::keyed(&ec, &bare)).ok();
    // Its log entry in the trusted root's log: it lands, named by the key.
    let good = layout_with(&f, &digest, "keyed", "keyed");
    f.packsync(&keyed_with_root(&ec, &root, &good)).ok();
    let json = f.packsync(&["status", "--json", "vol/packs"]).ok();
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(
        v["live"]["verified"][0]["key"].as_str(),
        Some(fp.as_str()),
        "{v}"
    );
}

fn keyed_with_root<'a>(key: &'a str, root: &'a str, src: &'a str) -> Vec<&'a str> {
    vec![
        "sync",
        "--grace",
        "0",
        "--verify-key",
        key,
        "--trusted-root",
        root,
        src,
        "vol/packs",
    ]
}
