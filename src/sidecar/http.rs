//! `--http-bind ADDR:PORT`: `/healthz`, `/readyz` and `/metrics`, and
//! nothing else, on threads of their own. A strict HTTP/1.x request parser
//! (a request head of at most `MAX_HEAD` bytes, read within `TIMEOUT`, GET or
//! HEAD, no body) answers anything else with a 4xx and closes the
//! connection. A few threads, one connection at a time each, every one
//! bounded in time and size, so nothing a client sends can stall the sync
//! loop or grow memory: the loop never waits on them.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::metrics::Health;

/// The longest request head: probes and scrapers send a few hundred bytes.
const MAX_HEAD: usize = 8192;
/// How long a client has to send its request head, and to take the answer.
const TIMEOUT: Duration = Duration::from_secs(2);

/// Threads that accept and answer, each one connection at a time: a client
/// that stalls holds one of them for at most `TIMEOUT`, and a probe still
/// finds another.
const WORKERS: usize = 4;

/// Listen on `addr` (only there) and serve from threads of their own, for
/// as long as the process runs.
pub fn serve(addr: SocketAddr, health: Arc<Health>) -> Result<()> {
    let listener = TcpListener::bind(addr)
        .with_context(|| format!("cannot listen on {addr} (--http-bind)"))?;
    for i in 0..WORKERS {
        let listener = listener
            .try_clone()
            .context("cannot share the listening socket")?;
        let health = health.clone();
        std::thread::Builder::new()
            .name(format!("http-{i}"))
            .spawn(move || loop {
                match listener.accept() {
                    // A client that went away is its own problem, not the loop's.
                    Ok((stream, _)) => {
                        let _ = answer(stream, &health);
                    }
                    // Out of descriptors, say: do not spin on it.
                    Err(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            })
            .context("cannot start the HTTP threads")?;
    }
    Ok(())
}

/// A request that parsed: what to send and whether with a body.
#[derive(Debug, PartialEq, Eq)]
pub struct Request<'a> {
    pub head_only: bool,
    pub path: &'a str,
}

/// Why a request is refused: its status code and reason.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub struct Refusal(pub u16, pub &'static str);

const BAD_REQUEST: Refusal = Refusal(400, "Bad Request");

fn answer(mut stream: TcpStream, health: &Health) -> io::Result<()> {
    stream.set_write_timeout(Some(TIMEOUT))?;
    let mut buf = [0u8; MAX_HEAD];
    let response = match read_head(&mut stream, &mut buf) {
        Ok(Some(len)) => match parse(&buf[..len]) {
            Ok(req) => respond(&req, health),
            Err(r) => refusal(r),
        },
        Ok(None) => return Ok(()), // closed before a byte: a port check
        Err(r) => refusal(r),
    };
    stream.write_all(&response)?;
    stream.flush()?;
    let _ = stream.shutdown(std::net::Shutdown::Both);
    Ok(())
}

/// Read up to the end of the request head into `buf`: its length, `None`
/// when the client closed before sending anything, or the refusal (408 too
/// slow, 431 too large, 400 cut short).
fn read_head(stream: &mut TcpStream, buf: &mut [u8; MAX_HEAD]) -> Result<Option<usize>, Refusal> {
    let deadline = Instant::now() + TIMEOUT;
    let mut len = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return Err(Refusal(408, "Request Timeout"));
        }
        match stream.read(&mut buf[len..]) {
            Ok(0) if len == 0 => return Ok(None),
            Ok(0) => return Err(BAD_REQUEST),
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(Refusal(408, "Request Timeout"))
            }
            Err(_) => return Err(BAD_REQUEST),
        }
        if let Some(end) = find(&buf[..len], b"\r\n\r\n") {
            return Ok(Some(end + 4));
        }
        if len == buf.len() {
            return Err(Refusal(431, "Request Header Fields Too Large"));
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Parse a request head (up to and including the blank line), strictly:
/// CRLF line ends, `METHOD SP /path SP HTTP/1.x`, `Name: value` headers of
/// visible ASCII, `Host` with HTTP/1.1, no body, GET or HEAD only.
pub fn parse(head: &[u8]) -> Result<Request<'_>, Refusal> {
    let text = std::str::from_utf8(head).map_err(|_| BAD_REQUEST)?;
    let text = text.strip_suffix("\r\n\r\n").ok_or(BAD_REQUEST)?;
    // Visible ASCII, spaces and tabs only: a bare CR or LF is refused too.
    let ok_bytes = |s: &str| s.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b));
    let mut lines = text.split("\r\n");
    if !text.split("\r\n").all(ok_bytes) {
        return Err(BAD_REQUEST);
    }
    let line = lines.next().ok_or(BAD_REQUEST)?;
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(BAD_REQUEST);
    };
    if method.is_empty() || !method.bytes().all(is_token) {
        return Err(BAD_REQUEST);
    }
    if !target.starts_with('/') || !ok_bytes(target) {
        return Err(BAD_REQUEST);
    }
    let http11 = match version {
        "HTTP/1.1" => true,
        "HTTP/1.0" => false,
        // HTTP/2 and the rest: a 4xx, as the SPEC has every bad request get.
        _ => return Err(BAD_REQUEST),
    };
    let mut host = false;
    for h in lines {
        let (name, value) = h.split_once(':').ok_or(BAD_REQUEST)?;
        if name.is_empty() || !name.bytes().all(is_token) || !ok_bytes(value) {
            return Err(BAD_REQUEST);
        }
        let value = value.trim_matches([' ', '\t']);
        if name.eq_ignore_ascii_case("host") {
            if host {
                return Err(BAD_REQUEST);
            }
            host = true;
        } else if name.eq_ignore_ascii_case("transfer-encoding")
            || (name.eq_ignore_ascii_case("content-length") && value != "0")
        {
            return Err(Refusal(413, "Content Too Large"));
        }
    }
    if http11 && !host {
        return Err(BAD_REQUEST);
    }
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => return Err(Refusal(405, "Method Not Allowed")),
    };
    Ok(Request {
        head_only,
        path: target,
    })
}

