//! Credentials that rotate: `credHelpers` and `credsStore` in the Docker
//! config run `docker-credential-NAME get` (here a shell script the test
//! writes, first on PATH, counting its calls and answering with the user
//! and secret in files the test rewrites), and the config, the helpers and
//! `--header-file` are read again by every sync and every round of
//! `--every`. The registry is a std `TcpListener` on 127.0.0.1 serving an
//! OCI layout the test writes, wanting Basic auth (or a Bearer token
//! traded for the helper's identity token) whose accepted value the test
//! changes between rounds; it also serves an archive over http:// only
//! with the header the test says. Checked as a user would: what lands, the
//! exit code and the one line, the helper's calls, and that no secret is
//! ever printed.

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use base64::Engine;

use crate::fixture::{Fixture, Run};
use crate::semver::add_images;
use crate::sidecar::Loop;
use crate::source_oci::have;

/// `docker-credential-test`: logs each call (and the host it was sent) in
/// its directory, then answers as the file `mode` says: `ok` (the files
/// `user` and `secret`), `missing` (docker-credential-helpers' message for
/// no credentials), `hang` (answers nothing), `broken` (prints the secret, fails with a line on stderr).
const HELPER_SH: &str = r#"#!/bin/sh
dir=$(dirname "$0")
IFS= read -r host || true
echo "$host" >> "$dir/calls"
case "$(cat "$dir/mode")" in
ok) printf '{"ServerURL":"%s","Username":"%s","Secret":"%s"}\n' "$host" "$(cat "$dir/user")" "$(cat "$dir/secret")" ;;
missing) echo "credentials not found in native keychain"; exit 1 ;;
hang) sleep 30 ;;
*) cat "$dir/secret"; echo "gpg: decryption failed: No secret key" >&2; echo "second line" >&2; exit 1 ;;
esac
"#;

/// The helper's directory, put first on PATH.
struct Helper {
    dir: PathBuf,
}

impl Helper {
    fn new(f: &Fixture) -> Helper {
        let dir = f.path("bin");
        fs::create_dir(&dir).unwrap();
        let script = dir.join("docker-credential-test");
        fs::write(&script, HELPER_SH).unwrap();
        fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
        let h = Helper { dir };
        h.answer("ok", "puller", "pw-one");
        h
    }

    fn answer(&self, mode: &str, user: &str, secret: &str) {
        fs::write(self.dir.join("mode"), mode).unwrap();
        fs::write(self.dir.join("user"), user).unwrap();
        fs::write(self.dir.join("secret"), secret).unwrap();
    }

    /// The hosts it was asked for, one a call.
    fn calls(&self) -> Vec<String> {
        fs::read_to_string(self.dir.join("calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// PATH with the helper first, a Docker config in `config_dir`, an empty HOME.
    fn env(&self, f: &Fixture, c: &mut Command) {
        let path = format!(
            "{}:{}",
            self.dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let home = f.path("home");
        let _ = fs::create_dir(&home);
        c.env("PATH", path)
            .env("HOME", home)
            .env("DOCKER_CONFIG", f.path("docker"));
    }
}

fn docker_config(f: &Fixture, json: &str) {
    let dir = f.path("docker");
    let _ = fs::create_dir(&dir);
    fs::write(dir.join("config.json"), json).unwrap();
}

fn basic(user: &str, password: &str) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {b64}")
}

/// What the test registry accepts.
struct State {
    layout: PathBuf,
    /// The `Authorization` every `/v2/` request needs (None: anonymous).
    want: Option<String>,
    /// Bearer mode: the refresh token `/token` trades for `Bearer granted`.
    refresh: Option<String>,
    /// The header `/bundle.tar.gz` needs.
    bundle_header: Option<(String, String)>,
    /// `METHOD PATH` of every request.
    requests: Vec<String>,
}

struct Fake {
    port: u16,
    state: Arc<Mutex<State>>,
}

impl Fake {
    fn start(layout: &Path) -> Fake {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(State {
            layout: layout.to_path_buf(),
            want: None,
            refresh: None,
            bundle_header: None,
            requests: Vec::new(),
        }));
        let s = state.clone();
        std::thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(tcp) = conn else { continue };
                let s = s.clone();
                std::thread::spawn(move || serve(tcp, port, &s));
            }
        });
        Fake { port, state }
    }

    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn set(&self, change: impl FnOnce(&mut State)) {
        change(&mut self.state.lock().unwrap());
    }

    fn requests(&self, part: &str) -> usize {
        let s = self.state.lock().unwrap();
        s.requests.iter().filter(|r| r.contains(part)).count()
    }
}

