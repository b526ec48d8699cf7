//! Commit: make a staged tree durable, name it by its digest, move it into
//! `gen/`, and publish it by renaming a fresh symlink over DEST.
//!
//! The protocol, which needs no lock:
//! 1. flush the staged data (`syncfs`, or nothing with `--no-fsync`);
//! 2. hardlink the manifest to `meta/<GEN>.manifest` (an existing one is the
//!    same tree: writers that staged identical trees converge on one GEN);
//! 3. rename `stage/<me>/tree` to `gen/<GEN>`; if GEN exists already, it is
//!    complete (only whole trees are ever renamed there), so reuse it and
//!    stamp `meta/<GEN>.used` so no collector retires it under us;
//! 4. create the symlink `stage/<me>/link` and rename it over DEST: the one
//!    atomic step readers can observe; flush DEST's parent;
//! 5. stamp `meta/<OLD>.retired`: the grace period of the old generation
//!    starts now, recorded on the volume so it holds across hosts and restarts.
//!
//! Collectors never remove a generation younger than the grace period, so a
//! generation between steps 3 and 4 is safe as long as a writer publishes
//! within the grace period of renaming (minutes, against milliseconds).
//!
//! The other layouts change step 4 (and, for `dir`, step 3): with fanout the
//! link is the slot's data link inside DEST, its new entries are claimed
//! before it moves and the entry links follow it (`layout::fanout`); with
//! `dir` the staged tree is exchanged with DEST itself (`layout::dir`).

use std::os::fd::AsFd;

use anyhow::{Context, Result};

use crate::config::Layout;
use crate::error::Failure;
use crate::layout;
use crate::manifest::Manifest;
use crate::sys;
use crate::volume::{Stage, State, Volume};

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
    if opts.fsync {
        sys::syncfs(stage.fd())
            .context("cannot flush the staged tree to disk (nothing was published)")?;
    }
    let text = manifest.seal();
    let name = manifest.digest[..GEN_LEN].to_string();
    let mname = format!("{name}.manifest");
    let mfd = sys::create_excl_at(stage.fd(), b"manifest")
        .context("cannot write the manifest in staging")?;
    sys::write_all(mfd.as_fd(), text.as_bytes()).context("cannot write the manifest in staging")?;
    rustix::fs::fchmod(mfd.as_fd(), rustix::fs::Mode::from_raw_mode(0o644))
        .context("cannot write the manifest")?;
    if opts.fsync {
        sys::fsync(mfd.as_fd()).context("cannot flush the manifest")?;
    }
    drop(mfd);
    match sys::link_at(
        stage.fd(),
        b"manifest",
        state.meta.as_fd(),
        mname.as_bytes(),
    ) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        // Filesystems without hardlinks: a rename replaces an identical manifest.
        Err(_) => sys::rename_at(
            stage.fd(),
            b"manifest",
            state.meta.as_fd(),
            mname.as_bytes(),
        )
        .context("cannot store the manifest")?,
    }
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
    let (name, converged) =
        match sys::rename_at(stage.fd(), b"tree", state.gen.as_fd(), name.as_bytes()) {
            Ok(()) => (name, false),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EEXIST | libc::ENOTEMPTY)) => {
                if intact(state, &name, manifest) {
                    state.stamp(&name, "used")?;
                    // Still there after the stamp: a collector that got it first wins, and the next run stages anew.
                    state.open_gen(&name).context(
                        "a generation with the same content was being retired; run the sync again",
                    )?;
                    (name, true)
                } else {
                    // Someone edited that generation in place: ours gets a name of its own.
                    let fresh = format!("{name}-{:08x}", sys::random_u64() as u32);
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
    if opts.fsync {
        sys::fsync(state.gen.as_fd()).context("cannot flush gen/")?;
        sys::fsync(state.meta.as_fd()).context("cannot flush meta/")?;
    }
    sys::crash_point("before-publish");
    if let Some(sig) = sys::signals::pending() {
        return Err(Failure::Interrupted(sig).into());
    }
    publish_as(vol, state, stage, &name, opts, adopt)?;
    sys::crash_point("after-publish");
    if let Some(old) = old.filter(|o| *o != name) {
        // Best effort: without the stamp the grace period counts from the old manifest.
        let _ = state.stamp(old, "retired");
    }
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
    let warn = crate::scan::Warnings::default();
    let Ok(existing) =
        crate::scan::run(fd.as_fd(), name, 0, &crate::scan::Filter::default(), &warn)
    else {
        return false;
    };
    let mut want = manifest.tree.clone();
    let c = crate::plan::Compare {
        owners: manifest.owners,
        checksum: false,
        granularity_ns: manifest.granularity_ns,
    };
    crate::plan::build(&mut want, Some(&existing), &c).up_to_date()
}

/// Point DEST at generation `name` with one rename (or exchange), whatever
/// the layout (`opts.swap` matters to the symlink layout only).
pub fn publish(vol: &Volume, stage: &Stage, name: &str, opts: &Options) -> Result<()> {
    let state = vol
        .state(false)?
        .with_context(|| format!("{}: the state directory is missing", vol.display))?;
    publish_as(vol, &state, stage, name, opts, false)
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
