//! Layouts: how DEST is published, and finding out which one a DEST uses.
//!
//! * `symlink` (default): DEST is a relative link into `.<name>.packsync/gen/`.
//! * `fanout`: DEST is a real directory holding a data link and one link per
//!   top-level entry; several slots may share it (`fanout`).
//! * `dir`: DEST is the live tree itself, a real directory swapped with
//!   renameat2(RENAME_EXCHANGE) (`dir`).
//!
//! Every layout is a `Volume` whose `parent`/`name` is the published name and
//! whose state directory has the same shape, so commit, retire and the
//! read-only commands work on all of them. This module opens DEST the right
//! way for a layout (`open`), finds the layout of an existing DEST (`current`,
//! `find`) and opens the live tree whatever the layout (`open_live`). It never
//! writes, except to create DEST itself for a first fanout sync.

pub mod dir;
pub mod fanout;

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::config::Layout;
use crate::error;
use crate::sys;
use crate::volume::{State, Volume};

/// The live generation, opened.
pub struct LiveTree {
    /// Its name (what `status` shows and leases name).
    pub gen: String,
    /// A handle on its root directory: reads through it see this generation
    /// and no other, whatever writers publish meanwhile.
    pub root: OwnedFd,
    /// Its absolute path, for `PACKSYNC_ROOT`. With `--layout dir` this is
    /// DEST itself: the live tree moves when it is replaced, so no path pins it.
    pub path: PathBuf,
}

pub fn layout_name(l: Layout) -> &'static str {
    match l {
        Layout::Symlink => "symlink",
        Layout::Fanout => "fanout",
        Layout::Dir => "dir",
    }
}

/// Open DEST as `sync` publishes it with `layout`. With fanout, DEST itself is
/// created when absent and `create` (an existing empty directory, such as a
/// volume's mount point, is the usual first case).
pub fn open(
    dest: &Path,
    mkpath: bool,
    layout: Layout,
    slot: Option<&str>,
    create: bool,
) -> Result<Volume> {
    let mut vol = Volume::open(dest, mkpath)?;
    let root_path = vol.root_path();
    vol.layout = layout;
    if layout != Layout::Fanout {
        return Ok(vol);
    }
    if create {
        match sys::mkdir_at(vol.parent.as_fd(), &vol.name, 0o755) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e).with_context(|| format!("cannot create {}", vol.display)),
        }
    }
    let fd = match sys::open_dir_at(vol.parent.as_fd(), &vol.name) {
        Ok(fd) => fd,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {
            return Err(error::refused(format!(
                "{}: --layout fanout needs DEST to be a real directory (it is a symlink or a file)",
                vol.display
            )))
        }
        Err(e) => return Err(e).with_context(|| format!("cannot open {}", vol.display)),
    };
    Ok(Volume {
        parent: fd,
        parent_path: root_path,
        name: fanout::data_link(slot),
        display: vol.display,
        layout,
        slot: slot.map(str::to_string),
    })
}

