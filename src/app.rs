//! The pipeline: the only file that knows the order of the stages, and the
//! owner of the thread pool (rayon's global one).
//!
//! `round` reads as the story of one sync: validate → scan (sources and the
//! live tree) → plan → guards → stage → verify → commit → retire, each step
//! a call through its module; `sync` shows its report, or hands the whole
//! to the loop of `--every` (`sidecar`), which runs it again and again. The functions below it are the
//! joints between stages that belong to none of them: opening what the
//! command line named, reading the live generation back, giving the tree
//! its owners. Every other command is one call into `ops`.

use std::collections::HashSet;
use std::time::Instant;

use anyhow::{Context, Result};

use crate::clock;
use crate::commit::{self, Swap};
use crate::config::{self, Command, Config, Owner, SyncConfig};
use crate::error;
use crate::filter::Filter;
use crate::label::Label;
use crate::layout;
use crate::live::LiveGen;
use crate::manifest::Manifest;
use crate::ops;
use crate::plan::{self, Compare, Plan};
use crate::report::{self, Collected, Console, Output, Reporter, Round, Summary};
use crate::retire::{self, Policy};
use crate::scan;
use crate::sidecar::Pass;
use crate::source::{self, Source};
use crate::stage;
use crate::staging::Stage;
use crate::sys::{self, DirFd};
use crate::tree::{Kind, Meta, Node, Tree};
use crate::verify;
use crate::volume::{Dest, State, Volume};

/// Run a command; the exit status on success.
pub fn run(cfg: Config) -> Result<i32> {
    init_pool(&cfg.command);
    sys::signals::install();
    sys::raise_fd_limit();
    sys::set_umask(0o022);
    match cfg.command {
        Command::Sync(s) => sync(&s),
        Command::Completions { shell } => {
            crate::cli::completions(shell, &mut std::io::stdout());
            Ok(0)
        }
        Command::Gc { dest, keep, grace } => ops::gc::run(&dest, keep, grace),
        Command::Status { dest, json, slot } => ops::status::run(&dest, slot.as_deref(), json),
        Command::Verify { dest, json, slot } => ops::verify::run(&dest, slot.as_deref(), json),
        Command::Rollback { dest, to, slot } => {
            ops::rollback::run(&dest, slot.as_deref(), to.as_deref())
        }
        Command::Wait {
            dest,
            timeout,
            label,
            slot,
        } => ops::wait::run(&dest, slot.as_deref(), timeout.as_ref(), label.as_deref()),
        Command::Exec { dest, cmd, slot } => ops::exec::run(&dest, slot.as_deref(), &cmd),
    }
}

/// Size the thread pool. Scanning and copying mostly wait on the
/// filesystem, so a one-shot sync has several threads per core: 8 a core
/// (16 at least) where requests cross a network (a network or FUSE volume,
/// or a directory SOURCE on one) or where every file is to be written (a
/// first sync), and 4 a core (8 at least) for an update or a no-op on a
/// local volume, which mostly stats and links. Measured on 2 cores
/// (BENCHMARKS.md, "Threads"): 8 threads took 1.27-1.31 times as long as
/// 16 to fill and to update a GlusterFS volume answering in 1 ms, and 1.08
/// times as long for a cold first sync of 10^5 files to a local disk,
/// while a local update or no-op took the same time cold and less warm;
/// each thread holds 150-200 KiB at the peak of a large update. So the
/// one-shot sync sizes its pool once DEST is open (`size_pool`); other
/// commands take the larger figure. The loop (`sync --every`) runs for
/// days and mostly finds nothing to do: it has one thread per core, since
/// every long-lived thread keeps its own deepest stack, and RSS would grow
/// with the rounds (BENCHMARKS.md). All share one allocator arena: with an
/// arena per thread each keeps the fragments of what it freed, which cost
/// a one-shot sync of 10^5 entries about 1 MiB of peak RSS (16 threads)
/// and made the loop's RSS creep. `RAYON_NUM_THREADS` overrides the
/// number of threads.
fn init_pool(command: &Command) {
    sys::share_one_arena();
    let threads = match command {
        Command::Sync(s) if s.every.is_some() => cores().max(2),
        Command::Sync(_) => return, // size_pool
        _ => pool_threads(true),
    };
    build_pool(threads);
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// A one-shot sync's threads (`init_pool`): `waits`, where its requests
/// wait on a network or on writes.
fn pool_threads(waits: bool) -> usize {
    if waits {
        (cores() * 8).clamp(16, 64)
    } else {
        (cores() * 4).clamp(8, 32)
    }
}

/// Set once `init_pool` or `size_pool` has sized the pool.
static POOL_SIZED: std::sync::Once = std::sync::Once::new();

fn build_pool(threads: usize) {
    POOL_SIZED.call_once(|| {
        if std::env::var_os("RAYON_NUM_THREADS").is_some() {
            return; // rayon reads it
        }
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build_global();
    });
}

/// `init_pool` for a one-shot sync, once DEST's volume is open (nothing
/// before this runs in the pool): the fewer threads only for an update or
/// a no-op where DEST and every directory SOURCE are on local filesystems
/// (other sources are fetched onto DEST's volume). A filesystem that
/// cannot be told counts as networked.
fn size_pool(vol: &Volume, dest: &Dest, sources: &Sources) {
    if POOL_SIZED.is_completed() {
        return; // a later round of this sync, or of the loop
    }
    let local = |k: Option<sys::FsKind>| k == Some(sys::FsKind::Local);
    let networked = !local(vol.fs_kind())
        || sources
            .all
            .iter()
            .filter_map(|s| s.root())
            .any(|d| !local(d.fs_kind().ok()));
    build_pool(pool_threads(networked || !matches!(dest, Dest::Live(_))));
}

/// `sync`: one round, shown; with `--every`, the loop (`sidecar::run`).
fn sync(cfg: &SyncConfig) -> Result<i32> {
    if cfg.every.is_some() {
        return crate::sidecar::run(cfg, &|pass| round(cfg, pass));
    }
    match round(cfg, Pass::ONCE) {
        Ok(r) => r.report(Output::of(cfg.json, cfg.quiet)),
        // A round a signal cut short (a download that stopped at once, say)
        // failed because of it: its staging is gone by now.
        Err(_) if sys::signals::pending().is_some() => {
            Err(crate::error::Failure::Interrupted(sys::signals::pending().unwrap_or(0)).into())
        }
        Err(e) => Err(e),
    }
}

/// One sync: validate → scan → plan → guards → stage → verify → commit →
/// retire. Shown by the caller (`Round::report`).
pub(crate) fn round(cfg: &SyncConfig, pass: Pass) -> Result<Round> {
    round_or_full(cfg, pass).map_err(|e| stays_live(cfg, e))
}

/// A failure (exit 1: a fetch, a stream, the volume) said with the
/// generation that stays live, where one is: nothing was published.
fn stays_live(cfg: &SyncConfig, e: anyhow::Error) -> anyhow::Error {
    if error::exit_code(&e) != 1 || sys::signals::pending().is_some() {
        return e;
    }
    let gen = Volume::open(&cfg.dest, false)
        .and_then(|base| layout::open_for_sync(base, cfg))
        .and_then(|vol| layout::live_generation(&vol));
    match gen {
        Ok(Some(gen)) => error::StaysLive { cause: e, gen }.into(),
        _ => e,
    }
}

/// `round`, tried once more where the volume was full and dead writers'
/// staging could be removed.
fn round_or_full(cfg: &SyncConfig, pass: Pass) -> Result<Round> {
    let err = match round_with(cfg, pass, None) {
        Err(e) if !cfg.dry_run && out_of_space(&e) => e,
        done => return done,
    };
    // The volume is full: staging that dead writers left (this host's
    // processes gone, or any host's untouched past the stale age) may be
    // what fills it. Remove it, as `gc` would, and try once more.
    let freed = Volume::open(&cfg.dest, false)
        .ok()
        .and_then(|vol| Some((vol.state(false).ok().flatten()?, vol)))
        .map_or(0, |(state, vol)| {
            retire::remove_dead_staging(&vol, &state, config::STALE_STAGE)
        });
    if freed == 0 {
        return Err(err);
    }
    let line = format!(
        "the volume was full: removed the staging of {freed} dead writer{} and tried again",
        if freed == 1 { "" } else { "s" }
    );
    round_with(cfg, pass, Some(line))
}

/// Whether `e` was caused by a full volume or an exhausted quota.
fn out_of_space(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(sys::out_of_space)
    })
}

/// `round`. Sources that can tell they are unchanged since the live
/// generation (an image tag on the same digest, a URL answering 304) are
/// first not fetched, the live manifest's entries standing in for them
/// (the shortcut). If the live tree drifted from them after all, the round
/// is tried once more without the shortcut: a bounded second try, never a
/// third. `note`: a warning to show first.
fn round_with(cfg: &SyncConfig, pass: Pass, note: Option<String>) -> Result<Round> {
    let start = Instant::now();
    let mut note = note;
    for shortcut in [true, false] {
        // Validate: nothing is written before the guards have passed.
        crate::source::spool::limit_entries(cfg.max_entries);
        let sources = Sources::open(cfg)?;
        // `--semver` lists tags and `--label auto` reads versions first: the
        // label (and so the guards) of this round depend on them.
        let resolved = resolve_label(cfg, &sources)?;
        let cfg = resolved.as_ref().unwrap_or(cfg);
        let chosen = chosen_of(&sources)?;
        let mut round = match round_on(cfg, sources, pass, shortcut, note.take(), start)? {
            Attempt::Done(round) => *round,
            // Drift under the shortcut: why, where it is worth saying.
            Attempt::Again(why) => {
                note = why;
                continue;
            }
        };
        round.summary.chosen = chosen;
        return Ok(round);
    }
    // `round_on` takes no shortcut when told not to, so it never asks twice.
    anyhow::bail!("the round asked to start again without a shortcut to drop")
}

/// What one try of a round came to: done, or to be tried again without
/// the shortcut (a source taken as unchanged was not), with why.
enum Attempt {
    Done(Box<Round>),
    Again(Option<String>),
}

/// What `--semver` chose, source by source (for the summary and metrics).
fn chosen_of(sources: &Sources) -> Result<Vec<report::Chosen>> {
    let mut out = Vec::new();
    for s in &sources.all {
        if let Some((tag, digest)) = s.chosen()? {
            out.push(report::Chosen {
                source: s.label().to_string(),
                tag,
                digest,
            });
        }
    }
    Ok(out)
}

