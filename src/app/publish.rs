//! The end of a round: a staged tree committed and the old retired
//! (`Publish`), or a round decided before anything is staged (`Planned`:
//! up to date, or a dry run); the manifest of what was staged, the hook
//! after, and the collection of what no reader needs.

use std::time::Instant;

use anyhow::Result;

use crate::clock;
use crate::commit::{self, Swap};
use crate::config::{self, SyncConfig};
use crate::layout;
use crate::manifest::Manifest;
use crate::ops;
use crate::plan::Plan;
use crate::report::{Collected, Console, Reporter, Round, Summary};
use crate::retire::{self, Policy};
use crate::sidecar::Pass;
use crate::stage;
use crate::staging::Stage;
use crate::sys::{self};
use crate::tree::Tree;
use crate::volume::{Dest, State, Volume};

use super::{shape_of, Sources};

/// A staged tree and its manifest, to commit (`commit::run`), then retire.
pub(super) struct Publish<'a> {
    pub(super) vol: &'a Volume,
    pub(super) state: &'a State,
    pub(super) staging: Stage,
    pub(super) was_live: Option<&'a str>,
    pub(super) caps: crate::caps::Caps,
    pub(super) swap: Swap,
    pub(super) spooled: Option<&'a crate::manifest::Spooled>,
    /// DEST is a plain directory this commit takes over: it is read
    /// (`takeover::record`) before the commit, while DEST is as it was, and
    /// kept once the swap has taken it out.
    pub(super) take_over: bool,
    /// Where the plan made first listed the directory taken over: the
    /// inodes two of its paths or more are on (`takeover::record`'s
    /// `groups`).
    pub(super) groups: Option<&'a [(u64, u64)]>,
}

impl Publish<'_> {
    pub(super) fn run(
        self,
        cfg: &SyncConfig,
        mut manifest: Manifest,
        mut summary: Summary,
        console: Console,
        start: Instant,
    ) -> Result<Round> {
        let (vol, state) = (self.vol, self.state);
        let taken = match self.take_over {
            true => crate::takeover::record(
                vol,
                self.staging.dir(),
                &self.caps,
                cfg.fsync,
                self.groups,
            )?,
            false => None,
        };
        // Commit: name the tree by its digest and publish it in one rename.
        let commit = commit::Commit {
            vol,
            state,
            stage: &self.staging,
            was_live: self.was_live,
            flush: self.caps.flush,
            opts: commit::Options {
                fsync: cfg.fsync,
                swap: self.swap,
                adopt: cfg.adopt,
            },
            spooled: self.spooled,
        };
        let gen = commit::run(&commit, &mut manifest)?;
        if let (Some(rec), Some(at)) = (&taken, gen.taken_over) {
            console.warn(
                &match crate::takeover::file(state, self.staging.dir(), at, rec) {
                    Ok(kept) => format!(
                    "took over the plain directory {d} ({} entries); kept as generation {kept}: \
                     `packsync rollback {d}` restores it",
                    rec.top,
                    d = vol.display
                ),
                    Err(e) => format!(
                        "took over the plain directory {}, but could not keep it: {e:#}",
                        vol.display
                    ),
                },
            );
        }
        drop(self.staging);
        if summary.fetched_bytes > 0 || summary.reused_bytes > 0 {
            let text = format!("{} {}\n", summary.fetched_bytes, summary.reused_bytes);
            if let Err(e) = state.note(&gen.name, "fetched", &text) {
                console.warn(&format!(
                    "{}: cannot record what was fetched for status: {e:#}",
                    vol.display
                ));
            }
        }
        // What verify found damaged was staged afresh: its record has done its work.
        for g in self.was_live.into_iter().chain([gen.name.as_str()]) {
            crate::damage::clear(state, g);
        }
        for w in &gen.warnings {
            console.warn(w);
        }

        // Retire what no reader may still need, then report.
        summary.status = "synced";
        summary.generation = Some(gen.name.clone());
        summary.retired = collect(cfg, vol, state, &console);
        let hook_failure = run_hook(cfg, vol, state, &gen.name, &mut summary);
        Ok(Round {
            summary,
            console,
            start,
            hook_failure,
        })
    }
}

