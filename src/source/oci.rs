//! Image sources: `oci://HOST[:PORT]/REPO[:TAG][@sha256:…]` (a registry),
//! `oci-layout:DIR[:TAG]` (an OCI image layout on disk), and
//! `oci-archive:FILE[:TAG]`, `docker-archive:FILE[:REF]` (an image saved
//! as a tar: `oci_archive.rs`). The root
//! filesystem of the image is its layers applied in order, with OCI
//! whiteouts, into the spool (`spool::Spool::apply`); each layer is checked
//! for size and digest as it streams (`oci_fetch`). The identity a
//! generation records is the image manifest's digest
//! (`oci://HOST/REPO@sha256:…`): a tag that still resolves to it is "up to
//! date" after one request, with no blob fetched (`unchanged_since`).
//!
//! The manifest also keeps what the image applied (`Record`: the layer
//! digests in order, the platform, the `//PATH`, and the options that
//! shaped the tree). When the next image's layers begin with those, only
//! the layers above are fetched, onto a spool seeded with the live tree
//! (`Source::resume`, `Spool::seed`): a new top layer costs its own bytes.

use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use anyhow::Result;

use super::chunked;
use super::oci_artifact::{self, Planned, Use};
use super::oci_fetch::{self, Layout, Registry, Resolved, Sink};
use super::oci_image;
use super::oci_ref;
use super::spool::Base;
use super::store::{self, Store};
use super::{LiveBase, Source, Spool, Stream, Streamed};
use crate::config::{Choose, Platform, Remote};
use crate::error;
use crate::escape::{percent, unpercent};
use crate::filter::Filter;
use crate::report::Reporter;
use crate::sys::DirFd;
use crate::tree::{Entry, Meta, Time, Tree};

/// A stream that names its content (an image digest, a URL's validators,
/// an archive's SHA-256) and can tell, with one request or one read of the
/// file, whether it still holds what a recorded identity names.
pub trait Named: Stream {
    fn unchanged_since(&self, recorded: &str) -> Result<bool>;

    /// `Source::chosen`.
    fn chosen(&self) -> Result<Option<(String, String)>> {
        Ok(None)
    }

    /// `Source::version`.
    fn version(&self) -> Result<Option<String>> {
        Ok(None)
    }

    /// `Source::version_in_spool`: a bundle (an archive, a URL) whose
    /// `.manifest` is read from the spool.
    fn version_in_spool(&self) -> bool {
        false
    }

    /// `Source::record`, given the filled spool.
    fn record(&self, spooled: &super::Spooled, shape: &str) -> Option<String> {
        let _ = (spooled, shape);
        None
    }

    /// `Source::resume`.
    fn resume(&self, record: &str, shape: &str, base: &LiveBase<'_>) -> Result<bool> {
        let _ = (record, shape, base);
        Ok(false)
    }

    /// `Source::verified_by`.
    fn verified_by(&self) -> Option<String> {
        None
    }

    /// `Source::lend`.
    fn lend(&self, base: &LiveBase<'_>, borrow: bool) -> Result<()> {
        let _ = (base, borrow);
        Ok(())
    }
}

impl Named for Image {
    fn lend(&self, base: &LiveBase<'_>, borrow: bool) -> Result<()> {
        self.identity()?;
        let layers = {
            let mut r = self.resolved.lock().unwrap();
            oci_fetch::layers(&*self.store, r.as_mut().expect("resolved"))?
        };
        if self.plan(&layers)?.is_some() || !layers.iter().any(chunked::has_toc) {
            return Ok(());
        }
        if let Some((index, Some(live))) = base() {
            let prefix = self.subpath.clone().unwrap_or_default();
            let lend = borrow.then_some(&prefix[..]);
            *self.donor.lock().unwrap() = Some(chunked::Donor::of(&index, live, lend)?);
        }
        Ok(())
    }

