//! `sync --every` tells the truth: its log's last line, `/healthz` after
//! failures, and `/metrics` as promtool and a real Prometheus read it (the
//! queries an operator writes). Every wait is on something a user could
//! watch, bounded by a deadline.

use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use crate::fixture::{skip, Fixture};
use crate::sidecar::{free_port, live, promtool_accepts, read, Loop, DEADLINE};

/// The value of the sample `name` (its whole series text, labels included)
/// in a `/metrics` answer.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

fn metric(l: &Loop, name: &str) -> Option<f64> {
    let (200, text) = l.get("/metrics")? else {
        return None;
    };
    sample(&text, name)
}

#[test]
fn a_recovery_is_an_info_line_healthz_goes_red_then_green_and_sigterm_is_no_error() {
    let fx = Fixture::new();
    fx.file("a.txt", "one");
    let l = Loop::start(&fx, &["--every", "50ms"]);
    l.until("the first generation", || {
        read(&fx.dest().join("a.txt")).is_some()
    });
    assert_eq!(metric(&l, "packsync_consecutive_failures"), Some(0.0));
    fs::rename(fx.src(), fx.path("away")).unwrap();
    // --unhealthy-after 3, the default: three failures in a row and
    // /healthz is red, though the last good tree stays live (and ready).
    l.until("three failures in a row", || {
        metric(&l, "packsync_consecutive_failures").is_some_and(|n| n >= 3.0)
    });
    assert_eq!((l.status("/healthz"), l.status("/readyz")), (503, 200));
    assert_eq!(read(&fx.dest().join("a.txt")).as_deref(), Some("one"));
    let last_line = || l.stderr().lines().last().unwrap_or_default().to_string();
    assert!(
        last_line().starts_with("packsync: error: "),
        "{}",
        l.stderr()
    );

    fs::rename(fx.path("away"), fx.src()).unwrap();
    l.until("/healthz green again", || l.status("/healthz") == 200);
    l.until("the recovery line", || last_line().contains("recovered"));
    let failed = l.rounds("error");
    assert_eq!(metric(&l, "packsync_consecutive_failures"), Some(0.0));
    assert_eq!(
        last_line(),
        format!(
            "packsync: recovered after {failed} failures; generation {} is live",
            live(&fx)
        )
    );
    let errors = l.stderr().matches("packsync: error: ").count() as u64;
    assert_eq!(errors, failed, "one error line a failed round");

    let run = l.stop();
    assert_eq!(run.code, 143, "{}", run.stderr);
    assert!(!run.stderr.contains("error: interrupted"), "{}", run.stderr);
    assert_eq!(
        run.stderr.lines().last().unwrap(),
        format!(
            "packsync: interrupted by SIGTERM; stopped, generation {} stays live",
            live(&fx)
        )
    );
}

#[test]
fn unhealthy_after_sets_how_many_failures_turn_healthz_red() {
    let fx = Fixture::new();
    fx.file("a.txt", "one");
    let l = Loop::start(&fx, &["--every", "20ms", "--unhealthy-after", "1000"]);
    l.until("the first generation", || {
        read(&fx.dest().join("a.txt")).is_some()
    });
    fs::remove_dir_all(fx.src()).unwrap();
    l.until("five failures in a row", || {
        metric(&l, "packsync_consecutive_failures").is_some_and(|n| n >= 5.0)
    });
    assert_eq!(l.status("/healthz"), 200, "{}", l.stderr());
    assert_eq!(l.stop().code, 143);

    let l = Loop::start(&fx, &["--every", "20ms", "--unhealthy-after", "1"]);
    l.until("a failure", || l.rounds("error") >= 1);
    assert_eq!(l.status("/healthz"), 503);
    // --max-failures still means exit, and it needs --every as before.
    drop(l);
    fx.sync(&["--unhealthy-after", "2"])
        .fails(2, "--unhealthy-after needs --every");
    fx.sync(&["--every", "1s", "--unhealthy-after", "0"])
        .fails(2, "invalid value \"0\" for --unhealthy-after");
}

