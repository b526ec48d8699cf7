//! The HTTP client of the sources that are not on this host (`https://`,
//! `oci://`): blocking (ureq on rustls, no async runtime), TLS verified
//! against the system's roots, the roots compiled into the binary and
//! `--ca-file`; `--timeout` for connecting, for an answer's headers (and
//! a document's body) to arrive whole, and as the stall window of a body
//! (`wire`); `--round-timeout` over all of it; redirects followed by hand,
//! so that credentials and `--header`s never go to another host and an
//! `https://` request never goes on over plain HTTP; plain HTTP only where
//! the caller allows it. A connection is not kept for another request: the
//! first failure closes it, nothing more is read.
//!
//! Everything a peer sends is hostile until parsed: a body that is parsed
//! (a manifest, an index, a token) is read to a bound (`read_document`),
//! and every failure is one line naming the status or the cause; callers
//! prefix the source. Nothing here writes anywhere.

pub mod auth;
pub mod helper;
mod tls;
mod wire;

use std::fmt;
use std::io::{self, Read};
use std::net::IpAddr;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
pub use url::Url;

use crate::clock;
use crate::config::Remote;
pub use wire::Abort;
use wire::Guard;

/// The most a parsed document (a manifest, an index, token JSON) may hold.
pub const MAX_DOCUMENT: u64 = 4 << 20;

/// Redirects followed for one request (a registry sends a blob to storage).
const MAX_REDIRECTS: usize = 5;

/// Waits (ms) before the attempts of a request the peer may answer next
/// time: a refused or reset connection, 429, 502, 503, 504.
const RETRY_WAITS: &[u64] = &[0, 250, 1000];

/// One client per sync: the TLS roots, built once, and the sync's
/// `--round-timeout` deadline.
pub struct Client {
    tls: Arc<rustls::ClientConfig>,
    insecure: Vec<String>,
    timeout: Duration,
    round: Option<(Instant, Duration)>,
}

/// A request: GET (or HEAD) of `url` with these headers. `auth` is the
/// `Authorization` value; it and `headers` go only to `url`'s own host.
pub struct Get<'a> {
    pub url: Url,
    pub headers: &'a [(String, String)],
    pub auth: Option<&'a str>,
    pub head: bool,
    /// Follow redirects (a blob, a bundle); else a 3xx is the answer.
    pub follow: bool,
    /// Plain HTTP to any host (a URL the user wrote as `http://`); else
    /// only to loopback and `--insecure-registry` hosts.
    pub any_http: bool,
    /// POST this `application/x-www-form-urlencoded` body instead (an
    /// OAuth2 token request).
    pub form: Option<&'a str>,
    /// Ask for these bytes only (`Range: bytes=START-END`): `(start,
    /// length)`, length at least 1. Sent after redirects too (a blob's
    /// storage answers it); `Reply::ranged` checks the answer.
    pub range: Option<(u64, u64)>,
}

impl<'a> Get<'a> {
    pub fn new(url: Url) -> Get<'a> {
        Get {
            url,
            headers: &[],
            auth: None,
            head: false,
            follow: true,
            any_http: false,
            form: None,
            range: None,
        }
    }
}

/// An answer with a status below 400 (a 304 among them).
pub struct Reply {
    pub status: u16,
    resp: ureq::Response,
    guard: Arc<Guard>,
}

/// Why a request has no answer: the peer's status, or no answer at all.
#[derive(Debug)]
pub enum Failed {
    /// The server answered 4xx/5xx; `challenge` is its `WWW-Authenticate`.
    Status {
        code: u16,
        text: String,
        challenge: Option<String>,
    },
    /// Plain HTTP to a host that is neither loopback nor an
    /// `--insecure-registry`.
    PlainHttp(String),
    /// No answer: DNS, connect, TLS, a timeout, a broken connection.
    Transport(String),
    /// A redirect from `https://` to this `http://` URL.
    Downgrade(String),
    /// Ended from this side: a signal, `--timeout`, `--round-timeout`.
    Ended(Abort),
}

