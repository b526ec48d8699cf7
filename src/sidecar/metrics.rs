//! What the loop of `sync --every` tells the world: the counts, times and
//! live generation behind `/metrics`, and the two states behind `/healthz`
//! and `/readyz`. The loop records each round here; the HTTP thread reads.
//! Plain data behind one mutex, fixed in size: nothing grows with rounds.
//!
//! One process serves one DEST (and at most one `--slot` of it), so no
//! series carries a `dest` label: the scrape target already names it.

use std::fmt::Write as _;
use std::sync::Mutex;

use crate::sys::ProcessFigures;

/// How a round ended, as `packsync_syncs_total{result}` counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Published,
    UpToDate,
    Error,
}

/// Upper bounds (seconds) of `packsync_sync_duration_seconds`' buckets:
/// from an idle round of a small tree (a few milliseconds) to a large
/// first copy.
const BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0, 60.0, 300.0,
];

/// The loop's state, shared with the HTTP thread.
pub struct Health {
    /// `--unhealthy-after`: this many failures in a row is unhealthy.
    unhealthy_after: u32,
    stats: Mutex<Stats>,
}

#[derive(Default)]
struct Stats {
    published: u64,
    up_to_date: u64,
    errors: u64,
    /// Per bucket of `BUCKETS` (not cumulative), then the sum and count.
    buckets: [u64; BUCKETS.len()],
    seconds: f64,
    rounds: u64,
    last_success: Option<f64>,
    copied_bytes: u64,
    /// Bytes fetched from remote sources, and bytes of content taken from
    /// the live generation instead (a zstd:chunked layer's files).
    fetched_bytes: u64,
    reused_bytes: u64,
    failures_in_a_row: u32,
    /// The live generation and its label, as last seen.
    live: Option<(String, String)>,
    /// A round of this process succeeded: its sources' tree is live.
    ready: bool,
    /// Resident bytes and open descriptors between rounds, as last read.
    resources: Option<(u64, u64)>,
    /// `--semver`: (source, tag, digest) of the last round that chose,
    /// one per image source (as many as SOURCE arguments at most).
    chosen: Vec<(String, String, String)>,
}

impl Health {
    pub fn new(unhealthy_after: u32) -> Health {
        Health {
            unhealthy_after,
            stats: Mutex::new(Stats::default()),
        }
    }

    /// One round: how it ended, how long it took, what it copied, and the
    /// live generation (name, label) it left, if known.
    pub fn record(
        &self,
        outcome: Outcome,
        seconds: f64,
        copied_bytes: u64,
        live: Option<(String, String)>,
        now: f64,
    ) {
        let mut s = self.stats.lock().unwrap();
        match outcome {
            Outcome::Published => s.published += 1,
            Outcome::UpToDate => s.up_to_date += 1,
            Outcome::Error => s.errors += 1,
        }
        let bucket = BUCKETS.iter().position(|b| seconds <= *b);
        if let Some(i) = bucket {
            s.buckets[i] += 1;
        }
        s.seconds += seconds;
        s.rounds += 1;
        s.copied_bytes += copied_bytes;
        if outcome == Outcome::Error {
            s.failures_in_a_row = s.failures_in_a_row.saturating_add(1);
        } else {
            s.failures_in_a_row = 0;
            s.last_success = Some(now);
            s.ready = true;
        }
        if live.is_some() {
            s.live = live;
        }
    }

    /// What a round fetched, and what it took from the live generation
    /// instead of fetching it.
    pub fn record_transfer(&self, fetched: u64, reused: u64) {
        let mut s = self.stats.lock().unwrap();
        s.fetched_bytes += fetched;
        s.reused_bytes += reused;
    }

    /// The process's resident bytes and open descriptors, read between
    /// rounds (after a round's memory is freed, before the next begins):
    /// what `/metrics` shows of them never catches a round midway.
    pub fn record_resources(&self, resident_bytes: u64, open_fds: u64) {
        self.stats.lock().unwrap().resources = Some((resident_bytes, open_fds));
    }

    /// `--semver`: what the round chose, source by source (a round that
    /// failed before choosing leaves the last choice shown).
    pub fn record_chosen(&self, chosen: Vec<(String, String, String)>) {
        if !chosen.is_empty() {
            self.stats.lock().unwrap().chosen = chosen;
        }
    }

    /// The live generation (name, label) found on the volume, outside a round.
    pub fn record_live(&self, gen: String, label: String) {
        self.stats.lock().unwrap().live = Some((gen, label));
    }

    /// The live generation's name, if known (else the loop looks on the volume).
    pub fn live(&self) -> Option<String> {
        self.stats
            .lock()
            .unwrap()
            .live
            .as_ref()
            .map(|l| l.0.clone())
    }

    /// `/healthz`: DEST holds a live generation, and fewer than
    /// `--unhealthy-after` rounds in a row failed.
    pub fn healthy(&self) -> bool {
        let s = self.stats.lock().unwrap();
        s.live.is_some() && s.failures_in_a_row < self.unhealthy_after
    }

