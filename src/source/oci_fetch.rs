//! Reading an image from where it is stored, a registry (Distribution API
//! v2) or an OCI layout directory: resolve what the reference names to one
//! image manifest digest (the source's identity, one request to a
//! registry), then stream each layer, in order, through a reader that
//! checks its size and digest as it goes. Nothing is written here: the
//! layers go to a `Sink` (the spool).

use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::Mutex;

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use super::oci_image::{self, Document, ACCEPT, REF_NAME};
use super::oci_ref::{LayoutRef, Reference};
use super::store::{short, Descriptor, Referrer, Store};
use crate::config::{Platform, Remote};
use crate::escape::hex;
use crate::net::{self, auth, Client, Failed, Get, Url};
use crate::sys::{self, DirFd};
use crate::trust::sigstore;

/// Where the layers go, in order (the spool applies each with whiteouts).
pub trait Sink {
    fn layer(&mut self, r: &mut dyn Read, what: &str) -> Result<()>;
}

/// What a reference resolved to: the image manifest's digest (what the
/// source's identity records) and, when that manifest was read already,
/// its layers.
pub struct Resolved {
    pub digest: String,
    /// The digest of what the reference itself names (an index, or the
    /// image manifest itself): what `cosign sign IMAGE:TAG` signs.
    pub root: String,
    desc: Descriptor,
    layers: Option<Vec<Descriptor>>,
}

impl Resolved {
    /// The image manifest's descriptor.
    pub fn desc(&self) -> &Descriptor {
        &self.desc
    }

    /// The layers, where the manifest was read already.
    pub fn known_layers(&self) -> Option<&[Descriptor]> {
        self.layers.as_deref()
    }
}

/// The most tags a listing may hold, and the most pages it may take.
pub const MAX_TAGS: usize = 100_000;
const MAX_TAG_PAGES: usize = 1000;

/// The image manifest the reference names for `platform` (an index is
/// followed, at most a few levels deep), from the document `root` (what
/// `Store::root` or `Store::root_tagged` gave): its digest without reading
/// it where an index gave the digest.
pub fn resolve_from(
    store: &dyn Store,
    root: (Vec<u8>, Option<String>, Descriptor),
    platform: &Platform,
) -> Result<Resolved> {
    let (mut bytes, mut ctype, mut desc) = root;
    let root = desc.digest.clone();
    for _ in 0..4 {
        let doc = oci_image::parse(&bytes, ctype.as_deref())
            .with_context(|| format!("{}: manifest {}", store.label(), desc.digest))?;
        match doc {
            Document::Image(layers) => {
                return Ok(Resolved {
                    digest: desc.digest.clone(),
                    root,
                    desc,
                    layers: Some(layers),
                })
            }
            Document::Index(ms) => {
                let chosen = oci_image::choose(&ms, platform)
                    .with_context(|| store.label().to_string())?
                    .clone();
                if !is_index_type(&chosen.media_type) {
                    return Ok(Resolved {
                        digest: chosen.digest.clone(),
                        root,
                        desc: chosen,
                        layers: None,
                    });
                }
                (bytes, ctype) = store.document(&chosen)?;
                desc = chosen;
            }
        }
    }
    bail!("{}: indexes nested too deep", store.label())
}

fn is_index_type(t: &str) -> bool {
    t == oci_image::OCI_INDEX || t == oci_image::DOCKER_LIST
}

/// The layers of `image`, in order: read from its manifest (one request,
/// once) where the reference resolved through an index.
pub fn layers(store: &dyn Store, image: &mut Resolved) -> Result<Vec<Descriptor>> {
    let layers = match &image.layers {
        Some(l) => l.clone(),
        None => {
            let (bytes, ctype) = store.document(&image.desc)?;
            match oci_image::parse(&bytes, ctype.as_deref())
                .with_context(|| format!("{}: manifest {}", store.label(), image.digest))?
            {
                Document::Image(layers) => layers,
                Document::Index(_) => bail!(
                    "{}: {} is an index where an image manifest was expected",
                    store.label(),
                    image.digest
                ),
            }
        }
    };
    image.layers = Some(layers.clone());
    Ok(layers)
}

/// Stream one layer whole into `sink`, checked against its descriptor.
pub fn fetch_layer(
    store: &dyn Store,
    layer: &Descriptor,
    what: &str,
    sink: &mut dyn Sink,
    fetched: &(dyn Fn(u64) + Sync),
) -> Result<()> {
    let (raw, stop) = store.blob(layer)?;
    let mut checked = Checked::new(raw, layer, fetched);
    pipelined_until(
        &mut checked,
        what,
        &|| stop.stop(),
        Checked::finish,
        |plain| sink.layer(plain, what),
    )
}

/// Chunks handed from the decompressing thread to the spool, and how many
/// may wait: under half a MiB in flight (at 256 KiB a chunk, 1.5 MiB of
/// them was most of an image's first sync's heap at its peak).
const CHUNK: usize = 64 << 10;
const CHUNKS: usize = 4;

/// After a decoding failure, the rest of a blob is read for its digest
/// (the better cause to name) only if this much is left at most.
const TAIL: u64 = 1 << 20;

/// `pipelined_until` for a reader that needs no stop (a file), where `end`
/// runs only when decoding and `consume` succeeded.
pub fn pipelined<R: Read + Send>(
    raw: &mut R,
    what: &str,
    end: impl FnOnce(&mut R) -> io::Result<()> + Send,
    consume: impl FnOnce(&mut dyn Read) -> Result<()>,
) -> Result<()> {
    let end = |r: &mut R, failed: bool| if failed { Ok(()) } else { end(r) };
    pipelined_until(raw, what, &|| {}, end, consume)
}

