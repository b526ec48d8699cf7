//! SIGKILL at random instants and at every named crash point: DEST still
//! resolves to a complete generation equal to one of the sources, and the
//! next run cleans up what the dead writer left.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::{assert_clean, assert_one_of, code, entries, ok, packsync, skip, variant_tree, Rng};
use crate::fixture::Fixture;

const TRIALS: u32 = 120;

fn sync_args(f: &Fixture, src: &PathBuf) -> Vec<std::ffi::OsString> {
    vec![
        "sync".into(),
        "-q".into(),
        "--grace".into(),
        "0".into(),
        "--keep".into(),
        "1".into(),
        src.into(),
        f.dest().into(),
    ]
}

#[test]
fn sigkill_at_random_instants_leaves_a_complete_generation() {
    let f = Fixture::new();
    let sources: Vec<PathBuf> = (0..3).map(|i| f.path(&format!("src{i}"))).collect();
    for (i, s) in sources.iter().enumerate() {
        variant_tree(s, i as u32, 300, 2);
    }
    // How long a whole sync takes here: the kills land anywhere inside it.
    let t0 = Instant::now();
    ok(packsync()
        .args(sync_args(&f, &sources[0]))
        .output()
        .unwrap());
    let span = t0.elapsed().as_micros().max(1000) as u64 * 3 / 2;
    let mut rng = Rng::new("sigkill at random instants");
    let (mut killed, mut finished, mut leftovers) = (0, 0, 0);
    for trial in 0..TRIALS {
        let src = &sources[rng.below(sources.len() as u64) as usize];
        let mut child = packsync()
            .args(sync_args(&f, src))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_micros(rng.below(span)));
        let _ = child.kill();
        let status = child.wait().unwrap();
        if status.success() {
            finished += 1;
        } else {
            // Killed, or done: any other exit (a bug's exit 1) is a failure.
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(status.signal(), Some(9), "trial {trial}: {status:?}");
            killed += 1;
        }
        let was = assert_one_of(&f.dest(), &sources);
        if !entries(&f.state(), "stage").is_empty() {
            leftovers += 1;
        }
        // The next run (here on the same host) finishes the job and cleans up.
        let next = &sources[(was + 1 + trial as usize) % sources.len()];
        ok(packsync().args(sync_args(&f, next)).output().unwrap());
        assert_eq!(sources[assert_one_of(&f.dest(), &sources)], *next);
        assert_clean(&f.state());
    }
    eprintln!(
        "sigkill at random instants: {TRIALS} trials over {span} us each; {killed} killed mid-run \
         ({leftovers} left staging behind), {finished} finished first; every DEST complete, every \
         next run clean"
    );
    assert!(killed > 0, "no kill landed mid-run");
}

/// Each crash point, and what must be true for it to be reached.
#[test]
fn sigkill_at_each_crash_point() {
    if skip("sigkill at each crash point", false, true) {
        return;
    }
    let points = [
        "copied-file",
        "after-manifest",
        "after-rename",
        "before-publish",
        "after-publish",
        "retire-trash",
        "stage-trash",
    ];
    let mut reached = 0;
    for point in points {
        let f = Fixture::new();
        let sources: Vec<PathBuf> = (0..3).map(|i| f.path(&format!("src{i}"))).collect();
        for (i, s) in sources.iter().enumerate() {
            variant_tree(s, i as u32, 30, 0);
        }
        let run = |src: &PathBuf, crash: Option<&str>| {
            let mut c = packsync();
            c.args(["sync", "-q", "--grace", "0", "--keep", "0"])
                .arg(src)
                .arg(f.dest());
            if let Some(p) = crash {
                c.env("PACKSYNC_TEST_CRASH_AT", p);
            }
            c.output().unwrap()
        };
        ok(run(&sources[0], None));
        ok(run(&sources[1], None));
        if point == "stage-trash" {
            // A dead writer's staging for the collector to move aside.
            assert_eq!(code(&run(&sources[0], Some("copied-file"))), 137);
            assert_eq!(entries(&f.state(), "stage").len(), 1);
        }
        // retire-trash is reached when an older generation goes; stage-trash when dead staging does.
        let out = run(&sources[2], Some(point));
        assert_eq!(code(&out), 137, "{point} reached: {}", super::stderr(&out));
        reached += 1;
        let live = assert_one_of(&f.dest(), &sources);
        let expect_new = matches!(point, "after-publish" | "retire-trash" | "stage-trash");
        assert_eq!(
            live,
            if expect_new { 2 } else { 1 },
            "after a kill at {point}"
        );
        // The next run, on another tree, completes and leaves nothing of the dead one.
        ok(run(&sources[0], None));
        assert_eq!(assert_one_of(&f.dest(), &sources), 0);
        assert_clean(&f.state());
        assert_eq!(
            entries(&f.state(), "gen").len(),
            1,
            "after {point}: {:?}",
            entries(&f.state(), "gen")
        );
    }
    eprintln!(
        "sigkill at each crash point: {reached} of {} points reached and survived",
        points.len()
    );
}
