//! Commit: make a staged tree durable, name it by its digest, move it into
//! `gen/` (converging with writers that staged the same tree), and publish
//! it through the layout's driver. The writer's half of the lock-free
//! protocol: see docs/architecture.md, "The on-disk protocol".

use std::ops::ControlFlow::{Break, Continue};
use std::os::fd::AsFd;

use anyhow::{Context, Result};

use crate::claim::Claim;
use crate::clock;
use crate::error::Failure;
use crate::layout;
use crate::manifest::Manifest;
use crate::staging::Stage;
use crate::sys::{self, DirFd};
use crate::volume::{State, Volume};

pub use crate::layout::{Options, Swap};

/// A generation made live.
#[derive(Debug, Clone)]
pub struct Generation {
    pub name: String,
    /// What publishing left undone, for the reporter (fanout entries that
    /// belong to another slot or were not made by packsync).
    pub warnings: Vec<String>,
    /// Where in the staging directory the swap left a real directory it
    /// took out of DEST (`takeover::file` keeps it).
    pub taken_over: Option<&'static [u8]>,
}

/// What `run` commits, and where.
pub struct Commit<'a> {
    pub vol: &'a Volume,
    pub state: &'a State,
    /// The staging directory holding `tree`.
    pub stage: &'a Stage,
    /// The generation live when the sync began.
    pub was_live: Option<&'a str>,
    /// How the staged tree is made durable, as `caps::probe` decided it for
    /// staging (one `syncfs` here, or nothing more where stage fsynced each
    /// file, or nothing at all with `--no-fsync`).
    pub flush: crate::caps::Flush,
    pub opts: Options,
    /// The manifest's body is in the staging directory already (`body`,
    /// written by `stage::stream`), and `Manifest::tree` is empty.
    pub spooled: Option<&'a crate::manifest::Spooled>,
}

/// Durably store `manifest` and the tree staged in `stage/<me>/tree` as a
/// generation, publish it, and return it.
pub fn run(c: &Commit<'_>, manifest: &mut Manifest) -> Result<Generation> {
    let (vol, state) = (c.vol, c.state);
    let stage = c.stage.dir();
    if c.flush == crate::caps::Flush::Syncfs {
        stage
            .syncfs()
            .and_then(|()| sys::flush_fault("staged"))
            .context("cannot flush the staged tree to disk (nothing was published)")?;
    }
    let name = write_manifest(c, stage, manifest)?;
    let mut claims = vec![Claim::take(state, &name)?];
    store_manifest(state, stage, &name)?;
    sys::crash_point("after-manifest");
    let driver = layout::of(vol);
    let name = if driver.live_in_gen() {
        let name = converge(c, stage, name, manifest, &mut claims)?;
        sys::crash_point("after-rename");
        ensure_present(state, stage, &name)?;
        if c.opts.fsync {
            state.gen.fsync().context("cannot flush gen/")?;
            state.meta.fsync().context("cannot flush meta/")?;
        }
        sys::crash_point("before-publish");
        sys::pause_point("before-publish");
        name
    } else {
        // DEST is the live tree: the staged tree is exchanged in, not renamed into gen/.
        name
    };
    if let Some(sig) = sys::signals::pending() {
        return Err(Failure::Interrupted(sig).into());
    }
    let published = driver.publish(vol, state, stage, &name, c.was_live, &c.opts)?;
    sys::crash_point("after-publish");
    if driver.live_in_gen() && state.open_gen(&name).is_err() {
        // Moved aside by a collector that then died: put it back at once.
        ensure_present(state, stage, &name)?;
    }
    for old in published.replaced.iter().filter(|o| **o != name) {
        // Best effort: without the stamp the grace period counts from the old manifest.
        let _ = state.stamp(old, "retired");
    }
    drop(claims);
    Ok(Generation {
        name,
        warnings: published.warnings,
        taken_over: published.taken_over,
    })
}

