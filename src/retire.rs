//! Retire: remove generations nobody may read any more, and staging left by
//! writers that are gone. Never removes the live generation, the `keep`
//! newest others, one retired (or made, or reused) less than `grace` ago, or
//! one leased by `exec` or claimed by a writer about to publish it (`claim`).
//! The collector's half of the lock-free protocol, and why `grace` has a
//! floor on shared volumes: see docs/architecture.md, "The on-disk protocol".
//! Directories that hold `.nfs*`/`.fuse_hidden*` files (still open
//! elsewhere) stay in `trash/` for a later run.

use std::time::Duration;

use anyhow::Result;

use crate::clock::now_f64 as now;
use crate::layout;
use crate::sys;
use crate::volume::{stage_owner, unique_name, State, Volume};

#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// Earlier generations kept besides the live one, newest first.
    pub keep: usize,
    /// How long a generation stays after it stopped being live.
    pub grace: Duration,
    /// Staging of another host is stale after this long without change.
    pub stale: Duration,
}

/// The least grace on a volume other clients share (FUSE, NFS, SMB, CephFS):
/// longer than the time a client may show an old DEST or an old listing.
pub const SHARED_MIN_GRACE: Duration = Duration::from_secs(120);

#[derive(Debug, Default)]
pub struct Retired {
    pub removed: Vec<String>,
    /// Generations whose removal must wait (files open on NFS/FUSE).
    pub left: Vec<String>,
    pub stale_stages: u64,
}

fn secs(st: &sys::Stat) -> f64 {
    let (s, ns) = sys::mtime_of(st);
    s as f64 + ns as f64 / 1e9
}

fn mtime_secs(state: &State, name: &str) -> Option<f64> {
    state.meta.stat(name.as_bytes()).ok().map(|st| secs(&st))
}

/// The mtimes of `gen`'s manifest and stamps: any change is activity.
fn stamps(state: &State, gen: &str) -> [Option<f64>; 3] {
    ["manifest", "retired", "used"].map(|w| mtime_secs(state, &format!("{gen}.{w}")))
}

/// When `gen` last mattered: made, reused, or retired.
pub fn last_active(state: &State, gen: &str) -> f64 {
    let [made, retired, used] = stamps(state, gen);
    let made = made.or_else(|| {
        let st = state.gen.stat(gen.as_bytes()).ok()?;
        Some(sys::mtime_of(&st).0 as f64)
    });
    [made, retired, used]
        .into_iter()
        .flatten()
        .fold(0.0, f64::max)
}

/// When `gen` was made (its manifest's mtime), for ordering.
pub fn made(state: &State, gen: &str) -> f64 {
    mtime_secs(state, &format!("{gen}.manifest")).unwrap_or(0.0)
}

/// Whether a live lease or claim holds `gen` (one of a dead local process does not).
pub fn leased(state: &State, gen: &str) -> bool {
    let Ok(list) = state.leases.list() else {
        return true;
    };
    let prefix = format!("{gen}.");
    list.iter().any(|l| {
        let name = String::from_utf8_lossy(&l.name);
        if name.ends_with(crate::claim::INTENT_SUFFIX) {
            return false;
        }
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
        _ => match state.leases.stat(name.as_bytes()) {
            Ok(st) => now() - (sys::mtime_of(&st).0 as f64) < 86_400.0,
            Err(_) => false,
        },
    }
}

fn live_gen(vol: &Volume) -> Result<Option<String>> {
    layout::live_generation(vol)
}

/// Apply `policy` to the state directory. `own_stage` is this writer's staging, left alone.
pub fn run(
    vol: &Volume,
    state: &State,
    policy: &Policy,
    own_stage: Option<&str>,
) -> Result<Retired> {
    let mut out = Retired::default();
    let shared = state.fd.fs_kind().map_or(true, |k| k.is_shared());
    let grace = if shared {
        policy.grace.max(SHARED_MIN_GRACE)
    } else {
        policy.grace
    };
    let live = live_gen(vol)?;
    let mut others: Vec<(f64, String)> = state
        .generations()?
        .into_iter()
        .filter(|g| Some(g) != live.as_ref())
        .map(|g| (made(state, &g), g))
        .collect();
    others.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)));
    let t = now();
    for (_, gen) in others.into_iter().skip(policy.keep) {
        let before = stamps(state, &gen);
        if t - last_active(state, &gen) < grace.as_secs_f64() || leased(state, &gen) {
            continue;
        }
        match remove_generation(vol, state, &gen, before) {
            Ok(Outcome::Removed) => out.removed.push(gen),
            Ok(Outcome::Kept) => {}
            Ok(Outcome::Left) | Err(_) => out.left.push(gen),
        }
    }
    sweep_trash(vol, state, policy.stale);
    out.stale_stages = remove_dead_stages(state, policy.stale, own_stage);
    if layout::of(vol).live_in_gen() {
        remove_orphan_meta(vol, state);
    } else {
        layout::dir::remove_stale_roots(vol, state, policy.stale);
    }
    remove_dead_leases(state);
    Ok(out)
}

