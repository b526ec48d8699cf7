//! `--verify-key` on images: cosign's legacy keyed signature (the image
//! manifest tagged `sha256-HEX.sig`, simple signing payload layers, the
//! signature in the `dev.cosignproject.cosign/signature` annotation), made
//! here as cosign makes it: the payload JSON for the image's manifest
//! digest, signed by `openssl dgst -sha256 -sign` with an ECDSA P-256 key
//! (DER, exactly cosign's form; P-384 and RSA likewise) or `openssl
//! pkeyutl -rawin` with Ed25519,
//! added to an OCI layout written by the test. A user checks: a signed
//! image lands and `status` names the key; no `.sig` tag, a payload naming
//! another digest, a signature by a key not given, a payload blob altered
//! after signing, a docker-archive: exit 6, the volume untouched.

use std::fs;
use std::path::Path;
use std::process::Command;

use crate::fixture::Fixture;
use crate::source_oci::{have, tree, write_layout, Auth, Registry, TOOLS};
use crate::trust_bundles::{keyed, keypair, openssl_fingerprint};

/// `sig.py LAYOUT TAGGED_DIGEST NAMED_DIGEST KEY KIND`: add to LAYOUT the
/// signature manifest tagged `sha256-HEX.sig` (HEX of TAGGED_DIGEST) whose
/// one payload names NAMED_DIGEST, signed with KEY (KIND `ec` or `ed`).
/// Prints the payload blob's digest.
pub(crate) const SIG_PY: &str = r#"
import hashlib, json, os, subprocess, sys, base64
root, tagged, named, key, kind = sys.argv[1:6]
def put(data):
    d = hashlib.sha256(data).hexdigest()
    open(os.path.join(root, "blobs", "sha256", d), "wb").write(data)
    return {"digest": "sha256:" + d, "size": len(data)}
payload = json.dumps({"critical": {"identity": {"docker-reference": "127.0.0.1/st2/packs"},
    "image": {"docker-manifest-digest": named}, "type": "cosign container image signature"},
    "optional": None}).encode()
tmp = os.path.join(os.path.dirname(key), "payload")
open(tmp, "wb").write(payload)
if kind == "ec":
    sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", key, tmp], capture_output=True, check=True).stdout
else:
    sig = subprocess.run(["openssl", "pkeyutl", "-sign", "-inkey", key, "-rawin", "-in", tmp], capture_output=True, check=True).stdout
p = put(payload)
p["mediaType"] = "application/vnd.dev.cosign.simplesigning.v1+json"
p["annotations"] = {"dev.cosignproject.cosign/signature": base64.b64encode(sig).decode()}
c = put(b"{}")
c["mediaType"] = "application/vnd.oci.image.config.v1+json"
m = put(json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": c, "layers": [p]}).encode())
m["mediaType"] = "application/vnd.oci.image.manifest.v1+json"
tag = tagged.replace(":", "-") + ".sig"
m["annotations"] = {"org.opencontainers.image.ref.name": tag}
index = json.load(open(os.path.join(root, "index.json")))
index["manifests"] = [x for x in index["manifests"]
    if x.get("annotations", {}).get("org.opencontainers.image.ref.name") != tag] + [m]
json.dump(index, open(os.path.join(root, "index.json"), "w"))
print(p["digest"])
"#;

pub(crate) fn image(marker: &str) -> String {
    format!(
        r#"[{{"tag":"1.0","platforms":[{{"os":"linux","arch":"amd64","layers":[
        {{"compression":"gzip","entries":[{{"name":"packs","type":"dir"}},
          {{"name":"packs/core.yaml","data":"core {marker}"}}]}}]}}]}}]"#
    )
}

/// Sign `named` under the tag of `tagged` in `layout` with keys/KEY.key; the payload's digest.
fn sign(f: &Fixture, layout: &Path, tagged: &str, named: &str, key: &str, kind: &str) -> String {
    let out = Command::new("python3")
        .arg("-c")
        .arg(SIG_PY)
        .arg(layout)
        .arg(tagged)
        .arg(named)
        .arg(f.path(&format!("keys/{key}.key")))
        .arg(kind)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "sig.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Keys `ec`, `other` (P-256), `p384` and `ed` (Ed25519) in keys/; an image tagged
/// 1.0 in layout/ (its manifest digest returned).
pub(crate) fn setup() -> Option<(Fixture, String)> {
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
        "p384",
        &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384"],
    );
    let digest = write_layout(&f.path("layout"), &image("v1"), "1.0").remove(0);
    Some((f, digest))
}

pub(crate) fn key(f: &Fixture, name: &str) -> String {
    f.path(&format!("keys/{name}.pub"))
        .to_str()
        .unwrap()
        .to_string()
}

