//! Image sources: `oci://HOST[:PORT]/REPO[:TAG][@sha256:…]` (a registry)
//! and `oci-layout:DIR[:TAG]` (an OCI image layout on disk). The root
//! filesystem of the image is its layers applied in order, with OCI
//! whiteouts, into the spool (`spool::Spool::apply`); each layer is checked
//! for size and digest as it streams (`oci_fetch`). The identity a
//! generation records is the image manifest's digest
//! (`oci://HOST/REPO@sha256:…`): a tag that still resolves to it is "up to
//! date" after one request, with no blob fetched (`unchanged_since`).

use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use anyhow::Result;

use super::oci_fetch::{self, Layout, Registry, Resolved, Sink, Store};
use super::oci_image;
use super::oci_ref;
use super::{Source, Spool, Stream, Streamed};
use crate::config::{Platform, Remote};
use crate::error;
use crate::manifest::escape;
use crate::report::Reporter;
use crate::scan::Filter;
use crate::sys::DirFd;
use crate::tree::Tree;

/// A stream that names its content (an image digest, a URL's validators)
/// and can tell, with one request, whether it still holds what a recorded
/// identity names.
pub trait Named: Stream {
    fn unchanged_since(&self, recorded: &str) -> Result<bool>;
}

impl Named for Image {
    fn unchanged_since(&self, recorded: &str) -> Result<bool> {
        Image::unchanged_since(self, recorded)
    }
}

impl Named for super::http::Bundle {
    fn unchanged_since(&self, recorded: &str) -> Result<bool> {
        super::http::Bundle::unchanged_since(self, recorded)
    }
}

/// A remote kind as a `Source`: spooled as `Streamed` does, and able to say
/// it is unchanged (`Source::unchanged_since`); the identity is then the
/// one recorded.
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

    fn unchanged_since(&self, recorded: &str) -> Result<bool> {
        let same = self.inner.stream().unchanged_since(recorded)?;
        if same {
            let _ = self.unchanged.set(recorded.to_string());
        }
        Ok(same)
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
}

/// `oci://…`: parsed now (a malformed reference is exit 2); nothing is
/// asked of the registry before the sync scans.
pub fn open_registry(arg: &str, remote: &Remote) -> Result<Image> {
    let r = oci_ref::parse(arg).map_err(|e| error::usage(format!("{arg}: {e:#}")))?;
    let base = format!("oci://{}/{}", r.host, r.repo);
    let subpath = r.subpath.clone();
    let registry = Registry::new(r, arg.to_string(), remote)?;
    Ok(Image {
        store: Box::new(registry),
        label: arg.to_string(),
        base,
        subpath,
        platform: platform_of(remote),
        path: None,
        resolved: Mutex::new(None),
    })
}

/// `oci-layout:DIR[:TAG]`: DIR must be a layout (exit 2 otherwise).
pub fn open_layout(arg: &str, remote: &Remote) -> Result<Image> {
    let r = oci_ref::parse_layout(arg).map_err(|e| error::usage(format!("{arg}: {e:#}")))?;
    let subpath = r.subpath.clone();
    let layout = Layout::open(r, arg.to_string())?;
    let base = format!("oci-layout:{}", layout.path.display());
    let path = Some(layout.path.clone());
    Ok(Image {
        store: Box::new(layout),
        label: arg.to_string(),
        base,
        subpath,
        platform: platform_of(remote),
        path,
        resolved: Mutex::new(None),
    })
}

fn platform_of(remote: &Remote) -> Platform {
    remote
        .platform
        .clone()
        .unwrap_or_else(oci_image::running_platform)
}

impl Image {
    /// The identity of the image manifest `digest`.
    fn identity_of(&self, digest: &str) -> String {
        match &self.subpath {
            Some(p) => format!("{}@{digest}//{}", self.base, escape(p)),
            None => format!("{}@{digest}", self.base),
        }
    }

    /// Resolve the reference once (one request to a registry).
    fn identity(&self) -> Result<String> {
        let mut r = self.resolved.lock().unwrap();
        if r.is_none() {
            *r = Some(oci_fetch::resolve(&*self.store, &self.platform)?);
        }
        Ok(self.identity_of(&r.as_ref().expect("resolved").digest))
    }

    /// Whether the reference resolves to the image `recorded` names (the
    /// live generation's identity for this source): then nothing is fetched.
    pub fn unchanged_since(&self, recorded: &str) -> Result<bool> {
        Ok(self.identity()? == recorded)
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
        let resolved = self.resolved.lock().unwrap();
        let image = resolved.as_ref().expect("resolved");
        let mut sink = Into { spool, reporter };
        oci_fetch::fetch(&*self.store, image, &mut sink, &|n| reporter.fetched(n))?;
        Ok(identity)
    }
}