    /// `/readyz`: a generation from this process's sources is live.
    pub fn ready(&self) -> bool {
        self.stats.lock().unwrap().ready
    }

    /// `/metrics`, in the Prometheus text exposition format (0.0.4), with
    /// the process's figures as a client library's process collector names
    /// them.
    pub fn render(&self, process: Option<&ProcessFigures>) -> String {
        let s = self.stats.lock().unwrap();
        let mut out = String::with_capacity(4096);
        out.push_str("# HELP packsync_syncs_total Rounds of the sync loop, by how they ended.\n");
        out.push_str("# TYPE packsync_syncs_total counter\n");
        for (result, n) in [
            ("published", s.published),
            ("up_to_date", s.up_to_date),
            ("error", s.errors),
        ] {
            let _ = writeln!(out, "packsync_syncs_total{{result=\"{result}\"}} {n}");
        }
        out.push_str("# HELP packsync_sync_duration_seconds How long a round took.\n");
        out.push_str("# TYPE packsync_sync_duration_seconds histogram\n");
        let mut cumulative = 0;
        for (bound, n) in BUCKETS.iter().zip(s.buckets) {
            cumulative += n;
            let _ = writeln!(
                out,
                "packsync_sync_duration_seconds_bucket{{le=\"{bound}\"}} {cumulative}"
            );
        }
        let _ = writeln!(
            out,
            "packsync_sync_duration_seconds_bucket{{le=\"+Inf\"}} {}",
            s.rounds
        );
        let _ = writeln!(out, "packsync_sync_duration_seconds_sum {}", s.seconds);
        let _ = writeln!(out, "packsync_sync_duration_seconds_count {}", s.rounds);
        out.push_str(
            "# HELP packsync_last_success_timestamp_seconds When a round last ended published or up to date.\n",
        );
        out.push_str("# TYPE packsync_last_success_timestamp_seconds gauge\n");
        let _ = writeln!(
            out,
            "packsync_last_success_timestamp_seconds {}",
            s.last_success.unwrap_or(0.0)
        );
        out.push_str(
            "# HELP packsync_live_generation_info The generation DEST publishes, and its label.\n",
        );
        out.push_str("# TYPE packsync_live_generation_info gauge\n");
        if let Some((gen, label)) = &s.live {
            let _ = writeln!(
                out,
                "packsync_live_generation_info{{generation=\"{}\",label=\"{}\"}} 1",
                label_value(gen),
                label_value(label)
            );
        }
        if !s.chosen.is_empty() {
            out.push_str(
                "# HELP packsync_source_info The tag --semver chose for each image source, and its manifest digest.\n",
            );
            out.push_str("# TYPE packsync_source_info gauge\n");
            for (source, tag, digest) in &s.chosen {
                let _ = writeln!(
                    out,
                    "packsync_source_info{{source=\"{}\",tag=\"{}\",digest=\"{}\"}} 1",
                    label_value(source),
                    label_value(tag),
                    label_value(digest)
                );
            }
        }
        out.push_str("# HELP packsync_copied_bytes_total Bytes copied into new generations.\n");
        out.push_str("# TYPE packsync_copied_bytes_total counter\n");
        let _ = writeln!(out, "packsync_copied_bytes_total {}", s.copied_bytes);
        out.push_str(
            "# HELP packsync_fetched_bytes_total Bytes fetched from remote sources (whole layers, ranges of them, bundles).\n",
        );
        out.push_str("# TYPE packsync_fetched_bytes_total counter\n");
        let _ = writeln!(out, "packsync_fetched_bytes_total {}", s.fetched_bytes);
        out.push_str(
            "# HELP packsync_reused_bytes_total Bytes of file content taken from the live generation instead of fetched.\n",
        );
        out.push_str("# TYPE packsync_reused_bytes_total counter\n");
        let _ = writeln!(out, "packsync_reused_bytes_total {}", s.reused_bytes);
        out.push_str(
            "# HELP packsync_consecutive_failures Rounds in a row that failed, up to the last one (0 once a round succeeds).\n",
        );
        out.push_str("# TYPE packsync_consecutive_failures gauge\n");
        let _ = writeln!(out, "packsync_consecutive_failures {}", s.failures_in_a_row);
        out.push_str("# HELP packsync_build_info The packsync version serving these metrics.\n");
        out.push_str("# TYPE packsync_build_info gauge\n");
        let _ = writeln!(
            out,
            "packsync_build_info{{version=\"{}\"}} 1",
            label_value(env!("CARGO_PKG_VERSION"))
        );
        if let Some((rss, fds)) = s.resources {
            out.push_str(
                "# HELP packsync_idle_resident_memory_bytes Resident memory between rounds, after the last one.\n",
            );
            out.push_str("# TYPE packsync_idle_resident_memory_bytes gauge\n");
            let _ = writeln!(out, "packsync_idle_resident_memory_bytes {rss}");
            out.push_str(
                "# HELP packsync_idle_open_fds Open file descriptors between rounds, after the last one.\n",
            );
            out.push_str("# TYPE packsync_idle_open_fds gauge\n");
            let _ = writeln!(out, "packsync_idle_open_fds {fds}");
        }
        drop(s);
        if let Some(p) = process {
            process_figures(&mut out, p);
        }
        out
    }
}

