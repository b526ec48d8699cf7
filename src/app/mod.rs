//! The pipeline: the only module that knows the order of the stages, and
//! the owner of the thread pool (rayon's global one).
//!
//! `round` reads as the story of one sync: validate → scan (sources and the
//! live tree) → plan → guards → stage → verify → commit → retire, each step
//! a call through its module; `sync` shows its report, or hands the whole
//! to the loop of `--every` (`sidecar`), which runs it again and again.
//! Each try of a round (`round_on`) opens what it works on once
//! (`Opened`), then ends at the first of its steps that applies: up to
//! date (`quick.rs`), directories a directory at a time (`streamed.rs`,
//! planned first by `survey.rs`), archives and images spooled and then the
//! same, or whole trees (`whole.rs`); `publish.rs` ends it. The functions
//! here are the joints between stages that belong to none of them: opening
//! what the command line named, the guards, giving the tree its owners.
//! Every other command is one call into `ops`.

use std::time::Instant;

use anyhow::{Context, Result};

use crate::config::{self, Command, Config, Owner, SyncConfig};
use crate::error;
use crate::filter::Filter;
use crate::label::Label;
use crate::layout;
use crate::live::LiveGen;
use crate::manifest::Manifest;
use crate::ops;
use crate::plan::Compare;
use crate::report::{self, Collected, Console, Output, Reporter, Round};
use crate::retire::{self};
use crate::scan;
use crate::sidecar::Pass;
use crate::source::{self, Source};
use crate::sys::{self, DirFd};
use crate::tree::{Kind, Meta, Tree};
use crate::volume::{Dest, State, Volume};

mod publish;
mod quick;
mod streamed;
mod survey;
mod whole;

use quick::{quick, quick_end, recorded_quick, unchanged_live};
use streamed::{Avoid, Step, StreamedRound};

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
/// before this runs in the pool): the fewer threads where DEST and every
/// directory SOURCE are on local filesystems (other sources are fetched
/// onto DEST's volume), for an update or a no-op, and for a first sync
/// whose sources are all spooled (archives, images, bundles: their bytes
/// are written as they are spooled, on one thread, and the stage only
/// moves the files into place). A filesystem that cannot be told counts
/// as networked.
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
    let copies = sources.all.iter().any(|s| !s.streamed());
    let first = !matches!(dest, Dest::Live(_));
    build_pool(pool_threads(networked || (first && copies)));
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
    let shown = report::Shown::default();
    let err = match round_with(cfg, pass, (None, &shown)) {
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
    round_with(cfg, pass, (Some(line), &shown))
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
/// is tried again without the shortcut, spooled sources still streamed.
/// Where a stage found the live tree's hardlinks drifted from its manifest
/// (two files joined, a group split), the round is tried again without
/// shortcuts, staged a directory at a time still but avoiding what drifted
/// (`stage::Drifted`: those paths are copied); only where that try finds
/// drift again, once more as whole trees. Each try drops something the
/// one before took, and avoiding is asked once, so there are four at most.
/// `told`: a warning to show first, and what the round has shown already
/// (where the volume was full and it starts again): a warning each try
/// meets is shown once.
fn round_with(
    cfg: &SyncConfig,
    pass: Pass,
    told: (Option<String>, &report::Shown),
) -> Result<Round> {
    let start = Instant::now();
    let (mut note, shown) = told;
    let mut next = Some(Try::Shortcut);
    // What a stage found drifted in the live tree's hardlinks, avoided by
    // the tries after it.
    let mut avoid = None;
    while let Some(this) = next {
        // Validate: nothing is written before the guards have passed.
        crate::source::spool::limit_entries(cfg.max_entries);
        let sources = Sources::open(cfg)?;
        // `--semver` lists tags and `--label auto` reads versions first: the
        // label (and so the guards) of this round depend on them.
        let resolved = resolve_label(cfg, &sources)?;
        let cfg = resolved.as_ref().unwrap_or(cfg);
        let chosen = chosen_of(&sources)?;
        let tried = (this, avoid.as_ref());
        let mut round = match round_on(cfg, sources, pass, tried, (note.take(), shown), start)? {
            Attempt::Done(round) => *round,
            // Drift: why, where it is worth saying.
            Attempt::Again {
                why,
                whole,
                avoid: found,
            } => {
                note = why;
                next = match found {
                    // Asked only where nothing was avoided yet.
                    Some(found) => {
                        avoid = Some(found);
                        Some(Try::Plain)
                    }
                    None => this.after(whole),
                };
                continue;
            }
        };
        round.summary.chosen = chosen;
        return Ok(round);
    }
    // A whole-tree try neither takes a shortcut nor streams a spool, so it
    // never asks again; a stage avoids what drifted once at most.
    anyhow::bail!("the round asked to start again after its last try")
}

/// Which try of a round this is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Try {
    /// The shortcuts where they apply: sources unchanged since the live
    /// generation, an image resumed from it or lent its files.
    Shortcut,
    /// No shortcut; spooled sources streamed a directory at a time.
    Plain,
    /// No shortcut, and spooled sources as whole trees.
    Whole,
}

