//! The command line: clap definitions and their conversion into `Config`.
//! The only file that imports clap (besides completions generation).

use std::path::PathBuf;

use anyhow::Result;
use clap::{ArgAction, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

use crate::config::{self, Command, Config, Layout, SyncConfig};
use crate::error;
use crate::report;

#[derive(Parser, Debug)]
#[command(
    name = "packsync",
    version,
    about = "Mirror a tree onto a shared volume: delete semantics, one atomic swap, many writers"
)]
pub struct Args {
    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Mirror SOURCE(s) into DEST (later SOURCEs win paths that several provide)
    Sync(Box<SyncArgs>),
    /// Show what is live and what is retained
    Status {
        dest: PathBuf,
        /// One JSON object on stdout
        #[arg(long)]
        json: bool,
        /// With --layout fanout: only this slot
        #[arg(long, value_name = "NAME")]
        slot: Option<String>,
    },
    /// Re-hash the live tree against its manifest (exit 4 on differences)
    Verify {
        dest: PathBuf,
        /// One JSON object on stdout
        #[arg(long)]
        json: bool,
        /// With --layout fanout: only this slot
        #[arg(long, value_name = "NAME")]
        slot: Option<String>,
    },
    /// Make a retained generation live again
    Rollback {
        dest: PathBuf,
        /// Generation to publish: a name, a unique prefix or a label (default: the newest one made before the live one)
        #[arg(long, value_name = "GEN")]
        to: Option<String>,
        /// With --layout fanout: the slot to roll back
        #[arg(long, value_name = "NAME")]
        slot: Option<String>,
    },
    /// Retire old generations and remove dead staging
    Gc {
        dest: PathBuf,
        #[arg(long, default_value_t = config::DEFAULT_KEEP)]
        keep: usize,
        #[arg(long, default_value = config::DEFAULT_GRACE)]
        grace: String,
    },
    /// Block until DEST holds a live generation (exit 5 on timeout)
    Wait {
        dest: PathBuf,
        /// Give up after this long (e.g. 30s, 5m; default: wait forever)
        #[arg(long, value_name = "DUR")]
        timeout: Option<String>,
        /// Wait for a live generation with exactly this label
        #[arg(long, value_name = "TEXT")]
        label: Option<String>,
        /// With --layout fanout: wait for this slot only
        #[arg(long, value_name = "NAME")]
        slot: Option<String>,
    },
    /// Run CMD with PACKSYNC_ROOT set to the live generation, leased while it runs
    Exec {
        dest: PathBuf,
        /// With --layout fanout: the slot whose generation CMD runs on
        #[arg(long, value_name = "NAME")]
        slot: Option<String>,
        #[arg(required = true, last = true)]
        cmd: Vec<String>,
    },
    /// Print a shell completion script
    Completions { shell: clap_complete::Shell },
}

