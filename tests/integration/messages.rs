//! Error lines that say what is wrong and where: a DEST whose parent this
//! user may not write, a web page where an archive was expected, a failed
//! fetch with a generation live, a negative duration, `exec` on a DEST
//! whose parent does not exist. Each is one line, with the documented exit
//! code, and the volume unchanged.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use crate::fixture::{bin, is_root, skip, Fixture, Run};

/// A server on 127.0.0.1 answering every request with `reply` (whole:
/// status line, headers, body); its URL for `path`.
fn serve(reply: &'static str, path: &str) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut tcp) = conn else { continue };
            let mut r = BufReader::new(tcp.try_clone().unwrap());
            let mut line = String::new();
            while r.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                line.clear();
            }
            let _ = tcp.write_all(reply.as_bytes());
        }
    });
    format!("http://127.0.0.1:{port}{path}")
}

/// A port on 127.0.0.1 where nothing listens.
fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn live_gen(f: &Fixture) -> String {
    let link = fs::read_link(f.dest()).unwrap();
    link.file_name().unwrap().to_string_lossy().into_owned()
}

#[test]
fn a_dest_parent_this_user_may_not_write_is_named_with_the_permission_missing() {
    // Root passes every permission check: run as nobody in a child process.
    if !is_root() {
        skip("needs root to run packsync as uid 65534 (setpriv)");
        return;
    }
    let have_setpriv = Command::new("setpriv")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_setpriv && skip("setpriv (util-linux) is not installed") {
        return;
    }
    let f = Fixture::new();
    f.file("a.txt", "a");
    // nobody may read the fixture and the source, not write vol/.
    for p in [f.path(""), f.src(), f.src().join("a.txt"), f.path("vol")] {
        let mode = if p.is_dir() { 0o755 } else { 0o644 };
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
    }
    let run = f.unchanged_by(|| {
        Run::from(
            Command::new("setpriv")
                .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(bin())
                .args(["sync", "--grace", "0", "src", "vol/packs"])
                .current_dir(f.path(""))
                .output()
                .unwrap(),
        )
    });
    run.fails(
        1,
        "cannot create state directory vol/.packs.packsync: permission denied \
         (uid 65534 needs write and search permission on vol, DEST's parent)",
    );
}

#[test]
fn a_web_page_where_an_archive_was_expected_names_its_content_type() {
    let url = serve(
        "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: 22\r\n\
         Connection: close\r\n\r\n<html>sign in</html>\r\n",
        "/bundle.tar.gz",
    );
    let f = Fixture::new();
    f.file("a.txt", "a");
    f.sync(&[]).ok();
    let run = f.unchanged_but_staging(|| f.packsync(&["sync", &url, "vol/packs"]));
    run.fails(
        1,
        &format!("{url}: the server sent Content-Type: text/html; charset=utf-8, not an archive ("),
    );
}

#[test]
fn a_failed_fetch_says_which_generation_stays_live() {
    let f = Fixture::new();
    f.file("a.txt", "a");
    f.sync(&[]).ok();
    let gen = live_gen(&f);
    let url = format!("http://127.0.0.1:{}/b.tar.gz", closed_port());
    let run = f.unchanged_but_staging(|| f.packsync(&["sync", "--grace", "0", &url, "vol/packs"]));
    run.fails(1, &format!("{url}: cannot connect to 127.0.0.1"))
        .fails(1, &format!("; generation {gen} stays live"));
    // Nothing live yet: nothing is said to stay.
    let g = Fixture::new();
    let run = g
        .packsync(&["sync", &url, "vol/packs"])
        .fails(1, "cannot connect");
    assert!(!run.stderr.contains("stays live"), "{}", run.stderr);
}

#[test]
fn a_negative_duration_is_one_clear_usage_line() {
    let f = Fixture::new();
    f.file("a.txt", "a");
    f.unchanged_by(|| {
        f.packsync(&["sync", "--grace", "-5m", "src", "vol/packs"])
            .fails(
                2,
                "invalid value \"-5m\" for --grace: negative durations are not allowed",
            )
    });
    f.sync(&[]).ok();
    f.unchanged_by(|| {
        f.packsync(&["gc", "vol/packs", "--grace", "-1"]).fails(
            2,
            "invalid value \"-1\" for --grace: negative durations are not allowed",
        )
    });
}

#[test]
fn exec_on_a_dest_whose_parent_is_missing_names_the_whole_path() {
    let f = Fixture::new();
    let full = fs::canonicalize(f.path("")).unwrap().join("st2");
    f.packsync(&["exec", "st2/packs", "--", "true"]).fails(
        3,
        &format!(
            "st2/packs: not a packsync destination ({} does not exist)",
            full.display()
        ),
    );
    fs::write(f.path("st2"), "a file").unwrap();
    f.packsync(&["exec", "st2/packs", "--", "true"]).fails(
        3,
        &format!(
            "st2/packs: not a packsync destination ({} is not a directory)",
            full.display()
        ),
    );
}
