//! `sync --every`: the loop through the binary. Every wait is on something
//! a user could watch (a file in DEST, a log line, an HTTP answer, the
//! process's exit) with a deadline; none sleeps and hopes.

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::fixture::{code, Fixture, Run};

/// Generous for a loaded 2-core machine; a pass never waits this long.
pub(crate) const DEADLINE: Duration = Duration::from_secs(30);

/// A running `sync --every`, its output in files; killed if a test fails.
pub(crate) struct Loop {
    pub(crate) child: Option<Child>,
    out: PathBuf,
    err: PathBuf,
    pub(crate) port: u16,
}

impl Loop {
    /// `packsync sync --grace 0 --http-bind 127.0.0.1:<free> ARGS src vol/packs`.
    pub(crate) fn start(fx: &Fixture, args: &[&str]) -> Loop {
        Loop::start_with(fx, args, |_| {})
    }

    pub(crate) fn start_with(
        fx: &Fixture,
        args: &[&str],
        tweak: impl FnOnce(&mut std::process::Command),
    ) -> Loop {
        Loop::start_on(fx, args, &["src"], tweak)
    }

    /// `start_with`, of these SOURCEs instead of `src`.
    pub(crate) fn start_on(
        fx: &Fixture,
        args: &[&str],
        sources: &[&str],
        tweak: impl FnOnce(&mut std::process::Command),
    ) -> Loop {
        let port = free_port();
        let bind = format!("127.0.0.1:{port}");
        let mut all = vec!["sync", "--grace", "0", "--http-bind", &bind];
        all.extend_from_slice(args);
        all.extend_from_slice(sources);
        all.push("vol/packs");
        let (out, err) = (fx.path("loop.out"), fx.path("loop.err"));
        let mut cmd = fx.command(&all);
        cmd.stdout(Stdio::from(fs::File::create(&out).unwrap()))
            .stderr(Stdio::from(fs::File::create(&err).unwrap()));
        tweak(&mut cmd);
        let child = cmd.spawn().unwrap();
        let l = Loop {
            child: Some(child),
            out,
            err,
            port,
        };
        l.until("the HTTP server answers", || l.get("/metrics").is_some());
        l
    }

    pub(crate) fn stdout(&self) -> String {
        fs::read_to_string(&self.out).unwrap_or_default()
    }

