//! `https://…` and `http://…` sources: an archive (an OPA bundle, a release
//! tarball) fetched with one GET, its body streamed into the spool, which
//! recognises tar, gzip and zstd by content. The identity a generation
//! records is the URL, the SHA-256 of the body and the validators the
//! server gave (ETag, Last-Modified); the next sync sends them back
//! (`If-None-Match`, `If-Modified-Since`), and a 304 is "up to date" after
//! that one request, with nothing fetched.

use std::io::{self, Read};
use std::sync::Mutex;

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

use super::oci_ref::split_subpath;
use super::{Spool, Stream};
use crate::config::Remote;
use crate::error;
use crate::escape::hex;
use crate::net::{self, Client, Failed, Get, Url};
use crate::report::Reporter;

/// A bundle at a URL: fetched once per sync, conditionally where the live
/// generation recorded validators for it.
pub struct Bundle {
    target: Target,
    label: String,
    client: Client,
    headers: Vec<(String, String)>,
    /// The body of a conditional GET that was not a 304: `fill` reads it,
    /// so a changed bundle costs one request too.
    pending: Mutex<Option<Box<Download>>>,
}

/// `https://…` / `http://…`: parsed now (exit 2 if malformed); nothing is
/// asked of the server before the sync scans.
pub fn open(arg: &str, remote: &Remote) -> Result<Bundle> {
    let target = parse(arg).map_err(|e| error::usage(format!("{arg}: {e:#}")))?;
    // An unreadable --ca-file is a usage error now, not at the first request.
    let client = Client::new(remote)?;
    Ok(Bundle {
        target,
        label: arg.to_string(),
        client,
        headers: headers_of(remote)?,
        pending: Mutex::new(None),
    })
}

/// `--header-file`'s lines, read now (each sync reads them again, so a
/// rotated token is sent from the next round on), then the `--header`s.
/// A file that went bad since the start fails the sync (exit 1).
fn headers_of(remote: &Remote) -> Result<Vec<(String, String)>> {
    let mut headers = Vec::new();
    if let Some(f) = &remote.header_file {
        let text = crate::sys::read_text_bounded(f, crate::config::MAX_HEADER_FILE)
            .map_err(|e| anyhow::anyhow!("{}: cannot read --header-file: {e}", f.display()))?;
        headers = crate::config::parse_header_lines(&text)
            .map_err(|e| anyhow::anyhow!("{}: {e:#}", f.display()))?;
    }
    headers.extend(remote.headers.iter().cloned());
    Ok(headers)
}

impl Bundle {
    /// Whether the server says the bundle `recorded` describes (the live
    /// generation's identity for this source) is current: a 304 to the
    /// validators it holds. One request, made now whatever `recorded` is
    /// (a failure shows before anything is written); a 200 is kept for
    /// `fill`.
    pub fn unchanged_since(&self, recorded: &str) -> Result<bool> {
        let prev = Identity::parse(recorded, self.target.url.as_str())
            .filter(|p| p.etag.is_some() || p.last_modified.is_some());
        match self.fetch(prev.as_ref())? {
            Fetched::NotModified if prev.is_some() => Ok(true),
            Fetched::NotModified => anyhow::bail!(
                "{}: 304 Not Modified to a request that was not conditional",
                self.label
            ),
            Fetched::Body(d) => {
                *self.pending.lock().unwrap() = Some(d);
                Ok(false)
            }
        }
    }
}

/// A body as it streams, counted for the progress bar.
struct Counted<'a> {
    inner: &'a mut Download,
    reporter: &'a dyn Reporter,
}

impl Read for Counted<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.reporter.fetched(n as u64);
        Ok(n)
    }
}

impl Stream for Bundle {
    fn label(&self) -> &str {
        &self.label
    }

    fn subpath(&self) -> Option<&[u8]> {
        self.target.subpath.as_deref()
    }

