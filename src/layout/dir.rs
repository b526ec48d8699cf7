//! `--layout dir`: DEST is a real directory, and it is the live tree itself.
//!
//! ```text
//! <parent>/<name>/                    the live generation (a real directory)
//! <parent>/.<name>.packsync/layout    "dir": this DEST uses the dir layout
//!                          gen/<GEN>  earlier generations, as retired
//!                          meta/<GEN>.root   inode of the tree published as GEN
//! ```
//!
//! Publishing exchanges the staged tree with DEST in one
//! renameat2(RENAME_EXCHANGE), so a reader opening a path below DEST sees the
//! old tree or the new one, never a mix and never a missing DEST. The old tree
//! comes back in the writer's staging directory and is filed under
//! `gen/<OLD>`, where `OLD` is looked up by its inode: a directory keeps its
//! inode across renames, and `meta/<GEN>.root` is written before the exchange,
//! so racing writers each file whatever tree they got back under its right
//! name. Filesystems without RENAME_EXCHANGE (NFS, FUSE, GlusterFS) cannot
//! host this layout; `preflight` refuses them before anything is staged.
//!
//! Limits: no path pins the live generation (it moves when replaced), and
//! DEST cannot be a mount point (a mount point cannot be renamed); use
//! `--layout fanout` for a volume root.

use std::os::fd::AsFd;

use anyhow::{Context, Result};

use crate::error;
use crate::staging::Stage;
use crate::sys;
use crate::volume::{State, Volume};

const MARKER: &[u8] = b"layout";

