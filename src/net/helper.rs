//! A Docker credential helper, run as the docker CLI runs it:
//! `docker-credential-NAME get` found on PATH and executed directly (no
//! shell), the server address written to its stdin (then closed), JSON
//! `{"ServerURL", "Username", "Secret"}` read from its stdout. Bounded:
//! `--timeout` for the whole run (the helper is killed after it), at most
//! 64 KiB of output, and a signal to packsync ends it at once. Its answer
//! is parsed by `parse_helper_reply`; nothing it prints is ever
//! repeated but the first line of its stderr on a failure.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde::Deserialize;

use crate::error::Failure;

/// A helper's answer is one small JSON object.
const MAX_OUTPUT: u64 = 64 << 10;

/// How often a running helper is looked at.
const POLL: Duration = Duration::from_millis(5);

/// A helper's JSON answer.
#[derive(Clone, PartialEq, Eq)]
pub struct HelperReply {
    pub user: String,
    pub secret: String,
}

impl std::fmt::Debug for HelperReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HelperReply({:?}, <hidden>)", self.user)
    }
}

#[derive(Deserialize)]
struct HelperJson {
    #[serde(rename = "Username")]
    username: String,
    #[serde(rename = "Secret")]
    secret: String,
}

/// `{"ServerURL": ..., "Username": ..., "Secret": ...}`. The error never
/// holds the text (it holds the secret).
pub fn parse_helper_reply(data: &[u8]) -> Result<HelperReply> {
    let j: HelperJson = serde_json::from_slice(data)
        .map_err(|_| anyhow::anyhow!("the answer is not JSON with \"Username\" and \"Secret\""))?;
    if j.secret.is_empty() {
        bail!("the answer holds an empty \"Secret\"");
    }
    if j.username.contains(':') {
        bail!("the answer's \"Username\" holds a ':'");
    }
    Ok(HelperReply {
        user: j.username,
        secret: j.secret,
    })
}

/// What `docker-credential-NAME get` says for `key`: `None` where it has
/// no credentials ("credentials not found", as docker-credential-helpers
/// prints it); any other failure is an error naming the helper.
pub fn get(name: &str, key: &str, timeout: Duration) -> Result<Option<HelperReply>> {
    let program = format!("docker-credential-{name}");
    let mut child = Command::new(&program)
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                anyhow::anyhow!("credential helper {program}: not found on PATH")
            }
            _ => anyhow::anyhow!("credential helper {program}: cannot run: {e}"),
        })?;
    let deadline = Instant::now() + timeout;
    if let Some(mut stdin) = child.stdin.take() {
        // A helper that exits without reading: its answer says why.
        let _ = stdin.write_all(key.as_bytes());
    }
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let status = loop {
        let done = child
            .try_wait()
            .map_err(|e| anyhow::anyhow!("credential helper {program}: cannot wait for it: {e}"))?;
        if let Some(s) = done {
            break s;
        }
        let signal = crate::sys::signals::pending();
        if signal.is_some() || Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            if let Some(sig) = signal {
                return Err(Failure::Interrupted(sig).into());
            }
            bail!(
                "credential helper {program}: no answer for {key} within {} (--timeout)",
                humantime::format_duration(timeout)
            );
        }
        std::thread::sleep(POLL);
    };
    // Something the helper started may hold its pipes open: wait no longer
    // than the deadline for them.
    let left = deadline.saturating_duration_since(Instant::now());
    let stdout = out.recv_timeout(left).unwrap_or_default();
    let stderr = err.recv_timeout(POLL).unwrap_or_default();
    if stdout.len() as u64 > MAX_OUTPUT {
        bail!("credential helper {program}: its answer for {key} is over 64 KiB");
    }
    if !status.success() {
        if String::from_utf8_lossy(&stdout)
            .to_ascii_lowercase()
            .contains("credentials not found")
        {
            return Ok(None);
        }
        let why = first_line(&stderr).unwrap_or_else(|| match status.code() {
            Some(c) => format!("exit status {c}"),
            None => "killed by a signal".to_string(),
        });
        bail!("credential helper {program} failed for {key}: {why}");
    }
    parse_helper_reply(&stdout)
        .map(Some)
        .map_err(|e| anyhow::anyhow!("credential helper {program}: for {key}: {e:#}"))
}

/// Read a pipe to the bound (one byte over it, to tell) on a thread.
fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    if let Some(pipe) = pipe {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = pipe.take(MAX_OUTPUT + 1).read_to_end(&mut buf);
            let _ = tx.send(buf);
        });
    }
    rx
}

/// The first non-empty line, printable characters only, cut at 200.
fn first_line(bytes: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(bytes);
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    let clean: String = line.chars().filter(|c| !c.is_control()).take(200).collect();
    Some(clean)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helper_replies() {
        let r = parse_helper_reply(br#"{"ServerURL":"x","Username":"u","Secret":"s3"}"#).unwrap();
        assert_eq!((r.user.as_str(), r.secret.as_str()), ("u", "s3"));
        assert!(!format!("{r:?}").contains("s3"));
        let e = parse_helper_reply(br#"{"Username":"u","Secret":5,"x":"s3"}"#).unwrap_err();
        assert!(!format!("{e:#}").contains("s3"));
        assert!(parse_helper_reply(br#"{"Username":"u","Secret":""}"#).is_err());
        assert!(parse_helper_reply(br#"{"Username":"a:b","Secret":"x"}"#).is_err());
        assert!(parse_helper_reply(b"credentials not found").is_err());
    }
}