    fn verified_by(&self) -> Option<String> {
        self.trust.verified.lock().unwrap().clone()
    }

    fn unchanged_since(&self, recorded: &str) -> Result<bool> {
        Image::unchanged_since(self, recorded)
    }

    fn chosen(&self) -> Result<Option<(String, String)>> {
        if self.choose.is_none() {
            return Ok(None);
        }
        self.identity()?;
        let tag = self.chosen.lock().unwrap().clone();
        let digest = self
            .resolved
            .lock()
            .unwrap()
            .as_ref()
            .map(|r| r.digest.clone());
        Ok(tag.zip(digest))
    }

    fn version(&self) -> Result<Option<String>> {
        Image::version(self)
    }

    fn record(&self, spooled: &super::Spooled, shape: &str) -> Option<String> {
        let layers = self.applied.lock().unwrap().clone()?;
        Some(
            Record {
                base: self.base.clone(),
                subpath: self.subpath.clone(),
                platform: self.platform.to_string(),
                shape: shape.to_string(),
                newest: spooled.newest(),
                root_given: spooled.root_given().ok()?,
                layers,
            }
            .to_string(),
        )
    }

    fn resume(&self, record: &str, shape: &str, base: &LiveBase<'_>) -> Result<bool> {
        let Some(rec) = Record::parse(record) else {
            return Ok(false);
        };
        if rec.base != self.base
            || rec.subpath != self.subpath
            || rec.platform != self.platform.to_string()
            || rec.shape != shape
        {
            return Ok(false);
        }
        self.identity()?;
        let layers = {
            let mut r = self.resolved.lock().unwrap();
            oci_fetch::layers(&*self.store, r.as_mut().expect("resolved"))?
        };
        if self.plan(&layers)?.is_some() {
            return Ok(false);
        }
        let below = rec.layers.len() <= layers.len()
            && rec.layers.iter().zip(&layers).all(|(a, b)| *a == b.digest);
        if !below {
            return Ok(false);
        }
        let Some((index, live)) = base() else {
            return Ok(false);
        };
        *self.resume.lock().unwrap() = Some((
            Base {
                index,
                newest: rec.newest,
                root_given: rec.root_given,
                live,
            },
            rec.layers.len(),
        ));
        Ok(true)
    }
}

/// What a generation made from an image keeps in its manifest (a `layers`
/// line), read back as hostile (it comes from the volume):
/// `oci-layers 1 BASE SUBPATH PLATFORM SHAPE NEWEST ROOT DIGEST...`, each
/// field escaped as manifest paths are; SUBPATH `-` or `//PATH`; ROOT `0`
/// or `1`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// `oci://HOST/REPO` or `oci-layout:DIR`.
    pub base: String,
    pub subpath: Option<Vec<u8>>,
    pub platform: String,
    pub shape: String,
    /// The spool's newest mtime (`Spooled::newest`).
    pub newest: Time,
    /// Whether the layers gave the root its metadata (`Spooled::root_given`).
    pub root_given: bool,
    /// The layer digests applied, in order.
    pub layers: Vec<String>,
}

const RECORD_MAGIC: &str = "oci-layers";
/// More layers than any registry takes (Docker's limit is 127).
const MAX_RECORDED_LAYERS: usize = 1024;

impl std::fmt::Display for Record {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sub = match &self.subpath {
            Some(p) => format!("//{}", percent(p)),
            None => "-".into(),
        };
        write!(
            f,
            "{RECORD_MAGIC} 1 {} {sub} {} {} {}.{:09} {}",
            percent(self.base.as_bytes()),
            percent(self.platform.as_bytes()),
            percent(self.shape.as_bytes()),
            { self.newest.s },
            { self.newest.ns },
            self.root_given as u8
        )?;
        for l in &self.layers {
            write!(f, " {}", percent(l.as_bytes()))?;
        }
        Ok(())
    }
}

