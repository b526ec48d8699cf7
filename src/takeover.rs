//! A plain directory at DEST (left by `cp -aR`) that the first sync takes
//! over is kept, never deleted: `record` reads it before the swap into a
//! manifest of its own (the way `verify` reads a tree: every entry, files
//! hashed), and `file` moves it, once the swap has taken it out of DEST,
//! into `gen/` as a retained generation like any other. `rollback` then
//! publishes it again, and `--keep`/`--grace` retire it.
//!
//! Recording comes before the swap so that anything that fails (a file that
//! cannot be read, a full volume) fails the sync with DEST as it was; after
//! the swap only renames are left. Its manifest bears the time the tree was
//! made (its root's mtime, a second before now at the latest), so the kept
//! tree is older than the new generation (`retire::made`), the one
//! `rollback` picks by default; its grace period counts from its take-over. Nothing here decides whether DEST is
//! taken over (the layout's driver does), nor writes outside the state directory.

use std::os::fd::AsFd;

use anyhow::{Context, Result};

use crate::claim::Claim;
use crate::manifest::Manifest;
use crate::sys::{self, DirFd};
use crate::volume::{State, Volume};

/// The kept tree's manifest in the writer's staging directory.
const MANIFEST: &[u8] = b"taken-over.manifest";

/// A directory at DEST, read and its manifest written into staging.
pub struct Recorded {
    /// The name its digest gives (another is chosen if that one is taken).
    name: String,
    /// Entries at its top, for the warning.
    pub top: usize,
}

/// Read the real directory at DEST (`vol`'s published name) and write its
/// manifest into `stage`. `None` for an empty directory (a mount point made
/// for the volume, say): there is nothing to keep.
pub fn record(
    vol: &Volume,
    stage: &DirFd,
    caps: &crate::caps::Caps,
    fsync: bool,
) -> Result<Option<Recorded>> {
    let failed = || format!("cannot read {} to keep it", vol.display);
    let root = vol
        .parent()
        .and_then(|p| p.open_dir(&vol.name))
        .with_context(failed)?;
    let (tree, _skipped) = crate::verify::read(&root, &vol.display, caps.hardlinks)?;
    if tree.is_empty() {
        return Ok(None);
    }
    let top = tree.entries.len();
    // When it was made, as far as its root tells, and before the new
    // generation in any case: the manifest's mtime orders generations, and
    // two manifests written within one tick of the kernel's coarse clock
    // would tie.
    let now = crate::clock::now_pair();
    let made = tree.root.mtime.pair().min((now.0 - 1, now.1));
    let mut manifest = Manifest {
        verified: Vec::new(),
        label: None,
        created: made,
        host: sys::hostname(),
        // Not made from a source: no source can say it is unchanged since.
        sources: Vec::new(),
        // Recorded as found, so compared as found.
        owners: true,
        granularity_ns: caps.granularity_ns,
        link_meta: caps.link_meta,
        hardlinks: caps.hardlinks,
        // Read without them, so recorded without them (they stay on disk).
        xattrs: false,
        set_mtime: None,
        layers: Vec::new(),
        digest: String::new(),
        tree,
    };
    let in_stage = || format!("cannot write the manifest of {} in staging", vol.display);
    let _ = stage.unlink(MANIFEST);
    let fd = stage.create_excl(MANIFEST).with_context(in_stage)?;
    // The `File` only writes the descriptor `sys` created in staging.
    let mut w = std::io::BufWriter::new(std::fs::File::from(fd));
    manifest.write(&mut w).with_context(in_stage)?;
    let file = w
        .into_inner()
        .map_err(|e| e.into_error())
        .with_context(in_stage)?;
    sys::set_meta_fd(file.as_fd(), None, Some(0o644), made).with_context(in_stage)?;
    if fsync {
        sys::fsync(file.as_fd()).with_context(in_stage)?;
    }
    Ok(Some(Recorded {
        name: manifest.digest[..crate::volume::GEN_LEN].to_string(),
        top,
    }))
}

/// After the swap: the tree taken out of DEST is `stage/<at>`; file it as
/// `gen/<name>` with the manifest `record` wrote, retired as of now. The
/// generation's name.
pub fn file(state: &State, stage: &DirFd, at: &[u8], rec: &Recorded) -> Result<String> {
    let st = stage
        .stat(at)
        .context("cannot find the directory taken out of DEST")?;
    if sys::kind_of(&st) != sys::StatKind::Dir {
        anyhow::bail!("what the swap took out of DEST is not a directory");
    }
    let mut name = rec.name.clone();
    let taken = |n: &str| {
        state.gen.exists(n.as_bytes()).unwrap_or(true)
            || state
                .meta
                .exists(format!("{n}.manifest").as_bytes())
                .unwrap_or(true)
    };
    if taken(&name) {
        // The same tree is retained already (or being published): ours is a twin.
        name = crate::commit::fresh_name(&name);
    }
    // Until it is in gen/ with its manifest and stamp, no collector takes it.
    let _claim = Claim::take(state, &name)?;
    let mname = format!("{name}.manifest");
    let shown = |what: &str| format!("cannot move {what} into {}", state.path.display());
    stage
        .rename(MANIFEST, &state.meta, mname.as_bytes())
        .with_context(|| shown("the kept tree's manifest"))?;
    stage
        .rename(at, &state.gen, name.as_bytes())
        .with_context(|| shown("the kept tree"))?;
    // Its grace period starts now.
    let _ = state.stamp(&name, "retired");
    Ok(name)
}