impl Failed {
    pub fn code(&self) -> Option<u16> {
        match self {
            Failed::Status { code, .. } => Some(*code),
            _ => None,
        }
    }
}

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failed::Status { code, text, .. } => write!(f, "{code} {text}"),
            Failed::PlainHttp(host) => write!(
                f,
                "refusing plain HTTP to {host} (pass --insecure-registry {host} to allow it)"
            ),
            Failed::Transport(why) => f.write_str(why),
            Failed::Downgrade(url) => {
                write!(f, "redirect from https to http refused (to {url})")
            }
            Failed::Ended(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for Failed {}

impl Client {
    /// The client for `remote`'s flags: an unreadable `--ca-file` is a usage error.
    pub fn new(remote: &Remote) -> Result<Client> {
        Ok(Client {
            tls: tls::config(remote.ca_file.as_deref())?,
            insecure: remote.insecure_registries.clone(),
            timeout: remote.timeout,
            round: remote.round_timeout.map(|d| (Instant::now() + d, d)),
        })
    }

    /// An agent for one attempt of one request: its connection goes
    /// through `guard`, with TLS or (`plain`) without, and is never pooled.
    fn agent(&self, guard: &Arc<Guard>, plain: bool) -> ureq::Agent {
        let connector = wire::Connector {
            tls: (!plain).then(|| self.tls.clone()),
            guard: guard.clone(),
            timeout: self.timeout,
        };
        ureq::AgentBuilder::new()
            .tls_connector(Arc::new(connector))
            .timeout_connect(self.timeout)
            .max_idle_connections(0)
            .redirects(0)
            .user_agent(concat!("packsync/", env!("CARGO_PKG_VERSION")))
            .build()
    }

    /// Whether plain HTTP may go to `url`'s host: loopback always (as
    /// Docker allows), others only when named by `--insecure-registry`.
    pub fn plain_http_allowed(&self, url: &Url) -> bool {
        let host = url.host_str().unwrap_or("");
        let with_port = match url.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.to_string(),
        };
        is_loopback(host) || self.insecure.iter().any(|h| h == &with_port || h == host)
    }

    /// Send `req`, following redirects where it says so, retrying what may
    /// pass (a refused connection, 429, 502-504) after growing waits.
    pub fn send(&self, req: &Get<'_>) -> Result<Reply, Failed> {
        let mut url = req.url.clone();
        let first = origin(&url);
        let mut https = false;
        for _ in 0..=MAX_REDIRECTS {
            https |= url.scheme() == "https";
            if url.scheme() == "http" && https {
                return Err(Failed::Downgrade(url.to_string()));
            }
            if url.scheme() == "http" && !req.any_http && !self.plain_http_allowed(&url) {
                return Err(Failed::PlainHttp(host_port(&url)));
            }
            // Credentials and the user's headers go to the host they were given for.
            let same = origin(&url) == first;
            let (resp, guard) = self.once(req, &url, same)?;
            let status = resp.status();
            let location = resp.header("location").map(str::to_string);
            match location {
                Some(loc) if req.follow && (300..400).contains(&status) && status != 304 => {
                    url = url
                        .join(&loc)
                        .map_err(|e| Failed::Transport(format!("bad redirect to {loc:?}: {e}")))?;
                    if !matches!(url.scheme(), "http" | "https") {
                        return Err(Failed::Transport(format!("redirect to {url} refused")));
                    }
                }
                _ => {
                    return Ok(Reply {
                        status,
                        resp,
                        guard,
                    })
                }
            }
        }
        Err(Failed::Transport(format!(
            "more than {MAX_REDIRECTS} redirects"
        )))
    }

    fn once(
        &self,
        req: &Get<'_>,
        url: &Url,
        same_host: bool,
    ) -> Result<(ureq::Response, Arc<Guard>), Failed> {
        // ureq lets a connector take over https:// connections only: plain
        // HTTP is asked for as https:// to the same port, with the Host
        // header of the http:// URL, and the connector speaks no TLS.
        let plain = url.scheme() == "http";
        let mut asked = url.clone();
        if plain {
            let port = url.port_or_known_default();
            asked
                .set_scheme("https")
                .expect("http and https are special");
            asked.set_port(port).expect("a URL with a host");
        }
        clock::retry(RETRY_WAITS, |_| {
            // A signal during a wait between attempts: no further attempt.
            if let Some(sig) = crate::sys::signals::pending() {
                return ControlFlow::Break(Err(Failed::Ended(Abort::Signal(sig))));
            }
            let guard = Guard::new(self.timeout, self.round);
            let method = match (req.form, req.head) {
                (Some(_), _) => "POST",
                (None, true) => "HEAD",
                (None, false) => "GET",
            };
            let mut r = self.agent(&guard, plain).request_url(method, &asked);
            if plain {
                r = r.set("Host", &host_port(url));
            }
            if let Some((start, len)) = req.range {
                let end = start + len.max(1) - 1;
                r = r.set("Range", &format!("bytes={start}-{end}"));
            }
            if same_host {
                for (k, v) in req.headers {
                    r = r.set(k, v);
                }
                if let Some(a) = req.auth {
                    r = r.set("Authorization", a);
                }
            }
            let answer = match req.form {
                Some(body) => r
                    .set("Content-Type", "application/x-www-form-urlencoded")
                    .send_string(body),
                None => r.call(),
            };
            match guard.aborted() {
                Some(Abort::Late(t)) => {
                    return ControlFlow::Break(Err(Failed::Transport(format!(
                        "no whole answer from {} within {} (--timeout)",
                        host_port(url),
                        humantime::format_duration(t)
                    ))))
                }
                Some(why) => return ControlFlow::Break(Err(Failed::Ended(why))),
                None => {}
            }
            match answer {
                Ok(resp) => ControlFlow::Break(Ok((resp, guard))),
                Err(ureq::Error::Status(code, resp)) => {
                    let failed = Failed::Status {
                        code,
                        text: reason(code, resp.status_text()),
                        challenge: resp.header("www-authenticate").map(str::to_string),
                    };
                    if matches!(code, 429 | 502 | 503 | 504) {
                        ControlFlow::Continue(failed)
                    } else {
                        ControlFlow::Break(Err(failed))
                    }
                }
                Err(ureq::Error::Transport(t)) => {
                    let again = matches!(
                        t.kind(),
                        ureq::ErrorKind::ConnectionFailed | ureq::ErrorKind::Io
                    ) && !timed_out(&t);
                    let failed = Failed::Transport(self.transport_text(url, &t));
                    if again {
                        ControlFlow::Continue(failed)
                    } else {
                        ControlFlow::Break(Err(failed))
                    }
                }
            }
        })
        .and_then(|r| r)
    }

    fn transport_text(&self, url: &Url, t: &ureq::Transport) -> String {
        let host = host_port(url);
        if timed_out(t) {
            return format!(
                "no answer from {host} within {} (--timeout)",
                humantime::format_duration(self.timeout)
            );
        }
        let mut why = t.message().map(str::to_string).unwrap_or_default();
        let mut src = std::error::Error::source(t);
        while let Some(e) = src {
            if why.is_empty() {
                why = e.to_string();
            } else if !why.contains(&e.to_string()) {
                why = format!("{why}: {e}");
            }
            src = e.source();
        }
        let tls = why.contains("certificate") || why.contains("tls") || why.contains("TLS");
        match (t.kind(), tls) {
            (_, true) => format!("TLS failure with {host}: {why}"),
            (ureq::ErrorKind::Dns, _) => format!("cannot resolve {host}: {why}"),
            (ureq::ErrorKind::ConnectionFailed, _) => format!("cannot connect to {host}: {why}"),
            _ => format!("{host}: {why}"),
        }
    }
}

