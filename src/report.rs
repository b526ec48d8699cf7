//! Reporting: the progress bar on a terminal, a line now and then in a log,
//! warnings, the closing summary line or the JSON summary of a sync (and its
//! `--itemize` lines), and how a failed command is shown. The only file that
//! knows indicatif; stages talk to a `Reporter` and stay silent in tests.
//! Warnings go through the reporter only: it shows each one as it comes and
//! keeps them for the summary.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::plan::Plan;

/// What a stage tells about its progress.
pub trait Reporter: Sync {
    /// Work on `entries` entries and `bytes` bytes of copying is about to start.
    fn begin(&self, entries: u64, bytes: u64);
    /// One more entry done, with its bytes (those not told of by `copying`).
    fn advance(&self, bytes: u64);
    fn finish(&self);
    /// Something the user should know that does not stop the sync.
    fn warn(&self, msg: &str);
    /// An entry left out because packsync does not mirror its kind (`what`:
    /// `FIFO`, `socket`, a device): `path` (raw bytes) is relative to the
    /// tree `label` names. Shown as a warning; a caller that needs the path
    /// (`verify`) keeps it from here, never from the warning's text.
    fn skipped(&self, label: &str, path: &[u8], what: &str) {
        self.warn(&skip_line(label, path, what));
    }
    /// `bytes` more of a file still being copied (a large one, a chunk at a
    /// time): its `advance` then brings only the rest.
    fn copying(&self, bytes: u64) {
        let _ = bytes;
    }
    /// `bytes` more downloaded (a layer, a bundle), before staging begins.
    fn fetched(&self, bytes: u64) {
        let _ = bytes;
    }
    /// `bytes` of content taken from the live generation instead of
    /// fetched (a zstd:chunked layer's files that were there already).
    fn reused(&self, bytes: u64) {
        let _ = bytes;
    }
}

/// The warning for a skipped entry: `skipping FIFO src/a/fifo`.
fn skip_line(label: &str, path: &[u8], what: &str) -> String {
    format!("skipping {what} {}", crate::escape::display(label, path))
}

/// An entry a scan left out (see `Reporter::skipped`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub path: Vec<u8>,
    pub what: String,
}

/// A reporter that keeps what it is told, for the caller to show or use
/// later: the warnings of scans that run in parallel with other work, and
/// the entries they skipped. Progress is not kept.
#[derive(Default)]
pub struct Collected {
    warnings: Mutex<Vec<String>>,
    skipped: Mutex<Vec<Skipped>>,
}

impl Collected {
    /// Every warning so far, in the order given (skipped entries included).
    pub fn take_warnings(&self) -> Vec<String> {
        std::mem::take(&mut *self.warnings.lock().unwrap())
    }

    /// Every skipped entry so far.
    pub fn take_skipped(&self) -> Vec<Skipped> {
        std::mem::take(&mut *self.skipped.lock().unwrap())
    }
}

impl Reporter for Collected {
    fn begin(&self, _: u64, _: u64) {}
    fn advance(&self, _: u64) {}
    fn finish(&self) {}
    fn warn(&self, msg: &str) {
        self.warnings.lock().unwrap().push(msg.to_string());
    }
    fn skipped(&self, label: &str, path: &[u8], what: &str) {
        self.skipped.lock().unwrap().push(Skipped {
            path: path.to_vec(),
            what: what.to_string(),
        });
        self.warn(&skip_line(label, path, what));
    }
}

/// How a sync shows its outcome: `--json`, `--quiet`, or a summary line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Line,
    Quiet,
    Json,
}

impl Output {
    pub fn of(json: bool, quiet: bool) -> Output {
        match (json, quiet) {
            (true, _) => Output::Json,
            (false, true) => Output::Quiet,
            (false, false) => Output::Line,
        }
    }
}

/// The reporter of a sync: progress as `Output::Line` shows it (a bar, or
/// lines in a log), warnings on stderr whatever the output, and kept for
/// the summary.
pub struct Console {
    progress: Option<Progress>,
    warnings: Mutex<Vec<String>>,
    /// Bytes fetched from remote sources, and bytes of content taken
    /// from the live generation instead (`Reporter::reused`).
    transfer: (AtomicU64, AtomicU64),
    /// Show each warning as it comes (else only keep it: `keeping`).
    echo: bool,
    /// The warnings the round has shown so far, in this try and those
    /// before it: each is shown once.
    shown: Shown,
}

