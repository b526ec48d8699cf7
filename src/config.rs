//! Config: the command line, resolved and typed. Each field's doc names its
//! flag. The parsers for values clap cannot check by itself (durations,
//! owners) live here, are pure, and are what `cli` hands to clap as value
//! parsers: no stage ever parses a string from the command line.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::chmod;
use crate::filter::Filter;
use crate::label::Label;

/// `--keep`: the live generation plus this many earlier ones survive a sync.
pub const DEFAULT_KEEP: usize = 2;
/// `--grace`: a reader that resolved DEST up to this long ago still finds its tree.
pub const DEFAULT_GRACE: &str = "15m";
/// Staging of another host with no change for this long is a dead writer's.
pub const STALE_STAGE: Duration = Duration::from_secs(3600);
/// The shortest `--every`: a round of an unchanged small tree takes a few
/// milliseconds, and the soak benchmark runs at this period.
pub const MIN_EVERY: Duration = Duration::from_millis(10);
/// The longest duration a flag takes: far beyond any use, and far below
/// where adding it to a clock could overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 86400);

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
        /// `--keep`
        keep: usize,
        /// `--grace`
        grace: Duration,
    },
    Wait {
        dest: PathBuf,
        /// `--timeout`
        timeout: Option<Timeout>,
        /// `--label`
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

#[derive(Clone)]
pub struct SyncConfig {
    /// SOURCE...: mirrored in order, later ones win.
    pub sources: Vec<PathBuf>,
    /// DEST
    pub dest: PathBuf,
    /// `--exclude` / `--include` in command-line order, after the lines of
    /// every `--exclude-from` file.
    pub filter: Filter,
    /// `--checksum`
    pub checksum: bool,
    /// `--set-mtime EPOCH`: every published entry gets this mtime (seconds
    /// since the epoch), and files are compared by size and content.
    pub set_mtime: Option<i64>,
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
    pub grace: Duration,
    /// `--max-delete`
    pub max_delete: Option<u64>,
    /// `--allow-empty`
    pub allow_empty: bool,
    /// `--chown UID:GID`
    pub chown: Option<Owner>,
    /// `--chmod RULES`
    pub chmod: Option<chmod::Rules>,
    /// `--exec-after CMD`
    pub exec_after: Option<String>,
    /// `--label`, with `--allow-downgrade` folded in; for `--label auto`
    /// and `--semver`, what the round found (`app::resolve_label`).
    pub label: Option<Label>,
    /// `--label auto`: each round takes the label from the content.
    pub label_auto: bool,
    /// `--allow-downgrade`
    pub allow_downgrade: bool,
    /// `--layout`
    pub layout: Layout,
    /// `--slot` (a valid slot name; only with `--layout fanout`)
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
    /// `--every DUR`: keep running, a round every DUR (None: sync once).
    pub every: Option<Duration>,
    /// `--max-failures N`: with `--every`, exit 1 after N failed rounds in a row.
    pub max_failures: Option<u32>,
    /// `--unhealthy-after N`: with `--every`, `/healthz` answers 503 once N
    /// rounds in a row failed, until one succeeds.
    pub unhealthy_after: u32,
    /// `--http-bind ADDR:PORT`: with `--every`, serve health and metrics there.
    pub http_bind: Option<std::net::SocketAddr>,
    /// `--max-entries N`: the most entries an archive, bundle or image may
    /// hold (every header of every layer counts, whiteouts too).
    pub max_entries: u64,
    /// `--verify-key FILE` (repeatable): with any, every SOURCE must be
    /// signed by one of these keys (`trust`), else exit 6.
    pub verify_keys: Vec<crate::trust::key::Key>,
    /// How `https://`, `oci://` and `oci-layout:` sources are reached.
    pub remote: Remote,
}

impl SyncConfig {
    /// Whether every SOURCE must be signed: a `--verify-key`, or a keyless
    /// identity (`--trusted-root` with `--certificate-identity`).
    pub fn trusting(&self) -> bool {
        !self.verify_keys.is_empty()
            || self
                .remote
                .keyless
                .as_ref()
                .is_some_and(|k| k.who.is_some())
    }
}

/// `--max-entries`: far above any pack image or bundle (a 1.5 GB StackStorm
/// image holds about 10^5 entries), far below what a small compressed
/// archive of empty entries could otherwise make the spool hold.
pub const DEFAULT_MAX_ENTRIES: u64 = 2_000_000;

/// `--timeout`: connecting, headers and documents whole, and a body's stall window.
pub const DEFAULT_NET_TIMEOUT: &str = "30s";

/// `sync --unhealthy-after`: failed rounds in a row that make `/healthz` 503.
pub const DEFAULT_UNHEALTHY_AFTER: u32 = 3;

/// The flags of sources that are not on this host (`https://`, `oci://`,
/// `oci-layout:`): resolved once, read by `net` and the source kinds.
#[derive(Clone, Debug, Default)]
pub struct Remote {
    /// `--registry-auth FILE`: a Docker `config.json` or a mounted
    /// `.dockerconfigjson` (None: `$DOCKER_CONFIG/config.json`, then
    /// `~/.docker/config.json`).
    pub registry_auth: Option<PathBuf>,
    /// `--ca-file FILE`: PEM certificates trusted besides the system's and
    /// the compiled-in roots.
    pub ca_file: Option<PathBuf>,
    /// `--insecure-registry HOST[:PORT]` (repeatable): plain HTTP allowed there.
    pub insecure_registries: Vec<String>,
    /// `--header 'NAME: VALUE'` (URLs only).
    pub headers: Vec<(String, String)>,
    /// `--header-file FILE`: read again by each sync (each round of
    /// `--every`), its lines sent before the `--header`s.
    pub header_file: Option<PathBuf>,
    /// `--timeout DUR`: connecting, an answer's headers and a document
    /// whole, and the stall window of a body.
    pub timeout: Duration,
    /// `--round-timeout DUR`: the transfers of one sync end by then (None: no bound).
    pub round_timeout: Option<Duration>,
    /// `--platform OS/ARCH[/VARIANT]` (None: the running one).
    pub platform: Option<Platform>,
    /// `--verify-key`: images check their cosign signature with these as
    /// soon as their digest is resolved.
    pub verify_keys: Vec<crate::trust::key::Key>,
    /// `--trusted-root FILE` with `--certificate-identity` and
    /// `--certificate-oidc-issuer`: images' keyless bundles are verified
    /// against it, and keyed bundles' log entries too.
    pub keyless: Option<crate::trust::keyless::Keyless>,
    /// `--semver RANGE` with `--tag-filter REGEX`: the tag an `oci://` or
    /// `oci-layout:` SOURCE without a tag publishes.
    pub choose: Option<Choose>,
    /// `--layer-media-type TYPE` (repeatable): an image publishes only its
    /// layers of these media types (empty: every layer it can).
    pub layer_media_types: Vec<String>,
}

/// `--semver RANGE` and `--tag-filter REGEX`, parsed.
#[derive(Clone, Debug)]
pub struct Choose {
    pub range: crate::semver::Range,
    pub filter: Option<regex::bytes::Regex>,
}

/// An image platform: `linux/amd64`, `linux/arm64/v8`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Platform {
    pub os: String,
    pub arch: String,
    pub variant: Option<String>,
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.arch)?;
        match &self.variant {
            Some(v) => write!(f, "/{v}"),
            None => Ok(()),
        }
    }
}

