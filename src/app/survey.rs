//! The plan of a dry run, `--itemize`, `--verify` or `--checksum`, made a
//! directory at a time (`scan::plan_live`): only the changes are held.

use anyhow::Result;

use crate::config::SyncConfig;
use crate::index::Index;
use crate::layout;
use crate::live::LiveGen;
use crate::manifest::Manifest;
use crate::plan::Compare;
use crate::report::{self, Collected, Output, Reporter};
use crate::scan;
use crate::sys::DirFd;
use crate::volume::{Dest, Volume};

use super::publish::{summary_of, Planned};
use super::{as_recorded, guards, planned_first, Adjust, Sources, Totals};

/// A dry run, `--itemize`, `--verify` or `--checksum` planned a directory
/// at a time (`scan::plan_live`), with what its listings reported and the
/// live manifest's header: for sources that list a directory at a time
/// (directories; archives and images once spooled: a dry run's spool is
/// outside the volume) onto nothing, a live generation whose manifest
/// indexes, or a live tree known only by its listing (no manifest, or
/// one that does not index). `None` where it does
/// not apply, where the live tree's hardlinks drifted from its manifest
/// and the plan made again by their inodes would reuse a drifted file
/// (`scan::plan_live_or_drifted`),
/// or at any error: the whole-tree path then plans (and says what failed,
/// as it always has).
pub(super) fn survey(
    cfg: &SyncConfig,
    dest: &Dest,
    vol: &Volume,
    live: Option<&LiveGen>,
    sources: &Sources,
    adjust: &Adjust<'_>,
    damaged: Option<&crate::damage::Damaged>,
) -> Option<Surveyed> {
    // Spooled sources list a directory at a time once they are spooled.
    let lists = sources.list_by_directory();
    if !lists {
        return None;
    }
    let mut listed = listed_only(dest, vol, live);
    let (header, index) = match (dest, &listed) {
        (Dest::Absent, _) | (_, Some(_)) => (None, None),
        (Dest::Live(_), None) => {
            let live = live?;
            let header = live.header()?.clone();
            match live.index() {
                Some(index) => (Some(header), Some(index)),
                // A manifest that does not index (cut short, out of
                // order): planned against the listing, as a missing one.
                None => {
                    listed = Some((live.root().ok()?.try_clone().ok()?, live.label.clone()));
                    (None, None)
                }
            }
        }
        _ => return None,
    };
    if !(planned_first(cfg, damaged.is_some()) || cfg.dry_run || listed.is_some()) {
        return None;
    }
    let warnings = Collected::default();
    let live_warnings = Collected::default();
    let side = match (live, &header, &index, &listed) {
        (Some(live), Some(header), Some(index), _) => Some(scan::LiveSide {
            root: live.root().ok()?,
            label: &live.label,
            recorded: Some((index, as_recorded(header))),
            reporter: &live_warnings,
            damaged,
        }),
        (_, _, _, Some((root, label))) => Some(scan::LiveSide {
            root,
            label,
            recorded: None,
            reporter: &live_warnings,
            damaged,
        }),
        _ => None,
    };
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
            hardlinks: header.as_ref().is_none_or(|m| m.hardlinks),
        },
        live: side,
        list: cfg.itemize,
        drifted: None,
    };
    let sv = scan::plan_live_or_drifted(&survey).ok().flatten()?;
    Some(Surveyed {
        sv,
        warnings,
        live_warnings,
        header,
        index,
        verified: sources.verified_early(cfg).unwrap_or_default(),
        listed,
    })
}

/// The live tree where there is no manifest to read, only a listing: a
/// DEST that is a plain directory (to take over), or a live generation
/// whose manifest is missing (or whose header does not read). Its root and
/// how it is named in messages. `None` elsewhere, and where the root does
/// not open (the whole-tree path says why).
pub(super) fn listed_only(
    dest: &Dest,
    vol: &Volume,
    live: Option<&LiveGen>,
) -> Option<(DirFd, String)> {
    if !bare(dest, live) {
        return None;
    }
    match (dest, live) {
        (Dest::Directory, _) => {
            let fd = vol.parent().ok()?.open_dir(&vol.name).ok()?;
            Some((fd, vol.display.clone()))
        }
        (_, Some(live)) => Some((live.root().ok()?.try_clone().ok()?, live.label.clone())),
        _ => None,
    }
}

/// Whether the live side has no manifest to read (`listed_only`'s cases),
/// told without opening anything.
pub(super) fn bare(dest: &Dest, live: Option<&LiveGen>) -> bool {
    match dest {
        Dest::Directory => true,
        Dest::Live(_) => live.is_some_and(|l| l.header().is_none()),
        _ => false,
    }
}

/// A plan made a directory at a time (`survey`): what it found, what its
/// listings reported, and the live manifest's header.
pub(super) struct Surveyed {
    pub(super) sv: scan::Surveyed,
    /// What the sources' listings reported (a stage that follows lists
    /// them again, and says it then).
    pub(super) warnings: Collected,
    /// What the live listing reported: said by the round either way.
    pub(super) live_warnings: Collected,
    pub(super) header: Option<Manifest>,
    /// The live manifest's index the plan was made with, for the stage
    /// that follows (`streams_given`), so it is built once a round.
    pub(super) index: Option<Index>,
    /// Under `--verify-key`: the keys that verified each source as it was
    /// resolved (`Sources::verified_early`).
    pub(super) verified: Vec<(usize, String)>,
    /// The live tree planned against by its listing (no manifest to read):
    /// its root and how it is named, for a `--checksum` stage that links
    /// from it (`stage::Against::Listed`).
    pub(super) listed: Option<(DirFd, String)>,
}

impl Surveyed {
    /// Show what `first` reported (a spool's warnings) before what the
    /// plan's listings did.
    pub(super) fn after(&mut self, first: &Collected) {
        let mut all = first.take_warnings();
        all.extend(self.warnings.take_warnings());
        for w in all {
            self.warnings.warn(&w);
        }
    }

    pub(super) fn live_label(&self) -> Option<&str> {
        self.header.as_ref().and_then(|h| h.label.as_deref())
    }

    /// Whether the live generation `gen` already is what the sources give.
    /// Never where the live generation's manifest is missing: it is
    /// written again.
    /// Under `--verify-key`, only where the same keys verified it then.
    pub(super) fn up_to_date(&self, cfg: &SyncConfig, gen: Option<&str>) -> bool {
        self.sv.plan.up_to_date()
            && gen.is_some()
            && self
                .header
                .as_ref()
                .is_some_and(|h| !cfg.trusting() || h.verified == self.verified)
            && (cfg.label.is_none() || cfg.label_text() == self.live_label())
    }

    /// The guards on what was planned: the names at the top of either side
    /// (the live listing's), whether either is empty, what goes.
    pub(super) fn guards(
        &self,
        cfg: &SyncConfig,
        vol: &Volume,
        gen: Option<&str>,
    ) -> Result<layout::Check> {
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
    pub(super) fn planned<'a>(
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
        for w in self.live_warnings.take_warnings() {
            self.warnings.warn(&w);
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
