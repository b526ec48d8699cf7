//! `--layout dir`: DEST is a real directory, and it is the live tree itself.
//!
//! ```text
//! <parent>/<name>/                    the live generation (a real directory)
//! <parent>/.<name>.packsync/layout    "dir": this DEST uses the dir layout
//!                          gen/<GEN>  earlier generations, as retired
//!                          meta/<GEN>.<INO>.root   the tree with inode INO was published as GEN
//! ```
//!
//! Publishing exchanges the staged tree with DEST in one
//! renameat2(RENAME_EXCHANGE), so a reader opening a path below DEST sees the
//! old tree or the new one, never a mix and never a missing DEST. The old tree
//! comes back in the writer's staging directory and is filed under
//! `gen/<OLD>`, where `OLD` is looked up by its inode: a directory keeps its
//! inode across renames, and `meta/<GEN>.<INO>.root` is written before the
//! exchange, so racing writers each file whatever tree they got back under
//! its right name. One record per tree, not per generation: writers that
//! start together stage the same GEN, and the second to swap takes out the
//! first one's tree, which readers may be in. That twin is filed as
//! `gen/<GEN>-<random>` (a generation of the same digest, as commit names
//! one that differs on the volume) and retired after the grace period like
//! any replaced tree. A record over an hour old whose tree is gone is removed
//! by the collector (`remove_stale_roots`). Filesystems without RENAME_EXCHANGE (NFS, FUSE, GlusterFS) cannot
//! host this layout; `preflight` refuses them before anything is staged.
//!
//! Limits: no path pins the live generation (it moves when replaced), and
//! DEST cannot be a mount point (a mount point cannot be renamed); use
//! `--layout fanout` for a volume root.

use anyhow::{Context, Result};

use super::{Driver, LiveTree, Options, Published, Swap};
use crate::config::Layout;
use crate::error;
use crate::sys::{self, DirFd};
use crate::volume::{Dest, State, Volume};

const MARKER: &[u8] = b"layout";

pub struct Dir;

impl Driver for Dir {
    fn name(&self) -> &'static str {
        "dir"
    }

    fn open(&self, base: Volume, _slot: Option<&str>) -> Result<Volume> {
        Ok(base.with_layout(Layout::Dir))
    }

    /// A real directory at DEST is the live generation whose recorded inode it has.
    fn inspect(&self, vol: &Volume) -> Result<Dest> {
        let dest = vol.read_dest()?;
        if dest != Dest::Directory {
            return Ok(dest);
        }
        let st = vol
            .parent()?
            .stat(&vol.name)
            .with_context(|| format!("cannot stat {}", vol.display))?;
        if let Some(state) = vol.state(false)? {
            if let Some(g) = gen_of(&state, st.st_ino) {
                return Ok(Dest::Live(g));
            }
        }
        Ok(Dest::Directory)
    }

    fn open_live(&self, vol: &Volume, state: &State) -> Result<Option<LiveTree>> {
        let fd = match vol.parent().and_then(|p| p.open_dir(&vol.name)) {
            Ok(fd) => fd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("cannot open {}", vol.display)),
        };
        let st = fd
            .fstat()
            .with_context(|| format!("cannot stat {}", vol.display))?;
        Ok(gen_of(state, st.st_ino).map(|gen| LiveTree { gen, root: fd }))
    }

    /// The live generation is DEST itself; the others are in `gen/`.
    fn open_generation(&self, vol: &Volume, state: &State, gen: &str) -> Result<DirFd> {
        if let Some(live) = self.open_live(vol, state)? {
            if live.gen == gen {
                return Ok(live.root);
            }
        }
        state.open_gen(gen)
    }

    fn live_in_gen(&self) -> bool {
        false
    }

    fn prepare(&self, vol: &Volume, state: &State, stage: &DirFd, _swap: Swap) -> Result<()> {
        preflight(vol, stage)?;
        mark(state)
    }

    fn publish(
        &self,
        vol: &Volume,
        state: &State,
        stage: &DirFd,
        gen: &str,
        was_live: Option<&str>,
        opts: &Options,
    ) -> Result<Published> {
        // The exchange says exactly which tree it took out; `was_live` only
        // counts when it did not (nothing there, or a directory taken over).
        let replaced = publish(vol, state, stage, gen, opts.fsync)?;
        // A tree exchanged out of DEST that no root record names is a
        // directory packsync did not make: left in staging, to be kept.
        let taken_over =
            (replaced.is_none() && stage.exists(b"tree").unwrap_or(false)).then_some(&b"tree"[..]);
        Ok(Published {
            replaced: replaced
                .or(was_live.map(str::to_string))
                .into_iter()
                .collect(),
            warnings: Vec::new(),
            taken_over,
        })
    }
}

