//! Up to date, decided without a tree held whole: the sources against the
//! live generation a directory at a time (`quick`), spooled sources against
//! its manifest (`spooled_quick`), sources unchanged since it against its
//! own tree (`recorded_quick`).

use std::time::Instant;

use anyhow::Result;

use crate::config::SyncConfig;
use crate::live::LiveGen;
use crate::manifest::Manifest;
use crate::plan::{Compare, Plan};
use crate::report::{self, Collected, Console, Output, Round, Summary};
use crate::scan;
use crate::sidecar::Pass;
use crate::tree::{Node, Tree};
use crate::volume::{State, Volume};

use super::publish::Planned;
use super::streamed::Recorded;
use super::{as_recorded, guards, Adjust, Sources, Totals};

/// A round found up to date by a compare a directory at a time (`Quick`):
/// the guards on the names at the top, then the end of any up-to-date round.
pub(super) fn quick_end(
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
pub(super) fn spooled_quick(
    cfg: &SyncConfig,
    live: Option<&LiveGen>,
    sources: &Sources,
    adjust: &Adjust<'_>,
    recorded: Option<&Recorded>,
) -> Result<Option<Quick>> {
    let (Some(live), Some(rec)) = (live, recorded) else {
        return Ok(None);
    };
    // Under `--verify-key`, verified then by other keys (or not at all):
    // the record is news. Without keys, what keys verified stands.
    if cfg.trusting() && Some(&rec.header.verified) != sources.verified_early(cfg).as_ref() {
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
        hardlinks: rec.header.hardlinks,
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

/// What the streaming compare found up to date.
pub(super) struct Quick {
    pub(super) gen: String,
    /// The live manifest's header.
    pub(super) header: Manifest,
    pub(super) compared: scan::Compared,
    pub(super) warnings: Collected,
}

/// Whether the live generation already is what the sources give, decided
/// a directory at a time (`scan::compare_live`) with nothing whole held:
/// `None` where it is not, or where this compare does not apply and the
/// sync goes on to plan (`--dry-run`, which plans a directory at a time
/// itself; a DEST that is not a generation, a manifest that is missing, a
/// label to change, a source that is not a directory, any error: the full
/// path reports it).
pub(super) fn quick(
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
    // Under `--verify-key` (a bundle in a directory, checked over its
    // listing): verified then by other keys, or not at all, the record is news.
    if cfg.trusting() && Some(&header.verified) != sources.verified_early(cfg).as_ref() {
        return None;
    }
    // Directories only: compared by metadata, as a directory sync is (and
    // with `--checksum`, by both sides' bytes too).
    compare_quick(cfg, live, header, adjust, &refs, None)
}

/// `scan::compare_live` of the live generation `gen` (its manifest's
/// `header`) against `sources`, or against its own manifest (`recorded`):
/// a `Quick` when it is up to date. Files are compared by size, mtime and
/// mode (and, with `--checksum`, against the sources by their bytes; under
/// `--set-mtime`, the sources' bytes against the recorded hashes). `None`
/// where this compare does not apply (a new label) or it found a
/// difference.
pub(super) fn compare_quick(
    cfg: &SyncConfig,
    live: &LiveGen,
    header: Manifest,
    adjust: &Adjust<'_>,
    sources: &[&dyn crate::source::Source],
    recorded: Option<&crate::index::Index>,
) -> Option<Quick> {
    if cfg.label.is_some() && cfg.label_text() != header.label.as_deref() {
        return None;
    }
    // A listing shows no attributes, nor hashes, nor hardlinks where the
    // volume does not (`hardlinks 0`): where the live generation has
    // attributes, `--set-mtime` leaves only content to tell files apart,
    // or its groups are only its manifest's, each live entry still as
    // recorded takes its manifest's (the index costs one more pass over
    // the manifest).
    let by_content = match (cfg.set_mtime, recorded) {
        (Some(_), None) => u64::MAX,
        _ => 0,
    };
    let index = match (
        (header.xattrs || by_content != 0 || !header.hardlinks),
        recorded,
    ) {
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
            hardlinks: header.hardlinks,
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
pub(super) fn reads_whole(live: &LiveGen) -> bool {
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
pub(super) fn unchanged_live(
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
pub(super) fn trusted_by(cfg: &SyncConfig, header: &Manifest, n: usize) -> bool {
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
/// label, a manifest that does not index).
pub(super) fn recorded_quick(
    cfg: &SyncConfig,
    live: &LiveGen,
    adjust: &Adjust<'_>,
) -> Option<Quick> {
    if cfg.dry_run || cfg.checksum {
        return None;
    }
    let header = live.header()?.clone();
    if cfg.label.is_some() && cfg.label_text() != header.label.as_deref() {
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
pub(super) fn recorded_tree(live: &LiveGen) -> Option<Tree> {
    let mut m = live.read()?;
    m.tree.for_each_mut(&mut |_, e| {
        if let Node::File(f) = &mut e.node {
            f.hash = None;
        }
    });
    Some(m.tree)
}
