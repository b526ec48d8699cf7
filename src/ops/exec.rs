//! `packsync exec DEST -- CMD...` and `sync --exec-after CMD`: run a command
//! pinned to one generation, with `PACKSYNC_ROOT` (its absolute path) and
//! `PACKSYNC_GENERATION` (its name) set, holding a lease on it meanwhile.
//!
//! A lease is the file `leases/<GEN>.<host>-<pid>-<random>`: `retire` keeps
//! every generation with a lease whose holder is alive (a local pid that
//! exists; another host's lease touched within a day, which the holder
//! refreshes), and removes leases of dead local processes. The lease is
//! taken before the generation is checked to exist, so a collector either
//! sees the lease or has already removed the generation, which is then
//! reported instead of running CMD on nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::error::Failure;
use crate::layout;
use crate::report::After;
use crate::sys::{self, DirFd};
use crate::volume::{self, State, Volume};

/// Another host trusts a lease for a day from its mtime; refresh well within.
const REFRESH: Duration = Duration::from_secs(600);

/// A held lease; removed when dropped.
pub struct Lease {
    dir: DirFd,
    name: String,
    /// Dropped with the lease: ends its refresher at once, with its handle
    /// (a `sync --every` takes a lease per `--exec-after`).
    _stop: Option<std::sync::mpsc::Sender<()>>,
}

impl Lease {
    pub fn take(state: &State, gen: &str) -> Result<Lease> {
        let name = format!("{gen}.{}", volume::unique_name());
        state.leases.create_excl(name.as_bytes()).with_context(|| {
            format!("cannot create lease {}/leases/{name}", state.path.display())
        })?;
        let dir = state
            .leases
            .try_clone()
            .context("cannot duplicate a handle")?;
        let refresh = (dir.try_clone(), name.clone());
        let mut stop = None;
        if let (Ok(fd), name) = refresh {
            let (tx, rx) = std::sync::mpsc::channel::<()>();
            stop = Some(tx);
            // Ends with the process, once the lease is dropped, or once it is gone.
            std::thread::spawn(move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(REFRESH)
                {
                    if fd.touch(name.as_bytes()).is_err() {
                        break;
                    }
                }
            });
        }
        Ok(Lease {
            dir,
            name,
            _stop: stop,
        })
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let _ = self.dir.unlink(self.name.as_bytes());
    }
}

/// Lease `gen` and return its absolute path, from the handle the lease
/// pins (see `ops::gen_path`), or fail if it is gone.
fn pin(vol: &Volume, state: &State, gen: &str) -> Result<(Lease, PathBuf)> {
    let lease = Lease::take(state, gen)?;
    let fd = layout::open_generation(vol, state, gen).with_context(|| {
        format!(
            "{}: generation {gen} was removed before it could be leased; run again",
            vol.display
        )
    })?;
    Ok((lease, super::gen_path(&fd, state, gen)))
}

pub fn run(dest: &Path, slot: Option<&str>, cmd: &[String]) -> Result<i32> {
    let t = super::open_one(dest, slot)?;
    let gen = t.live()?.gen;
    let (lease, root) = pin(&t.vol, &t.state, &gen)?;
    if let Some(sig) = sys::signals::pending() {
        return Err(Failure::Interrupted(sig).into());
    }
    sys::forward::prepare();
    let mut child = match Command::new(&cmd[0])
        .args(&cmd[1..])
        .env("PACKSYNC_ROOT", &root)
        .env("PACKSYNC_GENERATION", &gen)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            sys::forward::stop();
            drop(lease);
            // As env(1) and the shells do: 127 not found, 126 not runnable.
            eprintln!("packsync: error: cannot run {}: {e}", cmd[0]);
            return Ok(if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            });
        }
    };
    let status = wait_relaying(&mut child).with_context(|| format!("cannot wait for {}", cmd[0]));
    drop(lease);
    Ok(exit_status(status?))
}

/// Wait for `child` (started after `forward::prepare`), relaying
/// SIGINT/SIGTERM sent to packsync to it.
fn wait_relaying(child: &mut std::process::Child) -> std::io::Result<std::process::ExitStatus> {
    sys::forward::to_child(child.id());
    let status = child.wait();
    sys::forward::stop();
    status
}

/// A child's status as a shell reports it: its code, or 128 + the signal.
fn exit_status(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// Whether an `--exec-after` command succeeded on `gen` (`meta/<GEN>.after`).
pub fn after_done(state: &State, gen: &str) -> bool {
    state
        .meta
        .stat(format!("{gen}.after").as_bytes())
        .is_ok_and(|st| sys::kind_of(&st) == sys::StatKind::File)
}

/// `sync --exec-after CMD`: run CMD with `sh -c` on the generation just
/// published, or on the live one when an earlier CMD on it did not succeed.
/// Its output goes to packsync's (to stderr with `--json`, so stdout stays
/// one JSON object). Success is recorded as `meta/<GEN>.after`. Returns what
/// happened for the summary and, when CMD failed, the error to exit with
/// once the summary is out: the swap stays either way.
pub fn after(
    cmd: &str,
    vol: &Volume,
    state: &State,
    gen: &str,
    json: bool,
) -> (After, Option<anyhow::Error>) {
    let (exit_code, failure) = match run_after(cmd, vol, state, gen, json) {
        Ok(0) => {
            // Without the record, the next sync only runs CMD once more.
            let _ = state.stamp(gen, "after");
            (Some(0), None)
        }
        Ok(code) => (
            Some(code),
            Some(anyhow::anyhow!(
                "--exec-after command {cmd:?} failed with exit status {code}; generation {gen} stays live"
            )),
        ),
        Err(e) => (None, Some(e)),
    };
    let after = After {
        command: cmd.to_string(),
        ok: failure.is_none(),
        exit_code,
        error: failure.as_ref().map(|e| format!("{e:#}")),
    };
    (after, failure)
}

/// Run the hook leased on `gen`; its exit status.
fn run_after(cmd: &str, vol: &Volume, state: &State, gen: &str, json: bool) -> Result<i32> {
    let (lease, root) = pin(vol, state, gen)?;
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(cmd)
        .env("PACKSYNC_ROOT", &root)
        .env("PACKSYNC_GENERATION", gen);
    if json {
        c.stdout(Stdio::from(std::io::stderr()));
    }
    sys::forward::prepare();
    let status = c
        .spawn()
        .inspect_err(|_| sys::forward::stop())
        .and_then(|mut child| wait_relaying(&mut child))
        .with_context(|| format!("cannot run --exec-after command {cmd:?}"))?;
    drop(lease);
    Ok(exit_status(status))
}