/// `round_with`, on the sources opened (and the label resolved).
fn round_on(
    cfg: &SyncConfig,
    sources: Sources,
    pass: Pass,
    shortcut: bool,
    note: Option<String>,
    start: Instant,
) -> Result<Attempt> {
    // With --verify-key: every source is verified after its scan, so no
    // shortcut that skips the scan runs, but for sources unchanged since a
    // live generation those same keys verified (`unchanged_live`). An image
    // checks its cosign signature as its digest is resolved, which
    // `unchanged_live` does for every one before anything is written.
    let trusting = cfg.trusting();
    let (vol, dest) = open_dest(cfg, &sources)?;
    size_pool(&vol, &dest, &sources);
    let output = Output::of(cfg.json, cfg.quiet);
    let show = match cfg.progress {
        Some(true) => report::Show::Bar,
        Some(false) => report::Show::Off,
        None if sys::stderr_is_tty() => report::Show::Bar,
        None => report::Show::Lines,
    };
    let mut console = if pass.defer_warnings {
        Console::keeping(output, show)
    } else {
        Console::new(output, show)
    };
    if let Some(n) = note {
        console.warn(&n);
    }

    // A directory at a time, the sources against the live generation (or,
    // for sources unchanged since it, the live generation against its
    // manifest): a sync that finds nothing to do ends here, having held no
    // whole tree.
    let state = vol.state(false)?;
    // The live generation, opened once for the whole round: its root, its
    // manifest and the manifest's header.
    let live_gen = match (&dest, state.as_ref()) {
        (Dest::Live(gen), Some(state)) => Some(LiveGen::open(&vol, state, gen)),
        _ => None,
    };
    let live_gen = live_gen.as_ref();
    early_label_guard(cfg, &vol, live_gen)?;
    // Files `verify` found damaged: the live manifest is not to be trusted
    // for them, so no shortcut that trusts it (the quick compare, the
    // streamed update, sources unchanged since the live generation) runs,
    // and the whole-tree plan copies them afresh (`forget_damaged`).
    let damage = match (&dest, state.as_ref()) {
        (Dest::Live(gen), Some(state)) if !cfg.checksum => {
            crate::damage::read_or_warn(state, gen, &|w| console.warn(w))
        }
        _ => None,
    };
    let shortcut = shortcut && damage.is_none();
    let adjust = Adjust::of(cfg);
    let same_gen = unchanged_live(cfg, &sources, live_gen, shortcut)?;
    let quick = live_gen
        .filter(|_| damage.is_none() && !trusting)
        .and_then(|live| {
            quick(cfg, live, &sources, &adjust).or_else(|| {
                same_gen.as_ref()?;
                recorded_quick(cfg, live, &adjust)
            })
        });
    if let Some(q) = quick {
        return quick_end(cfg, &vol, state.as_ref(), q, console, pass, start)
            .map(|r| Attempt::Done(Box::new(r)));
    }

    let streamed_round = |recorded| StreamedRound {
        cfg,
        vol: &vol,
        dest: &dest,
        sources: &sources,
        adjust: &adjust,
        recorded,
        surveyed: None,
    };
    // `--itemize`, `--verify` and `--checksum` are planned below first,
    // against the live listing, as the whole-tree path plans them.
    let planned_first = cfg.itemize || cfg.verify || cfg.checksum;
    let streamed = (damage.is_none() && !trusting && !planned_first)
        .then(|| streams(cfg, live_gen, &dest, &sources))
        .flatten();
    if let Some(recorded) = streamed {
        match streamed_round(recorded).run(console, start, None)? {
            Ok(round) => return Ok(Attempt::Done(Box::new(round))),
            // The live tree joined files its manifest has apart: the
            // whole-tree path below sees its inodes and copies them apart.
            Err(back) => console = back,
        }
    }

    // A dry run, `--itemize` or `--verify` of directories, planned a
    // directory at a time: only the changes are held (where `--itemize`
    // lists them).
    let surveyed = (damage.is_none() && !trusting && same_gen.is_none())
        .then(|| survey(cfg, &dest, live_gen, &sources, &adjust))
        .flatten();
    if let Some(mut surveyed) = surveyed {
        let gen = live_gen.map(|l| l.gen.as_str());
        let up_to_date = surveyed.up_to_date(cfg, gen);
        if cfg.dry_run || up_to_date {
            let planned = surveyed.planned(cfg, &vol, gen, up_to_date)?;
            return planned
                .end(cfg, &vol, state.as_ref(), console, pass, start)
                .map(|r| Attempt::Done(Box::new(r)));
        }
        // Something to do: staged a directory at a time (its own listing
        // reports what it skips), guarded and counted as just planned.
        if let Some(recorded) = streams(cfg, live_gen, &dest, &sources) {
            let round = StreamedRound {
                surveyed: Some(surveyed),
                ..streamed_round(recorded)
            };
            match round.run(console, start, None)? {
                Ok(round) => return Ok(Attempt::Done(Box::new(round))),
                Err(back) => console = back,
            }
        }
    }

    // Scan the sources and the live generation at the same time. A
    // streamed source (an archive) is first read into a spool inside this
    // writer's staging directory, so that comes first then; a state
    // directory made only for it goes again if the sync stops short of
    // staging (`MadeState`).
    let warnings = Collected::default();
    let recorded = match (&same_gen, live_gen) {
        (Some(_), Some(live)) => recorded_tree(live),
        _ => None,
    };
    let noop = recorded.is_some();
    let resumed = !noop && !trusting && resume_live(cfg, &sources, live_gen, shortcut)?;
    // An image's signature covers its manifest, hence the TOC's digest
    // and every file's: lending skips no check, so `--verify-key` keeps it.
    let lent = !noop && !resumed && lend_live(cfg, &sources, live_gen, shortcut)?;
    let fresh_state = state.is_none();
    let streamed = sources.streamed() && !noop;
    // A dry run writes nothing on the volume: it spools outside it.
    let spool_here = streamed && !cfg.dry_run;
    let mut made = MadeState {
        vol: &vol,
        armed: spool_here && fresh_state,
    };
    let state = if spool_here && fresh_state {
        vol.state(true)?
    } else {
        state
    };
    let mut early = match (&state, spool_here) {
        (Some(state), true) => Some(Stage::new(state)?),
        _ => None,
    };
    let scratch = match streamed && cfg.dry_run {
        true => Some(source::Scratch::new()?),
        false => None,
    };
    let spool_in = early
        .as_ref()
        .map(|s| s.dir())
        .or(scratch.as_ref().map(|s| s.dir()));
    // Spooled, the sources list a directory at a time as a directory does:
    // then they stream as a directory source would (`StreamedRound`),
    // never held whole. Not where a spool lists files of the live
    // generation (`resume`, `lend`: then the plan must reuse each), a
    // signature is checked over the whole tree, a label is read from the
    // spool, or on the second try.
    let mut spooled = false;
    let spooled_streams =
        shortcut && !trusting && damage.is_none() && !(cfg.label_auto && cfg.label.is_none());
    if let (true, Some(stage), Some(st)) = (spooled_streams, early.as_ref(), state.as_ref()) {
        let kept = Scanning {
            kept: &warnings,
            console: &console,
        };
        source::spool_all(&sources.refs(), stage.dir(), &kept)?;
        spooled = true;
        if let Some(recorded) = streams(cfg, live_gen, &dest, &sources) {
            let q = spooled_quick(cfg, live_gen, &sources, &adjust, recorded.as_ref())?;
            if let Some(mut q) = q {
                for w in q.warnings.take_warnings() {
                    warnings.warn(&w);
                }
                q.warnings = warnings;
                return quick_end(cfg, &vol, state.as_ref(), q, console, pass, start)
                    .map(|r| Attempt::Done(Box::new(r)));
            }
            // `--itemize`, `--verify`: planned a directory at a time first
            // (where the live hardlinks drifted, by the whole trees).
            let mut surveyed = planned_first
                .then(|| survey(cfg, &dest, live_gen, &sources, &adjust))
                .flatten();
            let gen = live_gen.map(|l| l.gen.as_str());
            if let Some(s) = surveyed.as_mut().filter(|s| s.up_to_date(cfg, gen)) {
                s.after(&warnings);
                return s
                    .planned(cfg, &vol, gen, true)?
                    .end(cfg, &vol, state.as_ref(), console, pass, start)
                    .map(|r| Attempt::Done(Box::new(r)));
            }
            if !planned_first || surveyed.is_some() {
                let s = StreamedRound {
                    surveyed,
                    ..streamed_round(recorded)
                };
                let early = Early {
                    state: st,
                    stage: early.take().expect("matched"),
                    fresh: fresh_state,
                    made: &mut made,
                    kept: &warnings,
                };
                return match s.run(console, start, Some(early))? {
                    Ok(round) => Ok(Attempt::Done(Box::new(round))),
                    // The live tree joined files its manifest has apart, and
                    // the spool's files are moved out: spool again, whole.
                    Err(_) => Ok(Attempt::Again(None)),
                };
            }
        }
    }
    // A dry run of spooled sources, planned a directory at a time as a
    // directory source's is (its spool outside the volume).
    if let (true, Some(scratch)) = (spooled_streams && cfg.dry_run, scratch.as_ref()) {
        let kept = Scanning {
            kept: &warnings,
            console: &console,
        };
        source::spool_all(&sources.refs(), scratch.dir(), &kept)?;
        spooled = true;
        if let Some(mut s) = survey(cfg, &dest, live_gen, &sources, &adjust) {
            s.after(&warnings);
            let gen = live_gen.map(|l| l.gen.as_str());
            let up_to_date = s.up_to_date(cfg, gen);
            return s
                .planned(cfg, &vol, gen, up_to_date)?
                .end(cfg, &vol, state.as_ref(), console, pass, start)
                .map(|r| Attempt::Done(Box::new(r)));
        }
    }
    let (scanned, live) = rayon::join(
        || match recorded {
            Some(tree) => Ok((tree, None)),
            None => sources.scan(
                spool_in.filter(|_| !spooled),
                &cfg.filter,
                &cfg.verify_keys,
                cfg.trusting(),
                &Scanning {
                    kept: &warnings,
                    console: &console,
                },
            ),
        },
        || load_live(&vol, live_gen, &dest, &warnings, !cfg.checksum),
    );
    let ((mut tree, verified), mut live) = (scanned?, live?);
    // Unchanged since the live generation: the keys that verified it then.
    let verified = verified.unwrap_or_else(|| {
        live.manifest
            .as_ref()
            .map_or_else(Vec::new, |m| m.verified.clone())
    });
    // `--label auto` with a bundle that told its version only in the spool.
    // Sources unchanged since the live generation (`noop`) are not
    // spooled: the live label stands for what they hold.
    let late;
    let cfg = if cfg.label_auto && cfg.label.is_none() && !noop {
        late = resolve_label(cfg, &sources)?;
        late.as_ref().unwrap_or(cfg)
    } else {
        cfg
    };
    if let Some(d) = &damage {
        forget_damaged(&mut live, d);
    }
    let owners = adjust.mirrored;
    adjust.tree(&mut tree);

    // The recorded tree is compared by the quick check: it is the drift check.
    let by_content = match (noop, cfg.set_mtime) {
        (true, _) => 0,
        // The sources' mtimes are not kept: every file by its content.
        (false, Some(_)) => u64::MAX,
        (false, None) => sources.by_content(),
    };
    let plan = plan(cfg, &mut tree, &mut live, &sources, owners, by_content)?;
    if noop && !up_to_date(cfg, &plan, &live, &verified) {
        // Drift (or a new label): fetch after all.
        debug_assert!(shortcut);
        return Ok(Attempt::Again(None));
    }
    if (resumed || lent) && !sources.all.iter().all(|s| s.intact(&tree)) {
        // A file taken from the live generation drifted there (or a new
        // layer needed a lower one's file: that is said): fetch every
        // layer after all.
        let why = sources.all.iter().find_map(|s| s.why_not_intact());
        debug_assert!(shortcut);
        return Ok(Attempt::Again(why));
    }
    let names: Vec<&[u8]> = tree.entries.iter().map(|e| &*e.name).collect();
    let live_names: Option<Vec<&[u8]>> = live
        .tree
        .as_ref()
        .filter(|_| live.gen.is_some())
        .map(|t| t.entries.iter().map(|e| &*e.name).collect());
    let totals = Totals {
        empty: tree.is_empty(),
        live_nonempty: live.tree.as_ref().is_some_and(|t| !t.is_empty()),
        deleted: plan.deleted,
        names: &names,
        live_names: live_names.as_deref(),
    };
    let live_label = live.manifest.as_ref().and_then(|m| m.label.as_deref());
    let check = guards(cfg, &vol, &totals, live.gen.as_deref(), live_label)?;
    let up_to_date = up_to_date(cfg, &plan, &live, &verified);
    let counts = (tree.count(), tree.bytes());
    let mut summary = summary_of(cfg, &vol, counts, &plan, live.gen.as_deref(), up_to_date);
    if cfg.itemize {
        report::itemize(&plan, output, &mut summary);
    }
    if cfg.dry_run || up_to_date {
        let planned = Planned {
            summary,
            check,
            warnings,
            gen: live.gen.as_deref(),
            live_label,
            recorded: live_gen
                .and_then(LiveGen::header)
                .and_then(|h| h.label.as_deref()),
            up_to_date,
        };
        return planned
            .end(cfg, &vol, state.as_ref(), console, pass, start)
            .map(|r| Attempt::Done(Box::new(r)));
    }
    for w in warnings.take_warnings() {
        console.warn(&w);
    }
    for w in crate::label::warnings(
        &vol.display,
        cfg.label.as_ref(),
        live.gen.as_deref(),
        live_label,
        true,
    ) {
        console.warn(&w);
    }

    // Stage into this writer's own directory, removed whatever happens next.
    let state = match state {
        Some(state) if early.is_some() => state,
        _ => vol.state(true)?.expect("created"),
    };
    let mut staging = match early.take() {
        Some(stage) => stage,
        None => Stage::new(&state)?,
    };
    made.armed = false; // from here on, as for any source (`layout::prepare`)
    let swap = swap_for(&dest, cfg);
    layout::prepare(&vol, &state, &mut staging, fresh_state, swap)?;
    let caps = crate::caps::probe(staging.dir(), cfg.fsync).with_context(|| {
        let at = format!("{}/stage/{}", state.path.display(), staging.name);
        format!("cannot probe the volume at {at}")
    })?;
    console.begin(tree.count(), plan.copied_bytes);
    let job = stage::Job {
        sources: &sources.refs(),
        live: live.dir.as_ref().and_then(|d| d.root()),
        owners,
        reporter: &console,
        caps,
        heartbeat: Some(staging.dir()),
    };
    let staged = stage::run(&job, &mut tree, staging.dir())?;
    console.finish();
    let owners = owners && staged.owner_failures == 0;
    let manifest = manifest_of(cfg, &sources, owners, &caps, tree, verified);
    if cfg.verify {
        let rules = verify::Rules::of(&manifest);
        verify::staged(&staged.tree, &manifest.tree, rules)?;
    }
    note_staged(&mut summary, &staged, &console);
    drop(staged); // closes the staged tree before it moves into gen/
                  // A directory at DEST to take over is read now, while DEST is as it
                  // was, and kept once the swap has taken it out (`Publish::run`).
    let taken = match dest {
        Dest::Directory => crate::takeover::record(&vol, staging.dir(), &caps, cfg.fsync)?,
        _ => None,
    };
    let staged = Publish {
        vol: &vol,
        state: &state,
        staging,
        was_live: live.gen.as_deref(),
        caps,
        swap,
        spooled: None,
        taken,
    };
    staged
        .run(cfg, manifest, summary, console, start)
        .map(|r| Attempt::Done(Box::new(r)))
}

