//! `packsync rollback DEST [--to GEN]`: publish a retained generation again,
//! through the same commit step as a sync (a fresh link renamed over DEST).
//! The generation is re-hashed against its manifest first; one that differs
//! is refused. Default: the newest generation made before the live one.

use std::path::Path;

use anyhow::{Context, Result};

use crate::commit::{self, Swap};
use crate::error;
use crate::retire;
use crate::staging::Stage;
use crate::verify;

use super::Target;

pub fn run(dest: &Path, slot: Option<&str>, to: Option<&str>) -> Result<i32> {
    let t = super::open_one(dest, slot)?;
    let live = crate::layout::live_generation(&t.vol)?;
    let gen = match to {
        Some(spec) => find(&t, spec)?,
        None => previous(&t, live.as_deref())?,
    };
    if live.as_deref() == Some(gen.as_str()) {
        println!("packsync: {}: generation {gen} is already live", t.shown());
        return Ok(0);
    }
    // Leased from here until it is live: no collector removes it meanwhile.
    let lease = super::exec::Lease::take(&t.state, &gen)?;
    let fd = t.state.open_gen(&gen)?;
    let label = format!("{}/gen/{gen}", t.state.path.display());
    let refused = |e: anyhow::Error| {
        error::refused(format!(
            "{}: generation {gen} cannot be rolled back to: {e:#}",
            t.shown()
        ))
    };
    let checked = super::check_generation(&t.state, &gen, &fd, &label, &refused)?;
    let (diffs, gen_label) = (checked.differences, checked.header.label);
    drop(fd);
    if !diffs.is_empty() {
        return Err(error::refused(format!(
            "{}: generation {gen} differs from its manifest ({}); not rolled back",
            t.shown(),
            verify::summarize(&diffs, 3)
        )));
    }
    let stage = Stage::new(&t.state)?;
    let published = commit::publish(
        &t.vol,
        &stage,
        &gen,
        &commit::Options {
            fsync: true,
            swap: Swap::Link,
            adopt: false,
        },
    );
    drop(stage);
    drop(lease);
    published?;
    if let Some(old) = &live {
        // Its grace period starts now.
        let _ = t.state.stamp(old, "retired");
    }
    println!(
        "packsync: {}: rolled back {} to generation {gen}{}",
        t.shown(),
        match &live {
            Some(old) => format!("from generation {old}"),
            None => "(nothing was live)".into(),
        },
        gen_label
            .as_deref()
            .map(|l| format!(" (label {l})"))
            .unwrap_or_default()
    );
    Ok(0)
}

/// `--to`: a generation name, a unique prefix of one, or a label (the newest
/// generation carrying it).
fn find(t: &Target, spec: &str) -> Result<String> {
    let gens = t.state.generations()?;
    if gens.iter().any(|g| g == spec) {
        return Ok(spec.to_string());
    }
    let mut by_label: Vec<&String> = gens
        .iter()
        .filter(|g| {
            // The label as its header says it: only a generation that
            // names `spec` there has its manifest's digest checked.
            let header = t
                .state
                .manifest_reader(g)
                .ok()
                .and_then(|(mut r, _)| crate::manifest::Manifest::read_header(&mut r).ok());
            if header.is_some_and(|h| h.label.as_deref() != Some(spec)) {
                return false;
            }
            t.state
                .checked_header(g)
                .is_ok_and(|m| m.label.as_deref() == Some(spec))
        })
        .collect();
    by_label.sort_by(|a, b| retire::made(&t.state, b).total_cmp(&retire::made(&t.state, a)));
    if let Some(g) = by_label.first() {
        return Ok((*g).clone());
    }
    let prefixed: Vec<&String> = gens.iter().filter(|g| g.starts_with(spec)).collect();
    if spec.len() >= 4 && prefixed.len() == 1 {
        return Ok(prefixed[0].clone());
    }
    let known = if gens.is_empty() {
        "none is retained".to_string()
    } else {
        format!("retained: {}", gens.join(", "))
    };
    Err(error::usage(format!(
        "{}: no generation {spec:?} ({known}; see `packsync status`)",
        t.shown()
    )))
}

/// The newest generation made before `live` (any, when nothing is live).
fn previous(t: &Target, live: Option<&str>) -> Result<String> {
    let made_live = live.map(|g| retire::made(&t.state, g)).filter(|m| *m > 0.0);
    let mut candidates: Vec<(f64, String)> = t
        .state
        .generations()?
        .into_iter()
        .filter(|g| Some(g.as_str()) != live)
        .map(|g| (retire::made(&t.state, &g), g))
        .filter(|(m, _)| made_live.is_none_or(|l| *m < l))
        .collect();
    candidates.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)));
    candidates
        .into_iter()
        .next()
        .map(|(_, g)| g)
        .with_context(|| {
            format!(
                "{}: no generation older than the live one is retained \
                 (see `packsync status`; --keep decides how many are)",
                t.shown()
            )
        })
}
