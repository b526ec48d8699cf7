//! The one clock, and the one way to ask a shared volume again.
//!
//! Times on the volume (stamps, leases, staging heartbeats) are compared with
//! `now`; a network filesystem answering late (ESTALE, an empty link text,
//! a name that is gone for an instant while another client swaps it) is
//! asked again with `retry`, after short waits that grow.

use std::ops::ControlFlow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Short waits for an answer that should settle within milliseconds.
pub const BRIEF: &[u64] = &[0, 1, 2, 5, 10, 20, 50, 100, 200];

/// Time since the epoch, now (zero if the clock is before it).
pub fn now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// Seconds and nanoseconds since the epoch.
pub fn now_pair() -> (i64, u32) {
    let d = now();
    (d.as_secs() as i64, d.subsec_nanos())
}

/// Whole seconds since the epoch.
pub fn now_secs() -> i64 {
    now().as_secs() as i64
}

/// Seconds since the epoch, as a float (for ages).
pub fn now_f64() -> f64 {
    now().as_secs_f64()
}

/// Call `attempt` after each wait of `waits_ms` (milliseconds) until it
/// breaks with a value; the last `Continue` value if it never does.
pub fn retry<T, E>(
    waits_ms: &[u64],
    mut attempt: impl FnMut(usize) -> ControlFlow<T, E>,
) -> Result<T, E> {
    assert!(!waits_ms.is_empty(), "retry needs at least one attempt");
    let mut last = None;
    for (i, &ms) in waits_ms.iter().enumerate() {
        if ms > 0 {
            std::thread::sleep(Duration::from_millis(ms));
        }
        match attempt(i) {
            ControlFlow::Break(v) => return Ok(v),
            ControlFlow::Continue(e) => last = Some(e),
        }
    }
    Err(last.expect("at least one attempt"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_stops_at_the_first_answer_and_keeps_the_last_error() {
        let mut calls = 0;
        let r: Result<usize, usize> = retry(&[0, 0, 0, 0], |i| {
            calls += 1;
            if i == 2 {
                ControlFlow::Break(i)
            } else {
                ControlFlow::Continue(i)
            }
        });
        assert_eq!((r, calls), (Ok(2), 3));
        let r: Result<(), usize> = retry(&[0, 0, 0], ControlFlow::Continue);
        assert_eq!(r, Err(2));
    }
}