    pub(crate) fn stderr(&self) -> String {
        fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// Wait for `cond`, failing the test (with the loop's output) after `DEADLINE`.
    #[track_caller]
    pub(crate) fn until(&self, what: &str, mut cond: impl FnMut() -> bool) {
        let start = Instant::now();
        while !cond() {
            if start.elapsed() > DEADLINE {
                panic!(
                    "timed out waiting for {what}\nstdout: {}\nstderr: {}",
                    self.stdout(),
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// GET `path`: the status code and body, or None if nothing answers.
    pub(crate) fn get(&self, path: &str) -> Option<(u16, String)> {
        let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
        self.raw(req.as_bytes())
    }

    /// Send `bytes` as they are; the answer's status code and body.
    pub(crate) fn raw(&self, bytes: &[u8]) -> Option<(u16, String)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        s.write_all(bytes).ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        let status = text.split(' ').nth(1)?.parse().ok()?;
        let body = text.split_once("\r\n\r\n")?.1.to_string();
        Some((status, body))
    }

    /// `packsync_syncs_total{result="<result>"}`.
    pub(crate) fn rounds(&self, result: &str) -> u64 {
        let Some((200, text)) = self.get("/metrics") else {
            return 0;
        };
        let key = format!("packsync_syncs_total{{result=\"{result}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&key))
            .map_or(0, |n| n.parse().unwrap())
    }

    /// Wait until `result` was counted `n` more times than now.
    #[track_caller]
    pub(crate) fn more_rounds(&self, result: &str, n: u64) {
        let base = self.rounds(result);
        self.until(&format!("{n} more {result} rounds"), || {
            self.rounds(result) >= base + n
        });
    }

    pub(crate) fn status(&self, path: &str) -> u16 {
        self.get(path).expect("an answer").0
    }

    pub(crate) fn signal(&self, sig: rustix::process::Signal) {
        let pid = self.child.as_ref().unwrap().id();
        rustix::process::kill_process(rustix::process::Pid::from_raw(pid as i32).unwrap(), sig)
            .unwrap();
    }

    /// Wait for the process to exit by itself: its exit code and output.
    #[track_caller]
    pub(crate) fn exit(mut self) -> Run {
        let mut child = self.child.take().unwrap();
        let start = Instant::now();
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if start.elapsed() > DEADLINE {
                let _ = child.kill();
                panic!("the loop did not exit\nstderr: {}", self.stderr());
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let out = std::process::Output {
            status,
            stdout: fs::read(&self.out).unwrap(),
            stderr: fs::read(&self.err).unwrap(),
        };
        Run {
            code: code(&out),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// SIGTERM, and its exit.
    #[track_caller]
    pub(crate) fn stop(self) -> Run {
        self.signal(rustix::process::Signal::TERM);
        self.exit()
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub(crate) fn read(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok()
}

/// The generation DEST points at.
pub(crate) fn live(fx: &Fixture) -> String {
    fs::read_link(fx.dest())
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

fn staging_left(fx: &Fixture) -> Vec<String> {
    match fs::read_dir(fx.state().join("stage")) {
        Ok(d) => d
            .map(|e| e.unwrap().file_name().to_string_lossy().into())
            .collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn a_change_is_published_within_one_period_and_idle_rounds_print_nothing() {
    let fx = Fixture::new();
    fx.file("a.txt", "one");
    let l = Loop::start(&fx, &["--every", "1s"]);
    l.until("the first generation", || {
        read(&fx.dest().join("a.txt")).is_some()
    });
    l.more_rounds("up_to_date", 1);
    let first = live(&fx);
    let rounds = || l.rounds("up_to_date") + l.rounds("published");
    fx.file("b.txt", "two");
    let before = rounds();
    l.until("b.txt in DEST", || {
        read(&fx.dest().join("b.txt")).as_deref() == Some("two")
    });
    // Within one period: the round under way when b.txt was written may
    // miss it, the next one publishes it (counted in rounds, not seconds;
    // the latency is measured in bench/).
    let after = rounds();
    assert!(
        after - before <= 2,
        "published {} rounds after the change",
        after - before
    );
    assert_ne!(live(&fx), first);
    l.more_rounds("up_to_date", 2);
    let run = l.stop();
    assert_eq!(run.code, 143, "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(
        lines.len(),
        2,
        "a line per published round only: {}",
        run.stdout
    );
    assert!(
        lines.iter().all(|l| l.contains(" synced: ")),
        "{}",
        run.stdout
    );
    assert!(
        run.stderr.contains("interrupted by SIGTERM"),
        "{}",
        run.stderr
    );
    assert!(staging_left(&fx).is_empty());
}

#[test]
fn sighup_syncs_at_once() {
    let fx = Fixture::new();
    fx.file("a.txt", "one");
    let l = Loop::start(&fx, &["--every", "1h"]);
    l.until("the first generation", || {
        read(&fx.dest().join("a.txt")).is_some()
    });
    fx.file("a.txt", "changed");
    l.signal(rustix::process::Signal::HUP);
    l.until("the change, long before the hour", || {
        read(&fx.dest().join("a.txt")).as_deref() == Some("changed")
    });
    assert_eq!(l.stop().code, 143);
}

#[test]
fn a_failing_source_is_an_error_with_the_tree_kept_then_recovers() {
    let fx = Fixture::new();
    fx.file("a.txt", "one");
    let l = Loop::start(&fx, &["--every", "100ms"]);
    l.until("the first generation", || {
        read(&fx.dest().join("a.txt")).is_some()
    });
    let gen = live(&fx);
    fs::rename(fx.src(), fx.path("away")).unwrap();
    l.more_rounds("error", 2);
    assert_eq!(read(&fx.dest().join("a.txt")).as_deref(), Some("one"));
    assert_eq!(live(&fx), gen, "the live tree stays");
    assert_eq!((l.status("/healthz"), l.status("/readyz")), (200, 200));
    let err = l.stderr();
    assert!(err.contains("failure 1 in a row; next try in"), "{err}");
    assert!(err.contains("failure 2 in a row"), "{err}");
    fs::rename(fx.path("away"), fx.src()).unwrap();
    fx.file("b.txt", "two");
    l.until("the recovered source's tree", || {
        read(&fx.dest().join("b.txt")).is_some()
    });
    // DEST shows the tree before the round that published it is counted.
    l.until("the recovered round in /metrics", || {
        l.rounds("published") >= 2
    });
    assert_eq!(l.rounds("published"), 2, "first and recovered");
    assert_eq!(l.stop().code, 143);
}

#[test]
fn max_failures_exits_1_after_that_many_failures_in_a_row() {
    let fx = Fixture::new();
    fx.file("a.txt", "one");
    let l = Loop::start(&fx, &["--every", "100ms", "--max-failures", "3"]);
    l.until("the first generation", || {
        read(&fx.dest().join("a.txt")).is_some()
    });
    fs::remove_dir_all(fx.src()).unwrap();
    let run = l.exit();
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("giving up after 3 failed rounds in a row (--max-failures)"),
        "{}",
        run.stderr
    );
    assert_eq!(
        run.stderr.matches("in a row; next try in").count(),
        2,
        "{}",
        run.stderr
    );
    assert_eq!(read(&fx.dest().join("a.txt")).as_deref(), Some("one"));
}

#[test]
fn sigterm_during_staging_removes_it_and_exits_143() {
    let fx = Fixture::new();
    fx.file("a.txt", "one");
    let resume = fx.path("resume");
    let marker = PathBuf::from(format!("{}.paused", resume.display()));
    let spec = format!("staging:{}", resume.display());
    let l = Loop::start_with(&fx, &["--every", "100ms"], |c| {
        c.env("PACKSYNC_TEST_PAUSE_AT", &spec);
    });
    l.until("the pause in staging", || marker.exists());
    assert_eq!(staging_left(&fx).len(), 1, "staging is under way");
    let run = l.stop();
    assert_eq!(run.code, 143, "{}", run.stderr);
    assert!(staging_left(&fx).is_empty(), "{:?}", staging_left(&fx));
    assert!(
        fs::symlink_metadata(fx.dest()).is_err(),
        "nothing published"
    );
}

#[test]
fn exec_after_runs_once_per_new_generation_and_not_on_idle_rounds() {
    let fx = Fixture::new();
    fx.file("a.txt", "one");
    let hook = "echo \"$PACKSYNC_GENERATION\" >> hooks.log";
    let l = Loop::start(&fx, &["--every", "50ms", "--exec-after", hook]);
    let hooks = || read(&fx.path("hooks.log")).unwrap_or_default();
    l.until("the first hook", || hooks().lines().count() == 1);
    let first = live(&fx);
    l.more_rounds("up_to_date", 3);
    assert_eq!(hooks().lines().collect::<Vec<_>>(), [first.as_str()]);
    fx.file("b.txt", "two");
    l.until("the second hook", || hooks().lines().count() == 2);
    l.more_rounds("up_to_date", 3);
    let second = live(&fx);
    assert_ne!(first, second);
    assert_eq!(
        hooks().lines().collect::<Vec<_>>(),
        [first.as_str(), second.as_str()]
    );
    assert_eq!(l.stop().code, 143);
}

#[test]
fn healthz_and_readyz_follow_the_states_of_the_spec() {
    let fx = Fixture::new();
    fs::remove_dir(fx.src()).unwrap();
    // No generation anywhere yet: neither healthy nor ready.
    let l = Loop::start(&fx, &["--every", "100ms"]);
    l.more_rounds("error", 1);
    assert_eq!((l.status("/healthz"), l.status("/readyz")), (503, 503));
    fs::create_dir(fx.src()).unwrap();
    fx.file("a.txt", "one");
    l.until("ready", || l.status("/readyz") == 200);
    assert_eq!(l.status("/healthz"), 200);
    assert!(read(&fx.dest().join("a.txt")).is_some());
    assert_eq!(l.stop().code, 143);

    // A new pod whose source fails: DEST holds an earlier generation, so it
    // is healthy, but not ready (nothing from its own sources is live).
    fs::rename(fx.src(), fx.path("away")).unwrap();
    let l = Loop::start(&fx, &["--every", "100ms"]);
    l.more_rounds("error", 1);
    assert_eq!((l.status("/healthz"), l.status("/readyz")), (200, 503));
    assert_eq!(l.status("/nothing-else"), 404);
    assert_eq!(l.stop().code, 143);
}

#[test]
fn malformed_or_slow_http_requests_get_a_4xx_and_leave_the_loop_running() {
    let fx = Fixture::new();
    fx.file("a.txt", "one");
    let l = Loop::start(&fx, &["--every", "50ms"]);
    l.until("the first generation", || {
        read(&fx.dest().join("a.txt")).is_some()
    });
    // A client that connects and sends nothing holds the server, not the loop.
    let mut idle = TcpStream::connect(("127.0.0.1", l.port)).unwrap();
    idle.write_all(b"GET /hea").unwrap();
    fx.file("b.txt", "two");
    l.until("a round while a client stalls", || {
        read(&fx.dest().join("b.txt")).is_some()
    });
    // Nor does it hold back a probe: answered while the stalled client is
    // still waiting for its own answer (so not after it).
    assert_eq!(l.status("/healthz"), 200);
    idle.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    let pending = idle.read(&mut byte);
    assert!(
        matches!(&pending, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the stalled client was answered before the probe: {pending:?}"
    );
    idle.set_nonblocking(false).unwrap();
    let mut answer = String::new();
    idle.set_read_timeout(Some(DEADLINE)).unwrap();
    idle.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    for (req, want) in [
        (b"GARBAGE\r\n\r\n".to_vec(), 400),
        (b"GET /healthz HTTP/1.1\r\n\r\n".to_vec(), 400),
        (b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), 405),
        (
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 99\r\n\r\n".to_vec(),
            413,
        ),
        (b"GET /metrics HTTP/3\r\nHost: x\r\n\r\n".to_vec(), 400),
        ([b"GET /".to_vec(), vec![b'a'; 20_000]].concat(), 431),
    ] {
        assert_eq!(
            l.raw(&req).map(|a| a.0),
            Some(want),
            "{:?}",
            String::from_utf8_lossy(&req[..20.min(req.len())])
        );
    }
    fx.file("c.txt", "three");
    l.until("a round after the bad requests", || {
        read(&fx.dest().join("c.txt")).is_some()
    });
    assert_eq!(l.status("/healthz"), 200);
    assert_eq!(l.stop().code, 143);
}

#[test]
fn metrics_are_valid_prometheus_text_with_the_names_of_the_spec() {
    let fx = Fixture::new();
    fx.file("a.txt", "one");
    let l = Loop::start(&fx, &["--every", "50ms", "--label", "v1.2.3"]);
    l.more_rounds("up_to_date", 2);
    let (code, text) = l.get("/metrics").unwrap();
    assert_eq!(code, 200);
    let gen = live(&fx);
    for want in [
        "packsync_syncs_total{result=\"published\"} 1".to_string(),
        "packsync_syncs_total{result=\"error\"} 0".to_string(),
        format!("packsync_live_generation_info{{generation=\"{gen}\",label=\"v1.2.3\"}} 1"),
        "packsync_copied_bytes_total 3".to_string(),
    ] {
        assert!(text.lines().any(|l| l == want), "{want} not in\n{text}");
    }
    for name in [
        "packsync_sync_duration_seconds_bucket{le=\"+Inf\"}",
        "packsync_sync_duration_seconds_count",
        "packsync_last_success_timestamp_seconds",
    ] {
        assert!(text.contains(name), "{name} not in\n{text}");
    }
    // What the loop holds between rounds, as /proc shows it.
    let gauge = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{name} not in\n{text}"))
    };
    let pid = l.child.as_ref().unwrap().id();
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse().ok())
        .unwrap();
    let rss = gauge("packsync_idle_resident_memory_bytes");
    assert!(
        rss > kib * 1024 / 2 && rss < kib * 1024 * 2,
        "{rss} bytes, /proc says {kib} KiB"
    );
    let fds = gauge("packsync_idle_open_fds");
    let now = fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count() as u64;
    // stdin, stdout, stderr, the listening socket: and no more than /proc
    // counts now with this request's connection open.
    assert!((4..=now).contains(&fds), "{fds} fds, /proc lists {now}");
    assert_eq!(l.stop().code, 143);
    promtool_accepts(&text);
}

/// `promtool check metrics` (Debian's prometheus package) reads `text`
/// without a problem, lint included. Skips where it is not installed,
/// except in CI (.ci/run installs it).
pub(crate) fn promtool_accepts(text: &str) {
    let child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            crate::fixture::skip(&format!("the promtool check: cannot run promtool: {e}"));
            return;
        }
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn with_json_each_round_shown_is_one_json_object() {
    let fx = Fixture::new();
    fx.file("a.txt", "one");
    let l = Loop::start(&fx, &["--every", "50ms", "--json", "--max-failures", "2"]);
    l.until("the first generation", || {
        read(&fx.dest().join("a.txt")).is_some()
    });
    l.more_rounds("up_to_date", 2);
    fs::remove_dir_all(fx.src()).unwrap();
    let run = l.exit();
    assert_eq!(run.code, 1, "{}", run.stderr);
    let (objects, statuses) = crate::fixture::json_lines(&run.stdout);
    assert_eq!(statuses, ["synced", "error", "error"], "{}", run.stdout);
    assert_eq!(objects[1]["failures"], 1);
    assert!(objects[1]["retry_in_seconds"].as_f64().is_some());
    assert!(objects[2]["retry_in_seconds"].is_null());
}

#[test]
fn loop_flags_need_every_and_every_has_a_floor() {
    let fx = Fixture::new();
    fx.sync(&["--max-failures", "3"])
        .fails(2, "--max-failures needs --every");
    fx.sync(&["--http-bind", "127.0.0.1:1"])
        .fails(2, "--http-bind needs --every");
    fx.sync(&["--every", "0"])
        .fails(2, "invalid value \"0\" for --every: at least 10ms");
    fx.sync(&["--every", "1s", "--dry-run"])
        .fails(2, "--every cannot be combined with --dry-run");
    let port = free_port();
    let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
    fx.sync(&["--every", "1s", "--http-bind", &format!("127.0.0.1:{port}")])
        .fails(
            1,
            &format!("cannot listen on 127.0.0.1:{port} (--http-bind)"),
        );
    drop(listener);
}
