//! What `verify` found damaged in a live generation, kept for the next sync:
//! `meta/<GEN>.damaged`. A file whose bytes changed with its size and mtime
//! put back passes every metadata check, so without this record a sync
//! would call the tree up to date and hardlink the damaged file into every
//! new generation. With it, the sync copies those paths afresh from the
//! source (`app`), and the record goes once a new generation is published.
//!
//! ```text
//! packsync-damaged 1
//! generation 0123abcd0123abcd
//! found 1700000000
//! paths 2                    (how many verify found)
//! path actions/run.py        (escaped as in manifests; at most MAX_PATHS)
//! path lib/a.so
//! ```
//!
//! Fewer `path` lines than `paths` means the list was cut: every file then
//! counts as damaged. Written whole through the writer's staging directory
//! and renamed into place; read back as hostile (bounded, parsed strictly),
//! and a record that does not parse is ignored with a warning.

use std::collections::HashSet;
use std::os::fd::AsFd;

use anyhow::{bail, Context, Result};

use crate::escape::{percent, unpercent};
use crate::staging::Stage;
use crate::sys;
use crate::tree::{Entry, Node, Time};
use crate::volume::State;

const MAGIC: &str = "packsync-damaged 1";
/// A record larger than this is not read.
const MAX_BYTES: usize = 64 * 1024;
/// Paths listed at most; more, and the record says only how many.
const MAX_PATHS: usize = 256;

/// A record read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    pub gen: String,
    /// When verify found it (seconds since the epoch).
    pub found: i64,
    /// How many paths verify found.
    pub total: u64,
    /// The paths listed (all of them unless the list was cut).
    pub paths: Vec<Vec<u8>>,
}

impl Damage {
    /// Whether the list was cut: every file counts as damaged.
    pub fn everything(&self) -> bool {
        (self.paths.len() as u64) < self.total
    }

    /// The record's paths, to look up as a sync compares (`Damaged`).
    pub fn lookup(&self) -> Damaged {
        Damaged {
            all: self.everything(),
            set: self.paths.iter().cloned().collect(),
        }
    }
}

/// A record's paths (at most `MAX_PATHS`), looked up by every comparer of
/// a sync (the whole-tree plan, the plan a directory at a time, the
/// streamed stage) alike.
#[derive(Debug)]
pub struct Damaged {
    /// The list was cut: every file counts as damaged.
    all: bool,
    set: HashSet<Vec<u8>>,
}

impl Damaged {
    /// Whether the file at `path` is to be copied afresh.
    pub fn covers(&self, path: &[u8]) -> bool {
        self.all || self.set.contains(path)
    }

    /// Make the live file `e` at `path` compare as changed where the record
    /// names it: no hash, and an mtime no source file has. The file is
    /// then copied from the source, never linked from the live generation.
    pub fn forget(&self, path: &[u8], e: &mut Entry) {
        if let Node::File(f) = &mut e.node {
            if self.covers(path) {
                f.hash = None;
                e.meta.mtime = Time { s: i64::MIN, ns: 0 };
            }
        }
    }
}

fn file_name(gen: &str) -> String {
    format!("{gen}.damaged")
}

/// The record's text for generation `gen` and the `paths` verify found.
fn format(gen: &str, found: i64, paths: &[&[u8]]) -> String {
    let mut out = format!(
        "{MAGIC}\ngeneration {gen}\nfound {found}\npaths {}\n",
        paths.len()
    );
    for p in paths.iter().take(MAX_PATHS) {
        let line = format!("path {}\n", percent(p));
        if out.len() + line.len() > MAX_BYTES {
            break;
        }
        out.push_str(&line);
    }
    out
}

/// Parse a record of generation `gen`, strictly.
fn parse(gen: &str, text: &str) -> Result<Damage> {
    let mut lines = text.lines();
    if lines.next() != Some(MAGIC) {
        bail!("not a damage record (no `{MAGIC}` line)");
    }
    let mut field = |key: &str| -> Result<String> {
        let l = lines.next().with_context(|| format!("no `{key}` line"))?;
        l.strip_prefix(key)
            .and_then(|r| r.strip_prefix(' '))
            .map(str::to_string)
            .with_context(|| format!("expected `{key} ...`, found {l:?}"))
    };
    let named = field("generation")?;
    if named != gen {
        bail!("it names generation {named:?}");
    }
    let found = field("found")?.parse().context("bad `found`")?;
    let total: u64 = field("paths")?.parse().context("bad `paths`")?;
    let mut paths = Vec::new();
    for l in lines {
        let p = l
            .strip_prefix("path ")
            .with_context(|| format!("unexpected line {l:?}"))?;
        let p = unpercent(p)?;
        if p.is_empty() || p.starts_with(b"/") || paths.len() >= MAX_PATHS {
            bail!("bad path line {l:?}");
        }
        paths.push(p);
    }
    if paths.len() as u64 > total {
        bail!("more paths than `paths {total}`");
    }
    Ok(Damage {
        gen: gen.to_string(),
        found,
        total,
        paths,
    })
}

