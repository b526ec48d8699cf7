//! `sync --every DUR`: the sync as a loop that keeps DEST current for as
//! long as a pod runs. Each round is the one-shot sync's pipeline, handed
//! in by the caller (`app::round`: this file does not name it) and run as
//! one of the loop's (`Pass`); this file only decides when the next one starts, what is
//! shown, when to give up, and what `/healthz`, `/readyz` and `/metrics`
//! say (`metrics`, served by `http`).
//!
//! The next round starts DUR after the last one began, at once on SIGHUP,
//! and after a failure sooner, with a backoff doubling up to DUR. A round
//! is shown (one line, or one JSON object) when it published, failed, or
//! is the first; an idle round shows nothing; the first good round after
//! failures says so, so the last line is never a stale error.
//! SIGINT/SIGTERM, mid-round or between rounds, end the loop once the
//! round's staging is removed (exit 130/143), with an info line: being
//! stopped is how a sidecar ends, not a failure. Everything a round opens is closed when it ends and the
//! thread pool is rayon's global one, so nothing grows with the rounds.

mod http;
mod metrics;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::clock;
use crate::config::SyncConfig;
use crate::error::Failure;
use crate::manifest::Manifest;
use crate::ops;
use crate::report::{self, Output, Round};
use crate::sys::{self, signals::Wake};
use metrics::{Health, Outcome};

/// The first wait after a failure (DUR if shorter); it doubles up to DUR.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);

/// How a round differs when it is one of `--every`'s.
#[derive(Clone, Copy, Debug)]
pub struct Pass {
    /// Keep warnings for the round's line instead of showing them as they
    /// come (an idle round of the loop shows nothing).
    pub defer_warnings: bool,
    /// An up-to-date round runs `--exec-after` again where it did not
    /// succeed on the live generation (a one-shot sync, the loop's first
    /// round); later rounds of the loop run it only on what they publish.
    pub retry_hook: bool,
}

impl Pass {
    pub const ONCE: Pass = Pass {
        defer_warnings: false,
        retry_hook: true,
    };
}

/// Run `round` every `--every` until a signal, or `--max-failures`, ends the loop.
pub fn run(cfg: &SyncConfig, round: &dyn Fn(Pass) -> Result<Round>) -> Result<i32> {
    let every = cfg.every.expect("the loop runs with --every");
    sys::signals::install_loop().context("cannot install the signal handlers of --every")?;
    let health = Arc::new(Health::new(cfg.unhealthy_after));
    if let Some(addr) = cfg.http_bind {
        http::serve(addr, health.clone())?;
    }
    let output = Output::of(cfg.json, cfg.quiet);
    let mut failures = 0u32;
    let mut first = true;
    loop {
        let began = Instant::now();
        let pass = Pass {
            defer_warnings: true,
            retry_hook: first,
        };
        let result = round(pass);
        let seconds = began.elapsed().as_secs_f64();
        let failure = match result {
            Ok(round) => finish(round, first, seconds, output, &health).err(),
            Err(e) => {
                health.record(Outcome::Error, seconds, 0, None, clock::now_f64());
                Some(e)
            }
        };
        // The round's memory is freed; without this its scattered free
        // chunks would keep the RSS creeping up over thousands of rounds.
        sys::release_free_memory();
        if let Some((rss, fds)) = sys::own_resources() {
            health.record_resources(rss, fds);
        }
        if let Some(sig) = sys::signals::pending() {
            // Whatever the round made of it, its staging is gone by now; a
            // round it cut short is not a failure to show.
            return Ok(stopped(sig, cfg, &health));
        }
        first = false;
        let wait = match failure {
            None => {
                if failures > 0 {
                    report::round_recovered(failures, health.live().as_deref(), output);
                }
                failures = 0;
                every.saturating_sub(began.elapsed())
            }
            Some(e) => {
                failures += 1;
                if health.live().is_none() {
                    note_live(cfg, &health);
                }
                let wait = backoff(failures, every);
                let last = cfg.max_failures.is_some_and(|m| failures >= m);
                report::round_failed(&e, failures, (!last).then_some(wait), output);
                if last {
                    anyhow::bail!(
                        "giving up after {failures} failed rounds in a row (--max-failures)"
                    );
                }
                wait
            }
        };
        match sys::signals::pause(wait) {
            Wake::Elapsed | Wake::Hangup => {}
            Wake::Stop(sig) => return Ok(stopped(sig, cfg, &health)),
        }
    }
}

/// The loop ends on SIGINT/SIGTERM: one info line, and the exit status
/// 128 + the signal. With `--json` and nothing shown yet, the JSON object
/// of an interrupted run too, as a one-shot sync has it.
fn stopped(sig: i32, cfg: &SyncConfig, health: &Health) -> i32 {
    report::loop_stopped(sig, health.live().as_deref());
    let failure = Failure::Interrupted(sig);
    if cfg.json {
        report::json_error(&failure.to_string(), failure.exit_code());
    }
    failure.exit_code()
}

/// Record a round that ran to its end and show it if it did something (or
/// is the first); the hook's failure (or stdout's) makes it a failed round.
fn finish(round: Round, first: bool, seconds: f64, output: Output, health: &Health) -> Result<()> {
    let s = &round.summary;
    let published = s.status == "synced";
    let outcome = match (round.hook_failure.is_some(), published) {
        (true, _) => Outcome::Error,
        (false, true) => Outcome::Published,
        (false, false) => Outcome::UpToDate,
    };
    let live = s
        .generation
        .clone()
        .map(|g| (g, s.label.clone().unwrap_or_default()));
    let copied = if published { s.copied_bytes } else { 0 };
    health.record(outcome, seconds, copied, live, clock::now_f64());
    health.record_transfer(s.fetched_bytes, s.reused_bytes);
    health.record_chosen(
        s.chosen
            .iter()
            .map(|c| (c.source.clone(), c.tag.clone(), c.digest.clone()))
            .collect(),
    );
    if published || first || round.hook_failure.is_some() {
        round.report_deferred(output)?;
    }
    Ok(())
}

/// After a failure, before any round succeeded: the generation DEST
/// already shows (an earlier pod's), so that `/healthz` tells the truth.
fn note_live(cfg: &SyncConfig, health: &Health) {
    let Ok(target) = ops::open_one(&cfg.dest, cfg.slot.as_deref()) else {
        return;
    };
    let Ok(live) = target.live() else {
        return;
    };
    let label = target
        .state
        .manifest_reader(&live.gen)
        .ok()
        .and_then(|(mut r, _)| Manifest::read_header(&mut r).ok())
        .and_then(|m| m.label)
        .unwrap_or_default();
    health.record_live(live.gen, label);
}

/// The wait after the `failures`-th failure in a row: 1s, 2s, 4s... up to `every`.
fn backoff(failures: u32, every: Duration) -> Duration {
    let doubled = FIRST_BACKOFF.saturating_mul(1 << failures.saturating_sub(1).min(20));
    doubled.min(every)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_period() {
        let every = Duration::from_secs(30);
        let waits: Vec<u64> = (1..=8).map(|n| backoff(n, every).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(
            backoff(1, Duration::from_millis(200)),
            Duration::from_millis(200)
        );
        assert_eq!(backoff(u32::MAX, every), every);
    }
}