/// A staged tree and its manifest, to commit (`commit::run`), then retire.
struct Publish<'a> {
    vol: &'a Volume,
    state: &'a State,
    staging: Stage,
    was_live: Option<&'a str>,
    caps: crate::caps::Caps,
    swap: Swap,
    spooled: Option<&'a crate::manifest::Spooled>,
    /// The directory at DEST this commit takes over, read (`takeover::record`).
    taken: Option<crate::takeover::Recorded>,
}

impl Publish<'_> {
    fn run(
        self,
        cfg: &SyncConfig,
        mut manifest: Manifest,
        mut summary: Summary,
        console: Console,
        start: Instant,
    ) -> Result<Round> {
        let (vol, state) = (self.vol, self.state);
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
        if let (Some(rec), Some(at)) = (&self.taken, gen.taken_over) {
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

/// Whether a sync can be staged a directory at a time (`stage::stream`;
/// `--verify` then reads the staged tree back a directory at a time too):
/// sources that all list a directory at a time (with `--itemize`, once
/// `survey` has planned the changes it lists), without `--dry-run`
/// (planned by `survey`) or `--checksum` (it reads both trees), onto
/// nothing (a first sync:
/// `Some(None)`) or a live generation whose manifest indexes (an update:
/// `Some(Some(..))`; not where the volume does not show hardlinks, whose
/// groups come from the manifest). `None`: whole trees are compared.
fn streams(
    cfg: &SyncConfig,
    live: Option<&LiveGen>,
    dest: &Dest,
    sources: &Sources,
) -> Option<Option<Recorded>> {
    let plain = !cfg.dry_run
        && sources
            .all
            .iter()
            .all(|s| s.root().is_some() && s.lists_by_directory());
    match dest {
        Dest::Absent if plain => Some(None),
        Dest::Live(_) if plain => {
            let live = live?;
            let header = live.header()?.clone();
            if !header.hardlinks {
                return None;
            }
            let root = live.root_owned()?;
            // A manifest that does not index costs the streaming only.
            let index = live.index()?;
            Some(Some(Recorded {
                gen: live.gen.clone(),
                header,
                index,
                live: root,
            }))
        }
        _ => None,
    }
}

/// A dry run, `--itemize` or `--verify` planned a directory at a time
/// (`scan::plan_live`), with what its listings reported and the live
/// manifest's header: for sources that list a directory at a time
/// (directories; archives and images once spooled: a dry run's spool is
/// outside the volume) onto nothing or onto a live generation whose
/// manifest indexes and whose volume shows hardlinks, without `--set-mtime`
/// or `--label auto` (those compare or read whole trees).
/// `None` where it does not apply, where either side holds a hardlink
/// group, or at any error: the whole-tree path then plans (and says what
/// failed, as it always has).
fn survey(
    cfg: &SyncConfig,
    dest: &Dest,
    live: Option<&LiveGen>,
    sources: &Sources,
    adjust: &Adjust<'_>,
) -> Option<Surveyed> {
    // Spooled sources list a directory at a time once they are spooled.
    let applies = (cfg.dry_run || cfg.itemize || cfg.verify || cfg.checksum)
        && (!cfg.label_auto || cfg.label.is_some())
        && sources
            .all
            .iter()
            .all(|s| s.root().is_some() && s.lists_by_directory());
    if !applies {
        return None;
    }
    let (live, header, index) = match dest {
        Dest::Absent => (None, None, None),
        Dest::Live(_) => {
            let live = live?;
            let header = live.header()?.clone();
            if !header.hardlinks {
                return None;
            }
            // A manifest that does not index leaves the plan to whole trees.
            let index = live.index()?;
            (Some(live), Some(header), Some(index))
        }
        _ => return None,
    };
    let side = match (live, &header, &index) {
        (Some(live), Some(header), Some(index)) => {
            let side = scan::LiveSide {
                root: live.root().ok()?,
                label: &live.label,
                index,
                recorded: as_recorded(header),
            };
            Some(side)
        }
        _ => None,
    };
    let warnings = Collected::default();
    let survey = scan::Survey {
        sources: &sources.refs(),
        filter: &cfg.filter,
        reporter: &warnings,
        adjust: &|m, kind| adjust.meta(m, kind),
        compare: Compare {
            owners: adjust.mirrored,
            checksum: cfg.checksum,
            granularity_ns: header.as_ref().map_or(1, |m| m.granularity_ns),
            link_meta: header.as_ref().is_none_or(|m| m.link_meta),
            by_content: sources.compared_by_content(cfg),
            xattrs: true,
        },
        live: side,
        list: cfg.itemize,
    };
    let sv = scan::plan_live(&survey).ok().flatten()?;
    Some(Surveyed {
        sv,
        warnings,
        header,
    })
}

/// A plan made a directory at a time (`survey`): what it found, what its
/// listings reported, and the live manifest's header.
struct Surveyed {
    sv: scan::Surveyed,
    warnings: Collected,
    header: Option<Manifest>,
}

impl Surveyed {
    /// Show what `first` reported (a spool's warnings) before what the
    /// plan's listings did.
    fn after(&mut self, first: &Collected) {
        let mut all = first.take_warnings();
        all.extend(self.warnings.take_warnings());
        for w in all {
            self.warnings.warn(&w);
        }
    }

    fn live_label(&self) -> Option<&str> {
        self.header.as_ref().and_then(|h| h.label.as_deref())
    }

    /// Whether the live generation `gen` already is what the sources give.
    fn up_to_date(&self, cfg: &SyncConfig, gen: Option<&str>) -> bool {
        self.sv.plan.up_to_date()
            && gen.is_some()
            && (cfg.label.is_none() || cfg.label_text() == self.live_label())
    }

    /// The guards on what was planned: the names at the top of either side
    /// (the live listing's), whether either is empty, what goes.
    fn guards(&self, cfg: &SyncConfig, vol: &Volume, gen: Option<&str>) -> Result<layout::Check> {
        let sv = &self.sv;
        let names: Vec<&[u8]> = sv.top.iter().map(Vec::as_slice).collect();
        let live_names: Vec<&[u8]> = sv.live_top.iter().map(Vec::as_slice).collect();
        let totals = Totals {
            empty: sv.top.is_empty(),
            live_nonempty: !sv.live_top.is_empty(),
            deleted: sv.plan.deleted,
            names: &names,
            live_names: gen.map(|_| &live_names[..]),
        };
        guards(cfg, vol, &totals, gen, self.live_label())
    }

    /// A dry run, or a round found up to date: the guards, the summary,
    /// the changes where `--itemize` lists them.
    fn planned<'a>(
        &'a mut self,
        cfg: &SyncConfig,
        vol: &Volume,
        gen: Option<&'a str>,
        up_to_date: bool,
    ) -> Result<Planned<'a>> {
        let check = self.guards(cfg, vol, gen)?;
        let sv = &self.sv;
        let live_label = self.header.as_ref().and_then(|h| h.label.as_deref());
        let counts = (sv.entries, sv.bytes);
        let mut summary = summary_of(cfg, vol, counts, &sv.plan, gen, up_to_date);
        if cfg.itemize {
            report::itemize(&sv.plan, Output::of(cfg.json, cfg.quiet), &mut summary);
        }
        Ok(Planned {
            summary,
            check,
            warnings: std::mem::take(&mut self.warnings),
            gen,
            live_label,
            recorded: live_label,
            up_to_date,
        })
    }
}