/// The warnings one round has shown on stderr. A round tried again (the
/// live tree drifted, a shortcut did not hold) meets the same source
/// again, and says what it found about it once.
#[derive(Clone, Default)]
pub struct Shown(std::sync::Arc<Mutex<std::collections::HashSet<String>>>);

impl Shown {
    /// Whether `msg` is new to the round (and now shown).
    fn first(&self, msg: &str) -> bool {
        self.0.lock().unwrap().insert(msg.to_string())
    }
}

impl Console {
    /// `show`: a bar, a line now and then (a log), or no progress at all.
    pub fn new(output: Output, show: Show) -> Console {
        Console {
            progress: (output == Output::Line).then(|| Progress::new(show)),
            warnings: Mutex::new(Vec::new()),
            transfer: Default::default(),
            echo: true,
            shown: Shown::default(),
        }
    }

    /// This console, showing only what the round has not shown yet.
    pub fn in_round(self, shown: &Shown) -> Console {
        Console {
            shown: shown.clone(),
            ..self
        }
    }

    /// A console that keeps warnings without showing them, for a round of
    /// `sync --every`: only a round that did something or failed is shown
    /// (`show_kept`), never an idle one.
    pub fn keeping(output: Output, show: Show) -> Console {
        Console {
            echo: false,
            ..Console::new(output, show)
        }
    }

    /// Show the warnings kept so far on stderr (they stay kept for `finish`).
    pub fn show_kept(&self) {
        for w in self.warnings.lock().unwrap().iter() {
            if self.shown.first(w) {
                eprintln!("packsync: warning: {w}");
            }
        }
    }

    /// The warnings so far, in the order they were shown.
    fn take_warnings(&self) -> Vec<String> {
        std::mem::take(&mut *self.warnings.lock().unwrap())
    }

    /// Bytes fetched so far, and bytes reused instead of fetched.
    pub fn transfer(&self) -> (u64, u64) {
        (
            self.transfer.0.load(Ordering::Relaxed),
            self.transfer.1.load(Ordering::Relaxed),
        )
    }
}

impl Reporter for Console {
    fn begin(&self, entries: u64, bytes: u64) {
        if let Some(p) = &self.progress {
            p.begin(entries, bytes);
        }
    }

    fn advance(&self, bytes: u64) {
        if let Some(p) = &self.progress {
            p.advance(bytes);
        }
    }

    fn finish(&self) {
        if let Some(p) = &self.progress {
            p.finish();
        }
    }

    fn copying(&self, bytes: u64) {
        if let Some(p) = &self.progress {
            p.copying(bytes);
        }
    }

    fn fetched(&self, bytes: u64) {
        self.transfer.0.fetch_add(bytes, Ordering::Relaxed);
        if let Some(p) = &self.progress {
            p.fetched(bytes);
        }
    }

    fn reused(&self, bytes: u64) {
        self.transfer.1.fetch_add(bytes, Ordering::Relaxed);
    }

    fn warn(&self, msg: &str) {
        match &self.progress {
            _ if !self.echo || !self.shown.first(msg) => {}
            Some(p) => p.warn(msg),
            None => eprintln!("packsync: warning: {msg}"),
        }
        self.warnings.lock().unwrap().push(msg.to_string());
    }
}

/// How progress is shown: a bar (a terminal, or `--progress`), a line every
/// `LOG_EVERY` of long work (a log), or not at all (`--no-progress`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Show {
    Bar,
    Lines,
    Off,
}

/// How often a log gets a progress line.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// The counts a progress line shows, as they are at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counts {
    entries: u64,
    /// 0: not known (a sync staged as it lists).
    total_entries: u64,
    bytes: u64,
    total_bytes: u64,
}

