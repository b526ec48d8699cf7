//! A plain directory at DEST (left by `cp -aR`) that the first sync takes
//! over is kept, never deleted: `record` reads it before the swap into a
//! manifest of its own (the way `verify` reads a tree: every entry, files
//! hashed; a directory at a time, no tree held whole), and `file` moves
//! it, once the swap has taken it out of DEST, into `gen/` as a retained
//! generation like any other. `rollback` then publishes it again, and
//! `--keep`/`--grace` retire it.
//!
//! Recording comes before the swap so that anything that fails (a file that
//! cannot be read, a full volume) fails the sync with DEST as it was; after
//! the swap only renames are left. Its manifest bears the time the tree was
//! made (its root's mtime, a second before now at the latest), so the kept
//! tree is older than the new generation (`retire::made`), the one
//! `rollback` picks by default; its grace period counts from its take-over. Nothing here decides whether DEST is
//! taken over (the layout's driver does), nor writes outside the state directory.

use std::io::Write;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use anyhow::{Context, Result};

use crate::claim::Claim;
use crate::filter::Filter;
use crate::manifest::{Fragments, Manifest};
use crate::sys::{self, DirFd};
use crate::volume::{State, Volume};

/// The kept tree's manifest in the writer's staging directory, and the
/// spool and body `record` writes it from.
const MANIFEST: &[u8] = b"taken-over.manifest";
const LINES: &[u8] = b"taken-over.lines";
const BODY: &[u8] = b"taken-over.body";

/// A directory at DEST, read and its manifest written into staging.
pub struct Recorded {
    /// The name its digest gives (another is chosen if that one is taken).
    name: String,
    /// Entries at its top, for the warning.
    pub top: usize,
}

/// Read the real directory at DEST (`vol`'s published name) and write its
/// manifest into `stage`: a directory at a time (`Recording`, a visitor
/// of the one walk), each directory's lines spooled and the body put in
/// pre-order at the end, as a streamed stage writes its own: no tree held
/// whole. `None` for an empty directory (a mount point made for the
/// volume, say): there is nothing to keep.
///
/// `groups`: where the plan made first listed DEST, the inodes two of its
/// paths or more were on (`scan::Surveyed::shared`), sorted: only those
/// are keyed as a group's. A file the stage hardlinked from DEST has a
/// second link by now, in the new tree: held by inode until the end, at
/// 10^5 such files that cost 11 MiB for groups of one path. `None`: every
/// file of more than one link is keyed.
pub fn record(
    vol: &Volume,
    stage: &DirFd,
    caps: &crate::caps::Caps,
    fsync: bool,
    groups: Option<&[(u64, u64)]>,
) -> Result<Option<Recorded>> {
    let failed = || format!("cannot read {} to keep it", vol.display);
    let root = vol
        .parent()
        .and_then(|p| p.open_dir(&vol.name))
        .with_context(failed)?;
    let label = vol.display.as_str();
    let root_meta = crate::source::Dir::meta_of_root(&root, label, &Filter::default())?;
    let in_stage = || format!("cannot write the manifest of {} in staging", vol.display);
    for name in [LINES, BODY, MANIFEST] {
        let _ = stage.unlink(name);
    }
    let lines = stage.create_excl(LINES).with_context(in_stage)?;
    let r = Recording {
        label,
        keyed: caps.hardlinks,
        groups,
        seen: crate::report::Collected::default(),
        spool: crate::manifest::LineSpool::new(lines),
        frags: Mutex::new(Fragments {
            hash_every_path: true,
            ..Fragments::default()
        }),
        top: AtomicUsize::new(0),
    };
    crate::walk::run(&r, &[], &[], &root)?;
    let top = r.top.into_inner();
    if top == 0 {
        let _ = stage.unlink(LINES);
        return Ok(None);
    }
    // The body, then the header it completes, then the body after it.
    let mut frags = r.frags.into_inner().unwrap();
    let root_entry = crate::tree::Entry {
        name: Default::default(),
        meta: root_meta,
        node: crate::tree::Node::Dir(Default::default()),
    };
    let lines = stage.open_read(LINES).with_context(in_stage)?;
    let body = stage.create_excl(BODY).with_context(in_stage)?;
    // The `File` only writes the descriptor `sys` created in staging.
    let mut bw = std::io::BufWriter::with_capacity(256 * 1024, std::fs::File::from(body));
    let spooled = crate::manifest::assemble_spool(&root_entry, &mut frags, lines.as_fd(), &mut bw)
        .with_context(in_stage)?;
    bw.flush().with_context(in_stage)?;
    drop((bw, frags, lines));
    let _ = stage.unlink(LINES);
    // When it was made, as far as its root tells, and before the new
    // generation in any case: the manifest's mtime orders generations, and
    // two manifests written within one tick of the kernel's coarse clock
    // would tie.
    let now = crate::clock::now_pair();
    let made = root_meta.mtime.pair().min((now.0 - 1, now.1));
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
        tree: crate::tree::Tree::default(),
    };
    let fd = stage.create_excl(MANIFEST).with_context(in_stage)?;
    // The `File` only writes the descriptor `sys` created in staging.
    let mut w = std::io::BufWriter::new(std::fs::File::from(fd));
    let body = stage.open_read(BODY).with_context(in_stage)?;
    // The `File` only reads the descriptor `sys` opened in staging.
    let mut body = std::fs::File::from(body);
    manifest
        .write_spooled(&mut w, &spooled, &mut body)
        .with_context(in_stage)?;
    let file = w
        .into_inner()
        .map_err(|e| e.into_error())
        .with_context(in_stage)?;
    let _ = stage.unlink(BODY);
    sys::set_meta_fd(file.as_fd(), None, Some(0o644), made).with_context(in_stage)?;
    if fsync {
        sys::fsync(file.as_fd()).with_context(in_stage)?;
    }
    Ok(Some(Recorded {
        name: manifest.digest[..crate::volume::GEN_LEN].to_string(),
        top,
    }))
}

