//! `packsync status DEST [--json]`: what is live, what is retained, which
//! writers are staging. Reads only manifest headers and names; never hashes.

use std::os::fd::AsFd;
use std::path::Path;

use crate::clock::now_secs as now;

use anyhow::Result;

use crate::config;
use crate::layout;
use crate::manifest::Manifest;
use crate::report;
use crate::retire;
use crate::sys;
use crate::volume::{self, State};

use super::{age, meta_time, path_of, rfc3339, Target};

/// One tree's status; its fields are documented in the README ("status and
/// verify JSON").
#[derive(serde::Serialize)]
pub struct Status {
    pub dest: String,
    /// `symlink`, `fanout` or `dir`.
    pub layout: &'static str,
    /// The fanout slot (`null`: DEST's only tree, or the unslotted one).
    pub slot: Option<String>,
    /// DEST resolves to a generation that exists and has a manifest.
    pub resolves: bool,
    pub live: Option<GenInfo>,
    /// Every other generation still on the volume, newest first.
    pub retained: Vec<GenInfo>,
    pub staging: Vec<StageInfo>,
    /// What `verify` found damaged in the live generation, until a sync
    /// copies it afresh (`null`: nothing recorded).
    pub damaged: Option<DamageInfo>,
}

#[derive(serde::Serialize)]
pub struct DamageInfo {
    pub generation: String,
    /// How many paths differ from the manifest.
    pub paths: u64,
    /// The first few of them (escaped as in `verify`).
    pub first: Vec<String>,
    pub found: String,
    pub found_unix: i64,
}

#[derive(serde::Serialize)]
pub struct GenInfo {
    pub generation: String,
    pub path: String,
    /// The manifest was read; without it the fields below are null.
    pub complete: bool,
    pub label: Option<String>,
    pub created: Option<String>,
    pub created_unix: Option<i64>,
    pub host: Option<String>,
    pub sources: Vec<String>,
    pub entries: Option<u64>,
    pub bytes: Option<u64>,
    pub digest: Option<String>,
    /// When it stopped being live (retained generations only).
    pub retired: Option<String>,
    pub retired_unix: Option<i64>,
    /// An `exec` holds it.
    pub leased: bool,
    /// What the sync that made it fetched from remote sources, and what it
    /// took from the live generation instead (`null`: not recorded).
    pub fetched_bytes: Option<u64>,
    pub reused_bytes: Option<u64>,
    /// `--verify-key`: for each source, the fingerprint of the key whose
    /// signature it carried (empty: published without verification).
    pub verified: Vec<VerifiedInfo>,
}

#[derive(serde::Serialize)]
pub struct VerifiedInfo {
    /// The SOURCE as the manifest records it.
    pub source: String,
    /// Its position among the sources, from 0.
    pub index: usize,
    /// `SHA256:` and the unpadded base64 SHA-256 of the key's DER SubjectPublicKeyInfo.
    pub key: String,
}

#[derive(serde::Serialize)]
pub struct StageInfo {
    pub name: String,
    pub host: Option<String>,
    pub pid: Option<u32>,
    pub age_seconds: i64,
    /// `active`, or `stale`: its writer is gone; the next sync or gc removes it.
    pub state: &'static str,
}

/// With several fanout slots: one object holding each slot's status.
#[derive(serde::Serialize)]
struct Slots<'a> {
    dest: &'a str,
    layout: &'static str,
    /// Every slot resolves.
    resolves: bool,
    slots: &'a [Status],
}

pub fn run(dest: &Path, slot: Option<&str>, json: bool) -> Result<i32> {
    let targets = super::open(dest, slot)?;
    let all: Vec<Status> = targets.iter().map(collect).collect::<Result<_>>()?;
    if json {
        match all.as_slice() {
            [one] => report::json(one)?,
            _ => report::json(&Slots {
                dest: &targets[0].vol.display,
                layout: all[0].layout,
                resolves: all.iter().all(|s| s.resolves),
                slots: &all,
            })?,
        }
    } else {
        let blocks: Vec<String> = all.iter().map(table).collect();
        print!("{}", blocks.join("\n"));
    }
    Ok(0)
}