/// A round found up to date by a compare a directory at a time (`Quick`):
/// the guards on the names at the top, then the end of any up-to-date round.
fn quick_end(
    cfg: &SyncConfig,
    vol: &Volume,
    state: Option<&State>,
    q: Quick,
    console: Console,
    pass: Pass,
    start: Instant,
) -> Result<Round> {
    let top: Vec<&[u8]> = q.compared.top.iter().map(Vec::as_slice).collect();
    let totals = Totals {
        empty: q.compared.entries == 0,
        live_nonempty: q.compared.entries != 0,
        deleted: 0,
        names: &top,
        live_names: Some(&top),
    };
    let check = guards(cfg, vol, &totals, Some(&q.gen), q.header.label.as_deref())?;
    let mut summary = Summary {
        dest: vol.display.clone(),
        entries: q.compared.entries,
        bytes: q.compared.bytes,
        previous: Some(q.gen.clone()),
        generation: Some(q.gen.clone()),
        label: cfg.label_text().map(str::to_string),
        status: "up to date",
        ..Default::default()
    };
    if cfg.itemize {
        report::itemize(
            &Plan::default(),
            Output::of(cfg.json, cfg.quiet),
            &mut summary,
        );
    }
    let planned = Planned {
        summary,
        check,
        warnings: q.warnings,
        gen: Some(&q.gen),
        live_label: q.header.label.as_deref(),
        recorded: q.header.label.as_deref(),
        up_to_date: true,
    };
    planned.end(cfg, vol, state, console, pass, start)
}

/// Spooled sources that hold what the live generation records, by content
/// (an archive made again with other bytes but the same tree, say), where
/// the live tree has not drifted from its manifest (`recorded_quick`):
/// up to date, as the quick compare finds a directory source.
fn spooled_quick(
    cfg: &SyncConfig,
    live: Option<&LiveGen>,
    sources: &Sources,
    adjust: &Adjust<'_>,
    recorded: Option<&Recorded>,
) -> Result<Option<Quick>> {
    let (Some(live), Some(rec)) = (live, recorded) else {
        return Ok(None);
    };
    // Verified then, not now: the record is news.
    if !rec.header.verified.is_empty() {
        return Ok(None);
    }
    let compare = Compare {
        owners: adjust.mirrored,
        checksum: false,
        // Recorded as the sources gave them: equal exactly.
        granularity_ns: 1,
        link_meta: rec.header.link_meta,
        by_content: sources.compared_by_content(cfg),
        xattrs: true,
    };
    // What this listing skips is reported by the scan that stages.
    let same = scan::same_as_recorded(
        &sources.refs(),
        &cfg.filter,
        &Collected::default(),
        &|m, kind| adjust.meta(m, kind),
        &rec.index,
        compare,
    )?;
    Ok(same.then(|| recorded_quick(cfg, live, adjust)).flatten())
}

/// The live generation a streamed update stages against.
struct Recorded {
    gen: String,
    /// Its manifest's header, and its entries by directory.
    header: Manifest,
    index: crate::index::Index,
    /// Its root, to hardlink unchanged files from.
    live: DirFd,
}

/// A sync staged a directory at a time: the sources are never held whole,
/// nor is the live generation's tree. The guards hold as before, before
/// anything is written: the names at the top and whether either side is
/// empty are listed first, and `--max-delete` counts what goes with one
/// walk of the sources beside the live manifest (`scan::count_deleted`).
struct StreamedRound<'a> {
    cfg: &'a SyncConfig,
    vol: &'a Volume,
    dest: &'a Dest,
    sources: &'a Sources,
    adjust: &'a Adjust<'a>,
    /// An update: what is live.
    recorded: Option<Recorded>,
    /// The plan made a directory at a time before staging (`--itemize`,
    /// `--verify`): the guards and the counts of changes are its (against
    /// the live listing, as the whole-tree path's), and `--itemize` lists
    /// its changes.
    surveyed: Option<Surveyed>,
}

impl StreamedRound<'_> {
    /// The round, or the console back when the staged tree would have
    /// joined two live files (`stage::stream` gives `None`): its staging
    /// directory is gone by then, and the caller takes the whole-tree path.
    fn run(
        self,
        console: Console,
        start: Instant,
        early: Option<Early<'_, '_>>,
    ) -> Result<Result<Round, Console>> {
        let (cfg, vol) = (self.cfg, self.vol);
        let refs = self.sources.refs();
        let mut top: Vec<crate::tree::Entry> = Vec::new();
        let mut root = Meta::default();
        // What this listing skips is reported once, by the stage.
        let quiet = Collected::default();
        for (i, s) in refs.iter().enumerate() {
            let r = s.root().expect("streams() checked");
            root = s.root_meta(&cfg.filter)?;
            let listed = s.list(r, b"", i as u16, &cfg.filter, &quiet)?;
            crate::tree::merge_entries(&mut top, listed);
        }
        self.adjust.meta(&mut root, Kind::Dir);
        let rec = self.recorded.as_ref();
        let gen = rec.map(|r| r.gen.as_str());
        let live_label = rec.and_then(|r| r.header.label.as_deref());
        // Only `--max-delete` needs to know what goes before staging: one
        // more walk of the sources, beside the live manifest (planned
        // already where the round was: then as planned).
        let deleted = match (rec, cfg.max_delete, &self.surveyed) {
            (_, _, Some(_)) => 0,
            (Some(r), Some(_), None) => scan::count_deleted(&refs, &cfg.filter, &r.index)?,
            _ => 0,
        };
        let output = Output::of(cfg.json, cfg.quiet);
        if let Some(s) = &self.surveyed {
            s.guards(cfg, vol, gen)?;
            // Listed before staging, as the whole-tree path lists them.
            if cfg.itemize && output != Output::Json {
                report::print_itemized(&s.sv.plan);
            }
        } else {
            let live_top = rec.map(|r| r.index.top()).transpose()?;
            let names: Vec<&[u8]> = top.iter().map(|e| &*e.name).collect();
            let live_names: Option<Vec<&[u8]>> = live_top
                .as_ref()
                .map(|t| t.iter().map(Vec::as_slice).collect());
            let totals = Totals {
                empty: top.is_empty(),
                live_nonempty: rec.is_some_and(|r| r.index.entries > 0),
                deleted,
                names: &names,
                live_names: live_names.as_deref(),
            };
            guards(cfg, vol, &totals, gen, live_label)?;
        }
        drop(top);
        if let Some(e) = &early {
            for w in e.kept.take_warnings() {
                console.warn(&w);
            }
        }
        for w in crate::label::warnings(&vol.display, cfg.label.as_ref(), gen, live_label, true) {
            console.warn(&w);
        }

        // Stage into this writer's own directory, removed whatever happens
        // next (made already where a spool is in it).
        let made;
        let (state, mut staging, fresh_state) = match early {
            Some(e) => {
                e.made.armed = false; // from here on, as for any source (`layout::prepare`)
                (e.state, e.stage, e.fresh)
            }
            None => {
                let fresh = vol.state(false)?.is_none();
                made = vol.state(true)?.expect("created");
                let stage = Stage::new(&made)?;
                (&made, stage, fresh)
            }
        };
        let swap = swap_for(self.dest, cfg);
        layout::prepare(vol, state, &mut staging, fresh_state, swap)?;
        let caps = crate::caps::probe(staging.dir(), cfg.fsync).with_context(|| {
            let at = format!("{}/stage/{}", state.path.display(), staging.name);
            format!("cannot probe the volume at {at}")
        })?;
        // An update's bar counts towards the live tree's size; a first sync's has no total.
        match rec {
            Some(r) => console.begin(r.index.entries, 0),
            None => console.begin(0, 0),
        }
        let job = stage::Job {
            sources: &refs,
            live: rec.map(|r| &r.live),
            owners: self.adjust.mirrored,
            reporter: &console,
            caps,
            heartbeat: Some(staging.dir()),
        };
        let adjust = self.adjust;
        let stream = stage::Stream {
            job: &job,
            filter: &cfg.filter,
            adjust: &|m, kind| adjust.meta(m, kind),
            root,
            label: cfg.label_text(),
            recorded: rec.map(|r| {
                let compare = Compare {
                    owners: adjust.mirrored,
                    checksum: false,
                    // Recorded as the source gave them: equal exactly.
                    granularity_ns: 1,
                    link_meta: r.header.link_meta,
                    // A spooled source's files by their content (every
                    // file's under `--set-mtime`).
                    by_content: self.sources.compared_by_content(cfg),
                    xattrs: true,
                };
                (&r.index, compare)
            }),
            checksum: cfg.checksum,
        };
        let Some(mut streamed) = stage::stream(&stream, staging.dir())? else {
            console.finish();
            drop(staging);
            return Ok(Err(console));
        };
        console.finish();
        let changes = match &self.surveyed {
            // As planned against the live listing.
            Some(s) => stage::Changes {
                added: s.sv.plan.added,
                changed: s.sv.plan.changed,
                deleted: s.sv.plan.deleted,
            },
            None => {
                // Counted again as staged: a source that changed since is
                // refused now, before the commit (staging is private and goes).
                max_delete(cfg, vol, streamed.changes.deleted)?;
                std::mem::take(&mut streamed.changes)
            }
        };
        let owners = adjust.mirrored && streamed.staged.owner_failures == 0;
        let manifest = Manifest {
            // What the stage wrote: its tree is never held.
            xattrs: streamed.xattrs,
            ..manifest_of(
                cfg,
                self.sources,
                owners,
                &caps,
                Tree::default(),
                Vec::new(),
            )
        };
        if cfg.verify {
            // Against the body the stage wrote, a directory at a time.
            let rules = verify::Rules::of(&manifest);
            verify::staged_by_directory(&streamed.staged.tree, staging.dir(), rules)?;
        }
        let mut summary = Summary {
            dest: vol.display.clone(),
            entries: streamed.body.entries,
            bytes: streamed.body.bytes,
            added: changes.added,
            changed: changes.changed,
            deleted: changes.deleted,
            previous: gen.map(str::to_string),
            label: cfg.label_text().map(str::to_string),
            ..Default::default()
        };
        if let (true, Some(s), Output::Json) = (cfg.itemize, &self.surveyed, output) {
            report::itemize(&s.sv.plan, output, &mut summary);
        }
        note_staged(&mut summary, &streamed.staged, &console);
        let stage::Streamed { staged, body, .. } = streamed;
        drop(staged); // closes the staged tree before it moves into gen/
        let publish = Publish {
            vol,
            state,
            staging,
            was_live: gen,
            caps,
            swap,
            spooled: Some(&body),
            taken: None,
        };
        publish.run(cfg, manifest, summary, console, start).map(Ok)
    }
}

