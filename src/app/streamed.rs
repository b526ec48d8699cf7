//! A sync staged a directory at a time (`StreamedRound` → `stage::stream`):
//! the sources and the live generation are never held whole.

use std::time::Instant;

use anyhow::{Context, Result};

use crate::config::SyncConfig;
use crate::index::Index;
use crate::layout;
use crate::live::LiveGen;
use crate::manifest::Manifest;
use crate::plan::Compare;
use crate::report::{self, Collected, Console, Output, Reporter, Round, Summary};
use crate::scan;
use crate::stage;
use crate::staging::Stage;
use crate::sys::DirFd;
use crate::tree::{Kind, Meta, Tree};
use crate::verify;
use crate::volume::{Dest, State, Volume};

use super::publish::{manifest_of, note_staged, swap_for, Publish};
use super::survey::{self, survey, Surveyed};
use super::{
    guards, max_delete, planned_first, Adjust, Attempt, MadeState, Opened, Sources, Totals,
};

/// Whether a sync can be staged a directory at a time (`stage::stream`;
/// `--verify` then reads the staged tree back a directory at a time too),
/// and onto what: sources that all list a directory at a time (with
/// `--itemize`, once `survey` has planned the changes it lists), without
/// `--dry-run` (planned by `survey`), onto nothing (a first sync), a live
/// generation whose manifest indexes (an update; where the volume does
/// not show hardlinks, its groups are the manifest's), or a live tree
/// with no manifest to read (`Onto::Listed`: planned by `survey` first;
/// a manifest that does not index is read as none). `None`: whole trees
/// are compared.
pub(super) fn streams(
    cfg: &SyncConfig,
    live: Option<&LiveGen>,
    dest: &Dest,
    sources: &Sources,
) -> Option<Onto> {
    streams_given(cfg, live, dest, sources, None)
}

/// `streams`, with the live manifest's index where a plan made first
/// (`survey`) built it already: else it is built here.
pub(super) fn streams_given(
    cfg: &SyncConfig,
    live: Option<&LiveGen>,
    dest: &Dest,
    sources: &Sources,
    index: Option<Index>,
) -> Option<Onto> {
    let plain = !cfg.dry_run && sources.list_by_directory();
    if !plain {
        return None;
    }
    if survey::bare(dest, live) {
        return Some(Onto::Listed {
            gen: live.map(|l| l.gen.clone()),
        });
    }
    match dest {
        Dest::Absent => Some(Onto::Nothing),
        Dest::Live(_) => {
            let live = live?;
            let header = live.header()?.clone();
            let root = live.root_owned()?;
            // A manifest that does not index (cut short, out of order) is
            // not trusted for any file: as one that is missing.
            let Some(index) = index.or_else(|| live.index()) else {
                return Some(Onto::Listed {
                    gen: Some(live.gen.clone()),
                });
            };
            Some(Onto::Recorded(Box::new(Recorded {
                gen: live.gen.clone(),
                header,
                index,
                live: root,
            })))
        }
        _ => None,
    }
}

/// What a streamed round stages onto.
pub(super) enum Onto {
    /// Nothing: a first sync.
    Nothing,
    /// A live generation whose manifest indexes: files recorded with the
    /// same metadata are hardlinked from it.
    Recorded(Box<Recorded>),
    /// A live tree with no manifest to read (a DEST that is a plain
    /// directory to take over, `gen` `None`; a live generation `gen` whose
    /// manifest is missing, or does not index): the round is planned
    /// first against its listing (`survey`); every file is copied, but
    /// under `--checksum`, where one equal by its listed metadata is
    /// hardlinked if its bytes are the source's (`stage::Against::Listed`).
    Listed { gen: Option<String> },
}

impl Onto {
    pub(super) fn recorded(&self) -> Option<&Recorded> {
        match self {
            Onto::Recorded(r) => Some(r),
            _ => None,
        }
    }

    /// Whether the round must be planned first, against the listing.
    pub(super) fn listed(&self) -> bool {
        matches!(self, Onto::Listed { .. })
    }

    /// The live generation replaced, if any.
    fn gen(&self) -> Option<&str> {
        match self {
            Onto::Nothing => None,
            Onto::Recorded(r) => Some(&r.gen),
            Onto::Listed { gen } => gen.as_deref(),
        }
    }
}

/// The live generation a streamed update stages against.
pub(super) struct Recorded {
    pub(super) gen: String,
    /// Its manifest's header, and its entries by directory.
    pub(super) header: Manifest,
    pub(super) index: crate::index::Index,
    /// Its root, to hardlink unchanged files from.
    pub(super) live: DirFd,
}