impl Counts {
    /// How much of the work is done, 0 to 1: by bytes where bytes are to
    /// be copied, else by entries; `None` without a total.
    fn fraction(&self) -> Option<f64> {
        let (done, total) = match (self.total_bytes, self.total_entries) {
            (0, 0) => return None,
            (0, t) => (self.entries, t),
            (t, _) => (self.bytes, t),
        };
        Some((done as f64 / total as f64).min(1.0))
    }
}

/// The rates a progress line shows, smoothed over the last seconds (an
/// exponential average with `Pace::SMOOTH`), and an ETA only once it can be
/// trusted: after `ETA_AFTER` and `ETA_FROM` of the work, so that it does
/// not swing (3m, 29s, 11s) while the first files are small or cached.
/// Times are given (since the start), never read: tests bring their clock.
#[derive(Debug, Default)]
struct Pace {
    /// The last sample: (time since the start, bytes, entries).
    last: Option<(Duration, u64, u64)>,
    bytes_per_s: f64,
    entries_per_s: f64,
}

impl Pace {
    /// Seconds an old rate takes to fade to a third.
    const SMOOTH: f64 = 5.0;
    /// Samples closer than this to the last one are not taken.
    const MIN_STEP: Duration = Duration::from_millis(500);
    const ETA_AFTER: Duration = Duration::from_secs(5);
    const ETA_FROM: f64 = 0.10;

    /// Take the counts at `at` (time since the start) into the rates.
    fn sample(&mut self, at: Duration, c: &Counts) {
        let (t0, b0, e0) = match self.last {
            None => {
                // The first sample: the average since the start.
                let secs = at.as_secs_f64();
                if secs > 0.0 {
                    self.bytes_per_s = c.bytes as f64 / secs;
                    self.entries_per_s = c.entries as f64 / secs;
                    self.last = Some((at, c.bytes, c.entries));
                }
                return;
            }
            Some(last) => last,
        };
        if at < t0 + Pace::MIN_STEP {
            return;
        }
        let dt = (at - t0).as_secs_f64();
        let w = 1.0 - (-dt / Pace::SMOOTH).exp();
        let now_b = c.bytes.saturating_sub(b0) as f64 / dt;
        let now_e = c.entries.saturating_sub(e0) as f64 / dt;
        self.bytes_per_s += (now_b - self.bytes_per_s) * w;
        self.entries_per_s += (now_e - self.entries_per_s) * w;
        self.last = Some((at, c.bytes, c.entries));
    }

    /// Time left at `at`, if it can be told yet.
    fn eta(&self, at: Duration, c: &Counts) -> Option<Duration> {
        let fraction = c.fraction()?;
        if at < Pace::ETA_AFTER || fraction < Pace::ETA_FROM {
            return None;
        }
        let (left, rate) = if c.total_bytes > 0 {
            (c.total_bytes.saturating_sub(c.bytes), self.bytes_per_s)
        } else {
            (
                c.total_entries.saturating_sub(c.entries),
                self.entries_per_s,
            )
        };
        if left == 0 {
            return Some(Duration::ZERO);
        }
        (rate > 0.0).then(|| Duration::from_secs_f64((left as f64 / rate).min(1e7)))
    }

    /// `12/100 entries, 3.0 MiB/20.0 MiB copied, 1.5 MiB/s, 230 entries/s, ETA 11s`:
    /// totals where known, a rate where it says something (not `1 B/s`
    /// of a sync that reuses), the ETA once it is stable.
    fn line(&self, at: Duration, c: &Counts) -> String {
        let mut out = match c.total_entries {
            0 => format!("{} entries", c.entries),
            t => format!("{}/{t} entries", c.entries),
        };
        match c.total_bytes {
            0 => out.push_str(&format!(", {} copied", human_bytes(c.bytes))),
            t => out.push_str(&format!(
                ", {}/{} copied",
                human_bytes(c.bytes),
                human_bytes(t)
            )),
        }
        if self.last.is_some() {
            if self.bytes_per_s >= 1024.0 {
                out.push_str(&format!(", {}/s", human_bytes(self.bytes_per_s as u64)));
            }
            if self.entries_per_s >= 1.0 {
                out.push_str(&format!(", {:.0} entries/s", self.entries_per_s));
            }
        }
        if let Some(eta) = self.eta(at, c) {
            out.push_str(&format!(", ETA {}", short_duration(eta)));
        }
        out
    }
}