/// Everything `status` shows of one tree, read from its state directory.
pub fn collect(t: &Target) -> Result<Status> {
    let live = layout::live_generation(&t.vol)?;
    let mut gens = t.state.generations()?;
    // Newest first, as retire orders them.
    gens.sort_by(|a, b| {
        retire::made(&t.state, b)
            .total_cmp(&retire::made(&t.state, a))
            .then(b.cmp(a))
    });
    let mut out = Status {
        dest: t.vol.display.clone(),
        layout: layout::layout_name(t.vol.layout),
        slot: t.vol.slot.clone(),
        resolves: false,
        live: None,
        retained: Vec::new(),
        staging: stages(&t.state),
        damaged: None,
    };
    if let Some(g) = &live {
        out.damaged =
            crate::damage::read_or_warn(&t.state, g, &|w| eprintln!("packsync: warning: {w}")).map(
                |d| DamageInfo {
                    generation: d.gen,
                    paths: d.total,
                    first: d
                        .paths
                        .iter()
                        .take(5)
                        .map(|p| crate::escape::c_style(p))
                        .collect(),
                    found: rfc3339(d.found),
                    found_unix: d.found,
                },
            );
        let info = info(t, g, false);
        out.resolves = info.complete && layout::open_generation(&t.vol, &t.state, g).is_ok();
        out.live = Some(info);
    }
    for g in gens.iter().filter(|g| Some(*g) != live.as_ref()) {
        out.retained.push(info(t, g, true));
    }
    Ok(out)
}

fn info(t: &Target, gen: &str, retained: bool) -> GenInfo {
    let header = read_header(&t.state, gen);
    let retired_unix = if retained {
        meta_time(&t.state, &format!("{gen}.retired"))
    } else {
        None
    };
    let mut g = GenInfo {
        generation: gen.to_string(),
        path: path_of(&t.vol, &t.state, gen).display().to_string(),
        complete: header.is_some(),
        label: None,
        created: None,
        created_unix: None,
        host: None,
        sources: Vec::new(),
        entries: None,
        bytes: None,
        digest: None,
        retired: retired_unix.map(rfc3339),
        retired_unix,
        leased: retire::leased(&t.state, gen),
        verified: Vec::new(),
        fetched_bytes: None,
        reused_bytes: None,
    };
    if let Some((f, r)) = t.state.fetched(gen) {
        (g.fetched_bytes, g.reused_bytes) = (Some(f), Some(r));
    }
    if let Some((m, entries, bytes)) = header {
        g.label = m.label;
        g.created = Some(rfc3339(m.created.0));
        g.created_unix = Some(m.created.0);
        g.host = Some(m.host);
        g.verified = m
            .verified
            .iter()
            .map(|(i, fp)| VerifiedInfo {
                source: m.sources.get(*i).cloned().unwrap_or_default(),
                index: *i,
                key: fp.clone(),
            })
            .collect();
        g.sources = m.sources;
        g.entries = entries;
        g.bytes = bytes;
        g.digest = Some(m.digest);
    }
    g
}

/// The manifest's header (everything before `---`), and its counts.
pub(super) fn read_header(
    state: &State,
    gen: &str,
) -> Option<(Manifest, Option<u64>, Option<u64>)> {
    let name = format!("{gen}.manifest");
    let fd = state.meta.open_read(name.as_bytes()).ok()?;
    let text = volume::read_to_string(fd.as_fd()).ok()?;
    let head = text.split("\n---\n").next()?;
    let m = Manifest::read_header(&mut text.as_bytes()).ok()?;
    let count = |key: &str| {
        head.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.parse().ok())
    };
    Some((m, count("entries"), count("bytes")))
}

