//! The command line: clap definitions, and their conversion into `Config`
//! once, as fd and ripgrep do. The only file that imports clap (besides
//! completions generation). Every value arrives typed through a value parser
//! (durations, owners, chmod rules, labels, slot names, globs); what depends
//! on several flags (`--label` with `--allow-downgrade`, `--slot` with
//! `--layout`, the rules of `--exclude-from` files) is resolved in
//! `into_config`. A bad value is a usage error (exit 2) on one line.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::builder::{BoolishValueParser, TypedValueParser};
use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::parser::ValueSource;
use clap::{ArgAction, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

use crate::chmod;
use crate::config::{self, Command, Config, Layout, Owner, SyncConfig, Timeout};
use crate::error;
use crate::filter::Filter;
use crate::label::Label;
use crate::report;
use crate::sys;

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
    #[command(long_about = SYNC_LONG_ABOUT)]
    Sync(Box<SyncArgs>),
    /// Show what is live and what is retained
    Status {
        /// The DEST a sync publishes to
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
        /// The DEST a sync publishes to
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
        /// The DEST a sync publishes to
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
        /// The DEST a sync publishes to
        dest: PathBuf,
        /// Earlier generations to keep besides the live one
        #[arg(long, default_value_t = config::DEFAULT_KEEP, value_name = "N")]
        keep: usize,
        /// Keep every generation retired less than DUR ago (e.g. 30s, 10m, 2h)
        #[arg(long, default_value = config::DEFAULT_GRACE, value_name = "DUR", allow_hyphen_values = true, value_parser = parse_duration)]
        grace: Duration,
    },
    /// Block until DEST holds a live generation (exit 5 on timeout)
    Wait {
        /// The DEST a sync publishes to
        dest: PathBuf,
        /// Give up after this long (e.g. 30s, 5m; default: wait forever)
        #[arg(long, value_name = "DUR", value_parser = parse_timeout)]
        timeout: Option<Timeout>,
        /// Wait for a live generation with exactly this label
        #[arg(long, value_name = "TEXT")]
        label: Option<String>,
        /// With --layout fanout: wait for this slot only
        #[arg(long, value_name = "NAME")]
        slot: Option<String>,
    },
    /// Run CMD with PACKSYNC_ROOT set to the live generation, leased while it runs
    Exec {
        /// The DEST a sync publishes to
        dest: PathBuf,
        /// With --layout fanout: the slot whose generation CMD runs on
        #[arg(long, value_name = "NAME")]
        slot: Option<String>,
        /// The command and its arguments, after --
        #[arg(required = true, last = true, value_name = "CMD")]
        cmd: Vec<String>,
    },
    /// Print a shell completion script
    Completions {
        /// The shell to write the script for
        shell: clap_complete::Shell,
    },
}

/// `sync`'s help: what a SOURCE may be, and where flags may come from.
const SYNC_LONG_ABOUT: &str = "\
Mirror SOURCE(s) into DEST: the tree readers see at DEST changes in one atomic swap, \
with delete semantics (later SOURCEs win paths that several provide).

A SOURCE is one of:
  DIR                           a directory's contents
  FILE                          a .tar, .tar.gz (.tgz) or .tar.zst archive (recognised by content)
  https://URL, http://URL       an archive fetched from a URL (an OPA bundle server)
  oci://HOST[:PORT]/REPO[:TAG][@sha256:...]
                                an image's root filesystem, from a registry
  oci-layout:DIR[:TAG]          the same, from an OCI image layout on disk
  oci-archive:FILE[:TAG]        the same, from an OCI layout in a tar file
  docker-archive:FILE[:REF]     the same, from what docker save writes

Any SOURCE but a directory may end in //PATH to take one subtree of it, \
e.g. oci://registry.example/packs:1.4//opt/packs.

Every flag may also be set in the environment: PACKSYNC_ and the flag's name in \
capitals, - as _ (PACKSYNC_EVERY=30s, PACKSYNC_NO_FSYNC=true); a flag on the \
command line wins. A switch takes true/false (also 1/0, yes/no, on/off). A \
repeatable flag takes one value a line (blank lines are skipped); \
PACKSYNC_EXCLUDE_FROM names one FILE.";

const SOURCES: &str = "Sources and network";
const FILTERS: &str = "Filters and metadata";
const SAFETY: &str = "Safety";
const LAYOUT: &str = "Layout";
const SIDECAR: &str = "Sidecar";
const OUTPUT: &str = "Output";

#[derive(clap::Args, Debug)]
pub struct SyncArgs {
    /// What to mirror: a directory, an archive, an http(s):// URL or an image (oci://, oci-layout:, oci-archive:, docker-archive:), optionally ending in //PATH
    #[arg(required = true, value_name = "SOURCE")]
    pub sources: Vec<PathBuf>,
    /// The path readers use; packsync's state lives beside it, in .NAME.packsync
    #[arg(required = true, value_name = "DEST")]
    pub dest: PathBuf,