/// One `record` walk of DEST, shared by its threads: each directory
/// listed (no attributes: `--xattrs` is not read here), its files hashed,
/// its lines spooled, files of more than one link keyed by inode where
/// the volume shows hardlinks (`keyed`), as a manifest groups them.
struct Recording<'a> {
    label: &'a str,
    keyed: bool,
    /// The inodes keyed, where they are known (`record`'s `groups`).
    groups: Option<&'a [(u64, u64)]>,
    /// What the listing skips (a FIFO, a socket): in no manifest.
    seen: crate::report::Collected,
    spool: crate::manifest::LineSpool,
    frags: Mutex<Fragments>,
    /// Entries at the top.
    top: AtomicUsize,
}

impl crate::walk::Visit for Recording<'_> {
    type Dir = DirFd;
    type Keep = ();

    fn visit(
        &self,
        _: &[Option<&DirFd>],
        dir: &DirFd,
        rel: &[u8],
    ) -> Result<crate::walk::Visited<()>> {
        use rayon::prelude::*;
        let filter = Filter::default();
        let mut found = crate::source::Dir::list(dir, rel, self.label, 0, &filter, &self.seen)?;
        found.par_iter_mut().try_for_each(|e| -> Result<()> {
            let size = e.meta.size;
            let crate::tree::Node::File(f) = &mut e.node else {
                return Ok(());
            };
            let path = crate::tree::join(rel, &e.name);
            let shown = || crate::escape::display(self.label, &path);
            f.hash = Some(crate::scan::digest(dir.open_read(&e.name), size, &shown)?);
            Ok(())
        })?;
        if let Some(groups) = self.groups {
            // On an inode no other path of the tree is on: a file of one
            // link, as its manifest line says either way.
            for e in found.iter_mut() {
                if let crate::tree::Node::File(f) = &mut e.node {
                    if f.nlink > 1 && groups.binary_search(&(f.dev, f.ino)).is_err() {
                        f.nlink = 1;
                    }
                }
            }
        }
        if self.keyed {
            let mut frags = self.frags.lock().unwrap();
            for e in &found {
                if let crate::tree::Node::File(f) = &e.node {
                    if f.nlink > 1 {
                        let key = (f.dev, f.ino);
                        *frags.links.entry(key).or_default() += 1;
                        frags.hashes.insert(key, f.hash.expect("hashed above"));
                    }
                }
            }
        }
        if rel.is_empty() {
            self.top.store(found.len(), Ordering::Relaxed);
        }
        let text = crate::manifest::fragment_text(rel, &found, self.keyed);
        self.spool
            .append(&self.frags, rel, &text)
            .context("cannot write the manifest's lines in staging")?;
        Ok((0, crate::walk::subdirs(found)))
    }

    fn enter(&self, dir: &DirFd, _: &(), name: &[u8], path: &[u8]) -> Result<DirFd> {
        crate::walk::open_sub(dir, name, self.label, path)
    }
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