/// Decompress `raw` (gzip, zstd or plain: told by its first bytes) on a
/// thread of its own while `consume` reads the plain stream, so that
/// inflating and hashing the download overlap writing the files.
///
/// `end(raw, failed)` runs on `raw` after the plain stream ended, before
/// `consume` sees its end (the digest check: a failure there reaches
/// `consume` as a read error, so nothing is taken for complete), and
/// with `failed` after decoding failed: a blob that is not what its
/// digest says is then the cause named (`end`'s error wins), not what the
/// decompressor made of it, after `what`. When `consume` fails on its
/// own (a refused entry, ENOSPC, a signal), that is the first failure:
/// `stop` ends the transfer under way, `end` does not run, nothing more
/// is read.
pub fn pipelined_until<R: Read + Send>(
    raw: &mut R,
    what: &str,
    stop: &(dyn Fn() + Sync),
    end: impl FnOnce(&mut R, bool) -> io::Result<()> + Send,
    consume: impl FnOnce(&mut dyn Read) -> Result<()>,
) -> Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (tx, rx) = std::sync::mpsc::sync_channel::<io::Result<Vec<u8>>>(CHUNKS);
    let gave_up = AtomicBool::new(false);
    let gave_up = &gave_up;
    std::thread::scope(|s| {
        let producer = s.spawn(move || -> Option<io::Error> {
            let decode = (|| -> io::Result<()> {
                let (_, mut plain) = super::decode::decoded(&mut *raw)?;
                loop {
                    // Whole chunks: a decompressor hands out a few KiB a read.
                    let mut buf = vec![0; CHUNK];
                    let mut n = 0;
                    while n < CHUNK {
                        match plain.read(&mut buf[n..]) {
                            Ok(0) => break,
                            Ok(k) => n += k,
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(e) => return Err(e),
                        }
                    }
                    if n == 0 {
                        return Ok(());
                    }
                    buf.truncate(n);
                    if tx.send(Ok(buf)).is_err() {
                        return Ok(()); // the consumer ended (done, or failed)
                    }
                }
            })();
            if gave_up.load(Ordering::SeqCst) {
                return None; // the consumer's failure stands
            }
            let checked = end(raw, decode.is_err()).err();
            match (&checked, decode) {
                (Some(e), _) => {
                    let _ = tx.send(Err(io::Error::new(e.kind(), e.to_string())));
                }
                (None, Err(e)) => {
                    let _ = tx.send(Err(e));
                }
                (None, Ok(())) => {}
            }
            checked
        });
        let mut reader = Chunks {
            rx,
            cur: Vec::new(),
            at: 0,
            relayed: false,
        };
        let consumed = consume(&mut reader);
        // A failure of the consumer's own, not one the producer handed it.
        let own = consumed.is_err() && !reader.relayed;
        if own {
            gave_up.store(true, Ordering::SeqCst);
            stop();
        }
        drop(reader);
        let checked = producer.join().expect("the decompressing thread panicked");
        if let Some(sig) = crate::sys::signals::pending() {
            return Err(crate::error::Failure::Interrupted(sig).into());
        }
        match checked {
            Some(e) if !own => Err(anyhow::Error::new(e).context(what.to_string())),
            _ => consumed,
        }
    })
}

/// The plain stream, as chunks from the decompressing thread.
struct Chunks {
    rx: std::sync::mpsc::Receiver<io::Result<Vec<u8>>>,
    cur: Vec<u8>,
    at: usize,
    /// An error came from the producer.
    relayed: bool,
}

impl Read for Chunks {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use std::sync::mpsc::RecvTimeoutError;
        while self.at == self.cur.len() {
            match self.rx.recv_timeout(std::time::Duration::from_millis(100)) {
                Ok(Ok(chunk)) => {
                    self.cur = chunk;
                    self.at = 0;
                }
                Ok(Err(e)) => {
                    self.relayed = true;
                    return Err(e);
                }
                Err(RecvTimeoutError::Disconnected) => return Ok(0),
                // A signal while the download waits: the caller reports it
                // (not `Interrupted`, which readers retry).
                Err(RecvTimeoutError::Timeout) => {
                    if let Some(sig) = crate::sys::signals::pending() {
                        return Err(io::Error::other(crate::error::Failure::Interrupted(sig)));
                    }
                }
            }
        }
        let n = buf.len().min(self.cur.len() - self.at);
        buf[..n].copy_from_slice(&self.cur[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// A blob as it streams, refused once it is longer than its descriptor, or
/// at its end when shorter or when its digest differs.
pub struct Checked<'a, R> {
    inner: R,
    hasher: Sha256,
    seen: u64,
    size: u64,
    digest: &'a str,
    done: bool,
    fetched: &'a (dyn Fn(u64) + Sync),
}

impl<'a, R: Read> Checked<'a, R> {
    pub fn new(
        inner: R,
        desc: &'a Descriptor,
        fetched: &'a (dyn Fn(u64) + Sync),
    ) -> Checked<'a, R> {
        Checked {
            inner,
            hasher: Sha256::new(),
            seen: 0,
            size: desc.size,
            digest: &desc.digest,
            done: false,
            fetched,
        }
    }

    /// Read what the consumer left (a tar's padding after its end) and
    /// check; after a decoding failure (`failed`), only a short rest.
    pub fn finish(&mut self, failed: bool) -> io::Result<()> {
        if failed && self.size.saturating_sub(self.seen) > TAIL {
            return Ok(());
        }
        io::copy(self, &mut io::sink()).map(|_| ())
    }

    fn bad(&self, why: String) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, why)
    }
}

