//! Integration tests: the real binary on temporary trees.

mod fixture;
mod property;
mod sync;