/// A sync staged a directory at a time: the sources are never held whole,
/// nor is the live generation's tree. The guards hold as before, before
/// anything is written: the names at the top and whether either side is
/// empty are listed first, and `--max-delete` counts what goes with one
/// walk of the sources beside the live manifest (`scan::count_deleted`).
pub(super) struct StreamedRound<'a> {
    pub(super) cfg: &'a SyncConfig,
    pub(super) vol: &'a Volume,
    pub(super) dest: &'a Dest,
    pub(super) sources: &'a Sources,
    pub(super) adjust: &'a Adjust<'a>,
    /// What is staged onto: nothing, the live generation, or a live tree
    /// known only by its listing.
    pub(super) onto: Onto,
    /// The plan made a directory at a time before staging (`--itemize`,
    /// `--verify`): the guards and the counts of changes are its (against
    /// the live listing, as the whole-tree path's), and `--itemize` lists
    /// its changes.
    pub(super) surveyed: Option<Surveyed>,
    /// Files `verify` found damaged in the live generation: copied afresh.
    pub(super) damaged: Option<&'a crate::damage::Damaged>,
    /// What an earlier try of this round found drifted in the live tree's
    /// hardlinks (`Avoid`), where it is the same live generation.
    pub(super) avoid: Option<&'a Avoid>,
}

/// What a stage found drifted in the live tree's hardlinks, and the live
/// generation it found it in: the next try stages onto that generation
/// avoiding it (`stage::Stream::avoid`), a directory at a time still.
#[derive(Debug)]
pub(super) struct Avoid {
    pub(super) gen: String,
    pub(super) drifted: stage::Drifted,
}

impl StreamedRound<'_> {
    /// The round, or the console back with why the stage stopped short
    /// (`stage::Redo`): the live tree's hardlinks are not its manifest's
    /// (the staged tree would have joined two live files, or a recorded
    /// group was split on the volume), or a file a spool listed from the
    /// live generation was not as recorded. Its staging directory is gone
    /// by then.
    pub(super) fn run(
        self,
        console: Console,
        start: Instant,
        early: Option<Early<'_, '_>>,
    ) -> Result<Result<Round, (Console, stage::Redo)>> {
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
        let rec = self.onto.recorded();
        let gen = self.onto.gen();
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
            // What the live listing skipped (no stage lists it again).
            for w in s.live_warnings.take_warnings() {
                console.warn(&w);
            }
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
            // An empty source against a live tree its manifest says is
            // empty: whatever was dropped into it since counts, as the
            // whole-tree path sees the tree.
            let live_nonempty = rec.is_some_and(|r| {
                r.index.entries > 0
                    || (top.is_empty() && r.live.list().is_ok_and(|l| !l.is_empty()))
            });
            let totals = Totals {
                empty: top.is_empty(),
                live_nonempty,
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
        // `--checksum` onto a live tree with no manifest to read: its
        // listing, as the plan made first read it, and the files it holds
        // hardlinked where their bytes are the source's.
        let listed = match (&self.onto, &self.surveyed) {
            (Onto::Listed { .. }, Some(s)) if cfg.checksum => s.listed.as_ref(),
            _ => None,
        };
        let job = stage::Job {
            sources: &refs,
            live: rec.map(|r| &r.live).or(listed.map(|(root, _)| root)),
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
            against: match (rec, listed) {
                (Some(r), _) => {
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
                        hardlinks: r.header.hardlinks,
                    };
                    Some((stage::Against::Recorded(&r.index), compare))
                }
                (None, Some((_, label))) => {
                    let shared = &self.surveyed.as_ref().expect("listed").sv.shared;
                    let against = stage::Against::Listed { label, shared };
                    // As the whole-tree path compares with a listing, the
                    // bytes read as each file is linked (`Stream::checksum`).
                    let compare = Compare {
                        owners: adjust.mirrored,
                        checksum: false,
                        granularity_ns: 1,
                        link_meta: true,
                        by_content: 0,
                        xattrs: true,
                        hardlinks: true,
                    };
                    Some((against, compare))
                }
                (None, None) => None,
            },
            checksum: cfg.checksum,
            damaged: self.damaged,
            // What the plan made first found drifted in the live tree's
            // hardlinks (and planned by their inodes), or an earlier try.
            avoid: match self.surveyed.as_ref().and_then(|s| s.sv.avoid.as_ref()) {
                Some(drifted) => Some(drifted),
                None => self
                    .avoid
                    .filter(|a| gen == Some(a.gen.as_str()))
                    .map(|a| &a.drifted),
            },
        };
        let mut streamed = match stage::stream(&stream, staging.dir())? {
            Ok(streamed) => streamed,
            Err(redo) => {
                console.finish();
                drop(staging);
                return Ok(Err((console, redo)));
            }
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
                // Images under `--verify-key`: the keys that verified them.
                self.sources.verified_early(cfg).unwrap_or_default(),
            )
        };
        if let (Some(fp), [s]) = (self.sources.recheck.get(), &refs[..]) {
            // A bundle in a directory: what is published is what is checked.
            // Refused here, a first sync leaves no state directory behind,
            // as a refusal before staging leaves none.
            let mut made = MadeState {
                vol,
                armed: fresh_state,
            };
            crate::trust::check_staged(
                s.label(),
                &streamed.staged.tree,
                staging.dir(),
                fp,
                &cfg.verify_keys,
                &cfg.filter,
            )?;
            made.armed = false;
        }
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
            take_over: matches!(self.dest, Dest::Directory),
            groups: self.surveyed.as_ref().map(|s| s.sv.shared.as_slice()),
        };
        publish.run(cfg, manifest, summary, console, start).map(Ok)
    }
}

