//! Remote sources against servers that misbehave on purpose, all on
//! 127.0.0.1 (std `TcpListener` threads in the test, python3 for TLS): a
//! refused entry followed by endless zeros, a body that stalls, one that
//! trickles a byte at a time, headers that trickle, a body that is fast
//! enough but endless, an `https://` URL redirected to `http://`, a
//! self-signed certificate. Each sync must end promptly with one line, the
//! documented exit code and the volume unchanged; where the server counts
//! what it sent, packsync must have closed the connection early.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::fixture::{Fixture, Run};
use crate::source_oci::{first_line, have, python, tree};

/// What a test server saw.
#[derive(Default)]
struct Seen {
    requests: AtomicUsize,
    /// Body bytes written (headers not counted).
    sent: AtomicU64,
    /// A write failed: the client closed the connection.
    closed: AtomicBool,
}

struct Server {
    port: u16,
    seen: Arc<Seen>,
}

impl Server {
    /// Answer every request with `respond`, one thread a connection.
    fn start(respond: fn(&mut Out) -> std::io::Result<()>) -> Server {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let seen = Arc::new(Seen::default());
        let s = seen.clone();
        std::thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(mut tcp) = conn else { continue };
                let s = s.clone();
                std::thread::spawn(move || {
                    let mut r = BufReader::new(tcp.try_clone().unwrap());
                    let mut line = String::new();
                    while r.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                        line.clear();
                    }
                    s.requests.fetch_add(1, Ordering::SeqCst);
                    let mut out = Out {
                        tcp: &mut tcp,
                        seen: &s,
                    };
                    if respond(&mut out).is_err() {
                        s.closed.store(true, Ordering::SeqCst);
                    }
                });
            }
        });
        Server { port, seen }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

/// A connection being answered: `head` is not counted, `body` is.
struct Out<'a> {
    tcp: &'a mut TcpStream,
    seen: &'a Seen,
}

impl Out<'_> {
    fn head(&mut self, text: &str) -> std::io::Result<()> {
        self.tcp.write_all(text.as_bytes())
    }

    fn body(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.tcp.write_all(data)?;
        self.seen
            .sent
            .fetch_add(data.len() as u64, Ordering::SeqCst);
        Ok(())
    }
}