impl<R: Read> Read for Checked<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.done {
            return Ok(0);
        }
        let longer = |c: &Self| {
            c.bad(format!(
                "the blob is longer than the {} bytes its descriptor says",
                c.size
            ))
        };
        if self.seen > self.size {
            return Err(longer(self));
        }
        // One byte past the size is enough to know it is too long.
        let room = (self.size - self.seen)
            .saturating_add(1)
            .min(buf.len() as u64) as usize;
        let n = self.inner.read(&mut buf[..room])?;
        self.seen += n as u64;
        if self.seen > self.size {
            return Err(longer(self));
        }
        self.hasher.update(&buf[..n]);
        (self.fetched)(n as u64);
        if n == 0 && !buf.is_empty() {
            if self.seen < self.size {
                return Err(self.bad(format!("truncated: {} of {} bytes", self.seen, self.size)));
            }
            let got = format!("sha256:{}", hex(&self.hasher.clone().finalize()));
            if got != self.digest {
                return Err(self.bad(format!("digest mismatch: got {}", short(&got))));
            }
            self.done = true;
        }
        Ok(n)
    }
}

pub(crate) fn sha256_of(bytes: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(bytes)))
}

/// A document checked against its descriptor.
pub(crate) fn check_document(label: &str, bytes: &[u8], desc: &Descriptor) -> Result<()> {
    if bytes.len() as u64 != desc.size && desc.size != 0 {
        bail!(
            "{label}: {} is {} bytes, its descriptor says {}",
            short(&desc.digest),
            bytes.len(),
            desc.size
        );
    }
    let got = sha256_of(bytes);
    if got != desc.digest {
        bail!(
            "{label}: digest mismatch for {}: got {}",
            short(&desc.digest),
            short(&got)
        );
    }
    Ok(())
}

// ---------------------------------------------------------------- registry

/// A repository of a registry, over the Distribution API v2, with the
/// credentials for its host and the token (or Basic value) once a
/// challenge asked for one.
pub struct Registry {
    client: Client,
    base: Url,
    pub reference: Reference,
    label: String,
    found: auth::Found,
    authz: Mutex<Option<String>>,
}

impl Registry {
    /// The registry a reference names: HTTPS, or plain HTTP for loopback
    /// and `--insecure-registry` hosts. Credentials are looked up now (an
    /// unreadable `--registry-auth` is a usage error, before anything is written).
    pub fn new(reference: Reference, label: String, remote: &Remote) -> Result<Registry> {
        let client = Client::new(remote)?;
        let https = Url::parse(&format!("https://{}/", reference.host))
            .map_err(|e| crate::error::usage(format!("{label}: bad host: {e}")))?;
        let base = if client.plain_http_allowed(&https) {
            Url::parse(&format!("http://{}/", reference.host)).expect("the same host")
        } else {
            https
        };
        // Looked up for each sync: a helper's rotated token is used from the next round.
        let found = auth::lookup(
            &reference.host,
            remote.registry_auth.as_deref(),
            remote.timeout,
        )?;
        Ok(Registry {
            client,
            base,
            reference,
            label,
            found,
            authz: Mutex::new(None),
        })
    }

    fn get(
        &self,
        path: &str,
        accept: Option<&str>,
        what: &dyn Fn() -> String,
    ) -> Result<net::Reply> {
        self.get_url(self.url_of(path)?, accept, what)
    }

    /// `get`, the server's refusal (a 404) given back as it came.
    fn try_get(&self, path: &str, accept: Option<&str>) -> Result<Result<net::Reply, Failed>> {
        self.try_get_url(self.url_of(path)?, accept)
    }

    fn url_of(&self, path: &str) -> Result<Url> {
        self.base
            .join(path)
            .with_context(|| format!("{}: bad request path {path:?}", self.label))
    }

    /// `get`, of a whole URL on the registry's host.
    fn get_url(
        &self,
        url: Url,
        accept: Option<&str>,
        what: &dyn Fn() -> String,
    ) -> Result<net::Reply> {
        self.try_get_url(url, accept)?
            .map_err(|e| self.failed(e, what))
    }

    /// `try_get`, of a whole URL on the registry's host.
    fn try_get_url(&self, url: Url, accept: Option<&str>) -> Result<Result<net::Reply, Failed>> {
        self.try_get_range(url, accept, None)
    }

    /// `try_get_url`, for the bytes `range` (start, length) only.
    fn try_get_range(
        &self,
        url: Url,
        accept: Option<&str>,
        range: Option<(u64, u64)>,
    ) -> Result<Result<net::Reply, Failed>> {
        let headers: Vec<(String, String)> = accept
            .map(|a| vec![("Accept".to_string(), a.to_string())])
            .unwrap_or_default();
        let mut challenged = false;
        loop {
            let authz = self.authz.lock().unwrap().clone();
            let req = Get {
                headers: &headers,
                auth: authz.as_deref(),
                range,
                ..Get::new(url.clone())
            };
            match self.client.send(&req) {
                Ok(r) => return Ok(Ok(r)),
                Err(Failed::Status {
                    code: 401,
                    challenge,
                    ..
                }) if !challenged => {
                    challenged = true;
                    self.authenticate(challenge.as_deref())?;
                }
                Err(e) => return Ok(Err(e)),
            }
        }
    }