enum Outcome {
    Removed,
    /// Someone wants it after all (or removed it first).
    Kept,
    /// Files still open elsewhere: its remains stay in `trash/` for later.
    Left,
}

/// `trash/` names say which process put them there: `<what>+<host>-<pid>-<random>`.
fn trash_name(what: &str) -> String {
    format!("{what}+{}", unique_name())
}

fn wanted(vol: &Volume, state: &State, gen: &str) -> bool {
    leased(state, gen) || live_gen(vol).map_or(true, |g| g.as_deref() == Some(gen))
}

fn remove_generation(
    vol: &Volume,
    state: &State,
    gen: &str,
    before: [Option<f64>; 3],
) -> Result<Outcome> {
    // Announce, then look: a writer claims, then looks for announcements.
    let intent = crate::claim::Intent::take(state, gen)?;
    if wanted(vol, state, gen) || stamps(state, gen) != before {
        return Ok(Outcome::Kept);
    }
    let aside = trash_name(gen);
    match state
        .gen
        .rename(gen.as_bytes(), &state.trash, aside.as_bytes())
    {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Outcome::Kept),
        Err(e) => return Err(e.into()),
    }
    sys::crash_point("retire-trash");
    sys::pause_point("retire-trash");
    // Nobody can start using it under its name now: look again.
    if wanted(vol, state, gen) || stamps(state, gen) != before {
        put_back(state, gen, &aside)?;
        return Ok(Outcome::Kept);
    }
    let mname = format!("{gen}.manifest");
    let maside = trash_name(&mname);
    let moved = state
        .meta
        .rename(mname.as_bytes(), &state.trash, maside.as_bytes())
        .is_ok();
    if wanted(vol, state, gen) || state.gen.exists(gen.as_bytes()).unwrap_or(true) {
        if moved {
            let _ = state
                .trash
                .rename(maside.as_bytes(), &state.meta, mname.as_bytes());
        }
        put_back(state, gen, &aside)?;
        return Ok(Outcome::Kept);
    }
    drop(intent);
    for what in ["retired", "used", "root", "after", "fetched"] {
        let _ = state.meta.unlink(format!("{gen}.{what}").as_bytes());
    }
    let _ = state.trash.unlink(maside.as_bytes());
    Ok(if state.trash.remove_tree(aside.as_bytes())? {
        Outcome::Removed
    } else {
        Outcome::Left
    })
}

/// Rename `trash/<aside>` back to `gen/<gen>`; if a writer renamed a fresh
/// copy in meanwhile, ours is not needed.
fn put_back(state: &State, gen: &str, aside: &str) -> Result<()> {
    let back = state
        .trash
        .rename(aside.as_bytes(), &state.gen, gen.as_bytes());
    if back.is_err() && state.gen.exists(gen.as_bytes())? {
        state.trash.remove_tree(aside.as_bytes())?;
        return Ok(());
    }
    Ok(back?)
}

/// Put a generation that a collector moved aside (and then died) back
/// under its name, if it is still missing there. For a writer that finds
/// the generation it just claimed gone.
pub fn recover(state: &State, gen: &str) -> bool {
    let Ok(list) = state.trash.list() else {
        return false;
    };
    let prefix = format!("{gen}+");
    list.iter().any(|l| {
        l.name.starts_with(prefix.as_bytes())
            && state
                .trash
                .rename(&l.name, &state.gen, gen.as_bytes())
                .is_ok()
    })
}

/// Whether a `trash/` entry's owner is done with it: this process, a dead
/// one on this host, or another host's untouched for `stale`.
fn owner_gone(state: &State, name: &[u8], owner: Option<&str>, stale: Duration) -> bool {
    let me = crate::volume::host_tag();
    match owner.and_then(stage_owner) {
        Some((host, pid)) if host == me => pid == sys::pid() || !sys::pid_alive(pid),
        _ => state
            .trash
            .stat(name)
            .is_ok_and(|st| now() - secs(&st) > stale.as_secs_f64()),
    }
}