/// Write `manifest` as `stage/<me>/manifest` (made readable once complete)
/// and return the generation name its digest gives.
fn write_manifest(c: &Commit<'_>, stage: &DirFd, manifest: &mut Manifest) -> Result<String> {
    let in_stage = || {
        format!(
            "cannot write the manifest {}/stage/{}/manifest",
            c.state.path.display(),
            c.stage.name
        )
    };
    let mfd = stage.create_excl(b"manifest").with_context(in_stage)?;
    // The `File` only writes the descriptor `sys` created in staging.
    let mut w = std::io::BufWriter::with_capacity(256 * 1024, std::fs::File::from(mfd));
    match c.spooled {
        None => manifest.write(&mut w).with_context(in_stage)?,
        Some(spooled) => {
            let body = stage.open_read(b"body").with_context(in_stage)?;
            // The `File` only reads the descriptor `sys` opened in staging.
            let mut body = std::fs::File::from(body);
            manifest
                .write_spooled(&mut w, spooled, &mut body)
                .with_context(in_stage)?;
        }
    }
    let file = w
        .into_inner()
        .map_err(|e| e.into_error())
        .with_context(in_stage)?;
    sys::set_mode_fd(file.as_fd(), 0o644).context("cannot write the manifest")?;
    if c.opts.fsync {
        sys::fsync(file.as_fd()).context("cannot flush the manifest")?;
    }
    Ok(manifest.digest[..crate::volume::GEN_LEN].to_string())
}

/// Rename the staged tree to `gen/<name>`. If that generation exists it is
/// the same tree (only whole trees are renamed there) once it matches the
/// manifest: reuse it. If it does not (edited in place, or not a directory),
/// ours gets a fresh name. Returns the name that holds our tree.
fn converge<'s>(
    c: &Commit<'s>,
    stage: &DirFd,
    name: String,
    manifest: &Manifest,
    claims: &mut Vec<Claim<'s>>,
) -> Result<String> {
    let state = c.state;
    still_staged(state, c.stage)?;
    let moved = |to: &str| {
        stage
            .rename(b"tree", &state.gen, to.as_bytes())
            .with_context(|| {
                format!(
                    "cannot move the staged tree to {}/gen/{to}",
                    state.path.display()
                )
            })
    };
    match stage.rename(b"tree", &state.gen, name.as_bytes()) {
        Ok(()) => Ok(name),
        // EEXIST/ENOTEMPTY, EPERM on sshfs, ENOTDIR for a planted non-directory.
        Err(_) if state.gen.exists(name.as_bytes()).unwrap_or(false) => {
            if intact(state, &name, manifest, c.spooled.is_some().then_some(stage)) {
                state.stamp(&name, "used")?;
                return Ok(name);
            }
            // Someone edited that generation in place: ours gets a name of its own.
            let fresh = fresh_name(&name);
            claims.push(Claim::take(state, &fresh)?);
            let fresh_manifest = format!("{fresh}.manifest");
            stage
                .link(b"manifest", &state.meta, fresh_manifest.as_bytes())
                .or_else(|_| stage.rename(b"manifest", &state.meta, fresh_manifest.as_bytes()))
                .context("cannot store the manifest")?;
            moved(&fresh)?;
            Ok(fresh)
        }
        Err(e) => Err(e).with_context(|| {
            format!(
                "cannot move the staged tree to {}/gen/{name}",
                state.path.display()
            )
        }),
    }
}

/// `<name>-<random>`: a generation of the same digest that is not the one
/// on the volume under `name`.
pub(crate) fn fresh_name(name: &str) -> String {
    format!("{name}-{:08x}", sys::random_u64() as u32)
}

/// Whether generation `name` on the volume still holds exactly `manifest`'s
/// tree; with `spooled`, against the body the streamed stage wrote there,
/// a directory at a time (`verify::holds_body`: no tree held whole, and
/// hardlinks the body does not have a difference, not named).
/// Content too: a file edited in place with its size and mtime kept
/// passes every metadata check, and `sync --checksum` staged the fix.
fn intact(state: &State, name: &str, manifest: &Manifest, spooled: Option<&DirFd>) -> bool {
    let Ok(fd) = state.open_gen(name) else {
        return false;
    };
    let rules = crate::verify::Rules::of(manifest);
    match spooled {
        None => crate::verify::run(&fd, name, &manifest.tree, rules).is_ok_and(|d| d.is_empty()),
        Some(stage) => crate::verify::holds_body(&fd, name, stage, rules).unwrap_or(false),
    }
}

/// Our staging directory is still `stage/<me>`. A writer paused for longer
/// than `config::STALE_STAGE` may have had it taken for a dead writer's by
/// another host; then nothing is published. The touch is a heartbeat that
/// such a collector, checking again after moving it aside, sees.
fn still_staged(state: &State, stage: &Stage) -> Result<()> {
    let _ = stage.dir().touch_self();
    let ours = clock::retry(&[0, 5, 20, 100, 500], |_| {
        match (stage.dir().fstat(), state.stage.stat(stage.name.as_bytes())) {
            (Ok(a), Ok(b)) if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino) => Break(()),
            _ => Continue(()),
        }
    });
    ours.map_err(|()| {
        anyhow::anyhow!(
            "{}/stage/{}: this sync's staging directory was removed by another writer \
             (taken for a dead writer's after {} s without change); nothing was published, run the sync again",
            state.path.display(),
            stage.name,
            crate::config::STALE_STAGE.as_secs()
        )
    })
}