    /// Answer a 401's challenge: Basic with the credentials, or a token
    /// from the Bearer realm (asked with the credentials, or anonymously).
    fn authenticate(&self, challenge: Option<&str>) -> Result<()> {
        let unauthorized = || {
            self.failed(
                Failed::Status {
                    code: 401,
                    text: "Unauthorized".into(),
                    challenge: None,
                },
                &|| String::new(),
            )
        };
        let Some(ch) = challenge.and_then(auth::parse_challenge) else {
            return Err(unauthorized());
        };
        let basic = self.found.creds.as_ref().map(auth::Credentials::basic);
        match ch.scheme.as_str() {
            "basic" => {
                let Some(b) = basic else {
                    return Err(unauthorized());
                };
                *self.authz.lock().unwrap() = Some(b);
                Ok(())
            }
            "bearer" => {
                let realm = ch.param("realm").ok_or_else(|| {
                    anyhow::anyhow!("{}: a Bearer challenge without a realm", self.label)
                })?;
                let mut url = Url::parse(realm).map_err(|e| {
                    anyhow::anyhow!(
                        "{}: the token realm {realm:?} is not a URL: {e}",
                        self.label
                    )
                })?;
                if !matches!(url.scheme(), "http" | "https") {
                    bail!("{}: the token realm {realm:?} is not HTTP", self.label);
                }
                let scope = ch
                    .param("scope")
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("repository:{}:pull", self.reference.repo));
                let realm_url = url.clone();
                {
                    let mut q = url.query_pairs_mut();
                    if let Some(s) = ch.param("service") {
                        q.append_pair("service", s);
                    }
                    q.append_pair("scope", &scope);
                }
                // An identity token is a refresh token: traded for an
                // access token with an OAuth2 POST, as the docker CLI does.
                let form = self.found.identity_token.as_ref().map(|t| {
                    let mut f = url::form_urlencoded::Serializer::new(String::new());
                    f.append_pair("grant_type", "refresh_token")
                        .append_pair("client_id", "packsync")
                        .append_pair("refresh_token", &t.0)
                        .append_pair("scope", &scope);
                    if let Some(s) = ch.param("service") {
                        f.append_pair("service", s);
                    }
                    f.finish()
                });
                if form.is_some() {
                    url = realm_url;
                }
                let req = Get {
                    auth: basic.as_deref(),
                    form: form.as_deref(),
                    follow: form.is_none(),
                    ..Get::new(url)
                };
                let reply = self
                    .client
                    .send(&req)
                    .map_err(|e| self.failed(e, &|| "asking the token realm".to_string()))?;
                let body = reply
                    .read_document(64 << 10)
                    .map_err(|e| anyhow::anyhow!("{}: token realm: {e}", self.label))?;
                let token = auth::parse_token(&body)
                    .map_err(|e| anyhow::anyhow!("{}: token realm: {e:#}", self.label))?;
                *self.authz.lock().unwrap() = Some(format!("Bearer {token}"));
                Ok(())
            }
            other => bail!(
                "{}: 401 Unauthorized with an unsupported challenge {other:?}",
                self.label
            ),
        }
    }

    /// One line: the source, the status or cause, and what to do about it.
    fn failed(&self, e: Failed, what: &dyn Fn() -> String) -> anyhow::Error {
        let hint = match e.code() {
            Some(401) | Some(403) => {
                let has = self.found.creds.is_some() || self.found.identity_token.is_some();
                match (has, &self.found.helper, &self.found.file) {
                    (true, Some(h), _) => format!(
                        " (the credentials {h} gave for {} were refused)",
                        self.reference.host
                    ),
                    (true, None, Some(f)) => format!(
                        " (the credentials for {} in {} were refused)",
                        self.reference.host,
                        f.display()
                    ),
                    (false, Some(h), _) => format!(
                        " ({h} has no credentials for {}: anonymous)",
                        self.reference.host
                    ),
                    _ => " (credentials: --registry-auth FILE)".to_string(),
                }
            }
            Some(404) => match what() {
                w if w.is_empty() => String::new(),
                w => format!(" ({w})"),
            },
            _ => String::new(),
        };
        anyhow::anyhow!("{}: {e}{hint}", self.label)
    }

    fn repo_path(&self, kind: &str, reference: &str) -> String {
        format!("v2/{}/{kind}/{reference}", self.reference.repo)
    }
}

impl Registry {
    fn root_ref(&self, r: &str) -> Result<(Vec<u8>, Option<String>, Descriptor)> {
        let r = r.to_string();
        let path = self.repo_path("manifests", &r);
        let what = || {
            if self.reference.digest.is_some() {
                format!("no manifest {} in {}", short(&r), self.reference.repo)
            } else {
                format!("no tag {r} in {}", self.reference.repo)
            }
        };
        let reply = self.get(&path, Some(ACCEPT), &what)?;
        let ctype = reply.header("content-type").map(str::to_string);
        let bytes = reply
            .read_document(net::MAX_DOCUMENT)
            .map_err(|e| anyhow::anyhow!("{}: manifest: {e}", self.label))?;
        let digest = sha256_of(&bytes);
        if let Some(want) = &self.reference.digest {
            if &digest != want {
                bail!(
                    "{}: digest mismatch for the manifest: got {}",
                    self.label,
                    short(&digest)
                );
            }
        }
        let desc = Descriptor {
            media_type: ctype.clone().unwrap_or_default(),
            size: bytes.len() as u64,
            digest,
            platform: None,
            annotations: None,
        };
        Ok((bytes, ctype, desc))
    }
}