pub(crate) fn layout_src(f: &Fixture) -> String {
    format!("oci-layout:{}:1.0", f.path("layout").display())
}

/// A generation published without keys (the volume the refusals must keep).
pub(crate) fn published_unverified(f: &Fixture) {
    f.packsync(&["sync", "--grace", "0", &layout_src(f), "vol/packs"])
        .ok();
}

#[test]
fn a_signed_layout_lands_and_status_names_the_key() {
    let Some((f, digest)) = setup() else { return };
    sign(&f, &f.path("layout"), &digest, &digest, "ec", "ec");
    let fp = openssl_fingerprint(&f.path("keys"), "ec");
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
    ];
    let mut first = args.to_vec();
    first.extend([src.as_str(), "vol/packs"]);
    f.packsync(&first).ok();
    assert_eq!(tree(&f.dest()), ["packs/", "packs/core.yaml=core v1"]);
    let status = f.packsync(&["status", "vol/packs"]).ok();
    assert!(status.stdout.contains(&fp), "{}", status.stdout);
    let json = f.packsync(&["status", "--json", "vol/packs"]).ok();
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(
        v["live"]["verified"][0]["key"].as_str(),
        Some(fp.as_str()),
        "{v}"
    );
    // The same digest and keys: up to date, nothing written.
    let again = f.unchanged_by(|| f.packsync(&first).ok());
    assert!(again.stdout.contains("up to date"), "{}", again.stdout);
    // The signature gone since: the no-op looks again, and refuses.
    let index = f.path("layout/index.json");
    let text = fs::read_to_string(&index).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["manifests"].as_array_mut().unwrap().retain(|m| {
        !m["annotations"]["org.opencontainers.image.ref.name"]
            .as_str()
            .unwrap_or("")
            .ends_with(".sig")
    });
    fs::write(&index, v.to_string()).unwrap();
    f.refused(&first, 6, "no cosign signature (tag sha256-");
}

#[test]
fn ed25519_and_rsa_signatures_land() {
    let Some((f, digest)) = setup() else { return };
    keypair(
        &f.path("keys"),
        "rsa",
        &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
    );
    let src = layout_src(&f);
    // Ed25519 over the payload itself; RSA PKCS#1 v1.5 over its SHA-256.
    for (name, kind, dest) in [("ed", "ed", "vol/ed"), ("rsa", "ec", "vol/rsa")] {
        sign(&f, &f.path("layout"), &digest, &digest, name, kind);
        let k = key(&f, name);
        f.packsync(&["sync", "--grace", "0", "--verify-key", &k, &src, dest])
            .ok();
        assert_eq!(tree(&f.path(dest)), ["packs/", "packs/core.yaml=core v1"]);
        let status = f.packsync(&["status", dest]).ok();
        let fp = openssl_fingerprint(&f.path("keys"), name);
        assert!(status.stdout.contains(&fp), "{name}: {}", status.stdout);
    }
}

#[test]
fn an_unsigned_image_is_exit_6_and_nothing_is_written() {
    let Some((f, digest)) = setup() else { return };
    let ec = key(&f, "ec");
    let src = layout_src(&f);
    let hex = digest.strip_prefix("sha256:").unwrap();
    let want = format!(
        "{src}: no cosign signature (tag sha256-{hex}.sig) nor Sigstore bundle (referrers of {}, \
         tag sha256-{hex}) in the layout's index.json",
        &digest[..19]
    );
    // With no volume yet: nothing is made.
    f.refused(&keyed(&ec, &src), 6, &want);
    assert!(!f.path("vol/packs").exists());
    // Over a published generation: it and the state directory stay as they are.
    published_unverified(&f);
    f.refused(&keyed(&ec, &src), 6, &want);
}

#[test]
fn a_payload_naming_another_digest_is_exit_6() {
    let Some((f, digest)) = setup() else { return };
    let other = format!("sha256:{}", "0".repeat(64));
    sign(&f, &f.path("layout"), &digest, &other, "ec", "ec");
    published_unverified(&f);
    let ec = key(&f, "ec");
    let src = layout_src(&f);
    let fp = openssl_fingerprint(&f.path("keys"), "ec");
    f.refused(
        &keyed(&ec, &src),
        6,
        &format!("the signature by {fp} names image {other}, not the published {digest}"),
    );
}

