//! The binary under test against an older packsync: `PACKSYNC_OLD` names it
//! (`.ci/run` builds it from the commit in `tests/differential-base`). Both
//! sync the same random source histories, each into its own DEST on one
//! volume with the same flags, and must agree on exit codes, the JSON
//! summary, stderr, the generation, its manifest, the mirror (hardlink groups
//! included) and `status --json`; and each must find the DEST the other wrote
//! up to date. Without `PACKSYNC_OLD` the test is skipped.

use std::cell::RefCell;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use serde_json::Value;

use crate::fixture::{clean_env, mirror, Fixture, Run};
use crate::property::{apply, op, Op};

/// The two DESTs, side by side in `vol/`: the old binary's and the new one's.
/// Each name is a token no source path holds; `run` and `snapshot` write
/// it `DEST`.
const OLD: &str = "OLDDEST";
const NEW: &str = "NEWDEST";

#[derive(Clone, Copy)]
enum Source {
    Dir,
    /// `src.tar`, made from `src/` by GNU tar each round.
    Tar,
    /// An OCI layout whose tag `1` is one image of one layer, that tar.
    Oci,
}

#[derive(Clone, Copy)]
enum Layout {
    Symlink,
    Dir,
    /// `--layout fanout`, with `--slot` when named.
    Fanout(Option<&'static str>),
}

struct Mode {
    name: &'static str,
    /// The syncs of a round, each its flags; `{n}` is the round's number.
    runs: &'static [&'static [&'static str]],
    source: Source,
    layout: Layout,
    /// What some run's JSON must hold over all cases, so that a mode whose
    /// every run failed alike (a tool missing, a filesystem refusing the
    /// layout) does not pass for one that was compared.
    shows: &'static [&'static str],
    /// The live trees drift between rounds (`drift`). Not where the base
    /// binary took the whole-tree path and this one streams against the
    /// live manifest, counting what drifted differently: a plain sync of
    /// an archive or an image (a directory's streamed already there), and
    /// a plain sync on a volume that does not show hardlinks.
    drifts: bool,
    /// What the live side is before each round, besides what the syncs made.
    bare: Bare,
    /// The volume is taken for one that does not show hardlinks
    /// (`PACKSYNC_TEST_HARDLINKS=hidden`, as sshfs): manifests keep the
    /// groups (`hardlinks 0`).
    hidden_links: bool,
}

/// A live side with no manifest to read, as the round starts.
#[derive(Clone, Copy, PartialEq)]
enum Bare {
    /// As the last sync left it.
    No,
    /// The live generation's manifest is removed before every round.
    ManifestLost,
    /// Before the first round, DEST is a plain directory to take over: a
    /// copy of the source (hardlinks not kept, as `cp -R` copies) that
    /// then drifts.
    TakeOver,
}

const SYNCED: &str = r#""status":"synced""#;

const MODES: &[Mode] = &[
    Mode::new("plain", &[&[]]),
    Mode::new("dry run", &[&["--dry-run"], &[]]).shows(&[r#""status":"would sync""#, SYNCED]),
    Mode::new("itemize", &[&["--dry-run", "--itemize"], &["--itemize"]]),
    Mode::new("checksum", &[&["--checksum"]]),
    Mode::new("verify", &[&["--verify"]]),
    // 0 as well as 2: the random trees are small, and a round seldom deletes three entries.
    Mode::new(
        "max delete",
        &[&["--max-delete", "0"], &["--max-delete", "2"]],
    )
    .shows(&[SYNCED, "more than --max-delete 0"]),
    Mode::new("label", &[&["--label", "1.0.{n}"]]),
    Mode::new("layout dir", &[&[]]).on(Layout::Dir),
    Mode::new("layout fanout", &[&[]]).on(Layout::Fanout(None)),
    Mode::new("fanout slot", &[&[]]).on(Layout::Fanout(Some("s1"))),
    Mode::new("archive", &[&[]]).from(Source::Tar).steady(),
    Mode::new("oci layout", &[&[]]).from(Source::Oci).steady(),
    Mode::new(
        "archive itemize",
        &[&["--dry-run", "--itemize"], &["--itemize"]],
    )
    .from(Source::Tar),
    Mode::new(
        "oci itemize",
        &[&["--dry-run", "--itemize"], &["--itemize"]],
    )
    .from(Source::Oci),
    Mode::new("manifest lost", &[&["--dry-run", "--itemize"], &[]]).bare(Bare::ManifestLost),
    Mode::new("manifest lost itemize", &[&["--itemize"]]).bare(Bare::ManifestLost),
    Mode::new("archive manifest lost", &[&["--dry-run", "--itemize"], &[]])
        .from(Source::Tar)
        .bare(Bare::ManifestLost),
    Mode::new(
        "manifest lost checksum",
        &[&["--checksum", "--dry-run"], &["--checksum"]],
    )
    .bare(Bare::ManifestLost),
    Mode::new("take over", &[&["--dry-run", "--itemize"], &[]]).bare(Bare::TakeOver),
    Mode::new("take over checksum", &[&["--checksum", "--itemize"]]).bare(Bare::TakeOver),
    Mode::new("archive take over", &[&["--itemize"]])
        .from(Source::Tar)
        .bare(Bare::TakeOver),
    // Steady: the base binary compared whole trees on such a volume, this
    // one stages against the live manifest (see `drifts`).
    Mode::new("hardlinks hidden", &[&[]])
        .steady()
        .hidden_links(),
    Mode::new(
        "hardlinks hidden itemize",
        &[&["--dry-run", "--itemize"], &["--itemize"]],
    )
    .hidden_links(),
    Mode::new("hardlinks hidden checksum", &[&["--checksum"]]).hidden_links(),
    Mode::new("hardlinks hidden verify", &[&["--verify"]]).hidden_links(),
    Mode::new("hardlinks hidden archive", &[&[]])
        .from(Source::Tar)
        .steady()
        .hidden_links(),
];

impl Mode {
    const fn new(name: &'static str, runs: &'static [&'static [&'static str]]) -> Mode {
        Mode {
            name,
            runs,
            source: Source::Dir,
            layout: Layout::Symlink,
            shows: &[SYNCED],
            drifts: true,
            bare: Bare::No,
            hidden_links: false,
        }
    }

    const fn hidden_links(self) -> Mode {
        Mode {
            hidden_links: true,
            ..self
        }
    }

    const fn bare(self, bare: Bare) -> Mode {
        Mode { bare, ..self }
    }

    const fn steady(self) -> Mode {
        Mode {
            drifts: false,
            ..self
        }
    }

    const fn on(self, layout: Layout) -> Mode {
        Mode { layout, ..self }
    }

    const fn from(self, source: Source) -> Mode {
        Mode { source, ..self }
    }

    const fn shows(self, shows: &'static [&'static str]) -> Mode {
        Mode { shows, ..self }
    }
}

impl Layout {
    fn flags(self) -> Vec<&'static str> {
        match self {
            Layout::Symlink => vec![],
            Layout::Dir => vec!["--layout", "dir"],
            Layout::Fanout(None) => vec!["--layout", "fanout"],
            Layout::Fanout(Some(slot)) => vec!["--layout", "fanout", "--slot", slot],
        }
    }

