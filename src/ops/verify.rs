//! `packsync verify DEST [--json]`: re-hash the live generation (in
//! parallel) against its manifest. Exit 0 when identical; exit 4 after
//! listing each difference with its path. With fanout slots, every slot's
//! live generation (or `--slot`'s).

use std::path::Path;

use anyhow::Result;

use crate::error::Failure;
use crate::report;
use crate::verify::{self, Difference};

use super::Target;

/// One tree's report; its fields are documented in the README ("status and
/// verify JSON").
#[derive(serde::Serialize)]
struct Report {
    dest: String,
    slot: Option<String>,
    generation: String,
    label: Option<String>,
    ok: bool,
    entries: u64,
    bytes: u64,
    differences: Vec<Difference>,
    /// The differences are recorded in the state directory, for the next
    /// sync to copy those paths afresh (`false`: nothing to record, or the
    /// record could not be written, a read-only mount say).
    recorded: bool,
}

/// With several fanout slots: one object holding each slot's report.
#[derive(serde::Serialize)]
struct Slots<'a> {
    dest: &'a str,
    ok: bool,
    slots: &'a [Report],
}

pub fn run(dest: &Path, slot: Option<&str>, json: bool) -> Result<i32> {
    let targets = super::open(dest, slot)?;
    let reports: Vec<Report> = targets.iter().map(check).collect::<Result<_>>()?;
    let several = reports.len() > 1;
    if json {
        match reports.as_slice() {
            [one] => report::json(one)?,
            _ => report::json(&Slots {
                dest: &targets[0].vol.display,
                ok: reports.iter().all(|r| r.ok),
                slots: &reports,
            })?,
        }
    } else {
        for (r, t) in reports.iter().zip(&targets) {
            if r.ok {
                println!(
                    "packsync: {}: generation {} matches its manifest: {} entries ({})",
                    t.shown(),
                    r.generation,
                    r.entries,
                    report::human_bytes(r.bytes)
                );
            }
            for d in &r.differences {
                match (several, &r.slot) {
                    (true, Some(s)) => println!("slot {s}: {d}"),
                    (true, None) => println!("(no slot): {d}"),
                    _ => println!("{d}"),
                }
            }
        }
    }
    let drifted: Vec<String> = reports
        .iter()
        .zip(&targets)
        .filter(|(r, _)| !r.ok)
        .map(|(r, t)| {
            format!(
                "{}: {} difference(s) between generation {} and its manifest",
                t.shown(),
                r.differences.len(),
                r.generation
            )
        })
        .collect();
    if drifted.is_empty() {
        return Ok(0);
    }
    let repair = if reports.iter().all(|r| r.ok || r.recorded) {
        "recorded: the next `packsync sync` copies those paths afresh"
    } else {
        "`packsync sync --checksum` repairs the tree"
    };
    Err(Failure::Drift(format!(
        "{}; {repair}, `packsync rollback` publishes a retained generation",
        drifted.join("; ")
    ))
    .into())
}

fn check(t: &Target) -> Result<Report> {
    let live = t.live()?;
    let checked = super::check_generation(&t.state, &live.gen, &live.root, &t.vol.display, &|e| e)?;
    let verify::Checked {
        header: manifest,
        entries,
        bytes,
        differences,
    } = checked;
    // Kept for the next sync, which would otherwise trust the manifest:
    // a file edited with its size and mtime put back passes every other check.
    let recorded = if differences.is_empty() {
        crate::damage::clear(&t.state, &live.gen);
        false
    } else {
        let paths: Vec<&[u8]> = differences.iter().map(|d| d.path.as_slice()).collect();
        match crate::damage::record(&t.state, &live.gen, &paths) {
            Ok(()) => true,
            Err(e) => {
                eprintln!("packsync: warning: {e:#}");
                false
            }
        }
    };
    Ok(Report {
        recorded,
        dest: t.vol.display.clone(),
        slot: t.vol.slot.clone(),
        ok: differences.is_empty(),
        entries,
        bytes,
        label: manifest.label,
        generation: live.gen,
        differences,
    })
}