/// The `process_*` series of the Prometheus client libraries.
fn process_figures(out: &mut String, p: &ProcessFigures) {
    let mut series = |name: &str, kind: &str, help: &str, value: &dyn std::fmt::Display| {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        let _ = writeln!(out, "{name} {value}");
    };
    series(
        "process_cpu_seconds_total",
        "counter",
        "Total user and system CPU time spent in seconds.",
        &p.cpu_seconds,
    );
    series(
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory size in bytes.",
        &p.resident_bytes,
    );
    series(
        "process_virtual_memory_bytes",
        "gauge",
        "Virtual memory size in bytes.",
        &p.virtual_bytes,
    );
    series(
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since unix epoch in seconds.",
        &p.start_time_seconds,
    );
    series(
        "process_open_fds",
        "gauge",
        "Number of open file descriptors.",
        &p.open_fds,
    );
    if let Some(max) = p.max_fds {
        series(
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors.",
            &max,
        );
    }
}

/// A label value as the text format escapes it: `\`, `"` and newlines.
fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_follows_the_rounds() {
        let h = Health::new(3);
        assert!(!h.healthy() && !h.ready(), "nothing live yet");
        h.record(Outcome::Error, 0.1, 0, None, 1.0);
        assert!(!h.healthy() && !h.ready());
        h.record(
            Outcome::Published,
            0.1,
            10,
            Some(("g1".into(), "".into())),
            2.0,
        );
        assert!(h.healthy() && h.ready());
        for _ in 0..2 {
            h.record(Outcome::Error, 0.1, 0, None, 3.0);
        }
        assert!(
            h.healthy(),
            "two failures are fewer than --unhealthy-after 3"
        );
        h.record(Outcome::Error, 0.1, 0, None, 4.0);
        assert!(!h.healthy() && h.ready(), "the tree stays live");
        assert!(h
            .render(None)
            .contains("\npacksync_consecutive_failures 3\n"));
        h.record(Outcome::Error, 0.1, 0, None, 4.5);
        assert!(!h.healthy());
        h.record(Outcome::UpToDate, 0.1, 0, None, 5.0);
        assert!(h.healthy());
        assert!(h
            .render(None)
            .contains("\npacksync_consecutive_failures 0\n"));
    }

    #[test]
    fn the_histogram_is_cumulative_and_labels_are_escaped() {
        let h = Health::new(3);
        h.record(
            Outcome::Published,
            0.003,
            5,
            Some(("g".into(), "a\"b\\".into())),
            7.5,
        );
        h.record(Outcome::UpToDate, 0.2, 0, None, 8.0);
        h.record(Outcome::Error, 1000.0, 0, None, 9.0);
        let process = ProcessFigures {
            cpu_seconds: 1.5,
            resident_bytes: 4096,
            virtual_bytes: 8192,
            start_time_seconds: 1700000000.25,
            open_fds: 7,
            max_fds: Some(1024),
        };
        h.record_transfer(1000, 99000);
        let text = h.render(Some(&process));
        let version = format!(
            "packsync_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        for line in [
            "packsync_syncs_total{result=\"published\"} 1",
            "packsync_syncs_total{result=\"error\"} 1",
            "packsync_sync_duration_seconds_bucket{le=\"0.001\"} 0",
            "packsync_sync_duration_seconds_bucket{le=\"0.0025\"} 0",
            "packsync_sync_duration_seconds_bucket{le=\"0.005\"} 1",
            "packsync_sync_duration_seconds_bucket{le=\"0.25\"} 2",
            "packsync_sync_duration_seconds_bucket{le=\"300\"} 2",
            "packsync_sync_duration_seconds_bucket{le=\"+Inf\"} 3",
            "packsync_sync_duration_seconds_count 3",
            "packsync_last_success_timestamp_seconds 8",
            "packsync_live_generation_info{generation=\"g\",label=\"a\\\"b\\\\\"} 1",
            "packsync_copied_bytes_total 5",
            "packsync_fetched_bytes_total 1000",
            "packsync_reused_bytes_total 99000",
            "packsync_consecutive_failures 1",
            &version,
            "process_cpu_seconds_total 1.5",
            "process_resident_memory_bytes 4096",
            "process_virtual_memory_bytes 8192",
            "process_start_time_seconds 1700000000.25",
            "process_open_fds 7",
            "process_max_fds 1024",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
    }
}