impl Record {
    /// The record `text` holds, or `None` for anything else (another
    /// version, a malformed field): that only costs the shortcut.
    pub fn parse(text: &str) -> Option<Record> {
        if text.len() > crate::manifest::MAX_LAYERS_RECORD {
            return None;
        }
        let mut t = text.split(' ');
        if t.next()? != RECORD_MAGIC || t.next()? != "1" {
            return None;
        }
        let field = |s: &str| String::from_utf8(unpercent(s).ok()?).ok();
        let base = field(t.next()?)?;
        let subpath = match t.next()? {
            "-" => None,
            s => Some(unpercent(s.strip_prefix("//")?).ok()?),
        };
        let platform = field(t.next()?)?;
        let shape = field(t.next()?)?;
        let (s, ns) = t.next()?.split_once('.')?;
        let newest = Time {
            s: s.parse().ok()?,
            ns: ns
                .parse()
                .ok()
                .filter(|&n: &u32| n < 1_000_000_000 && ns.len() == 9)?,
        };
        let root_given = match t.next()? {
            "0" => false,
            "1" => true,
            _ => return None,
        };
        let mut layers = Vec::new();
        for l in t {
            if layers.len() == MAX_RECORDED_LAYERS || !is_digest(l) {
                return None;
            }
            layers.push(l.to_string());
        }
        Some(Record {
            base,
            subpath,
            platform,
            shape,
            newest,
            root_given,
            layers,
        })
    }
}

