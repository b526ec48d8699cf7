//! Layouts: how DEST is published. One `Driver` trait says what every layout
//! does; each layout is one file that implements it:
//!
//! * `symlink` (default): DEST is a relative link into `.<name>.packsync/gen/`.
//! * `fanout`: DEST is a real directory holding a data link and one link per
//!   top-level entry; several slots may share it.
//! * `dir`: DEST is the live tree itself, a real directory swapped with
//!   renameat2(RENAME_EXCHANGE).
//!
//! Every layout publishes through a `Volume` (the directory holding the
//! published name, and a state directory of one shape), so commit, retire
//! and the read-only commands work on all of them through the driver that
//! `driver_for` picks: the one place that matches `config::Layout`. This
//! module also finds the layout of an existing DEST (`current`, `find`) and
//! opens DEST for a sync (`open_for_sync`), which never writes: a fanout
//! DEST is created by the first `Volume::state(true)`, once every refusal
//! has passed. A new layout is a new file here, an arm in `driver_for`, and
//! its recognition in `current`.

pub mod dir;
pub mod fanout;
pub mod symlink;

use std::path::Path;

use anyhow::{Context, Result};

use crate::config::Layout;
use crate::error;
use crate::staging::Stage;
use crate::sys::{self, DirFd};
use crate::volume::{Dest, State, Volume};

/// The live generation, opened.
pub struct LiveTree {
    /// Its name (what `status` shows and leases name).
    pub gen: String,
    /// A handle on its root directory: reads through it see this generation
    /// and no other, whatever writers publish meanwhile.
    pub root: DirFd,
}

/// How DEST is replaced (the symlink layout; the others have one way each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Swap {
    /// DEST is absent or a packsync link: rename(2) over it.
    Link,
    /// DEST is a real directory: exchange it atomically for the link.
    Exchange,
    /// DEST is a real directory and `--migrate`: move it away, then rename (a gap).
    Migrate,
}

/// How a generation is published.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Flush what the publish changed (not `--no-fsync`).
    pub fsync: bool,
    pub swap: Swap,
    /// `--adopt` (fanout): entries of DEST packsync did not make give way.
    pub adopt: bool,
}

/// What a layout found before anything is written (fanout's checks).
#[derive(Debug, Default)]
pub struct Check {
    /// Entries packsync did not make that `--adopt` replaces or removes.
    pub adopt: Vec<Vec<u8>>,
    /// The published tree's links do not match its live generation (a writer
    /// was killed between its swap and its links, or someone edited DEST).
    pub repair: bool,
}

/// What publishing did.
#[derive(Debug, Default)]
pub struct Published {
    /// Generations that stopped being live (their grace period starts now).
    pub replaced: Vec<String>,
    /// For the reporter: what the publish left undone (fanout entries that
    /// belong to someone else).
    pub warnings: Vec<String>,
    /// Where in the staging directory the publish left a real directory it
    /// took out of DEST (a directory `cp -aR` left), to be kept.
    pub taken_over: Option<&'static [u8]>,
}

/// What every layout does. The state directory's shape and the protocol
/// around publishing (claims, convergence, retire) are the same for all;
/// see docs/architecture.md, "Layouts (and adding one)" and "The on-disk protocol".
pub trait Driver: Sync {
    /// What `--layout` takes and `status` shows.
    fn name(&self) -> &'static str;

    /// DEST (opened by `Volume::open`) as this layout publishes it: where the
    /// published name and the state directory are. Writes nothing.
    fn open(&self, base: Volume, slot: Option<&str>) -> Result<Volume>;

    /// What DEST is now.
    fn inspect(&self, vol: &Volume) -> Result<Dest> {
        vol.read_dest()
    }

    /// The live generation opened; its name and handle always agree, even
    /// while writers publish.
    fn open_live(&self, vol: &Volume, state: &State) -> Result<Option<LiveTree>>;

    /// Generation `gen` opened (retained or live).
    fn open_generation(&self, vol: &Volume, state: &State, gen: &str) -> Result<DirFd> {
        let _ = vol;
        state.open_gen(gen)
    }

    /// Whether the live generation is a directory in `gen/` that DEST points
    /// at (commit renames a staged tree there before publishing). False when
    /// DEST is the tree itself: a tree is then in a writer's staging while
    /// it is exchanged, so retire must not take its metadata for an orphan's.
    fn live_in_gen(&self) -> bool {
        true
    }

