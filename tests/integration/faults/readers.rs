//! Readers during swaps: one writer publishes a new generation after
//! another while readers read. A reader that resolves DEST once reads one
//! whole generation: every path, kind, content, mode, file mtime and link
//! target of one variant's source, nothing kept from another, nothing lost
//! (and some of those reads overlap a swap, so the test shows that it
//! holds while DEST moves); a reader that opens paths through DEST never
//! gets ENOENT for a path every generation has.

use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;

use super::{common_paths, ok, packsync, variant_of, variant_tree, Variants};
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

/// Resolve DEST once, like `packsync exec`, then read the whole tree below
/// it: it must be one variant's, whole.
fn read_whole(dest: &Path, want: &Variants, c: &Counts) {
    let before = fs::read_link(dest).ok();
    let Ok(root) = fs::canonicalize(dest) else {
        c.torn.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let whole = want.whole(&root);
    if fs::read_link(dest).ok() != before {
        c.straddled.fetch_add(1, Ordering::Relaxed);
    }
    match whole {
        Ok(_) => c.whole.fetch_add(1, Ordering::Relaxed),
        Err(e) => {
            eprintln!("{e}");
            c.torn.fetch_add(1, Ordering::Relaxed)
        }
    };
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
    let want = Variants::new(f.path("want"), FILES, 0);
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