/// `ALGORITHM:HEX` as the OCI image spec writes a digest.
fn is_digest(s: &str) -> bool {
    let Some((alg, hex)) = s.split_once(':') else {
        return false;
    };
    !alg.is_empty()
        && alg.len() <= 32
        && alg
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+._-".contains(&b))
        && (32..=128).contains(&hex.len())
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl Named for super::http::Bundle {
    fn unchanged_since(&self, recorded: &str) -> Result<bool> {
        super::http::Bundle::unchanged_since(self, recorded)
    }

    fn version_in_spool(&self) -> bool {
        true
    }
}

impl Named for super::Archive {
    fn unchanged_since(&self, recorded: &str) -> Result<bool> {
        super::Archive::unchanged_since(self, recorded)
    }

    fn version_in_spool(&self) -> bool {
        true
    }
}

/// A kind that names its content (an image, a URL, an archive FILE by its
/// SHA-256) as a `Source`: spooled as `Streamed` does, and able to say it
/// is unchanged (`Source::unchanged_since`); the identity is then the one
/// recorded.
pub struct Fetched<S> {
    inner: Streamed<S>,
    unchanged: OnceLock<String>,
}

impl<S: Named> Fetched<S> {
    pub fn new(stream: S) -> Fetched<S> {
        Fetched {
            inner: Streamed::new(stream),
            unchanged: OnceLock::new(),
        }
    }
}

impl<S: Named> Source for Fetched<S> {
    fn label(&self) -> &str {
        self.inner.label()
    }

    fn path(&self) -> Option<&Path> {
        self.inner.path()
    }

    fn identity(&self) -> String {
        match self.unchanged.get() {
            Some(id) => id.clone(),
            None => self.inner.identity(),
        }
    }

    fn scan(&self, src: u16, filter: &Filter, reporter: &dyn Reporter) -> Result<Tree> {
        self.inner.scan(src, filter, reporter)
    }

    fn lists_by_directory(&self) -> bool {
        self.inner.lists_by_directory()
    }

    fn list(
        &self,
        fd: &DirFd,
        rel: &[u8],
        src: u16,
        filter: &Filter,
        reporter: &dyn Reporter,
    ) -> Result<Vec<Entry>> {
        self.inner.list(fd, rel, src, filter, reporter)
    }

    fn root_meta(&self, filter: &Filter) -> Result<Meta> {
        self.inner.root_meta(filter)
    }

    fn root(&self) -> Option<&DirFd> {
        self.inner.root()
    }

    fn open_file(&self, path: &[u8]) -> io::Result<OwnedFd> {
        self.inner.open_file(path)
    }

    fn streamed(&self) -> bool {
        true
    }

    fn spool(&self, at: &DirFd, name: &[u8], reporter: &dyn Reporter) -> Result<()> {
        self.inner.spool(at, name, reporter)
    }

    fn owns_root(&self) -> bool {
        self.inner.owns_root()
    }

    fn chosen(&self) -> Result<Option<(String, String)>> {
        self.inner.stream().chosen()
    }

    fn version(&self) -> Result<Option<String>> {
        match (self.inner.stream().version_in_spool(), self.inner.root()) {
            (true, Some(root)) => super::bundle_revision(root, self.label()),
            (true, None) => Ok(None),
            (false, _) => self.inner.stream().version(),
        }
    }

    fn version_in_spool(&self) -> bool {
        self.inner.stream().version_in_spool()
    }

    fn unchanged_since(&self, recorded: &str) -> Result<bool> {
        let same = self.inner.stream().unchanged_since(recorded)?;
        if same {
            let _ = self.unchanged.set(recorded.to_string());
        }
        Ok(same)
    }

    fn record(&self, shape: &str) -> Option<String> {
        let spooled = self.inner.filled()?;
        self.inner.stream().record(spooled, shape)
    }

    fn resume(&self, record: &str, shape: &str, base: &LiveBase<'_>) -> Result<bool> {
        self.inner.stream().resume(record, shape, base)
    }

    fn intact(&self, tree: &Tree) -> bool {
        self.inner
            .filled()
            .is_none_or(|s| !s.seeded() || s.intact(tree))
    }

    fn holds_all(&self) -> bool {
        self.inner.filled().is_none_or(|s| !s.incomplete())
    }

    fn why_not_intact(&self) -> Option<String> {
        let why = self.inner.filled()?.why_incomplete()?;
        Some(format!("{}: {why}", self.label()))
    }

    fn verified_by(&self) -> Option<String> {
        self.inner.stream().verified_by()
    }

    fn lend(&self, base: &LiveBase<'_>, borrow: bool) -> Result<()> {
        self.inner.stream().lend(base, borrow)
    }
}

/// An image in a registry or a layout, resolved at most once per sync.
pub struct Image {
    store: Box<dyn Store>,
    label: String,
    /// `oci://HOST/REPO` or `oci-layout:DIR` (DIR resolved): the identity
    /// is this, `@`, the manifest digest, and the `//PATH` taken.
    base: String,
    subpath: Option<Vec<u8>>,
    platform: Platform,
    path: Option<PathBuf>,
    resolved: Mutex<Option<Resolved>>,
    /// What the spool starts from and how many layers that stands for
    /// (`Source::resume`), until `fill` takes it.
    resume: Mutex<Option<(Base, usize)>>,
    /// The digests of every layer of the image, once `fill` ran.
    applied: Mutex<Option<Vec<String>>>,
    /// `--verify-key`: checked as soon as the digest is resolved.
    trust: crate::trust::cosign::Trust,
    /// `--semver`: the tag is chosen from the store's tags.
    choose: Option<Choose>,
    /// The tag `choose` chose, once resolved.
    chosen: Mutex<Option<String>>,
    /// `--layer-media-type`: the layers published (empty: every one that can be).
    select: Vec<String>,
    /// The live generation's files by content (`Source::lend`, or the
    /// base a resumed spool starts from): a zstd:chunked layer takes them
    /// from there instead of fetching them.
    donor: Mutex<Option<chunked::Donor>>,
}

/// `oci://…`: parsed now (a malformed reference is exit 2); nothing is
/// asked of the registry before the sync scans.
pub fn open_registry(arg: &str, remote: &Remote) -> Result<Image> {
    let r = oci_ref::parse(arg).map_err(|e| error::usage(format!("{arg}: {e:#}")))?;
    if remote.choose.is_some() && (r.tag.is_some() || r.digest.is_some()) {
        return Err(error::usage(format!(
            "{arg}: --semver chooses the tag: name the repository without a tag or digest"
        )));
    }
    let base = format!("oci://{}/{}", r.host, r.repo);
    let subpath = r.subpath.clone();
    let registry = Registry::new(r, arg.to_string(), remote)?;
    Ok(Image {
        choose: remote.choose.clone(),
        store: Box::new(registry),
        label: arg.to_string(),
        base,
        subpath,
        platform: platform_of(remote),
        path: None,
        resolved: Mutex::new(None),
        resume: Mutex::new(None),
        applied: Mutex::new(None),
        trust: crate::trust::cosign::Trust::of(remote),
        chosen: Mutex::new(None),
        select: remote.layer_media_types.clone(),
        donor: Mutex::new(None),
    })
}

/// `oci-archive:FILE[:TAG]` and `docker-archive:FILE[:NAME:TAG|:@N]`:
/// FILE must be an uncompressed tar of an image (exit 2 otherwise).
pub fn open_archive(arg: &str, remote: &Remote) -> Result<Image> {
    let parts = if arg.starts_with("oci-archive:") {
        super::oci_archive::open_oci(arg)?
    } else {
        super::oci_archive::open_docker(arg)?
    };
    Ok(Image {
        store: parts.store,
        label: arg.to_string(),
        base: parts.base,
        subpath: parts.subpath,
        platform: platform_of(remote),
        path: Some(parts.path),
        resolved: Mutex::new(None),
        resume: Mutex::new(None),
        applied: Mutex::new(None),
        trust: crate::trust::cosign::Trust::of(remote),
        choose: None,
        chosen: Mutex::new(None),
        select: remote.layer_media_types.clone(),
        donor: Mutex::new(None),
    })
}

/// `oci-layout:DIR[:TAG]`: DIR must be a layout (exit 2 otherwise).
pub fn open_layout(arg: &str, remote: &Remote) -> Result<Image> {
    let r = oci_ref::parse_layout(arg).map_err(|e| error::usage(format!("{arg}: {e:#}")))?;
    if remote.choose.is_some() && r.tag.is_some() {
        return Err(error::usage(format!(
            "{arg}: --semver chooses the tag: name the layout without a tag"
        )));
    }
    let subpath = r.subpath.clone();
    let layout = Layout::open(r, arg.to_string())?;
    let base = format!("oci-layout:{}", layout.path.display());
    let path = Some(layout.path.clone());
    Ok(Image {
        choose: remote.choose.clone(),
        store: Box::new(layout),
        label: arg.to_string(),
        base,
        subpath,
        platform: platform_of(remote),
        path,
        resolved: Mutex::new(None),
        resume: Mutex::new(None),
        applied: Mutex::new(None),
        trust: crate::trust::cosign::Trust::of(remote),
        chosen: Mutex::new(None),
        select: remote.layer_media_types.clone(),
        donor: Mutex::new(None),
    })
}

fn platform_of(remote: &Remote) -> Platform {
    remote
        .platform
        .clone()
        .unwrap_or_else(oci_image::running_platform)
}

impl Image {
    /// Apply `layer` from its TOC (zstd:chunked or eStargz), fetching only the files
    /// `donor` does not hold: `false` (one line where it is news) where
    /// the whole layer must be fetched instead, before the spool is touched.
    fn delta(
        &self,
        layer: &super::store::Descriptor,
        what: &str,
        donor: &chunked::Donor,
        spool: &mut Spool,
        reporter: &dyn Reporter,
    ) -> Result<bool> {
        let fetched = |n| reporter.fetched(n);
        let max = super::spool::max_entries();
        let checked = chunked::plan(&*self.store, layer, donor, max, &fetched)
            .and_then(|plan| Ok((chunked::fetch(&*self.store, layer, &plan, &fetched)?, plan)));
        let (got, plan) = match checked {
            Ok(p) => p,
            Err(w) => {
                if let Some(why) = w.why {
                    reporter.warn(&chunked::whole_line(what, &why));
                }
                return Ok(false);
            }
        };
        reporter.reused(plan.reused_bytes);
        let mut tar = chunked::Layer::new(plan, got, donor, &*self.store, layer, &fetched);
        let lent = tar.take_lent();
        if let (false, Some(prefix)) = (lent.is_empty(), donor.prefix()) {
            spool.lend(lent, donor.live(), prefix)?;
        }
        spool.apply(&mut tar, true, what, reporter)?;
        Ok(true)
    }

    /// The identity of the image manifest `digest`: with `--semver`, the
    /// tag chosen too (`oci://HOST/REPO:TAG@sha256:…`).
    fn identity_of(&self, digest: &str) -> String {
        let tag = match self.chosen.lock().unwrap().as_deref() {
            Some(t) => format!(":{t}"),
            None => String::new(),
        };
        let id = match &self.subpath {
            Some(p) => format!("{}{tag}@{digest}//{}", self.base, percent(p)),
            None => format!("{}{tag}@{digest}", self.base),
        };
        // Another selection of the same image is another tree.
        match self.select.is_empty() {
            true => id,
            false => format!("{id}#layers={}", self.select.join(",")),
        }
    }

    /// What the layers publish and how, or None for an image whose every
    /// layer is an image layer and no `--layer-media-type` was given (its
    /// generations record their layers and resume from them).
    fn plan(&self, layers: &[store::Descriptor]) -> Result<Option<Vec<Planned>>> {
        let plan = oci_artifact::plan(layers, &self.select)
            .map_err(|e| anyhow::anyhow!("{}: {e:#}", self.label))?;
        let image =
            self.select.is_empty() && plan.iter().all(|p| p.how == Use::Layer { whiteouts: true });
        Ok((!image).then_some(plan))
    }

    /// Fill the spool from an artifact's layers (`oci_artifact`): no
    /// record, no resume.
    fn fill_artifact(
        &self,
        image: &mut Resolved,
        plan: &[Planned],
        spool: &mut Spool,
        reporter: &dyn Reporter,
    ) -> Result<()> {
        let fetched = |n| reporter.fetched(n);
        let files = plan.iter().any(|p| matches!(p.how, Use::File(_)));
        let mtime = match files {
            true => {
                let (bytes, _) = self.store.document(image.desc())?;
                oci_image::created_annotation(&bytes).unwrap_or(0)
            }
            false => 0,
        };
        for (i, p) in plan.iter().enumerate() {
            let layer = &p.desc;
            let what = format!(
                "{} layer {} ({})",
                self.store.label(),
                i + 1,
                store::short(&layer.digest)
            );
            let (raw, stop) = self.store.blob(layer)?;
            let mut checked = oci_fetch::Checked::new(raw, layer, &fetched);
            match &p.how {
                Use::File(name) => {
                    let mut file =
                        oci_artifact::FileTar::new(name, layer.size, mtime, &mut checked);
                    spool.apply(&mut file, false, &what, reporter)?;
                }
                how => oci_fetch::pipelined_until(
                    &mut checked,
                    &what,
                    &|| stop.stop(),
                    oci_fetch::Checked::finish,
                    |plain| {
                        match how {
                            Use::Dir(name) => spool.apply_within(plain, name, &what, reporter),
                            Use::Layer { whiteouts } => {
                                spool.apply(plain, *whiteouts, &what, reporter)
                            }
                            Use::File(_) => unreachable!(),
                        }
                        .map(|_| ())
                    },
                )?,
            }
        }
        Ok(())
    }

    /// Resolve the reference once (one request to a registry; with
    /// `--semver`, the tag listing first).
    fn identity(&self) -> Result<String> {
        let mut r = self.resolved.lock().unwrap();
        if r.is_none() {
            let root = match &self.choose {
                None => self.store.root()?,
                Some(choose) => {
                    let tags = self.store.tags()?;
                    let chosen = crate::semver::choose(
                        tags.iter().map(String::as_str),
                        &choose.range,
                        choose.filter.as_ref(),
                    )
                    .map_err(|none| {
                        let filter = match &choose.filter {
                            Some(f) => format!(" and --tag-filter {:?}", f.as_str()),
                            None => String::new(),
                        };
                        anyhow::anyhow!(
                            "{}: no tag matches --semver {:?}{filter} ({none})",
                            self.label,
                            choose.range.to_string()
                        )
                    })?;
                    let root = self.store.root_tagged(&chosen.tag)?;
                    *self.chosen.lock().unwrap() = Some(chosen.tag);
                    root
                }
            };
            let resolved = oci_fetch::resolve_from(&*self.store, root, &self.platform)?;
            self.trust
                .check(&*self.store, &resolved.root, &resolved.digest)?;
            // What cannot be published is refused before anything is
            // spooled, where the manifest is at hand (else at `fill`).
            if let Some(layers) = resolved.known_layers() {
                self.plan(layers)?;
            }
            *r = Some(resolved);
        }
        Ok(self.identity_of(&r.as_ref().expect("resolved").digest))
    }

    /// Whether the reference resolves to the image `recorded` names (the
    /// live generation's identity for this source): then nothing is
    /// fetched. With `--semver`, the tag chosen is part of it: another tag
    /// on the live image is a new generation (labelled with it), whose
    /// layers are all the live one's (`resume`: none is fetched).
    pub fn unchanged_since(&self, recorded: &str) -> Result<bool> {
        Ok(self.identity()? == recorded)
    }

    /// `--label auto`: the image's `org.opencontainers.image.version`, from
    /// its manifest's annotations, else its config's labels (one request
    /// each, once per image digest in this process).
    pub fn version(&self) -> Result<Option<String>> {
        self.identity()?;
        let desc = self
            .resolved
            .lock()
            .unwrap()
            .as_ref()
            .expect("resolved")
            .desc()
            .clone();
        static SEEN: Mutex<Vec<(String, Option<String>)>> = Mutex::new(Vec::new());
        if let Some((_, v)) = SEEN.lock().unwrap().iter().find(|(d, _)| *d == desc.digest) {
            return Ok(v.clone());
        }
        let (bytes, _) = self.store.document(&desc)?;
        let found = match oci_image::version_annotation(&bytes) {
            Some(v) => Some(v),
            None => match oci_image::config_of(&bytes) {
                Some(config) => {
                    let (raw, _) = self.store.blob(&config)?;
                    let quiet = |_: u64| {};
                    let mut checked = oci_fetch::Checked::new(raw, &config, &quiet);
                    let mut text = Vec::new();
                    (&mut checked)
                        .take(crate::net::MAX_DOCUMENT + 1)
                        .read_to_end(&mut text)
                        .map_err(|e| {
                            anyhow::anyhow!(
                                "{}: config {}: {e}",
                                self.label,
                                store::short(&config.digest)
                            )
                        })?;
                    if text.len() as u64 > crate::net::MAX_DOCUMENT {
                        anyhow::bail!(
                            "{}: the image config is larger than {} bytes",
                            self.label,
                            crate::net::MAX_DOCUMENT
                        );
                    }
                    oci_image::version_label(&text)
                }
                None => None,
            },
        };
        let mut seen = SEEN.lock().unwrap();
        if seen.len() >= 64 {
            seen.remove(0);
        }
        seen.push((desc.digest.clone(), found.clone()));
        Ok(found)
    }
}

/// Layers into the spool, with whiteouts.
struct Into<'a> {
    spool: &'a mut Spool,
    reporter: &'a dyn Reporter,
}

