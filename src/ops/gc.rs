//! `packsync gc DEST [--keep N] [--grace DUR]`: retire old generations and
//! remove dead staging, as a sync does after publishing, without syncing.
//! With fanout slots, every slot's state directory. Writes nothing but what
//! `retire` removes.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;

use crate::config;
use crate::error;
use crate::layout;
use crate::retire::{self, Policy};

pub fn run(dest: &Path, keep: usize, grace: Duration) -> Result<i32> {
    // One state directory per published tree: with fanout, one per slot.
    for vol in layout::find(dest, None)? {
        let state = vol.state(false)?.ok_or_else(|| {
            error::refused(format!("{}: not a packsync destination", vol.display))
        })?;
        let policy = Policy {
            keep,
            grace,
            stale: config::STALE_STAGE,
        };
        let r = retire::run(&vol, &state, &policy, None)?;
        println!(
            "packsync: {}{}: removed {} generation(s){}, {} stale staging dir(s)",
            vol.display,
            vol.slot
                .as_deref()
                .map(|s| format!(" (slot {s})"))
                .unwrap_or_default(),
            r.removed.len(),
            if r.left.is_empty() {
                String::new()
            } else {
                format!(", {} left for later (files still open)", r.left.len())
            },
            r.stale_stages
        );
    }
    Ok(0)
}
