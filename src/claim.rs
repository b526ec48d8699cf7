//! A writer's claim on the generation it is about to publish (or roll back
//! to), `leases/<GEN>.<host>-<pid>-<random>`, and a collector's intent to
//! remove one, `leases/<GEN>.<host>-<pid>-<random>.retiring`: the two flags
//! of the lock-free protocol, see docs/architecture.md, "The on-disk protocol".
//! Each dies with its process: on the same host one of a dead pid is ignored
//! and removed; another host's is trusted while it is fresh.

use std::ops::ControlFlow::{Break, Continue};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::clock;
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
        state
            .leases
            .make_file(name.as_bytes())
            .with_context(|| format!("cannot create {}/leases/{name}", state.path.display()))?;
        Ok(Claim { state, name })
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        let _ = self.state.leases.unlink(self.name.as_bytes());
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
        state
            .leases
            .make_file(name.as_bytes())
            .with_context(|| format!("cannot create {}/leases/{name}", state.path.display()))?;
        Ok(Intent { state, name })
    }
}

impl Drop for Intent<'_> {
    fn drop(&mut self) {
        let _ = self.state.leases.unlink(self.name.as_bytes());
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
        _ => state.leases.stat(name.as_bytes()).is_ok_and(|st| {
            clock::now_f64() - (sys::mtime_of(&st).0 as f64) < INTENT_STALE.as_secs_f64()
        }),
    }
}

/// Wait (about two seconds at most) while a collector announces it is
/// removing `gen`; it finishes or backs off within milliseconds.
pub fn wait_for_collectors(state: &State, gen: &str) {
    let prefix = format!("{gen}.");
    let _ = clock::retry(&[0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000], |_| {
        let Ok(list) = state.leases.list() else {
            return Break(());
        };
        let busy = list.iter().any(|l| {
            let name = String::from_utf8_lossy(&l.name);
            name.starts_with(&prefix) && intent_alive(state, &name)
        });
        if busy {
            Continue(())
        } else {
            Break(())
        }
    });
}