/// A round decided before anything is staged: up to date, or a dry run.
pub(super) struct Planned<'a> {
    pub(super) summary: Summary,
    pub(super) check: layout::Check,
    /// What the scans reported, shown now.
    pub(super) warnings: Collected,
    /// The live generation and its label.
    pub(super) gen: Option<&'a str>,
    pub(super) live_label: Option<&'a str>,
    /// The label its manifest's header records (what `--label auto`
    /// shows where the sources gave none), however its entries read.
    pub(super) recorded: Option<&'a str>,
    pub(super) up_to_date: bool,
}

impl Planned<'_> {
    /// Show the warnings; an up-to-date sync then settles (`settle`).
    pub(super) fn end(
        mut self,
        cfg: &SyncConfig,
        vol: &Volume,
        state: Option<&State>,
        console: Console,
        pass: Pass,
        start: Instant,
    ) -> Result<Round> {
        // `--label auto` that found no label in sources not spooled (up to
        // date, or a dry run): the live generation's stands for theirs.
        if cfg.label_auto && self.summary.label.is_none() && self.summary.generation.is_some() {
            self.summary.label = self.recorded.map(str::to_string);
        }
        for w in self.warnings.take_warnings() {
            console.warn(&w);
        }
        for w in crate::label::warnings(
            &vol.display,
            cfg.label.as_ref(),
            self.gen,
            self.live_label,
            !self.up_to_date,
        ) {
            console.warn(&w);
        }
        match state {
            Some(state) if !cfg.dry_run => {
                settle(cfg, vol, state, self.check, self.summary, console, pass).map(
                    |(summary, console, hook_failure)| Round {
                        summary,
                        console,
                        start,
                        hook_failure,
                    },
                )
            }
            _ => Ok(Round {
                summary: self.summary,
                console,
                start,
                hook_failure: None,
            }),
        }
    }
}

/// The manifest of the staged tree, before commit seals it with its digest.
pub(super) fn manifest_of(
    cfg: &SyncConfig,
    sources: &Sources,
    owners: bool,
    caps: &crate::caps::Caps,
    mut tree: Tree,
    verified: Vec<(usize, String)>,
) -> Manifest {
    tree.keep_hashes_on_leaders();
    Manifest {
        label: cfg.label_text().map(str::to_string),
        created: clock::now_pair(),
        host: sys::hostname(),
        sources: sources.all.iter().map(|s| s.identity()).collect(),
        owners,
        granularity_ns: caps.granularity_ns,
        link_meta: caps.link_meta,
        hardlinks: caps.hardlinks,
        xattrs: tree.has_xattrs(),
        set_mtime: cfg.set_mtime,
        layers: shape_of(cfg).map_or_else(Vec::new, |shape| {
            let records = sources.all.iter().map(|s| s.record(&shape));
            records
                .enumerate()
                .filter_map(|(i, r)| Some((i, r?)))
                .collect()
        }),
        verified,
        digest: String::new(),
        tree,
    }
}

/// What staging did, into the summary; owners it could not set are a warning.
pub(super) fn note_staged(summary: &mut Summary, staged: &stage::Staged, console: &Console) {
    summary.copied = staged.copied;
    summary.copied_bytes = staged.copied_bytes;
    (summary.fetched_bytes, summary.reused_bytes) = console.transfer();
    summary.reused = staged.reused;
    if staged.owner_failures > 0 {
        console.warn(&format!(
            "could not set the owner of {} entries (not root, or the volume squashes root)",
            staged.owner_failures
        ));
    }
    if let Some((name, err)) = &staged.first_xattr_failure {
        console.warn(&format!(
            "the volume refused {} extended attributes (first: {}: {}); published without them",
            staged.xattr_failures,
            crate::escape::c_style(name),
            err
        ));
    }
}