#[derive(clap::Args, Debug)]
pub struct SyncArgs {
    /// SOURCE... DEST
    #[arg(required = true, num_args = 2.., value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// Leave out paths matching GLOB (gitignore syntax; repeatable)
    #[arg(long, value_name = "GLOB", action = ArgAction::Append)]
    pub exclude: Vec<String>,
    /// Keep paths matching GLOB even if an earlier --exclude matched them
    #[arg(long, value_name = "GLOB", action = ArgAction::Append)]
    pub include: Vec<String>,
    /// Read exclude patterns from FILE (gitignore syntax)
    #[arg(long, value_name = "FILE", action = ArgAction::Append)]
    pub exclude_from: Vec<PathBuf>,
    /// Compare file content by SHA-256 instead of size and mtime
    #[arg(short = 'c', long)]
    pub checksum: bool,
    /// Show what would change; write nothing
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    /// One line per change: + added, ~ changed, - deleted (with --json, in its changes field)
    #[arg(short = 'i', long)]
    pub itemize: bool,
    /// One JSON summary on stdout
    #[arg(long)]
    pub json: bool,
    /// No summary line, no progress, warnings only
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Show a progress bar (default: when stderr is a terminal)
    #[arg(long, overrides_with = "no_progress")]
    pub progress: bool,
    #[arg(long, overrides_with = "progress")]
    pub no_progress: bool,
    /// Earlier generations to keep besides the live one
    #[arg(long, default_value_t = config::DEFAULT_KEEP, value_name = "N")]
    pub keep: usize,
    /// Keep every generation retired less than DUR ago (e.g. 30s, 10m, 2h)
    #[arg(long, default_value = config::DEFAULT_GRACE, value_name = "DUR")]
    pub grace: String,
    /// Refuse (exit 3) to delete more than N entries
    #[arg(long, value_name = "N")]
    pub max_delete: Option<u64>,
    /// Allow an empty source to replace a non-empty tree
    #[arg(long)]
    pub allow_empty: bool,
    /// Set every owner to UID:GID
    #[arg(long, value_name = "UID:GID")]
    pub chown: Option<String>,
    /// Change modes, rsync syntax (e.g. D755,F644 or go-w)
    #[arg(long, value_name = "RULES")]
    pub chmod: Option<String>,
    /// Run CMD (with sh -c) after a new generation goes live
    #[arg(long, value_name = "CMD")]
    pub exec_after: Option<String>,
    /// A version label recorded with the generation (refuses downgrades)
    #[arg(long, value_name = "TEXT")]
    pub label: Option<String>,
    /// Publish even if --label orders below the live generation's label
    #[arg(long)]
    pub allow_downgrade: bool,
    /// How DEST is laid out
    #[arg(long, value_enum, default_value_t = LayoutArg::Symlink)]
    pub layout: LayoutArg,
    /// With --layout fanout: publish as this slot (several images, one DEST)
    #[arg(long, value_name = "NAME")]
    pub slot: Option<String>,
    /// With --layout fanout: take over entries packsync did not create
    #[arg(long)]
    pub adopt: bool,
    /// Skip flushing to disk (faster, not crash-safe)
    #[arg(long)]
    pub no_fsync: bool,
    /// Re-read the staged tree and compare with the source hashes before publishing
    #[arg(long)]
    pub verify: bool,
    /// Create DEST's parent directories
    #[arg(long)]
    pub mkpath: bool,
    /// Take over a directory at DEST even where that leaves DEST missing for an instant
    #[arg(long)]
    pub migrate: bool,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum LayoutArg {
    Symlink,
    Fanout,
    Dir,
}

/// Parse the process arguments into a `Config`. A command-line error is
/// returned for the caller to print and exit with; when `--json` is on the
/// command line, it is also printed here as a JSON object on stdout.
pub fn parse() -> Result<Config, clap::Error> {
    parse_from(std::env::args_os()).inspect_err(|e| {
        if e.use_stderr() && json_requested(std::env::args_os()) {
            report::json_error(&one_line(e), e.exit_code());
        }
    })
}

/// `--json` among the arguments packsync itself reads (not after `--`, where
/// `exec`'s command starts).
fn json_requested(args: impl IntoIterator<Item = std::ffi::OsString>) -> bool {
    args.into_iter()
        .skip(1)
        .take_while(|a| a != "--")
        .any(|a| a == "--json")
}

/// clap's message without its usage and help hints, on one line.
fn one_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .filter(|l| !l.is_empty() && !l.starts_with("tip:"))
        .collect();
    let joined = lines.join(" ");
    joined
        .strip_prefix("error: ")
        .unwrap_or(&joined)
        .to_string()
}

fn parse_from(argv: impl IntoIterator<Item = std::ffi::OsString>) -> Result<Config, clap::Error> {
    let matches = Args::command().try_get_matches_from(argv)?;
    let args = Args::from_arg_matches(&matches)?;
    // --exclude and --include interleave: their relative order decides.
    let order = matches.subcommand_matches("sync").map(|m| {
        let mut rules: Vec<(usize, String)> = Vec::new();
        for (id, neg) in [("exclude", false), ("include", true)] {
            if let (Some(idx), Some(vals)) = (m.indices_of(id), m.get_many::<String>(id)) {
                for (i, v) in idx.zip(vals) {
                    rules.push((i, if neg { format!("!{v}") } else { v.clone() }));
                }
            }
        }
        rules.sort();
        rules.into_iter().map(|(_, r)| r).collect::<Vec<_>>()
    });
    Ok(into_config(args, order.unwrap_or_default()))
}

