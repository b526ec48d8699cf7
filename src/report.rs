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
    /// One more entry done, with its bytes.
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
    /// `bytes` more downloaded (a layer, a bundle), before staging begins.
    fn fetched(&self, bytes: u64) {
        let _ = bytes;
    }
}

/// The warning for a skipped entry: `skipping FIFO src/a/fifo`.
fn skip_line(label: &str, path: &[u8], what: &str) -> String {
    format!("skipping {what} {}", crate::scan::display(label, path))
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
    /// Show each warning as it comes (else only keep it: `keeping`).
    echo: bool,
}

impl Console {
    /// `bar`: a progress bar rather than a line now and then (a terminal).
    pub fn new(output: Output, bar: bool) -> Console {
        Console {
            progress: (output == Output::Line).then(|| Progress::new(bar)),
            warnings: Mutex::new(Vec::new()),
            echo: true,
        }
    }

    /// A console that keeps warnings without showing them, for a round of
    /// `sync --every`: only a round that did something or failed is shown
    /// (`show_kept`), never an idle one.
    pub fn keeping(output: Output, bar: bool) -> Console {
        Console {
            echo: false,
            ..Console::new(output, bar)
        }
    }

    /// Show the warnings kept so far on stderr (they stay kept for `finish`).
    pub fn show_kept(&self) {
        for w in self.warnings.lock().unwrap().iter() {
            eprintln!("packsync: warning: {w}");
        }
    }

    /// The warnings so far, in the order they were shown.
    fn take_warnings(&self) -> Vec<String> {
        std::mem::take(&mut *self.warnings.lock().unwrap())
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

    fn fetched(&self, bytes: u64) {
        if let Some(p) = &self.progress {
            p.fetched(bytes);
        }
    }

    fn warn(&self, msg: &str) {
        match &self.progress {
            _ if !self.echo => {}
            Some(p) => p.warn(msg),
            None => eprintln!("packsync: warning: {msg}"),
        }
        self.warnings.lock().unwrap().push(msg.to_string());
    }
}

/// A bar on a terminal; in a log, a line every 10 seconds of long work.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    total: AtomicU64,
    done: AtomicU64,
    bytes: AtomicU64,
    total_bytes: AtomicU64,
    /// Bytes downloaded so far (remote sources), and when the bar last said so.
    fetched: AtomicU64,
    fetched_shown: AtomicU64,
    last_line: Mutex<Instant>,
    start: Instant,
}

impl Progress {
    fn new(terminal: bool) -> Progress {
        let bar = terminal.then(|| {
            let b = indicatif::ProgressBar::with_draw_target(
                Some(0),
                indicatif::ProgressDrawTarget::stderr_with_hz(10),
            );
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} {pos}/{len} entries  {msg}  ETA {eta}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            b
        });
        Progress {
            bar,
            total: AtomicU64::new(0),
            done: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            total_bytes: AtomicU64::new(0),
            fetched: AtomicU64::new(0),
            fetched_shown: AtomicU64::new(0),
            last_line: Mutex::new(Instant::now()),
            start: Instant::now(),
        }
    }

    /// `copied/total bytes, rate`, for the bar and the log lines.
    /// Without a total (a sync staged as it lists: `begin(0, 0)`), only
    /// what was copied.
    fn bytes_line(&self, copied: u64) -> String {
        let secs = self.start.elapsed().as_secs_f64().max(0.001);
        let rate = human_bytes((copied as f64 / secs) as u64);
        match self.total_bytes.load(Ordering::Relaxed) {
            0 => format!("{} copied, {rate}/s", human_bytes(copied)),
            total => format!(
                "{}/{} copied, {rate}/s",
                human_bytes(copied),
                human_bytes(total)
            ),
        }
    }
}

impl Progress {
    fn begin(&self, entries: u64, bytes: u64) {
        self.total.store(entries, Ordering::Relaxed);
        self.total_bytes.store(bytes, Ordering::Relaxed);
        if let Some(b) = &self.bar {
            if entries == 0 {
                // Entries are counted as they are staged: no total, no ETA.
                b.set_style(
                    indicatif::ProgressStyle::with_template("{spinner} {pos} entries  {msg}")
                        .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
                );
            }
            b.set_length(entries);
            b.set_message(self.bytes_line(0));
        }
    }

    fn advance(&self, bytes: u64) {
        let done = self.done.fetch_add(1, Ordering::Relaxed) + 1;
        let b = self.bytes.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if let Some(bar) = &self.bar {
            bar.set_position(done);
            // Formatting is the costly part: refresh the text now and then.
            if done.is_multiple_of(256) || bytes > 1 << 20 {
                bar.set_message(self.bytes_line(b));
            }
            return;
        }
        let mut last = self.last_line.lock().unwrap();
        if last.elapsed() >= Duration::from_secs(10) {
            *last = Instant::now();
            let of = match self.total.load(Ordering::Relaxed) {
                0 => String::new(),
                total => format!("/{total}"),
            };
            eprintln!(
                "packsync: {done}{of} entries, {}, {:.0}s",
                self.bytes_line(b),
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
    /// counts them (every MiB), a log a line every 10 seconds.
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
        let mut last = self.last_line.lock().unwrap();
        if last.elapsed() >= Duration::from_secs(10) {
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
    pub exec_after: Option<crate::ops::exec::After>,
    pub seconds: f64,
    pub dry_run: bool,
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
            path: format!("{}{slash}", escape(&c.path)),
        }
    })
}

/// One line a change, written as they are made: the list is not copied.
fn print_itemized(plan: &Plan) {
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
    match (s.status, s.dry_run) {
        ("up to date", _) => format!(
            "packsync: {} up to date: {what}; generation {gen}; {:.2}s",
            s.dest, s.seconds
        ),
        (_, true) => format!(
            "packsync: dry run, {} not changed: would sync {what}; {:.2}s",
            s.dest, s.seconds
        ),
        _ => format!(
            "packsync: {} synced: {what}; generation {gen} is live; {:.2}s",
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

/// A path for a line-oriented log: printable UTF-8 as is; control bytes,
/// backslashes and invalid UTF-8 as C-style escapes (`\n`, `\t`, `\\`, `\xff`).
pub fn escape(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '\r' => out.push_str("\\r"),
                c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_keeps_one_path_on_one_line() {
        assert_eq!(escape(b"a b/\xff\n\\c\td"), "a b/\\xff\\n\\\\c\\td");
        assert_eq!(escape("é".as_bytes()), "é");
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
        let c = Console::new(Output::Json, false);
        c.warn("one");
        c.warn("two");
        assert_eq!(c.take_warnings(), ["one", "two"]);
        assert!(c.take_warnings().is_empty());
    }
}
