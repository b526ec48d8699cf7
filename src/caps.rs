//! What the destination volume can be trusted with, probed once per sync
//! inside this writer's staging directory: how finely it keeps mtimes,
//! whether a symlink's own times and owner can be set without reaching its
//! target, whether hardlinked names show up as one inode, and how to flush it.
//!
//! Network filesystems differ from ext4 in each of these (sshfs keeps whole
//! seconds, sets a symlink's *target* times when asked for the link's, shows
//! every hardlinked name as its own inode, and its `syncfs` returns without
//! flushing). The probes create and remove names only inside the staging
//! directory; the symlink probe is never run: on FUSE the answer is "no".

use std::os::fd::{AsFd, BorrowedFd};

use anyhow::{Context, Result};

use crate::sys::{self, FsKind};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// The volume keeps mtimes to this many nanoseconds (1 on ext4, 1e9 on sshfs).
    pub granularity_ns: u64,
    /// A symlink's own mtime and owner can be set safely (not on FUSE).
    pub link_meta: bool,
    /// Hardlinked names show one inode number and a link count above one.
    pub hardlinks: bool,
    /// `syncfs` does not flush this volume: fsync every file and directory instead.
    pub fsync_each: bool,
    pub kind: FsKind,
}

impl Default for Caps {
    /// What a local filesystem offers.
    fn default() -> Caps {
        Caps {
            granularity_ns: 1,
            link_meta: true,
            hardlinks: true,
            fsync_each: false,
            kind: FsKind::Local,
        }
    }
}

/// Probe the volume holding `dir` (this writer's staging directory).
pub fn probe(dir: BorrowedFd<'_>) -> Result<Caps> {
    let kind =
        sys::fs_kind(dir).context("cannot tell which filesystem holds the staging directory")?;
    let fuse = kind == FsKind::Fuse;
    Ok(Caps {
        granularity_ns: granularity(dir).context("cannot probe the volume's mtime resolution")?,
        link_meta: !fuse,
        hardlinks: hardlinks_visible(dir).context("cannot probe the volume's hardlinks")?,
        fsync_each: flush_each(fuse),
        kind,
    })
}

/// Whether the volume holding `fd` needs each file and directory fsynced
/// (see `Caps::fsync_each`); `syncfs` is enough elsewhere.
pub fn fsync_each(fd: BorrowedFd<'_>) -> bool {
    flush_each(sys::fs_kind(fd).is_ok_and(|k| k == FsKind::Fuse))
}

/// FUSE's `syncfs` returns at once without flushing (measured on sshfs and
/// GlusterFS), so there each file and directory is fsynced through its handle.
fn flush_each(fuse: bool) -> bool {
    #[cfg(feature = "fault-injection")]
    match std::env::var("PACKSYNC_TEST_FLUSH").as_deref() {
        Ok("each") => return true,
        Ok("syncfs") => return false,
        _ => {}
    }
    fuse
}

/// The mtime resolution: set a known odd time, read it back. On a probe
/// directory: a file unlinked right after it was closed can outlive its
/// directory on FUSE (`.fuse_hidden*`, when the release of the handle comes
/// after the unlink), and then that directory cannot be removed.
fn granularity(dir: BorrowedFd<'_>) -> Result<u64> {
    let name = b"probe-time";
    sys::mkdir_at(dir, name, 0o700)?;
    let read = sys::open_dir_at(dir, name).and_then(|fd| {
        sys::set_meta_fd(fd.as_fd(), None, None, (1_000_000_000, 123_456_789))?;
        sys::stat_at(dir, name)
    });
    let _ = sys::rmdir_at(dir, name);
    Ok(match sys::mtime_of(&read?).1 {
        123_456_789 => 1,
        123_456_000 => 1_000,
        123_000_000 => 1_000_000,
        _ => 1_000_000_000,
    })
}

/// Link a probe file to a second name: one inode with two links, or not?
/// The file is made with mknod, never opened, for the reason above.
fn hardlinks_visible(dir: BorrowedFd<'_>) -> Result<bool> {
    let (a, b) = (b"probe-link-a", b"probe-link-b");
    sys::make_file_at(dir, a)?;
    let seen = match sys::link_at(dir, a, dir, b) {
        Ok(()) => {
            let (sa, sb) = (sys::stat_at(dir, a), sys::stat_at(dir, b));
            let _ = sys::unlink_at(dir, b);
            let (sa, sb) = (sa?, sb?);
            sa.st_ino == sb.st_ino && sa.st_nlink > 1 && sb.st_nlink > 1
        }
        Err(_) => false,
    };
    let _ = sys::unlink_at(dir, a);
    Ok(seen)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_directory_has_every_capability() {
        let dir = tempfile::tempdir().unwrap();
        let fd = sys::open_dir_path(dir.path()).unwrap();
        let caps = probe(fd.as_fd()).unwrap();
        if caps.kind == FsKind::Local {
            assert!(caps.link_meta && caps.hardlinks, "{caps:?}");
            assert!(caps.granularity_ns <= 1_000_000, "{caps:?}");
        }
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "probes cleaned up"
        );
    }
}
