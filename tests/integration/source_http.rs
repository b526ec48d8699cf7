//! Bundles over HTTP as SOURCE: a real HTTP server (python3's
//! http.server, in the test) serving OPA bundles (`.manifest` with
//! revision and roots, `data.json`, `.rego` files, names with a leading
//! `/` as `opa build` writes them) with an ETag, answering 304 to a
//! matching `If-None-Match`, and, on other paths, 401 without the right
//! bearer token, 500, a body that stalls, a body cut short. Checked as a
//! user would: the bundle lands, `status` shows the URL with its ETag and
//! SHA-256, the second sync is up to date after one request that fetched
//! nothing, each failure exits 1 with one line and keeps the last good tree.

use std::fs;
use std::path::Path;
use std::process::Command;

use crate::fixture::Fixture;
use crate::source_oci::{first_line, have, python, tree, Helper};

/// Serves `DIR` (argv[1]) and logs each request as one line to argv[2]:
/// `PATH if-none-match=VALUE`. The ETag is the content's SHA-256.
/// `/private/*` wants `Authorization: Bearer s3cret`; `/fail` is a 500;
/// `/stall` sends 10 bytes of 100000 and waits; `/cut/NAME` sends half of
/// NAME and closes; `/away/PATH` redirects to PATH on `localhost` (another
/// host name for the same server). With argv[3] and argv[4] (a
/// certificate and its key) it speaks HTTPS.
const SERVER_PY: &str = r#"
import hashlib, http.server, os, sys, time
root, log = sys.argv[1], sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        inm = self.headers.get("If-None-Match")
        with open(log, "a") as f:
            f.write(f"{self.path} if-none-match={inm}\n")
        p = self.path
        if p.startswith("/away/"):
            self.send_response(302)
            self.send_header("Location", f"http://localhost:{self.server.server_address[1]}/{p[len('/away/'):]}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if p == "/fail":
            return self.plain(500, b"boom")
        if p == "/stall":
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            self.wfile.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03")
            self.wfile.flush()
            time.sleep(60)
            return
        if p.startswith("/private/"):
            if self.headers.get("Authorization") != "Bearer s3cret":
                return self.plain(401, b"no")
            p = p[len("/private"):]
        cut = p.startswith("/cut/")
        if cut:
            p = p[len("/cut"):]
        path = os.path.join(root, p.lstrip("/"))
        if not os.path.isfile(path):
            return self.plain(404, b"not found")
        data = open(path, "rb").read()
        etag = '"' + hashlib.sha256(data).hexdigest()[:16] + '"'
        if inm == etag:
            self.send_response(304)
            self.send_header("ETag", etag)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("ETag", etag)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[: len(data) // 2] if cut else data)
        if cut:
            self.close_connection = True
    def plain(self, code, body):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
s.daemon_threads = True
s.handle_error = lambda *a: None  # a refused TLS handshake is the test's point
if len(sys.argv) > 4:
    import ssl
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(sys.argv[3], sys.argv[4])
    s.socket = ctx.wrap_socket(s.socket, server_side=True)
print(s.server_address[1], flush=True)
s.serve_forever()
"#;

/// Write an OPA bundle `out` (tar.gz, names with a leading `/`).
fn bundle(out: &Path, revision: &str, allow: &str) {
    let code = r#"
import io, json, sys, tarfile
out, revision, allow = sys.argv[1], sys.argv[2], sys.argv[3]
files = {
    "/.manifest": json.dumps({"revision": revision, "roots": ["authz"]}),
    "/data.json": json.dumps({"authz": {"admins": ["ann"]}}),
    "/authz/policy.rego": "package authz\ndefault allow := " + allow + "\n",
}
with tarfile.open(out, "w:gz") as t:
    for name, text in files.items():
        data = text.encode()
        ti = tarfile.TarInfo(name)
        ti.size = len(data)
        ti.mtime = 1700000000
        ti.mode = 0o644
        t.addfile(ti, io.BytesIO(data))
"#;
    let ok = Command::new("python3")
        .args(["-c", code])
        .arg(out)
        .args([revision, allow])
        .status()
        .unwrap();
    assert!(ok.success());
}

fn bundle_tree(revision: &str, allow: &str) -> Vec<String> {
    vec![
        format!(".manifest={{\"revision\": \"{revision}\", \"roots\": [\"authz\"]}}"),
        "authz/".into(),
        format!("authz/policy.rego=package authz\ndefault allow := {allow}\n"),
        "data.json={\"authz\": {\"admins\": [\"ann\"]}}".into(),
    ]
}

pub(crate) struct Server {
    _proc: Helper,
    port: u16,
    log: std::path::PathBuf,
    pub(crate) www: std::path::PathBuf,
}

impl Server {
    pub(crate) fn start(f: &Fixture) -> Server {
        Server::start_with(f, &[])
    }

    /// `tls`: a certificate and its key, for HTTPS.
    fn start_with(f: &Fixture, tls: &[&str]) -> Server {
        let www = f.path("www");
        fs::create_dir_all(&www).unwrap();
        let log = f.path("requests.log");
        fs::write(&log, "").unwrap();
        let mut args = vec![www.to_str().unwrap(), log.to_str().unwrap()];
        args.extend_from_slice(tls);
        let mut proc = python(SERVER_PY, &args);
        let port = first_line(&mut proc.0).parse().unwrap();
        Server {
            _proc: proc,
            port,
            log,
            www,
        }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub(crate) fn requests(&self) -> Vec<String> {
        fs::read_to_string(&self.log)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

#[test]
fn an_opa_bundle_over_http_lands_and_a_304_is_up_to_date() {
    if !have(&["python3"]) {
        return;
    }
    let f = Fixture::new();
    let srv = Server::start(&f);
    bundle(&srv.www.join("authz.tar.gz"), "r1", "false");
    let url = srv.url("/authz.tar.gz");
    let sync = || f.packsync(&["sync", "--grace", "0", &url, "vol/packs"]);

    sync().ok();
    assert_eq!(tree(&f.dest()), bundle_tree("r1", "false"));
    let status = f.packsync(&["status", "vol/packs"]).ok();
    assert!(
        status.stdout.contains(&format!("{url} sha256:")) && status.stdout.contains("etag=\""),
        "{}",
        status.stdout
    );

    // Unchanged: one conditional request, answered 304.
    let again = f.unchanged_by(|| sync().ok());
    assert!(again.stdout.contains("up to date"), "{}", again.stdout);
    let reqs = srv.requests();
    assert_eq!(reqs.len(), 2, "{reqs:?}");
    assert!(
        reqs[1].starts_with("/authz.tar.gz if-none-match=\""),
        "{reqs:?}"
    );

    // A new revision: published, and the old policy gone.
    bundle(&srv.www.join("authz.tar.gz"), "r2", "true");
    sync().ok();
    assert_eq!(tree(&f.dest()), bundle_tree("r2", "true"));
    assert_eq!(
        srv.requests().len(),
        3,
        "a changed bundle costs one request too"
    );
}

#[test]
fn a_bundle_server_that_fails_keeps_the_last_good_tree() {
    if !have(&["python3"]) {
        return;
    }
    let f = Fixture::new();
    let srv = Server::start(&f);
    bundle(&srv.www.join("authz.tar.gz"), "r1", "false");
    bundle(&srv.www.join("big.tar.gz"), "r9", "true");

    // 401 without the token, with a hint; the header (or a header file) passes.
    let private = srv.url("/private/authz.tar.gz");
    f.refused(
        &["sync", &private, "vol/packs"],
        1,
        &format!("{private}: 401 Unauthorized (credentials: --header or --header-file)"),
    );
    f.packsync(&[
        "sync",
        "--grace",
        "0",
        "--header",
        "Authorization: Bearer s3cret",
        &private,
        "vol/packs",
    ])
    .ok();
    assert_eq!(tree(&f.dest()), bundle_tree("r1", "false"));
    let headers = f.path("headers");
    fs::write(
        &headers,
        "# the bundle server's token\nAuthorization: Bearer s3cret\n",
    )
    .unwrap();
    f.packsync(&[
        "sync",
        "--grace",
        "0",
        "--header-file",
        headers.to_str().unwrap(),
        &private,
        "vol/packs",
    ])
    .ok();

    // Redirected to another host name: the token is not sent there.
    let away = srv.url("/away/private/authz.tar.gz");
    f.refused(
        &[
            "sync",
            "--header",
            "Authorization: Bearer s3cret",
            &away,
            "vol/packs",
        ],
        1,
        "401 Unauthorized",
    );
    let public = srv.url("/away/authz.tar.gz");
    f.packsync(&["sync", "--grace", "0", &public, "vol/packs"])
        .ok();

    // 500, a stall past --timeout, a body cut short, a 404: exit 1, one
    // line, the live tree kept.
    let cases = [
        (srv.url("/fail"), "500"),
        (srv.url("/stall"), "stalled for 1s (--timeout)"),
        (
            srv.url("/cut/big.tar.gz"),
            "closed before the whole body arrived",
        ),
        (srv.url("/missing.tar.gz"), "404 Not Found"),
    ];
    for (url, needle) in cases {
        f.unchanged_but_staging(|| {
            f.packsync(&["sync", "--grace", "0", "--timeout", "1s", &url, "vol/packs"])
                .fails(1, needle)
        });
        assert_eq!(tree(&f.dest()), bundle_tree("r1", "false"), "{url}");
    }
    // Not an archive: the server's answer is refused.
    fs::write(srv.www.join("page.html"), "<html>hello</html>").unwrap();
    f.unchanged_but_staging(|| {
        f.packsync(&["sync", &srv.url("/page.html"), "vol/packs"])
            .fails(1, "page.html")
    });
    // A malformed URL is a usage error.
    f.refused(
        &[
            "sync",
            "https://user:pw@bundles.example/x.tar.gz",
            "vol/packs",
        ],
        2,
        "credentials in a URL",
    );
}

#[test]
fn https_is_verified_and_ca_file_adds_a_root() {
    if !have(&["python3", "openssl"]) {
        return;
    }
    let f = Fixture::new();
    // A private CA, and the server's certificate signed by it.
    crate::fixture::private_ca(f.dir.path());
    let (ca, cert, key) = (f.path("ca.pem"), f.path("cert.pem"), f.path("key.pem"));
    let srv = Server::start_with(&f, &[cert.to_str().unwrap(), key.to_str().unwrap()]);
    bundle(&srv.www.join("authz.tar.gz"), "r1", "false");
    let url = format!("https://127.0.0.1:{}/authz.tar.gz", srv.port);
    // A certificate no root vouches for: exit 1, the volume untouched.
    f.refused(
        &["sync", &url, "vol/packs"],
        1,
        "TLS failure with 127.0.0.1:",
    );
    f.packsync(&["sync", "--ca-file", ca.to_str().unwrap(), &url, "vol/packs"])
        .ok();
    assert_eq!(tree(&f.dest()), bundle_tree("r1", "false"));
    // A --ca-file that holds no certificate is a usage error.
    f.refused(
        &[
            "sync",
            "--ca-file",
            key.to_str().unwrap(),
            &url,
            "vol/packs",
        ],
        2,
        "--ca-file",
    );
}
