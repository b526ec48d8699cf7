//! Readers during swaps: one writer publishes a new generation after
//! another while readers read. A reader that resolves DEST once reads one
//! whole generation: every path, kind, content, mode, file mtime and link
//! target of one variant's source, nothing kept from another, nothing lost
//! (and some of those reads overlap a swap, so the test shows that it
//! holds while DEST moves); a reader that opens paths through DEST never
//! gets ENOENT for a path every generation has.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;

use super::{common_paths, ok, packsync, variant_of, variant_tree};
use crate::fixture::Fixture;

const SWAPS: u32 = 150;
const FILES: usize = 40;

#[derive(Default)]
struct Counts {
    /// Whole-tree reads through a root resolved once.
    whole: AtomicU64,
    /// Single-path reads through DEST.
    through: AtomicU64,
    /// A resolved tree holding files of two generations, or missing one.
    torn: AtomicU64,
    /// Whole-tree reads during which DEST moved to another generation.
    straddled: AtomicU64,
    /// ENOENT (or another error) through DEST for a path every generation has.
    missing: AtomicU64,
}

/// Every entry below `root`, as a reader sees it: path, kind, mode, and a
/// file's content and mtime or a link's target (directories' mtimes are
/// the time the source was written, not part of a variant). Sorted.
pub fn listing(root: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        let rd = match fs::read_dir(dir) {
            Ok(rd) => rd,
            Err(e) => return out.push(format!("{} unreadable: {e}", dir.display())),
        };
        for e in rd {
            let p = match e {
                Ok(e) => e.path(),
                Err(e) => return out.push(format!("{} unreadable: {e}", dir.display())),
            };
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let m = match fs::symlink_metadata(&p) {
                Ok(m) => m,
                Err(e) => {
                    out.push(format!("{rel} unreadable: {e}"));
                    continue;
                }
            };
            let mode = m.permissions().mode() & 0o7777;
            if m.file_type().is_symlink() {
                out.push(format!("{rel} l {:?}", fs::read_link(&p).ok()));
            } else if m.is_dir() {
                out.push(format!("{rel} d {mode:o}"));
                walk(root, &p, out);
            } else {
                let data = fs::read(&p).map(|b| String::from_utf8_lossy(&b).into_owned());
                out.push(format!("{rel} f {mode:o} {} {data:?}", m.mtime()));
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

/// Resolve DEST once, like `packsync exec`, then read the whole tree below
/// it: it must be one variant's, whole.
fn read_whole(dest: &Path, want: &HashMap<u32, Vec<String>>, c: &Counts) {
    let before = fs::read_link(dest).ok();
    let Ok(root) = fs::canonicalize(dest) else {
        c.torn.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let got = listing(&root);
    if fs::read_link(dest).ok() != before {
        c.straddled.fetch_add(1, Ordering::Relaxed);
    }
    let v = fs::read(root.join("d0/f0000.txt"))
        .ok()
        .and_then(|b| variant_of(&b));
    match v.and_then(|v| want.get(&v)) {
        Some(w) if *w == got => {
            c.whole.fetch_add(1, Ordering::Relaxed);
        }
        w => {
            let extra: Vec<_> = got
                .iter()
                .filter(|l| w.is_none_or(|w| !w.contains(l)))
                .collect();
            let lost: Vec<_> = w.map_or(Vec::new(), |w| {
                w.iter().filter(|l| !got.contains(l)).collect()
            });
            eprintln!(
                "torn read in {} (variant {v:?}): extra {extra:?}, missing {lost:?}",
                root.display()
            );
            c.torn.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn read_through(dest: &Path, paths: &[String], i: usize, c: &Counts) {
    let p = &paths[i % paths.len()];
    match fs::read(dest.join(p)) {
        Ok(b) if variant_of(&b).is_some() => {
            c.through.fetch_add(1, Ordering::Relaxed);
        }
        other => {
            eprintln!("read through DEST of {p}: {:?}", other.map(|b| b.len()));
            c.missing.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[test]
fn readers_during_swaps_see_whole_generations() {
    let f = Fixture::new();
    let src = f.src();
    let dest = f.dest();
    variant_tree(&src, 0, FILES, 0);
    ok(packsync()
        .args(["sync", "-q"])
        .arg(&src)
        .arg(&dest)
        .output()
        .unwrap());
    let paths = common_paths(FILES, 0);
    // What a reader must see of each variant: its source, listed.
    let want: HashMap<u32, Vec<String>> = (0..=SWAPS)
        .map(|v| {
            let dir = f.path("want");
            variant_tree(&dir, v, FILES, 0);
            (v, listing(&dir))
        })
        .collect();
    let counts = Counts::default();
    let done = AtomicBool::new(false);
    thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                read_whole(&dest, &want, &counts);
            }
        });
        s.spawn(|| {
            let mut i = 0;
            while !done.load(Ordering::Relaxed) {
                read_through(&dest, &paths, i, &counts);
                i += 1;
            }
        });
        // The writer: every swap publishes a generation no earlier one equals.
        for v in 1..=SWAPS {
            variant_tree(&src, v, FILES, 0);
            let out = packsync()
                .args(["sync", "-q"])
                .arg(&src)
                .arg(&dest)
                .output()
                .unwrap();
            done.store(v == SWAPS || super::code(&out) != 0, Ordering::Relaxed);
            ok(out);
        }
    });
    let whole = counts.whole.load(Ordering::Relaxed);
    let through = counts.through.load(Ordering::Relaxed);
    let torn = counts.torn.load(Ordering::Relaxed);
    let missing = counts.missing.load(Ordering::Relaxed);
    let straddled = counts.straddled.load(Ordering::Relaxed);
    eprintln!(
        "readers during swaps: {SWAPS} swaps; {whole} whole-tree reads ({straddled} while DEST \
         moved) and {through} reads through DEST; torn reads {torn}, missing paths {missing}"
    );
    assert_eq!((torn, missing), (0, 0));
    assert!(through > 0, "the reader through DEST ran");
    assert!(
        straddled > 0,
        "no whole-tree read overlapped a swap ({whole} reads): the test showed nothing"
    );
    assert_eq!(
        variant_of(&fs::read(dest.join("d0/f0000.txt")).unwrap()),
        Some(SWAPS)
    );
}
