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

/// A bundle in a directory, checked over its listing (`check_listed`)
/// before it was staged, checked again over the tree a streamed stage made
/// of it (`out`, whose manifest body is `body` in `staging`), before
/// anything is published: a file changed in the directory between the two
/// listings is caught here, since what is checked now is what is
/// published. The tree is read as its body records it (the stage's own
/// account of what it wrote: each file's SHA-256 that of the bytes it
/// copied, or of the live file it linked, as a reuse is taken); only files
/// OPA hashes otherwise are read, from staging. The
/// same lines as `check`, naming `label`; `fingerprint`: the key that
/// verified it before, which must verify it again.
pub fn check_staged(
    label: &str,
    out: &crate::sys::DirFd,
    staging: &crate::sys::DirFd,
    fingerprint: &str,
    keys: &[Key],
    filter: &Filter,
) -> anyhow::Result<()> {
    use anyhow::Context;
    // What the stage freed goes back first: the signature's list is read
    // again now.
    crate::sys::release_free_memory();
    let shown = "the staged manifest body";
    let body = staging
        .open_read(b"body")
        .with_context(|| format!("cannot read {shown}"))?;
    let file = std::fs::File::from(body);
    let reread = Box::new(std::os::fd::OwnedFd::from(file.try_clone()?));
    let index = crate::index::Index::build(std::io::BufReader::new(file), reread, shown.into())?;
    let root = out.reopen().context("cannot reopen the staged tree")?;
    let view = Staged {
        dir: crate::source::Dir::new(root, label.to_string()),
        index,
    };
    let quiet = crate::report::Collected::default();
    let fp = opa::check_listed(&view, keys, filter, &quiet)?
        .map_err(|m| error::untrusted(format!("{label}: {m}")))?;
    if fp != fingerprint {
        return Err(error::untrusted(format!(
            "{label}: /.signatures.json changed while it was synced"
        )));
    }
    Ok(())
}

/// A staged tree as the bundle `check_staged` checks: its entries as its
/// manifest body records them (each file's SHA-256 that of the bytes the
/// stage wrote, or of the live file it linked), its files read from it.
struct Staged {
    dir: crate::source::Dir,
    index: crate::index::Index,
}

impl Source for Staged {
    fn label(&self) -> &str {
        self.dir.label()
    }

    fn path(&self) -> Option<&std::path::Path> {
        None
    }

    fn identity(&self) -> String {
        self.dir.label().to_string()
    }

    fn scan(
        &self,
        src: u16,
        filter: &Filter,
        reporter: &dyn crate::report::Reporter,
    ) -> anyhow::Result<Tree> {
        self.dir.scan(src, filter, reporter)
    }

    fn root(&self) -> Option<&crate::sys::DirFd> {
        self.dir.root()
    }

    fn lists_by_directory(&self) -> bool {
        true
    }

    /// The directory's entries as the stage wrote them (its body's lines,
    /// the tree it made is private to this writer): nothing is listed or
    /// statted again.
    fn list(
        &self,
        _: &crate::sys::DirFd,
        rel: &[u8],
        src: u16,
        _: &Filter,
        _: &dyn crate::report::Reporter,
    ) -> anyhow::Result<Vec<crate::tree::Entry>> {
        let mut entries = self.index.entries(rel)?;
        for e in entries.iter_mut() {
            if let crate::tree::Node::File(f) = &mut e.node {
                f.src = src;
            }
        }
        Ok(entries)
    }

    fn open_file(&self, path: &[u8]) -> std::io::Result<std::os::fd::OwnedFd> {
        self.dir.open_file(path)
    }
}