/// Scheme, host and port: what "the same host" means for credentials.
fn origin(url: &Url) -> (String, Option<String>, Option<u16>) {
    (
        url.scheme().to_string(),
        url.host_str().map(str::to_string),
        url.port_or_known_default(),
    )
}

/// `host[:port]` as the user would write it.
pub fn host_port(url: &Url) -> String {
    let host = url.host_str().unwrap_or("");
    match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    }
}

/// 127.0.0.0/8, ::1 and `localhost`.
pub fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn timed_out(t: &ureq::Transport) -> bool {
    let mut src = std::error::Error::source(t);
    while let Some(e) = src {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            if matches!(
                io.kind(),
                io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
            ) {
                return true;
            }
        }
        src = e.source();
    }
    false
}

/// The reason phrase the server gave, else the standard one.
fn reason(code: u16, given: &str) -> String {
    if !given.trim().is_empty()
        && given.len() < 64
        && given.bytes().all(|b| (b' '..0x7f).contains(&b))
    {
        return given.trim().to_string();
    }
    match code {
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "",
    }
    .to_string()
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.resp.header(name)
    }

    /// The declared length of the body, if any.
    pub fn length(&self) -> Option<u64> {
        self.header("content-length")?.trim().parse().ok()
    }

    /// The body as it streams: less than 1 KiB in `--timeout` of waiting
    /// is a stall, an error saying so.
    pub fn into_reader(self) -> Body {
        self.guard.stream();
        Body {
            inner: self.resp.into_reader(),
            guard: self.guard,
        }
    }

    /// The whole body, which must be at most `max` bytes (a manifest, an
    /// index, token JSON).
    pub fn read_document(self, max: u64) -> Result<Vec<u8>, Failed> {
        if self.length().is_some_and(|n| n > max) {
            return Err(Failed::Transport(format!(
                "the answer is larger than {max} bytes"
            )));
        }
        // Not streamed: the whole document within `--timeout` of the request.
        let mut out = Vec::new();
        let mut body = Body {
            inner: self.resp.into_reader(),
            guard: self.guard,
        }
        .take(max + 1);
        body.read_to_end(&mut out)
            .map_err(|e| Failed::Transport(format!("reading the answer: {e}")))?;
        if out.len() as u64 > max {
            return Err(Failed::Transport(format!(
                "the answer is larger than {max} bytes"
            )));
        }
        Ok(out)
    }
}