impl Try {
    /// The try after this one asked again; `whole`: the live tree's
    /// hardlinks drifted from its manifest once a spool was moved out, and
    /// a try that avoided what drifted found it again: whole trees, which
    /// see the live inodes, take it.
    fn after(self, whole: bool) -> Option<Try> {
        match (self, whole) {
            (Try::Shortcut, false) => Some(Try::Plain),
            (Try::Shortcut | Try::Plain, _) => Some(Try::Whole),
            (Try::Whole, _) => None,
        }
    }
}

/// What one try of a round came to: done, or to be tried again (`Try::after`),
/// with why where it is worth saying; or again without shortcuts, staged
/// avoiding what a stage found drifted in the live tree's hardlinks.
enum Attempt {
    Done(Box<Round>),
    Again {
        why: Option<String>,
        whole: bool,
        avoid: Option<Avoid>,
    },
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

/// `round_with`, on the sources opened (and the label resolved): the
/// story of one try, each step ending the round where it can.
fn round_on(
    cfg: &SyncConfig,
    sources: Sources,
    pass: Pass,
    (this, avoid): (Try, Option<&Avoid>),
    told: (Option<String>, &report::Shown),
    start: Instant,
) -> Result<Attempt> {
    let (r, console) = Opened::open(cfg, sources, pass, (this, avoid), told, start)?;
    // 1. Up to date, found a directory at a time (the sources against the
    //    live generation, or sources unchanged since it against its
    //    manifest): nothing was held whole.
    let quick = r
        .live()
        .filter(|_| r.damage.is_none() && !r.trusting)
        .and_then(|live| {
            quick(cfg, live, &r.sources, &r.adjust).or_else(|| {
                r.same_gen.as_ref()?;
                recorded_quick(cfg, live, &r.adjust)
            })
        });
    if let Some(q) = quick {
        return quick_end(cfg, &r.vol, r.state.as_ref(), q, console, pass, start)
            .map(|r| Attempt::Done(Box::new(r)));
    }
    // 2. Directories: planned first where a mode lists or checks the
    //    changes, then staged, a directory at a time.
    let console = match streamed::directories(&r, console)? {
        Step::Done(done) => return Ok(done),
        Step::Next(console) => *console,
    };
    // 3. Archives and images: spooled, then as directories; 4. what no
    //    directory-at-a-time step takes: whole trees.
    whole::spooled_or_whole(r, console)
}

/// What one try of a round works on, each opened once: the sources,
/// DEST's volume and what DEST is, the state directory, the live
/// generation (its root, its manifest and the manifest's header), the
/// damage record `verify` left, and what the sources said of the live
/// generation.
struct Opened<'a> {
    cfg: &'a SyncConfig,
    sources: Sources,
    vol: Volume,
    dest: Dest,
    state: Option<State>,
    live_gen: Option<LiveGen>,
    /// Files `verify` found damaged: the live manifest is not to be trusted
    /// for them, so no shortcut that trusts it (the quick compare, sources
    /// unchanged since the live generation, a spooled source streamed)
    /// runs, and every plan and stage compares them as changed
    /// (`Damaged::forget`): they are copied afresh.
    damage: Option<crate::damage::Damaged>,
    adjust: Adjust<'a>,
    /// The live generation, where every SOURCE says it still holds what
    /// that generation was made from (`unchanged_live`).
    same_gen: Option<String>,
    /// Which try of the round this is (`round_with`).
    this: Try,
    /// What a stage of an earlier try found drifted in the live tree's
    /// hardlinks: avoided where it is the same live generation.
    avoid: Option<&'a Avoid>,
    /// With --verify-key, where a source is verified after its scan (a
    /// bundle in a directory among several sources; a spooled bundle
    /// until it is spooled): no shortcut that skips the scan runs, but for sources
    /// unchanged since a live generation those same keys verified
    /// (`unchanged_live`). Not where every source is an image, which
    /// checks its cosign signature as its digest is resolved
    /// (`unchanged_live` does that for every one before anything is
    /// written): those stream as any image does (`Sources::verified_early`).
    trusting: bool,
    pass: Pass,
    start: Instant,
}