/// `45s`, `3m 05s`, `2h 10m`.
fn short_duration(d: Duration) -> String {
    let s = d.as_secs() + u64::from(d.subsec_millis() >= 500);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        _ => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
    }
}

/// A bar on a terminal; in a log, a line every `LOG_EVERY` of long work.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    /// Lines in a log (no bar, and not `Show::Off`).
    lines: bool,
    total: AtomicU64,
    done: AtomicU64,
    bytes: AtomicU64,
    total_bytes: AtomicU64,
    /// Bytes downloaded so far (remote sources), and when the bar last said so.
    fetched: AtomicU64,
    fetched_shown: AtomicU64,
    /// Bytes shown by the bar's message when it was last refreshed.
    bytes_shown: AtomicU64,
    last_line: Mutex<Instant>,
    pace: Mutex<Pace>,
    start: Instant,
}

impl Progress {
    fn new(show: Show) -> Progress {
        let bar = (show == Show::Bar).then(|| {
            let b = indicatif::ProgressBar::with_draw_target(
                Some(0),
                indicatif::ProgressDrawTarget::stderr_with_hz(10),
            );
            b.set_style(
                indicatif::ProgressStyle::with_template("{spinner} {msg}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
            );
            b
        });
        Progress {
            bar,
            lines: show == Show::Lines,
            total: AtomicU64::new(0),
            done: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            total_bytes: AtomicU64::new(0),
            fetched: AtomicU64::new(0),
            fetched_shown: AtomicU64::new(0),
            bytes_shown: AtomicU64::new(0),
            last_line: Mutex::new(Instant::now()),
            pace: Mutex::new(Pace::default()),
            start: Instant::now(),
        }
    }

    fn counts(&self) -> Counts {
        Counts {
            entries: self.done.load(Ordering::Relaxed),
            total_entries: self.total.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            total_bytes: self.total_bytes.load(Ordering::Relaxed),
        }
    }

    /// The line for the counts now, the rates brought up to date.
    fn line(&self) -> String {
        let at = self.start.elapsed();
        let c = self.counts();
        let mut pace = self.pace.lock().unwrap();
        pace.sample(at, &c);
        pace.line(at, &c)
    }

    fn begin(&self, entries: u64, bytes: u64) {
        self.total.store(entries, Ordering::Relaxed);
        self.total_bytes.store(bytes, Ordering::Relaxed);
        if let Some(b) = &self.bar {
            b.set_message(self.line());
        }
    }

    fn advance(&self, bytes: u64) {
        let done = self.done.fetch_add(1, Ordering::Relaxed) + 1;
        let b = self.bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        // Formatting is the costly part: refresh the text now and then.
        self.refresh(done.is_multiple_of(256), b);
    }

    fn copying(&self, bytes: u64) {
        let b = self.bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.refresh(false, b);
    }

    /// Refresh the bar's text (`now`, or every 4 MiB copied), or print a
    /// log line if `LOG_EVERY` passed since the last.
    fn refresh(&self, now: bool, bytes: u64) {
        if let Some(bar) = &self.bar {
            let shown = self.bytes_shown.load(Ordering::Relaxed);
            if now || bytes >= shown + (4 << 20) {
                self.bytes_shown.store(bytes, Ordering::Relaxed);
                bar.set_message(self.line());
            }
            return;
        }
        if !self.lines {
            return;
        }
        let mut last = self.last_line.lock().unwrap();
        if last.elapsed() >= LOG_EVERY {
            *last = Instant::now();
            drop(last);
            eprintln!(
                "packsync: {}, {:.0}s",
                self.line(),
                self.start.elapsed().as_secs_f64()
            );
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }

    /// Downloads come before the entries are known: the bar's message
    /// counts them (every MiB), a log a line every `LOG_EVERY`.
    fn fetched(&self, bytes: u64) {
        let total = self.fetched.fetch_add(bytes, Ordering::Relaxed) + bytes;
        let line = || {
            let secs = self.start.elapsed().as_secs_f64().max(0.001);
            format!(
                "{} downloaded, {}/s",
                human_bytes(total),
                human_bytes((total as f64 / secs) as u64)
            )
        };
        if let Some(bar) = &self.bar {
            let shown = self.fetched_shown.load(Ordering::Relaxed);
            if total >= shown + (1 << 20) {
                self.fetched_shown.store(total, Ordering::Relaxed);
                bar.set_message(line());
                bar.tick();
            }
            return;
        }
        if !self.lines {
            return;
        }
        let mut last = self.last_line.lock().unwrap();
        if last.elapsed() >= LOG_EVERY {
            *last = Instant::now();
            eprintln!("packsync: {}", line());
        }
    }

    fn warn(&self, msg: &str) {
        match &self.bar {
            Some(b) => b.suspend(|| eprintln!("packsync: warning: {msg}")),
            None => eprintln!("packsync: warning: {msg}"),
        }
    }
}

/// Set once a `--json` run printed its object: stdout holds one JSON object,
/// so an error that comes after it (`verify` drift, a failing `--exec-after`)
/// is in that object and on stderr, never a second object.
static JSON_PRINTED: AtomicBool = AtomicBool::new(false);

/// Print the one JSON object of a `--json` run on stdout.
pub fn json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    use std::io::Write;
    let text = serde_json::to_string(value)?;
    let mut out = std::io::stdout().lock();
    // An error, not println!'s panic, when the reader of stdout went away.
    writeln!(out, "{text}")
        .and_then(|()| out.flush())
        .map_err(|e| anyhow::anyhow!("cannot write the JSON output to stdout: {e}"))?;
    JSON_PRINTED.store(true, Ordering::Relaxed);
    Ok(())
}

/// A failed command under `--json` (README, "Exit codes").
#[derive(serde::Serialize)]
struct Failed<'a> {
    status: &'static str,
    error: &'a str,
    exit_code: i32,
}