/// What a server made of a `Range` request (`Reply::ranged`).
pub enum Ranged {
    /// 206 with the bytes asked for: exactly that many are read, a shorter
    /// body is an error.
    Part(Exact<Body>),
    /// 200: the server ignored `Range` and sends the whole resource: the
    /// body is dropped (the connection closes, nothing more is read), and
    /// the caller reads the resource whole with a request of its own.
    Whole,
}

/// The `START-END/TOTAL` of a `Content-Range: bytes START-END/TOTAL`
/// header (TOTAL may be `*`), if it is one.
pub fn content_range(value: &str) -> Option<(u64, u64, Option<u64>)> {
    let rest = value.trim().strip_prefix("bytes")?.trim_start();
    let (span, total) = rest.split_once('/')?;
    let (a, b) = span.trim().split_once('-')?;
    let digits = |t: &str| !t.is_empty() && t.len() <= 19 && t.bytes().all(|c| c.is_ascii_digit());
    let (a, b, total) = (a.trim(), b.trim(), total.trim());
    if !digits(a) || !digits(b) || !(total == "*" || digits(total)) {
        return None;
    }
    let (a, b): (u64, u64) = (a.parse().ok()?, b.parse().ok()?);
    let total = match total {
        "*" => None,
        t => Some(t.parse().ok()?),
    };
    if b < a || total.is_some_and(|t| b >= t) {
        return None;
    }
    Some((a, b, total))
}

/// A reader of exactly `left` bytes: fewer before the end is an error.
pub struct Exact<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Exact<R> {
    pub fn new(inner: R, len: u64) -> Exact<R> {
        Exact { inner, left: len }
    }
}

impl<R: Read> Read for Exact<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 || buf.is_empty() {
            return Ok(0);
        }
        let room = buf.len().min(self.left.min(usize::MAX as u64) as usize);
        let n = self.inner.read(&mut buf[..room])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("the range ended {} bytes short", self.left),
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

impl Reply {
    /// The answer to a request with `range: Some((start, len))`, checked: a
    /// 206 must name exactly those bytes in its `Content-Range` and, where
    /// it gives one, its `Content-Length`; anything else is an error (one
    /// line saying what came). A 200 is `Ranged::Whole`.
    pub fn ranged(self, start: u64, len: u64) -> Result<Ranged, Failed> {
        match self.status {
            200 => Ok(Ranged::Whole),
            206 => {
                let cr = self.header("content-range").map(str::to_string);
                let end = start + len - 1;
                match cr.as_deref().and_then(content_range) {
                    Some((a, b, _)) if a == start && b == end => {}
                    _ => {
                        return Err(Failed::Transport(format!(
                            "asked for bytes {start}-{end}, the answer's Content-Range is {}",
                            cr.as_deref().map_or("missing".into(), |c| format!("{c:?}"))
                        )))
                    }
                }
                if let Some(n) = self.length().filter(|&n| n != len) {
                    return Err(Failed::Transport(format!(
                        "asked for {len} bytes ({start}-{end}), the answer holds {n}"
                    )));
                }
                Ok(Ranged::Part(Exact::new(self.into_reader(), len)))
            }
            s => Err(Failed::Transport(format!(
                "asked for a range, the answer is {s}"
            ))),
        }
    }
}

