//! Config: the command line, resolved. Each field's doc names its flag.
//! Parsing helpers for values clap cannot check (durations, owners) live here
//! and are pure.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};

/// `--keep`: the live generation plus this many earlier ones survive a sync.
pub const DEFAULT_KEEP: usize = 2;
/// `--grace`: a reader that resolved DEST up to this long ago still finds its tree.
pub const DEFAULT_GRACE: &str = "15m";
/// Staging of another host with no change for this long is a dead writer's.
pub const STALE_STAGE: Duration = Duration::from_secs(3600);

pub struct Config {
    pub command: Command,
}

impl Config {
    /// `--json` (sync, status, verify): the result, or the error, is one
    /// JSON object on stdout.
    pub fn json(&self) -> bool {
        match &self.command {
            Command::Sync(s) => s.json,
            Command::Status { json, .. } | Command::Verify { json, .. } => *json,
            _ => false,
        }
    }
}

/// `slot` in the commands below is `--slot`: with `--layout fanout`, which
/// slot's tree (none: every tree DEST publishes, or the only one).
pub enum Command {
    Sync(Box<SyncConfig>),
    Status {
        dest: PathBuf,
        json: bool,
        slot: Option<String>,
    },
    Verify {
        dest: PathBuf,
        json: bool,
        slot: Option<String>,
    },
    Rollback {
        dest: PathBuf,
        to: Option<String>,
        slot: Option<String>,
    },
    Gc {
        dest: PathBuf,
        keep: usize,
        grace: String,
    },
    Wait {
        dest: PathBuf,
        timeout: Option<String>,
        label: Option<String>,
        slot: Option<String>,
    },
    Exec {
        dest: PathBuf,
        cmd: Vec<String>,
        slot: Option<String>,
    },
    Completions {
        shell: clap_complete::Shell,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Symlink,
    Fanout,
    Dir,
}

pub struct SyncConfig {
    /// SOURCE...: mirrored in order, later ones win.
    pub sources: Vec<PathBuf>,
    /// DEST
    pub dest: PathBuf,
    /// `--exclude` / `--include` as gitignore lines in command-line order (`!` = include).
    pub rules: Vec<String>,
    /// `--exclude-from`
    pub exclude_from: Vec<PathBuf>,
    /// `--checksum`
    pub checksum: bool,
    /// `--dry-run`
    pub dry_run: bool,
    /// `--itemize`
    pub itemize: bool,
    /// `--json`
    pub json: bool,
    /// `--quiet`
    pub quiet: bool,
    /// `--progress` / `--no-progress` (None: when stderr is a terminal)
    pub progress: Option<bool>,
    /// `--keep`
    pub keep: usize,
    /// `--grace`
    pub grace: String,
    /// `--max-delete`
    pub max_delete: Option<u64>,
    /// `--allow-empty`
    pub allow_empty: bool,
    /// `--chown UID:GID`
    pub chown: Option<String>,
    /// `--chmod RULES`
    pub chmod: Option<String>,
    /// `--exec-after CMD`
    pub exec_after: Option<String>,
    /// `--label`
    pub label: Option<String>,
    /// `--allow-downgrade`
    pub allow_downgrade: bool,
    /// `--layout`
    pub layout: Layout,
    /// `--slot`
    pub slot: Option<String>,
    /// `--adopt`
    pub adopt: bool,
    /// not `--no-fsync`
    pub fsync: bool,
    /// `--verify`
    pub verify: bool,
    /// `--mkpath`
    pub mkpath: bool,
    /// `--migrate`
    pub migrate: bool,
}

/// `30s`, `10m`, `2h`, `1d`, `500ms`, or plain seconds (`0`, `90`).
pub fn parse_duration(s: &str) -> Result<Duration> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        bail!("expected a number with a unit such as 30s, 10m, 2h");
    }
    let n: f64 = num
        .parse()
        .map_err(|_| anyhow::anyhow!("expected a number with a unit such as 30s, 10m, 2h"))?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86400.0,
        _ => bail!("unknown unit {unit:?} (use ms, s, m, h or d)"),
    };
    // Past this no deadline or timestamp can hold it (and from_secs_f64 panics).
    const MAX_SECS: f64 = 1e15;
    if secs > MAX_SECS {
        bail!("out of range (at most {MAX_SECS:.0}s)");
    }
    Ok(Duration::from_secs_f64(secs))
}

/// `UID:GID` (numbers).
pub fn parse_owner(s: &str) -> Result<(u32, u32)> {
    let (u, g) = s
        .split_once(':')
        .ok_or_else(|| anyhow::anyhow!("expected UID:GID, such as 1000:1000"))?;
    let num = |x: &str| {
        x.parse::<u32>()
            .map_err(|_| anyhow::anyhow!("expected numeric UID:GID, such as 1000:1000"))
    };
    Ok((num(u)?, num(g)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        for bad in ["", "m", "10x", "-1s", "1.2.3s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn owners() {
        assert_eq!(parse_owner("1000:2000").unwrap(), (1000, 2000));
        assert!(parse_owner("root:root").is_err());
        assert!(parse_owner("1000").is_err());
    }
}