/// Show a failed command and return its exit status: one line on stderr,
/// and with `--json` the same message as a JSON object on stdout.
pub fn error(err: &anyhow::Error, json: bool) -> i32 {
    let code = crate::error::exit_code(err);
    let msg = format!("{err:#}");
    eprintln!("packsync: error: {msg}");
    if json {
        json_error(&msg, code);
    }
    code
}

/// The JSON object of a failed `--json` run, unless the run already printed
/// its object (which then tells what went wrong).
pub fn json_error(msg: &str, exit_code: i32) {
    if JSON_PRINTED.load(Ordering::Relaxed) {
        return;
    }
    // stdout gone: the line already on stderr is all there is to say.
    let _ = json(&Failed {
        status: "error",
        error: msg,
        exit_code,
    });
}

/// A failed round of `sync --every`: one line on stderr, or with `--json`
/// one JSON object on stdout (each round shown is one line).
#[derive(serde::Serialize)]
struct RoundFailed<'a> {
    status: &'static str,
    error: &'a str,
    exit_code: i32,
    /// Failed rounds in a row, this one included.
    failures: u32,
    /// When the next round starts; absent when the loop gives up.
    retry_in_seconds: Option<f64>,
}

/// Show a failed round of `sync --every` (`retry_in`: the wait before the
/// next, none when this was the last).
pub fn round_failed(
    err: &anyhow::Error,
    failures: u32,
    retry_in: Option<Duration>,
    output: Output,
) {
    let msg = format!("{err:#}");
    if output == Output::Json {
        let _ = json(&RoundFailed {
            status: "error",
            error: &msg,
            exit_code: crate::error::exit_code(err),
            failures,
            retry_in_seconds: retry_in.map(|d| d.as_secs_f64()),
        });
        return;
    }
    let next = match retry_in {
        Some(d) => format!(
            "next try in {}",
            humantime::format_duration(Duration::from_millis(d.as_millis() as u64))
        ),
        None => "giving up".to_string(),
    };
    eprintln!("packsync: error: {msg} (failure {failures} in a row; {next})");
}