impl Store for Registry {
    fn label(&self) -> &str {
        &self.label
    }

    fn root(&self) -> Result<(Vec<u8>, Option<String>, Descriptor)> {
        self.root_ref(self.reference.manifest_ref())
    }

    fn root_tagged(&self, tag: &str) -> Result<(Vec<u8>, Option<String>, Descriptor)> {
        self.root_ref(tag)
    }

    /// `GET /v2/NAME/tags/list`, page after page as each `Link: <…>;
    /// rel="next"` header says (relative, or absolute on the registry's own
    /// scheme, host and port: a link elsewhere is refused), at most
    /// `MAX_TAGS` tags over at most `MAX_TAG_PAGES` pages.
    fn tags(&self) -> Result<Vec<String>> {
        let first = format!("v2/{}/tags/list?n={}", self.reference.repo, tags_page());
        let mut url = self
            .base
            .join(&first)
            .with_context(|| format!("{}: bad request path {first:?}", self.label))?;
        let what = || format!("no repository {}", self.reference.repo);
        let mut tags: Vec<String> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..MAX_TAG_PAGES {
            if !seen.insert(url.to_string()) {
                bail!(
                    "{}: the tag list's Link headers go round in a loop",
                    self.label
                );
            }
            let reply = self.get_url(url.clone(), Some("application/json"), &what)?;
            let link = reply.header("link").map(str::to_string);
            let bytes = reply
                .read_document(net::MAX_DOCUMENT)
                .map_err(|e| anyhow::anyhow!("{}: tag list: {e}", self.label))?;
            let page = parse_tag_list(&bytes)
                .map_err(|e| anyhow::anyhow!("{}: tag list: {e:#}", self.label))?;
            if tags.len() + page.len() > MAX_TAGS {
                bail!(
                    "{}: the repository lists more than {MAX_TAGS} tags",
                    self.label
                );
            }
            tags.extend(page);
            let Some(next) = link.as_deref().and_then(next_link) else {
                return Ok(tags);
            };
            let joined = url.join(next).map_err(|e| {
                anyhow::anyhow!(
                    "{}: the tag list's Link {next:?} is not a URL: {e}",
                    self.label
                )
            })?;
            if net::host_port(&joined) != net::host_port(&self.base)
                || joined.scheme() != self.base.scheme()
            {
                bail!(
                    "{}: the tag list's Link points at another host ({}): refused",
                    self.label,
                    net::host_port(&joined)
                );
            }
            url = joined;
        }
        bail!(
            "{}: the tag list takes more than {MAX_TAG_PAGES} pages",
            self.label
        )
    }

    fn document(&self, desc: &Descriptor) -> Result<(Vec<u8>, Option<String>)> {
        let path = self.repo_path("manifests", &desc.digest);
        let what = || {
            format!(
                "no manifest {} in {}",
                short(&desc.digest),
                self.reference.repo
            )
        };
        let reply = self.get(&path, Some(ACCEPT), &what)?;
        let ctype = reply.header("content-type").map(str::to_string);
        let bytes = reply
            .read_document(net::MAX_DOCUMENT)
            .map_err(|e| anyhow::anyhow!("{}: manifest: {e}", self.label))?;
        check_document(&self.label, &bytes, desc)?;
        Ok((bytes, ctype))
    }

    fn blob(&self, desc: &Descriptor) -> Result<(Box<dyn Read + Send + '_>, net::Stop)> {
        let path = self.repo_path("blobs", &desc.digest);
        let what = || format!("blob {} missing", short(&desc.digest));
        let reply = self.get(&path, None, &what)?;
        let label = self.label.clone();
        let body = reply.into_reader();
        let stop = body.stopper();
        Ok((Box::new(Named { inner: body, label }), stop))
    }

    fn serves_ranges(&self) -> bool {
        true
    }

    fn blob_range(
        &self,
        desc: &Descriptor,
        start: u64,
        len: u64,
    ) -> Result<Option<Box<dyn Read + Send + '_>>> {
        super::store::check_range(&self.label, desc, start, len)?;
        let path = self.repo_path("blobs", &desc.digest);
        let what = || format!("blob {} missing", short(&desc.digest));
        let reply = self
            .try_get_range(self.url_of(&path)?, None, Some((start, len)))?
            .map_err(|e| self.failed(e, &what))?;
        match reply.ranged(start, len) {
            Ok(net::Ranged::Part(body)) => Ok(Some(Box::new(Named {
                inner: body,
                label: self.label.clone(),
            }))),
            // Dropped: the connection closes, nothing more is read.
            Ok(net::Ranged::Whole) => Ok(None),
            Err(e) => Err(anyhow::anyhow!(
                "{}: blob {}: {e}",
                self.label,
                short(&desc.digest)
            )),
        }
    }

    fn by_tag(&self, tag: &str) -> Option<Result<Option<Vec<u8>>>> {
        let path = self.repo_path("manifests", tag);
        let accept = "application/vnd.oci.image.manifest.v1+json, \
            application/vnd.docker.distribution.manifest.v2+json, \
            application/vnd.oci.image.index.v1+json";
        Some((|| {
            let reply = match self.try_get(&path, Some(accept))? {
                Ok(r) => r,
                Err(e) if e.code() == Some(404) => return Ok(None),
                Err(e) => return Err(self.failed(e, &String::new)),
            };
            let bytes = reply
                .read_document(net::MAX_DOCUMENT)
                .map_err(|e| anyhow::anyhow!("{}: manifest {tag}: {e}", self.label))?;
            Ok(Some(bytes))
        })())
    }

    /// `GET /v2/NAME/referrers/DIGEST` (OCI 1.1), its answer bounded.
    fn referrers(&self, digest: &str) -> Option<Result<Option<Vec<Referrer>>>> {
        let path = self.repo_path("referrers", digest);
        Some((|| {
            let reply = match self.try_get(&path, Some(oci_image::OCI_INDEX))? {
                Ok(r) => r,
                Err(e) if e.code() == Some(404) => return Ok(None),
                Err(e) => return Err(self.failed(e, &String::new)),
            };
            let bytes = reply.read_document(net::MAX_DOCUMENT).map_err(|e| {
                anyhow::anyhow!("{}: referrers of {}: {e}", self.label, short(digest))
            })?;
            sigstore::parse_referrers(&bytes).map(Some).map_err(|m| {
                crate::error::untrusted(format!(
                    "{}: referrers of {}: {m}",
                    self.label,
                    short(digest)
                ))
            })
        })())
    }

    fn tags_where(&self) -> String {
        format!("in {}", self.reference.repo)
    }
}