/// A staging directory made before a round streams, because the spools of
/// its sources are in it (`source::spool_all`).
struct Early<'e, 'v> {
    state: &'e State,
    stage: Stage,
    /// The state directory was made for the spool.
    fresh: bool,
    made: &'e mut MadeState<'v>,
    /// What the spools reported, shown after the guards.
    kept: &'e Collected,
}

/// A round decided before anything is staged: up to date, or a dry run.
struct Planned<'a> {
    summary: Summary,
    check: layout::Check,
    /// What the scans reported, shown now.
    warnings: Collected,
    /// The live generation and its label.
    gen: Option<&'a str>,
    live_label: Option<&'a str>,
    /// The label its manifest's header records (what `--label auto`
    /// shows where the sources gave none), however its entries read.
    recorded: Option<&'a str>,
    up_to_date: bool,
}

impl Planned<'_> {
    /// Show the warnings; an up-to-date sync then settles (`settle`).
    fn end(
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

/// What the streaming compare found up to date.
struct Quick {
    gen: String,
    /// The live manifest's header.
    header: Manifest,
    compared: scan::Compared,
    warnings: Collected,
}

/// Whether the live generation already is what the sources give, decided
/// a directory at a time (`scan::compare_live`) with nothing whole held:
/// `None` where it is not, or where this compare does not apply and the
/// sync goes on to plan (`--dry-run`, which plans a directory at a time
/// itself; a DEST that is not a generation, a manifest that is missing or
/// gives the hardlink groups itself, a label to change, a source that is
/// not a directory, any error: the full path reports it).
fn quick(
    cfg: &SyncConfig,
    live: &LiveGen,
    sources: &Sources,
    adjust: &Adjust<'_>,
) -> Option<Quick> {
    if cfg.dry_run {
        return None;
    }
    let refs = sources.refs();
    if !refs
        .iter()
        .all(|s| s.root().is_some() && s.lists_by_directory())
    {
        return None;
    }
    let header = live.header()?.clone();
    // Directories only: compared by metadata, as a directory sync is (and
    // with `--checksum`, by both sides' bytes too).
    compare_quick(cfg, live, header, adjust, &refs, None)
}

/// `scan::compare_live` of the live generation `gen` (its manifest's
/// `header`) against `sources`, or against its own manifest (`recorded`):
/// a `Quick` when it is up to date. Files are compared by size, mtime and
/// mode (and, with `--checksum`, against the sources by their bytes; under
/// `--set-mtime`, the sources' bytes against the recorded hashes). `None`
/// where this compare does not apply (a new label, a volume without
/// hardlinks) or it found a difference.
fn compare_quick(
    cfg: &SyncConfig,
    live: &LiveGen,
    header: Manifest,
    adjust: &Adjust<'_>,
    sources: &[&dyn crate::source::Source],
    recorded: Option<&crate::index::Index>,
) -> Option<Quick> {
    if !header.hardlinks || (cfg.label.is_some() && cfg.label_text() != header.label.as_deref()) {
        return None;
    }
    // A listing shows no attributes, nor hashes: where the live generation
    // has attributes, or `--set-mtime` leaves only content to tell files
    // apart, each live entry still as recorded takes its manifest's (the
    // index costs one more pass over the manifest).
    let by_content = match (cfg.set_mtime, recorded) {
        (Some(_), None) => u64::MAX,
        _ => 0,
    };
    let index = match ((header.xattrs || by_content != 0), recorded) {
        (true, None) => Some(live.index()?),
        _ => None,
    };
    let warnings = Collected::default();
    let against = scan::Against {
        sources,
        live: live.root().ok()?,
        live_label: &live.label,
        filter: &cfg.filter,
        reporter: &warnings,
        adjust: &|m, kind| adjust.meta(m, kind),
        compare: Compare {
            owners: adjust.mirrored,
            checksum: false,
            granularity_ns: header.granularity_ns,
            link_meta: header.link_meta,
            by_content,
            // Against the sources: with the attributes the manifest gives
            // the live entries. The live tree against its own manifest (a
            // drift check): a listing has none to compare.
            xattrs: recorded.is_none(),
        },
        recorded,
        as_recorded: index.as_ref().map(|ix| (ix, as_recorded(&header))),
        // The live generation against its own manifest takes no `--checksum`.
        hash: cfg.checksum && recorded.is_none(),
    };
    // `--checksum` trusts no record: a manifest that does not read to its
    // end is written again, as the whole-tree path, reading every entry,
    // finds it must be.
    if against.hash && !reads_whole(live) {
        return None;
    }
    let compared = scan::compare_live(&against).ok().filter(|c| c.same)?;
    Some(Quick {
        gen: live.gen.clone(),
        header,
        compared,
        warnings,
    })
}

/// Whether every entry of the live manifest parses, read one at a time.
fn reads_whole(live: &LiveGen) -> bool {
    let Some(mut r) = live.body() else {
        return false;
    };
    let mut entries = crate::manifest::Entries::new(&mut r);
    loop {
        match entries.next_entry() {
            Ok(Some(_)) => {}
            Ok(None) => return true,
            Err(_) => return false,
        }
    }
}

/// Ask every SOURCE whether it still holds what the live generation's
/// manifest names for it (`Source::unchanged_since`): a remote kind
/// answers with one request (resolving a tag, a conditional GET), an
/// archive by hashing its file (no entry unpacked), before anything is
/// written, so a 401, a 404 or a server that is down fails here with the
/// volume untouched. Every source is asked (each remote one resolves now),
/// even after a no. The live generation when every one says yes; `None`
/// otherwise (no live generation, another number of sources,
/// `--checksum`, a directory source, `shortcut` off).
fn unchanged_live(
    cfg: &SyncConfig,
    sources: &Sources,
    live: Option<&LiveGen>,
    shortcut: bool,
) -> Result<Option<String>> {
    let header = match live {
        Some(live) if shortcut && !cfg.checksum => live
            .header()
            // Made under another `--set-mtime`: its tree has other mtimes.
            .filter(|h| h.set_mtime == cfg.set_mtime)
            // Under --verify-key: only if these keys verified every source then.
            .filter(|h| trusted_by(cfg, h, sources.all.len()))
            .map(|h| (&live.gen, h)),
        _ => None,
    };
    let recorded = header
        .as_ref()
        .map(|(_, h)| h.sources.as_slice())
        .filter(|r| r.len() == sources.all.len());
    let mut all = recorded.is_some();
    for (i, s) in sources.all.iter().enumerate() {
        let r = recorded.map_or("", |r| r[i].as_str());
        all &= s.unchanged_since(r)? && recorded.is_some();
    }
    Ok(header.filter(|_| all).map(|(gen, _)| gen.clone()))
}

/// Whether a generation's record says that one of `cfg`'s keys (or its
/// keyless identity) verified each of its `n` sources (always true
/// without --verify-key or --certificate-identity).
fn trusted_by(cfg: &SyncConfig, header: &Manifest, n: usize) -> bool {
    let keyless = cfg.remote.keyless.as_ref().and_then(|k| k.label());
    !cfg.trusting()
        || (0..n).all(|i| {
            header.verified.iter().any(|(at, fp)| {
                *at == i
                    && (cfg.verify_keys.iter().any(|k| &k.fingerprint == fp)
                        || keyless.as_ref() == Some(fp))
            })
        })
}

/// For sources unchanged since the live generation `gen`
/// (`unchanged_live`): whether its tree is still what its manifest
/// records, decided a directory at a time (`scan::compare_live` over the
/// manifest's index), so that the sync is up to date holding no whole
/// tree. `None` where it is not (drift: the whole-tree path below fetches
/// and repairs), or where this compare does not apply (`--dry-run`, a new
/// label, a volume without hardlinks, a manifest that does not index).
fn recorded_quick(cfg: &SyncConfig, live: &LiveGen, adjust: &Adjust<'_>) -> Option<Quick> {
    if cfg.dry_run || cfg.checksum {
        return None;
    }
    let header = live.header()?.clone();
    if !header.hardlinks || (cfg.label.is_some() && cfg.label_text() != header.label.as_deref()) {
        return None;
    }
    let index = live.index()?;
    // By size, mtime and mode, as the whole-tree drift check is.
    compare_quick(cfg, live, header, adjust, &[], Some(&index))
}

/// The live generation `gen`'s tree as its manifest records it, for
/// sources unchanged since (`unchanged_live`) where `recorded_quick` did
/// not find it up to date: nothing is fetched, and plan compares the live
/// tree with it by size, mtime and mode (file hashes left out), the drift
/// check. `None` if the manifest cannot be read.
fn recorded_tree(live: &LiveGen) -> Option<Tree> {
    let mut m = live.read()?;
    m.tree.for_each_mut(&mut |_, e| {
        if let Node::File(f) = &mut e.node {
            f.hash = None;
        }
    });
    Some(m.tree)
}

/// After `recorded_tree` said no: whether the one SOURCE can start from
/// the live generation (`Source::resume`: an image whose layers begin with
/// the ones the live generation applied, under the same platform, `//PATH`
/// and `shape_of`), so that only the layers above are fetched, onto the
/// live tree as its manifest records it. Asked before anything is written
/// (reading the image manifest is one request). `false` where the
/// whole-image shortcut does not apply, for several sources, `--dry-run`,
/// a filter, or a volume without hardlinks. The plan must then reuse every
/// file taken from the live generation (`Source::intact`), else the round
/// starts again without the shortcut: a drifted file is repaired.
fn resume_live(
    cfg: &SyncConfig,
    sources: &Sources,
    live: Option<&LiveGen>,
    shortcut: bool,
) -> Result<bool> {
    let Some(live) = live else {
        return Ok(false);
    };
    if !shortcut || cfg.checksum || cfg.dry_run || sources.all.len() != 1 {
        return Ok(false);
    }
    let Some(shape) = shape_of(cfg) else {
        return Ok(false);
    };
    let Some(header) = live
        .header()
        .filter(|h| h.hardlinks && h.sources.len() == 1)
    else {
        return Ok(false);
    };
    let Some(record) = header.layers_of(0) else {
        return Ok(false);
    };
    // The live tree as its manifest records it, and its root: a file a
    // new layer links to is read from there (checked by its hash).
    let base = || Some((live.checked()?.tree, live.root_owned()));
    sources.all[0].resume(record, &shape, &base)
}

/// Where the sync neither stands still nor resumes: offer each streamed
/// source the live generation's files by content (`Source::lend`), so a
/// zstd:chunked layer fetches only what the volume lacks. Read only if a
/// source asks (the live manifest, once). Where `resume_live`'s conditions
/// hold but for the record (one SOURCE, no filter, a volume of hardlinks,
/// the shortcut not refused this round), files the live generation holds
/// at the same path may be listed from it rather than spooled: then true,
/// and the plan must reuse each (`Source::intact`).
fn lend_live(
    cfg: &SyncConfig,
    sources: &Sources,
    live: Option<&LiveGen>,
    shortcut: bool,
) -> Result<bool> {
    let Some(live) = live else {
        return Ok(false);
    };
    if !sources.streamed() {
        return Ok(false);
    }
    let borrow = shortcut
        && !cfg.checksum
        && !cfg.dry_run
        && sources.all.len() == 1
        && shape_of(cfg).is_some()
        && live
            .header()
            .is_some_and(|h| h.hardlinks && h.sources.len() == 1);
    let base = || Some((live.checked()?.tree, live.root_owned()));
    for s in sources.all.iter().filter(|s| s.streamed()) {
        s.lend(&base, borrow)?;
    }
    Ok(borrow)
}

/// What shapes a generation's tree besides its sources (owners, `--chmod`),
/// as a short name a source's record keeps (`Source::record`). `None` with
/// `--exclude`/`--include`: their rules are not kept, so a tree made under
/// them is never resumed from.
fn shape_of(cfg: &SyncConfig) -> Option<String> {
    use sha2::Digest;
    if !cfg.filter.is_empty() {
        return None;
    }
    let a = Adjust::of(cfg);
    let mut text = format!("{:?} {:?} {}", a.owner, a.chmod, a.mirrored);
    if let Some(t) = cfg.set_mtime {
        text.push_str(&format!(" mtime {t}"));
    }
    let h = crate::escape::hex(&sha2::Sha256::digest(text.as_bytes()));
    Some(h[..16].to_string())
}

/// Nothing to stage: the live generation is the planned tree, under the
/// same label (a new label on the same content is a new generation).
/// A live generation whose manifest is missing or unreadable is not up to
/// date: the sync stages it again, and commit replaces the bad manifest.
fn up_to_date(cfg: &SyncConfig, plan: &Plan, live: &Live, verified: &[(usize, String)]) -> bool {
    let live_label = live.manifest.as_ref().and_then(|m| m.label.as_deref());
    plan.up_to_date()
        && live.gen.is_some()
        && live.manifest.is_some()
        && (cfg.label.is_none() || cfg.label_text() == live_label)
        // Verified now but not then (or by other keys): the record is news.
        && live.manifest.as_ref().is_some_and(|m| m.verified == verified)
}

/// The summary as planned: "up to date", or what a dry run would do, or
/// counts that staging completes (`note_staged`).
/// `entries` and `bytes`: the new tree's (`Tree::count`, `Tree::bytes`);
/// `gen`: the live generation.
fn summary_of(
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

/// The manifest of the staged tree, before commit seals it with its digest.
fn manifest_of(
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
fn note_staged(summary: &mut Summary, staged: &stage::Staged, console: &Console) {
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

/// The SOURCEs, each opened once: what is scanned is what is staged from.
struct Sources {
    all: Vec<Box<dyn Source>>,
}

impl Sources {
    /// Each SOURCE must be something `source::open` can read (exit 2 otherwise).
    fn open(cfg: &SyncConfig) -> Result<Sources> {
        Ok(Sources {
            all: source::open_all(&cfg.sources, &cfg.remote)?,
        })
    }

    fn refs(&self) -> Vec<&dyn Source> {
        self.all.iter().map(|s| &**s).collect()
    }

    /// A bit per source whose files are compared by content
    /// (`plan::Compare::by_content`): each that hashed its files as they
    /// streamed, or every one under `--set-mtime` (one mtime for every
    /// file: only content tells).
    fn compared_by_content(&self, cfg: &SyncConfig) -> u64 {
        match cfg.set_mtime {
            Some(_) => u64::MAX,
            None => self.by_content(),
        }
    }

    /// A bit per source that hashed its files as they streamed.
    fn by_content(&self) -> u64 {
        self.all
            .iter()
            .enumerate()
            .filter(|(_, s)| s.streamed())
            .fold(0, |bits, (i, _)| {
                bits | 1u64.checked_shl(i as u32).unwrap_or(0)
            })
    }

    /// Whether any source must be spooled before it is scanned.
    fn streamed(&self) -> bool {
        self.all.iter().any(|s| s.streamed())
    }

    /// Spool the streamed sources into `staging` (this writer's staging
    /// directory, or a dry run's scratch directory), then scan every source
    /// (each in parallel inside) and overlay them in order.
    /// With `keys`, each source's tree is checked as it is scanned
    /// (`trust::check`, exit 6), before any is staged: then the SOURCE
    /// index and fingerprint of the key that verified each.
    #[allow(clippy::type_complexity)]
    fn scan(
        &self,
        staging: Option<&DirFd>,
        filter: &Filter,
        keys: &[crate::trust::Key],
        trusting: bool,
        reporter: &dyn Reporter,
    ) -> Result<(Tree, Option<Vec<(usize, String)>>)> {
        if let Some(staging) = staging {
            source::spool_all(&self.refs(), staging, reporter)?;
        }
        if !trusting {
            return Ok((scan::run(&self.refs(), filter, reporter)?, None));
        }
        let verified = std::sync::Mutex::new(Vec::new());
        let tree = scan::run_each(&self.refs(), filter, reporter, &|i, s, t| {
            let fp = crate::trust::check(s, t, keys, filter)?;
            verified.lock().expect("not poisoned").push((i, fp));
            Ok(())
        })?;
        Ok((tree, Some(verified.into_inner().expect("not poisoned"))))
    }
}

/// The reporter of the scan: warnings kept for after the plan, as a
/// directory's are; bytes downloaded (remote sources) shown as they come.
struct Scanning<'a> {
    kept: &'a Collected,
    console: &'a Console,
}

impl Reporter for Scanning<'_> {
    fn begin(&self, _: u64, _: u64) {}
    fn advance(&self, _: u64) {}
    fn finish(&self) {}
    fn warn(&self, msg: &str) {
        self.kept.warn(msg);
    }
    fn skipped(&self, label: &str, path: &[u8], what: &str) {
        self.kept.skipped(label, path, what);
    }
    fn fetched(&self, bytes: u64) {
        self.console.fetched(bytes);
    }

    fn reused(&self, bytes: u64) {
        self.console.reused(bytes);
    }
}

/// A state directory made before the guards only to spool a streamed
/// source in: removed again (with the staging inside it), and so are the
/// directories made for DEST with it (`--mkpath`, a fanout DEST), when the
/// sync ends before it stages: an error, a refusal, a dry run.
struct MadeState<'a> {
    vol: &'a Volume,
    armed: bool,
}

impl Drop for MadeState<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let name = self.vol.state_name();
        let top = name.split(|b| *b == b'/').next().unwrap_or_default();
        if let Ok(parent) = self.vol.parent() {
            let _ = parent.remove_tree(top);
        }
        self.vol.unmake_parent();
    }
}