/// The first good round of `sync --every` after failures, with `--json` an
/// object on stdout like the failures before it: the log's last line then
/// says the loop is well again, not the stale error.
#[derive(serde::Serialize)]
struct RoundRecovered<'a> {
    status: &'static str,
    /// The failed rounds in a row this one ended.
    failures: u32,
    generation: Option<&'a str>,
}

/// Show that a round succeeded after `failures` failed ones, leaving
/// `generation` live.
pub fn round_recovered(failures: u32, generation: Option<&str>, output: Output) {
    if output == Output::Json {
        let _ = json(&RoundRecovered {
            status: "recovered",
            failures,
            generation,
        });
        return;
    }
    let rounds = if failures == 1 { "failure" } else { "failures" };
    match generation {
        Some(g) => {
            eprintln!("packsync: recovered after {failures} {rounds}; generation {g} is live")
        }
        None => eprintln!("packsync: recovered after {failures} {rounds}"),
    }
}

/// `sync --every` ended by SIGINT/SIGTERM, as asked: an info line, not an
/// error (the exit status still tells which signal).
pub fn loop_stopped(sig: i32, generation: Option<&str>) {
    let name = crate::sys::signal_name(sig);
    match generation {
        Some(g) => eprintln!("packsync: interrupted by {name}; stopped, generation {g} stays live"),
        None => eprintln!("packsync: interrupted by {name}; stopped"),
    }
}

/// What a sync did, for the summary line and `--json`.
#[derive(serde::Serialize, Default)]
pub struct Summary {
    pub dest: String,
    pub status: &'static str,
    pub generation: Option<String>,
    pub previous: Option<String>,
    pub label: Option<String>,
    pub entries: u64,
    pub bytes: u64,
    pub added: u64,
    pub changed: u64,
    pub deleted: u64,
    pub copied: u64,
    pub copied_bytes: u64,
    pub reused: u64,
    /// Bytes fetched from remote sources (layers, ranges of them, bundles).
    pub fetched_bytes: u64,
    /// Bytes of file content taken from the live generation instead of
    /// fetched (a zstd:chunked layer's files the volume held already).
    pub reused_bytes: u64,
    pub retired: Vec<String>,
    /// Every warning the `Console` showed, in order (set by `finish`).
    pub warnings: Vec<String>,
    /// `--itemize` under `--json`: the lines `--itemize` prints without
    /// `--json`, in the same order; the key is absent without `--itemize`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changes: Option<Vec<Itemized>>,
    /// `--exec-after`: what the hook did; `None` when it did not run (not
    /// given, dry run, or up to date with a success on the live generation
    /// already recorded).
    pub exec_after: Option<After>,
    /// `--semver`: the tag chosen for each image source that chose one,
    /// and the manifest digest it named; the key is absent without.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub chosen: Vec<Chosen>,
    pub seconds: f64,
    pub dry_run: bool,
}

/// A round that ran to its end: what it did, ready to be shown.
pub struct Round {
    pub summary: Summary,
    pub console: Console,
    pub start: Instant,
    /// `--exec-after` failed: the error to exit with once the summary is out.
    pub hook_failure: Option<anyhow::Error>,
}

impl Round {
    /// Show the summary (line or JSON object, with the warnings kept); the
    /// exit status, or the hook's failure.
    pub fn report(self, output: Output) -> Result<i32> {
        let code = finish(self.summary, &self.console, self.start, output)?;
        match self.hook_failure {
            Some(e) => Err(e),
            None => Ok(code),
        }
    }

    /// Show the warnings kept by a `sidecar::Pass` that deferred them, then `report`.
    pub fn report_deferred(self, output: Output) -> Result<i32> {
        if output != Output::Json {
            self.console.show_kept();
        }
        self.report(output)
    }
}

/// What `sync --exec-after` did, for the summary (`exec_after` in `--json`).
#[derive(serde::Serialize)]
pub struct After {
    /// CMD as given.
    pub command: String,
    /// CMD ran and exited 0.
    pub ok: bool,
    /// CMD's status as a shell reports it (128 + a signal), or `None` when
    /// it could not be started.
    pub exit_code: Option<i32>,
    /// The error packsync reports on stderr when CMD failed, or `None`.
    pub error: Option<String>,
}

