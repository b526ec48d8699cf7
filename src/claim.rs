//! A writer's claim on the generation it is about to publish (or roll back
//! to): a lease file `leases/<GEN>.<host>-<pid>-<random>`, the same shape
//! `exec` uses, taken before the generation is stored or checked and dropped
//! once DEST points at it. Collectors (`retire`) look for claims *after*
//! moving a generation out of `gen/` and move it back when they find one,
//! so a claimed generation is never deleted, whatever the timing.
//!
//! The claim dies with its process: on the same host a lease of a dead pid
//! is ignored and removed; another host's is trusted while it is fresh (see
//! `retire::lease_alive`).
//!
//! A collector announces a removal the same way before it looks for claims:
//! an `Intent`, `leases/<GEN>.<host>-<pid>-<random>.retiring`. A writer
//! takes its claim, then waits while it sees an intent on its generation;
//! a collector takes its intent, then backs off when it sees a claim. Each
//! creates its own file before listing the other's, so at least one of them
//! sees the other (Dekker's two flags): a collector never moves a generation
//! a writer has checked and is about to publish.

use std::os::fd::AsFd;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::sys;
use crate::volume::{unique_name, State};

/// Held while a generation is being published; released when dropped.
/// Claims and intents are made with mknod, never opened: on FUSE a file
/// unlinked right after it was closed can linger as `.fuse_hidden*`.
pub struct Claim<'s> {
    state: &'s State,
    name: String,
}

impl<'s> Claim<'s> {
    /// Claim `gen` for this process.
    pub fn take(state: &'s State, gen: &str) -> Result<Claim<'s>> {
        let name = format!("{gen}.{}", unique_name());
        sys::make_file_at(state.leases.as_fd(), name.as_bytes())
            .with_context(|| format!("cannot create {}/leases/{name}", state.path.display()))?;
        Ok(Claim { state, name })
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        let _ = sys::unlink_at(self.state.leases.as_fd(), self.name.as_bytes());
    }
}

/// A collector's announcement that it is about to move a generation away.
pub struct Intent<'s> {
    state: &'s State,
    name: String,
}

pub const INTENT_SUFFIX: &str = ".retiring";

/// Another host's intent older than this is a dead collector's.
pub const INTENT_STALE: Duration = Duration::from_secs(60);

impl<'s> Intent<'s> {
    pub fn take(state: &'s State, gen: &str) -> Result<Intent<'s>> {
        let name = format!("{gen}.{}{INTENT_SUFFIX}", unique_name());
        sys::make_file_at(state.leases.as_fd(), name.as_bytes())
            .with_context(|| format!("cannot create {}/leases/{name}", state.path.display()))?;
        Ok(Intent { state, name })
    }
}

impl Drop for Intent<'_> {
    fn drop(&mut self) {
        let _ = sys::unlink_at(self.state.leases.as_fd(), self.name.as_bytes());
    }
}

/// Whether `leases/<name>` is an intent whose collector may still be at work.
pub fn intent_alive(state: &State, name: &str) -> bool {
    let Some(rest) = name.strip_suffix(INTENT_SUFFIX) else {
        return false;
    };
    let owner = rest.split_once('.').map_or("", |(_, o)| o);
    match crate::volume::stage_owner(owner) {
        Some((host, pid)) if host == crate::volume::host_tag() => sys::pid_alive(pid),
        _ => sys::stat_at(state.leases.as_fd(), name.as_bytes()).is_ok_and(|st| {
            let age = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64()
                - sys::mtime_of(&st).0 as f64;
            age < INTENT_STALE.as_secs_f64()
        }),
    }
}

/// Wait (about two seconds at most) while a collector announces it is
/// removing `gen`; it finishes or backs off within milliseconds.
pub fn wait_for_collectors(state: &State, gen: &str) {
    let prefix = format!("{gen}.");
    for wait_ms in [0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000] {
        std::thread::sleep(Duration::from_millis(wait_ms));
        let Ok(list) = sys::list_dir(state.leases.as_fd()) else {
            return;
        };
        let busy = list.iter().any(|l| {
            let name = String::from_utf8_lossy(&l.name);
            name.starts_with(&prefix) && intent_alive(state, &name)
        });
        if !busy {
            return;
        }
    }
}
