//! `packsync wait DEST [--timeout DUR] [--label TEXT]`: block until DEST
//! resolves to a complete generation (its directory and manifest present),
//! optionally one labelled TEXT; exit 5 on timeout. For consumers' startup,
//! so that they never start on an empty volume. With fanout slots, every
//! slot's tree (or `--slot`'s, which need not exist yet).
//!
//! It polls (every 100 ms) rather than watching: inotify does not see
//! another client's rename on a network filesystem. Each poll opens DEST's
//! parent afresh, so a volume that appears late is still seen.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::config::Timeout;
use crate::error::{self, Failure};
use crate::layout;
use crate::sys;
use crate::volume::{Dest, Volume};

const POLL: Duration = Duration::from_millis(100);

enum Probe {
    /// Every tree is live: what to print.
    Ready(String),
    /// Not yet, and why (for the timeout message).
    NotYet(String),
}

pub fn run(
    dest: &Path,
    slot: Option<&str>,
    timeout: Option<&Timeout>,
    label: Option<&str>,
) -> Result<i32> {
    let deadline = timeout.map(|t| Instant::now() + t.limit);
    let shown = dest.display().to_string();
    loop {
        match probe(dest, &shown, slot, label)? {
            Probe::Ready(what) => {
                println!("packsync: {what}");
                return Ok(0);
            }
            Probe::NotYet(why) => {
                if let Some(sig) = sys::signals::pending() {
                    return Err(Failure::Interrupted(sig).into());
                }
                let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                if left == Some(Duration::ZERO) {
                    return Err(Failure::Timeout(format!(
                        "{why} after {}",
                        timeout.map_or("", |t| &t.text)
                    ))
                    .into());
                }
                std::thread::sleep(left.map_or(POLL, |l| l.min(POLL)));
            }
        }
    }
}

/// One look at DEST: ready when every tree it publishes (or `slot`'s) has a
/// complete live generation, carrying `label` when one is asked for.
fn probe(dest: &Path, shown: &str, slot: Option<&str>, label: Option<&str>) -> Result<Probe> {
    let not_yet = |why: String| Ok(Probe::NotYet(why));
    let base = match Volume::find(dest) {
        Ok(Some(base)) => base,
        Ok(None) => {
            return not_yet(format!(
                "{shown}: no live generation (its parent directory does not exist)"
            ))
        }
        Err(_) => {
            return not_yet(format!(
                "{shown}: no live generation (its parent directory cannot be opened)"
            ))
        }
    };
    if layout::current(&base)?.is_none() {
        // Nothing a sync could ever replace: say so now rather than at the timeout.
        match base.read_dest()? {
            Dest::File => {
                return Err(error::refused(format!(
                    "{shown}: not a packsync destination (it is not a directory)"
                )))
            }
            Dest::Foreign(t) => {
                return Err(error::refused(format!(
                    "{shown}: not a packsync destination (a symlink to {t})"
                )))
            }
            _ => return not_yet(format!("{shown}: no live generation")),
        }
    }
    let vols = match layout::find(dest, slot) {
        Ok(v) => v,
        // A slot not published yet.
        Err(e) if crate::error::exit_code(&e) == 3 => return not_yet(format!("{e:#}")),
        Err(e) => return Err(e),
    };
    let mut ready = Vec::new();
    for vol in &vols {
        let name = match &vol.slot {
            Some(s) => format!("{shown} (slot {s})"),
            None => shown.to_string(),
        };
        let Some(state) = vol.state(false)? else {
            return not_yet(format!("{name}: no live generation (no state directory)"));
        };
        let Some(live) = layout::open_live(vol, &state)? else {
            return not_yet(format!("{name}: no live generation"));
        };
        // The header is enough, and cheap to read every poll.
        let Some((manifest, _, _)) = super::status::read_header(&state, &live.gen) else {
            return not_yet(format!("{name}: generation {} has no manifest", live.gen));
        };
        if let Some(want) = label {
            if manifest.label.as_deref() != Some(want) {
                return not_yet(format!(
                    "{name}: no live generation labelled {want} (live: {}, {})",
                    live.gen,
                    match &manifest.label {
                        Some(l) => format!("label {l}"),
                        None => "no label".into(),
                    }
                ));
            }
        }
        ready.push(format!(
            "{name}: generation {}{} is live",
            live.gen,
            manifest
                .label
                .map(|l| format!(" (label {l})"))
                .unwrap_or_default()
        ));
    }
    Ok(Probe::Ready(ready.join("; ")))
}