impl<'a> Opened<'a> {
    /// Open DEST and the live generation, read the damage record, ask the
    /// sources about the live generation (remote identities are resolved
    /// here, before anything is written); the console, `note` shown first.
    fn open(
        cfg: &'a SyncConfig,
        sources: Sources,
        pass: Pass,
        (this, avoid): (Try, Option<&'a Avoid>),
        (note, shown): (Option<String>, &report::Shown),
        start: Instant,
    ) -> Result<(Opened<'a>, Console)> {
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
        let console = if pass.defer_warnings {
            Console::keeping(output, show)
        } else {
            Console::new(output, show)
        }
        .in_round(shown);
        if let Some(n) = note {
            console.warn(&n);
        }

        let state = vol.state(false)?;
        // The live generation, opened once for the whole round: its root, its
        // manifest and the manifest's header.
        let live_gen = match (&dest, state.as_ref()) {
            (Dest::Live(gen), Some(state)) => Some(LiveGen::open(&vol, state, gen)),
            _ => None,
        };
        early_label_guard(cfg, &vol, live_gen.as_ref())?;
        let damage = match (&dest, state.as_ref()) {
            (Dest::Live(gen), Some(state)) if !cfg.checksum => {
                crate::damage::read_or_warn(state, gen, &|w| console.warn(w)).map(|d| d.lookup())
            }
            _ => None,
        };
        let adjust = Adjust::of(cfg);
        let shortcut = this == Try::Shortcut && damage.is_none();
        let same_gen = unchanged_live(cfg, &sources, live_gen.as_ref(), shortcut)?;
        // Images were checked as they resolved; a spooled bundle is
        // checked once spooled (`check_listed`). A bundle in a directory
        // (the one SOURCE) is checked over its listing now, before
        // anything is written, and the tree staged from it again before it
        // is published (`check_directory`): a file changed in between is
        // caught there. Several sources with one in a directory: checked
        // over their scanned trees, which the whole-tree stage copies only
        // as scanned.
        if trusting && same_gen.is_none() {
            sources.check_directory(cfg, &Collected::default())?;
        }
        let trusting = trusting && sources.verified_early(cfg).is_none();
        let r = Opened {
            cfg,
            sources,
            vol,
            dest,
            state,
            live_gen,
            damage,
            adjust,
            same_gen,
            this,
            avoid,
            trusting,
            pass,
            start,
        };
        Ok((r, console))
    }

    /// Shortcuts allowed this try: on the first only, and not with damage.
    fn shortcut(&self) -> bool {
        self.this == Try::Shortcut && self.damage.is_none()
    }

    /// The live generation, where DEST has one.
    fn live(&self) -> Option<&LiveGen> {
        self.live_gen.as_ref()
    }

    /// A round staged a directory at a time onto `onto`, not planned first.
    fn streamed_round(&self, onto: streamed::Onto) -> StreamedRound<'_> {
        StreamedRound {
            cfg: self.cfg,
            vol: &self.vol,
            dest: &self.dest,
            sources: &self.sources,
            adjust: &self.adjust,
            onto,
            surveyed: None,
            damaged: self.damage.as_ref(),
            avoid: self.avoid,
        }
    }

    /// What a stage that stopped short (`redo`) asks of the round, where
    /// it asks anything: where the live tree's hardlinks drifted from its
    /// manifest and no earlier try avoided anything, another try that
    /// avoids what drifted (a directory at a time still). `None` where a
    /// try already did: the caller takes whole trees.
    fn again(&self, redo: crate::stage::Redo) -> Option<Attempt> {
        again(redo, self.avoid, self.live())
    }
}

/// `Opened::again`, on its parts.
fn again(
    redo: crate::stage::Redo,
    avoided: Option<&Avoid>,
    live: Option<&LiveGen>,
) -> Option<Attempt> {
    let (crate::stage::Redo::Links(drifted), None, Some(live)) = (redo, avoided, live) else {
        return None;
    };
    Some(Attempt::Again {
        why: None,
        whole: false,
        avoid: Some(Avoid {
            gen: live.gen.clone(),
            drifted,
        }),
    })
}