/// How the commit replaces DEST: a real directory there is exchanged for
/// the link (the layout refuses where the filesystem cannot), or with
/// `--migrate` moved away first.
pub(super) fn swap_for(dest: &Dest, cfg: &SyncConfig) -> Swap {
    match dest {
        Dest::Directory if cfg.migrate => Swap::Migrate,
        Dest::Directory => Swap::Exchange,
        _ => Swap::Link,
    }
}

/// An up-to-date sync writes no generation, but repairs fanout links that
/// do not match the live one, collects, and (`pass.retry_hook`) runs
/// `--exec-after` again where it failed on (or never ran on) the live
/// generation. The summary, the console and the hook's failure.
pub(super) fn settle(
    cfg: &SyncConfig,
    vol: &Volume,
    state: &State,
    check: layout::Check,
    mut summary: Summary,
    console: Console,
    pass: Pass,
) -> Result<(Summary, Console, Option<anyhow::Error>)> {
    for w in layout::of(vol).repair(vol, state, &check)? {
        console.warn(&w);
    }
    summary.retired = collect(cfg, vol, state, &console);
    let gen = summary
        .generation
        .clone()
        .expect("up to date with a live generation");
    if cfg.exec_after.is_none() || !pass.retry_hook || ops::exec::after_done(state, &gen) {
        return Ok((summary, console, None));
    }
    let failure = run_hook(cfg, vol, state, &gen, &mut summary);
    Ok((summary, console, failure))
}

/// Garbage collection after a sync: its failure is a warning, as the sync
/// itself is done and the next run collects again.
pub(super) fn collect(
    cfg: &SyncConfig,
    vol: &Volume,
    state: &State,
    console: &Console,
) -> Vec<String> {
    let policy = Policy {
        keep: cfg.keep,
        grace: cfg.grace,
        stale: config::STALE_STAGE,
    };
    match retire::run(vol, state, &policy, None) {
        Ok(r) => r.removed,
        Err(e) => {
            console.warn(&format!("garbage collection left for the next run: {e:#}"));
            Vec::new()
        }
    }
}

/// Run `--exec-after` (if given) on `gen`. What it did goes into the
/// summary; its failure is returned, to be the error (exit 1) once the
/// summary is out: the swap stays.
pub(super) fn run_hook(
    cfg: &SyncConfig,
    vol: &Volume,
    state: &State,
    gen: &str,
    summary: &mut Summary,
) -> Option<anyhow::Error> {
    cfg.exec_after.as_deref().and_then(|c| {
        let (after, failure) = ops::exec::after(c, vol, state, gen, cfg.json);
        summary.exec_after = Some(after);
        failure
    })
}

/// The summary as planned: "up to date", or what a dry run would do, or
/// counts that staging completes (`note_staged`).
/// `entries` and `bytes`: the new tree's (`Tree::count`, `Tree::bytes`);
/// `gen`: the live generation.
pub(super) fn summary_of(
    cfg: &SyncConfig,
    vol: &Volume,
    (entries, bytes): (u64, u64),
    plan: &Plan,
    gen: Option<&str>,
    up_to_date: bool,
) -> Summary {
    let mut s = Summary {
        dest: vol.display.clone(),
        entries,
        bytes,
        added: plan.added,
        changed: plan.changed,
        deleted: plan.deleted,
        previous: gen.map(str::to_string),
        label: cfg.label_text().map(str::to_string),
        dry_run: cfg.dry_run,
        ..Default::default()
    };
    if up_to_date || cfg.dry_run {
        s.status = if up_to_date {
            "up to date"
        } else {
            "would sync"
        };
        s.generation = gen.map(str::to_string);
    }
    if cfg.dry_run {
        (s.copied, s.copied_bytes, s.reused) = (plan.copied, plan.copied_bytes, plan.reused);
    }
    s
}
