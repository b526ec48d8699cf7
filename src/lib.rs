//! packsync mirrors one or more SOURCE trees into DEST on a shared volume.
//!
//! A sync is a pipeline: the command line becomes a `Config`; `scan` reads
//! each source (and the live generation) into a `Tree`; `plan` compares them
//! and marks what can be reused; `stage` builds the new tree in a private
//! staging directory; `commit` makes it durable, names it by its digest and
//! publishes it with one rename of a symlink over DEST; `retire` removes what
//! no reader may still need. `volume` holds the destination's directory
//! handles and `sys` is the only place that makes raw syscalls.
//!
//! The binary reaches all of it through `main`; every module is private to
//! the crate, so the compiler sees what is unused.

// Until the other parts of issue 10 land, these modules hold items the
// compiler now sees unused: the shared clock, retry and `sys::component`
// that callers are being moved to, and dead items their owners remove
// (`commit::Generation::{digest, converged}`, `layout::LiveTree::path`,
// `manifest::Manifest::seal`, `tree::Tree::adopt_groups`,
// `sys::cstr_bytes`). The allowances go once those are merged.

pub(crate) mod app;
pub(crate) mod caps;
pub(crate) mod chmod;
pub(crate) mod claim;
pub(crate) mod cli;
#[allow(dead_code)]
pub(crate) mod clock;
#[allow(dead_code)]
pub(crate) mod commit;
pub(crate) mod config;
pub(crate) mod error;
pub(crate) mod label;
#[allow(dead_code)]
pub(crate) mod layout;
#[allow(dead_code)]
pub(crate) mod manifest;
pub(crate) mod ops;
pub(crate) mod plan;
pub(crate) mod report;
pub(crate) mod retire;
pub(crate) mod scan;
pub(crate) mod source;
pub(crate) mod stage;
pub(crate) mod staging;
#[allow(dead_code)]
#[allow(unused_imports)]
pub(crate) mod sys;
#[allow(dead_code)]
pub(crate) mod tree;
pub(crate) mod verify;
pub(crate) mod volume;

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