/// Open DEST's parent as the layout wants it, and refuse a DEST that a sync
/// must not replace: one inside a SOURCE (or holding one), a file, a symlink
/// packsync did not make, a directory with fanout.
fn open_dest(cfg: &SyncConfig, sources: &Sources) -> Result<(Volume, Dest)> {
    let base = Volume::open(&cfg.dest, cfg.mkpath && !cfg.dry_run)?;
    check_nested(&base)?;
    check_overlap(&base, sources)?;
    let vol = layout::open_for_sync(base, cfg)?;
    let dest = layout::inspect(&vol)?;
    layout::of(&vol).check_dest(&vol, &dest)?;
    Ok((vol, dest))
}

/// DEST one level too deep (exit 2): inside a tree packsync publishes (a
/// generation, which is never modified once committed) or a state
/// directory, or naming a state directory. DEST's parent is resolved (a
/// DEST link followed leads into a state directory), then each directory
/// from it up is looked at: a `.NAME.packsync` component, a directory
/// beside which `.NAME.packsync` holds generations (a `--layout dir`
/// tree, or a DEST link's target reached some other way), a fanout DEST.
fn check_nested(vol: &Volume) -> Result<()> {
    let parent = sys::canonicalize_existing(&vol.parent_path)
        .with_context(|| format!("cannot resolve {}", vol.parent_path.display()))?;
    if let Some(of) = state_of(&vol.name) {
        return Err(error::usage(format!(
            "{}: DEST is a packsync state directory; sync into {} instead",
            vol.display,
            parent.join(sys::os(of)).display()
        )));
    }
    let is_dir = |p: &std::path::Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir());
    for dir in parent.ancestors() {
        let Some(name) = dir.file_name() else {
            continue;
        };
        let up = dir.parent().unwrap_or(std::path::Path::new("/"));
        let refused = |inside: String, of: &std::path::Path| {
            Err(error::usage(format!(
                "{}: DEST is inside {inside} (a published generation is never modified); \
                 sync into {} itself",
                vol.display,
                of.display()
            )))
        };
        // `.NAME.packsync`: NAME beside it; fanout's `..packsync`: the DEST holding it.
        if let Some(of) = state_of(name.as_encoded_bytes()) {
            let of = match of {
                [] => up.to_path_buf(),
                _ => up.join(sys::os(of)),
            };
            let below: Vec<_> = parent.strip_prefix(dir).map_or(Vec::new(), |p| {
                p.components().map(|c| c.as_os_str().to_owned()).collect()
            });
            let inside = match below.as_slice() {
                [g, gen, ..] if g == "gen" => {
                    format!("generation {} of {}", gen.to_string_lossy(), of.display())
                }
                _ => format!("the state directory {} of {}", dir.display(), of.display()),
            };
            return refused(inside, &of);
        }
        let mut state = b".".to_vec();
        state.extend_from_slice(name.as_encoded_bytes());
        state.extend_from_slice(b".packsync");
        let beside = up.join(sys::os(&state)).join("gen");
        let fanout = dir.join(sys::os(crate::layout::fanout::STATE)).join("gen");
        if is_dir(&beside) || is_dir(&fanout) {
            return refused(format!("{}, which packsync publishes", dir.display()), dir);
        }
    }
    Ok(())
}