/// `--platform OS/ARCH[/VARIANT]`: lowercase words, as image indexes write them.
pub fn parse_platform(s: &str) -> Result<Platform> {
    let parts: Vec<&str> = s.split('/').collect();
    let word = |w: &str| {
        !w.is_empty()
            && w.len() <= 32
            && w.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'.')
    };
    if !(2..=3).contains(&parts.len()) || !parts.iter().all(|p| word(p)) {
        bail!("expected OS/ARCH[/VARIANT], such as linux/amd64 or linux/arm64/v8");
    }
    Ok(Platform {
        os: parts[0].to_string(),
        arch: parts[1].to_string(),
        variant: parts.get(2).map(|v| v.to_string()),
    })
}

/// `--header 'NAME: VALUE'`: a token name and a value without control
/// characters (a header must not smuggle a second one in).
pub fn parse_header(s: &str) -> Result<(String, String)> {
    let (name, value) = s.split_once(':').ok_or_else(|| {
        anyhow::anyhow!("expected NAME: VALUE, such as 'Authorization: Bearer TOKEN'")
    })?;
    let name = name.trim();
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    // Neither part is quoted back: a misplaced colon would show a token.
    if name.is_empty() || !name.bytes().all(token) {
        bail!("the part before the first ':' is not a header name");
    }
    let value = value.trim();
    if value.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
        bail!("the value of {name} holds a control character");
    }
    Ok((name.to_string(), value.to_string()))
}