fn stages(state: &State) -> Vec<StageInfo> {
    let Ok(list) = state.stage.list() else {
        return Vec::new();
    };
    let me = volume::host_tag();
    let t = now();
    let mut out: Vec<StageInfo> = list
        .into_iter()
        .map(|l| {
            let name = String::from_utf8_lossy(&l.name).into_owned();
            let age_seconds = state
                .stage
                .stat(&l.name)
                .map(|st| t - sys::mtime_of(&st).0)
                .unwrap_or(0);
            let owner = volume::stage_owner(&name).map(|(h, p)| (h.to_string(), p));
            // The same rule gc applies: a local writer by its pid, another host's by age.
            let stale = match &owner {
                Some((h, pid)) if *h == me => !sys::pid_alive(*pid),
                _ => age_seconds > config::STALE_STAGE.as_secs() as i64,
            };
            StageInfo {
                host: owner.as_ref().map(|o| o.0.clone()),
                pid: owner.map(|o| o.1),
                name,
                age_seconds,
                state: if stale { "stale" } else { "active" },
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The human view: a line for DEST, a table of generations, the staging.
fn table(s: &Status) -> String {
    let mut out = String::new();
    let live = match &s.live {
        Some(g) if s.resolves => format!("generation {} is live", g.generation),
        Some(g) => format!(
            "generation {} is live but does not resolve to a complete tree",
            g.generation
        ),
        None => "no generation is live".into(),
    };
    let slot = s
        .slot
        .as_deref()
        .map(|x| format!("slot {x}, "))
        .unwrap_or_default();
    out.push_str(&format!("{} ({slot}layout {}): {live}\n", s.dest, s.layout));
    let t_now = now();
    let mut rows = vec![[
        String::new(),
        "GENERATION".into(),
        "LABEL".into(),
        "CREATED".into(),
        "ENTRIES".into(),
        "BYTES".into(),
        "STATE".into(),
    ]];
    let row = |mark: &str, g: &GenInfo, state: String| {
        [
            mark.to_string(),
            g.generation.clone(),
            g.label.clone().unwrap_or_else(|| "-".into()),
            g.created
                .as_deref()
                .map(|c| c.replace('T', " ").replace('Z', " UTC"))
                .unwrap_or_else(|| "-".into()),
            g.entries
                .map(|n| n.to_string())
                .unwrap_or_else(|| "-".into()),
            g.bytes
                .map(report::human_bytes)
                .unwrap_or_else(|| "-".into()),
            state,
        ]
    };
    if let Some(g) = &s.live {
        let mut state = String::from("live");
        if !g.complete {
            state.push_str(", no manifest");
        }
        if g.leased {
            state.push_str(", leased");
        }
        rows.push(row("*", g, state));
    }
    for g in &s.retained {
        let mut state = match g.retired_unix {
            Some(r) => format!("retired {} ago", age(t_now - r)),
            None => "retained".into(),
        };
        if !g.complete {
            state.push_str(", no manifest");
        }
        if g.leased {
            state.push_str(", leased");
        }
        rows.push(row(" ", g, state));
    }
    let widths: Vec<usize> = (0..7)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for r in &rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(c, v)| format!("{v:<w$}", w = widths[c]))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    if let Some(g) = &s.live {
        if g.complete {
            out.push_str(&format!(
                "live: made on {} from {}; digest {}\n",
                g.host.as_deref().unwrap_or("-"),
                if g.sources.is_empty() {
                    "-".to_string()
                } else {
                    g.sources.join(", ")
                },
                g.digest.as_deref().unwrap_or("-")
            ));
            for v in &g.verified {
                out.push_str(&format!("verified: {} signed by {}\n", v.source, v.key));
            }
            if let (Some(f), Some(r)) = (g.fetched_bytes, g.reused_bytes) {
                out.push_str(&format!(
                    "fetched: {} from the sources, {} taken from the generation before instead\n",
                    report::human_bytes(f),
                    report::human_bytes(r)
                ));
            }
        }
    }
    if let Some(d) = &s.damaged {
        let more = (d.paths as usize).saturating_sub(d.first.len());
        out.push_str(&format!(
            "damaged: `packsync verify` found {} path{} of generation {} differing from its manifest ({}{}); the next sync copies {} afresh\n",
            d.paths,
            if d.paths == 1 { "" } else { "s" },
            d.generation,
            d.first.join(", "),
            if more > 0 { format!(" and {more} more") } else { String::new() },
            if d.paths == 1 { "it" } else { "them" },
        ));
    }
    if s.staging.is_empty() {
        out.push_str("staging: none\n");
    } else {
        let list: Vec<String> = s
            .staging
            .iter()
            .map(|st| format!("{} ({}, {} old)", st.name, st.state, age(st.age_seconds)))
            .collect();
        out.push_str(&format!("staging: {}\n", list.join(", ")));
    }
    out
}
