//! `--layout symlink` (the default): DEST is a relative symlink into the
//! state directory beside it, replaced by renaming a fresh link over it.
//!
//! ```text
//! <parent>/<name>  ->  .<name>.packsync/gen/<GEN>
//! ```
//!
//! The link text is relative, so the volume works mounted at any path, and
//! rename(2) is all it needs (NFS has it; no RENAME_EXCHANGE), except to
//! take over a real directory at DEST atomically (`Swap::Exchange`; without
//! it, only `--migrate`). Fanout publishes its data link the same way
//! (`link`, `open_live`).

use std::ops::ControlFlow::{Break, Continue};

use anyhow::{Context, Result};

use super::{Driver, LiveTree, Options, Published, Swap};
use crate::config::Layout;
use crate::error;
use crate::sys::DirFd;
use crate::volume::{Dest, State, Volume};

pub struct Symlink;

impl Driver for Symlink {
    fn name(&self) -> &'static str {
        "symlink"
    }

    fn open(&self, base: Volume, _slot: Option<&str>) -> Result<Volume> {
        Ok(base.with_layout(Layout::Symlink))
    }

    fn open_live(&self, vol: &Volume, state: &State) -> Result<Option<LiveTree>> {
        open_live(vol, state)
    }

    fn prepare(&self, vol: &Volume, _state: &State, stage: &DirFd, swap: Swap) -> Result<()> {
        if swap == Swap::Exchange && !super::exchange_works(stage)? {
            return Err(error::refused(format!(
                "{}: is a directory and this filesystem cannot swap it atomically (no RENAME_EXCHANGE); \
                 pass --migrate to take it over with DEST missing for an instant",
                vol.display
            )));
        }
        Ok(())
    }

    fn publish(
        &self,
        vol: &Volume,
        _state: &State,
        stage: &DirFd,
        gen: &str,
        was_live: Option<&str>,
        opts: &Options,
    ) -> Result<Published> {
        let replaced = shown_before(vol, was_live);
        link(vol, stage, gen, opts)?;
        // The directory that was DEST, now in staging (`link`).
        let taken_over = match opts.swap {
            Swap::Link => None,
            Swap::Exchange => Some(&b"link"[..]),
            Swap::Migrate => Some(&b"old"[..]),
        };
        Ok(Published {
            replaced,
            warnings: Vec::new(),
            taken_over,
        })
    }
}

/// The generations that stop being live when a link is swapped now: what
/// DEST shows just before (another writer may have replaced `was_live`),
/// and `was_live`.
pub(super) fn shown_before(vol: &Volume, was_live: Option<&str>) -> Vec<String> {
    let shown = match vol.read_dest() {
        Ok(Dest::Live(g)) => Some(g),
        _ => None,
    };
    shown
        .into_iter()
        .chain(was_live.map(str::to_string))
        .collect()
}

/// The link's generation opened. The link may move on between reading it
/// and opening its target, and a collector may then retire the old target:
/// read again until they agree.
pub(super) fn open_live(vol: &Volume, state: &State) -> Result<Option<LiveTree>> {
    crate::clock::retry(&[0; 8], |_| {
        let gen = match vol.read_dest() {
            Ok(Dest::Live(g)) => g,
            Ok(_) => return Break(Ok(None)),
            Err(e) => return Break(Err(e)),
        };
        match state.open_gen(&gen) {
            Ok(root) => Break(Ok(Some(LiveTree { gen, root }))),
            Err(e) => match vol.read_dest() {
                Ok(Dest::Live(now)) if now == gen => Break(Err(e)),
                Ok(_) => Continue(e),
                Err(e) => Break(Err(e)),
            },
        }
    })?
}

/// Rename a fresh link to generation `gen` over the published name.
pub(super) fn link(vol: &Volume, stage: &DirFd, gen: &str, opts: &Options) -> Result<()> {
    let target = vol.link_target(gen);
    let parent = vol.parent()?;
    let _ = stage.unlink(b"link");
    stage
        .symlink(&target, b"link")
        .context("cannot create the new DEST link in staging")?;
    match opts.swap {
        Swap::Link => stage.rename(b"link", parent, &vol.name),
        Swap::Exchange => stage.rename_exchange(b"link", parent, &vol.name),
        Swap::Migrate => parent
            .rename(&vol.name, stage, b"old")
            .and_then(|()| stage.rename(b"link", parent, &vol.name)),
    }
    .with_context(|| format!("cannot publish {}", vol.display))?;
    if opts.fsync {
        parent
            .fsync()
            .and_then(|()| crate::sys::flush_fault("published"))
            .with_context(|| {
                format!(
                    "cannot flush {} after publishing (DEST already shows the new generation)",
                    vol.parent_path.display()
                )
            })?;
    }
    Ok(())
}
