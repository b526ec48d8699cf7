//! The operator's commands around a sync: `status`, `verify`, `rollback`,
//! `wait`, `exec` (and `--exec-after`), one file each with one `run`. This
//! file holds what they share: opening a DEST that must be packsync's, the
//! path of a generation, and how times read.
//!
//! None of them writes inside a generation; `rollback` publishes through
//! `commit::publish`, `exec` writes only its lease.

pub mod exec;
pub mod gc;
pub mod rollback;
pub mod status;
pub mod verify;
pub mod wait;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::error;
use crate::layout::{self, LiveTree};
use crate::sys::{self, DirFd};
use crate::volume::{Dest, State, Volume};

/// One tree DEST publishes (DEST itself, or one fanout slot of it), opened.
pub struct Target {
    pub vol: Volume,
    pub state: State,
}

/// Open every tree DEST publishes (one; one per slot with fanout, or only
/// `slot`); refuse (exit 3) anything packsync did not make.
pub fn open(dest: &Path, slot: Option<&str>) -> Result<Vec<Target>> {
    let Some(base) = Volume::find(dest)? else {
        let parent = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        // The whole path, and what is wrong with it.
        let full = std::path::absolute(parent).unwrap_or_else(|_| parent.to_path_buf());
        let why = match std::fs::symlink_metadata(parent) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "does not exist",
            _ => "is not a directory",
        };
        return Err(error::refused(format!(
            "{}: not a packsync destination ({} {why})",
            dest.display(),
            full.display()
        )));
    };
    if layout::current(&base)?.is_none() {
        let why = match base.read_dest()? {
            Dest::File => "it is not a directory".to_string(),
            Dest::Foreign(t) => format!("a symlink to {t}"),
            Dest::Directory => {
                "a plain directory; the first `packsync sync` takes it over".to_string()
            }
            Dest::Absent | Dest::Live(_) => format!(
                "nothing there and no state directory {}",
                sys::os(&base.state_name()).to_string_lossy()
            ),
        };
        return Err(error::refused(format!(
            "{}: not a packsync destination ({why})",
            base.display
        )));
    }
    let mut out = Vec::new();
    for vol in layout::find(dest, slot)? {
        let state = vol.state(false)?.with_context(|| {
            format!(
                "{}: points into a missing state directory {}",
                vol.display,
                sys::os(&vol.state_name()).to_string_lossy()
            )
        })?;
        out.push(Target { vol, state });
    }
    Ok(out)
}

/// Open the one tree a command that changes or pins DEST works on.
pub fn open_one(dest: &Path, slot: Option<&str>) -> Result<Target> {
    let mut all = open(dest, slot)?;
    if all.len() > 1 {
        let names: Vec<String> = all.iter().map(|t| slot_name(&t.vol)).collect();
        return Err(error::usage(format!(
            "{}: publishes several slots ({}); choose one with --slot",
            dest.display(),
            names.join(", ")
        )));
    }
    Ok(all.remove(0))
}

/// `(no slot)` or the slot's name, for messages.
pub fn slot_name(vol: &Volume) -> String {
    vol.slot.clone().unwrap_or_else(|| "(no slot)".into())
}

impl Target {
    /// The live generation, or an error when DEST does not point at one yet.
    pub fn live(&self) -> Result<LiveTree> {
        layout::open_live(&self.vol, &self.state)?.with_context(|| {
            format!(
                "{}: no live generation yet (no sync has completed; `packsync wait` blocks until one has)",
                self.vol.display
            )
        })
    }

    /// `vol/packs`, or `vol/packs (slot a)` with fanout slots.
    pub fn shown(&self) -> String {
        match &self.vol.slot {
            Some(s) => format!("{} (slot {s})", self.vol.display),
            None => self.vol.display.clone(),
        }
    }
}

/// The absolute path of the generation `fd` holds open (for `PACKSYNC_ROOT`
/// and `status`): where the kernel has it now, so below the state directory,
/// or DEST itself for the live tree of `--layout dir`. Without /proc, the
/// path it has in `gen/`.
pub fn gen_path(fd: &DirFd, state: &State, gen: &str) -> PathBuf {
    fd.path().unwrap_or_else(|| in_gen(state, gen))
}

/// `gen_path` of generation `gen`, opened for the purpose.
pub fn path_of(vol: &Volume, state: &State, gen: &str) -> PathBuf {
    match layout::open_generation(vol, state, gen) {
        Ok(fd) => gen_path(&fd, state, gen),
        Err(_) => in_gen(state, gen),
    }
}

/// `<state>/gen/<gen>`, absolute.
fn in_gen(state: &State, gen: &str) -> PathBuf {
    std::path::absolute(&state.path)
        .unwrap_or_else(|_| state.path.clone())
        .join("gen")
        .join(gen)
}

/// `2024-05-01T12:00:00Z` for seconds since the epoch (UTC).
pub fn rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// `12s`, `5m`, `3h`, `2d`: how long ago, for tables.
pub fn age(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

/// Seconds since the epoch of `meta/<name>`'s mtime, if it exists.
pub fn meta_time(state: &State, name: &str) -> Option<i64> {
    let st = state.meta.stat(name.as_bytes()).ok()?;
    Some(sys::mtime_of(&st).0)
}

/// Generation `gen` of `state`, at `root` (named `label`), against its
/// manifest: a directory at a time where the manifest allows
/// (`verify::against_manifest`), else the whole manifest and tree, as
/// always. A manifest that does not read is the error `bad_manifest`
/// makes of it (what the command says and its exit code).
fn check_generation(
    state: &State,
    gen: &str,
    root: &DirFd,
    label: &str,
    bad_manifest: &dyn Fn(anyhow::Error) -> anyhow::Error,
) -> Result<crate::verify::Checked> {
    use crate::verify;
    if let Ok((r, shown)) = state.manifest_reader(gen) {
        if let Some(c) = verify::against_manifest(root, label, r.into_inner(), &shown)? {
            return Ok(c);
        }
    }
    let manifest = state.read_manifest(gen).map_err(bad_manifest)?;
    let rules = verify::Rules::of(&manifest);
    let differences = verify::run(root, label, &manifest.tree, rules)?;
    Ok(verify::Checked {
        entries: manifest.tree.count(),
        bytes: manifest.tree.bytes(),
        header: manifest,
        differences,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_714_564_800 + 3661), "2024-05-01T13:01:01Z");
        assert_eq!(age(5), "5s");
        assert_eq!(age(600), "10m");
        assert_eq!(age(3 * 3600), "3h");
        assert_eq!(age(3 * 86_400), "3d");
    }
}