/// A response body; its read errors say what went wrong in words.
/// Dropping it closes the connection.
pub struct Body {
    inner: Box<dyn Read + Send + Sync + 'static>,
    guard: Arc<Guard>,
}

/// Ends a `Body`'s transfer from another thread: the read under way (or
/// the next) fails within a fraction of a second, nothing more is read.
#[derive(Clone, Default)]
pub struct Stop(Option<Arc<Guard>>);

impl Stop {
    pub fn stop(&self) {
        if let Some(g) = &self.0 {
            g.stop();
        }
    }
}

impl Body {
    pub fn stopper(&self) -> Stop {
        Stop(Some(self.guard.clone()))
    }
}

impl Read for Body {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner
            .read(buf)
            .map_err(|e| match self.guard.aborted() {
                // ureq may have wrapped the socket's error (chunked bodies).
                Some(why) => why.io(),
                None => match e.kind() {
                    io::ErrorKind::UnexpectedEof => io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the connection closed before the whole body arrived",
                    ),
                    _ => e,
                },
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for h in ["127.0.0.1", "127.1.2.3", "[::1]", "localhost", "LOCALHOST"] {
            assert!(is_loopback(h), "{h}");
        }
        for h in ["10.0.0.1", "registry.example", "[::2]", "localhost.example"] {
            assert!(!is_loopback(h), "{h}");
        }
    }

    #[test]
    fn plain_http_needs_loopback_or_the_flag() {
        let c = Client::new(&Remote {
            insecure_registries: vec!["reg.example:5000".into()],
            timeout: Duration::from_secs(1),
            ..Default::default()
        })
        .unwrap();
        let ok = |u: &str| c.plain_http_allowed(&Url::parse(u).unwrap());
        assert!(ok("http://127.0.0.1:5000/v2/"));
        assert!(ok("http://[::1]:5000/v2/"));
        assert!(ok("http://reg.example:5000/v2/"));
        assert!(!ok("http://reg.example/v2/"));
        assert!(!ok("http://other.example:5000/v2/"));
        let refused = c
            .send(&Get::new(Url::parse("http://other.example/v2/").unwrap()))
            .err()
            .unwrap();
        assert!(matches!(refused, Failed::PlainHttp(_)), "{refused}");
        assert!(refused
            .to_string()
            .contains("--insecure-registry other.example"));
    }

    #[test]
    fn content_ranges_are_read_strictly() {
        assert_eq!(content_range("bytes 0-9/100"), Some((0, 9, Some(100))));
        assert_eq!(content_range("bytes 5-5/*"), Some((5, 5, None)));
        for bad in [
            "",
            "bytes",
            "bytes 9-0/100",
            "bytes 0-100/100",
            "bytes -1-2/3",
            "items 0-1/2",
            "bytes 0-1",
            "bytes a-b/c",
            "bytes 0-1/+5",
        ] {
            assert_eq!(content_range(bad), None, "{bad}");
        }
    }

    #[test]
    fn an_exact_reader_refuses_a_short_body() {
        let mut ok = Exact::new(&b"abcdef"[..], 4);
        let mut v = Vec::new();
        ok.read_to_end(&mut v).unwrap();
        assert_eq!(v, b"abcd");
        let e = Exact::new(&b"ab"[..], 4)
            .read_to_end(&mut Vec::new())
            .unwrap_err();
        assert!(e.to_string().contains("2 bytes short"), "{e}");
    }

    #[test]
    fn reasons_are_the_servers_or_the_standard_ones() {
        assert_eq!(reason(401, ""), "Unauthorized");
        assert_eq!(reason(404, "Not Found"), "Not Found");
        assert_eq!(reason(500, "x\r\ny"), "Internal Server Error");
    }
}