    // ---- Sources and network ----
    /// Registry credentials: a Docker config.json (its credHelpers and credsStore run docker-credential-NAME) or a mounted .dockerconfigjson (default: $DOCKER_CONFIG/config.json, then ~/.docker/config.json); read again by each sync
    #[arg(long, value_name = "FILE", env = "PACKSYNC_REGISTRY_AUTH", help_heading = SOURCES)]
    pub registry_auth: Option<PathBuf>,
    /// Trust the PEM certificates in FILE too (besides the system's and the compiled-in roots)
    #[arg(long, value_name = "FILE", env = "PACKSYNC_CA_FILE", help_heading = SOURCES)]
    pub ca_file: Option<PathBuf>,
    /// Allow plain HTTP to this registry (repeatable; loopback addresses need no flag)
    #[arg(long, value_name = "HOST[:PORT]", action = ArgAction::Append, value_delimiter = '\n', value_parser = EnvLines(config::parse_registry_host), env = "PACKSYNC_INSECURE_REGISTRY", help_heading = SOURCES)]
    pub insecure_registry: Vec<Option<String>>,
    /// Send this header with https:// and http:// sources (repeatable), e.g. 'Authorization: Bearer TOKEN'
    #[arg(long, value_name = "NAME: VALUE", action = ArgAction::Append, value_delimiter = '\n', value_parser = EnvLines(config::parse_header), env = "PACKSYNC_HEADER", help_heading = SOURCES)]
    pub header: Vec<Option<(String, String)>>,
    /// Read headers for https:// and http:// sources from FILE, one 'NAME: VALUE' a line (read again by each sync)
    #[arg(long, value_name = "FILE", env = "PACKSYNC_HEADER_FILE", help_heading = SOURCES)]
    pub header_file: Option<PathBuf>,
    /// Give up on a connection, on headers or a manifest not whole, or on a download with less than 1 KiB, after DUR
    #[arg(long, value_name = "DUR", default_value = config::DEFAULT_NET_TIMEOUT, value_parser = parse_duration, env = "PACKSYNC_TIMEOUT", help_heading = SOURCES)]
    pub timeout: Duration,
    /// End the downloads of a sync (each round with --every) after DUR (default: no bound)
    #[arg(long, value_name = "DUR", value_parser = parse_duration, env = "PACKSYNC_ROUND_TIMEOUT", help_heading = SOURCES)]
    pub round_timeout: Option<Duration>,
    /// For oci:// and oci-layout: SOURCEs without a tag: publish the highest tag that is a semantic version in RANGE (Flux's syntax: '>=1.4.0 <2.0.0', '~1.4', '^1.2', '1.x', '||'); the sidecar follows new releases
    #[arg(long, value_name = "RANGE", value_parser = parse_semver, env = "PACKSYNC_SEMVER", help_heading = SOURCES)]
    pub semver: Option<crate::semver::Range>,
    /// With --semver: consider only the tags REGEX matches (anywhere in the tag unless anchored)
    #[arg(long, value_name = "REGEX", value_parser = parse_tag_filter, env = "PACKSYNC_TAG_FILTER", help_heading = SOURCES)]
    pub tag_filter: Option<regex::bytes::Regex>,
    /// The image of an index to take: OS/ARCH[/VARIANT] (default: the running platform)
    #[arg(long, value_name = "OS/ARCH[/VARIANT]", value_parser = config::parse_platform, env = "PACKSYNC_PLATFORM", help_heading = SOURCES)]
    pub platform: Option<config::Platform>,
    /// Publish only sources signed by this PEM public key (repeatable; ECDSA P-256/P-384, Ed25519, RSA >= 2048): an OPA bundle's /.signatures.json; else exit 6
    #[arg(long, value_name = "FILE", action = ArgAction::Append, value_delimiter = '\n', value_parser = EnvLines(parse_key_path), env = "PACKSYNC_VERIFY_KEY", help_heading = SOURCES)]
    pub verify_key: Vec<Option<PathBuf>>,
    /// For image SOURCEs: verify Sigstore bundles offline against this trusted_root.json: keyless certificates (with --certificate-identity and --certificate-oidc-issuer) and every bundle's transparency log entry; else exit 6
    #[arg(long, value_name = "FILE", value_parser = parse_key_path, env = "PACKSYNC_TRUSTED_ROOT", help_heading = SOURCES)]
    pub trusted_root: Option<PathBuf>,
    /// With --trusted-root: the identity (SAN email or URI) a keyless certificate must name, exactly
    #[arg(long, value_name = "ID", value_parser = parse_nonempty, env = "PACKSYNC_CERTIFICATE_IDENTITY", help_heading = SOURCES)]
    pub certificate_identity: Option<String>,
    /// With --trusted-root: the OIDC issuer a keyless certificate must name, exactly (e.g. https://token.actions.githubusercontent.com)
    #[arg(long, value_name = "URL", value_parser = parse_nonempty, env = "PACKSYNC_CERTIFICATE_OIDC_ISSUER", help_heading = SOURCES)]
    pub certificate_oidc_issuer: Option<String>,
    /// For image SOURCEs: publish only the layers of this media type (repeatable; Flux's layerSelector), e.g. an OPA bundle's application/vnd.oci.image.layer.v1.tar+gzip
    #[arg(long, value_name = "TYPE", action = ArgAction::Append, value_delimiter = '\n', value_parser = EnvLines(config::parse_media_type), env = "PACKSYNC_LAYER_MEDIA_TYPE", help_heading = SOURCES)]
    pub layer_media_type: Vec<Option<String>>,

