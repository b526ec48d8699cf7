//! Commit: make a staged tree durable, name it by its digest, move it into
//! `gen/`, and publish it by renaming a fresh symlink over DEST.
//!
//! The protocol, which needs no lock (the collector's half is in `retire`):
//! 1. flush the staged data: `syncfs`, or, where that does not flush (FUSE),
//!    nothing more, as `stage` fsynced each file and directory; nothing at
//!    all with `--no-fsync`;
//! 2. claim GEN (`claim`: a lease file in `leases/`); from here until the
//!    claim is dropped no collector deletes GEN;
//! 3. hardlink the manifest to `meta/<GEN>.manifest` (an existing one is the
//!    same tree: writers that staged identical trees converge on one GEN);
//! 4. check that `stage/<me>` is still ours (a writer paused for longer than
//!    `config::STALE_STAGE` may have had it removed by another host), then
//!    rename `stage/<me>/tree` to `gen/<GEN>`; if GEN exists already, it is
//!    complete (only whole trees are ever renamed there) once it matches the
//!    manifest, so reuse it and stamp `meta/<GEN>.used`; if it does not match
//!    (edited in place, or not a directory), ours gets a name of its own;
//! 5. check that `gen/<GEN>` and its manifest are there (a collector that
//!    moved them aside at that instant sees the claim and moves them back;
//!    if they stay gone, ours is renamed in from staging);
//! 6. read DEST, create the symlink `stage/<me>/link` and rename it over
//!    DEST: the one atomic step readers can observe; flush DEST's parent;
//! 7. stamp `meta/<OLD>.retired` for the generation DEST pointed at just
//!    before (and the one live when the sync began): its grace period starts
//!    now, recorded on the volume so it holds across hosts and restarts;
//!    drop the claim.
//!
//! Timing assumptions: none for a single host. Across hosts, another
//! client may show an old DEST, or miss a claim, for as long as it caches
//! names (about 1 s on GlusterFS, up to 60 s on NFS); `retire` keeps every
//! generation that long after its last activity on such volumes.
//!
//! The other layouts change step 4 (and, for `dir`, step 3): with fanout the
//! link is the slot's data link inside DEST, its new entries are claimed
//! before it moves and the entry links follow it (`layout::fanout`); with
//! `dir` the staged tree is exchanged with DEST itself (`layout::dir`).

use std::os::fd::AsFd;

use anyhow::{Context, Result};

use crate::claim::Claim;
use crate::config::Layout;
use crate::error::Failure;
use crate::layout;
use crate::manifest::Manifest;
use crate::staging::Stage;
use crate::sys;
use crate::volume::{Dest, State, Volume};

/// A generation made live.
#[derive(Debug, Clone)]
pub struct Generation {
    pub name: String,
    pub digest: String,
    /// The generation existed already (another writer staged the same tree).
    pub converged: bool,
}

/// How DEST is replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Swap {
    /// DEST is absent or a packsync link: rename(2) over it.
    Link,
    /// DEST is a real directory: exchange it atomically for the link.
    Exchange,
    /// DEST is a real directory and `--migrate`: move it away, then rename (a gap).
    Migrate,
}

pub struct Options {
    pub fsync: bool,
    pub swap: Swap,
}

pub const GEN_LEN: usize = 16;

