//! `--verify-key` on images signed as cosign v2.4+ (`--new-bundle-format`)
//! and v3 sign them: a Sigstore bundle (v0.3) attached to the image as an
//! OCI 1.1 referrer (a manifest whose `subject` is the image, whose
//! `artifactType` and one layer are the bundle). The bundle is made here as
//! cosign makes it with a key: a DSSE envelope over an in-toto statement
//! (`predicateType` `https://sigstore.dev/cosign/sign/v1`) whose subject is
//! the image manifest digest, the DSSE PAE signed by `openssl dgst -sha256
//! -sign` with an ECDSA P-256 key (DER, base64). A user checks: a bundle by
//! the key lands and `status` names it; a statement for another image, a
//! signature by another key, a payload altered after signing, and no
//! signature in either place are exit 6 with the volume untouched.

use std::path::Path;
use std::process::Command;

use crate::fixture::Fixture;
use crate::source_oci::{have, tree, Auth, Registry, TOOLS};
use crate::trust_bundles::{keyed, openssl_fingerprint};
use crate::trust_images::{key, layout_src, published_unverified, setup};

/// `bundle.py LAYOUT SUBJECT NAMED KEY MODE`: add to LAYOUT a referrer of
/// the image manifest SUBJECT whose bundle's statement names NAMED, signed
/// with KEY. MODE `subject`: the referrer is an `index.json` entry (what
/// `oras`/cosign write into a layout); `tag`: an index of referrers tagged
/// `sha256-HEX` (the referrers tag fallback, for a push); `tamper`: as
/// `subject`, the statement changed after signing (another subject added).
/// Prints the referrer manifest's digest.
const BUNDLE_PY: &str = r#"
import hashlib, json, os, subprocess, sys, base64
root, subject, named, key, mode = sys.argv[1:6]
BUNDLE = "application/vnd.dev.sigstore.bundle.v0.3+json"
def put(data):
    d = hashlib.sha256(data).hexdigest()
    open(os.path.join(root, "blobs", "sha256", d), "wb").write(data)
    return {"digest": "sha256:" + d, "size": len(data)}
def statement(digests):
    return json.dumps({"_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": "127.0.0.1/st2/packs", "digest": {"sha256": d[7:]}} for d in digests],
        "predicateType": "https://sigstore.dev/cosign/sign/v1", "predicate": {}}).encode()
ptype = "application/vnd.in-toto+json"
payload = statement([named])
pae = b"DSSEv1 %d %s %d " % (len(ptype), ptype.encode(), len(payload)) + payload
tmp = os.path.join(os.path.dirname(key), "pae")
open(tmp, "wb").write(pae)
sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", key, tmp], capture_output=True, check=True).stdout
if mode == "tamper":
    payload = statement([named, "sha256:" + "1" * 64])
bundle = json.dumps({"mediaType": BUNDLE,
    "verificationMaterial": {"publicKey": {"hint": "packsync-test"}, "tlogEntries": []},
    "dsseEnvelope": {"payload": base64.b64encode(payload).decode(), "payloadType": ptype,
        "signatures": [{"sig": base64.b64encode(sig).decode(), "keyid": ""}]}}).encode()
layer = put(bundle)
layer["mediaType"] = BUNDLE
config = put(b"{}")
config["mediaType"] = "application/vnd.oci.empty.v1+json"
size = os.path.getsize(os.path.join(root, "blobs", "sha256", subject[7:]))
OCI = "application/vnd.oci.image.manifest.v1+json"
m = put(json.dumps({"schemaVersion": 2, "mediaType": OCI, "artifactType": BUNDLE,
    "config": config, "layers": [layer],
    "subject": {"mediaType": OCI, "digest": subject, "size": size},
    "annotations": {"dev.sigstore.bundle.content": "dsse-envelope",
        "dev.sigstore.bundle.predicateType": "https://sigstore.dev/cosign/sign/v1"}}).encode())
m["mediaType"] = OCI
m["artifactType"] = BUNDLE
index = json.load(open(os.path.join(root, "index.json")))
if mode == "tag":
    ix = put(json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [m]}).encode())
    ix["mediaType"] = "application/vnd.oci.image.index.v1+json"
    ix["annotations"] = {"org.opencontainers.image.ref.name": subject.replace(":", "-")}
    index["manifests"].append(ix)
else:
    index["manifests"].append(m)
# Published as a registry does: whole, by rename (a sidecar may be
# reading the index while this runs).
with open(os.path.join(root, "index.json.tmp"), "w") as tmp:
    json.dump(index, tmp)
os.replace(os.path.join(root, "index.json.tmp"), os.path.join(root, "index.json"))
print(m["digest"])
"#;

