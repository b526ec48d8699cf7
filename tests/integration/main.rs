//! Integration tests: the real binary on temporary trees.

mod containers;
mod converge;
mod copy;
mod examples;
mod faults;
mod fixture;
mod hostile_remote;
mod layouts;
mod messages;
mod ops;
mod property;
mod sidecar;
mod source_archive;
mod source_http;
mod source_image_more;
mod source_oci;
mod streaming;
mod sync;
mod tar_corpus;