/// Durably store `manifest` and the tree staged in `stage/<me>/tree` as a
/// generation, publish it, and return it. `old` is the generation that was
/// live. `adopt` (fanout): entries of DEST packsync did not make give way.
pub fn run(
    vol: &Volume,
    state: &State,
    stage: &Stage,
    manifest: &mut Manifest,
    old: Option<&str>,
    opts: &Options,
    adopt: bool,
) -> Result<Generation> {
    if opts.fsync && !crate::caps::fsync_each(stage.fd()) {
        sys::syncfs(stage.fd())
            .context("cannot flush the staged tree to disk (nothing was published)")?;
    }
    let in_stage = || format!("{}/stage/{}/manifest", state.path.display(), stage.name);
    let name = {
        let mfd = sys::create_excl_at(stage.fd(), b"manifest")
            .with_context(|| format!("cannot write the manifest {}", in_stage()))?;
        let mut w = std::io::BufWriter::with_capacity(256 * 1024, std::fs::File::from(mfd));
        manifest
            .write(&mut w)
            .with_context(|| format!("cannot write the manifest {}", in_stage()))?;
        let file = w
            .into_inner()
            .map_err(|e| e.into_error())
            .with_context(|| format!("cannot write the manifest {}", in_stage()))?;
        rustix::fs::fchmod(&file, rustix::fs::Mode::from_raw_mode(0o644))
            .context("cannot write the manifest")?;
        if opts.fsync {
            sys::fsync(file.as_fd()).context("cannot flush the manifest")?;
        }
        manifest.digest[..GEN_LEN].to_string()
    };
    let mut claims = vec![Claim::take(state, &name)?];
    store_manifest(state, stage, &name)?;
    sys::crash_point("after-manifest");
    if vol.layout == Layout::Dir {
        // DEST is the live tree: the staged tree is exchanged in, not renamed into gen/.
        if let Some(sig) = sys::signals::pending() {
            return Err(Failure::Interrupted(sig).into());
        }
        let replaced = layout::dir::publish(vol, state, stage, &name, opts.fsync)?;
        sys::crash_point("after-publish");
        if let Some(old) = replaced.as_deref().or(old).filter(|o| *o != name) {
            let _ = state.stamp(old, "retired");
        }
        return Ok(Generation {
            name,
            digest: manifest.digest.clone(),
            converged: false,
        });
    }
    still_staged(state, stage)?;
    let (name, converged) =
        match sys::rename_at(stage.fd(), b"tree", state.gen.as_fd(), name.as_bytes()) {
            Ok(()) => (name, false),
            // EEXIST/ENOTEMPTY, EPERM on sshfs, ENOTDIR for a planted non-directory.
            Err(_) if sys::exists_at(state.gen.as_fd(), name.as_bytes()).unwrap_or(false) => {
                if intact(state, &name, manifest) {
                    state.stamp(&name, "used")?;
                    (name, true)
                } else {
                    // Someone edited that generation in place: ours gets a name of its own.
                    let fresh = format!("{name}-{:08x}", sys::random_u64() as u32);
                    claims.push(Claim::take(state, &fresh)?);
                    let fresh_manifest = format!("{fresh}.manifest");
                    sys::link_at(
                        stage.fd(),
                        b"manifest",
                        state.meta.as_fd(),
                        fresh_manifest.as_bytes(),
                    )
                    .or_else(|_| {
                        sys::rename_at(
                            stage.fd(),
                            b"manifest",
                            state.meta.as_fd(),
                            fresh_manifest.as_bytes(),
                        )
                    })
                    .context("cannot store the manifest")?;
                    sys::rename_at(stage.fd(), b"tree", state.gen.as_fd(), fresh.as_bytes())
                        .with_context(|| {
                            format!(
                                "cannot move the staged tree to {}/gen/{fresh}",
                                state.path.display()
                            )
                        })?;
                    (fresh, false)
                }
            }
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "cannot move the staged tree to {}/gen/{name}",
                        state.path.display()
                    )
                })
            }
        };
    sys::crash_point("after-rename");
    ensure_present(state, stage, &name)?;
    if opts.fsync {
        sys::fsync(state.gen.as_fd()).context("cannot flush gen/")?;
        sys::fsync(state.meta.as_fd()).context("cannot flush meta/")?;
    }
    sys::crash_point("before-publish");
    sys::pause_point("before-publish");
    if let Some(sig) = sys::signals::pending() {
        return Err(Failure::Interrupted(sig).into());
    }
    // What DEST shows just before the swap: another writer may have replaced `old`.
    let replaced = match vol.inspect() {
        Ok(Dest::Live(g)) => Some(g),
        _ => None,
    };
    publish_as(vol, state, stage, &name, opts, adopt)?;
    sys::crash_point("after-publish");
    if state.open_gen(&name).is_err() {
        // Moved aside by a collector that then died: put it back at once.
        ensure_present(state, stage, &name)?;
    }
    for old in [replaced.as_deref(), old].into_iter().flatten() {
        if old != name {
            // Best effort: without the stamp the grace period counts from the old manifest.
            let _ = state.stamp(old, "retired");
        }
    }
    drop(claims);
    Ok(Generation {
        name,
        digest: manifest.digest.clone(),
        converged,
    })
}

/// Whether generation `name` on the volume still holds exactly `manifest`'s tree.
fn intact(state: &State, name: &str, manifest: &Manifest) -> bool {
    let Ok(fd) = state.open_gen(name) else {
        return false;
    };
    // Content too: a file edited in place with its size and mtime kept
    // passes every metadata check, and `sync --checksum` staged the fix.
    let rules = crate::verify::Rules::of(manifest);
    crate::verify::run(&fd, name, &manifest.tree, rules).is_ok_and(|d| d.is_empty())
}

/// Our staging directory is still `stage/<me>`. A writer paused for longer
/// than `config::STALE_STAGE` may have had it taken for a dead writer's by
/// another host; then nothing is published. The touch is a heartbeat that
/// such a collector, checking again after moving it aside, sees.
fn still_staged(state: &State, stage: &Stage) -> Result<()> {
    let _ = sys::touch_fd(stage.fd());
    for wait_ms in [0, 5, 20, 100, 500] {
        std::thread::sleep(std::time::Duration::from_millis(wait_ms));
        if let (Ok(a), Ok(b)) = (
            sys::fstat(stage.fd()),
            sys::stat_at(state.stage.as_fd(), stage.name.as_bytes()),
        ) {
            if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino) {
                return Ok(());
            }
        }
    }
    anyhow::bail!(
        "{}/stage/{}: this sync's staging directory was removed by another writer \
         (taken for a dead writer's after {} s without change); nothing was published, run the sync again",
        state.path.display(),
        stage.name,
        crate::config::STALE_STAGE.as_secs()
    )
}

