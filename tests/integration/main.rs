//! Integration tests: the real binary on temporary trees.

mod containers;
mod copy;
mod examples;
mod faults;
mod fixture;
mod layouts;
mod ops;
mod property;
mod sidecar;
mod streaming;
mod sync;
