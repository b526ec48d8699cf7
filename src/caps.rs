//! What the destination volume can be trusted with, probed once per sync
//! inside this writer's staging directory: how finely it keeps mtimes,
//! whether a symlink's own times and owner can be set without reaching its
//! target, whether hardlinked names show up as one inode, and how to flush it
//! (`Flush`: the one decision of what a sync flushes, `--no-fsync` included).
//!
//! Network filesystems differ from ext4 in each of these (sshfs keeps whole
//! seconds, sets a symlink's *target* times when asked for the link's, shows
//! every hardlinked name as its own inode, and its `syncfs` returns without
//! flushing). The probes create and remove names only inside the staging
//! directory; the symlink probe is never run: on FUSE the answer is "no".

use std::os::fd::AsFd;

use anyhow::{Context, Result};

use crate::sys::{self, DirFd, FsKind};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// The volume keeps mtimes to this many nanoseconds (1 on ext4, 1e9 on sshfs).
    pub granularity_ns: u64,
    /// A symlink's own mtime and owner can be set safely (not on FUSE).
    pub link_meta: bool,
    /// Hardlinked names show one inode number and a link count above one.
    pub hardlinks: bool,
    /// What the sync flushes, and how (`flush`).
    pub flush: Flush,
    pub kind: FsKind,
}

/// How a sync makes what it staged durable before commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flush {
    /// `--no-fsync`, on every filesystem: no fsync, fdatasync or syncfs of
    /// anything (staged files and directories, the manifest, `gen/`,
    /// `meta/`, DEST's parent), and no early writeback of large files.
    Nothing,
    /// One `syncfs` of the volume before commit; writeback of large files
    /// starts as they are copied.
    Syncfs,
    /// `syncfs` does not flush this volume (FUSE): every staged file and
    /// directory is fsynced through the handle that wrote it.
    EachFile,
}

impl Flush {
    /// Starting writeback of a large file while it is copied pays off.
    pub fn durable(self) -> bool {
        self != Flush::Nothing
    }
}

/// What to flush: nothing without `durable` (`--no-fsync`), whatever the
/// filesystem; else each file where `syncfs` does not flush (FUSE).
pub fn flush(durable: bool, kind: FsKind) -> Flush {
    if !durable {
        return Flush::Nothing;
    }
    if flush_each(kind == FsKind::Fuse) {
        Flush::EachFile
    } else {
        Flush::Syncfs
    }
}

impl Default for Caps {
    /// What a local filesystem offers.
    fn default() -> Caps {
        Caps {
            granularity_ns: 1,
            link_meta: true,
            hardlinks: true,
            flush: Flush::Syncfs,
            kind: FsKind::Local,
        }
    }
}

/// Probe the volume holding `dir` (this writer's staging directory);
/// `durable`: the sync flushes what it writes (no `--no-fsync`).
pub fn probe(dir: &DirFd, durable: bool) -> Result<Caps> {
    let kind = dir
        .fs_kind()
        .context("cannot tell which filesystem holds the staging directory")?;
    Ok(Caps {
        granularity_ns: granularity(dir).context("cannot probe the volume's mtime resolution")?,
        link_meta: kind != FsKind::Fuse,
        hardlinks: hardlinks_visible(dir).context("cannot probe the volume's hardlinks")?
            && !hardlinks_hidden_by_test(),
        flush: flush(durable, kind),
        kind,
    })
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
fn granularity(dir: &DirFd) -> Result<u64> {
    let name = b"probe-time";
    dir.mkdir(name, 0o700)?;
    let read = dir.open_dir(name).and_then(|fd| {
        sys::set_meta_fd(fd.as_fd(), None, None, (1_000_000_000, 123_456_789))?;
        dir.stat(name)
    });
    let _ = dir.rmdir(name);
    Ok(match sys::mtime_of(&read?).1 {
        123_456_789 => 1,
        123_456_000 => 1_000,
        123_000_000 => 1_000_000,
        _ => 1_000_000_000,
    })
}

/// The fault suite's `PACKSYNC_TEST_HARDLINKS=hidden`: the volume is taken
/// for one that does not show hardlinks (as sshfs), so that its manifests
/// keep the groups (`hardlinks 0`) on any filesystem.
fn hardlinks_hidden_by_test() -> bool {
    #[cfg(feature = "fault-injection")]
    if std::env::var("PACKSYNC_TEST_HARDLINKS").as_deref() == Ok("hidden") {
        return true;
    }
    false
}

/// Link a probe file to a second name: one inode with two links, or not?
/// The file is made with mknod, never opened, for the reason above.
fn hardlinks_visible(dir: &DirFd) -> Result<bool> {
    let (a, b) = (b"probe-link-a", b"probe-link-b");
    dir.make_file(a)?;
    let seen = match dir.link(a, dir, b) {
        Ok(()) => {
            let (sa, sb) = (dir.stat(a), dir.stat(b));
            let _ = dir.unlink(b);
            let (sa, sb) = (sa?, sb?);
            sa.st_ino == sb.st_ino && sa.st_nlink > 1 && sb.st_nlink > 1
        }
        Err(_) => false,
    };
    let _ = dir.unlink(a);
    Ok(seen)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_directory_has_every_capability() {
        let dir = tempfile::tempdir().unwrap();
        let fd = DirFd::open_path(dir.path()).unwrap();
        let caps = probe(&fd, true).unwrap();
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

    #[test]
    fn no_fsync_flushes_nothing_on_any_filesystem() {
        for kind in [FsKind::Local, FsKind::Fuse, FsKind::Network] {
            assert_eq!(flush(false, kind), Flush::Nothing, "{kind:?}");
            assert!(!flush(false, kind).durable());
        }
    }

    #[test]
    fn a_durable_sync_fsyncs_each_file_only_where_syncfs_does_not_flush() {
        // Not under a PACKSYNC_TEST_FLUSH override (the fault suite's).
        if std::env::var_os("PACKSYNC_TEST_FLUSH").is_some() {
            return;
        }
        assert_eq!(flush(true, FsKind::Fuse), Flush::EachFile);
        assert_eq!(flush(true, FsKind::Local), Flush::Syncfs);
        assert_eq!(flush(true, FsKind::Network), Flush::Syncfs);
    }
}
