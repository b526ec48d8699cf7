//! Relay SIGINT and SIGTERM sent to packsync to the child it runs (`exec`,
//! `--exec-after`).
//!
//! A container runtime or a supervisor signals packsync alone, with kill(2):
//! the child must hear it too. A terminal's Ctrl-C already reaches the whole
//! foreground process group, child included; that one (sent by the kernel,
//! `SI_KERNEL`) is not relayed, so the child does not get it twice. A signal
//! that arrives while the child is being started is kept and relayed as soon
//! as its pid is known.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Once;

/// 0: no child; -1: a child is being started; else its pid.
static CHILD: AtomicI32 = AtomicI32::new(0);
/// A signal that came while CHILD was -1.
static EARLY: AtomicI32 = AtomicI32::new(0);

/// A child is about to be started: from now on signals are kept for it.
pub fn prepare() {
    EARLY.store(0, Ordering::SeqCst);
    CHILD.store(-1, Ordering::SeqCst);
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        for sig in [libc::SIGINT, libc::SIGTERM] {
            // SAFETY: the action only touches atomics and calls kill(2),
            // both async-signal-safe.
            let _ = unsafe {
                signal_hook_registry::register_sigaction(sig, move |info: &libc::siginfo_t| {
                    match CHILD.load(Ordering::SeqCst) {
                        -1 => EARLY.store(sig, Ordering::SeqCst),
                        pid if pid > 0 && info.si_code != libc::SI_KERNEL => {
                            libc::kill(pid, sig);
                        }
                        _ => {}
                    }
                })
            };
        }
    });
}

/// Relay from now on to `pid`, and relay what came while it started.
pub fn to_child(pid: u32) {
    let pid = pid as i32;
    CHILD.store(pid, Ordering::SeqCst);
    let early = EARLY.swap(0, Ordering::SeqCst);
    if early != 0 {
        // SAFETY: kill(2) on the child we just started.
        unsafe {
            libc::kill(pid, early);
        }
    }
}

/// Stop relaying (the child has exited, or never started; its pid may be reused).
pub fn stop() {
    CHILD.store(0, Ordering::SeqCst);
}