/// A ustar header for a regular file `name` of `size` bytes.
fn tar_header(name: &str, size: u64) -> [u8; 512] {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    h[100..108].copy_from_slice(b"0000644\0");
    h[108..116].copy_from_slice(b"0000000\0");
    h[116..124].copy_from_slice(b"0000000\0");
    h[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
    h[136..148].copy_from_slice(b"14000000000\0");
    h[148..156].copy_from_slice(b"        ");
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

/// The largest size a ustar header holds: a body that never ends in time.
const ENDLESS: u64 = 0o77777777777;

/// `packsync ARGS` on `f`, ended by the test if it runs past `limit` (a
/// hang fails the test instead of holding it).
fn bounded(f: &Fixture, args: &[&str], limit: Duration) -> Run {
    let child = f.spawn(args);
    wait_bounded(child, limit)
}

fn wait_bounded(mut child: Child, limit: Duration) -> Run {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let run = Run::wait(child);
            panic!("still running after {limit:?}; stderr: {}", run.stderr);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Run::wait(child)
}

/// Wait until `what` holds, failing after a generous deadline.
fn until(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A fixture whose DEST holds a good generation (from a directory), which
/// every failure below must leave as it is.
fn seeded() -> Fixture {
    let f = Fixture::new();
    f.file("keep.txt", "last good\n");
    f.sync(&[]).ok();
    f
}

fn staging_left(f: &Fixture) -> Vec<String> {
    match fs::read_dir(f.state().join("stage")) {
        Ok(d) => d
            .map(|e| e.unwrap().file_name().to_string_lossy().into())
            .collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn a_refused_entry_closes_the_connection_at_once() {
    // A tar header for `../escape`, then zeros for as long as anyone reads.
    let srv = Server::start(|out| {
        out.head("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")?;
        out.body(&tar_header("../escape", ENDLESS))?;
        let zeros = vec![0u8; 64 << 10];
        loop {
            out.body(&zeros)?;
        }
    });
    let f = seeded();
    let url = srv.url("/bundle.tar");
    f.unchanged_but_staging(|| {
        bounded(&f, &["sync", &url, "vol/packs"], Duration::from_secs(8))
            .fails(1, "\"..\" component")
    });
    until("the server sees the connection closed", || {
        srv.seen.closed.load(Ordering::SeqCst)
    });
    let sent = srv.seen.sent.load(Ordering::SeqCst);
    assert!(
        sent < 64 << 20,
        "the server sent {sent} bytes before the close"
    );
}

#[test]
fn sigterm_ends_a_stalled_download_with_143_and_no_staging() {
    // Headers, the first bytes of a gzip stream, then nothing.
    let srv = Server::start(|out| {
        out.head("HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")?;
        out.body(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03")?;
        std::thread::sleep(Duration::from_secs(60));
        Ok(())
    });
    let f = seeded();
    let url = srv.url("/bundle.tar.gz");
    let child = f.spawn(&["sync", "--timeout", "60s", &url, "vol/packs"]);
    until("the download is under way", || {
        srv.seen.sent.load(Ordering::SeqCst) > 0 && !staging_left(&f).is_empty()
    });
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let run = wait_bounded(child, Duration::from_secs(5));
    assert_eq!(run.code, 143, "{}", run.stderr);
    assert!(
        run.stderr.contains("interrupted by SIGTERM"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("stall"), "{}", run.stderr);
    assert!(staging_left(&f).is_empty(), "{:?}", staging_left(&f));
    assert_eq!(tree(&f.dest()), vec!["keep.txt=last good\n".to_string()]);
}

#[test]
fn a_body_that_trickles_is_a_stall() {
    // A byte every 100 ms: each read gets something, the download never ends.
    let srv = Server::start(|out| {
        out.head("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")?;
        out.body(&tar_header("slow.txt", ENDLESS))?;
        loop {
            out.body(b"x")?;
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let f = seeded();
    let url = srv.url("/bundle.tar");
    f.unchanged_but_staging(|| {
        bounded(
            &f,
            &["sync", "--timeout", "1s", &url, "vol/packs"],
            Duration::from_secs(8),
        )
        .fails(1, "stalled for 1s (--timeout)")
    });
}

#[test]
fn headers_that_trickle_are_not_an_answer() {
    let srv = Server::start(|out| {
        for b in b"HTTP/1.1 200 OK\r\nX-Padding: "
            .iter()
            .chain([b'a'; 100].iter())
        {
            out.head(std::str::from_utf8(&[*b]).unwrap())?;
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    });
    let f = seeded();
    let url = srv.url("/bundle.tar");
    f.refused(
        &["sync", "--timeout", "1s", &url, "vol/packs"],
        1,
        &format!(
            "no whole answer from 127.0.0.1:{} within 1s (--timeout)",
            srv.port
        ),
    );
}

#[test]
fn round_timeout_bounds_a_download_that_never_stalls() {
    // 64 KiB every 100 ms of one file that would take days.
    let srv = Server::start(|out| {
        out.head("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")?;
        out.body(&tar_header("big.bin", ENDLESS))?;
        let block = vec![7u8; 64 << 10];
        loop {
            out.body(&block)?;
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let f = seeded();
    let url = srv.url("/bundle.tar");
    f.unchanged_but_staging(|| {
        bounded(
            &f,
            &[
                "sync",
                "--timeout",
                "1s",
                "--round-timeout",
                "2s",
                &url,
                "vol/packs",
            ],
            Duration::from_secs(8),
        )
        .fails(1, "took longer than 2s (--round-timeout)")
    });
    until("the server sees the connection closed", || {
        srv.seen.closed.load(Ordering::SeqCst)
    });
}

#[test]
fn a_bad_header_is_never_echoed() {
    let f = Fixture::new();
    let url = "https://bundles.example/b.tar.gz";
    for bad in [
        "Authorization Bearer s3cretTOKEN",
        "Authorization Bearer s3cretTOKEN: x",
        "Authorization: Bearer s3cretTOKEN\u{1}",
    ] {
        let run = f.refused(&["sync", "--header", bad, url, "vol/packs"], 2, "--header");
        assert!(!run.stderr.contains("s3cretTOKEN"), "{}", run.stderr);
        let file = f.path("headers");
        fs::write(&file, format!("# tokens\n{bad}\n")).unwrap();
        let run = f.refused(
            &[
                "sync",
                "--header-file",
                file.to_str().unwrap(),
                url,
                "vol/packs",
            ],
            2,
            "bad line 2 in --header-file",
        );
        assert!(!run.stderr.contains("s3cretTOKEN"), "{}", run.stderr);
    }
}

/// Serves argv[3] for every GET over HTTPS (argv[1], argv[2]: certificate
/// and key), or, with argv[4], redirects every GET to argv[4].
const TLS_PY: &str = r#"
import http.server, ssl, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        if len(sys.argv) > 4:
            self.send_response(302)
            self.send_header("Location", sys.argv[4])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = open(sys.argv[3], "rb").read()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
s.daemon_threads = True
s.handle_error = lambda *a: None
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1], sys.argv[2])
s.socket = ctx.wrap_socket(s.socket, server_side=True)
print(s.server_address[1], flush=True)
s.serve_forever()
"#;

/// A tar with one file `hello.txt`.
fn small_tar(path: &std::path::Path) {
    let mut t = tar_header("hello.txt", 6).to_vec();
    t.extend(b"hello\n");
    t.resize(512 * 4, 0);
    fs::write(path, t).unwrap();
}

#[test]
fn a_self_signed_ca_file_is_the_servers_certificate() {
    if !have(&["python3", "openssl"]) {
        return;
    }
    let f = Fixture::new();
    let dir = f.path("tls");
    fs::create_dir_all(&dir).unwrap();
    // What `openssl req -x509` makes: a CA certificate the server presents
    // as its own, as many a private bundle server does.
    crate::fixture::openssl(
        &dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            "key.pem",
            "-out",
            "cert.pem",
        ],
    );
    let tar = dir.join("b.tar");
    small_tar(&tar);
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let mut srv = python(
        TLS_PY,
        &[
            cert.to_str().unwrap(),
            key.to_str().unwrap(),
            tar.to_str().unwrap(),
        ],
    );
    let port = first_line(&mut srv.0);
    let url = format!("https://127.0.0.1:{port}/b.tar");
    f.refused(
        &["sync", &url, "vol/packs"],
        1,
        "TLS failure with 127.0.0.1:",
    );
    f.packsync(&[
        "sync",
        "--ca-file",
        cert.to_str().unwrap(),
        &url,
        "vol/packs",
    ])
    .ok();
    assert_eq!(tree(&f.dest()), vec!["hello.txt=hello\n".to_string()]);
    // Pinned to that certificate: the same server under another name is refused.
    let other = format!("https://localhost:{port}/b.tar");
    let run = f.packsync(&[
        "sync",
        "--ca-file",
        cert.to_str().unwrap(),
        &other,
        "vol/packs",
    ]);
    assert_eq!(run.code, 1, "{}", run.stderr);
}

#[test]
fn https_is_never_redirected_to_plain_http() {
    if !have(&["python3", "openssl"]) {
        return;
    }
    let f = seeded();
    let dir = f.path("tls");
    fs::create_dir_all(&dir).unwrap();
    // A CA and a leaf it signs (trusted with --ca-file).
    crate::fixture::private_ca(&dir);
    // The plain server holds a good bundle: following the redirect would publish it.
    let plain = Server::start(|out| {
        let mut t = tar_header("hello.txt", 6).to_vec();
        t.extend(b"hello\n");
        t.resize(512 * 4, 0);
        out.head(&format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
            t.len()
        ))?;
        out.body(&t)
    });
    let tar = dir.join("b.tar");
    small_tar(&tar);
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let target = plain.url("/b.tar");
    let mut srv = python(
        TLS_PY,
        &[
            cert.to_str().unwrap(),
            key.to_str().unwrap(),
            tar.to_str().unwrap(),
            &target,
        ],
    );
    let port = first_line(&mut srv.0);
    let url = format!("https://127.0.0.1:{port}/b.tar");
    let ca = dir.join("ca.pem");
    f.refused(
        &["sync", "--ca-file", ca.to_str().unwrap(), &url, "vol/packs"],
        1,
        &format!("redirect from https to http refused (to {target})"),
    );
    assert_eq!(
        plain.seen.requests.load(Ordering::SeqCst),
        0,
        "plain HTTP was asked"
    );
}