/// A body whose read errors name the source.
struct Named<R> {
    inner: R,
    label: String,
}

impl<R: Read> Read for Named<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner
            .read(buf)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", self.label)))
    }
}

/// How many tags a page of the tag list asks for (`n`): the test suite
/// asks for small pages to see pagination against a real registry.
fn tags_page() -> usize {
    #[cfg(feature = "fault-injection")]
    if let Some(n) = std::env::var("PACKSYNC_TEST_TAGS_PAGE")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return n;
    }
    1000
}

/// One page of `GET /v2/NAME/tags/list`: `{"name": …, "tags": [...]}`
/// (`tags` may be null). Every tag must be a valid tag.
pub fn parse_tag_list(bytes: &[u8]) -> Result<Vec<String>> {
    #[derive(serde::Deserialize)]
    struct Page {
        tags: Option<Vec<String>>,
    }
    let page: Page = serde_json::from_slice(bytes).context("not a tag list")?;
    let tags = page.tags.unwrap_or_default();
    if let Some(bad) = tags.iter().find(|t| !super::oci_ref::valid_tag(t)) {
        bail!("{bad:?} is not a tag");
    }
    Ok(tags)
}

/// The target of the `rel="next"` link of a `Link` header
/// (`<URL>; rel="next"`, possibly among other links), if any.
pub fn next_link(header: &str) -> Option<&str> {
    header.split(',').find_map(|link| {
        let link = link.trim();
        let (target, params) = link.strip_prefix('<')?.split_once('>')?;
        let next = params.split(';').any(|p| {
            let p = p.trim();
            p.split_once('=').is_some_and(|(k, v)| {
                k.trim().eq_ignore_ascii_case("rel")
                    && v.trim()
                        .trim_matches('"')
                        .split_whitespace()
                        .any(|r| r.eq_ignore_ascii_case("next"))
            })
        });
        next.then_some(target)
    })
}

// ---------------------------------------------------------------- layout

/// An OCI image layout directory: `index.json` and `blobs/sha256/<hex>`,
/// read below a handle on the directory, never following a symlink.
pub struct Layout {
    dir: DirFd,
    pub path: PathBuf,
    pub reference: LayoutRef,
    label: String,
}

impl Layout {
    /// The layout at `reference.dir`: a directory with `oci-layout` and
    /// `index.json`, else a usage error.
    pub fn open(reference: LayoutRef, label: String) -> Result<Layout> {
        let path = PathBuf::from(&reference.dir);
        let dir = DirFd::open_path(&path).map_err(|e| {
            crate::error::usage(format!("{label}: cannot open the layout directory: {e}"))
        })?;
        for name in [&b"oci-layout"[..], b"index.json"] {
            if !dir.exists(name).unwrap_or(false) {
                return Err(crate::error::usage(format!(
                    "{label}: not an OCI image layout (no {})",
                    String::from_utf8_lossy(name)
                )));
            }
        }
        let path = sys::canonicalize(&path).unwrap_or(path);
        Ok(Layout {
            dir,
            path,
            reference,
            label,
        })
    }

    fn index(&self) -> Result<Vec<u8>> {
        let fd = self
            .dir
            .open_read(b"index.json")
            .with_context(|| format!("{}: cannot open index.json", self.label))?;
        self.read_bounded(sys::reader(fd), "index.json")
    }

    fn open_blob(&self, digest: &str) -> Result<std::fs::File> {
        let hex = digest.strip_prefix("sha256:").expect("a checked digest");
        let fd = self
            .dir
            .open_dir(b"blobs")
            .and_then(|b| b.open_dir(b"sha256"))
            .and_then(|d| d.open_read(hex.as_bytes()))
            .with_context(|| format!("{}: cannot open blob {}", self.label, short(digest)))?;
        Ok(sys::reader(fd))
    }

    fn read_bounded(&self, mut f: std::fs::File, what: &str) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        (&mut f)
            .take(net::MAX_DOCUMENT + 1)
            .read_to_end(&mut out)
            .with_context(|| format!("{}: cannot read {what}", self.label))?;
        if out.len() as u64 > net::MAX_DOCUMENT {
            bail!(
                "{}: {what} is larger than {} bytes",
                self.label,
                net::MAX_DOCUMENT
            );
        }
        Ok(out)
    }
}