/// Leftovers of removals that died midway, or that met open files: put
/// back what DEST or a claim still wants, delete the rest.
fn sweep_trash(vol: &Volume, state: &State, stale: Duration) {
    let Ok(list) = state.trash.list() else {
        return;
    };
    for l in list {
        let name = String::from_utf8_lossy(&l.name).into_owned();
        let (what, owner) = match name.rsplit_once('+') {
            Some((w, o)) => (w, Some(o)),
            None => (name.as_str(), None),
        };
        if !owner_gone(state, &l.name, owner, stale) {
            continue;
        }
        if let Some(gen) = what.strip_suffix(".manifest") {
            let mname = format!("{gen}.manifest");
            let missing = !state.meta.exists(mname.as_bytes()).unwrap_or(true);
            let needed =
                state.gen.exists(gen.as_bytes()).unwrap_or(true) || wanted(vol, state, gen);
            if missing
                && needed
                && state
                    .trash
                    .rename(&l.name, &state.meta, mname.as_bytes())
                    .is_ok()
            {
                continue;
            }
        } else if crate::volume::valid_gen(what.as_bytes())
            && !what.starts_with("stage-")
            && !state.gen.exists(what.as_bytes()).unwrap_or(true)
            && wanted(vol, state, what)
            && state
                .trash
                .rename(&l.name, &state.gen, what.as_bytes())
                .is_ok()
        {
            continue;
        }
        let _ = state.trash.remove_tree(&l.name);
    }
}

/// The staging of dead writers, removed before a sync gives up on a full
/// volume: how many went.
pub fn remove_dead_staging(vol: &Volume, state: &State, stale: Duration) -> u64 {
    // What an earlier removal left in trash/ goes first.
    sweep_trash(vol, state, stale);
    remove_dead_stages(state, stale, None)
}

/// Staging of a dead process on this host, or of any host untouched for
/// `stale`: moved into `trash/` first, checked again (a writer touches its
/// staging before it publishes), then deleted.
fn remove_dead_stages(state: &State, stale: Duration, own: Option<&str>) -> u64 {
    let Ok(list) = state.stage.list() else {
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
        let Ok(st) = state.stage.stat(&l.name) else {
            continue;
        };
        let old = t - secs(&st) > stale.as_secs_f64();
        let dead = match stage_owner(&name) {
            Some((host, pid)) if host == me => old || !sys::pid_alive(pid),
            _ => old,
        };
        if !dead {
            continue;
        }
        if sys::kind_of(&st) != sys::StatKind::Dir {
            // Not packsync's: a symlink or file planted here is removed, never followed.
            if state.stage.unlink(&l.name).is_ok() {
                n += 1;
            }
            continue;
        }
        let aside = trash_name(&format!("stage-{name}"));
        if state
            .stage
            .rename(&l.name, &state.trash, aside.as_bytes())
            .is_err()
        {
            continue;
        }
        sys::crash_point("stage-trash");
        let touched = state
            .trash
            .stat(aside.as_bytes())
            .map_or(true, |now| sys::mtime_of(&now) != sys::mtime_of(&st));
        if touched {
            // Its writer is alive after all.
            let _ = state.trash.rename(aside.as_bytes(), &state.stage, &l.name);
            continue;
        }
        if state.trash.remove_tree(aside.as_bytes()).unwrap_or(false) {
            n += 1;
        }
    }
    n
}

/// Manifests and stamps of generations that are not in `gen/`, live, or
/// claimed: left by a writer killed between storing its manifest and
/// renaming its tree. A manifest goes aside first and is put back if a
/// writer turns out to need it (as in `remove_generation`).
fn remove_orphan_meta(vol: &Volume, state: &State) {
    let Ok(list) = state.meta.list() else {
        return;
    };
    for l in list {
        let name = String::from_utf8_lossy(&l.name).into_owned();
        let Some((gen, what)) = name.rsplit_once('.') else {
            continue;
        };
        if !matches!(
            what,
            "manifest" | "retired" | "used" | "after" | "damaged" | "fetched"
        ) || !crate::volume::valid_gen(gen.as_bytes())
            || state.gen.exists(gen.as_bytes()).unwrap_or(true)
            || wanted(vol, state, gen)
        {
            continue;
        }
        if what != "manifest" {
            let _ = state.meta.unlink(&l.name);
            continue;
        }
        let aside = trash_name(&name);
        if state
            .meta
            .rename(&l.name, &state.trash, aside.as_bytes())
            .is_err()
        {
            continue;
        }
        if state.gen.exists(gen.as_bytes()).unwrap_or(true) || wanted(vol, state, gen) {
            let _ = state.trash.rename(aside.as_bytes(), &state.meta, &l.name);
        } else {
            let _ = state.trash.unlink(aside.as_bytes());
        }
    }
}

fn remove_dead_leases(state: &State) {
    let Ok(list) = state.leases.list() else {
        return;
    };
    for l in list {
        let name = String::from_utf8_lossy(&l.name).into_owned();
        let owner = name.split_once('.').map(|(_, o)| o).unwrap_or("");
        let alive = if name.ends_with(crate::claim::INTENT_SUFFIX) {
            crate::claim::intent_alive(state, &name)
        } else {
            lease_alive(state, &name, owner)
        };
        if !alive {
            let _ = state.leases.unlink(&l.name);
        }
    }
}