/// A staging directory made before a round streams, because the spools of
/// its sources are in it (`source::spool_all`).
pub(super) struct Early<'e, 'v> {
    pub(super) state: &'e State,
    pub(super) stage: Stage,
    /// The state directory was made for the spool.
    pub(super) fresh: bool,
    pub(super) made: &'e mut MadeState<'v>,
    /// What the spools reported, shown after the guards.
    pub(super) kept: &'e Collected,
}

/// Directories staged a directory at a time (`stage::stream`), onto
/// nothing, a live generation whose manifest indexes, or a live tree known
/// by its listing: planned first (`survey`) where a mode lists or checks
/// the changes (`--dry-run`, `--itemize`, `--verify`, `--checksum`, a
/// damage record) or there is no manifest to count against, which may end
/// the round there (a dry run, or up to date). `Step::Next` gives the
/// console back where this step does not apply, or the stage found the
/// live hardlinks drifted.
pub(super) fn directories(r: &Opened<'_>, console: Console) -> Result<Step> {
    let cfg = r.cfg;
    let live_gen = r.live();
    let mut console = console;
    let onto = || streams(cfg, live_gen, &r.dest, &r.sources);
    let streamed = (!r.trusting && !planned_first(cfg, r.damage.is_some()))
        .then(onto)
        .flatten()
        .filter(|o| !o.listed());
    if let Some(onto) = streamed {
        match r.streamed_round(onto).run(console, r.start, None)? {
            Ok(round) => return Ok(Step::Done(Attempt::Done(Box::new(round)))),
            // The live tree's hardlinks drifted from its manifest (files
            // joined or a group split): tried again avoiding what drifted;
            // where a try did already, the whole-tree path sees its inodes.
            Err((back, redo)) => match r.again(redo) {
                Some(again) => return Ok(Step::Done(again)),
                None => console = back,
            },
        }
    }

    // A dry run, `--itemize`, `--verify` or a live tree without a manifest,
    // planned a directory at a time: only the changes are held (where
    // `--itemize` lists them).
    // Only where it can end the round (a dry run, up to date) or be staged
    // from: else the whole trees plan again. Told without building the
    // live manifest's index, which the plan builds and the stage then
    // takes from it.
    let useful = cfg.dry_run || stageable(cfg, live_gen, &r.dest, &r.sources);
    let surveyed = (!r.trusting && r.same_gen.is_none() && useful)
        .then(|| {
            survey(
                cfg,
                &r.dest,
                &r.vol,
                live_gen,
                &r.sources,
                &r.adjust,
                r.damage.as_ref(),
            )
        })
        .flatten();
    if let Some(mut surveyed) = surveyed {
        let gen = live_gen.map(|l| l.gen.as_str());
        let up_to_date = surveyed.up_to_date(cfg, gen);
        if cfg.dry_run || up_to_date {
            let planned = surveyed.planned(cfg, &r.vol, gen, up_to_date)?;
            return planned
                .end(cfg, &r.vol, r.state.as_ref(), console, r.pass, r.start)
                .map(|r| Step::Done(Attempt::Done(Box::new(r))));
        }
        // Something to do: staged a directory at a time (its own listing
        // reports what it skips), guarded and counted as just planned.
        let index = surveyed.index.take();
        if let Some(onto) = streams_given(cfg, live_gen, &r.dest, &r.sources, index) {
            let round = StreamedRound {
                surveyed: Some(surveyed),
                ..r.streamed_round(onto)
            };
            match round.run(console, r.start, None)? {
                Ok(round) => return Ok(Step::Done(Attempt::Done(Box::new(round)))),
                Err((back, redo)) => match r.again(redo) {
                    Some(again) => return Ok(Step::Done(again)),
                    None => console = back,
                },
            }
        }
    }
    Ok(Step::Next(Box::new(console)))
}

/// Whether `streams` may give something to stage onto, told without the
/// live manifest's index: where it does not index, `streams` gives a
/// listing.
fn stageable(cfg: &SyncConfig, live: Option<&LiveGen>, dest: &Dest, sources: &Sources) -> bool {
    let lists = sources.list_by_directory();
    let onto = match dest {
        _ if survey::bare(dest, live) => true,
        Dest::Absent => true,
        Dest::Live(_) => live.is_some_and(|l| l.header().is_some() && l.root().is_ok()),
        _ => false,
    };
    !cfg.dry_run && lists && onto
}

/// Where a step of a round left it: ended, or the console handed on to
/// the next step.
pub(super) enum Step {
    Done(Attempt),
    Next(Box<Console>),
}