/// What `--semver` chose for one SOURCE.
#[derive(serde::Serialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Chosen {
    /// `oci://HOST/REPO` or `oci-layout:DIR`, as given.
    pub source: String,
    pub tag: String,
    pub digest: String,
}

/// One `--itemize` line as JSON: `{"change": "+", "path": "a/b.txt"}`.
#[derive(serde::Serialize)]
pub struct Itemized {
    /// `+` added, `~` changed, `-` deleted.
    pub change: char,
    /// As the text line shows it: escaped by `escape` (as `verify --json`
    /// paths are), a directory with a trailing `/`, `.` the root.
    pub path: String,
}

/// `--itemize`: one line a change on stdout, or under `--json` the same
/// lines in the summary's `changes` (stdout stays one JSON object).
pub fn itemize(plan: &Plan, output: Output, summary: &mut Summary) {
    if output == Output::Json {
        summary.changes = Some(itemized(plan).collect());
    } else {
        print_itemized(plan);
    }
}

/// The changes of `plan` as `--itemize` shows them, in path order.
fn itemized(plan: &Plan) -> impl Iterator<Item = Itemized> + '_ {
    plan.changes.iter().map(|c| {
        let slash = if c.kind == crate::tree::Kind::Dir && c.path != b"." {
            "/"
        } else {
            ""
        };
        Itemized {
            change: c.op.symbol(),
            path: format!("{}{slash}", crate::escape::c_style(&c.path)),
        }
    })
}

/// One line a change, written as they are made: the list is not copied.
pub fn print_itemized(plan: &Plan) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    for c in itemized(plan) {
        let _ = writeln!(out, "{} {}", c.change, c.path);
    }
}