/// Attach a bundle referring to `subject` whose statement names `named`,
/// signed with keys/KEY.key; the referrer's digest.
pub(crate) fn attach(
    f: &Fixture,
    layout: &Path,
    subject: &str,
    named: &str,
    key: &str,
    mode: &str,
) -> String {
    let out = Command::new("python3")
        .arg("-c")
        .arg(BUNDLE_PY)
        .arg(layout)
        .arg(subject)
        .arg(named)
        .arg(f.path(&format!("keys/{key}.key")))
        .arg(mode)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bundle.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn a_bundle_referrer_by_the_key_lands_and_status_names_it() {
    let Some((f, digest)) = setup() else { return };
    attach(&f, &f.path("layout"), &digest, &digest, "ec", "subject");
    let src = layout_src(&f);
    let (ec, ed) = (key(&f, "ec"), key(&f, "ed"));
    let args = [
        "sync",
        "--grace",
        "0",
        "--verify-key",
        &ed,
        "--verify-key",
        &ec,
        &src,
        "vol/packs",
    ];
    f.packsync(&args).ok();
    assert_eq!(tree(&f.dest()), ["packs/", "packs/core.yaml=core v1"]);
    let fp = openssl_fingerprint(&f.path("keys"), "ec");
    let status = f.packsync(&["status", "vol/packs"]).ok();
    assert!(status.stdout.contains(&fp), "{}", status.stdout);
    let json = f.packsync(&["status", "--json", "vol/packs"]).ok();
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(
        v["live"]["verified"][0]["key"].as_str(),
        Some(fp.as_str()),
        "{v}"
    );
    // Only the Ed25519 key: the bundle is by another key.
    f.refused(
        &keyed(&ed, &src),
        6,
        "DSSE signature(s) is by a --verify-key",
    );
}

#[test]
fn a_bundle_for_another_image_is_exit_6() {
    let Some((f, digest)) = setup() else { return };
    let other = format!("sha256:{}", "0".repeat(64));
    let referrer = attach(&f, &f.path("layout"), &digest, &other, "ec", "subject");
    published_unverified(&f);
    let fp = openssl_fingerprint(&f.path("keys"), "ec");
    f.refused(
        &keyed(&key(&f, "ec"), &layout_src(&f)),
        6,
        &format!(
            "referrer {}: the statement signed by {fp} names image {other}, not the published {digest}",
            &referrer[..19]
        ),
    );
}

#[test]
fn a_bundle_by_another_key_is_exit_6() {
    let Some((f, digest)) = setup() else { return };
    attach(&f, &f.path("layout"), &digest, &digest, "other", "subject");
    published_unverified(&f);
    f.refused(
        &keyed(&key(&f, "ec"), &layout_src(&f)),
        6,
        "none of its 1 DSSE signature(s) is by a --verify-key (signed by another key, or altered)",
    );
}

#[test]
fn a_statement_altered_after_signing_is_exit_6() {
    let Some((f, digest)) = setup() else { return };
    attach(&f, &f.path("layout"), &digest, &digest, "ec", "tamper");
    published_unverified(&f);
    f.refused(
        &keyed(&key(&f, "ec"), &layout_src(&f)),
        6,
        "none of its 1 DSSE signature(s) is by a --verify-key",
    );
}

#[test]
fn no_sig_tag_and_no_referrer_is_exit_6_naming_both_places() {
    let Some((f, digest)) = setup() else { return };
    published_unverified(&f);
    let src = layout_src(&f);
    let hex = &digest[7..];
    f.refused(
        &keyed(&key(&f, "ec"), &src),
        6,
        &format!(
            "{src}: no cosign signature (tag sha256-{hex}.sig) nor Sigstore bundle (referrers of {}, tag sha256-{hex}) in the layout's index.json",
            &digest[..19]
        ),
    );
}

#[test]
fn a_bundle_pushed_under_the_referrers_tag_fallback_lands_from_a_registry() {
    if !have(TOOLS) {
        return;
    }
    let Some((f, digest)) = setup() else { return };
    let reg = Registry::start(Auth::None);
    let layout = f.path("layout");
    reg.push(&layout, "1.0", "st2/packs", None);
    let src = format!("oci://{}/st2/packs:1.0", reg.host());
    let ec = key(&f, "ec");
    let hex = &digest[7..];
    f.refused(
        &keyed(&ec, &src),
        6,
        &format!("{src}: no cosign signature (tag sha256-{hex}.sig) nor Sigstore bundle"),
    );
    // The registry has no referrers API: the tag fallback was read.
    assert!(reg.requests("/referrers/") >= 1);
    assert_eq!(
        reg.requests("/blobs/"),
        0,
        "a layer was fetched before the check"
    );
    attach(&f, &layout, &digest, &digest, "ec", "tag");
    reg.push(&layout, &format!("sha256-{hex}"), "st2/packs", None);
    f.packsync(&keyed(&ec, &src)).ok();
    assert_eq!(tree(&f.dest()), ["packs/", "packs/core.yaml=core v1"]);
    let status = f.packsync(&["status", "vol/packs"]).ok();
    let fp = openssl_fingerprint(&f.path("keys"), "ec");
    assert!(status.stdout.contains(&fp), "{}", status.stdout);
}
