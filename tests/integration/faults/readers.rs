//! Readers during swaps: one writer publishes a new generation after
//! another while readers read. A reader that resolves DEST once reads one
//! whole generation; a reader that opens paths through DEST never gets
//! ENOENT for a path every generation has.

use std::fs;
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
    /// ENOENT (or another error) through DEST for a path every generation has.
    missing: AtomicU64,
}

/// Resolve DEST once, like `packsync exec`, then read every common path below it.
fn read_whole(dest: &Path, paths: &[String], c: &Counts) {
    let Ok(root) = fs::canonicalize(dest) else {
        c.torn.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let mut seen = None;
    for p in paths {
        match fs::read(root.join(p)).ok().and_then(|b| variant_of(&b)) {
            Some(v) if seen.is_none_or(|s| s == v) => seen = Some(v),
            other => {
                eprintln!(
                    "torn read in {}: {p} gave {other:?}, expected {seen:?}",
                    root.display()
                );
                c.torn.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }
    c.whole.fetch_add(1, Ordering::Relaxed);
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
    let counts = Counts::default();
    let done = AtomicBool::new(false);
    thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                read_whole(&dest, &paths, &counts);
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
    eprintln!(
        "readers during swaps: {SWAPS} swaps; {whole} whole-tree reads of {} files each \
         and {through} reads through DEST; torn reads {torn}, missing paths {missing}",
        paths.len()
    );
    assert_eq!((torn, missing), (0, 0));
    assert!(whole > 0 && through > 0, "the readers ran");
    assert_eq!(
        variant_of(&fs::read(dest.join("d0/f0000.txt")).unwrap()),
        Some(SWAPS)
    );
}