/// Show a sync's outcome, its warnings taken from `console`: the closing
/// summary line, or the JSON summary. The exit status (0).
pub fn finish(mut s: Summary, console: &Console, start: Instant, output: Output) -> Result<i32> {
    s.seconds = (start.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
    s.warnings = console.take_warnings();
    match output {
        Output::Json => json(&s)?,
        Output::Quiet => {}
        Output::Line => println!("{}", summary_line(&s)),
    }
    Ok(0)
}

fn summary_line(s: &Summary) -> String {
    let what = format!(
        "{} entries ({}): {} copied ({}), {} reused, {} deleted",
        s.entries,
        human_bytes(s.bytes),
        s.copied,
        human_bytes(s.copied_bytes),
        s.reused,
        s.deleted
    );
    let gen = s.generation.as_deref().unwrap_or("-");
    // `--semver`: which tag, on every line (the loop's line says what it followed).
    let chose: String = s
        .chosen
        .iter()
        .map(|c| {
            format!(
                "; {}:{} ({})",
                c.source,
                c.tag,
                crate::source::store::short(&c.digest)
            )
        })
        .collect();
    match (s.status, s.dry_run) {
        ("up to date", _) => format!(
            "packsync: {} up to date: {what}; generation {gen}{chose}; {:.2}s",
            s.dest, s.seconds
        ),
        (_, true) => format!(
            "packsync: dry run, {} not changed: would sync {what}{chose}; {:.2}s",
            s.dest, s.seconds
        ),
        _ => format!(
            "packsync: {} synced: {what}; generation {gen} is live{chose}; {:.2}s",
            s.dest, s.seconds
        ),
    }
}

pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    fn counts(entries: u64, bytes: u64) -> Counts {
        Counts {
            entries,
            total_entries: 1000,
            bytes,
            total_bytes: 100 << 20,
        }
    }

    #[test]
    fn no_eta_before_five_seconds_and_a_tenth_of_the_work() {
        let mut p = Pace::default();
        // Fast at first (cached files), 20% done in 2 s: no ETA yet.
        let c = counts(200, 20 << 20);
        p.sample(at(2.0), &c);
        assert_eq!(p.eta(at(2.0), &c), None);
        assert!(
            !p.line(at(2.0), &c).contains("ETA"),
            "{}",
            p.line(at(2.0), &c)
        );
        // Past 5 s but only 5% of a bigger job: still none.
        let few = Counts {
            total_bytes: 1 << 30,
            ..c
        };
        assert_eq!(p.eta(at(6.0), &few), None);
        // Past 5 s and 10%: an ETA.
        let c = counts(300, 30 << 20);
        p.sample(at(6.0), &c);
        assert!(p.eta(at(6.0), &c).is_some());
        assert!(
            p.line(at(6.0), &c).contains(", ETA "),
            "{}",
            p.line(at(6.0), &c)
        );
    }

    #[test]
    fn the_eta_follows_a_smoothed_rate_not_the_last_burst() {
        // 1 MiB/s for 20 s, then one second at 50 MiB/s (a cached stretch).
        let mut p = Pace::default();
        let mut bytes = 0u64;
        for s in 1..=20 {
            bytes += 1 << 20;
            p.sample(at(s as f64), &counts(s, bytes));
        }
        let steady = p.eta(at(20.0), &counts(20, bytes)).unwrap();
        assert!((75.0..=85.0).contains(&steady.as_secs_f64()), "{steady:?}");
        bytes += 50 << 20;
        p.sample(at(21.0), &counts(21, bytes));
        let after = p.eta(at(21.0), &counts(21, bytes)).unwrap();
        // The raw rate would say under a second; the smoothed one still minutes.
        assert!(after.as_secs() >= 2, "{after:?}");
        assert!(after < steady, "{after:?} {steady:?}");
        // Samples closer than half a second change nothing.
        let before = (p.bytes_per_s, p.entries_per_s);
        p.sample(at(21.2), &counts(500, bytes + (10 << 20)));
        assert_eq!((p.bytes_per_s, p.entries_per_s), before);
    }

    #[test]
    fn small_file_trees_show_entries_per_second_and_no_tiny_byte_rate() {
        let mut p = Pace::default();
        let c = Counts {
            entries: 4000,
            total_entries: 10_000,
            bytes: 300,
            total_bytes: 0,
        };
        p.sample(at(8.0), &c);
        let line = p.line(at(8.0), &c);
        assert_eq!(
            line,
            "4000/10000 entries, 300 B copied, 500 entries/s, ETA 12s"
        );
        // A first sync staged as it lists: no totals, so no ETA.
        let c = Counts {
            entries: 10,
            ..Counts::default()
        };
        let mut p = Pace::default();
        p.sample(at(20.0), &c);
        assert_eq!(p.line(at(20.0), &c), "10 entries, 0 B copied");
    }

    #[test]
    fn durations_read_short() {
        assert_eq!(short_duration(at(0.4)), "0s");
        assert_eq!(short_duration(at(44.6)), "45s");
        assert_eq!(short_duration(at(185.0)), "3m 05s");
        assert_eq!(short_duration(at(7800.0)), "2h 10m");
    }

    #[test]
    fn human_bytes_reads_well() {
        assert_eq!(human_bytes(12), "12 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
    }

    #[test]
    fn summary_lines_read_as_before() {
        let mut s = Summary {
            dest: "vol/packs".into(),
            status: "synced",
            generation: Some("0123abcd".into()),
            entries: 3,
            bytes: 1536,
            copied: 2,
            copied_bytes: 1024,
            reused: 1,
            seconds: 0.25,
            ..Default::default()
        };
        assert_eq!(
            summary_line(&s),
            "packsync: vol/packs synced: 3 entries (1.5 KiB): 2 copied (1.0 KiB), 1 reused, 0 deleted; generation 0123abcd is live; 0.25s"
        );
        s.status = "up to date";
        assert!(summary_line(&s).starts_with("packsync: vol/packs up to date: 3 entries"));
        s.status = "would sync";
        s.dry_run = true;
        assert!(
            summary_line(&s).starts_with("packsync: dry run, vol/packs not changed: would sync 3")
        );
    }

    #[test]
    fn the_console_keeps_every_warning_in_order() {
        let c = Console::new(Output::Json, Show::Lines);
        c.warn("one");
        c.warn("two");
        assert_eq!(c.take_warnings(), ["one", "two"]);
        assert!(c.take_warnings().is_empty());
    }
}