/// The most a `--header-file` may hold.
pub const MAX_HEADER_FILE: u64 = 1 << 20;

/// The lines of a `--header-file`: `NAME: VALUE` each, blank lines and
/// `#` comments skipped. The error names the line (1-based).
pub fn parse_header_lines(text: &str) -> Result<Vec<(String, String)>> {
    let mut headers = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.starts_with('#'))
    {
        headers.push(
            parse_header(line).with_context(|| format!("bad line {} in --header-file", n + 1))?,
        );
    }
    Ok(headers)
}

/// `--insecure-registry HOST[:PORT]`: a host name or address, no scheme or path.
pub fn parse_registry_host(s: &str) -> Result<String> {
    let ok = !s.is_empty()
        && s.len() <= 255
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.:[]_".contains(&b));
    if !ok {
        bail!("expected HOST or HOST:PORT, such as registry.example:5000");
    }
    Ok(s.to_ascii_lowercase())
}

/// `--layer-media-type TYPE`: a media type as RFC 6838 restricts its
/// names (`type/subtype`, each 1 to 127 of letters, digits and
/// `!#$&-^_.+`), without parameters; compared exactly, lowercased.
pub fn parse_media_type(s: &str) -> Result<String> {
    let name = |p: &str| {
        !p.is_empty()
            && p.len() <= 127
            && p.as_bytes()[0].is_ascii_alphanumeric()
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
    };
    match s.split_once('/') {
        Some((t, sub)) if name(t) && name(sub) => Ok(s.to_ascii_lowercase()),
        _ => bail!("expected a media type TYPE/SUBTYPE, such as application/vnd.oci.image.layer.v1.tar+gzip"),
    }
}

impl SyncConfig {
    /// The `--label` text, if any.
    pub fn label_text(&self) -> Option<&str> {
        self.label.as_ref().map(|l| l.text.as_str())
    }
}

/// `--chown UID:GID`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// `wait --timeout DUR`: how long, and the text it was given as (the
/// timeout message quotes it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timeout {
    pub limit: Duration,
    pub text: String,
}

/// `30s`, `10m`, `2h`, `1d`, `500ms`, decimals such as `1.5h`, plain
/// seconds (`0`, `90`, `2.5`), or parts together (`1h30m`), as `humantime`
/// reads them (`15min` and `1week` too); no spaces inside (`15 minutes` is
/// refused, as it always was), at most `MAX_DURATION`.
pub fn parse_duration(s: &str) -> Result<Duration> {
    const EXPECTED: &str = "expected a number with a unit such as 30s, 10m, 2h";
    let s = s.trim();
    if s.is_empty() || s.contains(char::is_whitespace) {
        bail!(EXPECTED);
    }
    if s.starts_with('-') {
        bail!("negative durations are not allowed");
    }
    let plain_seconds = s.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    let parsed = if plain_seconds {
        humantime::parse_duration(&format!("{s}s"))
    } else {
        humantime::parse_duration(s)
    };
    let d = match parsed {
        Ok(d) => d,
        Err(humantime::DurationError::UnknownUnit { unit, .. }) => {
            bail!("unknown unit {unit:?} (use ms, s, m, h or d)")
        }
        Err(humantime::DurationError::NumberOverflow) => too_long()?,
        Err(_) => bail!(EXPECTED),
    };
    if d > MAX_DURATION {
        too_long()?;
    }
    Ok(d)
}

