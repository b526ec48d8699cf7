//! Random trees and random updates, synced one after another: after each
//! sync the mirror equals the source, and the previous generation still
//! equals the previous source.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

use proptest::prelude::*;

use crate::fixture::{mirror, set_mtime, Fixture};

#[derive(Debug, Clone)]
pub(crate) enum Op {
    AddFile(u16, u32),
    AddDir(u16),
    AddLink(u16, u32),
    Delete(u16),
    Modify(u16, u32),
    ChangeMode(u16),
    ChangeMtime(u16, u32),
    Retarget(u16, u32),
    SwapKind(u16),
    Hardlink(u16, u16),
    BreakHardlink(u16),
}

pub(crate) fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (any::<u16>(), any::<u32>()).prop_map(|(a, b)| Op::AddFile(a, b)),
        1 => any::<u16>().prop_map(Op::AddDir),
        1 => (any::<u16>(), any::<u32>()).prop_map(|(a, b)| Op::AddLink(a, b)),
        2 => any::<u16>().prop_map(Op::Delete),
        2 => (any::<u16>(), any::<u32>()).prop_map(|(a, b)| Op::Modify(a, b)),
        1 => any::<u16>().prop_map(Op::ChangeMode),
        1 => (any::<u16>(), any::<u32>()).prop_map(|(a, b)| Op::ChangeMtime(a, b)),
        1 => (any::<u16>(), any::<u32>()).prop_map(|(a, b)| Op::Retarget(a, b)),
        1 => any::<u16>().prop_map(Op::SwapKind),
        1 => (any::<u16>(), any::<u16>()).prop_map(|(a, b)| Op::Hardlink(a, b)),
        1 => any::<u16>().prop_map(Op::BreakHardlink),
    ]
}

/// Every entry below `root` (not following links), sorted.
fn entries(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    fn walk(d: &Path, out: &mut Vec<PathBuf>) {
        for e in fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            out.push(p.clone());
            if fs::symlink_metadata(&p).unwrap().is_dir() {
                walk(&p, out);
            }
        }
    }
    walk(root, &mut out);
    out.sort();
    out
}

fn pick<F: Fn(&fs::Metadata) -> bool>(root: &Path, i: u16, want: F) -> Option<PathBuf> {
    let all: Vec<PathBuf> = entries(root)
        .into_iter()
        .filter(|p| want(&fs::symlink_metadata(p).unwrap()))
        .collect();
    (!all.is_empty()).then(|| all[i as usize % all.len()].clone())
}

fn dirs(root: &Path, i: u16) -> PathBuf {
    pick(root, i, |m| m.is_dir())
        .filter(|_| !i.is_multiple_of(3))
        .unwrap_or_else(|| root.to_path_buf())
}

pub(crate) fn apply(root: &Path, op: &Op, n: usize) {
    let file = |m: &fs::Metadata| m.is_file();
    match *op {
        Op::AddFile(d, v) => {
            let p = dirs(root, d).join(format!("f{n}"));
            fs::write(&p, format!("{v}").repeat((v % 50) as usize)).unwrap();
        }
        Op::AddDir(d) => fs::create_dir(dirs(root, d).join(format!("d{n}"))).unwrap(),
        Op::AddLink(d, v) => {
            symlink(format!("../t{v}"), dirs(root, d).join(format!("l{n}"))).unwrap()
        }
        Op::Delete(i) => {
            if let Some(p) = pick(root, i, |_| true) {
                if fs::symlink_metadata(&p).unwrap().is_dir() {
                    fs::remove_dir_all(&p).unwrap()
                } else {
                    fs::remove_file(&p).unwrap()
                }
            }
        }
        Op::Modify(i, v) => {
            if let Some(p) = pick(root, i, file) {
                fs::write(&p, format!("changed {v} {n}")).unwrap();
            }
        }
        Op::ChangeMode(i) => {
            if let Some(p) = pick(root, i, |m| !m.file_type().is_symlink()) {
                let m = fs::metadata(&p).unwrap().permissions().mode();
                fs::set_permissions(&p, fs::Permissions::from_mode(m ^ 0o011)).unwrap();
            }
        }
        Op::ChangeMtime(i, v) => {
            if let Some(p) = pick(root, i, |_| true) {
                set_mtime(&p, 1_600_000_000 + v as i64 % 1000, v % 1_000_000_000);
            }
        }
        Op::Retarget(i, v) => {
            if let Some(p) = pick(root, i, |m| m.file_type().is_symlink()) {
                fs::remove_file(&p).unwrap();
                symlink(format!("/abs/{v}"), &p).unwrap();
            }
        }
        Op::SwapKind(i) => {
            if let Some(p) = pick(root, i, |m| !m.file_type().is_symlink()) {
                if fs::metadata(&p).unwrap().is_dir() {
                    fs::remove_dir_all(&p).unwrap();
                    fs::write(&p, "was a dir").unwrap();
                } else {
                    fs::remove_file(&p).unwrap();
                    fs::create_dir(&p).unwrap();
                    fs::write(p.join("inner"), "was a file").unwrap();
                }
            }
        }
        Op::Hardlink(i, d) => {
            if let Some(p) = pick(root, i, file) {
                fs::hard_link(&p, dirs(root, d).join(format!("h{n}"))).unwrap();
            }
        }
        Op::BreakHardlink(i) => {
            use std::os::unix::fs::MetadataExt;
            if let Some(p) = pick(root, i, |m| m.is_file() && m.nlink() > 1) {
                let data = fs::read(&p).unwrap();
                let meta = fs::metadata(&p).unwrap();
                fs::remove_file(&p).unwrap();
                fs::write(&p, data).unwrap();
                set_mtime(&p, meta.mtime(), meta.mtime_nsec() as u32);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn every_sync_mirrors_the_source_and_keeps_the_previous_tree(
        rounds in prop::collection::vec(prop::collection::vec(op(), 1..8), 2..6)
    ) {
        let f = Fixture::new();
        let mut previous: Option<(PathBuf, Vec<String>)> = None;
        let mut n = 0;
        for ops in &rounds {
            for o in ops {
                n += 1;
                apply(&f.src(), o, n);
            }
            let out = f.sync(&["--keep", "1", "--allow-empty"]);
            prop_assert_eq!(out.code, 0, "{}", out.stderr);
            let expected = mirror(&f.src());
            prop_assert_eq!(&mirror(&f.dest()), &expected);
            if let Some((gen, tree)) = &previous {
                let path = f.path("vol").join(gen);
                if path.exists() {
                    prop_assert_eq!(&mirror(&path), tree, "previous generation changed");
                }
            }
            let gen = fs::read_link(f.dest()).unwrap();
            if previous.as_ref().map(|p| &p.0) != Some(&gen) {
                // The generation just replaced must still be there (--keep 1).
                if let Some((old, _)) = &previous {
                    prop_assert!(f.path("vol").join(old).exists(), "previous generation removed");
                }
            }
            previous = Some((gen, expected));
        }
    }
}
