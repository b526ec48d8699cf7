//! The pipeline: the only file that knows the order of the stages.
//!
//! validate → scan sources (+ live tree) → plan → guards → stage → commit →
//! retire, and the reporting around it. Owns the thread pool (rayon's global one).

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};

use crate::commit::{self, Swap};
use crate::config::{self, Command, Config, Layout, SyncConfig};
use crate::error;
use crate::layout;
use crate::manifest::Manifest;
use crate::ops;
use crate::plan::{self, Compare, Plan};
use crate::report::{self, Progress, Quiet, Reporter};
use crate::retire::{self, Policy};
use crate::scan::{self, Filter, Warnings};
use crate::stage;
use crate::sys;
use crate::tree::{Node, Tree};
use crate::volume::{Dest, Stage, State, Volume};

/// Run a command; the exit status on success.
pub fn run(cfg: Config) -> Result<i32> {
    init_pool();
    sys::signals::install();
    sys::raise_fd_limit();
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o022));
    match cfg.command {
        Command::Sync(s) => sync(&s),
        Command::Completions { shell } => {
            crate::cli::completions(shell, &mut std::io::stdout());
            Ok(0)
        }
        Command::Gc { dest, keep, grace } => gc(&dest, keep, &grace),
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
        } => ops::wait::run(&dest, slot.as_deref(), timeout.as_deref(), label.as_deref()),
        Command::Exec { dest, cmd, slot } => ops::exec::run(&dest, slot.as_deref(), &cmd),
    }
}

/// Size the thread pool. Scanning and copying mostly wait on the
/// filesystem (metadata not yet cached, a network volume), so the pool has
/// several threads per core: on 2 cores, 16 threads scan a cold tree of 10^5
/// files about 1.4 times as fast as 2 (BENCHMARKS.md). `RAYON_NUM_THREADS`
/// overrides it.
fn init_pool() {
    if std::env::var_os("RAYON_NUM_THREADS").is_some() {
        return; // rayon reads it
    }
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads((cores * 8).clamp(16, 64))
        .build_global();
}

/// What a sync did, for the summary line and `--json`.
#[derive(serde::Serialize, Default)]
pub struct Summary {
    pub dest: String,
    pub status: &'static str,
    pub generation: Option<String>,
    pub previous: Option<String>,
    pub label: Option<String>,
    pub entries: u64,
    pub bytes: u64,
    pub added: u64,
    pub changed: u64,
    pub deleted: u64,
    pub copied: u64,
    pub copied_bytes: u64,
    pub reused: u64,
    pub retired: Vec<String>,
    pub warnings: Vec<String>,
    /// `--itemize` under `--json`: the lines `--itemize` prints without
    /// `--json`, in the same order; the key is absent without `--itemize`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changes: Option<Vec<Itemized>>,
    /// `--exec-after`: what the hook did; `None` when it did not run (not
    /// given, dry run, or up to date with a success on the live generation
    /// already recorded).
    pub exec_after: Option<ops::exec::After>,
    pub seconds: f64,
    pub dry_run: bool,
}

/// One `--itemize` line as JSON: `{"change": "+", "path": "a/b.txt"}`.
#[derive(serde::Serialize)]
pub struct Itemized {
    /// `+` added, `~` changed, `-` deleted.
    pub change: char,
    /// As the text line shows it: escaped by `report::escape` (as `verify
    /// --json` paths are), a directory with a trailing `/`, `.` the root.
    pub path: String,
}

fn validate_sources(cfg: &SyncConfig) -> Result<(Vec<OwnedFd>, Vec<PathBuf>, Vec<String>)> {
    let mut fds = Vec::new();
    let mut canon = Vec::new();
    let mut labels = Vec::new();
    for src in &cfg.sources {
        let shown = src.display().to_string();
        let meta = std::fs::metadata(src).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                error::usage(format!("{shown}: source does not exist"))
            } else {
                error::usage(format!("{shown}: cannot read source: {e}"))
            }
        })?;
        if !meta.is_dir() {
            return Err(error::usage(format!("{shown}: source is not a directory")));
        }
        let fd = sys::open_dir_path(src)
            .map_err(|e| error::usage(format!("{shown}: cannot read source: {e}")))?;
        // A listing on a handle of its own: the one kept must start at offset 0.
        sys::open_dir_path(src)
            .and_then(|probe| sys::list_dir(probe.as_fd()))
            .map_err(|e| error::usage(format!("{shown}: cannot read source: {e}")))?;
        canon.push(std::fs::canonicalize(src).with_context(|| format!("cannot resolve {shown}"))?);
        fds.push(fd);
        labels.push(shown);
    }
    Ok((fds, canon, labels))
}