impl Store for Layout {
    fn label(&self) -> &str {
        &self.label
    }

    fn root(&self) -> Result<(Vec<u8>, Option<String>, Descriptor)> {
        let fd = self
            .dir
            .open_read(b"index.json")
            .with_context(|| format!("{}: cannot open index.json", self.label))?;
        let bytes = self.read_bounded(sys::reader(fd), "index.json")?;
        let chosen = tagged(&self.label, &bytes, self.reference.tag.as_deref())?;
        let (bytes, ctype) = self.document(&chosen)?;
        Ok((bytes, ctype, chosen))
    }

    fn root_tagged(&self, tag: &str) -> Result<(Vec<u8>, Option<String>, Descriptor)> {
        let bytes = self.index()?;
        let chosen = tagged(&self.label, &bytes, Some(tag))?;
        let (bytes, ctype) = self.document(&chosen)?;
        Ok((bytes, ctype, chosen))
    }

    /// The `org.opencontainers.image.ref.name` of each image of `index.json`.
    fn tags(&self) -> Result<Vec<String>> {
        let bytes = self.index()?;
        let Document::Index(ms) = oci_image::parse(&bytes, Some(oci_image::OCI_INDEX))
            .with_context(|| format!("{}: index.json", self.label))?
        else {
            bail!("{}: index.json is not an image index", self.label);
        };
        Ok(ms
            .iter()
            .filter_map(|d| d.annotations.as_ref()?.get(REF_NAME).cloned())
            .collect())
    }

    fn document(&self, desc: &Descriptor) -> Result<(Vec<u8>, Option<String>)> {
        let f = self.open_blob(&desc.digest)?;
        let bytes = self.read_bounded(f, short(&desc.digest))?;
        check_document(&self.label, &bytes, desc)?;
        let ctype = Some(desc.media_type.clone()).filter(|t| !t.is_empty());
        Ok((bytes, ctype))
    }

    fn blob(&self, desc: &Descriptor) -> Result<(Box<dyn Read + Send + '_>, net::Stop)> {
        let file = io::BufReader::with_capacity(256 << 10, self.open_blob(&desc.digest)?);
        Ok((Box::new(file), net::Stop::default()))
    }

    fn serves_ranges(&self) -> bool {
        true
    }

    /// The bytes read at their offset in the blob's file (exactly: a file
    /// shorter than its descriptor says is a read error).
    fn blob_range(
        &self,
        desc: &Descriptor,
        start: u64,
        len: u64,
    ) -> Result<Option<Box<dyn Read + Send + '_>>> {
        use std::io::{Seek, SeekFrom};
        super::store::check_range(&self.label, desc, start, len)?;
        let mut file = self.open_blob(&desc.digest)?;
        file.seek(SeekFrom::Start(start))
            .with_context(|| format!("{}: cannot read blob {}", self.label, short(&desc.digest)))?;
        Ok(Some(Box::new(net::Exact::new(file, len))))
    }

    fn by_tag(&self, tag: &str) -> Option<Result<Option<Vec<u8>>>> {
        Some((|| {
            let fd = self
                .dir
                .open_read(b"index.json")
                .with_context(|| format!("{}: cannot open index.json", self.label))?;
            let index = self.read_bounded(sys::reader(fd), "index.json")?;
            match in_index(&self.label, &index, tag)? {
                Some(d) => Ok(Some(self.document(&d)?.0)),
                None => Ok(None),
            }
        })())
    }

    fn referrers(&self, digest: &str) -> Option<Result<Option<Vec<Referrer>>>> {
        Some(
            self.index()
                .and_then(|ix| sigstore::in_layout(self, &ix, digest).map(Some)),
        )
    }

    fn tags_where(&self) -> String {
        "in the layout's index.json".into()
    }
}

/// The descriptor an OCI layout's `index.json` (`bytes`) tags `tag`, if any.
pub fn in_index(label: &str, bytes: &[u8], tag: &str) -> Result<Option<Descriptor>> {
    let Document::Index(ms) = oci_image::parse(bytes, Some(oci_image::OCI_INDEX))
        .with_context(|| format!("{label}: index.json"))?
    else {
        bail!("{label}: index.json is not an image index");
    };
    Ok(ms.into_iter().find(|d| {
        d.annotations
            .as_ref()
            .and_then(|a| a.get(REF_NAME))
            .is_some_and(|t| t == tag)
    }))
}

