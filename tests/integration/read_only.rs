//! A publisher that is not root (the restricted Pod Security profile) and a
//! source whose directories are read-only (an image's `COPY --chmod=555`, a
//! checkout made read-only): moving such a tree needs its owner's write bit,
//! and so does emptying it when it retires.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use crate::fixture::{bin, is_root, skip, Fixture, Run};

const NOBODY: u32 = 65534;

/// Every entry below `root`: its path, kind and mode.
fn modes(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            out.push(format!("{rel} {:o}", m.mode() & 0o7777));
            if m.is_dir() {
                todo.push(p);
            }
        }
    }
    out.push(format!(
        ". {:o}",
        fs::metadata(root).unwrap().mode() & 0o7777
    ));
    out.sort();
    out
}

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

fn as_nobody(f: &Fixture, args: &[&str]) -> Run {
    Run::from(
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(bin())
            .args(args)
            .current_dir(f.path(""))
            .output()
            .unwrap(),
    )
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn a_publisher_that_is_not_root_mirrors_a_read_only_tree_and_retires_it() {
    if !is_root() {
        skip("needs root to run packsync as uid 65534 (setpriv)");
        return;
    }
    let f = Fixture::new();
    f.file("actions/run.py", "print(1)\n");
    f.file("pack.yaml", "name: core\n");
    fs::create_dir_all(f.path("vol")).unwrap();
    std::os::unix::fs::chown(f.path("vol"), Some(NOBODY), Some(NOBODY)).unwrap();
    chmod(&f.path(""), 0o755);
    let seal = |f: &Fixture| {
        for d in [f.src().join("actions"), f.src()] {
            chmod(&d, 0o555);
        }
    };
    seal(&f);
    let sync = |f: &Fixture| {
        as_nobody(
            f,
            &["sync", "--keep", "0", "--grace", "0", "src", "vol/packs"],
        )
    };

    sync(&f).ok();
    assert_eq!(modes(&f.dest()), modes(&f.src()), "the first generation");
    let first = fs::read_link(f.dest()).unwrap();

    // v2: one action more; v1, read-only throughout, is retired by nobody.
    chmod(&f.src().join("actions"), 0o755);
    f.file("actions/stop.py", "print(0)\n");
    seal(&f);
    sync(&f).ok();
    assert_eq!(modes(&f.dest()), modes(&f.src()), "the second generation");
    assert_ne!(fs::read_link(f.dest()).unwrap(), first);
    let live = fs::read_link(f.dest()).unwrap();
    let live = live.file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(
        names(&f.state().join("gen")),
        [live],
        "--keep 0: the first generation is gone"
    );
    assert_eq!(names(&f.state().join("trash")), Vec::<String>::new());
    assert_eq!(names(&f.state().join("stage")), Vec::<String>::new());
    let again = sync(&f).ok();
    assert!(
        again.stdout.contains("up to date"),
        "a re-sync: {}",
        again.stdout
    );
}

#[test]
fn the_dir_and_fanout_layouts_take_a_read_only_tree_from_a_publisher_that_is_not_root() {
    if !is_root() {
        skip("needs root to run packsync as uid 65534 (setpriv)");
        return;
    }
    for layout in ["dir", "fanout"] {
        let f = Fixture::new();
        f.file("policy.rego", "package a\n");
        fs::create_dir_all(f.path("vol")).unwrap();
        std::os::unix::fs::chown(f.path("vol"), Some(NOBODY), Some(NOBODY)).unwrap();
        chmod(&f.path(""), 0o755);
        chmod(&f.src(), 0o555);
        let args = [
            "sync",
            "--layout",
            layout,
            "--keep",
            "0",
            "--grace",
            "0",
            "src",
            "vol/packs",
        ];
        as_nobody(&f, &args).ok();
        chmod(&f.src(), 0o755);
        f.file("data.json", "{}\n");
        chmod(&f.src(), 0o555);
        as_nobody(&f, &args).ok();
        // fanout: DEST holds the state directory, a link per entry and
        // `..data`, the link to the generation: the tree is behind it.
        let tree = match layout {
            "fanout" => fs::canonicalize(f.dest().join("..data")).unwrap(),
            _ => f.dest(),
        };
        let (got, want) = (modes(&tree), modes(&f.src()));
        assert_eq!(got, want, "{layout}: the second generation");
    }
}
