//! Copying files of every size: with one read and one write, through several
//! buffers, and by the kernel a chunk at a time; durable or not. The copy is
//! exact and the manifest records the SHA-256 of what was copied.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::fixture::{mirror, write_at, Fixture};

/// Both sides of each limit in stage.rs: the 64 KiB buffer, the 1 MiB limit
/// of copying through user space, the 8 MiB chunks of `copy_large`.
const SIZES: [usize; 9] = [
    0,
    1,
    (64 << 10) - 1,
    64 << 10,
    (64 << 10) + 1,
    1 << 20,
    (1 << 20) + 1,
    (8 << 20) + 3,
    (17 << 20) + 5,
];

/// Bytes that differ at every offset, so a chunk copied twice or skipped shows.
fn content(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The live generation's manifest.
fn live_manifest(f: &Fixture) -> String {
    let gen = fs::read_link(f.dest()).unwrap();
    let gen = gen.file_name().unwrap().to_string_lossy().into_owned();
    fs::read_to_string(f.state().join(format!("meta/{gen}.manifest"))).unwrap()
}

#[track_caller]
fn assert_recorded(manifest: &str, name: &str, data: &[u8]) {
    let line = manifest
        .lines()
        .find(|l| l.starts_with("f ") && l.ends_with(&format!(" {name}")))
        .unwrap_or_else(|| panic!("{name} not in the manifest:\n{manifest}"));
    assert!(
        line.contains(&format!(" {} ", sha256_hex(data))),
        "{name}: wrong hash in {line}"
    );
}

fn write(path: &Path, data: &[u8]) {
    fs::write(path, data).unwrap();
}

#[test]
fn files_of_every_size_are_copied_and_hashed_exactly() {
    for extra in [&[][..], &["--no-fsync"][..]] {
        let f = Fixture::new();
        let files: Vec<(String, Vec<u8>)> = SIZES
            .iter()
            .enumerate()
            .map(|(i, &n)| (format!("f{i}.bin"), content(i as u64, n)))
            .collect();
        for (name, data) in &files {
            write(&f.src().join(name), data);
        }
        f.sync(extra).ok();
        assert_eq!(mirror(&f.dest()), mirror(&f.src()), "{extra:?}");
        let manifest = live_manifest(&f);
        for (name, data) in &files {
            assert_recorded(&manifest, name, data);
        }
    }
}

#[test]
fn a_large_file_changed_in_the_middle_is_copied_again_whole() {
    let f = Fixture::new();
    let mut data = content(7, (20 << 20) + 11);
    write_at(&f.src().join("big.bin"), &data, 1_700_000_000, 0);
    write(&f.src().join("small.txt"), b"unchanged\n");
    f.sync(&[]).ok();
    // Same size, new bytes in the third chunk, a new mtime.
    data[(16 << 20) + 5] ^= 0xff;
    write_at(&f.src().join("big.bin"), &data, 1_700_000_100, 0);
    let out = f.sync(&["--json"]).ok();
    let summary: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(summary["copied"], 1, "{}", out.stdout);
    assert_eq!(summary["reused"], 1, "{}", out.stdout);
    assert_eq!(fs::read(f.dest().join("big.bin")).unwrap(), data);
    assert_recorded(&live_manifest(&f), "big.bin", &data);
}

/// Every count of a `--json` summary, for comparing runs.
fn counts(out: &str) -> (String, u64, u64) {
    let s: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    (
        s["status"].as_str().unwrap().to_string(),
        s["copied"].as_u64().unwrap(),
        s["reused"].as_u64().unwrap(),
    )
}

#[test]
fn a_new_label_on_unchanged_content_reuses_every_file() {
    let f = Fixture::new();
    f.file("a/x.py", "x");
    f.file("b.txt", "b");
    f.sync(&["--label", "v1"]).ok();
    let ino = fs::metadata(f.dest().join("a/x.py")).unwrap().ino();
    let out = f.sync(&["--label", "v2", "--json"]).ok();
    assert_eq!(counts(&out.stdout), ("synced".into(), 0, 2));
    assert_eq!(fs::metadata(f.dest().join("a/x.py")).unwrap().ino(), ino);
    assert_recorded(&live_manifest(&f), "a/x.py", b"x");
}

#[test]
fn a_dry_run_of_an_up_to_date_tree_counts_every_file_as_reused() {
    let f = Fixture::new();
    f.file("a/x.py", "x");
    f.file("b.txt", "b");
    f.sync(&[]).ok();
    let out = f.sync(&["--dry-run", "--json"]).ok();
    assert_eq!(counts(&out.stdout), ("up to date".into(), 0, 2));
}