/// The image an OCI layout's `index.json` (`bytes`) names by `tag` (its
/// `org.opencontainers.image.ref.name`), or its only one where no tag is
/// given: a layout directory's, or an `oci-archive:` FILE's.
pub fn tagged(label: &str, bytes: &[u8], tag: Option<&str>) -> Result<Descriptor> {
    let Document::Index(ms) = oci_image::parse(bytes, Some(oci_image::OCI_INDEX))
        .with_context(|| format!("{label}: index.json"))?
    else {
        bail!("{label}: index.json is not an image index");
    };
    let tag_of = |d: &Descriptor| {
        d.annotations
            .as_ref()
            .and_then(|a| a.get(REF_NAME))
            .cloned()
    };
    let chosen = match tag {
        Some(t) => ms
            .iter()
            .find(|d| tag_of(d).as_deref() == Some(t))
            .ok_or_else(|| {
                let tags: Vec<String> = ms.iter().filter_map(tag_of).collect();
                anyhow::anyhow!(
                    "{label}: no tag {t} in the layout (it has {})",
                    if tags.is_empty() {
                        "none".into()
                    } else {
                        tags.join(", ")
                    }
                )
            })?,
        None if ms.len() == 1 => &ms[0],
        None => {
            let tags: Vec<String> = ms.iter().filter_map(tag_of).collect();
            bail!(
                "{label}: the layout holds {} images: name one as SOURCE:TAG (tags: {})",
                ms.len(),
                tags.join(", ")
            )
        }
    };
    Ok(chosen.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(data: &[u8]) -> Descriptor {
        Descriptor {
            media_type: String::new(),
            digest: sha256_of(data),
            size: data.len() as u64,
            platform: None,
            annotations: None,
        }
    }

    fn read_all(r: &mut dyn Read) -> io::Result<Vec<u8>> {
        let mut v = Vec::new();
        r.read_to_end(&mut v)?;
        Ok(v)
    }

    #[test]
    fn tag_list_pages_and_their_links() {
        assert_eq!(
            parse_tag_list(br#"{"name":"app","tags":["1.0.0","v2"]}"#).unwrap(),
            ["1.0.0", "v2"]
        );
        assert!(parse_tag_list(br#"{"name":"app","tags":null}"#)
            .unwrap()
            .is_empty());
        assert!(parse_tag_list(br#"{"name":"app"}"#).unwrap().is_empty());
        for bad in [
            &br#"{"tags":["ok","bad tag"]}"#[..],
            b"[]",
            b"{",
            br#"{"tags":[1]}"#,
        ] {
            assert!(
                parse_tag_list(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let rel = r#"</v2/app/tags/list?n=2&last=b>; rel="next""#;
        assert_eq!(next_link(rel), Some("/v2/app/tags/list?n=2&last=b"));
        let abs = r#"<https://r.example/v2/a/tags/list?last=x>; rel=next"#;
        assert_eq!(
            next_link(abs),
            Some("https://r.example/v2/a/tags/list?last=x")
        );
        let several = r#"</first>; rel="first", </n>; title="x"; rel="prev next""#;
        assert_eq!(next_link(several), Some("/n"));
        for none in [
            "",
            "</p>; rel=\"prev\"",
            "/no/brackets; rel=next",
            "<unclosed; rel=next",
        ] {
            assert_eq!(next_link(none), None, "{none}");
        }
    }

    #[test]
    fn a_blob_is_checked_as_it_streams() {
        let data = b"layer bytes".to_vec();
        let d = desc(&data);
        let quiet = |_: u64| {};
        let mut ok = Checked::new(&data[..], &d, &quiet);
        assert_eq!(read_all(&mut ok).unwrap(), data);
        ok.finish(false).unwrap();

        let mut bad = data.clone();
        bad[0] ^= 1;
        let e = read_all(&mut Checked::new(&bad[..], &d, &quiet)).unwrap_err();
        assert!(e.to_string().contains("digest mismatch"), "{e}");
        let e = read_all(&mut Checked::new(&data[..5], &d, &quiet)).unwrap_err();
        assert!(e.to_string().contains("truncated: 5 of 11"), "{e}");
        let long = [&data[..], b"x"].concat();
        let mut c = Checked::new(&long[..], &d, &quiet);
        let e = read_all(&mut c).unwrap_err();
        assert!(e.to_string().contains("longer than the 11 bytes"), "{e}");
        // Read again after that (`finish` after the decoder failed on it):
        // the same cause, not an overflow.
        let e = c.finish(true).unwrap_err();
        assert!(
            e.to_string()
                .contains("longer than the 11 bytes its descriptor says"),
            "{e}"
        );
        // A consumer that stops early: `finish` still reads to the end and checks.
        let mut part = Checked::new(&bad[..], &d, &quiet);
        part.read_exact(&mut [0; 3]).unwrap();
        assert!(part.finish(false).is_err());
    }

    /// An endless blob of zeros that counts what was read from it.
    struct Endless<'a> {
        read: &'a std::sync::atomic::AtomicU64,
        stopped: &'a std::sync::atomic::AtomicBool,
    }

    impl Read for Endless<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            use std::sync::atomic::Ordering::SeqCst;
            if self.stopped.load(SeqCst) {
                return Err(io::Error::other("stopped"));
            }
            if self.read.load(SeqCst) > 1 << 30 {
                return Err(io::Error::other("drained a GiB"));
            }
            buf.fill(0);
            self.read.fetch_add(buf.len() as u64, SeqCst);
            Ok(buf.len())
        }
    }

    #[test]
    fn a_consumer_that_fails_stops_the_transfer_and_its_error_stands() {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
        let (read, stopped) = (AtomicU64::new(0), AtomicBool::new(false));
        let mut raw = Endless {
            read: &read,
            stopped: &stopped,
        };
        let e = pipelined_until(
            &mut raw,
            "layer 1",
            &|| stopped.store(true, SeqCst),
            |r, _| io::copy(r, &mut io::sink()).map(|_| ()),
            |plain| {
                plain.read_exact(&mut [0; 512])?;
                bail!("entry ../escape refused")
            },
        )
        .unwrap_err();
        assert_eq!(format!("{e:#}"), "entry ../escape refused");
        assert!(stopped.load(SeqCst), "the transfer was stopped");
        // What was in flight (a few chunks), not the rest of the blob.
        let n = read.load(SeqCst);
        assert!(n < 64 << 20, "{n} bytes read");
    }
}