/// `gen/<name>` and its manifest are there, under our claim, before DEST
/// may point at them. First wait while a collector announces it is removing
/// it (it either backs off, having seen our claim, or finishes); one that
/// moved it aside anyway sees the claim and moves it back; if it stays gone,
/// it is taken back from `trash/`, or ours is renamed in from staging.
fn ensure_present(state: &State, stage: &Stage, name: &str) -> Result<()> {
    crate::claim::wait_for_collectors(state, name);
    let mut present = false;
    for wait_ms in [0, 2, 5, 10, 20, 50, 100, 200, 500] {
        std::thread::sleep(std::time::Duration::from_millis(wait_ms));
        if state.open_gen(name).is_ok() {
            present = true;
            break;
        }
    }
    if !present && !crate::retire::recover(state, name) {
        sys::rename_at(stage.fd(), b"tree", state.gen.as_fd(), name.as_bytes()).with_context(
            || {
                format!(
                "generation {}/gen/{name} was removed while being published; run the sync again",
                state.path.display()
            )
            },
        )?;
    }
    let mname = format!("{name}.manifest");
    if !sys::exists_at(state.meta.as_fd(), mname.as_bytes())? {
        store_manifest(state, stage, name)?;
    }
    Ok(())
}

/// Store the staged manifest as `meta/<name>.manifest`: by hardlink, so the
/// staged one stays for a retry, or by rename where the volume has no
/// hardlinks. One already there is the same tree's (the name is its digest)
/// and is kept; anything but a file there (a planted symlink) is replaced.
fn store_manifest(state: &State, stage: &Stage, name: &str) -> Result<()> {
    let mname = format!("{name}.manifest");
    let failed = || {
        format!(
            "cannot store the manifest {}/meta/{mname}",
            state.path.display()
        )
    };
    let link = || {
        sys::link_at(
            stage.fd(),
            b"manifest",
            state.meta.as_fd(),
            mname.as_bytes(),
        )
    };
    match link() {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if sys::stat_at(state.meta.as_fd(), mname.as_bytes())
                .is_ok_and(|st| sys::kind_of(&st) != sys::StatKind::File)
            {
                sys::remove_tree_at(state.meta.as_fd(), mname.as_bytes())
                    .and_then(|_| link())
                    .with_context(failed)?;
            }
            Ok(())
        }
        Err(_) => sys::rename_at(
            stage.fd(),
            b"manifest",
            state.meta.as_fd(),
            mname.as_bytes(),
        )
        .with_context(failed),
    }
}

/// Point DEST at generation `name` with one rename (or exchange), whatever
/// the layout (`opts.swap` matters to the symlink layout only).
/// Generation `name` is claimed first and must be there (see `ensure_present`).
pub fn publish(vol: &Volume, stage: &Stage, name: &str, opts: &Options) -> Result<()> {
    let state = vol
        .state(false)?
        .with_context(|| format!("{}: the state directory is missing", vol.display))?;
    let claim = Claim::take(&state, name)?;
    let _ = state.stamp(name, "used");
    ensure_present(&state, stage, name)?;
    publish_as(vol, &state, stage, name, opts, false)?;
    drop(claim);
    Ok(())
}

fn publish_as(
    vol: &Volume,
    state: &State,
    stage: &Stage,
    name: &str,
    opts: &Options,
    adopt: bool,
) -> Result<()> {
    match vol.layout {
        Layout::Symlink => link(vol, stage, name, opts),
        Layout::Dir => layout::dir::publish(vol, state, stage, name, opts.fsync).map(|_| ()),
        Layout::Fanout => {
            layout::fanout::claim(vol, &layout::fanout::top_level(state, name)?)?;
            link(vol, stage, name, opts)?;
            let warnings = layout::fanout::reconcile(vol, state, adopt.then_some(stage))?;
            for w in warnings {
                eprintln!("packsync: warning: {w}");
            }
            if opts.fsync {
                sys::fsync(vol.parent.as_fd())
                    .with_context(|| format!("cannot flush {}", vol.display))?;
            }
            Ok(())
        }
    }
}

/// Rename a fresh link to generation `name` over the published name.
fn link(vol: &Volume, stage: &Stage, name: &str, opts: &Options) -> Result<()> {
    let target = vol.link_target(name);
    let _ = sys::unlink_at(stage.fd(), b"link");
    sys::symlink_at(&target, stage.fd(), b"link")
        .context("cannot create the new DEST link in staging")?;
    match opts.swap {
        Swap::Link => sys::rename_at(stage.fd(), b"link", vol.parent.as_fd(), &vol.name),
        Swap::Exchange => sys::rename_exchange(stage.fd(), b"link", vol.parent.as_fd(), &vol.name),
        Swap::Migrate => sys::rename_at(vol.parent.as_fd(), &vol.name, stage.fd(), b"old")
            .and_then(|()| sys::rename_at(stage.fd(), b"link", vol.parent.as_fd(), &vol.name)),
    }
    .with_context(|| format!("cannot publish {}", vol.display))?;
    if opts.fsync {
        sys::fsync(vol.parent.as_fd())
            .with_context(|| format!("cannot flush {}", vol.parent_path.display()))?;
    }
    Ok(())
}