    /// The live tree of `dest`, and the link naming its generation (none
    /// with `--layout dir`, where DEST is the tree).
    fn live(self, dest: &Path) -> (PathBuf, Option<PathBuf>) {
        match self {
            Layout::Symlink => (dest.into(), Some(dest.into())),
            Layout::Dir => (dest.into(), None),
            Layout::Fanout(slot) => {
                let data = dest.join(slot.map_or("..data".into(), |s| format!("..data-{s}")));
                (data.clone(), Some(data))
            }
        }
    }

    /// The state directory of `dest`, `meta/` inside it.
    fn state(self, dest: &Path) -> PathBuf {
        match self {
            Layout::Symlink | Layout::Dir => {
                let name = dest.file_name().unwrap().to_str().unwrap();
                dest.with_file_name(format!(".{name}.packsync"))
            }
            Layout::Fanout(None) => dest.join("..packsync"),
            Layout::Fanout(Some(slot)) => dest.join("..packsync/slots").join(slot),
        }
    }
}

/// `bin ARGS` in `dir` with the fixture's environment: its exit code, its
/// stdout as JSON (null when empty) and its stderr, with `dest` (the DEST's
/// name) written `DEST` and the timings taken out (`strip_times`).
fn run(bin: &Path, dir: &Path, args: &[String], dest: &str, mode: &Mode) -> (i32, Value, String) {
    unsuffix(run_as_is(bin, dir, args, dest, mode))
}