#[test]
fn with_json_the_recovery_is_one_object_after_the_failed_ones() {
    let fx = Fixture::new();
    fx.file("a.txt", "one");
    let l = Loop::start(&fx, &["--every", "50ms", "--json"]);
    l.until("the first generation", || {
        read(&fx.dest().join("a.txt")).is_some()
    });
    fs::rename(fx.src(), fx.path("away")).unwrap();
    l.more_rounds("error", 2);
    fs::rename(fx.path("away"), fx.src()).unwrap();
    l.until("the recovery object", || {
        l.stdout().contains("\"recovered\"")
    });
    let failed = l.rounds("error");
    let gen = live(&fx);
    let run = l.stop();
    assert_eq!(run.code, 143, "{}", run.stderr);
    let (objects, statuses) = crate::fixture::json_lines(&run.stdout);
    let mut want = vec!["synced"];
    want.extend(std::iter::repeat_n("error", failed as usize));
    want.push("recovered");
    assert_eq!(statuses, want, "{}", run.stdout);
    let last = objects.last().unwrap();
    assert_eq!(last["failures"], failed);
    assert_eq!(last["generation"], gen.as_str());
}

/// A raw request: the status code, the headers (names lower-cased) and the body.
fn request(port: u16, method: &str, path: &str) -> (u16, Vec<(String, String)>, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    write!(s, "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let mut lines = head.split("\r\n");
    let code = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .map(|h| {
            let (n, v) = h.split_once(':').unwrap();
            (n.to_ascii_lowercase(), v.trim().to_string())
        })
        .collect();
    (code, headers, body.to_string())
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> &'a str {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {name} in {headers:?}"))
}

#[test]
fn head_answers_as_get_does_without_the_body() {
    let fx = Fixture::new();
    fx.file("a.txt", "one");
    let l = Loop::start(&fx, &["--every", "50ms"]);
    l.until("ready", || l.status("/readyz") == 200);
    for path in ["/healthz", "/readyz", "/metrics", "/nothing"] {
        let (get_code, get_headers, get_body) = request(l.port, "GET", path);
        let (code, headers, body) = request(l.port, "HEAD", path);
        assert_eq!(code, get_code, "{path}");
        assert_eq!(body, "", "{path}: HEAD has no body");
        assert_eq!(
            header(&headers, "content-type"),
            header(&get_headers, "content-type"),
            "{path}"
        );
        let len: usize = header(&headers, "content-length").parse().unwrap();
        assert_eq!(
            header(&get_headers, "content-length"),
            get_body.len().to_string()
        );
        if path == "/metrics" {
            // The figures move between the two requests; the size is near.
            assert!(
                len * 2 > get_body.len() && len < get_body.len() * 2,
                "{len}"
            );
        } else {
            assert_eq!(len, get_body.len(), "{path}");
        }
    }
    assert_eq!(l.stop().code, 143);
}

#[test]
fn metrics_carry_the_build_the_failures_in_a_row_and_the_process_figures() {
    let fx = Fixture::new();
    fx.file("a.txt", "one");
    let before = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    // Rounds on SIGHUP only, so that between them the loop holds what it
    // holds when idle, and the open files it reports are the ones /proc lists.
    let l = Loop::start(&fx, &["--every", "1h"]);
    l.until("the first round", || l.rounds("published") >= 1);
    for _ in 0..2 {
        let base = l.rounds("up_to_date");
        l.signal(rustix::process::Signal::HUP);
        l.until("a round on SIGHUP", || l.rounds("up_to_date") > base);
    }
    let after = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let (_, text) = l.get("/metrics").unwrap();
    let pid = l.child.as_ref().unwrap().id();
    let version = format!(
        "packsync_build_info{{version=\"{}\"}}",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(sample(&text, &version), Some(1.0), "{text}");
    assert_eq!(sample(&text, "packsync_consecutive_failures"), Some(0.0));
    // An up-to-date round of a small tree takes milliseconds: the first
    // bucket is 1 ms, so the histogram can tell such rounds apart.
    assert!(
        sample(&text, "packsync_sync_duration_seconds_bucket{le=\"0.001\"}").is_some(),
        "{text}"
    );
    let get = |name: &str| sample(&text, name).unwrap_or_else(|| panic!("{name} in\n{text}"));
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse().ok())
        .unwrap();
    let rss = get("process_resident_memory_bytes");
    assert!(
        rss > kib * 512.0 && rss < kib * 2048.0,
        "{rss}, /proc: {kib} KiB"
    );
    let fds = get("process_open_fds");
    let listed = fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count() as f64;
    // The connection that asked is open while the answer is made.
    assert!(
        fds >= 4.0 && (listed..=listed + 1.0).contains(&fds),
        "{fds}, /proc lists {listed}"
    );
    // Started between the two clock readings (the start time counts in
    // clock ticks, and boot time in whole seconds).
    let start = get("process_start_time_seconds");
    assert!(
        start > before - 2.0 && start < after + 2.0,
        "{start} not in {before}..{after}"
    );
    assert!(get("process_virtual_memory_bytes") >= rss);
    assert!(get("process_cpu_seconds_total") >= 0.0);
    assert!(get("process_max_fds") >= fds);
    assert_eq!(l.stop().code, 143);
    promtool_accepts(&text);
}

/// A Prometheus server scraping `target` every second, on a port of its
/// own on 127.0.0.1, with its data in `dir`; stopped when dropped.
struct Prometheus {
    child: Child,
    port: u16,
}

impl Prometheus {
    fn start(dir: &Path, target: u16) -> Option<Prometheus> {
        let config = dir.join("prometheus.yml");
        fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: packsync\n    static_configs:\n      \
                 - targets: ['127.0.0.1:{target}']\n"
            ),
        )
        .unwrap();
        let port = free_port();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                fs::File::create(dir.join("prometheus.log")).unwrap(),
            ))
            .spawn();
        match child {
            Ok(child) => Some(Prometheus { child, port }),
            Err(e) => {
                skip(&format!(
                    "the Prometheus queries: cannot run prometheus: {e}"
                ));
                None
            }
        }
    }

    /// `/api/v1/query?query=QUERY`: the result vector's values by the
    /// series' labels (None while Prometheus is not up yet).
    fn query(&self, query: &str) -> Option<Vec<(serde_json::Value, f64)>> {
        let q: String = query
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'.' | b'-' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(DEADLINE)).ok()?;
        write!(
            s,
            "GET /api/v1/query?query={q} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        let body = text.split_once("\r\n\r\n")?.1;
        let v: serde_json::Value = serde_json::from_str(body).ok()?;
        if v["status"] != "success" {
            return None;
        }
        let results = v["data"]["result"].as_array()?;
        Some(
            results
                .iter()
                .map(|r| {
                    let value = r["value"][1].as_str().unwrap().parse().unwrap();
                    (r["metric"].clone(), value)
                })
                .collect(),
        )
    }

    /// Wait until `query` has one series whose value `ok` accepts: that value.
    #[track_caller]
    fn until(&self, query: &str, ok: impl Fn(f64) -> bool, log: &Path) -> f64 {
        // Prometheus takes seconds to start, and a rate needs two scrapes.
        let start = Instant::now();
        loop {
            if let Some(rows) = self.query(query) {
                if let [(_, v)] = rows[..] {
                    if ok(v) {
                        return v;
                    }
                }
            }
            if start.elapsed() > DEADLINE * 2 {
                panic!(
                    "no good answer to {query}: {:?}\nprometheus: {}",
                    self.query(query),
                    fs::read_to_string(log).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_prometheus_scraping_the_loop_answers_the_queries_an_operator_writes() {
    let fx = Fixture::new();
    fx.file("a.txt", "one");
    let l = Loop::start(&fx, &["--every", "100ms", "--label", "v1.2.3"]);
    l.until("the first generation", || {
        read(&fx.dest().join("a.txt")).is_some()
    });
    let dir = fx.path("prometheus");
    fs::create_dir(&dir).unwrap();
    let Some(prom) = Prometheus::start(&dir, l.port) else {
        return;
    };
    let log = dir.join("prometheus.log");
    // Scraped, and what it scraped parsed.
    prom.until("up{job=\"packsync\"}", |v| v == 1.0, &log);
    // Rounds happen: ten a second, counted as a rate.
    prom.until("sum(rate(packsync_syncs_total[1m]))", |v| v > 0.0, &log);
    prom.until(
        "rate(packsync_syncs_total{result=\"error\"}[1m])",
        |v| v == 0.0,
        &log,
    );
    // The last success is recent: a scrape and a round ago at most.
    let age = prom.until(
        "time() - packsync_last_success_timestamp_seconds",
        |v| v.is_finite(),
        &log,
    );
    assert!(age > -5.0 && age < DEADLINE.as_secs_f64() * 2.0, "{age}");
    // The histogram gives a quantile: a number within the buckets, not NaN.
    prom.until(
        "histogram_quantile(0.9, rate(packsync_sync_duration_seconds_bucket[1m]))",
        |v| v > 0.0 && v <= 300.0,
        &log,
    );
    prom.until("packsync_consecutive_failures", |v| v == 0.0, &log);
    prom.until("process_resident_memory_bytes", |v| v > 0.0, &log);
    let gen = live(&fx);
    let rows = prom
        .query("packsync_live_generation_info")
        .expect("an answer");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].0["generation"], gen.as_str());
    assert_eq!(rows[0].0["label"], "v1.2.3");
    let rows = prom.query("packsync_build_info").expect("an answer");
    assert_eq!(rows[0].0["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(l.stop().code, 143);
}
