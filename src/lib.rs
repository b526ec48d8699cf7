//! packsync mirrors one or more SOURCE trees into DEST on a shared volume.
//!
//! A sync is a pipeline: the command line becomes a `Config`; `scan` reads
//! each source (and the live generation) into a `Tree`; `plan` compares them
//! and marks what can be reused; `stage` builds the new tree in a private
//! staging directory; `commit` makes it durable, names it by its digest and
//! publishes it through the layout's driver (`layout`); `retire` removes what
//! no reader may still need; `sidecar` runs that sync as a loop
//! (`--every`) with health and metrics. `source` is where the entries come from,
//! `volume` holds the destination's directory handles, and `sys` is the only
//! place that makes raw syscalls (inside the volume, through `sys::DirFd`).
//! docs/architecture.md draws the pipeline, says what each module may touch
//! and describes the on-disk protocol.
//!
//! The binary reaches all of it through `main`; every module is private to
//! the crate, so the compiler sees what is unused.

pub(crate) mod app;
pub(crate) mod caps;
pub(crate) mod chmod;
pub(crate) mod claim;
pub(crate) mod cli;
pub(crate) mod clock;
pub(crate) mod commit;
pub(crate) mod config;
pub(crate) mod damage;
pub(crate) mod distinct;
pub(crate) mod error;
pub(crate) mod escape;
pub(crate) mod filter;
#[doc(hidden)]
pub mod fuzzing;
pub(crate) mod index;
pub(crate) mod label;
pub(crate) mod layout;
pub(crate) mod live;
pub(crate) mod manifest;
pub(crate) mod net;
pub(crate) mod ops;
pub(crate) mod plan;
pub(crate) mod report;
pub(crate) mod retire;
pub(crate) mod scan;
pub(crate) mod semver;
pub(crate) mod sidecar;
pub(crate) mod source;
pub(crate) mod stage;
pub(crate) mod staging;
pub(crate) mod sys;
pub(crate) mod takeover;
pub(crate) mod tree;
pub(crate) mod trust;
pub(crate) mod verify;
pub(crate) mod volume;
pub(crate) mod walk;
pub(crate) mod xattr;

/// Parse the process's arguments, run the command, show a failure: the
/// exit status (README, "Exit codes").
pub fn main() -> i32 {
    let cfg = match cli::parse() {
        Ok(cfg) => cfg,
        Err(code) => return code,
    };
    let json = cfg.json();
    match app::run(cfg) {
        Ok(code) => code,
        Err(err) => report::error(&err, json),
    }
}