    // ---- Filters and metadata ----
    /// Leave out paths matching GLOB (gitignore syntax; repeatable)
    #[arg(long, value_name = "GLOB", action = ArgAction::Append, value_delimiter = '\n', value_parser = EnvLines(parse_glob), env = "PACKSYNC_EXCLUDE", help_heading = FILTERS)]
    pub exclude: Vec<Option<String>>,
    /// Keep paths matching GLOB even if an earlier --exclude matched them (repeatable)
    #[arg(long, value_name = "GLOB", action = ArgAction::Append, value_delimiter = '\n', value_parser = EnvLines(parse_glob), env = "PACKSYNC_INCLUDE", help_heading = FILTERS)]
    pub include: Vec<Option<String>>,
    /// Read exclude patterns from FILE (gitignore syntax; repeatable)
    #[arg(long, value_name = "FILE", action = ArgAction::Append, env = "PACKSYNC_EXCLUDE_FROM", help_heading = FILTERS)]
    pub exclude_from: Vec<PathBuf>,
    /// Compare file content by SHA-256 instead of size and mtime
    #[arg(short = 'c', long, value_parser = BoolishValueParser::new(), env = "PACKSYNC_CHECKSUM", help_heading = FILTERS)]
    pub checksum: bool,
    /// Mirror a directory source's extended attributes (user.*, security.*, trusted.*; not ACLs), as rsync -X; archives and images always carry theirs
    #[arg(short = 'X', long, value_parser = BoolishValueParser::new(), env = "PACKSYNC_XATTRS", help_heading = FILTERS)]
    pub xattrs: bool,
    /// Give every published entry this mtime, seconds since the epoch (e.g. "$SOURCE_DATE_EPOCH"), and compare files by size and content: writers whose sources differ only in mtimes publish one generation
    #[arg(long, value_name = "EPOCH", env = "PACKSYNC_SET_MTIME", allow_negative_numbers = true, value_parser = parse_epoch, help_heading = FILTERS)]
    pub set_mtime: Option<i64>,
    /// Set every owner to UID:GID
    #[arg(long, value_name = "UID:GID", value_parser = config::parse_owner, env = "PACKSYNC_CHOWN", help_heading = FILTERS)]
    pub chown: Option<Owner>,
    /// Change modes, rsync syntax (e.g. D755,F644 or go-w)
    #[arg(long, value_name = "RULES", value_parser = chmod::parse, env = "PACKSYNC_CHMOD", help_heading = FILTERS)]
    pub chmod: Option<chmod::Rules>,
    /// A version label recorded with the generation (refuses downgrades); 'auto': the content's version (an image's org.opencontainers.image.version, a bundle's .manifest revision)
    #[arg(long, value_name = "TEXT", value_parser = parse_label, env = "PACKSYNC_LABEL", help_heading = FILTERS)]
    pub label: Option<Label>,

    // ---- Safety ----
    /// Show what would change; write nothing
    #[arg(short = 'n', long, value_parser = BoolishValueParser::new(), env = "PACKSYNC_DRY_RUN", help_heading = SAFETY)]
    pub dry_run: bool,
    /// Refuse (exit 3) to delete more than N entries
    #[arg(long, value_name = "N", env = "PACKSYNC_MAX_DELETE", help_heading = SAFETY)]
    pub max_delete: Option<u64>,
    /// Allow an empty source to replace a non-empty tree
    #[arg(long, value_parser = BoolishValueParser::new(), env = "PACKSYNC_ALLOW_EMPTY", help_heading = SAFETY)]
    pub allow_empty: bool,
    /// Publish even if --label orders below the live generation's label
    #[arg(long, value_parser = BoolishValueParser::new(), env = "PACKSYNC_ALLOW_DOWNGRADE", help_heading = SAFETY)]
    pub allow_downgrade: bool,
    /// Refuse (exit 1) an archive, bundle or image that holds more than N entries
    #[arg(long, value_name = "N", default_value_t = config::DEFAULT_MAX_ENTRIES, value_parser = clap::value_parser!(u64).range(1..), env = "PACKSYNC_MAX_ENTRIES", help_heading = SAFETY)]
    pub max_entries: u64,
    /// Re-read the staged tree and compare with the source hashes before publishing
    #[arg(long, value_parser = BoolishValueParser::new(), env = "PACKSYNC_VERIFY", help_heading = SAFETY)]
    pub verify: bool,
    /// Flush nothing to disk, on any filesystem: no fsync or syncfs of the staged files and directories, the manifest, gen/, meta/ or the published link (faster; a crash or power loss may leave the live generation empty or missing on disk)
    #[arg(long, value_parser = BoolishValueParser::new(), env = "PACKSYNC_NO_FSYNC", help_heading = SAFETY)]
    pub no_fsync: bool,

    // ---- Layout ----
    /// How DEST is laid out
    #[arg(long, value_enum, default_value_t = LayoutArg::Symlink, env = "PACKSYNC_LAYOUT", help_heading = LAYOUT)]
    pub layout: LayoutArg,
    /// With --layout fanout: publish as this slot (several images, one DEST)
    #[arg(long, value_name = "NAME", value_parser = parse_slot, env = "PACKSYNC_SLOT", help_heading = LAYOUT)]
    pub slot: Option<String>,
    /// With --layout fanout: take over entries packsync did not create
    #[arg(long, value_parser = BoolishValueParser::new(), env = "PACKSYNC_ADOPT", help_heading = LAYOUT)]
    pub adopt: bool,
    /// Earlier generations to keep besides the live one
    #[arg(long, default_value_t = config::DEFAULT_KEEP, value_name = "N", env = "PACKSYNC_KEEP", help_heading = LAYOUT)]
    pub keep: usize,
    /// Keep every generation retired less than DUR ago (e.g. 30s, 10m, 2h)
    #[arg(long, default_value = config::DEFAULT_GRACE, value_name = "DUR", allow_hyphen_values = true, value_parser = parse_duration, env = "PACKSYNC_GRACE", help_heading = LAYOUT)]
    pub grace: Duration,
    /// Create DEST's parent directories
    #[arg(long, value_parser = BoolishValueParser::new(), env = "PACKSYNC_MKPATH", help_heading = LAYOUT)]
    pub mkpath: bool,
    /// Take over a directory at DEST even where that leaves DEST missing for an instant
    #[arg(long, value_parser = BoolishValueParser::new(), env = "PACKSYNC_MIGRATE", help_heading = LAYOUT)]
    pub migrate: bool,
    /// Run CMD (with sh -c) after a new generation goes live
    #[arg(long, value_name = "CMD", env = "PACKSYNC_EXEC_AFTER", help_heading = LAYOUT)]
    pub exec_after: Option<String>,