fn serve(tcp: std::net::TcpStream, port: u16, state: &Mutex<State>) {
    let mut r = BufReader::new(tcp.try_clone().unwrap());
    let mut first = String::new();
    if r.read_line(&mut first).is_err() {
        return;
    }
    let mut headers = BTreeMap::new();
    let mut line = String::new();
    while r.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
        if let Some((k, v)) = line.trim_end().split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
        line.clear();
    }
    let mut body = vec![
        0;
        headers
            .get("content-length")
            .map_or(0, |n| n.parse().unwrap())
    ];
    let _ = r.read_exact(&mut body);
    let mut parts = first.split(' ');
    let method = parts.next().unwrap_or("").to_string();
    let path = parts.next().unwrap_or("/").to_string();
    let mut st = state.lock().unwrap();
    st.requests.push(format!("{method} {path}"));
    let (status, extra, payload) = answer(&st, port, &method, &path, &headers, &body);
    drop(st);
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n",
        payload.len()
    );
    let mut tcp = tcp;
    let _ = tcp.write_all(head.as_bytes());
    let _ = tcp.write_all(&payload);
}

fn answer(
    st: &State,
    port: u16,
    method: &str,
    path: &str,
    headers: &BTreeMap<String, String>,
    body: &[u8],
) -> (&'static str, String, Vec<u8>) {
    let denied = |challenge: String| {
        (
            "401 Unauthorized",
            format!("WWW-Authenticate: {challenge}\r\n"),
            b"{}".to_vec(),
        )
    };
    let not_found = ("404 Not Found", String::new(), b"{}".to_vec());
    if method == "POST" && path == "/token" {
        let form: BTreeMap<String, String> = url_pairs(&String::from_utf8_lossy(body));
        let ok = form.get("grant_type").map(String::as_str) == Some("refresh_token")
            && st.refresh.is_some()
            && form.get("refresh_token") == st.refresh.as_ref();
        return if ok {
            (
                "200 OK",
                "Content-Type: application/json\r\n".into(),
                br#"{"access_token":"granted"}"#.to_vec(),
            )
        } else {
            ("401 Unauthorized", String::new(), b"{}".to_vec())
        };
    }
    if path == "/bundle.tar.gz" {
        if let Some((k, v)) = &st.bundle_header {
            if headers.get(&k.to_ascii_lowercase()) != Some(v) {
                return ("401 Unauthorized", String::new(), b"no".to_vec());
            }
        }
        return match fs::read(st.layout.join("bundle.tar.gz")) {
            Ok(b) => ("200 OK", String::new(), b),
            Err(_) => not_found,
        };
    }
    if let Some(want) = &st.want {
        if headers.get("authorization") != Some(want) {
            return denied(if st.refresh.is_some() {
                format!(r#"Bearer realm="http://127.0.0.1:{port}/token",service="fake""#)
            } else {
                r#"Basic realm="fake""#.to_string()
            });
        }
    }
    let index: serde_json::Value =
        serde_json::from_slice(&fs::read(st.layout.join("index.json")).unwrap()).unwrap();
    let descs = index["manifests"].as_array().unwrap().clone();
    let blob = |digest: &str| {
        fs::read(
            st.layout
                .join("blobs/sha256")
                .join(digest.strip_prefix("sha256:")?),
        )
        .ok()
    };
    if path == "/v2/" {
        return ("200 OK", String::new(), b"{}".to_vec());
    }
    if let Some(r) = path.strip_prefix("/v2/app/manifests/") {
        let desc = descs.iter().find(|d| {
            d["digest"] == r || d["annotations"]["org.opencontainers.image.ref.name"] == r
        });
        return match desc.and_then(|d| {
            Some((
                d["mediaType"].as_str()?.to_string(),
                blob(d["digest"].as_str()?)?,
            ))
        }) {
            Some((mt, bytes)) => ("200 OK", format!("Content-Type: {mt}\r\n"), bytes),
            None => not_found,
        };
    }
    if let Some(d) = path.strip_prefix("/v2/app/blobs/") {
        return match blob(d) {
            Some(bytes) => ("200 OK", String::new(), bytes),
            None => not_found,
        };
    }
    not_found
}

/// `a=b&c=d`, percent-decoded.
fn url_pairs(s: &str) -> BTreeMap<String, String> {
    let decode = |t: &str| {
        let t = t.replace('+', " ");
        let mut out = Vec::new();
        let b = t.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'%' && i + 2 < b.len() {
                if let Ok(v) = u8::from_str_radix(&t[i + 1..i + 3], 16) {
                    out.push(v);
                    i += 3;
                    continue;
                }
            }
            out.push(b[i]);
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    s.split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (decode(k), decode(v)))
        .collect()
}

/// A registry serving `app:1`, whose file `v` holds `text`.
fn registry(f: &Fixture, text: &str) -> Fake {
    let layout = f.path("layout");
    image(&layout, text);
    Fake::start(&layout)
}

/// (Re)write `app:1` with `v` holding `text`.
fn image(layout: &Path, text: &str) {
    add_images(layout, &["1"], &format!(r#","files":{{"v":{text:?}}}"#));
}

fn sync(f: &Fixture, h: &Helper, extra: &[&str], source: &str) -> Run {
    let mut args = vec!["sync", "--grace", "0"];
    args.extend_from_slice(extra);
    args.extend([source, "vol/packs"]);
    let mut c = f.command(&args);
    h.env(f, &mut c);
    Run::from(c.output().unwrap())
}

fn published(f: &Fixture) -> Option<String> {
    fs::read_to_string(f.dest().join("v")).ok()
}

fn tools() -> bool {
    have(&["python3", "sh"])
}

#[test]
fn the_hosts_cred_helper_comes_first_then_creds_store_then_auths() {
    if !tools() {
        return;
    }
    let f = Fixture::new();
    let h = Helper::new(&f);
    let reg = registry(&f, "one");
    reg.set(|s| s.want = Some(basic("puller", "pw-one")));
    let src = format!("oci://{}/app:1", reg.host());
    let wrong = base64::engine::general_purpose::STANDARD.encode("puller:stale");
    // credHelpers for the host wins over credsStore and over the auths entry.
    docker_config(
        &f,
        &format!(
            r#"{{"auths":{{"{0}":{{"auth":"{wrong}"}}}},"credHelpers":{{"{0}":"test"}},"credsStore":"absent"}}"#,
            reg.host()
        ),
    );
    let run = sync(&f, &h, &["--json"], &src).ok();
    assert_eq!(published(&f).as_deref(), Some("one"));
    assert_eq!(h.calls(), [reg.host()], "one call, sent the host");
    for out in [&run.stdout, &run.stderr] {
        assert!(!out.contains("pw-one"), "{out}");
    }

    // credsStore, for a host credHelpers does not name, before the auths
    // entry (the docker CLI's order).
    image(&f.path("layout"), "two");
    docker_config(
        &f,
        &format!(
            r#"{{"auths":{{"{}":{{"auth":"{wrong}"}}}},"credHelpers":{{"other.example":"absent"}},"credsStore":"test"}}"#,
            reg.host()
        ),
    );
    sync(&f, &h, &[], &src).ok();
    assert_eq!(published(&f).as_deref(), Some("two"));
    assert_eq!(h.calls().len(), 2);

    // No helper configured: the auths entry.
    image(&f.path("layout"), "three");
    docker_config(
        &f,
        &format!(r#"{{"auths":{{"{}":{{"auth":"{wrong}"}}}}}}"#, reg.host()),
    );
    reg.set(|s| s.want = Some(basic("puller", "stale")));
    sync(&f, &h, &[], &src).ok();
    assert_eq!(published(&f).as_deref(), Some("three"));
    assert_eq!(h.calls().len(), 2, "the helper is not asked");
}

#[test]
fn credentials_not_found_is_anonymous() {
    if !tools() {
        return;
    }
    let f = Fixture::new();
    let h = Helper::new(&f);
    h.answer("missing", "", "");
    let reg = registry(&f, "one");
    reg.set(|s| s.want = Some(basic("puller", "pw-one")));
    let src = format!("oci://{}/app:1", reg.host());
    docker_config(&f, r#"{"credsStore":"test"}"#);
    // Asked anonymously: the 401 says the helper had nothing.
    f.unchanged_by(|| {
        sync(&f, &h, &[], &src).fails(
            1,
            &format!(
                "{src}: 401 Unauthorized (docker-credential-test has no credentials for {}: anonymous)",
                reg.host()
            ),
        )
    });
    assert_eq!(h.calls().len(), 1);
    // A registry that lets anyone pull: published.
    reg.set(|s| s.want = None);
    sync(&f, &h, &[], &src).ok();
    assert_eq!(published(&f).as_deref(), Some("one"));
}

#[test]
fn a_failing_helper_is_exit_1_naming_it_and_never_the_secret() {
    if !tools() {
        return;
    }
    let f = Fixture::new();
    let h = Helper::new(&f);
    let reg = registry(&f, "one");
    let src = format!("oci://{}/app:1", reg.host());
    docker_config(&f, r#"{"credsStore":"test"}"#);
    sync(&f, &h, &[], &src).ok();
    h.answer("broken", "puller", "hunter2-secret");
    let run = f.unchanged_by(|| {
        sync(&f, &h, &["--json"], &src).fails(
            1,
            &format!(
                "credential helper docker-credential-test failed for {}: gpg: decryption failed: No secret key",
                reg.host()
            ),
        )
    });
    for out in [&run.stdout, &run.stderr] {
        assert!(!out.contains("hunter2"), "{out}");
        assert!(!out.contains("second line"), "{out}");
    }
    // Nothing asked of the registry after the helper failed.
    assert_eq!(reg.requests("GET /v2/app/manifests/"), 1);

    // A helper that hangs: ended after --timeout.
    h.answer("hang", "puller", "x");
    f.unchanged_by(|| {
        sync(&f, &h, &["--timeout", "300ms"], &src).fails(
            1,
            &format!(
                "credential helper docker-credential-test: no answer for {} within 300ms (--timeout)",
                reg.host()
            ),
        )
    });

    // A helper that is not on PATH.
    docker_config(&f, r#"{"credsStore":"nowhere"}"#);
    f.unchanged_by(|| {
        sync(&f, &h, &[], &src).fails(
            1,
            "credential helper docker-credential-nowhere: not found on PATH",
        )
    });
}

#[test]
fn an_identity_token_is_traded_at_the_realm() {
    if !tools() {
        return;
    }
    let f = Fixture::new();
    let h = Helper::new(&f);
    h.answer("ok", "<token>", "refresh-one");
    let reg = registry(&f, "one");
    reg.set(|s| {
        s.want = Some("Bearer granted".into());
        s.refresh = Some("refresh-one".into());
    });
    let src = format!("oci://{}/app:1", reg.host());
    docker_config(
        &f,
        &format!(r#"{{"credHelpers":{{"{}":"test"}}}}"#, reg.host()),
    );
    sync(&f, &h, &[], &src).ok();
    assert_eq!(published(&f).as_deref(), Some("one"));
    assert_eq!(reg.requests("POST /token"), 1);
    // The realm no longer takes that token: refused, and the line says whose it was.
    image(&f.path("layout"), "two");
    reg.set(|s| s.refresh = Some("refresh-two".into()));
    let run = f.unchanged_by(|| {
        sync(&f, &h, &[], &src).fails(
            1,
            &format!(
                "{src}: 401 Unauthorized (the credentials docker-credential-test gave for {} were refused)",
                reg.host()
            ),
        )
    });
    assert!(!run.stderr.contains("refresh-"), "{}", run.stderr);
}

#[test]
fn a_sidecar_uses_the_rotated_password_from_the_next_round() {
    if !tools() {
        return;
    }
    let f = Fixture::new();
    let h = Helper::new(&f);
    let reg = registry(&f, "one");
    reg.set(|s| s.want = Some(basic("puller", "pw-one")));
    let src = format!("oci://{}/app:1", reg.host());
    docker_config(
        &f,
        &format!(r#"{{"credHelpers":{{"{}":"test"}}}}"#, reg.host()),
    );
    // Rounds come only from SIGHUP.
    let l = Loop::start_on(&f, &["--every", "1h"], &[&src], |c| h.env(&f, c));
    l.until("the first round to publish", || {
        published(&f).as_deref() == Some("one")
    });
    assert_eq!(h.calls().len(), 1);

    // The password rotates: the registry takes only the new one, the
    // helper gives it, and the image moves.
    image(&f.path("layout"), "two");
    h.answer("ok", "puller", "pw-two");
    reg.set(|s| s.want = Some(basic("puller", "pw-two")));
    l.signal(rustix::process::Signal::HUP);
    l.until("the round after the rotation to publish", || {
        published(&f).as_deref() == Some("two")
    });
    assert_eq!(h.calls().len(), 2, "asked again for the round");
    assert_eq!(l.rounds("error"), 0, "{}", l.stderr());

    // The helper's failure is a failed round, named, the tree kept.
    h.answer("broken", "puller", "pw-three");
    l.signal(rustix::process::Signal::HUP);
    l.until("a failed round", || l.rounds("error") == 1);
    let run = l.stop();
    assert!(
        run.stderr.contains("docker-credential-test failed for"),
        "{}",
        run.stderr
    );
    for out in [&run.stdout, &run.stderr] {
        assert!(!out.contains("pw-"), "{out}");
    }
    assert_eq!(published(&f).as_deref(), Some("two"));
}

/// A gzip tar holding `v` = `text`, where the registry serves `/bundle.tar.gz`.
fn archive(f: &Fixture, text: &str) {
    let dir = f.path("bundle-src");
    let _ = fs::create_dir(&dir);
    fs::write(dir.join("v"), text).unwrap();
    let ok = Command::new("tar")
        .arg("-czf")
        .arg(f.path("layout/bundle.tar.gz"))
        .arg("-C")
        .arg(&dir)
        .arg("v")
        .status()
        .unwrap()
        .success();
    assert!(ok, "tar failed");
}

#[test]
fn the_header_file_is_read_again_by_each_sync() {
    if !have(&["python3", "tar"]) {
        return;
    }
    let f = Fixture::new();
    let h = Helper::new(&f);
    let reg = registry(&f, "unused");
    archive(&f, "one");
    reg.set(|s| s.bundle_header = Some(("X-Token".into(), "t-one".into())));
    let src = format!("http://{}/bundle.tar.gz", reg.host());
    let file = f.path("headers");
    let hf = file.to_str().unwrap();
    fs::write(&file, "# rotated by a controller\nX-Token: t-one\n").unwrap();
    sync(&f, &h, &["--header-file", hf], &src).ok();
    assert_eq!(published(&f).as_deref(), Some("one"));

    // The token rotates in the file and at the server.
    archive(&f, "two");
    fs::write(&file, "X-Token: t-two\n").unwrap();
    reg.set(|s| s.bundle_header = Some(("X-Token".into(), "t-two".into())));
    sync(&f, &h, &["--header-file", hf], &src).ok();
    assert_eq!(published(&f).as_deref(), Some("two"));

    // Missing at the start: a usage error, nothing asked.
    fs::remove_file(&file).unwrap();
    let asked = reg.requests("/bundle.tar.gz");
    f.unchanged_by(|| {
        sync(&f, &h, &["--header-file", hf], &src)
            .fails(2, &format!("{hf}: cannot read --header-file"))
    });
    assert_eq!(reg.requests("/bundle.tar.gz"), asked);

    // Gone bad under a sidecar: a failed round naming the file, then the
    // next good file is used.
    fs::write(&file, "X-Token: t-two\n").unwrap();
    let l = Loop::start_on(&f, &["--every", "1h", "--header-file", hf], &[&src], |c| {
        h.env(&f, c)
    });
    l.until("the first round", || {
        l.rounds("up_to_date") + l.rounds("published") == 1
    });
    fs::write(&file, "no colon here\n").unwrap();
    l.signal(rustix::process::Signal::HUP);
    l.until("a failed round", || l.rounds("error") == 1);
    archive(&f, "three");
    fs::write(&file, "X-Token: t-three\n").unwrap();
    reg.set(|s| s.bundle_header = Some(("X-Token".into(), "t-three".into())));
    l.signal(rustix::process::Signal::HUP);
    l.until("the round with the new token", || {
        published(&f).as_deref() == Some("three")
    });
    let run = l.stop();
    assert!(
        run.stderr
            .contains(&format!("{hf}: bad line 1 in --header-file")),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("t-three"), "{}", run.stderr);
}
