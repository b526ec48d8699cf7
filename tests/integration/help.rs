//! The command line as a user meets it: `--help` of every command (compared
//! with committed snapshots in `snapshots/`; `PACKSYNC_UPDATE_SNAPSHOTS=1`
//! rewrites them), and `sync`'s flags taken from the environment.

use std::fs;
use std::path::PathBuf;

use crate::fixture::{json, packsync, Fixture};

fn snapshot_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/integration/snapshots")
}

#[test]
fn help_of_every_command_matches_its_snapshot() {
    let update = std::env::var_os("PACKSYNC_UPDATE_SNAPSHOTS").is_some_and(|v| v == "1");
    let mut stale = Vec::new();
    for cmd in [
        "",
        "sync",
        "status",
        "verify",
        "rollback",
        "gc",
        "wait",
        "exec",
        "completions",
    ] {
        let mut c = packsync();
        // 100 columns, and stdout not a terminal (piped by output()).
        c.env("COLUMNS", "100");
        if !cmd.is_empty() {
            c.arg(cmd);
        }
        let out = c.arg("--help").output().unwrap();
        assert!(out.status.success(), "{cmd} --help: {out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(
            text.lines().all(|l| l.chars().count() <= 100),
            "{cmd}: a line wider than 100 columns:\n{text}"
        );
        let name = if cmd.is_empty() { "packsync" } else { cmd };
        let path = snapshot_dir().join(format!("help-{name}.txt"));
        if update {
            fs::create_dir_all(snapshot_dir()).unwrap();
            fs::write(&path, &text).unwrap();
            continue;
        }
        let want = fs::read_to_string(&path).unwrap_or_default();
        if want != text {
            stale.push(format!(
                "{}:\n--- committed\n{want}\n--- now\n{text}",
                path.display()
            ));
        }
    }
    assert!(
        stale.is_empty(),
        "help changed (PACKSYNC_UPDATE_SNAPSHOTS=1 rewrites the snapshots):\n{}",
        stale.join("\n")
    );
}

#[test]
fn sync_help_shows_the_usage_the_sources_and_the_headings() {
    let out = packsync()
        .env("COLUMNS", "100")
        .args(["sync", "--help"])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    for want in [
        "Usage: packsync sync [OPTIONS] <SOURCE>... <DEST>",
        "oci://HOST[:PORT]/REPO",
        "oci-layout:DIR",
        "oci-archive:FILE",
        "docker-archive:FILE",
        "https://URL",
        "//PATH",
        ".tar.zst",
        "Sources and network:",
        "Filters and metadata:",
        "Safety:",
        "Layout:",
        "Sidecar:",
        "Output:",
        "[env: PACKSYNC_EVERY]",
        "[env: PACKSYNC_NO_PROGRESS]",
    ] {
        assert!(text.contains(want), "{want:?} not in\n{text}");
    }
    // A value from the environment is never shown (a header holds tokens).
    let out = packsync()
        .env("COLUMNS", "100")
        .env("PACKSYNC_HEADER", "Authorization: Bearer s3cr3t")
        .args(["sync", "--help"])
        .output()
        .unwrap();
    let shown = String::from_utf8(out.stdout).unwrap();
    assert!(!shown.contains("s3cr3t"), "{shown}");
    assert_eq!(shown, text);
}

#[test]
fn sync_flags_come_from_the_environment_and_the_command_line_wins() {
    let fx = Fixture::new();
    for f in ["a.txt", "x.log", "keep.log", "y.tmp"] {
        fx.file(f, f);
    }
    let run = |label: Option<&str>| {
        let mut args = vec!["sync"];
        args.extend(label.map(|l| ["--label", l]).iter().flatten());
        args.extend(["src", "vol/packs"]);
        let mut c = fx.command(&args);
        // A repeatable flag: one value a line, the last line ending too.
        c.env("PACKSYNC_EXCLUDE", "*.log\n*.tmp\n")
            .env("PACKSYNC_INCLUDE", "keep.log")
            .env("PACKSYNC_LABEL", "v1.2.3")
            .env("PACKSYNC_JSON", "true")
            .env("PACKSYNC_GRACE", "0")
            .env("PACKSYNC_NO_PROGRESS", "1");
        crate::fixture::Run::from(c.output().unwrap()).ok()
    };
    let first = json(&run(None));
    assert_eq!(first["label"], "v1.2.3");
    let mut names: Vec<String> = fs::read_dir(fx.dest())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["a.txt", "keep.log"]);
    let second = json(&run(Some("v1.3.0")));
    assert_eq!(second["label"], "v1.3.0", "the command line wins");
}

#[test]
fn a_bad_value_in_the_environment_is_a_usage_error_naming_the_variable() {
    let fx = Fixture::new();
    fx.file("a.txt", "one");
    for (var, value, want) in [
        (
            "PACKSYNC_EVERY",
            "0",
            "invalid value \"0\" for --every (from PACKSYNC_EVERY): at least 10ms",
        ),
        (
            "PACKSYNC_CHECKSUM",
            "maybe",
            "invalid value \"maybe\" for --checksum (from PACKSYNC_CHECKSUM)",
        ),
        (
            "PACKSYNC_HEADER",
            "nocolon",
            "invalid value for --header (from PACKSYNC_HEADER)",
        ),
    ] {
        fx.unchanged_by(|| {
            let mut c = fx.command(&["sync", "src", "vol/packs"]);
            c.env(var, value);
            let run = crate::fixture::Run::from(c.output().unwrap()).fails(2, want);
            assert!(!run.stderr.contains("nocolon"), "{}", run.stderr);
            run
        });
    }
    // Given on the command line, the variable is not named.
    fx.sync(&["--every", "0"])
        .fails(2, "invalid value \"0\" for --every: at least 10ms");
}
