//! Retire: remove generations nobody may read any more, and staging left by
//! writers that are gone. Never removes the live generation, the `keep`
//! newest others, one retired (or made, or reused) less than `grace` ago, or
//! one leased by `exec`.
//!
//! A generation is removed by first renaming it into `trash/` (one atomic
//! step, so `gen/` only ever holds whole trees), then deleting it through
//! handles. If DEST turns out to point at it after the rename (a writer
//! reused it at that instant), it is renamed back at once. Directories that
//! hold `.nfs*`/`.fuse_hidden*` files (still open elsewhere) stay in `trash/`
//! for a later run.

use std::os::fd::AsFd;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Result;

use crate::sys;
use crate::volume::{stage_owner, Dest, State, Volume};

#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// Earlier generations kept besides the live one, newest first.
    pub keep: usize,
    /// How long a generation stays after it stopped being live.
    pub grace: Duration,
    /// Staging of another host is stale after this long without change.
    pub stale: Duration,
}

#[derive(Debug, Default)]
pub struct Retired {
    pub removed: Vec<String>,
    /// Generations whose removal must wait (files open on NFS/FUSE).
    pub left: Vec<String>,
    pub stale_stages: u64,
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

fn mtime_secs(state: &State, name: &str) -> Option<f64> {
    let st = sys::stat_at(state.meta.as_fd(), name.as_bytes()).ok()?;
    let (s, ns) = sys::mtime_of(&st);
    Some(s as f64 + ns as f64 / 1e9)
}

/// When `gen` last mattered: made, reused, or retired.
pub fn last_active(state: &State, gen: &str) -> f64 {
    let made = mtime_secs(state, &format!("{gen}.manifest")).or_else(|| {
        let st = sys::stat_at(state.gen.as_fd(), gen.as_bytes()).ok()?;
        Some(sys::mtime_of(&st).0 as f64)
    });
    [
        made,
        mtime_secs(state, &format!("{gen}.retired")),
        mtime_secs(state, &format!("{gen}.used")),
    ]
    .into_iter()
    .flatten()
    .fold(0.0, f64::max)
}

/// When `gen` was made (its manifest's mtime), for ordering.
pub fn made(state: &State, gen: &str) -> f64 {
    mtime_secs(state, &format!("{gen}.manifest")).unwrap_or(0.0)
}

/// Whether a live lease holds `gen` (a lease of a dead local process does not).
pub fn leased(state: &State, gen: &str) -> bool {
    let Ok(list) = sys::list_dir(state.leases.as_fd()) else {
        return true;
    };
    let prefix = format!("{gen}.");
    list.iter().any(|l| {
        let name = String::from_utf8_lossy(&l.name);
        let Some(owner) = name.strip_prefix(&prefix) else {
            return false;
        };
        lease_alive(state, &name, owner)
    })
}

fn lease_alive(state: &State, name: &str, owner: &str) -> bool {
    match stage_owner(owner) {
        Some((host, pid)) if host == crate::volume::host_tag() => sys::pid_alive(pid),
        // Another host's lease: its holder refreshes it; trust it for a day.
        _ => match sys::stat_at(state.leases.as_fd(), name.as_bytes()) {
            Ok(st) => now() - (sys::mtime_of(&st).0 as f64) < 86_400.0,
            Err(_) => false,
        },
    }
}

/// Apply `policy` to the state directory. `own_stage` is this writer's staging, left alone.
pub fn run(
    vol: &Volume,
    state: &State,
    policy: &Policy,
    own_stage: Option<&str>,
) -> Result<Retired> {
    let mut out = Retired::default();
    let live = match vol.inspect()? {
        Dest::Live(g) => Some(g),
        _ => None,
    };
    let mut others: Vec<(f64, String)> = state
        .generations()?
        .into_iter()
        .filter(|g| Some(g) != live.as_ref())
        .map(|g| (made(state, &g), g))
        .collect();
    others.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)));
    let t = now();
    for (_, gen) in others.into_iter().skip(policy.keep) {
        if t - last_active(state, &gen) < policy.grace.as_secs_f64() || leased(state, &gen) {
            continue;
        }
        match remove_generation(vol, state, &gen) {
            Ok(true) => out.removed.push(gen),
            Ok(false) | Err(_) => out.left.push(gen),
        }
    }
    // Leftovers of earlier removals.
    if let Ok(list) = sys::list_dir(state.trash.as_fd()) {
        for l in list {
            let _ = sys::remove_tree_at(state.trash.as_fd(), &l.name);
        }
    }
    out.stale_stages = remove_dead_stages(state, policy.stale, own_stage);
    remove_dead_leases(state);
    Ok(out)
}

fn remove_generation(vol: &Volume, state: &State, gen: &str) -> Result<bool> {
    let trash_name = format!("{gen}.{:016x}", sys::random_u64());
    sys::rename_at(
        state.gen.as_fd(),
        gen.as_bytes(),
        state.trash.as_fd(),
        trash_name.as_bytes(),
    )?;
    if vol.inspect()? == Dest::Live(gen.to_string()) {
        sys::rename_at(
            state.trash.as_fd(),
            trash_name.as_bytes(),
            state.gen.as_fd(),
            gen.as_bytes(),
        )?;
        return Ok(false);
    }
    for what in ["manifest", "retired", "used", "root"] {
        let _ = sys::unlink_at(state.meta.as_fd(), format!("{gen}.{what}").as_bytes());
    }
    Ok(sys::remove_tree_at(
        state.trash.as_fd(),
        trash_name.as_bytes(),
    )?)
}

/// Staging of a dead process on this host, or of another host untouched for `stale`.
fn remove_dead_stages(state: &State, stale: Duration, own: Option<&str>) -> u64 {
    let Ok(list) = sys::list_dir(state.stage.as_fd()) else {
        return 0;
    };
    let me = crate::volume::host_tag();
    let t = now();
    let mut n = 0;
    for l in list {
        let name = String::from_utf8_lossy(&l.name).into_owned();
        if Some(name.as_str()) == own {
            continue;
        }
        let dead = match stage_owner(&name) {
            Some((host, pid)) if host == me => !sys::pid_alive(pid),
            _ => match sys::stat_at(state.stage.as_fd(), &l.name) {
                Ok(st) => t - (sys::mtime_of(&st).0 as f64) > stale.as_secs_f64(),
                Err(_) => false,
            },
        };
        if dead && sys::remove_tree_at(state.stage.as_fd(), &l.name).unwrap_or(false) {
            n += 1;
        }
    }
    n
}

fn remove_dead_leases(state: &State) {
    let Ok(list) = sys::list_dir(state.leases.as_fd()) else {
        return;
    };
    for l in list {
        let name = String::from_utf8_lossy(&l.name).into_owned();
        let owner = name.split_once('.').map(|(_, o)| o).unwrap_or("");
        if !lease_alive(state, &name, owner) {
            let _ = sys::unlink_at(state.leases.as_fd(), &l.name);
        }
    }
}