/// `gen/<name>` and its manifest are there, under our claim, before DEST
/// may point at them. First wait while a collector announces it is removing
/// it (it either backs off, having seen our claim, or finishes); one that
/// moved it aside anyway sees the claim and moves it back; if it stays gone,
/// it is taken back from `trash/`, or ours is renamed in from staging.
fn ensure_present(state: &State, stage: &DirFd, name: &str) -> Result<()> {
    crate::claim::wait_for_collectors(state, name);
    let present = clock::retry(&[0, 2, 5, 10, 20, 50, 100, 200, 500], |_| {
        match state.open_gen(name) {
            Ok(_) => Break(()),
            Err(_) => Continue(()),
        }
    })
    .is_ok();
    if !present && !crate::retire::recover(state, name) {
        stage
            .rename(b"tree", &state.gen, name.as_bytes())
            .with_context(|| {
                format!(
                    "generation {}/gen/{name} was removed while being published; run the sync again",
                    state.path.display()
                )
            })?;
    }
    let mname = format!("{name}.manifest");
    if !state.meta.exists(mname.as_bytes())? {
        store_manifest(state, stage, name)?;
    }
    Ok(())
}

/// Store the staged manifest as `meta/<name>.manifest`: by hardlink, so the
/// staged one stays for a retry, or by rename where the volume has no
/// hardlinks. One already there is the same tree's (the name is its digest)
/// and is kept while it reads whole and matches its digest; one that does
/// not (cut short by a power loss, edited, not a file) is replaced by ours
/// in one rename, so a reader sees the old text or the new one.
fn store_manifest(state: &State, stage: &DirFd, name: &str) -> Result<()> {
    let mname = format!("{name}.manifest");
    let failed = || {
        format!(
            "cannot store the manifest {}/meta/{mname}",
            state.path.display()
        )
    };
    let link = || stage.link(b"manifest", &state.meta, mname.as_bytes());
    match link() {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let kind = state
                .meta
                .stat(mname.as_bytes())
                .map(|st| sys::kind_of(&st));
            if kind.is_ok_and(|k| k != sys::StatKind::File) {
                state
                    .meta
                    .remove_tree(mname.as_bytes())
                    .and_then(|_| link())
                    .with_context(failed)?;
            } else if !manifest_whole(state, stage, name) {
                let spare = b"manifest.replacing";
                let _ = stage.unlink(spare);
                stage
                    .link(b"manifest", stage, spare)
                    .and_then(|()| stage.rename(spare, &state.meta, mname.as_bytes()))
                    .or_else(|_| stage.rename(b"manifest", &state.meta, mname.as_bytes()))
                    .with_context(failed)?;
            }
            Ok(())
        }
        Err(_) => stage
            .rename(b"manifest", &state.meta, mname.as_bytes())
            .with_context(failed),
    }
}

/// Whether `meta/<name>.manifest` reads whole, matches its digest, and is
/// the staged manifest's tree (same digest).
fn manifest_whole(state: &State, stage: &DirFd, name: &str) -> bool {
    let digest_of = |m: Result<Manifest>| m.ok().map(|m| m.digest);
    let ours = stage
        .open_read(b"manifest")
        .map_err(anyhow::Error::from)
        .and_then(|fd| {
            // The `File` only reads the descriptor `sys` opened in staging.
            let mut r = std::io::BufReader::new(std::fs::File::from(fd));
            Manifest::read_header(&mut r)
        });
    let theirs = state.checked_header(name);
    matches!((digest_of(ours), digest_of(theirs)), (Some(a), Some(b)) if a == b)
}

/// Point DEST at generation `name` again (a rollback), through the layout's
/// driver. Generation `name` is claimed first and must be there (see
/// `ensure_present`).
pub fn publish(vol: &Volume, stage: &Stage, name: &str, opts: &Options) -> Result<()> {
    let state = vol
        .state(false)?
        .with_context(|| format!("{}: the state directory is missing", vol.display))?;
    let dir = stage.dir();
    let claim = Claim::take(&state, name)?;
    let _ = state.stamp(name, "used");
    ensure_present(&state, dir, name)?;
    layout::of(vol).publish(vol, &state, dir, name, None, opts)?;
    drop(claim);
    Ok(())
}