/// DEST inside a SOURCE, or a SOURCE inside DEST (or its state directory).
fn check_overlap(vol: &Volume, sources: &[PathBuf], labels: &[String]) -> Result<()> {
    let parent = std::fs::canonicalize(&vol.parent_path)
        .with_context(|| format!("cannot resolve {}", vol.parent_path.display()))?;
    let dest = parent.join(sys::os(&vol.name));
    let state = parent.join(sys::os(&vol.state_name()));
    for (src, label) in sources.iter().zip(labels) {
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

fn load_rules(cfg: &SyncConfig) -> Result<Vec<String>> {
    let mut rules = Vec::new();
    for f in &cfg.exclude_from {
        let text = std::fs::read_to_string(f).map_err(|e| {
            error::usage(format!("{}: cannot read --exclude-from: {e}", f.display()))
        })?;
        rules.extend(exclude_lines(&text).map(str::to_string));
    }
    rules.extend(cfg.rules.iter().cloned());
    Ok(rules)
}

/// The rules of an `--exclude-from` file: its lines but blank ones and comments.
pub(crate) fn exclude_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
}

fn now() -> (i64, u32) {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (d.as_secs() as i64, d.subsec_nanos())
}

/// The live tree as it is on the volume, with hashes from its manifest where
/// the manifest still describes the file.
struct Live {
    gen: Option<String>,
    fd: Option<OwnedFd>,
    tree: Option<Tree>,
    /// The live manifest's header (its entries were only streamed through).
    manifest: Option<Manifest>,
    /// The rest of the live manifest, while its hashes are not attached yet:
    /// only a sync that stages anything reads it.
    rest: Option<std::io::BufReader<std::fs::File>>,
}

/// `lazy`: leave the manifest's entries for `attach_manifest` later (not
/// where its hardlink groups are needed to compare: `hardlinks 0`).
fn load_live(
    vol: &Volume,
    state: Option<&State>,
    dest: &Dest,
    warn: &Warnings,
    lazy: bool,
) -> Result<Live> {
    match dest {
        Dest::Live(gen) => {
            let state = state.with_context(|| {
                format!("{} points into a missing state directory", vol.display)
            })?;
            let opened = vol.open_generation(state, gen).and_then(|fd| {
                let label = format!("{}/gen/{gen}", state.path.display());
                let tree = scan::run(fd.as_fd(), &label, 0, &Filter::default(), warn)?;
                Ok((fd, tree))
            });
            let (fd, mut tree) = match opened {
                Ok(live) => live,
                Err(e) => {
                    // Removed since DEST was read (another writer replaced it and
                    // its grace ran out), or not a directory: nothing to reuse.
                    warn.push(format!(
                        "cannot read the live generation {gen}, copying everything: {e:#}"
                    ));
                    return Ok(Live {
                        gen: Some(gen.clone()),
                        fd: None,
                        tree: None,
                        manifest: None,
                        rest: None,
                    });
                }
            };
            tree.assign_groups_by_inode();
            // A missing or unreadable manifest only costs reuse: every file is copied.
            let mut rest = None;
            let manifest = state.manifest_reader(gen).ok().and_then(|(mut r, _)| {
                let header = Manifest::read_header(&mut r).ok()?;
                if lazy && header.hardlinks {
                    rest = Some(r);
                } else {
                    attach_manifest(&mut tree, &mut r, &header).ok()?;
                }
                Some(header)
            });
            Ok(Live {
                gen: Some(gen.clone()),
                fd: Some(fd),
                tree: Some(tree),
                manifest,
                rest,
            })
        }
        Dest::Directory => {
            let fd = sys::open_dir_at(vol.parent.as_fd(), &vol.name)
                .with_context(|| format!("cannot open {}", vol.display))?;
            let tree = scan::run(fd.as_fd(), &vol.display, 0, &Filter::default(), warn)?;
            Ok(Live {
                gen: None,
                fd: None,
                tree: Some(tree),
                manifest: None,
                rest: None,
            })
        }
        _ => Ok(Live {
            gen: None,
            fd: None,
            tree: None,
            manifest: None,
            rest: None,
        }),
    }
}

/// Copy each manifest hash onto the live file it still describes, and its
/// hardlink group where the volume does not show hardlinks (`hardlinks 0`).
/// Both are in pre-order, so one pass over each, holding one manifest entry
/// at a time.
fn attach_manifest(live: &mut Tree, r: &mut dyn std::io::BufRead, header: &Manifest) -> Result<()> {
    use std::cmp::Ordering;
    let mut entries = crate::manifest::Entries::new(r);
    let c = Compare {
        owners: header.owners,
        checksum: false,
        granularity_ns: header.granularity_ns,
        link_meta: header.link_meta,
    };
    let mut next = entries.next_entry()?.filter(|(p, _)| p != b".");
    if next.is_none() {
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
    match failed {
        Some(err) => Err(err),
        None => Ok(()),
    }
}

fn sync(cfg: &SyncConfig) -> Result<i32> {
    let start = Instant::now();
    let grace = config::parse_duration(&cfg.grace)
        .map_err(|e| crate::cli::bad_value("--grace", &cfg.grace, e))?;
    let chown = match &cfg.chown {
        Some(c) => {
            Some(config::parse_owner(c).map_err(|e| crate::cli::bad_value("--chown", c, e))?)
        }
        None => None,
    };
    let chmod = match &cfg.chmod {
        Some(r) => {
            Some(crate::chmod::parse(r).map_err(|e| crate::cli::bad_value("--chmod", r, e))?)
        }
        None => None,
    };
    let version = crate::label::from_flag(cfg.label.as_deref(), cfg.allow_downgrade)?;
    let rules = load_rules(cfg)?;
    let filter = Filter::new(&rules).map_err(|e| error::usage(format!("{e:#}")))?;
    let (src_fds, canon, labels) = validate_sources(cfg)?;
    let base = Volume::open(&cfg.dest, cfg.mkpath && !cfg.dry_run)?;
    check_overlap(&base, &canon, &labels)?;
    let vol = layout::open_for_sync(base, cfg)?;
    let dest = vol.inspect()?;
    match &dest {
        Dest::Directory | Dest::File if vol.layout == Layout::Fanout => {
            return Err(error::refused(format!(
                "{}: {} is not a packsync link; remove it or choose another DEST",
                vol.display,
                sys::os(&vol.name).to_string_lossy()
            )))
        }
        Dest::File => {
            return Err(error::usage(format!(
                "{}: DEST exists and is not a directory",
                vol.display
            )))
        }
        Dest::Foreign(t) => {
            return Err(error::refused(format!(
            "{}: not a packsync destination (a symlink to {t}); remove it or choose another DEST",
            vol.display
        )))
        }
        _ => {}
    }
    let quiet = Quiet {
        show_warnings: true,
    };
    let progress =
        Progress::new(cfg.progress.unwrap_or_else(sys::stderr_is_tty) && !cfg.quiet && !cfg.json);
    let reporter: &dyn Reporter = if cfg.quiet || cfg.json {
        &quiet
    } else {
        &progress
    };
    let warnings = Warnings::default();

    // Scan every source (each in parallel inside) and overlay them in order.
    // Scan the sources and the live generation at the same time.
    let state = vol.state(false)?;
    let scan_sources = || -> Result<Tree> {
        let mut tree = Tree::default();
        for (i, fd) in src_fds.iter().enumerate() {
            let t = scan::run(fd.as_fd(), &labels[i], i as u16, &filter, &warnings)?;
            if i == 0 {
                tree = t;
            } else {
                tree.overlay(t);
            }
        }
        tree.assign_groups();
        Ok(tree)
    };
    let (tree, live) = rayon::join(scan_sources, || {
        load_live(&vol, state.as_ref(), &dest, &warnings, !cfg.checksum)
    });
    let (mut tree, live) = (tree?, live?);
    let root = sys::euid() == 0;
    let owners = root || chown.is_some();
    if let Some((u, g)) = chown {
        tree.root.uid = u;
        tree.root.gid = g;
        tree.for_each_mut(&mut |_, e| {
            e.meta.uid = u;
            e.meta.gid = g;
        });
    }
    if !owners {
        // Files will be ours: record that, and drop setuid/setgid bits on files,
        // which would mean something else on a file we cannot give its owner.
        let (uid, gid) = (sys::euid(), sys::egid());
        let own = |m: &mut crate::tree::Meta, is_dir: bool| {
            m.uid = uid;
            m.gid = gid;
            if !is_dir {
                m.mode &= !0o6000;
            }
        };
        own(&mut tree.root, true);
        tree.for_each_mut(&mut |_, e| {
            let d = matches!(e.node, Node::Dir(_));
            own(&mut e.meta, d);
        });
    }
    if let Some(rules) = &chmod {
        rules.apply(&mut tree);
    }
    let granularity = live
        .manifest
        .as_ref()
        .map(|m| m.granularity_ns)
        .unwrap_or(1);
    let compare = Compare {
        owners,
        checksum: cfg.checksum,
        granularity_ns: granularity,
        link_meta: live.manifest.as_ref().is_none_or(|m| m.link_meta),
    };
    if cfg.checksum {
        if let Some(lt) = live.tree.as_ref() {
            hash_candidates(&mut tree, lt, &src_fds, &labels)?;
        }
    }
    let mut live_tree = live.tree;
    if cfg.checksum {
        if let (Some(lt), Some(fd)) = (live_tree.as_mut(), live.fd.as_ref()) {
            let fds = vec![Some(fd.try_clone()?)];
            scan::hash(lt, &fds, std::slice::from_ref(&vol.display), &|e| {
                matches!(e.node, Node::File(_))
            })?;
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
    let mut plan = plan_of(&mut tree, live_tree.as_ref());
    // The live hashes only matter for reuse: a sync that turns out up to
    // date never reads past the manifest's header.
    if let (Some(mut rest), Some(header), Some(lt)) =
        (live.rest, live.manifest.as_ref(), live_tree.as_mut())
    {
        if !plan.up_to_date() || cfg.dry_run || (cfg.label.is_some() && cfg.label != header.label) {
            // Entries that cannot be read only cost reuse: those files are copied.
            let _ = attach_manifest(lt, &mut rest, header);
            plan = plan_of(&mut tree, Some(lt));
        }
    }

    let mut summary = Summary {
        dest: vol.display.clone(),
        entries: tree.count(),
        bytes: tree.bytes(),
        added: plan.added,
        changed: plan.changed,
        deleted: plan.deleted,
        previous: live.gen.clone(),
        label: cfg.label.clone(),
        dry_run: cfg.dry_run,
        ..Default::default()
    };
    let live_nonempty = live_tree.as_ref().is_some_and(|t| !t.is_empty());
    guards(cfg, &vol, &tree, &plan, live_nonempty)?;
    // Fanout: other slots' entries and entries packsync did not make, before anything is written.
    let fanout = if vol.layout == Layout::Fanout {
        let names: Vec<&[u8]> = tree.entries.iter().map(|e| &*e.name).collect();
        let live_names: Option<Vec<&[u8]>> = live_tree
            .as_ref()
            .filter(|_| live.gen.is_some())
            .map(|t| t.entries.iter().map(|e| &*e.name).collect());
        Some(layout::fanout::check(
            &vol,
            &names,
            live_names.as_deref(),
            cfg.adopt,
        )?)
    } else {
        None
    };
    let live_label = live.manifest.as_ref().and_then(|m| m.label.clone());
    crate::label::guard(
        &vol.display,
        cfg.label.as_deref(),
        version.as_ref(),
        live.gen.as_deref(),
        live_label.as_deref(),
    )?;
    // A new label on the same content is a new generation (the label is part of it).
    let up_to_date =
        plan.up_to_date() && live.gen.is_some() && (cfg.label.is_none() || cfg.label == live_label);
    // Under --json the lines go into the one object: stdout stays one JSON object.
    if cfg.itemize {
        if cfg.json {
            summary.changes = Some(itemized(&plan).collect());
        } else {
            print_itemized(&plan);
        }
    }
    for w in warnings.take() {
        reporter.warn(&w);
        summary.warnings.push(w);
    }
    let policy = Policy {
        keep: cfg.keep,
        grace,
        stale: config::STALE_STAGE,
    };
    if cfg.dry_run {
        summary.status = if up_to_date {
            "up to date"
        } else {
            "would sync"
        };
        summary.generation = live.gen.clone();
        summary.copied = plan.copied;
        summary.copied_bytes = plan.copied_bytes;
        summary.reused = plan.reused;
        return finish(cfg, summary, start);
    }
    if up_to_date {
        summary.status = "up to date";
        summary.generation = live.gen.clone();
        if let Some(state) = &state {
            if let Some(check) = fanout.as_ref().filter(|c| c.repair || !c.adopt.is_empty()) {
                for w in layout::fanout::repair(&vol, state, !check.adopt.is_empty())? {
                    reporter.warn(&w);
                    summary.warnings.push(w);
                }
            }
            summary.retired = collect(&vol, state, &policy, reporter, &mut summary);
            // A hook that failed on the live generation (or never ran on it) runs now.
            let retry = live
                .gen
                .as_deref()
                .filter(|g| cfg.exec_after.is_some() && !ops::exec::after_done(state, g));
            if let Some(gen) = retry {
                return finish_with_hook(cfg, &vol, state, gen, summary, start);
            }
        }
        return finish(cfg, summary, start);
    }

    // Stage, commit, retire.
    let fresh_state = state.is_none();
    let state = vol.state(true)?.expect("created");
    let swap = match dest {
        Dest::Directory if cfg.migrate => Swap::Migrate,
        Dest::Directory => Swap::Exchange,
        _ => Swap::Link,
    };
    let mut stage = state.new_stage()?;
    if vol.layout == Layout::Dir {
        layout::dir::prepare(&vol, &state, &mut stage, fresh_state)?;
    }
    let result = (|| -> Result<commit::Generation> {
        if swap == Swap::Exchange && vol.layout == Layout::Symlink {
            probe_exchange(&stage).map_err(|_| {
                error::refused(format!(
                    "{}: is a directory and this filesystem cannot swap it atomically (no RENAME_EXCHANGE); \
                     pass --migrate to take it over with DEST missing for an instant",
                    vol.display
                ))
            })?;
        }
        sys::mkdir_at(stage.fd(), b"tree", 0o700).context("cannot create the staging tree")?;
        let out = sys::open_dir_at(stage.fd(), b"tree")?;
        let caps = crate::caps::probe(stage.fd()).with_context(|| {
            format!(
                "cannot probe the volume at {}/stage/{}",
                state.path.display(),
                stage.name
            )
        })?;
        let granularity_ns = caps.granularity_ns;
        reporter.begin(tree.count(), plan.copied_bytes);
        let job = stage::Job {
            sources: &src_fds,
            labels: &labels,
            live: live.fd.as_ref().map(|f| f.as_fd()),
            owners,
            reporter,
            caps,
            heartbeat: Some(stage.fd()),
            durable: cfg.fsync,
        };
        let staged = stage::run(&job, &mut tree, out.as_fd())?;
        reporter.finish();
        if cfg.verify {
            let rules = crate::verify::Rules {
                owners: owners && staged.owner_failures == 0,
                granularity_ns,
                link_meta: caps.link_meta,
                hardlinks: caps.hardlinks,
            };
            crate::verify::staged(out.as_fd(), &tree, rules)?;
        }
        drop(out);
        summary.copied = staged.copied;
        summary.copied_bytes = staged.copied_bytes;
        summary.reused = staged.reused;
        if staged.owner_failures > 0 {
            let w = format!(
                "could not set the owner of {} entries (not root, or the volume squashes root)",
                staged.owner_failures
            );
            reporter.warn(&w);
            summary.warnings.push(w);
        }
        let mut manifest = Manifest {
            label: cfg.label.clone(),
            created: now(),
            host: sys::hostname(),
            sources: canon.iter().map(|p| p.display().to_string()).collect(),
            owners: owners && staged.owner_failures == 0,
            granularity_ns,
            link_meta: caps.link_meta,
            hardlinks: caps.hardlinks,
            digest: String::new(),
            tree,
        };
        let opts = commit::Options {
            fsync: cfg.fsync,
            swap,
        };
        commit::run(
            &vol,
            &state,
            &stage,
            &mut manifest,
            live.gen.as_deref(),
            &opts,
            cfg.adopt,
        )
    })();
    stage.remove(&state);
    let gen = result?;
    summary.status = "synced";
    summary.generation = Some(gen.name.clone());
    summary.retired = collect(&vol, &state, &policy, reporter, &mut summary);
    finish_with_hook(cfg, &vol, &state, &gen.name, summary, start)
}

/// Run `--exec-after` (if given) on `gen`, then `finish`. The hook's failure
/// is in the summary, then the error (exit 1): the swap stays.
fn finish_with_hook(
    cfg: &SyncConfig,
    vol: &Volume,
    state: &State,
    gen: &str,
    mut summary: Summary,
    start: Instant,
) -> Result<i32> {
    let failure = cfg.exec_after.as_deref().and_then(|c| {
        let (after, failure) = ops::exec::after(c, vol, state, gen, cfg.json);
        summary.exec_after = Some(after);
        failure
    });
    let code = finish(cfg, summary, start)?;
    match failure {
        Some(e) => Err(e),
        None => Ok(code),
    }
}

/// Garbage collection after a sync: its failure is a warning, as the sync
/// itself is done and the next run collects again.
fn collect(
    vol: &Volume,
    state: &State,
    policy: &Policy,
    reporter: &dyn Reporter,
    summary: &mut Summary,
) -> Vec<String> {
    match retire::run(vol, state, policy, None) {
        Ok(r) => r.removed,
        Err(e) => {
            let w = format!("garbage collection left for the next run: {e:#}");
            reporter.warn(&w);
            summary.warnings.push(w);
            Vec::new()
        }
    }
}

/// Refusals that must come before anything is written.
fn guards(
    cfg: &SyncConfig,
    vol: &Volume,
    tree: &Tree,
    plan: &Plan,
    live_nonempty: bool,
) -> Result<()> {
    if tree.is_empty() && live_nonempty && !cfg.allow_empty {
        return Err(error::refused(format!(
            "{}: refusing to replace a non-empty tree with an empty source (pass --allow-empty if that is intended)",
            vol.display
        )));
    }
    if let Some(max) = cfg.max_delete {
        if plan.deleted > max {
            return Err(error::refused(format!(
                "{}: refusing to delete {} entries, more than --max-delete {max}",
                vol.display, plan.deleted
            )));
        }
    }
    Ok(())
}

/// With `--checksum`, hash the source files that have a live file of the same size.
fn hash_candidates(tree: &mut Tree, live: &Tree, fds: &[OwnedFd], labels: &[String]) -> Result<()> {
    let mut sizes = std::collections::HashMap::new();
    live.for_each(&mut |p, e| {
        if let Node::File(_) = e.node {
            sizes.insert(p.to_vec(), e.meta.size);
        }
    });
    let mut want = std::collections::HashSet::new();
    tree.for_each(&mut |p, e| {
        if matches!(e.node, Node::File(_)) && sizes.get(p) == Some(&e.meta.size) {
            want.insert(p.to_vec());
        }
    });
    if want.is_empty() {
        return Ok(());
    }
    // Mark by name inside the walk: a file is wanted if its path is. Paths are rebuilt by the hasher, so flag files instead.
    tree.for_each_mut(&mut |p, e| {
        if let Node::File(f) = &mut e.node {
            f.reuse = want.contains(p);
        }
    });
    let roots: Vec<Option<OwnedFd>> = fds.iter().map(|f| f.try_clone().ok()).collect();
    scan::hash(
        tree,
        &roots,
        labels,
        &|e| matches!(&e.node, Node::File(f) if f.reuse),
    )?;
    tree.for_each_mut(&mut |_, e| {
        if let Node::File(f) = &mut e.node {
            f.reuse = false;
        }
    });
    Ok(())
}

/// Can this filesystem exchange two names atomically?
fn probe_exchange(stage: &Stage) -> Result<()> {
    sys::mkdir_at(stage.fd(), b"probe-a", 0o700)?;
    sys::mkdir_at(stage.fd(), b"probe-b", 0o700)?;
    let r = sys::rename_exchange(stage.fd(), b"probe-a", stage.fd(), b"probe-b");
    let _ = sys::rmdir_at(stage.fd(), b"probe-a");
    let _ = sys::rmdir_at(stage.fd(), b"probe-b");
    Ok(r?)
}

/// The changes of `plan` as `--itemize` shows them, in path order.
fn itemized(plan: &Plan) -> impl Iterator<Item = Itemized> + '_ {
    plan.changes.iter().map(|c| {
        let slash = if c.kind == crate::tree::Kind::Dir && c.path != b"." {
            "/"
        } else {
            ""
        };
        Itemized {
            change: c.op.symbol(),
            path: format!("{}{slash}", report::escape(&c.path)),
        }
    })
}

/// One line a change, written as they are made: the list is not copied.
fn print_itemized(plan: &Plan) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    for c in itemized(plan) {
        let _ = writeln!(out, "{} {}", c.change, c.path);
    }
}

fn finish(cfg: &SyncConfig, mut s: Summary, start: Instant) -> Result<i32> {
    s.seconds = (start.elapsed().as_secs_f64() * 1000.0).round() / 1000.0;
    if cfg.json {
        report::json(&s)?;
    } else if !cfg.quiet {
        let what = format!(
            "{} entries ({}): {} copied ({}), {} reused, {} deleted",
            s.entries,
            report::human_bytes(s.bytes),
            s.copied,
            report::human_bytes(s.copied_bytes),
            s.reused,
            s.deleted
        );
        let gen = s.generation.as_deref().unwrap_or("-");
        let line = match (s.status, cfg.dry_run) {
            ("up to date", _) => format!(
                "packsync: {} up to date: {what}; generation {gen}; {:.2}s",
                s.dest, s.seconds
            ),
            (_, true) => format!(
                "packsync: dry run, {} not changed: would sync {what}; {:.2}s",
                s.dest, s.seconds
            ),
            _ => format!(
                "packsync: {} synced: {what}; generation {gen} is live; {:.2}s",
                s.dest, s.seconds
            ),
        };
        println!("{line}");
    }
    Ok(0)
}

fn gc(dest: &Path, keep: usize, grace: &str) -> Result<i32> {
    let grace =
        config::parse_duration(grace).map_err(|e| crate::cli::bad_value("--grace", grace, e))?;
    // One state directory per published tree: with fanout, one per slot.
    for vol in layout::find(dest, None)? {
        let state = vol.state(false)?.ok_or_else(|| {
            error::refused(format!("{}: not a packsync destination", vol.display))
        })?;
        let r = retire::run(
            &vol,
            &state,
            &Policy {
                keep,
                grace,
                stale: config::STALE_STAGE,
            },
            None,
        )?;
        println!(
            "packsync: {}{}: removed {} generation(s){}, {} stale staging dir(s)",
            vol.display,
            vol.slot
                .as_deref()
                .map(|s| format!(" (slot {s})"))
                .unwrap_or_default(),
            r.removed.len(),
            if r.left.is_empty() {
                String::new()
            } else {
                format!(", {} left for later (files still open)", r.left.len())
            },
            r.stale_stages
        );
    }
    Ok(0)
}