    // ---- Sidecar ----
    /// Keep running: sync again every DUR (and at once on SIGHUP), publishing only what changed
    #[arg(long, value_name = "DUR", value_parser = parse_every, env = "PACKSYNC_EVERY", help_heading = SIDECAR)]
    pub every: Option<Duration>,
    /// With --every: exit 1 after N failed rounds in a row (default: keep trying)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..), env = "PACKSYNC_MAX_FAILURES", help_heading = SIDECAR)]
    pub max_failures: Option<u32>,
    /// With --every: /healthz answers 503 after N failed rounds in a row, until one succeeds (default: 3)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..), env = "PACKSYNC_UNHEALTHY_AFTER", help_heading = SIDECAR)]
    pub unhealthy_after: Option<u32>,
    /// With --every: serve /healthz, /readyz and /metrics on ADDR:PORT
    #[arg(long, value_name = "ADDR:PORT", env = "PACKSYNC_HTTP_BIND", help_heading = SIDECAR)]
    pub http_bind: Option<std::net::SocketAddr>,

    // ---- Output ----
    /// One line per change: + added, ~ changed, - deleted (with --json, in its changes field)
    #[arg(short = 'i', long, value_parser = BoolishValueParser::new(), env = "PACKSYNC_ITEMIZE", help_heading = OUTPUT)]
    pub itemize: bool,
    /// One JSON summary on stdout
    #[arg(long, value_parser = BoolishValueParser::new(), env = "PACKSYNC_JSON", help_heading = OUTPUT)]
    pub json: bool,
    /// No summary line, no progress, warnings only
    #[arg(short = 'q', long, value_parser = BoolishValueParser::new(), env = "PACKSYNC_QUIET", help_heading = OUTPUT)]
    pub quiet: bool,
    /// Show a progress bar (default: when stderr is a terminal; in a log, a line every 10s of long work instead, which --no-progress turns off)
    #[arg(long, overrides_with = "no_progress", value_parser = BoolishValueParser::new(), env = "PACKSYNC_PROGRESS", help_heading = OUTPUT)]
    pub progress: bool,
    /// Show no progress bar, not even on a terminal
    #[arg(long, overrides_with = "progress", value_parser = BoolishValueParser::new(), env = "PACKSYNC_NO_PROGRESS", help_heading = OUTPUT)]
    pub no_progress: bool,
}

/// A repeatable flag's value parser, `P`, that takes a blank value coming
/// from the environment (its one-value-a-line form, a trailing newline
/// included) as no value at all. On the command line a blank value is
/// still `P`'s to refuse.
#[derive(Clone)]
struct EnvLines<P>(P);

impl<P: TypedValueParser> TypedValueParser for EnvLines<P> {
    type Value = Option<P::Value>;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<Self::Value, clap::Error> {
        self.0.parse_ref(cmd, arg, value).map(Some)
    }

    fn parse_ref_(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
        source: ValueSource,
    ) -> Result<Self::Value, clap::Error> {
        if source == ValueSource::EnvVariable && value.to_string_lossy().trim().is_empty() {
            return Ok(None);
        }
        self.0.parse_ref_(cmd, arg, value, source).map(Some)
    }
}

#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum LayoutArg {
    Symlink,
    Fanout,
    Dir,
}

/// Parse the process arguments into a `Config`. A command-line error is
/// shown here (one line on stderr for a bad value, with `--json` also a
/// JSON object on stdout) and its exit status returned.
pub fn parse() -> Result<Config, i32> {
    let json = json_requested(std::env::args_os());
    parse_from(std::env::args_os()).map_err(|e| match e {
        Invalid::Value(err) => report::error(&err, json),
        Invalid::Clap(e) => {
            if e.use_stderr() && json {
                report::json_error(&one_line(&e), e.exit_code());
            }
            let _ = e.print();
            e.exit_code()
        }
    })
}

/// Why the command line does not parse.
#[derive(Debug)]
enum Invalid {
    /// A flag's value was refused (exit 2, one line as every usage error).
    Value(anyhow::Error),
    /// Anything else clap found (unknown flag, missing argument), or
    /// `--help` / `--version`, shown as clap shows them.
    Clap(clap::Error),
}

impl From<clap::Error> for Invalid {
    fn from(e: clap::Error) -> Invalid {
        Invalid::of(e, &[])
    }
}

impl Invalid {
    /// clap's error for the command line `argv`.
    fn of(e: clap::Error, argv: &[std::ffi::OsString]) -> Invalid {
        match refused_value(&e, argv) {
            Some(err) => Invalid::Value(err),
            None => Invalid::Clap(e),
        }
    }
}

