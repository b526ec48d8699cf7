//! Integration tests: the real binary on temporary trees.

mod copy;
mod examples;
mod faults;
mod fixture;
mod ops;
mod layouts;
mod property;
mod sync;