/// A token character of RFC 9110 (method and header names).
fn is_token(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn respond(req: &Request, health: &Health) -> Vec<u8> {
    let (status, body, ctype) = match req.path {
        "/healthz" | "/readyz" => {
            let up = match req.path {
                "/healthz" => health.healthy(),
                _ => health.ready(),
            };
            match up {
                true => ((200, "OK"), "ok\n".to_string(), TEXT),
                false => ((503, "Service Unavailable"), "not ok\n".to_string(), TEXT),
            }
        }
        "/metrics" => {
            let process = crate::sys::process_figures();
            ((200, "OK"), health.render(process.as_ref()), METRICS)
        }
        _ => ((404, "Not Found"), "not found\n".to_string(), TEXT),
    };
    // HEAD: the head GET would get, its Content-Length included, no body.
    let len = body.len();
    let body = if req.head_only { "" } else { &body };
    message(status, ctype, len, body, "")
}

const TEXT: &str = "text/plain; charset=utf-8";
const METRICS: &str = "text/plain; version=0.0.4; charset=utf-8";

fn refusal(Refusal(code, reason): Refusal) -> Vec<u8> {
    let body = format!("{code} {reason}\n");
    let extra = if code == 405 {
        "Allow: GET, HEAD\r\n"
    } else {
        ""
    };
    message((code, reason), TEXT, body.len(), &body, extra)
}

fn message(status: (u16, &str), ctype: &str, len: usize, body: &str, extra: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {ctype}\r\nContent-Length: {len}\r\n{extra}Connection: close\r\n\r\n{body}",
        status.0, status.1
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(head: &str) -> u16 {
        match parse(head.as_bytes()) {
            Ok(_) => 200,
            Err(Refusal(c, _)) => c,
        }
    }

    #[test]
    fn probes_and_scrapers_parse() {
        let req = parse(b"GET /healthz HTTP/1.1\r\nHost: 10.0.0.1:8080\r\nUser-Agent: kube-probe/1.30\r\nAccept: */*\r\nConnection: close\r\n\r\n").unwrap();
        assert_eq!(
            req,
            Request {
                head_only: false,
                path: "/healthz"
            }
        );
        assert!(parse(b"HEAD /metrics HTTP/1.0\r\n\r\n").unwrap().head_only);
        assert_eq!(
            code("GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"),
            200
        );
    }

    #[test]
    fn anything_else_is_refused_with_a_4xx() {
        for (head, want) in [
            ("GET /healthz HTTP/1.1\r\n\r\n", 400),             // no Host
            ("GET /healthz HTTP/1.1\nHost: x\n\n", 400),        // bare LF
            ("GET  /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 400), // two spaces
            ("GET healthz HTTP/1.1\r\nHost: x\r\n\r\n", 400),   // not a path
            ("GET /healthz\r\nHost: x\r\n\r\n", 400),           // HTTP/0.9
            ("GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n", 400),
            ("GET /healthz FTP/1.1\r\nHost: x\r\n\r\n", 400),
            ("POST /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 405),
            ("G(T /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 400),
            ("GET /healthz HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400),
            ("GET /healthz HTTP/1.1\r\nHost x\r\n\r\n", 400),
            ("GET /healthz HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n", 400),
            (
                "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n",
                413,
            ),
            (
                "GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
                413,
            ),
            ("GET /h\u{e9} HTTP/1.1\r\nHost: x\r\n\r\n", 400),
            ("GET /healthz HTTP/1.1\r\nHost: \u{1}\r\n\r\n", 400),
            ("GET /healthz HTTP/1.1\r\nHost: x\r\n", 400),
            ("", 400),
        ] {
            assert_eq!(code(head), want, "{head:?}");
        }
    }
}