/// A value a value parser refused, as the usage error `bad_value` makes;
/// one that came from the environment (its flag is not in `argv`) names
/// the variable too.
fn refused_value(e: &clap::Error, argv: &[std::ffi::OsString]) -> Option<anyhow::Error> {
    if e.kind() != ErrorKind::ValueValidation {
        return None;
    }
    let text = |kind| match e.get(kind) {
        Some(ContextValue::String(s)) => Some(s.as_str()),
        _ => None,
    };
    // `--grace <DUR>`: the flag is the first word.
    let flag = text(ContextKind::InvalidArg)?.split(' ').next()?;
    let value = text(ContextKind::InvalidValue)?;
    let why = std::error::Error::source(e)?;
    let var = env_name(flag);
    let typed = argv.iter().any(|a| {
        let a = a.to_string_lossy();
        a == flag || a.starts_with(&format!("{flag}="))
    });
    let flag = match std::env::var_os(&var) {
        Some(_) if !typed => format!("{flag} (from {var})"),
        _ => flag.to_string(),
    };
    let flag = flag.as_str();
    if flag == "--header" || flag.starts_with("--header (") {
        // A header's value is often a token: it is never shown.
        return Some(error::usage(format!("invalid value for {flag}: {why}")));
    }
    Some(error::bad_value(flag, value, why))
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

/// The command line's definition, as parsing, `--help` and the completion
/// scripts see it. A flag's value from the environment is never shown in
/// `--help` (`--header` may hold a token).
pub fn command() -> clap::Command {
    Args::command().mut_subcommand("sync", |c| c.mut_args(|a| a.hide_env_values(true)))
}

/// The environment variable that may set `sync`'s flag `--NAME`:
/// `PACKSYNC_NAME`, capitals and `_` for `-`.
fn env_name(flag: &str) -> String {
    let name = flag.trim_start_matches('-').to_ascii_uppercase();
    format!("PACKSYNC_{}", name.replace('-', "_"))
}

fn parse_from(argv: impl IntoIterator<Item = std::ffi::OsString>) -> Result<Config, Invalid> {
    let argv: Vec<std::ffi::OsString> = argv.into_iter().collect();
    let matches = command()
        .try_get_matches_from(&argv)
        .map_err(|e| Invalid::of(e, &argv))?;
    let args = Args::from_arg_matches(&matches)?;
    // --exclude and --include interleave: their relative order decides.
    let order = matches.subcommand_matches("sync").map(|m| {
        let mut rules: Vec<(usize, String)> = Vec::new();
        for (id, neg) in [("exclude", false), ("include", true)] {
            // The environment's values come after the command line's, a
            // blank line of it as a `None`.
            if let (Some(idx), Some(vals)) = (m.indices_of(id), m.get_many::<Option<String>>(id)) {
                for (i, v) in idx.zip(vals) {
                    if let Some(v) = v {
                        rules.push((i, if neg { format!("!{v}") } else { v.clone() }));
                    }
                }
            }
        }
        rules.sort();
        rules.into_iter().map(|(_, r)| r).collect::<Vec<_>>()
    });
    into_config(args, order.unwrap_or_default()).map_err(Invalid::Value)
}

fn into_config(args: Args, rules: Vec<String>) -> Result<Config> {
    let command = match args.command {
        Cmd::Sync(s) => Command::Sync(Box::new(sync_config(*s, rules)?)),
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
    Ok(Config { command })
}

/// `sync`'s flags resolved together; `rules` are `--exclude` / `--include`
/// in command-line order (`!` = include).
fn sync_config(s: SyncArgs, rules: Vec<String>) -> Result<SyncConfig> {
    let layout = match s.layout {
        LayoutArg::Symlink => Layout::Symlink,
        LayoutArg::Fanout => Layout::Fanout,
        LayoutArg::Dir => Layout::Dir,
    };
    if layout != Layout::Fanout {
        for (flag, set) in [("--slot", s.slot.is_some()), ("--adopt", s.adopt)] {
            if set {
                return Err(error::usage(format!("{flag} needs --layout fanout")));
            }
        }
    }
    if s.every.is_none() {
        for (flag, set) in [
            ("--max-failures", s.max_failures.is_some()),
            ("--unhealthy-after", s.unhealthy_after.is_some()),
            ("--http-bind", s.http_bind.is_some()),
        ] {
            if set {
                return Err(error::usage(format!("{flag} needs --every")));
            }
        }
    } else if s.dry_run {
        return Err(error::usage("--every cannot be combined with --dry-run"));
    }
    let label_auto = s.label.as_ref().is_some_and(|l| l.text == "auto");
    if s.tag_filter.is_some() && s.semver.is_none() {
        return Err(error::usage("--tag-filter needs --semver"));
    }
    let chooses = |p: &PathBuf| {
        p.to_str()
            .is_some_and(|t| t.starts_with("oci://") || t.starts_with("oci-layout:"))
    };
    if s.semver.is_some() && !s.sources.iter().any(chooses) {
        return Err(error::usage(
            "--semver needs an oci:// or oci-layout: SOURCE without a tag",
        ));
    }
    let label = match s.label {
        _ if label_auto => None,
        Some(l) if s.allow_downgrade => Some(Label {
            version: None,
            ..l
        }),
        Some(l) if l.version.is_none() => {
            return Err(error::bad_value(
                "--label",
                &l.text,
                "not a version such as v1.2.3 or 1.2.0-rc1 (pass --allow-downgrade to record any text without ordering)",
            ))
        }
        l => l,
    };
    let mut lines = Vec::new();
    for f in &s.exclude_from {
        let text = sys::read_text(f).map_err(|e| {
            error::usage(format!("{}: cannot read --exclude-from: {e}", f.display()))
        })?;
        lines.extend(exclude_lines(&text).map(str::to_string));
    }
    lines.extend(rules);
    let mut filter = Filter::new(&lines).map_err(|e| error::usage(format!("{e:#}")))?;
    filter.xattrs = s.xattrs;
    // Read again by each sync; a file that cannot be used at the start is
    // a usage error now.
    if let Some(f) = &s.header_file {
        let text = sys::read_text_bounded(f, config::MAX_HEADER_FILE).map_err(|e| {
            error::usage(format!("{}: cannot read --header-file: {e}", f.display()))
        })?;
        config::parse_header_lines(&text)
            .map_err(|e| error::usage(format!("{}: {e:#}", f.display())))?;
    }
    let headers: Vec<(String, String)> = s.header.into_iter().flatten().collect();
    if s.timeout.is_zero() {
        return Err(error::bad_value("--timeout", "0", "must be more than zero"));
    }
    if s.round_timeout.is_some_and(|d| d.is_zero()) {
        return Err(error::bad_value(
            "--round-timeout",
            "0",
            "must be more than zero",
        ));
    }
    let mut verify_keys = Vec::new();
    for f in s.verify_key.iter().flatten() {
        let key = crate::trust::key::Key::load(f).map_err(|e| error::usage(format!("{e:#}")))?;
        verify_keys.push(key);
    }
    let keyless = match (
        &s.trusted_root,
        s.certificate_identity,
        s.certificate_oidc_issuer,
    ) {
        (None, None, None) => None,
        (None, _, _) => {
            return Err(error::usage(
                "--certificate-identity and --certificate-oidc-issuer need --trusted-root FILE",
            ))
        }
        (Some(f), id, iss) => {
            let who = match (id, iss) {
                (Some(id), Some(iss)) => Some((id, iss)),
                (None, None) if !verify_keys.is_empty() => None,
                (None, None) => {
                    return Err(error::usage(
                        "--trusted-root needs --certificate-identity and --certificate-oidc-issuer (keyless), or --verify-key",
                    ))
                }
                (Some(_), None) => {
                    return Err(error::usage(
                        "--certificate-identity needs --certificate-oidc-issuer",
                    ))
                }
                (None, Some(_)) => {
                    return Err(error::usage(
                        "--certificate-oidc-issuer needs --certificate-identity",
                    ))
                }
            };
            let root = crate::trust::keyless::TrustedRoot::load(f)
                .map_err(|e| error::usage(format!("{e:#}")))?;
            Some(crate::trust::keyless::Keyless {
                root: std::sync::Arc::new(root),
                who,
            })
        }
    };
    let remote = config::Remote {
        keyless,
        registry_auth: s.registry_auth,
        ca_file: s.ca_file,
        insecure_registries: s.insecure_registry.into_iter().flatten().collect(),
        headers,
        header_file: s.header_file,
        timeout: s.timeout,
        round_timeout: s.round_timeout,
        platform: s.platform,
        verify_keys: verify_keys.clone(),
        choose: s.semver.map(|range| config::Choose {
            range,
            filter: s.tag_filter,
        }),
        layer_media_types: {
            let mut t: Vec<String> = s.layer_media_type.into_iter().flatten().collect();
            t.sort();
            t.dedup();
            t
        },
    };
    Ok(SyncConfig {
        sources: s.sources,
        dest: s.dest,
        filter,
        checksum: s.checksum,
        set_mtime: s.set_mtime,
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
        label,
        label_auto,
        allow_downgrade: s.allow_downgrade,
        layout,
        slot: s.slot,
        adopt: s.adopt,
        fsync: !s.no_fsync,
        verify: s.verify,
        mkpath: s.mkpath,
        migrate: s.migrate,
        every: s.every,
        max_failures: s.max_failures,
        unhealthy_after: s.unhealthy_after.unwrap_or(config::DEFAULT_UNHEALTHY_AFTER),
        http_bind: s.http_bind,
        max_entries: s.max_entries,
        verify_keys,
        remote,
    })
}

/// `--verify-key FILE`: read in `sync_config`, where a bad key names its file.
fn parse_key_path(s: &str) -> Result<PathBuf> {
    if s.trim().is_empty() {
        anyhow::bail!("empty path");
    }
    Ok(PathBuf::from(s))
}

/// `--certificate-identity`, `--certificate-oidc-issuer`: compared exactly.
fn parse_nonempty(s: &str) -> Result<String> {
    if s.is_empty() {
        anyhow::bail!("empty");
    }
    Ok(s.to_string())
}

/// `--grace`: see `config::parse_duration`.
fn parse_duration(s: &str) -> Result<Duration> {
    config::parse_duration(s)
}

/// `sync --set-mtime`: whole seconds since the epoch, within the range a
/// time in nanoseconds holds (1677 to 2262).
fn parse_epoch(s: &str) -> Result<i64> {
    let t: i64 = s
        .trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("not a whole number of seconds since the epoch"))?;
    let max = i64::MAX / 1_000_000_000;
    if !(-max..=max).contains(&t) {
        anyhow::bail!("out of range (at most {max} seconds either side of the epoch)");
    }
    Ok(t)
}

/// `sync --every`: a duration of at least `config::MIN_EVERY`.
fn parse_every(s: &str) -> Result<Duration> {
    let d = config::parse_duration(s)?;
    if d < config::MIN_EVERY {
        anyhow::bail!("at least {}", humantime::format_duration(config::MIN_EVERY));
    }
    Ok(d)
}

/// `wait --timeout`.
fn parse_timeout(s: &str) -> Result<Timeout> {
    Ok(Timeout {
        limit: config::parse_duration(s)?,
        text: s.to_string(),
    })
}

/// `--label`: any text; whether it must be a version depends on
/// `--allow-downgrade` (`sync_config`).
fn parse_label(s: &str) -> Result<Label> {
    Ok(Label {
        text: s.to_string(),
        version: crate::label::parse(s),
        from_tag: false,
    })
}

/// `--semver RANGE`: Masterminds' constraint syntax (`semver::parse_range`).
fn parse_semver(s: &str) -> Result<crate::semver::Range> {
    crate::semver::parse_range(s).map_err(|e| anyhow::anyhow!("{e}"))
}

/// `--tag-filter REGEX`: the `regex` crate's syntax, bounded in size.
/// Tags are ASCII: classes such as `\d` and `\w` are ASCII ones (the
/// crate's Unicode tables would add half a megabyte for no tag).
fn parse_tag_filter(s: &str) -> Result<regex::bytes::Regex> {
    regex::bytes::RegexBuilder::new(s)
        .unicode(false)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| {
            anyhow::anyhow!(
                "{}",
                e.to_string()
                    .lines()
                    .last()
                    .unwrap_or("not a regular expression")
            )
        })
}

