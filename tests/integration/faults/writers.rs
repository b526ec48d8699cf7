//! Many writers without working locks: concurrent writers with different
//! sources, collecting with `--grace 0 --keep 0` as they go, and the two
//! races a collector can lose, stopped at the worst instant with the pause
//! hook: a writer between renaming its tree into `gen/` and publishing it,
//! and a collector between moving a generation aside and looking again.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;

use super::{assert_clean, assert_one_of, code, entries, ok, packsync, skip, variant_tree};
use crate::fixture::Fixture;

const WRITERS: usize = 4;
const ROUNDS: usize = 16;

/// A racy-free dangling check: DEST read twice around a look at its target;
/// the same target both times and missing in between means DEST dangled.
fn watch(dest: &Path, done: &AtomicBool, checks: &AtomicU64, dangling: &AtomicU64) {
    let parent = dest.parent().unwrap();
    while !done.load(Ordering::Relaxed) {
        let Ok(a) = fs::read_link(dest) else { continue };
        let there = parent.join(&a).is_dir();
        let Ok(b) = fs::read_link(dest) else { continue };
        checks.fetch_add(1, Ordering::Relaxed);
        if !there && a == b {
            eprintln!("DEST dangles: {} -> {}", dest.display(), a.display());
            dangling.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn spawn_sync(src: &Path, dest: &Path) -> Child {
    crate::fixture::spawn_sync(src, dest, &[])
}

#[test]
fn concurrent_writers_with_different_sources() {
    let f = Fixture::new();
    let dest = f.dest();
    let sources: Vec<PathBuf> = (0..WRITERS).map(|i| f.path(&format!("src{i}"))).collect();
    let (done, checks, dangling) = (AtomicBool::new(false), AtomicU64::new(0), AtomicU64::new(0));
    let mut syncs = 0;
    thread::scope(|s| {
        s.spawn(|| watch(&dest, &done, &checks, &dangling));
        for round in 0..ROUNDS {
            // New content every round: new generations to publish, old ones to collect.
            for (i, src) in sources.iter().enumerate() {
                variant_tree(src, (round * WRITERS + i) as u32, 60, 0);
            }
            let children: Vec<Child> = sources.iter().map(|src| spawn_sync(src, &dest)).collect();
            for c in children {
                let out = c.wait_with_output().unwrap();
                syncs += 1;
                if code(&out) != 0 {
                    done.store(true, Ordering::Relaxed);
                }
                assert_eq!(code(&out), 0, "round {round}: {}", super::stderr(&out));
            }
            assert_one_of(&dest, &sources);
        }
        done.store(true, Ordering::Relaxed);
    });
    ok(packsync()
        .args(["gc", "--grace", "0", "--keep", "0"])
        .arg(&dest)
        .output()
        .unwrap());
    assert_one_of(&dest, &sources);
    assert_clean(&f.state());
    assert_eq!(entries(&f.state(), "gen").len(), 1);
    let (checks, dangling) = (checks.into_inner(), dangling.into_inner());
    eprintln!(
        "concurrent writers: {WRITERS} writers x {ROUNDS} rounds = {syncs} syncs, all exit 0, \
         collecting with --grace 0 --keep 0; DEST checked {checks} times, dangling {dangling}; \
         no staging left after gc"
    );
    assert_eq!(dangling, 0);
    assert!(checks > 0);
}

/// Start `packsync ARGS` stopped at `point`.
fn paused(args: &[&std::ffi::OsStr], point: &str, resume: &Path) -> Child {
    super::start_paused(packsync().args(args), point, resume)
}

#[test]
fn gc_never_removes_a_generation_about_to_be_published() {
    if skip("gc during a publish", false, true) {
        return;
    }
    let f = Fixture::new();
    let (a, b) = (f.path("a"), f.path("b"));
    variant_tree(&a, 1, 20, 0);
    variant_tree(&b, 2, 20, 0);
    ok(packsync()
        .arg("sync")
        .arg(&a)
        .arg(f.dest())
        .output()
        .unwrap());
    // The writer has renamed its tree into gen/ and holds its claim; DEST still shows A.
    let resume = f.path("resume");
    let dest = f.dest();
    let args: Vec<&std::ffi::OsStr> = vec!["sync".as_ref(), b.as_os_str(), dest.as_os_str()];
    let writer = paused(&args, "before-publish", &resume);
    let gens = entries(&f.state(), "gen");
    assert_eq!(gens.len(), 2, "{gens:?}");
    // The most eager collector there is.
    let gc = ok(packsync()
        .args(["gc", "--grace", "0", "--keep", "0"])
        .arg(f.dest())
        .output()
        .unwrap());
    assert_eq!(
        entries(&f.state(), "gen"),
        gens,
        "{}",
        String::from_utf8_lossy(&gc.stdout)
    );
    fs::write(&resume, "").unwrap();
    ok(writer.wait_with_output().unwrap());
    assert_eq!(assert_one_of(&f.dest(), &[a, b]), 1);
}

#[test]
fn a_collector_stopped_midway_never_takes_a_generation_a_writer_publishes() {
    if skip("a collector stopped midway", false, true) {
        return;
    }
    let f = Fixture::new();
    let (a, b) = (f.path("a"), f.path("b"));
    variant_tree(&a, 1, 20, 0);
    variant_tree(&b, 2, 20, 0);
    ok(packsync()
        .arg("sync")
        .arg(&a)
        .arg(f.dest())
        .output()
        .unwrap());
    ok(packsync()
        .arg("sync")
        .arg(&b)
        .arg(f.dest())
        .output()
        .unwrap());
    // A collector moves A's generation (not live, past a zero grace) aside and stops there.
    let resume = f.path("resume");
    let dest = f.dest();
    let gc_args: Vec<&std::ffi::OsStr> = vec![
        "gc".as_ref(),
        "--grace".as_ref(),
        "0".as_ref(),
        "--keep".as_ref(),
        "0".as_ref(),
        dest.as_os_str(),
    ];
    let gc = paused(&gc_args, "retire-trash", &resume);
    assert_eq!(
        entries(&f.state(), "gen").len(),
        1,
        "A's generation is aside"
    );
    // Meanwhile a writer publishes A again: it converges on that very generation.
    let out = ok(packsync()
        .args(["sync", "--json"])
        .arg(&a)
        .arg(f.dest())
        .output()
        .unwrap());
    assert_eq!(assert_one_of(&f.dest(), &[a.clone(), b.clone()]), 0);
    fs::write(&resume, "").unwrap();
    ok(gc.wait_with_output().unwrap());
    // The collector saw the writer's claim, or DEST, and left A's generation alone.
    assert_eq!(
        assert_one_of(&f.dest(), &[a, b]),
        0,
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    ok(packsync()
        .args(["gc", "--grace", "0", "--keep", "0"])
        .arg(f.dest())
        .output()
        .unwrap());
    assert_clean(&f.state());
}