/// For a state directory's name (`.NAME.packsync`, or fanout's
/// `..packsync`), the NAME it belongs to (empty for fanout's).
fn state_of(name: &[u8]) -> Option<&[u8]> {
    name.strip_prefix(b".")?.strip_suffix(b".packsync")
}

/// DEST inside a SOURCE, or a SOURCE inside DEST (or its state directory).
fn check_overlap(vol: &Volume, sources: &Sources) -> Result<()> {
    let parent = sys::canonicalize_existing(&vol.parent_path)
        .with_context(|| format!("cannot resolve {}", vol.parent_path.display()))?;
    let dest = parent.join(sys::os(&vol.name));
    let state = parent.join(sys::os(&vol.state_name()));
    // Sources with a path on this host: DEST must not overlap them.
    for (src, label) in sources
        .all
        .iter()
        .filter_map(|s| Some((s.path()?, s.label())))
    {
        if dest.starts_with(src) {
            return Err(error::usage(format!(
                "{}: DEST is inside SOURCE {label}",
                vol.display
            )));
        }
        if src.starts_with(&dest) || src.starts_with(&state) {
            return Err(error::usage(format!(
                "{label}: SOURCE is inside DEST {}",
                vol.display
            )));
        }
    }
    Ok(())
}

/// The owners and modes the staged tree gets: `--chown`'s, the source's as
/// root, else ours, with setuid/setgid bits dropped from files (they would
/// mean something else on a file we cannot give its owner); then `--chmod`;
/// every mtime `--set-mtime`'s.
/// Applied entry by entry, to a whole tree or to a directory being compared.
#[derive(Clone, Copy)]
struct Adjust<'a> {
    owner: Option<Owner>,
    /// Whether owners are mirrored (and so compared).
    mirrored: bool,
    chmod: Option<&'a crate::chmod::Rules>,
    mtime: Option<crate::tree::Time>,
}

impl<'a> Adjust<'a> {
    fn of(cfg: &'a SyncConfig) -> Adjust<'a> {
        let (owner, mirrored) = match cfg.chown {
            Some(o) => (Some(o), true),
            None if sys::euid() == 0 => (None, true),
            None => (
                Some(Owner {
                    uid: sys::euid(),
                    gid: sys::egid(),
                }),
                false,
            ),
        };
        Adjust {
            owner,
            mirrored,
            chmod: cfg.chmod.as_ref(),
            mtime: cfg.set_mtime.map(|s| (s, 0).into()),
        }
    }

    fn meta(&self, m: &mut Meta, kind: Kind) {
        if let Some(owner) = self.owner {
            m.uid = owner.uid;
            m.gid = owner.gid;
            if !self.mirrored && kind != Kind::Dir {
                m.mode &= !0o6000;
            }
        }
        if let Some(rules) = self.chmod {
            if kind != Kind::Symlink {
                m.mode = rules.mode(m.mode, kind == Kind::Dir);
            }
        }
        if let Some(t) = self.mtime {
            m.mtime = t;
        }
    }

    /// `meta` for every entry of `tree`.
    fn tree(&self, tree: &mut Tree) {
        let owners_only = Adjust {
            chmod: None,
            ..*self
        };
        if self.owner.is_some() {
            owners_only.meta(&mut tree.root, Kind::Dir);
            tree.for_each_mut(&mut |_, e| {
                let kind = e.kind();
                owners_only.meta(&mut e.meta, kind)
            });
        }
        if let Some(rules) = self.chmod {
            rules.apply(tree);
        }
        if let Some(t) = self.mtime {
            tree.root.mtime = t;
            tree.for_each_mut(&mut |_, e| e.meta.mtime = t);
        }
    }
}

/// The live tree as it is on the volume, with hashes from its manifest where
/// the manifest still describes the file.
struct Live {
    gen: Option<String>,
    dir: Option<source::Dir>,
    tree: Option<Tree>,
    /// The live manifest's header (its entries were only streamed through).
    manifest: Option<Manifest>,
    /// The rest of the live manifest, while its hashes are not attached yet:
    /// only a sync that stages anything reads it.
    rest: Option<Box<dyn std::io::BufRead + Send>>,
}

impl Live {
    /// Nothing to compare with or reuse from (`gen`: what DEST pointed at).
    fn nothing(gen: Option<String>) -> Live {
        Live {
            gen,
            dir: None,
            tree: None,
            manifest: None,
            rest: None,
        }
    }
}

/// `lazy`: leave the manifest's entries for `attach_manifest` later (not
/// where its hardlink groups are needed to compare: `hardlinks 0`).
fn load_live(
    vol: &Volume,
    live: Option<&LiveGen>,
    dest: &Dest,
    warn: &Collected,
    lazy: bool,
) -> Result<Live> {
    match dest {
        Dest::Live(gen) => {
            let live = live.with_context(|| {
                format!("{} points into a missing state directory", vol.display)
            })?;
            let opened = match live.root() {
                Ok(fd) => fd.try_clone().map_err(anyhow::Error::from),
                Err(e) => Err(anyhow::anyhow!("{e:#}")),
            }
            .and_then(|fd| {
                let dir = source::Dir::new(fd, live.label.clone());
                let tree = dir.scan(0, &Filter::default(), warn)?;
                Ok((dir, tree))
            });
            let (dir, mut tree) = match opened {
                Ok(live) => live,
                Err(e) => {
                    // Removed since DEST was read (another writer replaced it and
                    // its grace ran out), or not a directory: nothing to reuse.
                    warn.warn(&format!(
                        "cannot read the live generation {gen}, copying everything: {e:#}"
                    ));
                    return Ok(Live::nothing(Some(gen.clone())));
                }
            };
            tree.assign_groups_by_inode();
            // A missing or unreadable manifest only costs reuse: every file is copied.
            let mut rest: Option<Box<dyn std::io::BufRead + Send>> = None;
            let manifest = live.header().cloned().and_then(|header| {
                let mut r = live.body()?;
                // Attributes are on no listing: they come from the manifest.
                if lazy && header.hardlinks && !header.xattrs {
                    rest = Some(Box::new(r));
                } else {
                    attach_manifest(&mut tree, &mut r, &header).ok()?;
                }
                Some(header)
            });
            Ok(Live {
                gen: Some(gen.clone()),
                dir: Some(dir),
                tree: Some(tree),
                manifest,
                rest,
            })
        }
        Dest::Directory => {
            let fd = vol
                .parent()
                .and_then(|p| p.open_dir(&vol.name))
                .with_context(|| format!("cannot open {}", vol.display))?;
            let dir = source::Dir::new(fd, vol.display.clone());
            let tree = dir.scan(0, &Filter::default(), warn)?;
            Ok(Live {
                tree: Some(tree),
                ..Live::nothing(None)
            })
        }
        _ => Ok(Live::nothing(None)),
    }
}

/// Make the live files a damage record names (`verify` found their bytes,
/// or more, differ from the manifest) compare as changed: the plan then
/// copies them from the source instead of linking them from the live
/// generation. Their mtime is set to one no source file has, and without
/// a hash no manifest line is attached to them.
fn forget_damaged(live: &mut Live, damage: &crate::damage::Damage) {
    let set: HashSet<&[u8]> = damage.paths.iter().map(Vec::as_slice).collect();
    let Some(tree) = live.tree.as_mut() else {
        return;
    };
    tree.for_each_mut(&mut |path, e| {
        if let Node::File(f) = &mut e.node {
            if damage.covers(&set, path) {
                f.hash = None;
                e.meta.mtime = crate::tree::Time { s: i64::MIN, ns: 0 };
            }
        }
    });
}

/// How a manifest's entry is matched with the listing of the file it
/// describes: by the rules the manifest records, attributes aside (no
/// listing reads them).
fn as_recorded(header: &Manifest) -> Compare {
    Compare {
        owners: header.owners,
        checksum: false,
        granularity_ns: header.granularity_ns,
        link_meta: header.link_meta,
        by_content: 0,
        xattrs: false,
    }
}

/// Copy each manifest hash onto the live file it still describes, and its
/// hardlink group where the volume does not show hardlinks (`hardlinks 0`).
/// Both are in pre-order, so one pass over each, holding one manifest entry
/// at a time.
fn attach_manifest(live: &mut Tree, r: &mut dyn std::io::BufRead, header: &Manifest) -> Result<()> {
    use std::cmp::Ordering;
    let mut entries = crate::manifest::Entries::new(r);
    let c = as_recorded(header);
    let mut next = entries.next_entry()?;
    if let Some((_, root)) = next.as_ref().filter(|(p, _)| p == b".") {
        let dir = |meta| crate::tree::Entry {
            name: Default::default(),
            meta,
            node: Node::Dir(Default::default()),
        };
        if plan::same_entry(&dir(root.meta), &dir(live.root), &c) {
            live.root.xattrs = root.meta.xattrs;
        }
        next = entries.next_entry()?;
    }
    let mut failed = None;
    live.for_each_mut(&mut |path, e| {
        while let Some((mp, _)) = &next {
            if crate::manifest::cmp_preorder(mp, path) != Ordering::Less {
                break;
            }
            next = entries.next_entry().unwrap_or_else(|err| {
                failed = Some(err);
                None
            });
        }
        let recorded = next
            .as_ref()
            .filter(|(mp, me)| mp.as_slice() == path && plan::same_entry(me, e, &c));
        if let Some((_, me)) = recorded {
            e.meta.xattrs = me.meta.xattrs;
        }
        if let Node::File(f) = &mut e.node {
            let mf = recorded.and_then(|(_, me)| match &me.node {
                Node::File(mf) => Some(mf),
                _ => None,
            });
            if let Some(mf) = mf {
                f.hash = mf.hash;
            }
            if !header.hardlinks {
                f.group = mf.and_then(|mf| mf.group);
            }
        }
    });
    live.share_group_hashes();
    match failed {
        Some(err) => Err(err),
        None => Ok(()),
    }
}

/// Compare the source tree with the live one, marking what can be reused.
/// `--checksum` hashes the candidates on both sides first; the live
/// manifest's hashes are read only when something is to be staged.
/// `by_content`: the sources whose files are compared by their hashes
/// (`plan::Compare::by_content`).
fn plan(
    cfg: &SyncConfig,
    tree: &mut Tree,
    live: &mut Live,
    sources: &Sources,
    owners: bool,
    by_content: u64,
) -> Result<Plan> {
    let compare = Compare {
        owners,
        checksum: cfg.checksum,
        granularity_ns: live.manifest.as_ref().map_or(1, |m| m.granularity_ns),
        link_meta: live.manifest.as_ref().is_none_or(|m| m.link_meta),
        by_content,
        xattrs: true,
    };
    if cfg.checksum || cfg.set_mtime.is_some() {
        if let Some(lt) = live.tree.as_ref() {
            hash_candidates(tree, lt, sources)?;
        }
    }
    if cfg.checksum {
        if let (Some(lt), Some(dir)) = (live.tree.as_mut(), live.dir.as_ref()) {
            scan::hash(lt, &[dir], &|e| matches!(e.node, Node::File(_)))?;
        }
    }
    // The list of changes costs a path per entry: only `--itemize` shows it.
    let plan_of = |tree: &mut Tree, live: Option<&Tree>| {
        if cfg.itemize {
            plan::build(tree, live, &compare)
        } else {
            plan::build_counted(tree, live, &compare)
        }
    };
    let mut plan = plan_of(tree, live.tree.as_ref());
    // The live hashes only matter for reuse: a sync that turns out up to
    // date never reads past the manifest's header.
    if let (Some(mut rest), Some(header), Some(lt)) =
        (live.rest.take(), live.manifest.as_ref(), live.tree.as_mut())
    {
        let relabel = cfg.label.is_some() && cfg.label_text() != header.label.as_deref();
        if !plan.up_to_date() || cfg.dry_run || relabel {
            // Entries that cannot be read only cost reuse: those files are copied.
            let _ = attach_manifest(lt, &mut rest, header);
            plan = plan_of(tree, Some(lt));
        }
    }
    Ok(plan)
}

/// With `--checksum` or `--set-mtime`, hash the source files that have a
/// live file of the same size (the only ones whose content decides
/// anything) and no hash yet (a spooled source hashed its files already).
fn hash_candidates(tree: &mut Tree, live: &Tree, sources: &Sources) -> Result<()> {
    let mut sizes = std::collections::HashMap::new();
    live.for_each(&mut |p, e| {
        if let Node::File(_) = e.node {
            sizes.insert(p.to_vec(), e.meta.size);
        }
    });
    // The hasher sees entries, not paths: pick the files by their identity
    // in the source (every link of a hardlinked file has the same content).
    let mut want = HashSet::new();
    tree.for_each(&mut |p, e| {
        if let Node::File(f) = &e.node {
            if f.hash.is_none() && sizes.get(p) == Some(&e.meta.size) {
                want.insert((f.src, f.dev, f.ino));
            }
        }
    });
    if want.is_empty() {
        return Ok(());
    }
    scan::hash(
        tree,
        &sources.refs(),
        &|e| matches!(&e.node, Node::File(f) if want.contains(&(f.src, f.dev, f.ino))),
    )
}

/// What the guards look at, from whole trees and their plan or from a
/// streaming compare (which only ever finds a tree up to date).
struct Totals<'a> {
    /// The sources hold no entry.
    empty: bool,
    live_nonempty: bool,
    deleted: u64,
    /// The names at the top of the new tree, and of the live generation.
    names: &'a [&'a [u8]],
    live_names: Option<&'a [&'a [u8]]>,
}