/// Record that generation `gen` has `paths` damaged (`verify` found them):
/// written in a staging directory of its own, then renamed over any record before.
pub fn record(state: &State, gen: &str, paths: &[&[u8]]) -> Result<()> {
    let name = file_name(gen);
    let failed = || format!("cannot record {}/meta/{name}", state.path.display());
    let text = format(gen, crate::clock::now_secs(), paths);
    let stage = Stage::new(state).with_context(failed)?;
    let fd = stage.dir().create_excl(b"damaged").with_context(failed)?;
    sys::write_all(fd.as_fd(), text.as_bytes()).with_context(failed)?;
    sys::set_mode_fd(fd.as_fd(), 0o644).with_context(failed)?;
    sys::fsync(fd.as_fd()).with_context(failed)?;
    drop(fd);
    stage
        .dir()
        .rename(b"damaged", &state.meta, name.as_bytes())
        .with_context(failed)
}

/// Remove generation `gen`'s record, if any.
pub fn clear(state: &State, gen: &str) {
    let _ = state.meta.unlink(file_name(gen).as_bytes());
}

/// Generation `gen`'s record: `Ok(None)` without one, `Err` (a warning's
/// text) for one that cannot be read or parsed, which counts as none.
pub fn read(state: &State, gen: &str) -> Result<Option<Damage>> {
    let name = file_name(gen);
    let shown = format!("{}/meta/{name}", state.path.display());
    let fd = match state.meta.open_read(name.as_bytes()) {
        Ok(fd) => fd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("ignoring {shown}")),
    };
    let text = (|| -> Result<String> {
        let st = sys::fstat(fd.as_fd())?;
        if sys::kind_of(&st) != sys::StatKind::File {
            bail!("not a regular file");
        }
        if st.st_size as u64 > MAX_BYTES as u64 {
            bail!("larger than {MAX_BYTES} bytes");
        }
        let mut buf = vec![0u8; MAX_BYTES + 1];
        let mut n = 0;
        while n < buf.len() {
            match sys::read(fd.as_fd(), &mut buf[n..])? {
                0 => break,
                k => n += k,
            }
        }
        if n > MAX_BYTES {
            bail!("larger than {MAX_BYTES} bytes");
        }
        buf.truncate(n);
        String::from_utf8(buf).map_err(|_| anyhow::anyhow!("not UTF-8"))
    })();
    text.and_then(|t| parse(gen, &t))
        .map(Some)
        .with_context(|| format!("ignoring {shown}"))
}

/// Whatever `read` gives, a bad record reported through `warn` and taken for none.
pub fn read_or_warn(state: &State, gen: &str, warn: &dyn Fn(&str)) -> Option<Damage> {
    read(state, gen).unwrap_or_else(|e| {
        warn(&format!("{e:#}"));
        None
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_and_a_cut_list_covers_everything() {
        let paths: Vec<&[u8]> = vec![b"a b/c", b"d%e"];
        let text = format("g1", 7, &paths);
        let d = parse("g1", &text).unwrap();
        assert_eq!(d.paths, vec![b"a b/c".to_vec(), b"d%e".to_vec()]);
        assert!(!d.everything());
        let many: Vec<Vec<u8>> = (0..MAX_PATHS + 5)
            .map(|i| format!("p{i}").into_bytes())
            .collect();
        let refs: Vec<&[u8]> = many.iter().map(Vec::as_slice).collect();
        let d = parse("g1", &format("g1", 7, &refs)).unwrap();
        assert_eq!((d.paths.len(), d.total), (MAX_PATHS, MAX_PATHS as u64 + 5));
        assert!(d.everything());
        assert!(d.lookup().covers(b"anything"));
        let named = parse("g1", &format("g1", 7, &[b"x/y"])).unwrap().lookup();
        assert!(named.covers(b"x/y") && !named.covers(b"x") && !named.covers(b"x/y/z"));
    }

    #[test]
    fn a_bad_record_is_refused() {
        let good = format("g1", 7, &[b"x"]);
        assert!(parse("g2", &good).is_err(), "another generation's");
        for bad in [
            "",
            "packsync-damaged 2\n",
            "packsync-damaged 1\ngeneration g1\nfound x\npaths 1\n",
            "packsync-damaged 1\ngeneration g1\nfound 1\npaths 0\npath x\n",
            "packsync-damaged 1\ngeneration g1\nfound 1\npaths 1\npath /etc\n",
            "packsync-damaged 1\ngeneration g1\nfound 1\npaths 1\njunk\n",
            "packsync-damaged 1\ngeneration g1\nfound 1\npaths 1\npath %zz\n",
        ] {
            assert!(parse("g1", bad).is_err(), "{bad:?}");
        }
    }
}