/// `run`, generation names as they are.
fn run_as_is(
    bin: &Path,
    dir: &Path,
    args: &[String],
    dest: &str,
    mode: &Mode,
) -> (i32, Value, String) {
    let mut c = Command::new(bin);
    clean_env(&mut c).args(args).current_dir(dir);
    if mode.hidden_links {
        c.env("PACKSYNC_TEST_HARDLINKS", "hidden");
    }
    let out = Run::from(c.output().unwrap());
    let stdout = out.stdout.replace(dest, "DEST");
    let mut json = if stdout.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
    };
    strip_times(&mut json);
    (out.code, json, out.stderr.replace(dest, "DEST"))
}

/// A run's JSON and stderr `unsuffixed`.
fn unsuffix((code, json, stderr): (i32, Value, String)) -> (i32, Value, String) {
    let json = serde_json::from_str(&unsuffixed(&json.to_string())).unwrap();
    (code, json, unsuffixed(&stderr))
}

/// `text` with each generation name's unique suffix (`<digest>-<8 hex>`:
/// the same tree published again after its live copy drifted) written
/// `<digest>-SUFFIX`: two writers pick different ones by design.
fn unsuffixed(text: &str) -> String {
    let b = text.as_bytes();
    let hex = |r: std::ops::Range<usize>| {
        b.get(r.clone()).is_some_and(|s| {
            s.iter()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
        })
    };
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let boundary = |j: usize| b.get(j).is_none_or(|c| !c.is_ascii_alphanumeric());
        if (i == 0 || boundary(i - 1))
            && hex(i..i + 16)
            && b.get(i + 16) == Some(&b'-')
            && hex(i + 17..i + 25)
            && boundary(i + 25)
        {
            out.push_str(&text[i..i + 17]);
            out.push_str("SUFFIX");
            i += 25;
        } else {
            let c = text[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// Take out what says when, or how long: a sync's `seconds`, and in
/// `status` each generation's `created` and `retired` (times, and `_unix`
/// the same in seconds) and each staging directory's `age_seconds`. A
/// sync's `retired` is the list of generations it removed, and stays; so
/// does every count.
fn strip_times(v: &mut Value) {
    match v {
        Value::Object(o) => {
            for key in [
                "seconds",
                "age_seconds",
                "created",
                "created_unix",
                "retired_unix",
            ] {
                o.remove(key);
            }
            if o.get("retired").is_some_and(|r| !r.is_array()) {
                o.remove("retired");
            }
            o.values_mut().for_each(strip_times);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_times),
        _ => {}
    }
}

/// What a reader and `status` see of `vol/NAME`: the link to the live
/// generation, its manifest (but its `created` line), DEST's own entries
/// (fanout's entry links), the mirror, and `status --json`.
#[derive(Debug, PartialEq)]
struct Snapshot {
    link: Option<String>,
    manifest: Option<String>,
    entries: Vec<String>,
    mirror: Vec<String>,
    status: (i32, Value, String),
}

fn snapshot(f: &Fixture, mode: &Mode, bin: &Path, name: &str) -> Snapshot {
    let (dest, layout) = (f.path("vol").join(name), mode.layout);
    let args = ["status".into(), "--json".into(), format!("vol/{name}")];
    let status = run_as_is(bin, f.dir.path(), &args, name, mode);
    if fs::symlink_metadata(&dest).is_err() {
        return Snapshot {
            link: None,
            manifest: None,
            entries: vec![],
            mirror: vec![],
            status: unsuffix(status),
        };
    }
    let (tree, link) = layout.live(&dest);
    // Missing where a round removed it (`Bare::ManifestLost`).
    let manifest = status.1["live"]["generation"].as_str().and_then(|gen| {
        let path = layout.state(&dest).join(format!("meta/{gen}.manifest"));
        let text = fs::read_to_string(&path).ok()?;
        let created = |l: &&str| l.starts_with("created ");
        Some(text.split_inclusive('\n').filter(|l| !created(l)).collect())
    });
    let mut entries: Vec<String> = fs::read_dir(&dest)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|e| e != "..packsync")
        .map(|e| unsuffixed(&format!("{e} -> {:?}", fs::read_link(dest.join(&e)).ok())))
        .collect();
    entries.sort();
    Snapshot {
        // None where DEST is still a directory to take over.
        link: link.and_then(|l| {
            let to = fs::read_link(l).ok()?;
            Some(unsuffixed(&to.to_string_lossy().replace(name, "DEST")))
        }),
        manifest,
        entries,
        mirror: mirror(&tree),
        status: unsuffix(status),
    }
}

/// Make this round's `src.tar` and, for an OCI source, the layout's tag `1`.
fn make_source(f: &Fixture, source: Source) -> &'static str {
    if let Source::Dir = source {
        return "src";
    }
    let ok = Command::new("tar")
        .args(["-C", "src", "--format=pax", "-cf", "src.tar", "."])
        .current_dir(f.dir.path())
        .status()
        .unwrap();
    assert!(ok.success(), "tar of src/");
    if let Source::Tar = source {
        return "src.tar";
    }
    let tar = f.path("src.tar").display().to_string();
    let image = format!(
        r#"[{{"tag":"1","platforms":[{{"os":"linux","arch":"amd64","layers":[{{"tar":{tar:?}}}]}}]}}]"#
    );
    crate::source_oci::write_layout(&f.path("layout"), &image, "1");
    "oci-layout:layout:1"
}

/// Change the live tree at `live` (if there is one) as someone with a
/// shell on the volume might, the same way for the same `seed`: a file
/// added, the first file removed, the first directory's mtime or the
/// first file's mode changed, or the first file's bytes changed keeping
/// its size and mtime (only `--checksum` sees that) ("first" in name
/// order, depth first).
fn drift(live: &Path, seed: usize) {
    // The tree itself, not the link naming it (whose own times would change).
    let Ok(live) = fs::canonicalize(live) else {
        return;
    };
    let live = live.as_path();
    fn first(dir: &Path, want_dir: bool) -> Option<PathBuf> {
        let mut names: Vec<PathBuf> = fs::read_dir(dir).ok()?.map(|e| e.unwrap().path()).collect();
        names.sort();
        for p in names {
            let m = fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                if want_dir {
                    return Some(p);
                }
                if let Some(found) = first(&p, want_dir) {
                    return Some(found);
                }
            } else if m.is_file() && !want_dir {
                return Some(p);
            }
        }
        None
    }
    match seed % 5 {
        // The directory written keeps a set mtime: both trees drift alike.
        0 => {
            let p = live.join(format!("drift{seed}"));
            fs::write(&p, "drift").unwrap();
            crate::fixture::set_mtime(&p, 1_000_000_100, 0);
            crate::fixture::set_mtime(live, 1_000_000_100, 0);
        }
        1 => {
            if let Some(p) = first(live, false) {
                fs::remove_file(&p).unwrap();
                crate::fixture::set_mtime(p.parent().unwrap(), 1_000_000_100, 0);
            }
        }
        2 => {
            if let Some(p) = first(live, true) {
                crate::fixture::set_mtime(&p, 1_000_000_000, 0);
            }
        }
        3 => {
            if let Some(p) = first(live, false) {
                use std::os::unix::fs::PermissionsExt;
                fs::set_permissions(p, fs::Permissions::from_mode(0o600)).unwrap();
            }
        }
        _ => {
            if let Some(p) = first(live, false) {
                let (s, ns) = crate::fixture::mtime(&p);
                let mut bytes = fs::read(&p).unwrap();
                bytes.iter_mut().for_each(|b| *b = b.wrapping_add(1));
                fs::write(&p, bytes).unwrap();
                crate::fixture::set_mtime(&p, s, ns);
            }
        }
    }
}