    fn fill(&self, spool: &mut Spool, reporter: &dyn Reporter) -> Result<String> {
        let pending = self.pending.lock().unwrap().take();
        let mut download = match pending {
            Some(d) => d,
            None => match self.fetch(None)? {
                Fetched::Body(d) => d,
                Fetched::NotModified => anyhow::bail!(
                    "{}: 304 Not Modified to a request that was not conditional",
                    self.label
                ),
            },
        };
        let content_type = download.content_type.take();
        let stop = download.body.stopper();
        let mut counted = Counted {
            inner: &mut download,
            reporter,
        };
        // The rest after the archive's end is read for the body's hash;
        // after a failure nothing more is read, and dropping the body
        // closes the connection.
        super::oci_fetch::pipelined_until(
            &mut counted,
            &self.label,
            &|| stop.stop(),
            |c, failed| match failed {
                true => Ok(()),
                false => io::copy(c, &mut io::sink()).map(|_| ()),
            },
            |plain| spool.apply(plain, false, &self.label, reporter).map(|_| ()),
        )
        .map_err(|e| not_an_archive(e, &self.label, content_type.as_deref()))?;
        let id = download
            .identity(&self.target.url)
            .with_context(|| self.label.clone())?;
        Ok(id.text())
    }
}

/// A URL source, parsed: the URL and the `//PATH` it may end in.
pub struct Target {
    pub url: Url,
    pub subpath: Option<Vec<u8>>,
}

/// `https://HOST/PATH[//SUBPATH]`; a malformed URL is a usage error.
pub fn parse(arg: &str) -> Result<Target> {
    let after = arg.find("://").map_or(0, |i| i + 3);
    let (main, subpath) = split_subpath(arg, after)?;
    let url = Url::parse(main).map_err(|e| anyhow::anyhow!("not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        anyhow::bail!("not an http:// or https:// URL with a host");
    }
    if !url.username().is_empty() || url.password().is_some() {
        anyhow::bail!(
            "credentials in a URL would be shown and recorded: use --header or --header-file"
        );
    }
    Ok(Target { url, subpath })
}

/// What a fetch recorded: `URL sha256:<hex>[ etag=<etag>][ last-modified=<date>]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub url: String,
    pub sha256: String,
    pub etag: Option<String>,
    pub last_modified: Option<String>,
}

impl Identity {
    pub fn text(&self) -> String {
        let mut s = format!("{} sha256:{}", self.url, self.sha256);
        if let Some(e) = &self.etag {
            s.push_str(&format!(" etag={e}"));
        }
        if let Some(l) = &self.last_modified {
            s.push_str(&format!(" last-modified={l}"));
        }
        s
    }

    /// The identity `text` wrote for `url`, or `None` (another source, or
    /// something else).
    pub fn parse(text: &str, url: &str) -> Option<Identity> {
        let rest = text.strip_prefix(url)?.strip_prefix(" sha256:")?;
        let (sha, mut rest) = rest.split_at(rest.find(' ').unwrap_or(rest.len()));
        if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut id = Identity {
            url: url.to_string(),
            sha256: sha.to_string(),
            etag: None,
            last_modified: None,
        };
        if let Some(r) = rest.strip_prefix(" etag=") {
            let end = r.find(' ').unwrap_or(r.len());
            id.etag = Some(r[..end].to_string());
            rest = &r[end..];
        }
        if let Some(r) = rest.strip_prefix(" last-modified=") {
            id.last_modified = Some(r.to_string());
            rest = "";
        }
        rest.is_empty().then_some(id)
    }
}

/// The answer to the conditional GET.
pub enum Fetched {
    /// 304: what the live generation holds is current.
    NotModified,
    /// The body, streaming, and the validators that came with it.
    Body(Box<Download>),
}

/// A body as it streams, hashed on the way (the identity's SHA-256).
pub struct Download {
    body: net::Body,
    /// The Content-Type the server gave, to name when the body is no archive.
    content_type: Option<String>,
    hasher: Sha256,
    pub etag: Option<String>,
    pub last_modified: Option<String>,
    pub length: Option<u64>,
    seen: u64,
}

impl Download {
    /// The identity of what was read, once it was read to its end.
    pub fn identity(mut self, url: &Url) -> Result<Identity> {
        io::copy(&mut self, &mut io::sink()).context("reading the rest of the body")?;
        Ok(Identity {
            url: url.to_string(),
            sha256: hex(&self.hasher.finalize()),
            etag: self.etag,
            last_modified: self.last_modified,
        })
    }
}

