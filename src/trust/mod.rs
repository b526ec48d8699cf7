//! Trust: whether a SOURCE was signed by a key the operator pins
//! (`--verify-key`), decided after the scan and before anything is staged
//! (an image: as soon as its digest is resolved, before any layer).
//! `key.rs` reads keys and checks raw signatures, `jws.rs` compact JWS
//! tokens, `canon.rs` OPA's canonical JSON, `opa.rs` a bundle's
//! `/.signatures.json`, `cosign.rs` an image's cosign signature (its legacy tag), `sigstore.rs`
//! a Sigstore bundle attached to it as a referrer, `keyless.rs` a bundle's
//! certificate and transparency log entry against `--trusted-root`. A source that is not trusted is exit 6
//! (`error::Failure::Untrusted`), one line naming it and what was wrong.
//! Nothing here writes.

pub mod canon;
pub mod cosign;
pub mod dsse;
pub mod jws;
pub mod key;
pub mod keyless;
pub mod opa;
pub mod sigstore;

pub use key::Key;

use crate::error;
use crate::filter::Filter;
use crate::source::Source;
use crate::tree::Tree;

/// Whether SOURCE `label` is an image (its signatures are cosign's, not a
/// bundle's): told by the prefix the SOURCE was given with.
pub fn is_image(label: &str) -> bool {
    ["oci://", "oci-layout:", "oci-archive:", "docker-archive:"]
        .iter()
        .any(|p| label.starts_with(p))
}

/// Check one scanned source's bundle signature; the fingerprint of the
/// key that verified it, or exit 6 naming the source.
pub fn check(
    source: &dyn Source,
    tree: &Tree,
    keys: &[Key],
    filter: &Filter,
) -> anyhow::Result<String> {
    if is_image(source.label()) {
        // Checked when its digest was resolved, before any layer came.
        return source.verified_by().ok_or_else(|| {
            error::untrusted(format!(
                "{}: its cosign signature was not checked",
                source.label()
            ))
        });
    }
    if keys.is_empty() {
        return Err(error::untrusted(format!(
            "{}: keyless verification (--trusted-root) covers image SOURCEs only; a bundle's \
             /.signatures.json needs --verify-key",
            source.label()
        )));
    }
    opa::check(source, tree, keys, filter)
        .map_err(|m| error::untrusted(format!("{}: {m}", source.label())))
}

/// `check`, for a source that lists a directory at a time (a directory,
/// or a spool once it is filled): a bundle's signature checked with no
/// tree held (`opa::check_listed`), the same verdict and line.
pub fn check_listed(
    source: &dyn Source,
    keys: &[Key],
    filter: &Filter,
    reporter: &dyn crate::report::Reporter,
) -> anyhow::Result<String> {
    if is_image(source.label()) || keys.is_empty() {
        return check(source, &Tree::default(), keys, filter);
    }
    opa::check_listed(source, keys, filter, reporter)?
        .map_err(|m| error::untrusted(format!("{}: {m}", source.label())))
}