/// Make `dest` a plain directory holding a copy of `src` (by `cp -R`,
/// keeping modes and times but not hardlinks), then drift it.
fn take_over(src: &Path, dest: &Path, seed: usize) {
    fs::create_dir_all(dest.parent().unwrap()).unwrap();
    let ok = Command::new("cp")
        .args(["-R", "--preserve=mode,timestamps", "--no-dereference"])
        .arg(src)
        .arg(dest)
        .status()
        .unwrap();
    assert!(ok.success(), "cp -R of src/");
    drift(dest, seed);
}

/// Remove the manifest of `dest`'s live generation, where it has one.
fn lose_manifest(layout: Layout, dest: &Path) {
    let Ok(tree) = fs::canonicalize(layout.live(dest).0) else {
        return;
    };
    let gen = tree.file_name().unwrap().to_str().unwrap();
    let _ = fs::remove_file(layout.state(dest).join(format!("meta/{gen}.manifest")));
}

/// One random history in `mode`: each round's syncs by both binaries must
/// agree, and after the round each binary must find the other's DEST up to
/// date. Each summary is added to `seen`.
fn history(
    old: &Path,
    mode: &Mode,
    rounds: &[Vec<Op>],
    seen: &RefCell<String>,
) -> Result<(), TestCaseError> {
    let f = Fixture::new();
    let mut k = 0;
    for (n, ops) in rounds.iter().enumerate() {
        for o in ops {
            k += 1;
            apply(&f.src(), o, k);
        }
        let source = make_source(&f, mode.source);
        for d in [OLD, NEW] {
            let dest = f.path("vol").join(d);
            match mode.bare {
                Bare::TakeOver if n == 0 => take_over(&f.src(), &dest, n + k),
                Bare::ManifestLost => lose_manifest(mode.layout, &dest),
                _ => {}
            }
        }
        // Every third round, the live trees drift alike first: the plans
        // then differ from the manifests, as the whole-tree path sees them.
        if mode.drifts && n % 3 == 2 {
            for d in [OLD, NEW] {
                drift(&mode.layout.live(&f.path("vol").join(d)).0, n + k);
            }
        }
        let args = |flags: &[&str], dest: &str| -> Vec<String> {
            let fixed = ["sync", "--json", "--grace", "0"].into_iter();
            let flags = flags.iter().map(|s| s.replace("{n}", &n.to_string()));
            (fixed.chain(mode.layout.flags()).map(String::from))
                .chain(flags)
                .chain([source.into(), format!("vol/{dest}")])
                .collect()
        };
        let mut last = 0;
        for flags in mode.runs {
            let was = run(old, f.dir.path(), &args(flags, OLD), OLD, mode);
            let now = run(
                &crate::fixture::bin(),
                f.dir.path(),
                &args(flags, NEW),
                NEW,
                mode,
            );
            seen.borrow_mut().push_str(&now.1.to_string());
            prop_assert_eq!(&was, &now, "round {}, flags {:?}", n, flags);
            prop_assert_eq!(
                snapshot(&f, mode, old, OLD),
                snapshot(&f, mode, &crate::fixture::bin(), NEW),
                "round {}, flags {:?}",
                n,
                flags
            );
            if mode.hidden_links {
                let manifest = snapshot(&f, mode, old, OLD).manifest.unwrap_or_default();
                prop_assert!(
                    manifest.is_empty() || manifest.contains("\nhardlinks 0\n"),
                    "round {}: the volume showed hardlinks: {}",
                    n,
                    manifest
                );
            }
            last = now.0;
        }
        if last == 0 {
            // The other way round: each binary syncs the other's DEST again.
            let flags = mode.runs.last().unwrap();
            let was = run(old, f.dir.path(), &args(flags, NEW), NEW, mode);
            let now = run(
                &crate::fixture::bin(),
                f.dir.path(),
                &args(flags, OLD),
                OLD,
                mode,
            );
            prop_assert!(
                was.1["status"] == "up to date",
                "round {}: the old binary on the new one's DEST: {:?}",
                n,
                was
            );
            prop_assert_eq!(&was, &now, "round {}: each on the other's DEST", n);
        }
    }
    Ok(())
}