#[test]
fn a_signature_by_a_key_not_given_is_exit_6() {
    let Some((f, digest)) = setup() else { return };
    sign(&f, &f.path("layout"), &digest, &digest, "other", "ec");
    published_unverified(&f);
    let (ec, ed) = (key(&f, "ec"), key(&f, "ed"));
    f.refused(
        &[
            "sync",
            "--grace",
            "0",
            "--verify-key",
            &ec,
            "--verify-key",
            &ed,
            &layout_src(&f),
            "vol/packs",
        ],
        6,
        "none of its 1 signature(s) is by a --verify-key",
    );
}

#[test]
fn a_payload_altered_after_signing_is_exit_6() {
    let Some((f, digest)) = setup() else { return };
    let payload = sign(&f, &f.path("layout"), &digest, &digest, "ec", "ec");
    // Another image's digest in the blob, under the signed blob's name.
    let blob = f
        .path("layout/blobs/sha256")
        .join(payload.strip_prefix("sha256:").unwrap());
    let text = fs::read_to_string(&blob).unwrap();
    fs::write(&blob, text.replace(&digest[7..17], "0000000000")).unwrap();
    published_unverified(&f);
    let ec = key(&f, "ec");
    f.refused(
        &keyed(&ec, &layout_src(&f)),
        6,
        "digest mismatch: the blob is",
    );
}

#[test]
fn a_docker_archive_has_nowhere_to_look_and_is_exit_6() {
    let Some((f, _)) = setup() else { return };
    if !have(&["skopeo"]) {
        return;
    }
    let tar = f.path("image.tar");
    let out = Command::new("skopeo")
        .args(["copy", "-q"])
        .arg(format!("oci:{}:1.0", f.path("layout").display()))
        .arg(format!("docker-archive:{}:st2/packs:1.0", tar.display()))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ec = key(&f, "ec");
    let src = format!("docker-archive:{}", tar.display());
    f.refused(
        &keyed(&ec, &src),
        6,
        "a docker-archive holds no tags of that form",
    );
}

#[test]
fn a_signed_image_in_a_registry_lands_and_an_unsigned_tag_is_refused() {
    if !have(TOOLS) || !have(&["openssl"]) {
        return;
    }
    let Some((f, digest)) = setup() else { return };
    let reg = Registry::start(Auth::None);
    let layout = f.path("layout");
    reg.push(&layout, "1.0", "st2/packs", None);
    let src = format!("oci://{}/st2/packs:1.0", reg.host());
    let ec = key(&f, "ec");
    let args = [
        "sync",
        "--grace",
        "0",
        "--verify-key",
        &ec,
        &src,
        "vol/packs",
    ];
    let hex = digest.strip_prefix("sha256:").unwrap();
    f.refused(
        &args,
        6,
        &format!(
            "{src}: no cosign signature (tag sha256-{hex}.sig) nor Sigstore bundle (referrers of {}, \
             tag sha256-{hex}) in st2/packs",
            &digest[..19]
        ),
    );
    assert_eq!(
        reg.requests("/blobs/"),
        0,
        "a layer was fetched before the check"
    );
    sign(&f, &layout, &digest, &digest, "ec", "ec");
    reg.push(&layout, &format!("sha256-{hex}.sig"), "st2/packs", None);
    f.packsync(&args).ok();
    assert_eq!(tree(&f.dest()), ["packs/", "packs/core.yaml=core v1"]);
    let status = f.packsync(&["status", "vol/packs"]).ok();
    let fp = openssl_fingerprint(&f.path("keys"), "ec");
    assert!(status.stdout.contains(&fp), "{}", status.stdout);
    // A verified no-op: the tag's manifest, the signature's manifest and
    // its one payload blob; no layer.
    let (manifests, blobs) = (reg.requests("/manifests/"), reg.requests("/blobs/"));
    let again = f.unchanged_by(|| f.packsync(&args).ok());
    assert!(again.stdout.contains("up to date"), "{}", again.stdout);
    assert_eq!(reg.requests("/manifests/") - manifests, 2);
    assert_eq!(reg.requests("/blobs/") - blobs, 1);
}