/// Record in the state directory that DEST uses the dir layout.
pub fn mark(state: &State) -> Result<()> {
    match state.fd.create_excl(MARKER) {
        Ok(fd) => sys::write_all(std::os::fd::AsFd::as_fd(&fd), b"dir\n")
            .with_context(|| format!("cannot write {}/layout", state.path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e).with_context(|| format!("cannot create {}/layout", state.path.display())),
    }
}

pub fn is_marked(state: &State) -> bool {
    state.fd.exists(MARKER).unwrap_or(false)
}

/// `meta/` names of root records: `<GEN>.<INO>.root`; before per-tree
/// records, `<GEN>.root` holding the inode, which is still read.
const ROOT_SUFFIX: &str = ".root";

/// The generation and inode a root record's name gives (the inode `None`
/// for a record of the older form, which holds it instead).
fn parse_root_name(name: &str) -> Option<(&str, Option<u64>)> {
    let stem = name.strip_suffix(ROOT_SUFFIX)?;
    if let Some((gen, ino)) = stem.rsplit_once('.') {
        if let Ok(ino) = ino.parse::<u64>() {
            return crate::volume::valid_gen(gen.as_bytes()).then_some((gen, Some(ino)));
        }
    }
    crate::volume::valid_gen(stem.as_bytes()).then_some((stem, None))
}

/// The generation whose tree has inode `ino`, from the root records. A
/// record of a tree that was removed unpublished (a writer killed between
/// recording and swapping) may name an inode the kernel has handed out again
/// since: the newest record wins, as it was written after that reuse.
pub fn gen_of(state: &State, ino: u64) -> Option<String> {
    // A handle of its own: a listing reads on from where the last one on a handle stopped.
    let meta = state.meta.reopen().ok()?;
    let list = meta.list().ok()?;
    list.into_iter()
        .filter_map(|l| {
            let name = String::from_utf8(l.name).ok()?;
            let (gen, named) = parse_root_name(&name)?;
            let fd = state.meta.open_read(name.as_bytes()).ok()?;
            let fd = std::os::fd::AsFd::as_fd(&fd);
            let recorded = match named {
                Some(i) => i,
                None => crate::volume::read_to_string(fd)
                    .ok()?
                    .trim()
                    .parse()
                    .ok()?,
            };
            if recorded != ino {
                return None;
            }
            let written = sys::mtime_of(&sys::fstat(fd).ok()?);
            Some((written, gen.to_string()))
        })
        .max()
        .map(|(_, gen)| gen)
}

/// Remove the root records older than `stale` (an hour: when a writer's
/// staging counts as dead) whose tree is neither DEST,
/// nor in `gen/`, nor being staged: one is written per publish, and a tree
/// that was retired (or never swapped in by a writer that died) needs its
/// record no more. A writer records its tree just before the exchange, so a
/// record older than `stale` whose inode no tree has is no writer's.
pub fn remove_stale_roots(vol: &Volume, state: &State, stale: std::time::Duration) {
    let Ok(list) = state.meta.reopen().and_then(|m| m.list()) else {
        return;
    };
    let now = crate::clock::now_f64();
    let old: Vec<(Vec<u8>, u64)> = list
        .into_iter()
        .filter_map(|l| {
            let name = std::str::from_utf8(&l.name).ok()?;
            let (_, ino) = parse_root_name(name)?;
            let st = state.meta.stat(&l.name).ok()?;
            let (s, _) = sys::mtime_of(&st);
            let ino = ino.or_else(|| {
                let fd = state.meta.open_read(&l.name).ok()?;
                let text = crate::volume::read_to_string(std::os::fd::AsFd::as_fd(&fd)).ok()?;
                text.trim().parse().ok()
            })?;
            (now - s as f64 > stale.as_secs_f64()).then_some((l.name, ino))
        })
        .collect();
    if old.is_empty() {
        return;
    }
    // Every tree there is now, looked up after the records were listed.
    let mut trees = std::collections::HashSet::new();
    let mut note = |dir: &DirFd, name: &[u8]| {
        if let Ok(st) = dir.stat(name) {
            trees.insert(st.st_ino);
        }
    };
    if let Ok(parent) = vol.parent() {
        note(parent, &vol.name);
    }
    if let Ok(gens) = state.gen.reopen().and_then(|g| g.list()) {
        for g in gens {
            note(&state.gen, &g.name);
        }
    }
    if let Ok(stages) = state.stage.reopen().and_then(|s| s.list()) {
        for s in stages {
            if let Ok(dir) = state.stage.open_dir(&s.name) {
                note(&dir, b"tree");
            }
        }
    }
    for (name, ino) in old {
        if !trees.contains(&ino) {
            let _ = state.meta.unlink(&name);
        }
    }
}

/// Refuse, before anything is staged, a DEST this layout cannot swap: a mount
/// point, or a filesystem without RENAME_EXCHANGE. `stage` is a fresh staging
/// directory on DEST's filesystem to probe in.
pub fn preflight(vol: &Volume, stage: &DirFd) -> Result<()> {
    let parent = vol.parent()?;
    if let Ok(st) = parent.stat(&vol.name) {
        let up = parent
            .fstat()
            .with_context(|| format!("cannot stat {}", vol.parent_path.display()))?;
        if st.st_dev != up.st_dev {
            return Err(error::refused(format!(
                "{}: is a mount point, which --layout dir cannot swap; use --layout fanout for a volume root",
                vol.display
            )));
        }
    }
    if !super::exchange_works(stage)? {
        return Err(error::refused(format!(
            "{}: --layout dir needs renameat2(RENAME_EXCHANGE), which this filesystem lacks \
             (NFS, FUSE and GlusterFS do); use --layout symlink or --layout fanout",
            vol.display
        )));
    }
    Ok(())
}

/// Make generation `name` the tree at DEST. The tree is `stage/<me>/tree`
/// (a sync) or the retained `gen/<name>` (a rollback). Returns the generation
/// the exchange took out of DEST, now in `gen/`, if packsync knew it.
fn publish(
    vol: &Volume,
    state: &State,
    stage: &DirFd,
    name: &str,
    fsync: bool,
) -> Result<Option<String>> {
    let from_gen = !stage.exists(b"tree")?;
    if from_gen {
        state
            .gen
            .rename(name.as_bytes(), stage, b"tree")
            .with_context(|| format!("cannot take {}/gen/{name}", state.path.display()))?;
    }
    let result = swap(vol, state, stage, name, fsync);
    if result.is_err() && from_gen {
        // Put the retained generation back where it was.
        let _ = stage.rename(b"tree", &state.gen, name.as_bytes());
    }
    let exchanged = result?;
    if !exchanged {
        return Ok(None);
    }
    // The tree that was live is now `stage/<me>/tree`: file it as what it was.
    let st = stage
        .stat(b"tree")
        .context("cannot find the replaced tree")?;
    let Some(old) = gen_of(state, st.st_ino) else {
        // A directory packsync did not make (taken over): `takeover::file` keeps it.
        return Ok(None);
    };
    // A twin of the generation just published (a writer that swapped the
    // same GEN in first), or a copy of one retained already: readers may be
    // in it, so it is filed under a name of its own, retired like any other.
    let mut filed = old.clone();
    if old == name || state.gen.exists(old.as_bytes()).unwrap_or(true) {
        filed = twin_name(&old);
    }
    stage
        .rename(b"tree", &state.gen, filed.as_bytes())
        .with_context(|| {
            format!(
                "cannot move the replaced tree to {}/gen/{filed}",
                state.path.display()
            )
        })?;
    Ok(Some(filed))
}

/// `<GEN>-<random>`: where a second tree of generation GEN is kept.
fn twin_name(gen: &str) -> String {
    let base = &gen[..gen.len().min(crate::volume::GEN_LEN)];
    format!("{base}-{:08x}", sys::random_u64() as u32)
}

/// Record the staged tree's inode, then put it at DEST. True when a tree was
/// exchanged out of DEST (it is then `stage/<me>/tree`).
fn swap(vol: &Volume, state: &State, stage: &DirFd, name: &str, fsync: bool) -> Result<bool> {
    use std::os::fd::AsFd;
    let st = stage.stat(b"tree").context("cannot stat the staged tree")?;
    let _ = stage.unlink(b"root");
    let fd = stage
        .create_excl(b"root")
        .context("cannot write the root record")?;
    sys::write_all(fd.as_fd(), format!("{}\n", st.st_ino).as_bytes())
        .context("cannot write the root record")?;
    sys::set_mode_fd(fd.as_fd(), 0o644).context("cannot write the root record")?;
    if fsync {
        sys::fsync(fd.as_fd()).context("cannot flush the root record")?;
    }
    drop(fd);
    let rname = format!("{name}.{}{ROOT_SUFFIX}", st.st_ino);
    stage
        .rename(b"root", &state.meta, rname.as_bytes())
        .with_context(|| format!("cannot store {}/meta/{rname}", state.path.display()))?;
    if fsync {
        state.meta.fsync().context("cannot flush meta/")?;
    }
    sys::pause_point("before-exchange");
    if let Some(sig) = sys::signals::pending() {
        return Err(crate::error::Failure::Interrupted(sig).into());
    }
    let parent = vol.parent()?;
    let exchanged = match stage.rename_noreplace(b"tree", parent, &vol.name) {
        Ok(()) => false,
        Err(e)
            if e.kind() == std::io::ErrorKind::AlreadyExists
                || e.kind() == std::io::ErrorKind::Unsupported =>
        {
            stage
                .rename_exchange(b"tree", parent, &vol.name)
                .with_context(|| format!("cannot publish {}", vol.display))?;
            true
        }
        Err(e) => return Err(e).with_context(|| format!("cannot publish {}", vol.display)),
    };
    if fsync {
        parent
            .fsync()
            .with_context(|| format!("cannot flush {}", vol.parent_path.display()))?;
    }
    Ok(exchanged)
}

#[cfg(test)]
mod tests {
    use super::parse_root_name;

    #[test]
    fn root_records_name_their_generation_and_inode() {
        assert_eq!(
            parse_root_name("0123abcd.4711.root"),
            Some(("0123abcd", Some(4711)))
        );
        // The older form holds the inode inside.
        assert_eq!(parse_root_name("0123abcd.root"), Some(("0123abcd", None)));
        assert_eq!(
            parse_root_name("0123abcd-1a2b3c4d.9.root"),
            Some(("0123abcd-1a2b3c4d", Some(9)))
        );
        for bad in [
            "0123abcd.manifest",
            ".root",
            "..root",
            "a/b.1.root",
            ".x.1.root",
        ] {
            assert_eq!(parse_root_name(bad), None, "{bad}");
        }
    }
}