    /// Whether several trees (`--slot`) may publish into one DEST, and
    /// `--adopt` means something.
    fn has_slots(&self) -> bool {
        false
    }

    /// Refuse a DEST this layout cannot publish over, before anything is read.
    fn check_dest(&self, vol: &Volume, dest: &Dest) -> Result<()> {
        refuse_dest(vol, dest)
    }

    /// Refusals that need the new tree's top-level `names` (and the live
    /// one's, if any), before anything is written.
    fn check(
        &self,
        vol: &Volume,
        names: &[&[u8]],
        live: Option<&[&[u8]]>,
        adopt: bool,
    ) -> Result<Check> {
        let _ = (vol, names, live, adopt);
        Ok(Check::default())
    }

    /// Before staging into `stage`: refuse what cannot be published here
    /// (see `prepare`, which cleans up after a refusal), record the layout.
    fn prepare(&self, vol: &Volume, state: &State, stage: &DirFd, swap: Swap) -> Result<()> {
        let _ = (vol, state, stage, swap);
        Ok(())
    }

    /// Make generation `gen` live. It is claimed and present (in `gen/`, or
    /// staged as `stage/tree` when `live_in_gen` is false). `was_live` is the
    /// generation live when the sync began.
    fn publish(
        &self,
        vol: &Volume,
        state: &State,
        stage: &DirFd,
        gen: &str,
        was_live: Option<&str>,
        opts: &Options,
    ) -> Result<Published>;

    /// An up-to-date sync: bring what DEST shows in line with the live
    /// generation without publishing (fanout's entry links); warnings.
    fn repair(&self, vol: &Volume, state: &State, check: &Check) -> Result<Vec<String>> {
        let _ = (vol, state, check);
        Ok(Vec::new())
    }
}

/// The driver for `layout`: the one place that matches it.
pub fn driver_for(layout: Layout) -> &'static dyn Driver {
    match layout {
        Layout::Symlink => &symlink::Symlink,
        Layout::Fanout => &fanout::Fanout,
        Layout::Dir => &dir::Dir,
    }
}

/// The driver that publishes `vol`.
pub fn of(vol: &Volume) -> &'static dyn Driver {
    driver_for(vol.layout)
}

pub fn layout_name(l: Layout) -> &'static str {
    driver_for(l).name()
}

/// What DEST is now, as its layout reads it.
pub fn inspect(vol: &Volume) -> Result<Dest> {
    of(vol).inspect(vol)
}

/// The live generation's name (`None`: nothing published yet).
pub fn live_generation(vol: &Volume) -> Result<Option<String>> {
    Ok(match inspect(vol)? {
        Dest::Live(g) => Some(g),
        _ => None,
    })
}

/// See `Driver::open_live`.
pub fn open_live(vol: &Volume, state: &State) -> Result<Option<LiveTree>> {
    of(vol).open_live(vol, state)
}

/// See `Driver::open_generation`.
pub fn open_generation(vol: &Volume, state: &State, gen: &str) -> Result<DirFd> {
    of(vol).open_generation(vol, state, gen)
}

/// `Driver::prepare`, and after a refusal nothing left behind: the staging
/// directory, and the state directory when this sync made it.
pub fn prepare(
    vol: &Volume,
    state: &State,
    stage: &mut Stage,
    fresh_state: bool,
    swap: Swap,
) -> Result<()> {
    let refused = of(vol).prepare(vol, state, stage.dir(), swap);
    if refused.is_err() {
        stage.remove();
        if fresh_state {
            if let Ok(parent) = vol.parent() {
                let _ = parent.remove_tree(top(&vol.state_name()));
            }
        }
    }
    refused
}

/// The first component of a relative path.
fn top(path: &[u8]) -> &[u8] {
    path.split(|b| *b == b'/').next().unwrap_or_default()
}

/// The refusals every layout shares: DEST is a file, or a link packsync did not make.
pub fn refuse_dest(vol: &Volume, dest: &Dest) -> Result<()> {
    match dest {
        Dest::File => Err(error::usage(format!(
            "{}: DEST exists and is not a directory",
            vol.display
        ))),
        Dest::Foreign(t) => Err(error::refused(format!(
            "{}: not a packsync destination (a symlink to {t}); remove it or choose another DEST",
            vol.display
        ))),
        _ => Ok(()),
    }
}