#[test]
fn an_index_signed_as_cosign_signs_a_tag_publishes_its_platform_image() {
    let Some((f, _)) = setup() else { return };
    let spec = r#"[{"tag":"2.0","platforms":[
        {"os":"linux","arch":"amd64","layers":[{"compression":"none","entries":[{"name":"amd","data":"a"}]}]},
        {"os":"linux","arch":"arm64","layers":[{"compression":"none","entries":[{"name":"arm","data":"b"}]}]}]}]"#;
    let layout = f.path("layout");
    let platforms = write_layout(&layout, spec, "2.0");
    let index: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(layout.join("index.json")).unwrap()).unwrap();
    let top = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == "2.0")
        .unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(top, platforms[0]);
    let src = format!("oci-layout:{}:2.0", layout.display());
    let ec = key(&f, "ec");
    let args = [
        "sync",
        "--grace",
        "0",
        "--platform",
        "linux/amd64",
        "--verify-key",
        &ec,
        &src,
        "vol/packs",
    ];
    // Unsigned: both places looked at are named.
    f.refused(
        &args,
        6,
        &format!(
            "no cosign signature (tag {}.sig for the index, nor {}.sig for the platform's image)",
            top.replace(':', "-"),
            platforms[0].replace(':', "-")
        ),
    );
    // A signature over the index (what `cosign sign IMAGE:2.0` makes).
    sign(&f, &layout, &top, &top, "ec", "ec");
    f.packsync(&args).ok();
    assert_eq!(tree(&f.dest()), ["amd=a"]);
}

#[test]
fn a_p384_signature_and_an_oci_archive_land() {
    let Some((f, digest)) = setup() else { return };
    // `openssl dgst -sha256` with a P-384 key: what cosign makes with one.
    sign(&f, &f.path("layout"), &digest, &digest, "p384", "ec");
    let tar = f.path("image.tar");
    let out = Command::new("tar")
        .arg("-C")
        .arg(f.path("layout"))
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p384 = key(&f, "p384");
    let src = format!("oci-archive:{}:1.0", tar.display());
    f.packsync(&keyed(&p384, &src)).ok();
    assert_eq!(tree(&f.dest()), ["packs/", "packs/core.yaml=core v1"]);
    let status = f.packsync(&["status", "vol/packs"]).ok();
    let fp = openssl_fingerprint(&f.path("keys"), "p384");
    assert!(status.stdout.contains(&fp), "{}", status.stdout);
    // The same archive, another key: exit 6, naming where it looked.
    let ec = key(&f, "ec");
    f.refused(
        &keyed(&ec, &src),
        6,
        &format!(
            "{src}: sha256-{}.sig: none of its 1 signature(s) is by a --verify-key",
            &digest[7..]
        ),
    );
}

/// The live generation's name and the key its `verified` record names
/// (the first), as `status --json` shows them.
pub(crate) fn live_key(f: &Fixture) -> (String, Option<String>) {
    let json = f.packsync(&["status", "--json", "vol/packs"]).ok();
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let live = &v["live"];
    (
        live["generation"].as_str().unwrap().to_string(),
        live["verified"][0]["key"].as_str().map(str::to_string),
    )
}

/// One tree published without the key and then with it: two generations,
/// the second naming the key; up to date with the key and without it; an
/// update signed by the key lands naming it again, and one whose
/// signature names another digest is refused with the volume untouched.
#[test]
fn a_verified_generation_is_its_own_and_a_signed_update_keeps_the_key() {
    let Some((f, digest)) = setup() else { return };
    sign(&f, &f.path("layout"), &digest, &digest, "ec", "ec");
    let fp = openssl_fingerprint(&f.path("keys"), "ec");
    let src = layout_src(&f);
    let ec = key(&f, "ec");
    published_unverified(&f);
    let (unverified, none) = live_key(&f);
    assert_eq!(none, None);
    f.packsync(&keyed(&ec, &src)).ok();
    let (verified, named) = live_key(&f);
    assert_ne!(
        verified, unverified,
        "the same tree verified is another generation"
    );
    assert_eq!(named.as_deref(), Some(fp.as_str()));
    let again = f.unchanged_by(|| f.packsync(&keyed(&ec, &src)).ok());
    assert!(again.stdout.contains("up to date"), "{}", again.stdout);
    let plain = f.unchanged_by(|| {
        f.packsync(&["sync", "--grace", "0", &src, "vol/packs"])
            .ok()
    });
    assert!(plain.stdout.contains("up to date"), "{}", plain.stdout);

    let v2 = write_layout(&f.path("layout"), &image("v2"), "1.0").remove(0);
    sign(&f, &f.path("layout"), &v2, &v2, "ec", "ec");
    f.packsync(&keyed(&ec, &src)).ok();
    assert_eq!(tree(&f.dest()), ["packs/", "packs/core.yaml=core v2"]);
    let (updated, named) = live_key(&f);
    assert_ne!(updated, verified);
    assert_eq!(named.as_deref(), Some(fp.as_str()));

    let v3 = write_layout(&f.path("layout"), &image("v3"), "1.0").remove(0);
    sign(&f, &f.path("layout"), &v3, &v2, "ec", "ec");
    f.unchanged_by(|| f.refused(&keyed(&ec, &src), 6, &v3));
    assert_eq!(tree(&f.dest()), ["packs/", "packs/core.yaml=core v2"]);
}
