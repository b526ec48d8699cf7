//! Integration tests: the real binary on temporary trees.

mod containers;
mod converge;
mod copy;
mod examples;
mod faults;
mod fixture;
mod help;
mod hostile_remote;
mod layouts;
mod manifests;
mod messages;
mod ops;
mod property;
mod semver;
mod sidecar;
mod sidecar_truth;
mod source_archive;
mod source_http;
mod source_image_more;
mod source_oci;
mod streaming;
mod sync;
mod takeover;
mod tar_corpus;
mod xattrs;