/// Refusals that must come before anything is written: an empty source
/// over a full tree, `--max-delete`, entries of other fanout slots (whose
/// check also says what the fanout links need), a downgrade of `--label`.
fn guards(
    cfg: &SyncConfig,
    vol: &Volume,
    t: &Totals<'_>,
    gen: Option<&str>,
    live_label: Option<&str>,
) -> Result<layout::Check> {
    if t.empty && t.live_nonempty && !cfg.allow_empty {
        return Err(error::refused(format!(
            "{}: refusing to replace a non-empty tree with an empty source (pass --allow-empty if that is intended)",
            vol.display
        )));
    }
    max_delete(cfg, vol, t.deleted)?;
    // The layout's own (fanout: other slots' entries, entries packsync did not make).
    let check = layout::of(vol).check(vol, t.names, t.live_names, cfg.adopt)?;
    let new = cfg
        .label
        .as_ref()
        .filter(|l| !range_moved(cfg, l, live_label));
    crate::label::guard(&vol.display, new, gen, live_label)?;
    Ok(check)
}

/// A label the sources gave (`--semver`'s tag, `--label auto`) is known
/// before anything is fetched: a downgrade is refused then, before a layer
/// is asked for or a spool made (the guards check again after the scan).
fn early_label_guard(cfg: &SyncConfig, vol: &Volume, live: Option<&LiveGen>) -> Result<()> {
    let (Some(new), Some(live)) = (cfg.label.as_ref(), live) else {
        return Ok(());
    };
    if !new.from_tag && !cfg.label_auto {
        return Ok(());
    }
    let live_label = live.header().and_then(|m| m.label.as_deref());
    let new = Some(new).filter(|l| !range_moved(cfg, l, live_label));
    crate::label::guard(&vol.display, new, Some(&live.gen), live_label)
}

/// Whether the live generation's label is a tag `--semver` no longer
/// matches (the range was moved on purpose, below it say): then a lower
/// chosen tag is what the range says, not a registry mirror behind, and
/// the downgrade guard lets it through.
fn range_moved(cfg: &SyncConfig, new: &Label, live_label: Option<&str>) -> bool {
    let (true, Some(choose), Some(live)) = (new.from_tag, &cfg.remote.choose, live_label) else {
        return false;
    };
    crate::semver::parse_tag(live).is_some_and(|v| !choose.range.matches(&v))
}

/// The label of this round where the sources give it: `--label auto`
/// takes the first SOURCE's version that names one (an image's
/// `org.opencontainers.image.version`, a bundle's `.manifest` `revision`),
/// and `--semver` without `--label` the tag it chose (the first image's
/// with `--semver`), so that the downgrade guard orders what is published.
/// `None`: the configuration's label stands. A source that names no
/// version, or one that is not a version, fails the round (exit 1).
fn resolve_label(cfg: &SyncConfig, sources: &Sources) -> Result<Option<SyncConfig>> {
    let by_tag = cfg.remote.choose.is_some() && cfg.label.is_none() && !cfg.label_auto;
    if !cfg.label_auto && !by_tag {
        return Ok(None);
    }
    let ordered = |text: &str| {
        if cfg.allow_downgrade {
            None
        } else {
            crate::label::parse(text)
        }
    };
    if by_tag {
        for s in &sources.all {
            if let Some((tag, _)) = s.chosen()? {
                let label = Label {
                    version: ordered(&tag),
                    text: tag,
                    from_tag: true,
                };
                return Ok(Some(SyncConfig {
                    label: Some(label),
                    ..cfg.clone()
                }));
            }
        }
        return Ok(None);
    }
    let mut found = None;
    for s in &sources.all {
        if s.version_in_spool() && s.root().is_none() {
            // Known once the sources are spooled: `round_on` asks again.
            return Ok(None);
        }
        if let Some(v) = s.version()? {
            found = Some((v, s.label()));
            break;
        }
    }
    let Some((text, from)) = found else {
        let names: Vec<&str> = sources.all.iter().map(|s| s.label()).collect();
        anyhow::bail!(
            "--label auto: no version in {} (an image's org.opencontainers.image.version annotation or config label, a bundle's .manifest revision)",
            names.join(", ")
        );
    };
    let version = ordered(&text);
    if version.is_none() && !cfg.allow_downgrade {
        anyhow::bail!(
            "--label auto: {from} names the version {text:?}, which is not a version such as v1.2.3 (pass --allow-downgrade to record it without ordering)"
        );
    }
    Ok(Some(SyncConfig {
        label: Some(Label {
            text,
            version,
            from_tag: false,
        }),
        ..cfg.clone()
    }))
}

/// `--max-delete`: refuse to delete more than that many entries.
fn max_delete(cfg: &SyncConfig, vol: &Volume, deleted: u64) -> Result<()> {
    match cfg.max_delete {
        Some(max) if deleted > max => Err(error::refused(format!(
            "{}: refusing to delete {deleted} entries, more than --max-delete {max}",
            vol.display
        ))),
        _ => Ok(()),
    }
}

/// How the commit replaces DEST: a real directory there is exchanged for
/// the link (the layout refuses where the filesystem cannot), or with
/// `--migrate` moved away first.
fn swap_for(dest: &Dest, cfg: &SyncConfig) -> Swap {
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
fn settle(
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
fn collect(cfg: &SyncConfig, vol: &Volume, state: &State, console: &Console) -> Vec<String> {
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
fn run_hook(
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