#[test]
fn the_old_binary_and_this_one_sync_alike() {
    let Some(old) = std::env::var_os("PACKSYNC_OLD").filter(|o| !o.is_empty()) else {
        crate::fixture::skip(
            "PACKSYNC_OLD names no binary (a packsync built from an older commit, \
             as .ci/run builds from tests/differential-base)",
        );
        return;
    };
    let old = PathBuf::from(old);
    assert!(old.is_file(), "PACKSYNC_OLD={old:?} is not a file");
    let rounds = prop::collection::vec(prop::collection::vec(op(), 1..8), 2..5);
    for mode in MODES {
        // The same cases on every run (a seed of the mode's name): a mode
        // whose random cases happened to show nothing it must (no round
        // deleting under `--max-delete 0`, say) would fail by chance.
        // `PACKSYNC_DIFF_SEED` draws others.
        let mut seed = [0u8; 32];
        let salt = std::env::var("PACKSYNC_DIFF_SEED").unwrap_or_default();
        for (i, b) in mode.name.bytes().chain(salt.bytes()).enumerate() {
            seed[i % 32] = seed[i % 32].wrapping_mul(31).wrapping_add(b);
        }
        let config = Config {
            cases: 10,
            failure_persistence: None,
            ..Config::default()
        };
        let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed);
        let mut runner = TestRunner::new_with_rng(config, rng);
        let seen = RefCell::new(String::new());
        if let Err(e) = runner.run(&rounds, |r| history(&old, mode, &r, &seen)) {
            panic!("{}: {e}", mode.name);
        }
        for want in mode.shows {
            assert!(
                seen.borrow().contains(want),
                "{}: no run showed {want}",
                mode.name
            );
        }
    }
}
