//! The whole-tree path: both trees in memory, planned by `plan::build` and
//! staged by `stage::run`, for what no directory-at-a-time path takes
//! (docs/architecture.md lists it), and the seeding of an image spool from
//! the live generation (`resume_live`, `lend_live`).

use std::collections::HashSet;

use anyhow::{Context, Result};

use crate::config::SyncConfig;
use crate::filter::Filter;
use crate::layout;
use crate::live::LiveGen;
use crate::manifest::Manifest;
use crate::plan::{self, Compare, Plan};
use crate::report::{self, Collected, Console, Output, Reporter};
use crate::scan;
use crate::source::{self, Source};
use crate::stage;
use crate::staging::Stage;
use crate::tree::{Node, Tree};
use crate::verify;
use crate::volume::{Dest, Volume};

use super::publish::{manifest_of, note_staged, summary_of, swap_for, Planned, Publish};
use super::quick::{quick_end, recorded_tree, spooled_quick};
use super::streamed::{streams, Early, StreamedRound};
use super::survey::survey;
use super::{
    as_recorded, guards, planned_first, resolve_label, shape_of, Attempt, MadeState, Opened,
    Scanning, Sources, Totals, Try,
};

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
pub(super) fn resume_live(
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
    let base = || Some((live.checked_index()?, live.root_owned()));
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
pub(super) fn lend_live(
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
    let base = || Some((live.checked_index()?, live.root_owned()));
    for s in sources.all.iter().filter(|s| s.streamed()) {
        s.lend(&base, borrow)?;
    }
    Ok(borrow)
}

/// Nothing to stage: the live generation is the planned tree, under the
/// same label (a new label on the same content is a new generation).
/// A live generation whose manifest is missing or unreadable is not up to
/// date: the sync stages it again, and commit replaces the bad manifest.
pub(super) fn up_to_date(
    cfg: &SyncConfig,
    plan: &Plan,
    live: &Live,
    verified: &[(usize, String)],
) -> bool {
    let live_label = live.manifest.as_ref().and_then(|m| m.label.as_deref());
    plan.up_to_date()
        && live.gen.is_some()
        && live.manifest.is_some()
        && (cfg.label.is_none() || cfg.label_text() == live_label)
        // Verified now but not then (or by other keys): the record is news.
        // Without keys, what a keyed sync verified of the same tree stands.
        && (!cfg.trusting() || live.manifest.as_ref().is_some_and(|m| m.verified == verified))
}

/// The live tree as it is on the volume, with hashes from its manifest where
/// the manifest still describes the file.
pub(super) struct Live {
    pub(super) gen: Option<String>,
    pub(super) dir: Option<source::Dir>,
    pub(super) tree: Option<Tree>,
    /// The live manifest's header (its entries were only streamed through).
    pub(super) manifest: Option<Manifest>,
    /// The rest of the live manifest, while its hashes are not attached yet:
    /// only a sync that stages anything reads it.
    pub(super) rest: Option<Box<dyn std::io::BufRead + Send>>,
}

impl Live {
    /// Nothing to compare with or reuse from (`gen`: what DEST pointed at).
    pub(super) fn nothing(gen: Option<String>) -> Live {
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
pub(super) fn load_live(
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
            let mut tree = dir.scan(0, &Filter::default(), warn)?;
            // Its hardlinks as they are, as a live generation's listing;
            // its files read under `--checksum`, and linked where equal, as
            // a live generation's without a manifest.
            tree.assign_groups_by_inode();
            Ok(Live {
                dir: Some(dir),
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
pub(super) fn forget_damaged(live: &mut Live, damaged: &crate::damage::Damaged) {
    let Some(tree) = live.tree.as_mut() else {
        return;
    };
    tree.for_each_mut(&mut |path, e| damaged.forget(path, e));
}

/// Copy each manifest hash onto the live file it still describes, and its
/// hardlink group where the volume does not show hardlinks (`hardlinks 0`).
/// Both are in pre-order, so one pass over each, holding one manifest entry
/// at a time.
pub(super) fn attach_manifest(
    live: &mut Tree,
    r: &mut dyn std::io::BufRead,
    header: &Manifest,
) -> Result<()> {
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
pub(super) fn plan(
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
        hardlinks: live.manifest.as_ref().is_none_or(|m| m.hardlinks),
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
pub(super) fn hash_candidates(tree: &mut Tree, live: &Tree, sources: &Sources) -> Result<()> {
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

/// `--label auto` where a source tells its version only once spooled (a
/// bundle's): the sync's options with the label it gives, read from the
/// spools filled by now. `None` where the label was known before.
fn late_label(cfg: &SyncConfig, sources: &Sources) -> Result<Option<SyncConfig>> {
    match cfg.label_auto && cfg.label.is_none() {
        true => resolve_label(cfg, sources),
        false => Ok(None),
    }
}

/// The rest of a round: archives and images are spooled (into this
/// writer's staging directory; a dry run's outside the volume), then
/// planned and staged a directory at a time as directories are
/// (`StreamedRound`); what no directory-at-a-time step takes (listed in
/// docs/architecture.md) scans both trees whole, plans them with
/// `plan::build` and stages with `stage::run`.
pub(super) fn spooled_or_whole(r: Opened<'_>, console: Console) -> Result<Attempt> {
    let console = console;
    let output = Output::of(r.cfg.json, r.cfg.quiet);
    let shortcut = r.shortcut();
    let Opened {
        cfg,
        ref sources,
        ref vol,
        ref dest,
        state,
        ref live_gen,
        ref damage,
        ref adjust,
        ref same_gen,
        this,
        avoid,
        trusting,
        pass,
        start,
    } = r;
    let live_gen = live_gen.as_ref();
    let streamed_round = |cfg, onto| StreamedRound {
        cfg,
        vol,
        dest,
        sources,
        adjust,
        onto,
        surveyed: None,
        damaged: damage.as_ref(),
        avoid,
    };
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
    // Not under keys: the layers taken from the live tree were not checked now.
    let resumed = !noop && !cfg.trusting() && resume_live(cfg, sources, live_gen, shortcut)?;
    // An image's signature covers its manifest, hence the TOC's digest
    // and every file's: lending skips no check, so `--verify-key` keeps it.
    let lent = !noop && !resumed && lend_live(cfg, sources, live_gen, shortcut)?;
    let fresh_state = state.is_none();
    let streamed = sources.streamed() && !noop;
    // A dry run writes nothing on the volume: it spools outside it.
    let spool_here = streamed && !cfg.dry_run;
    let mut made = MadeState {
        vol,
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
    // never held whole, a spool's files listed from the live generation
    // (`resume`, `lend`) among them: the stage must link each from there
    // (else the round is tried again without them). Not on the whole-tree
    // try (`Try::Whole`). A bundle's signature (`--verify-key`) is checked over
    // its spool a directory at a time, before anything is staged. A label
    // `--label auto` reads from the spool is read once it is filled.
    let mut spooled = false;
    let spooled_streams = this != Try::Whole;
    if let (true, Some(stage), Some(st)) = (spooled_streams, early.as_ref(), state.as_ref()) {
        let kept = Scanning {
            kept: &warnings,
            console: &console,
        };
        source::spool_all(&sources.refs(), stage.dir(), &kept)?;
        spooled = true;
        // The decompressors' buffers and the chunks in flight are gone:
        // give their pages back before the stage takes its own.
        crate::sys::release_free_memory();
        if (resumed || lent) && !sources.all.iter().all(|s| s.holds_all()) {
            // A new layer needed a lower one's file the live generation
            // could not give (that is said): fetch every layer after all.
            let why = sources.all.iter().find_map(|s| s.why_not_intact());
            debug_assert!(shortcut);
            return Ok(Attempt::Again {
                why,
                whole: false,
                avoid: None,
            });
        }
        let checked = !trusting || sources.check_listed(cfg, &kept)?;
        // `--label auto` with a bundle that tells its version in the spool.
        let late = late_label(cfg, sources)?;
        let cfg = late.as_ref().unwrap_or(cfg);
        if let Some(onto) = streams(cfg, live_gen, dest, sources).filter(|_| checked) {
            // Up to date by the live manifest: not where it is known damaged.
            let q = match damage {
                None => spooled_quick(cfg, live_gen, sources, adjust, onto.recorded())?,
                Some(_) => None,
            };
            if let Some(mut q) = q {
                for w in q.warnings.take_warnings() {
                    warnings.warn(&w);
                }
                q.warnings = warnings;
                return quick_end(cfg, vol, state.as_ref(), q, console, pass, start)
                    .map(|r| Attempt::Done(Box::new(r)));
            }
            // `--itemize`, `--verify`, a live tree without a manifest:
            // planned a directory at a time first (where the live hardlinks
            // drifted, by the whole trees).
            let first = planned_first(cfg, damage.is_some()) || onto.listed();
            let mut surveyed = first
                .then(|| survey(cfg, dest, vol, live_gen, sources, adjust, damage.as_ref()))
                .flatten();
            let gen = live_gen.map(|l| l.gen.as_str());
            if let Some(s) = surveyed.as_mut().filter(|s| s.up_to_date(cfg, gen)) {
                s.after(&warnings);
                return s
                    .planned(cfg, vol, gen, true)?
                    .end(cfg, vol, state.as_ref(), console, pass, start)
                    .map(|r| Attempt::Done(Box::new(r)));
            }
            if !first || surveyed.is_some() {
                let s = StreamedRound {
                    surveyed,
                    ..streamed_round(cfg, onto)
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
                    // Under a resumed or lent spool the stage stops where a
                    // file listed from the live generation drifted there:
                    // first without the shortcut, still streamed. Else the
                    // live tree's hardlinks drifted from its manifest, and
                    // the spool's files are moved out: spooled again,
                    // staged avoiding what drifted; where a try did
                    // already, spooled again whole.
                    Err((_, redo)) if resumed || lent => {
                        drop(redo);
                        Ok(Attempt::Again {
                            why: None,
                            whole: false,
                            avoid: None,
                        })
                    }
                    Err((_, redo)) => Ok(super::again(redo, avoid, live_gen).unwrap_or(
                        Attempt::Again {
                            why: None,
                            whole: true,
                            avoid: None,
                        },
                    )),
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
        let checked = !trusting || sources.check_listed(cfg, &kept)?;
        let late = late_label(cfg, sources)?;
        let cfg = late.as_ref().unwrap_or(cfg);
        let surveyed = checked
            .then(|| survey(cfg, dest, vol, live_gen, sources, adjust, damage.as_ref()))
            .flatten();
        if let Some(mut s) = surveyed {
            s.after(&warnings);
            let gen = live_gen.map(|l| l.gen.as_str());
            let up_to_date = s.up_to_date(cfg, gen);
            return s
                .planned(cfg, vol, gen, up_to_date)?
                .end(cfg, vol, state.as_ref(), console, pass, start)
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
        || load_live(vol, live_gen, dest, &warnings, !cfg.checksum),
    );
    let ((mut tree, verified), mut live) = (scanned?, live?);
    // Unchanged since the live generation: the keys that verified it then.
    // Else, without keys, none: what was not checked claims no key.
    let verified = verified.unwrap_or_else(|| match (noop, live.manifest.as_ref()) {
        (true, Some(m)) => m.verified.clone(),
        _ => Vec::new(),
    });
    // `--label auto` with a bundle that told its version only in the spool.
    // Sources unchanged since the live generation (`noop`) are not
    // spooled: the live label stands for what they hold.
    let late;
    let cfg = if noop {
        cfg
    } else {
        late = late_label(cfg, sources)?;
        late.as_ref().unwrap_or(cfg)
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
    let plan = plan(cfg, &mut tree, &mut live, sources, owners, by_content)?;
    if noop && !up_to_date(cfg, &plan, &live, &verified) {
        // Drift (or a new label): fetch after all.
        debug_assert!(shortcut);
        return Ok(Attempt::Again {
            why: None,
            whole: false,
            avoid: None,
        });
    }
    if (resumed || lent) && !sources.all.iter().all(|s| s.intact(&tree)) {
        // A file taken from the live generation drifted there (or a new
        // layer needed a lower one's file: that is said): fetch every
        // layer after all.
        let why = sources.all.iter().find_map(|s| s.why_not_intact());
        debug_assert!(shortcut);
        return Ok(Attempt::Again {
            why,
            whole: false,
            avoid: None,
        });
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
    let check = guards(cfg, vol, &totals, live.gen.as_deref(), live_label)?;
    let up_to_date = up_to_date(cfg, &plan, &live, &verified);
    let counts = (tree.count(), tree.bytes());
    let mut summary = summary_of(cfg, vol, counts, &plan, live.gen.as_deref(), up_to_date);
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
            .end(cfg, vol, state.as_ref(), console, pass, start)
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
    let swap = swap_for(dest, cfg);
    layout::prepare(vol, &state, &mut staging, fresh_state, swap)?;
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
    let manifest = manifest_of(cfg, sources, owners, &caps, tree, verified);
    if cfg.verify {
        let rules = verify::Rules::of(&manifest);
        verify::staged(&staged.tree, &manifest.tree, rules)?;
    }
    note_staged(&mut summary, &staged, &console);
    drop(staged); // closes the staged tree before it moves into gen/
    let staged = Publish {
        vol,
        state: &state,
        staging,
        was_live: live.gen.as_deref(),
        caps,
        swap,
        spooled: None,
        take_over: matches!(dest, Dest::Directory),
        groups: None,
    };
    staged
        .run(cfg, manifest, summary, console, start)
        .map(|r| Attempt::Done(Box::new(r)))
}