fn too_long() -> Result<Duration> {
    bail!("too long (at most 100 years, 36500d)")
}

/// `UID:GID` (numbers).
pub fn parse_owner(s: &str) -> Result<Owner> {
    let (u, g) = s
        .split_once(':')
        .ok_or_else(|| anyhow::anyhow!("expected UID:GID, such as 1000:1000"))?;
    let num = |x: &str| {
        x.parse::<u32>()
            .map_err(|_| anyhow::anyhow!("expected numeric UID:GID, such as 1000:1000"))
    };
    Ok(Owner {
        uid: num(u)?,
        gid: num(g)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("2h").unwrap(), Duration::from_secs(7200));
        assert_eq!(parse_duration("1d").unwrap(), Duration::from_secs(86400));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration(" 15m ").unwrap(), Duration::from_secs(900));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("15min").unwrap(), Duration::from_secs(900));
        for bad in ["", " ", "m", "10x", "-1s", "1.2.3s", "15 minutes", "1h 30m"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn decimal_durations_as_before() {
        assert_eq!(parse_duration("1.5h").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("0.5s").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2.5").unwrap(), Duration::from_millis(2500));
        assert_eq!(parse_duration("0.25m").unwrap(), Duration::from_secs(15));
    }

    #[test]
    fn durations_too_long_for_a_clock_are_refused_not_a_panic() {
        assert_eq!(parse_duration("36500d").unwrap(), MAX_DURATION);
        for bad in [
            "36501d",
            "99999999999999999999d",
            "99999999999999999999",
            "18446744073709551615s",
            "18446744073709551616s",
            "213503982334601d",
            "9999999999999999999y",
        ] {
            let e = parse_duration(bad).unwrap_err().to_string();
            assert!(e.contains("too long"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_wrong_unit_is_named() {
        let e = parse_duration("10x").unwrap_err().to_string();
        assert!(e.contains("unknown unit \"x\""), "{e}");
    }

    #[test]
    fn platforms_and_headers() {
        let p = parse_platform("linux/arm64/v8").unwrap();
        assert_eq!((p.os.as_str(), p.arch.as_str()), ("linux", "arm64"));
        assert_eq!(p.variant.as_deref(), Some("v8"));
        assert_eq!(p.to_string(), "linux/arm64/v8");
        assert_eq!(parse_platform("linux/amd64").unwrap().variant, None);
        for bad in [
            "linux",
            "linux/",
            "/amd64",
            "a/b/c/d",
            "Linux/AMD64",
            "linux/amd 64",
        ] {
            assert!(parse_platform(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse_header("Authorization: Bearer x y").unwrap(),
            ("Authorization".into(), "Bearer x y".into())
        );
        for bad in ["NoColon", ": v", "Bad Name: v", "X: a\r\nInjected: b"] {
            assert!(parse_header(bad).is_err(), "{bad:?}");
        }
        // A token is never quoted back, whichever part holds it.
        for bad in [
            "Authorization Bearer s3cret: x",
            "Authorization: Bearer s3cret\u{1}",
        ] {
            let e = parse_header(bad).unwrap_err().to_string();
            assert!(!e.contains("s3cret"), "{e}");
        }
        assert_eq!(
            parse_registry_host("Reg.example:5000").unwrap(),
            "reg.example:5000"
        );
        assert!(parse_registry_host("http://reg.example").is_err());
    }

    #[test]
    fn owners() {
        assert_eq!(
            parse_owner("1000:2000").unwrap(),
            Owner {
                uid: 1000,
                gid: 2000
            }
        );
        assert_eq!(parse_owner("0:0").unwrap(), Owner { uid: 0, gid: 0 });
        for bad in [
            "root:root",
            "1000",
            "",
            ":",
            "1:",
            "-1:0",
            "4294967296:0",
            "1:2:3",
        ] {
            assert!(parse_owner(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_owner("4294967295:0").unwrap().uid, u32::MAX);
    }
}