/// Record in the state directory that DEST uses the dir layout.
pub fn mark(state: &State) -> Result<()> {
    match sys::create_excl_at(state.fd.as_fd(), MARKER) {
        Ok(fd) => sys::write_all(fd.as_fd(), b"dir\n")
            .with_context(|| format!("cannot write {}/layout", state.path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e).with_context(|| format!("cannot create {}/layout", state.path.display())),
    }
}

pub fn is_marked(state: &State) -> bool {
    sys::exists_at(state.fd.as_fd(), MARKER).unwrap_or(false)
}

/// The generation whose tree has inode `ino`, from `meta/<GEN>.root`. A
/// record of a tree that was removed unpublished (a writer killed between
/// recording and swapping) may name an inode the kernel has handed out again
/// since: the newest record wins, as it was written after that reuse.
pub fn gen_of(state: &State, ino: u64) -> Option<String> {
    // A handle of its own: a listing reads on from where the last one on a handle stopped.
    let meta = sys::open_dir_at(state.meta.as_fd(), b".").ok()?;
    let list = sys::list_dir(meta.as_fd()).ok()?;
    list.into_iter()
        .filter_map(|l| {
            let name = String::from_utf8(l.name).ok()?;
            let gen = name.strip_suffix(".root")?;
            let fd = sys::open_read_at(state.meta.as_fd(), name.as_bytes()).ok()?;
            let text = crate::volume::read_to_string(fd.as_fd()).ok()?;
            if text.trim().parse::<u64>().ok()? != ino {
                return None;
            }
            let written = sys::mtime_of(&sys::fstat(fd.as_fd()).ok()?);
            Some((written, gen.to_string()))
        })
        .max()
        .map(|(_, gen)| gen)
}

/// Refuse, before anything is staged, a DEST this layout cannot swap: a mount
/// point, or a filesystem without RENAME_EXCHANGE. `stage` is a fresh staging
/// directory on DEST's filesystem to probe in.
pub fn preflight(vol: &Volume, stage: &Stage) -> Result<()> {
    if let Ok(st) = sys::stat_at(vol.parent.as_fd(), &vol.name) {
        let parent = sys::fstat(vol.parent.as_fd())
            .with_context(|| format!("cannot stat {}", vol.parent_path.display()))?;
        if st.st_dev != parent.st_dev {
            return Err(error::refused(format!(
                "{}: is a mount point, which --layout dir cannot swap; use --layout fanout for a volume root",
                vol.display
            )));
        }
    }
    sys::mkdir_at(stage.fd(), b"probe-a", 0o700).context("cannot probe the filesystem")?;
    sys::mkdir_at(stage.fd(), b"probe-b", 0o700).context("cannot probe the filesystem")?;
    let r = sys::rename_exchange(stage.fd(), b"probe-a", stage.fd(), b"probe-b");
    let _ = sys::rmdir_at(stage.fd(), b"probe-a");
    let _ = sys::rmdir_at(stage.fd(), b"probe-b");
    r.map_err(|_| {
        error::refused(format!(
            "{}: --layout dir needs renameat2(RENAME_EXCHANGE), which this filesystem lacks \
             (NFS, FUSE and GlusterFS do); use --layout symlink or --layout fanout",
            vol.display
        ))
    })
}

/// Make generation `name` the tree at DEST. The tree is `stage/<me>/tree`
/// (a sync) or the retained `gen/<name>` (a rollback). Returns the generation
/// the exchange took out of DEST, now in `gen/`, if packsync knew it.
pub fn publish(
    vol: &Volume,
    state: &State,
    stage: &Stage,
    name: &str,
    fsync: bool,
) -> Result<Option<String>> {
    let from_gen = !sys::exists_at(stage.fd(), b"tree")?;
    if from_gen {
        sys::rename_at(state.gen.as_fd(), name.as_bytes(), stage.fd(), b"tree")
            .with_context(|| format!("cannot take {}/gen/{name}", state.path.display()))?;
    }
    let result = swap(vol, state, stage, name, fsync);
    if result.is_err() && from_gen {
        // Put the retained generation back where it was.
        let _ = sys::rename_at(stage.fd(), b"tree", state.gen.as_fd(), name.as_bytes());
    }
    let exchanged = result?;
    if !exchanged {
        return Ok(None);
    }
    // The tree that was live is now `stage/<me>/tree`: file it as what it was.
    let st = sys::stat_at(stage.fd(), b"tree").context("cannot find the replaced tree")?;
    let Some(old) = gen_of(state, st.st_ino as u64).filter(|g| g != name) else {
        // A directory packsync did not make (taken over): removed with the staging directory.
        return Ok(None);
    };
    match sys::rename_at(stage.fd(), b"tree", state.gen.as_fd(), old.as_bytes()) {
        Ok(()) => Ok(Some(old)),
        // A copy of the same generation is retained already: this one goes with the staging.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EEXIST | libc::ENOTEMPTY)) => Ok(Some(old)),
        Err(e) => Err(e).with_context(|| {
            format!(
                "cannot move the replaced tree to {}/gen/{old}",
                state.path.display()
            )
        }),
    }
}

/// Record the staged tree's inode, then put it at DEST. True when a tree was
/// exchanged out of DEST (it is then `stage/<me>/tree`).
fn swap(vol: &Volume, state: &State, stage: &Stage, name: &str, fsync: bool) -> Result<bool> {
    let st = sys::stat_at(stage.fd(), b"tree").context("cannot stat the staged tree")?;
    let _ = sys::unlink_at(stage.fd(), b"root");
    let fd = sys::create_excl_at(stage.fd(), b"root").context("cannot write the root record")?;
    sys::write_all(fd.as_fd(), format!("{}\n", st.st_ino).as_bytes())
        .context("cannot write the root record")?;
    rustix::fs::fchmod(fd.as_fd(), rustix::fs::Mode::from_raw_mode(0o644))
        .context("cannot write the root record")?;
    if fsync {
        sys::fsync(fd.as_fd()).context("cannot flush the root record")?;
    }
    drop(fd);
    let rname = format!("{name}.root");
    sys::rename_at(stage.fd(), b"root", state.meta.as_fd(), rname.as_bytes())
        .with_context(|| format!("cannot store {}/meta/{rname}", state.path.display()))?;
    if fsync {
        sys::fsync(state.meta.as_fd()).context("cannot flush meta/")?;
    }
    if let Some(sig) = sys::signals::pending() {
        return Err(crate::error::Failure::Interrupted(sig).into());
    }
    let exchanged = match sys::rename_noreplace(stage.fd(), b"tree", vol.parent.as_fd(), &vol.name)
    {
        Ok(()) => false,
        Err(e)
            if e.kind() == std::io::ErrorKind::AlreadyExists
                || e.kind() == std::io::ErrorKind::Unsupported =>
        {
            sys::rename_exchange(stage.fd(), b"tree", vol.parent.as_fd(), &vol.name)
                .with_context(|| format!("cannot publish {}", vol.display))?;
            true
        }
        Err(e) => return Err(e).with_context(|| format!("cannot publish {}", vol.display)),
    };
    if fsync {
        sys::fsync(vol.parent.as_fd())
            .with_context(|| format!("cannot flush {}", vol.parent_path.display()))?;
    }
    Ok(exchanged)
}

/// Before staging: refuse what this layout cannot swap (see `preflight`),
/// removing the staging and, when this sync made it, the state directory, so
/// that a refused sync leaves nothing behind; else mark the layout.
pub fn prepare(vol: &Volume, state: &State, stage: &mut Stage, fresh_state: bool) -> Result<()> {
    if let Err(e) = preflight(vol, stage) {
        stage.remove();
        if fresh_state {
            let _ = sys::remove_tree_at(vol.parent.as_fd(), &vol.state_name());
        }
        return Err(e);
    }
    mark(state)
}
