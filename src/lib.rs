//! packsync mirrors one or more SOURCE trees into DEST on a shared volume.
//!
//! A sync is a pipeline: the command line becomes a `Config`; `scan` reads
//! each source (and the live generation) into a `Tree`; `plan` compares them
//! and marks what can be reused; `stage` builds the new tree in a private
//! staging directory; `commit` makes it durable, names it by its digest and
//! publishes it with one rename of a symlink over DEST; `retire` removes what
//! no reader may still need. `volume` holds the destination's directory
//! handles and `sys` is the only place that makes raw syscalls.

pub mod app;
pub mod caps;
pub mod chmod;
pub mod claim;
pub mod cli;
pub mod clock;
pub mod commit;
pub mod config;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod label;
pub mod layout;
pub mod manifest;
pub mod ops;
pub mod plan;
pub mod report;
pub mod retire;
pub mod scan;
pub mod stage;
pub mod sys;
pub mod tree;
pub mod verify;
pub mod volume;