/// Whether the filesystem of `dir` exchanges two names atomically
/// (renameat2 RENAME_EXCHANGE), probed with two directories made in `dir`.
pub fn exchange_works(dir: &DirFd) -> Result<bool> {
    dir.mkdir(b"probe-a", 0o700)
        .context("cannot probe the filesystem")?;
    dir.mkdir(b"probe-b", 0o700)
        .context("cannot probe the filesystem")?;
    let r = dir.rename_exchange(b"probe-a", dir, b"probe-b");
    let _ = dir.rmdir(b"probe-a");
    let _ = dir.rmdir(b"probe-b");
    Ok(r.is_ok())
}

/// The layout an existing DEST was published with (`None`: nothing packsync
/// made is there). `base` is DEST opened with `Volume::open`.
pub fn current(base: &Volume) -> Result<Option<Layout>> {
    let parent = match base.parent() {
        Ok(p) => p,
        // `--mkpath`: DEST's parent is not there yet, so neither is DEST.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let st = match parent.stat(&base.name) {
        Ok(st) => Some(st),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("cannot stat {}", base.display)),
    };
    let kind = st.as_ref().map(sys::kind_of);
    if kind == Some(sys::StatKind::Symlink) && matches!(base.read_dest()?, Dest::Live(_)) {
        return Ok(Some(Layout::Symlink));
    }
    if kind == Some(sys::StatKind::Dir) {
        let fd = parent
            .open_dir(&base.name)
            .with_context(|| format!("cannot open {}", base.display))?;
        if fd.open_dir(fanout::STATE).is_ok() {
            return Ok(Some(Layout::Fanout));
        }
    }
    match base.state(false)? {
        Some(state) if dir::is_marked(&state) => Ok(Some(Layout::Dir)),
        Some(_) => Ok(Some(Layout::Symlink)),
        None => Ok(None),
    }
}

/// Open an existing DEST for a command other than `sync`, whatever its
/// layout: one `Volume` per published tree, so one for the symlink and dir
/// layouts and one per slot with fanout (the unslotted tree first, then slots
/// by name). `slot` picks one slot. A DEST packsync did not make is refused (exit 3).
pub fn find(dest: &Path, slot: Option<&str>) -> Result<Vec<Volume>> {
    let base = Volume::open(dest, false)?;
    let layout = current(&base)?
        .ok_or_else(|| error::refused(format!("{}: not a packsync destination", base.display)))?;
    let driver = driver_for(layout);
    if !driver.has_slots() {
        if let Some(s) = slot {
            return Err(error::usage(format!(
                "{}: --slot {s}: DEST uses --layout {}; slots exist only with --layout fanout",
                base.display,
                layout_name(layout)
            )));
        }
        return Ok(vec![driver.open(base, None)?]);
    }
    let slots = fanout::slots(&base)?;
    let chosen: Vec<Option<String>> = match slot {
        None => slots.clone(),
        Some(s) => slots
            .iter()
            .filter(|x| x.as_deref() == Some(s))
            .cloned()
            .collect(),
    };
    if chosen.is_empty() {
        let known: Vec<String> = slots
            .iter()
            .map(|s| s.clone().unwrap_or_else(|| "(no slot)".into()))
            .collect();
        return Err(error::refused(format!(
            "{}: no slot {} here (slots: {})",
            base.display,
            slot.unwrap_or("(no slot)"),
            if known.is_empty() {
                "none yet".into()
            } else {
                known.join(", ")
            }
        )));
    }
    chosen
        .iter()
        .map(|s| driver.open(Volume::open(dest, false)?, s.as_deref()))
        .collect()
}

/// Open DEST for `sync` with the layout and slot the command line asks for
/// (`base` is DEST opened with `Volume::open`). Refuses a slot or `--adopt`
/// without fanout (exit 2), and a DEST published with another layout (exit
/// 3). Writes nothing: what the layout needs created is made by
/// `Volume::state(true)` when the sync is about to stage.
pub fn open_for_sync(base: Volume, cfg: &crate::config::SyncConfig) -> Result<Volume> {
    let want = cfg.layout;
    let driver = driver_for(want);
    if !driver.has_slots() {
        for (flag, set) in [("--slot", cfg.slot.is_some()), ("--adopt", cfg.adopt)] {
            if set {
                return Err(error::usage(format!("{flag} needs --layout fanout")));
            }
        }
    }
    if let Some(have) = current(&base)? {
        if have != want {
            return Err(error::refused(format!(
                "{}: was published with --layout {}; pass --layout {} (a live DEST does not change layout)",
                base.display,
                layout_name(have),
                layout_name(have)
            )));
        }
    }
    driver.open(base, cfg.slot.as_deref())
}