impl Sink for Into<'_> {
    fn layer(&mut self, r: &mut dyn Read, what: &str) -> Result<()> {
        self.spool.apply(r, true, what, self.reporter).map(|_| ())
    }
}

impl Stream for Image {
    fn label(&self) -> &str {
        &self.label
    }

    fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    fn subpath(&self) -> Option<&[u8]> {
        self.subpath.as_deref()
    }

    fn fill(&self, spool: &mut Spool, reporter: &dyn Reporter) -> Result<String> {
        let identity = self.identity()?;
        let mut resolved = self.resolved.lock().unwrap();
        let image = resolved.as_mut().expect("resolved");
        let layers = oci_fetch::layers(&*self.store, image)?;
        if let Some(plan) = self.plan(&layers)? {
            self.resume.lock().unwrap().take();
            self.fill_artifact(image, &plan, spool, reporter)?;
            return Ok(identity);
        }
        let mut skip = 0;
        if let Some((base, below)) = self.resume.lock().unwrap().take() {
            let chunked = layers[below..].iter().any(chunked::has_toc);
            if let (true, Some(live)) = (chunked, &base.live) {
                let live = live.try_clone()?;
                let prefix = self.subpath.clone().unwrap_or_default();
                *self.donor.lock().unwrap() =
                    Some(chunked::Donor::of(&base.index, live, Some(&prefix))?);
            }
            spool.seed(base, self.subpath.as_deref().unwrap_or_default())?;
            skip = below;
        }
        *self.applied.lock().unwrap() = Some(layers.iter().map(|l| l.digest.clone()).collect());
        let donor = self.donor.lock().unwrap().take();
        let fetched = |n| reporter.fetched(n);
        for (i, layer) in layers.iter().enumerate().skip(skip) {
            let what = format!(
                "{} layer {} ({})",
                self.store.label(),
                i + 1,
                super::store::short(&layer.digest)
            );
            if let Some(donor) = &donor {
                if self.delta(layer, &what, donor, spool, reporter)? {
                    continue;
                }
            }
            let mut sink = Into { spool, reporter };
            oci_fetch::fetch_layer(&*self.store, layer, &what, &mut sink, &fetched)?;
        }
        Ok(identity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            base: "oci://registry.example:5000/st2 packs".into(),
            subpath: Some(b"opt/stack storm".to_vec()),
            platform: "linux/arm64/v8".into(),
            shape: "0123456789abcdef".into(),
            newest: Time { s: -3, ns: 7 },
            root_given: true,
            layers: vec![
                format!("sha256:{}", "a".repeat(64)),
                format!("sha512:{}", "0".repeat(128)),
            ],
        }
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let r = record();
        let text = r.to_string();
        assert!(text.starts_with("oci-layers 1 oci://registry.example:5000/st2%20packs //opt/stack%20storm linux/arm64/v8 "), "{text}");
        assert_eq!(Record::parse(&text), Some(r.clone()));
        let none = Record {
            subpath: None,
            layers: vec![],
            ..r
        };
        assert_eq!(Record::parse(&none.to_string()), Some(none));
    }

    #[test]
    fn a_malformed_record_is_no_record() {
        let good = record().to_string();
        let digest = format!("sha256:{}", "a".repeat(64));
        for bad in [
            String::new(),
            good.replace("oci-layers 1", "oci-layers 2"),
            good.replace("-3.000000007", "-3.7"),
            good.replace("-3.000000007", "1.1000000000"),
            good.replace(" 1 sha256", " 2 sha256"),
            good.replace(&digest, "sha256:zz"),
            good.replace(&digest, "sha256"),
            good.replace(" //opt", " opt"),
            format!("{good} "),
            format!("{good} {}", vec![digest.as_str(); 1100].join(" ")),
        ] {
            assert_eq!(Record::parse(&bad), None, "{bad}");
        }
    }
}