/// `--itemize`, `--verify` and `--checksum` are planned first, against
/// the live listing, as the whole-tree path plans them; so is a sync onto
/// a generation `verify` found damaged, which may be up to date all the
/// same (the record named what has been put back since), and whose plan
/// the record changes.
fn planned_first(cfg: &SyncConfig, damaged: bool) -> bool {
    cfg.itemize || cfg.verify || cfg.checksum || damaged
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

/// The SOURCEs, each opened once: what is scanned is what is staged from.
struct Sources {
    all: Vec<Box<dyn Source>>,
    /// Under `--verify-key`: every source's key, once each was checked a
    /// directory at a time (`check_listed`).
    checked: std::sync::OnceLock<Vec<(usize, String)>>,
    /// A bundle in a directory checked over its listing
    /// (`check_directory`): the key that verified it, which must verify
    /// the staged tree again before it is published.
    recheck: std::sync::OnceLock<String>,
}

impl Sources {
    /// Whether every source lists a directory at a time from a root of
    /// its own (a directory; an archive or image once spooled).
    fn list_by_directory(&self) -> bool {
        self.all
            .iter()
            .all(|s| s.root().is_some() && s.lists_by_directory())
    }

    /// Each SOURCE must be something `source::open` can read (exit 2 otherwise).
    fn open(cfg: &SyncConfig) -> Result<Sources> {
        Ok(Sources {
            all: source::open_all(&cfg.sources, &cfg.remote)?,
            checked: std::sync::OnceLock::new(),
            recheck: std::sync::OnceLock::new(),
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

    /// Under `--verify-key` (or a keyless identity): the SOURCE index and
    /// key of each source, where every one is checked already: an image as
    /// it was resolved, before anything was written (its cosign signature,
    /// with its digest), or every source by `check_listed`. `None` where
    /// one is still to be checked (a bundle's `/.signatures.json`, over
    /// its listing or its scanned tree). Without keys, none.
    fn verified_early(&self, cfg: &SyncConfig) -> Option<Vec<(usize, String)>> {
        if !cfg.trusting() {
            return Some(Vec::new());
        }
        if let Some(checked) = self.checked.get() {
            return Some(checked.clone());
        }
        self.all
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let image = crate::trust::is_image(s.label());
                Some((i, s.verified_by().filter(|_| image)?))
            })
            .collect()
    }

    /// Under `--verify-key`, once the streamed sources are spooled (a
    /// spool is private to this writer: what is checked is what is
    /// staged), where every source is spooled or an image: each bundle's
    /// signature checked a directory at a time (`trust::check_listed`;
    /// exit 6 naming the first that is not trusted, before anything is
    /// staged), so that `verified_early` gives their keys. False where a
    /// source is a directory (see `check_directory`).
    fn check_listed(&self, cfg: &SyncConfig, reporter: &dyn Reporter) -> Result<bool> {
        if self.verified_early(cfg).is_some() {
            return Ok(true);
        }
        if !self
            .all
            .iter()
            .all(|s| s.owns_root() && s.root().is_some() && s.lists_by_directory())
        {
            return Ok(false);
        }
        let mut keys = Vec::with_capacity(self.all.len());
        for (i, s) in self.all.iter().enumerate() {
            keys.push((
                i,
                crate::trust::check_listed(&**s, &cfg.verify_keys, &cfg.filter, reporter)?,
            ));
        }
        let _ = self.checked.set(keys);
        Ok(true)
    }

    /// Under `--verify-key`, where the one SOURCE is a bundle in a
    /// directory: its signature checked over its listing, a directory at
    /// a time (`trust::check_listed`: exit 6 naming it, before anything is
    /// written), so that it plans and stages a directory at a time too.
    /// The directory may change between that listing and the stage's, so
    /// the staged tree is checked again before it is published
    /// (`recheck`, `trust::check_staged`): what was checked then is what
    /// is published. False where it does not apply (several sources: the
    /// whole-tree path checks each scanned tree, and stages what it
    /// scanned).
    fn check_directory(&self, cfg: &SyncConfig, reporter: &dyn Reporter) -> Result<bool> {
        let [s] = &self.all[..] else {
            return Ok(false);
        };
        let bundle = !s.streamed()
            && !s.owns_root()
            && s.root().is_some()
            && s.lists_by_directory()
            && !crate::trust::is_image(s.label());
        if !bundle || self.verified_early(cfg).is_some() {
            return Ok(false);
        }
        let fp = crate::trust::check_listed(&**s, &cfg.verify_keys, &cfg.filter, reporter)?;
        // The signature's list is gone: give its pages back before the
        // stage, which checks the staged tree against a list of its own.
        crate::sys::release_free_memory();
        let _ = self.recheck.set(fp.clone());
        let _ = self.checked.set(vec![(0, fp)]);
        Ok(true)
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
        hardlinks: header.hardlinks,
    }
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
