//! The few failures that change the exit code. Everything else is an
//! `anyhow::Error` with context naming the path, and exits 1.

use std::fmt;

#[derive(Debug)]
pub enum Failure {
    /// Bad command line or arguments that fail validation (exit 2).
    Usage(String),
    /// A guard refused: `--max-delete`, empty source, downgrade, not packsync's (exit 3).
    Refused(String),
    /// `verify` found differences (exit 4); the differences were already printed.
    Drift(String),
    /// `wait` timed out (exit 5).
    Timeout(String),
    /// `--verify-key` given and a source without a valid signature by one
    /// of the keys (exit 6); nothing was written.
    Untrusted(String),
    /// SIGINT (130) or SIGTERM (143), after cleaning up.
    Interrupted(i32),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Usage(m)
            | Failure::Refused(m)
            | Failure::Drift(m)
            | Failure::Timeout(m)
            | Failure::Untrusted(m) => f.write_str(m),
            Failure::Interrupted(sig) => {
                write!(f, "interrupted by {}", crate::sys::signal_name(*sig))
            }
        }
    }
}

impl std::error::Error for Failure {}

impl Failure {
    pub fn exit_code(&self) -> i32 {
        match self {
            Failure::Usage(_) => 2,
            Failure::Refused(_) => 3,
            Failure::Drift(_) => 4,
            Failure::Timeout(_) => 5,
            Failure::Untrusted(_) => 6,
            Failure::Interrupted(sig) => 128 + sig,
        }
    }
}

/// A sync that failed where a generation was live: shown as its cause
/// then `; generation G stays live`, with the cause's exit status.
#[derive(Debug)]
pub struct StaysLive {
    pub cause: anyhow::Error,
    pub gen: String,
}

impl fmt::Display for StaysLive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#}; generation {} stays live", self.cause, self.gen)
    }
}

impl std::error::Error for StaysLive {}

/// The exit status for an error: its `Failure`, if any in the chain, else 1.
pub fn exit_code(err: &anyhow::Error) -> i32 {
    if let Some(s) = err.downcast_ref::<StaysLive>() {
        return exit_code(&s.cause);
    }
    err.chain()
        .find_map(|e| e.downcast_ref::<Failure>())
        .map(Failure::exit_code)
        .unwrap_or(1)
}

pub fn usage(msg: impl Into<String>) -> anyhow::Error {
    Failure::Usage(msg.into()).into()
}

/// A usage error for a flag value.
pub fn bad_value(flag: &str, value: &str, why: impl std::fmt::Display) -> anyhow::Error {
    usage(format!("invalid value {value:?} for {flag}: {why}"))
}

pub fn refused(msg: impl Into<String>) -> anyhow::Error {
    Failure::Refused(msg.into()).into()
}

pub fn untrusted(msg: impl Into<String>) -> anyhow::Error {
    Failure::Untrusted(msg.into()).into()
}

/// Ok, or the signal (SIGINT, SIGTERM) that asked this process to stop,
/// as `Failure::Interrupted`: checked by every long walk between entries.
pub fn check_signal() -> anyhow::Result<()> {
    match crate::sys::signals::pending() {
        Some(sig) => Err(Failure::Interrupted(sig).into()),
        None => Ok(()),
    }
}