fn into_config(args: Args, rules: Vec<String>) -> Config {
    let command = match args.command {
        Cmd::Sync(s) => {
            let s = *s;
            let mut paths = s.paths;
            let dest = paths.pop().expect("clap requires two paths");
            Command::Sync(Box::new(SyncConfig {
                sources: paths,
                dest,
                rules,
                exclude_from: s.exclude_from,
                checksum: s.checksum,
                dry_run: s.dry_run,
                itemize: s.itemize,
                json: s.json,
                quiet: s.quiet,
                progress: if s.progress {
                    Some(true)
                } else if s.no_progress {
                    Some(false)
                } else {
                    None
                },
                keep: s.keep,
                grace: s.grace,
                max_delete: s.max_delete,
                allow_empty: s.allow_empty,
                chown: s.chown,
                chmod: s.chmod,
                exec_after: s.exec_after,
                label: s.label,
                allow_downgrade: s.allow_downgrade,
                layout: match s.layout {
                    LayoutArg::Symlink => Layout::Symlink,
                    LayoutArg::Fanout => Layout::Fanout,
                    LayoutArg::Dir => Layout::Dir,
                },
                slot: s.slot,
                adopt: s.adopt,
                fsync: !s.no_fsync,
                verify: s.verify,
                mkpath: s.mkpath,
                migrate: s.migrate,
            }))
        }
        Cmd::Status { dest, json, slot } => Command::Status { dest, json, slot },
        Cmd::Verify { dest, json, slot } => Command::Verify { dest, json, slot },
        Cmd::Rollback { dest, to, slot } => Command::Rollback { dest, to, slot },
        Cmd::Gc { dest, keep, grace } => Command::Gc { dest, keep, grace },
        Cmd::Wait {
            dest,
            timeout,
            label,
            slot,
        } => Command::Wait {
            dest,
            timeout,
            label,
            slot,
        },
        Cmd::Exec { dest, cmd, slot } => Command::Exec { dest, cmd, slot },
        Cmd::Completions { shell } => Command::Completions { shell },
    };
    Config { command }
}

/// Write the completion script for `shell` to `out`.
pub fn completions(shell: clap_complete::Shell, out: &mut dyn std::io::Write) {
    clap_complete::generate(shell, &mut Args::command(), "packsync", out);
}

/// A usage error for a flag value that clap cannot check by itself.
pub fn bad_value(flag: &str, value: &str, why: impl std::fmt::Display) -> anyhow::Error {
    error::usage(format!("invalid value {value:?} for {flag}: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<std::ffi::OsString> {
        std::iter::once("packsync")
            .chain(args.iter().copied())
            .map(Into::into)
            .collect()
    }

    #[test]
    fn json_is_looked_for_before_the_command_of_exec() {
        assert!(json_requested(argv(&["sync", "--json", "--bogus"])));
        assert!(!json_requested(argv(&["sync", "--bogus"])));
        assert!(!json_requested(argv(&[
            "exec",
            "vol/packs",
            "--",
            "jq",
            "--json"
        ])));
    }

    #[test]
    fn a_parse_error_reads_as_one_line() {
        let Err(e) = parse_from(argv(&["sync", "--json", "--bogus", "src", "dst"])) else {
            panic!("--bogus parsed");
        };
        assert_eq!(one_line(&e), "unexpected argument '--bogus' found");
        let Err(e) = parse_from(argv(&["sync", "--json", "src"])) else {
            panic!("one path parsed");
        };
        let msg = one_line(&e);
        assert!(!msg.contains('\n') && msg.contains("PATH"), "{msg}");
    }
}
