//! Reporting: the progress bar on a terminal, a line now and then in a log,
//! the closing summary, the JSON summary, and how a failed command is shown.
//! The only file that knows indicatif; stages talk to a `Reporter` and stay
//! silent in tests.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

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

/// Reports nothing but warnings (to stderr unless quiet).
pub struct Quiet {
    pub show_warnings: bool,
}

impl Reporter for Quiet {
    fn begin(&self, _: u64, _: u64) {}
    fn advance(&self, _: u64) {}
    fn finish(&self) {}
    fn warn(&self, msg: &str) {
        if self.show_warnings {
            eprintln!("packsync: warning: {msg}");
        }
    }
}

/// A bar on a terminal; in a log, a line every 10 seconds of long work.
pub struct Progress {
    bar: Option<indicatif::ProgressBar>,
    total: AtomicU64,
    done: AtomicU64,
    bytes: AtomicU64,
    total_bytes: AtomicU64,
    last_line: Mutex<Instant>,
    start: Instant,
}

impl Progress {
    pub fn new(terminal: bool) -> Progress {
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
            last_line: Mutex::new(Instant::now()),
            start: Instant::now(),
        }
    }

    /// `copied/total bytes, rate`, for the bar and the log lines.
    fn bytes_line(&self, copied: u64) -> String {
        let secs = self.start.elapsed().as_secs_f64().max(0.001);
        format!(
            "{}/{} copied, {}/s",
            human_bytes(copied),
            human_bytes(self.total_bytes.load(Ordering::Relaxed)),
            human_bytes((copied as f64 / secs) as u64)
        )
    }
}

impl Reporter for Progress {
    fn begin(&self, entries: u64, bytes: u64) {
        self.total.store(entries, Ordering::Relaxed);
        self.total_bytes.store(bytes, Ordering::Relaxed);
        if let Some(b) = &self.bar {
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
            eprintln!(
                "packsync: {done}/{} entries, {}, {:.0}s",
                self.total.load(Ordering::Relaxed),
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
}