/// The layout an existing DEST was published with (`None`: nothing packsync
/// made is there). `base` is DEST opened with `Volume::open`.
pub fn current(base: &Volume) -> Result<Option<Layout>> {
    let st = match sys::stat_at(base.parent.as_fd(), &base.name) {
        Ok(st) => Some(st),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("cannot stat {}", base.display)),
    };
    let kind = st.as_ref().map(sys::kind_of);
    if kind == Some(sys::StatKind::Symlink)
        && matches!(base.inspect()?, crate::volume::Dest::Live(_))
    {
        return Ok(Some(Layout::Symlink));
    }
    if kind == Some(sys::StatKind::Dir) {
        let fd = sys::open_dir_at(base.parent.as_fd(), &base.name)
            .with_context(|| format!("cannot open {}", base.display))?;
        if sys::open_dir_at(fd.as_fd(), fanout::STATE).is_ok() {
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
    let mut base = Volume::open(dest, false)?;
    let layout = current(&base)?
        .ok_or_else(|| error::refused(format!("{}: not a packsync destination", base.display)))?;
    if layout != Layout::Fanout {
        if let Some(s) = slot {
            return Err(error::usage(format!(
                "{}: --slot {s}: DEST uses --layout {}; slots exist only with --layout fanout",
                base.display,
                layout_name(layout)
            )));
        }
        base.layout = layout;
        return Ok(vec![base]);
    }
    let dest_fd = sys::open_dir_at(base.parent.as_fd(), &base.name)
        .with_context(|| format!("cannot open {}", base.display))?;
    let slots = fanout::slots(dest_fd.as_fd())
        .with_context(|| format!("cannot list the slots of {}", base.display))?;
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
        .map(|s| open(dest, false, Layout::Fanout, s.as_deref(), false))
        .collect()
}

/// See `Volume::open_live`.
pub fn open_live(vol: &Volume, state: &State) -> Result<Option<LiveTree>> {
    if vol.layout == Layout::Dir {
        let fd = match sys::open_dir_at(vol.parent.as_fd(), &vol.name) {
            Ok(fd) => fd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("cannot open {}", vol.display)),
        };
        let st = sys::fstat(fd.as_fd()).with_context(|| format!("cannot stat {}", vol.display))?;
        return Ok(dir::gen_of(state, st.st_ino as u64).map(|gen| LiveTree {
            gen,
            root: fd,
            path: absolute(&vol.root_path()),
        }));
    }
    // The link may move on between reading it and opening its target, and a
    // collector may then retire the old target: read again until they agree.
    let mut last_err = None;
    for _ in 0..8 {
        let Some(gen) = vol.live_generation()? else {
            return Ok(None);
        };
        match state.open_gen(&gen) {
            Ok(root) => {
                let path = absolute(&state.path).join("gen").join(&gen);
                return Ok(Some(LiveTree { gen, root, path }));
            }
            Err(e) => {
                if vol.live_generation()?.as_deref() == Some(gen.as_str()) {
                    return Err(e);
                }
                last_err = Some(e);
            }
        }
    }
    Err(last_err.expect("looped"))
}

/// See `Volume::open_generation`.
pub fn open_generation(vol: &Volume, state: &State, gen: &str) -> Result<OwnedFd> {
    if vol.layout == Layout::Dir {
        if let Some(live) = open_live(vol, state)? {
            if live.gen == gen {
                return Ok(live.root);
            }
        }
    }
    state.open_gen(gen)
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Open a relative path one component at a time, never following a symlink.
pub fn open_beneath(dir: std::os::fd::BorrowedFd<'_>, path: &[u8]) -> std::io::Result<OwnedFd> {
    let mut fd = sys::open_dir_at(dir, b".")?;
    for part in path.split(|b| *b == b'/').filter(|p| !p.is_empty()) {
        if part == b".." || part == b"." {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "path leaves its directory",
            ));
        }
        fd = sys::open_dir_at(fd.as_fd(), part)?;
    }
    Ok(fd)
}

/// Open DEST for `sync` with the layout and slot the command line asks for
/// (`base` is DEST opened with `Volume::open`). Refuses a slot or `--adopt`
/// without fanout (exit 2), and a DEST published with another layout (exit 3).
pub fn open_for_sync(base: Volume, cfg: &crate::config::SyncConfig) -> Result<Volume> {
    let want = cfg.layout;
    if want != Layout::Fanout {
        for (flag, set) in [("--slot", cfg.slot.is_some()), ("--adopt", cfg.adopt)] {
            if set {
                return Err(error::usage(format!("{flag} needs --layout fanout")));
            }
        }
    }
    if let Some(s) = &cfg.slot {
        if !fanout::valid_slot(s) {
            return Err(crate::cli::bad_value(
                "--slot",
                s,
                "use letters, digits, '-', '_' and '.', starting with a letter or digit (at most 64)",
            ));
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
    if want == Layout::Fanout && cfg.dry_run && !sys::exists_at(base.parent.as_fd(), &base.name)? {
        // Nothing there and nothing to create in a dry run: everything would be added.
        return Ok(base);
    }
    let create = !cfg.dry_run;
    let mkpath = cfg.mkpath && create;
    open(&cfg.dest, mkpath, want, cfg.slot.as_deref(), create)
}