/// `sync --slot`: a name that is one component inside the state directory.
fn parse_slot(s: &str) -> Result<String> {
    if !crate::layout::fanout::valid_slot(s) {
        anyhow::bail!(
            "use letters, digits, '-', '_' and '.', starting with a letter or digit (at most 64)"
        );
    }
    Ok(s.to_string())
}

/// `--exclude` / `--include`: one gitignore line.
fn parse_glob(s: &str) -> Result<String> {
    Filter::new(&[s.to_string()])?;
    Ok(s.to_string())
}

/// The rules of an `--exclude-from` file: its lines but blank ones and comments.
pub(crate) fn exclude_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
}

/// Write the completion script for `shell` to `out`.
pub fn completions(shell: clap_complete::Shell, out: &mut dyn std::io::Write) {
    clap_complete::generate(shell, &mut command(), "packsync", out);
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

    /// Every argument of every command says what it is for, in `--help`.
    #[test]
    fn every_argument_of_every_command_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            let path = format!("{path} {}", cmd.get_name());
            if cmd.get_about().is_none() {
                missing.push(path.clone());
            }
            for a in cmd.get_arguments() {
                if a.get_help().is_none_or(|h| h.to_string().trim().is_empty()) {
                    missing.push(format!("{path} {}", a.get_id()));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &path, missing);
            }
        }
        let mut cmd = command();
        cmd.build();
        let mut missing = Vec::new();
        walk(&cmd, "", &mut missing);
        assert!(missing.is_empty(), "no help: {missing:?}");
    }

    /// `sync`'s flags: each under one of the headings, each settable from
    /// `PACKSYNC_` + its name, none of those names one the tests or the
    /// commands packsync runs use for something else.
    #[test]
    fn every_sync_flag_has_a_heading_and_its_environment_name() {
        let cmd = command();
        let sync = cmd.find_subcommand("sync").unwrap();
        let headings = [SOURCES, FILTERS, SAFETY, LAYOUT, SIDECAR, OUTPUT];
        let mut flags = 0;
        for a in sync.get_arguments() {
            let Some(long) = a.get_long() else {
                assert!(a.is_positional(), "{}", a.get_id());
                assert!(a.get_env().is_none(), "{}", a.get_id());
                continue;
            };
            if long == "help" {
                continue;
            }
            flags += 1;
            let heading = a.get_help_heading();
            assert!(
                heading.is_some_and(|h| headings.contains(&h)),
                "--{long}: heading {heading:?}"
            );
            let env = a.get_env().map(|e| e.to_string_lossy().into_owned());
            assert_eq!(env, Some(env_name(&format!("--{long}"))), "--{long}");
            let env = env.unwrap();
            assert!(!env.starts_with("PACKSYNC_TEST_"), "{env}");
            // What exec and --exec-after set for the commands they run.
            assert!(!["PACKSYNC_ROOT", "PACKSYNC_GENERATION"].contains(&env.as_str()));
            assert!(a.is_hide_env_values_set(), "--{long} would show its value");
        }
        assert!(flags > 30, "{flags} flags");
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
        let Err(Invalid::Clap(e)) = parse_from(argv(&["sync", "--json", "--bogus", "src", "dst"]))
        else {
            panic!("--bogus parsed");
        };
        assert_eq!(one_line(&e), "unexpected argument '--bogus' found");
        let Err(Invalid::Clap(e)) = parse_from(argv(&["sync", "--json", "src"])) else {
            panic!("one path parsed");
        };
        let msg = one_line(&e);
        assert!(!msg.contains('\n') && msg.contains("<SOURCE>..."), "{msg}");
    }

    /// The usage error (exit 2) a command line gives, as its one line.
    fn refused(args: &[&str]) -> String {
        match parse_from(argv(args)) {
            Err(Invalid::Value(e)) => {
                assert_eq!(crate::error::exit_code(&e), 2, "{e:#}");
                let msg = format!("{e:#}");
                assert!(!msg.contains('\n'), "{msg}");
                msg
            }
            Err(Invalid::Clap(e)) => panic!("{args:?}: not a value error: {e}"),
            Ok(_) => panic!("{args:?} parsed"),
        }
    }

    fn sync(args: &[&str]) -> SyncConfig {
        let full: Vec<&str> = ["sync"]
            .iter()
            .chain(args)
            .chain(&["src", "vol/packs"])
            .copied()
            .collect();
        match parse_from(argv(&full)).map(|c| c.command) {
            Ok(Command::Sync(s)) => *s,
            Ok(_) => panic!("not a sync"),
            Err(Invalid::Value(e)) => panic!("{args:?}: {e:#}"),
            Err(Invalid::Clap(e)) => panic!("{args:?}: {e}"),
        }
    }

    #[test]
    fn flags_arrive_typed() {
        let s = sync(&[
            "--grace",
            "90",
            "--chown",
            "1000:2000",
            "--chmod",
            "D755,F644",
            "--label",
            "v1.2",
            "--keep",
            "0",
        ]);
        assert_eq!(s.grace, Duration::from_secs(90));
        assert_eq!(
            s.chown,
            Some(Owner {
                uid: 1000,
                gid: 2000
            })
        );
        assert_eq!(s.chmod, Some(chmod::parse("D755,F644").unwrap()));
        let label = s.label.expect("--label");
        assert_eq!(label.text, "v1.2");
        assert_eq!(label.version, crate::label::parse("1.2.0"));
        assert_eq!(s.keep, 0);
        let d = sync(&[]);
        assert_eq!(d.grace, Duration::from_secs(15 * 60), "the default");
        assert!(d.label.is_none() && d.chown.is_none() && d.chmod.is_none());
        assert!(d.filter.is_empty());
    }

    #[test]
    fn tag_filters_take_the_usual_forms() {
        for (re, tag, hit) in [
            (r"^v\d+\.\d+\.\d+$", "v1.20.3", true),
            (r"^v\d+\.\d+\.\d+$", "v1.20.3-rc.1", false),
            (r"^1\..*", "1.4.2", true),
            (r"rc", "2.0.0-rc.1", true),
            (r"^[0-9]+(\.[0-9]+){2}$", "1.2", false),
            (r"\w+-\d", "stable-1", true),
        ] {
            let f = parse_tag_filter(re).unwrap_or_else(|e| panic!("{re}: {e}"));
            assert_eq!(f.is_match(tag.as_bytes()), hit, "{re} {tag}");
        }
        assert!(parse_tag_filter("([").is_err());
    }

    #[test]
    fn a_label_need_not_be_a_version_only_with_allow_downgrade() {
        assert_eq!(
            refused(&["sync", "--label", "latest", "src", "dst"]),
            "invalid value \"latest\" for --label: not a version such as v1.2.3 or 1.2.0-rc1 \
             (pass --allow-downgrade to record any text without ordering)"
        );
        let s = sync(&["--label", "v2", "--allow-downgrade"]);
        let label = s.label.expect("--label");
        assert_eq!((label.text.as_str(), label.version), ("v2", None));
        assert_eq!(
            sync(&["--label", "hot fix", "--allow-downgrade"]).label_text(),
            Some("hot fix")
        );
    }

    #[test]
    fn bad_values_are_one_line_usage_errors_naming_the_flag() {
        let cases: &[(&[&str], &str)] = &[
            (
                &["sync", "--grace", "15 minutes", "s", "d"],
                "invalid value \"15 minutes\" for --grace: ",
            ),
            (
                &["sync", "--grace", "99999999999999999999d", "s", "d"],
                "for --grace: too long",
            ),
            (
                &["gc", "d", "--grace", "99999999999999999999d"],
                "for --grace: too long",
            ),
            (
                &["wait", "d", "--timeout", "99999999999999999999d"],
                "for --timeout: too long",
            ),
            (
                &["wait", "d", "--timeout="],
                "invalid value \"\" for --timeout: ",
            ),
            (
                &["sync", "--chown", "root:root", "s", "d"],
                "invalid value \"root:root\" for --chown: ",
            ),
            (
                &["sync", "--chmod", "D8", "s", "d"],
                "invalid value \"D8\" for --chmod: ",
            ),
            (
                &["sync", "--slot", "../x", "--layout", "fanout", "s", "d"],
                "invalid value \"../x\" for --slot: ",
            ),
            (
                &["sync", "--keep", "99999999999999999999999", "s", "d"],
                "invalid value \"99999999999999999999999\" for --keep: ",
            ),
            (
                &["sync", "--max-delete", "many", "s", "d"],
                "invalid value \"many\" for --max-delete: ",
            ),
            (
                &["gc", "d", "--keep", "x"],
                "invalid value \"x\" for --keep: ",
            ),
        ];
        for (args, want) in cases {
            let msg = refused(args);
            assert!(msg.contains(want), "{args:?}: {msg}");
        }
    }

    #[test]
    fn wait_keeps_the_timeout_as_written_for_its_message() {
        let Ok(Config {
            command: Command::Wait { timeout, .. },
        }) = parse_from(argv(&["wait", "d", "--timeout", "200ms"]))
        else {
            panic!("wait did not parse");
        };
        assert_eq!(
            timeout,
            Some(Timeout {
                limit: Duration::from_millis(200),
                text: "200ms".into()
            })
        );
    }

    #[test]
    fn remote_flags_arrive_typed() {
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("headers");
        std::fs::write(&file, "# tokens\nX-From-File: 1\n\n").unwrap();
        let s = sync(&[
            "--timeout",
            "5s",
            "--platform",
            "linux/arm64",
            "--insecure-registry",
            "reg.example:5000",
            "--header-file",
            file.to_str().unwrap(),
            "--header",
            "Authorization: Bearer t",
        ]);
        let r = s.remote;
        assert_eq!(r.timeout, Duration::from_secs(5));
        assert_eq!(r.platform.unwrap().to_string(), "linux/arm64");
        assert_eq!(r.insecure_registries, ["reg.example:5000"]);
        // The file is read by each sync; only its path is kept.
        assert_eq!(r.header_file.as_deref(), Some(file.as_path()));
        assert_eq!(
            r.headers,
            [("Authorization".to_string(), "Bearer t".to_string())]
        );
        assert_eq!(sync(&[]).remote.timeout, Duration::from_secs(30));
        assert!(refused(&["sync", "--platform", "amd64", "s", "d"]).contains("for --platform"));
        assert!(refused(&["sync", "--header", "nocolon", "s", "d"]).contains("for --header"));
        assert!(refused(&["sync", "--timeout", "0", "s", "d"]).contains("for --timeout"));
    }

    #[test]
    fn slot_and_adopt_need_fanout() {
        assert_eq!(
            refused(&["sync", "--slot", "a", "s", "d"]),
            "--slot needs --layout fanout"
        );
        assert_eq!(
            refused(&["sync", "--adopt", "s", "d"]),
            "--adopt needs --layout fanout"
        );
        assert_eq!(
            sync(&["--layout", "fanout", "--slot", "a"]).slot.as_deref(),
            Some("a")
        );
    }

    #[test]
    fn rules_keep_command_line_order_after_the_exclude_from_files() {
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("ignore");
        std::fs::write(&file, "# a comment\n\n*.log\n").unwrap();
        let file = file.to_str().unwrap();
        let s = sync(&[
            "--exclude",
            "*.tmp",
            "--exclude-from",
            file,
            "--include",
            "keep.tmp",
        ]);
        assert!(s.filter.excludes(b"a.log", false));
        assert!(s.filter.excludes(b"a.tmp", false));
        assert!(!s.filter.excludes(b"keep.tmp", false));
        assert!(!s.filter.excludes(b"a.txt", false));
        let missing = t.path().join("missing");
        let msg = refused(&[
            "sync",
            "--exclude-from",
            missing.to_str().unwrap(),
            "s",
            "d",
        ]);
        assert!(msg.contains("cannot read --exclude-from"), "{msg}");
    }
}
