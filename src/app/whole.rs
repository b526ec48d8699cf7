//! The whole-tree path: both trees in memory, planned by `plan::build` and
//! staged by `stage::run`, for what no directory-at-a-time path takes
//! (docs/architecture.md lists it), and the seeding of an image spool from
//! the live generation (`resume_live`, `lend_live`).

use super::*;

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
    let base = || Some((live.checked()?.tree, live.root_owned()));
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
        && live.manifest.as_ref().is_some_and(|m| m.verified == verified)
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
pub(super) fn forget_damaged(live: &mut Live, damage: &crate::damage::Damage) {
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