impl Read for Download {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.body.read(buf)?;
        self.seen += n as u64;
        if n == 0 && !buf.is_empty() {
            if let Some(len) = self.length.filter(|&l| l != self.seen) {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the body ended after {} of {len} bytes", self.seen),
                ));
            }
        }
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// A body that failed to read as an archive, sent as a web page or a JSON
/// answer (a login page, an error document): the Content-Type the server
/// gave is what tells the user, so the error names it.
fn not_an_archive(e: anyhow::Error, label: &str, content_type: Option<&str>) -> anyhow::Error {
    let Some(ct) = content_type else { return e };
    let media = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let textual = media.starts_with("text/")
        || ["json", "xml", "html", "javascript"]
            .iter()
            .any(|t| media.contains(t));
    if !textual || error::exit_code(&e) != 1 {
        return e;
    }
    let why = format!("{e:#}");
    let why = why.strip_prefix(&format!("{label}: ")).unwrap_or(&why);
    anyhow::anyhow!("{label}: the server sent Content-Type: {ct}, not an archive ({why})")
}

/// A header value a peer sent that is safe to record and send back.
fn validator(v: Option<&str>) -> Option<String> {
    v.map(str::trim)
        .filter(|v| !v.is_empty() && v.len() <= 256 && v.bytes().all(|b| (0x20..0x7f).contains(&b)))
        .map(str::to_string)
}

impl Bundle {
    /// GET the URL with the user's headers, conditional on `previous` (the
    /// live generation's identity for this source).
    fn fetch(&self, previous: Option<&Identity>) -> Result<Fetched> {
        let (label, url) = (&self.label, &self.target.url);
        let mut headers = self.headers.clone();
        if let Some(p) = previous {
            if let Some(e) = &p.etag {
                headers.push(("If-None-Match".into(), e.clone()));
            }
            if let Some(l) = &p.last_modified {
                headers.push(("If-Modified-Since".into(), l.clone()));
            }
        }
        let req = Get {
            headers: &headers,
            any_http: true,
            ..Get::new(url.clone())
        };
        let reply = self.client.send(&req).map_err(|e| {
            let hint = match &e {
                Failed::Status {
                    code: 401 | 403, ..
                } => " (credentials: --header or --header-file)",
                _ => "",
            };
            anyhow::anyhow!("{label}: {e}{hint}")
        })?;
        if reply.status == 304 {
            return Ok(Fetched::NotModified);
        }
        if reply.status != 200 {
            anyhow::bail!("{label}: unexpected answer {} (expected 200)", reply.status);
        }
        Ok(Fetched::Body(Box::new(Download {
            etag: validator(reply.header("etag")),
            last_modified: validator(reply.header("last-modified")),
            content_type: validator(reply.header("content-type")),
            length: reply.length(),
            hasher: Sha256::new(),
            seen: 0,
            body: reply.into_reader(),
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_subpaths() {
        let t = parse("https://bundles.example/authz.tar.gz//policies").unwrap();
        assert_eq!(t.url.as_str(), "https://bundles.example/authz.tar.gz");
        assert_eq!(t.subpath.as_deref(), Some(&b"policies"[..]));
        assert!(parse("http://127.0.0.1:8080/b.tar.gz")
            .unwrap()
            .subpath
            .is_none());
        for bad in [
            "https://",
            "ftp://x/y",
            "https://user:pw@bundles.example/x",
            "https://bundles.example/x//",
            "https://bundles.example/x//../y",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn identities_round_trip() {
        let url = "https://bundles.example/authz.tar.gz";
        let id = Identity {
            url: url.into(),
            sha256: "ab".repeat(32),
            etag: Some("W/\"x1\"".into()),
            last_modified: Some("Tue, 01 Dec 2026 11:00:00 GMT".into()),
        };
        assert_eq!(Identity::parse(&id.text(), url), Some(id.clone()));
        let bare = Identity {
            etag: None,
            last_modified: None,
            ..id.clone()
        };
        assert_eq!(Identity::parse(&bare.text(), url), Some(bare));
        assert_eq!(
            Identity::parse(&id.text(), "https://bundles.example/other"),
            None
        );
        assert_eq!(Identity::parse("/some/dir", url), None);
    }
}
