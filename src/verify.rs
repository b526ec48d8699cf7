//! Verify: re-read a tree on the volume and compare it with what its manifest
//! says, content included. The live tree for `packsync verify`, a retained
//! generation before `rollback` publishes it, the staged tree before commit
//! with `sync --verify`.
//!
//! Reading and hashing go through `scan` (handles, no symlink followed, files
//! hashed in parallel); `compare` is pure and holds the rules. Nothing here
//! writes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use anyhow::{Context, Result};

use crate::escape::hex;
use crate::filter::Filter;
use crate::report::Collected;
use crate::scan;
use crate::source::{Dir, Source};
use crate::sys::DirFd;
use crate::tree::{Entry, Kind, Meta, Node, Time, Tree};

/// One way the tree on disk differs from its manifest.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Difference {
    /// `modified`, `missing`, `extra`, `type changed`, `mode changed`,
    /// `mtime changed`, `owner changed`, `link changed`, `hardlink broken`,
    /// `hardlink joined`.
    pub what: &'static str,
    /// Relative to the tree's root; `.` is the root itself.
    #[serde(serialize_with = "ser_path")]
    pub path: Vec<u8>,
    /// What the manifest says, where a value helps (`0644`, a link target).
    pub expected: Option<String>,
    /// What the tree holds.
    pub found: Option<String>,
}

fn ser_path<S: serde::Serializer>(p: &[u8], s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&crate::escape::c_style(p))
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.what, crate::escape::c_style(&self.path))?;
        match (&self.expected, &self.found) {
            (Some(e), Some(x)) => write!(f, " (expected {e}, found {x})"),
            (None, Some(x)) => write!(f, " ({x})"),
            _ => Ok(()),
        }
    }
}

/// What to compare besides content, types and link targets.
#[derive(Clone, Copy, Debug)]
pub struct Rules {
    /// Owners were mirrored when the tree was made: compare uid/gid.
    pub owners: bool,
    /// The volume keeps mtimes to this many nanoseconds.
    pub granularity_ns: u64,
    /// Symlinks got their own mtime and owner (the manifest's `linkmeta`).
    pub link_meta: bool,
    /// The volume shows hardlinked names as one inode (the manifest's `hardlinks`).
    pub hardlinks: bool,
}

impl Rules {
    /// The rules a generation's manifest records.
    pub fn of(m: &crate::manifest::Manifest) -> Rules {
        Rules {
            owners: m.owners,
            granularity_ns: m.granularity_ns,
            link_meta: m.link_meta,
            hardlinks: m.hardlinks,
        }
    }
}

/// Read the tree below `root`, hash every file (in parallel) and compare it
/// with `expected`. `label` names the root in messages.
pub fn run(root: &DirFd, label: &str, expected: &Tree, rules: Rules) -> Result<Vec<Difference>> {
    let (found, seen) = read(root, label, rules.hardlinks)?;
    let mut diffs = compare(expected, &found, rules);
    // What scan skipped (a FIFO, a socket) is in no manifest: extra.
    for s in seen.take_skipped() {
        diffs.push(Difference {
            what: "extra",
            path: s.path,
            expected: None,
            found: Some(s.what),
        });
    }
    Ok(diffs)
}

/// The tree below `root` as a manifest records it: every entry, files
/// hashed (in parallel), hardlink groups by inode where `hardlinks` (the
/// volume shows them). What scan skipped (a FIFO, a socket) is in the
/// `Collected`. Also how a directory taken over at DEST gets its manifest.
pub fn read(root: &DirFd, label: &str, hardlinks: bool) -> Result<(Tree, Collected)> {
    let dir = Dir::new(
        root.try_clone().context("cannot duplicate a handle")?,
        label,
    );
    let seen = Collected::default();
    let mut found = dir.scan(0, &Filter::default(), &seen)?;
    if hardlinks {
        // Which of its files share an inode: `hardlink joined` needs it.
        found.assign_groups_by_inode();
    }
    scan::hash(&mut found, &[&dir], &|e| matches!(e.node, Node::File(_)))?;
    Ok((found, seen))
}

/// `sync --verify`: the staged tree in `out` must be the planned `tree`.
/// Fails (nothing published) with the first differences in the message.
pub fn staged(out: &DirFd, tree: &Tree, rules: Rules) -> Result<()> {
    let fd = out.reopen().context("cannot reopen the staged tree")?;
    refuse(&run(&fd, "staging", tree, rules)?)
}

/// `sync --verify` of a tree staged a directory at a time: the staged
/// tree in `out` against the manifest body the stage wrote (`body` in
/// `staging`), read back a directory at a time (`against_body`) with no
/// tree held whole. Fails as `staged` does.
pub fn staged_by_directory(out: &DirFd, staging: &DirFd, rules: Rules) -> Result<()> {
    let fd = out.reopen().context("cannot reopen the staged tree")?;
    refuse(&against_body(&fd, "staging", staging, rules)?)
}

/// The tree below `root` (named `label` in messages) against the manifest
/// body a streamed stage wrote (`body` in `staging`), indexed and compared
/// a directory at a time (`by_directory`): the differences `run` finds.
pub fn against_body(
    root: &DirFd,
    label: &str,
    staging: &DirFd,
    rules: Rules,
) -> Result<Vec<Difference>> {
    match by_body(root, label, staging, rules)? {
        Some(diffs) => Ok(diffs),
        // Hardlinks the manifest does not have: the whole walk says where.
        None => {
            let file = open_body(staging)?;
            let tree = crate::manifest::Manifest::read_body(&mut std::io::BufReader::new(file))?;
            run(root, label, &tree, rules)
        }
    }
}

/// Whether the tree below `root` holds exactly what the body a streamed
/// stage wrote records (`against_body` finds nothing), never read whole:
/// hardlinks the body does not have are a difference, not named. How a
/// writer converging on a generation of the same digest checks that
/// generation (`commit`), which is the drifted live one when a repair
/// republishes the same tree.
pub fn holds_body(root: &DirFd, label: &str, staging: &DirFd, rules: Rules) -> Result<bool> {
    Ok(by_body(root, label, staging, rules)?.is_some_and(|d| d.is_empty()))
}

/// `by_directory` against the body in `staging`.
fn by_body(
    root: &DirFd,
    label: &str,
    staging: &DirFd,
    rules: Rules,
) -> Result<Option<Vec<Difference>>> {
    let file = open_body(staging)?;
    let reread = Box::new(std::os::fd::OwnedFd::from(file.try_clone()?));
    let shown = "the staged manifest body";
    let ix = crate::index::Index::build(std::io::BufReader::new(file), reread, shown.into())?;
    by_directory(root, label, &ix, rules)
}

/// The body a streamed stage wrote in `staging`.
fn open_body(staging: &DirFd) -> Result<std::fs::File> {
    let fd = staging
        .open_read(b"body")
        .context("cannot read the staged manifest body")?;
    Ok(std::fs::File::from(fd))
}

/// What `against_manifest` found: the manifest's header, its entries and
/// bytes (as its tree would count them), and the differences.
pub struct Checked {
    pub header: crate::manifest::Manifest,
    pub entries: u64,
    pub bytes: u64,
    pub differences: Vec<Difference>,
}

/// A published generation at `root` (named `label` in messages) against
/// its manifest (`file`, named `shown`), with no tree held whole: the
/// manifest read once, indexed and checked against its digest as it goes
/// (`Index::build_each`, `manifest::LineDigest`), then the tree compared a
/// directory at a time (`by_directory`). `None` where that does not apply
/// (a manifest that does not read whole, match its digest or index, or
/// hardlinks the whole walk must name): the caller reads it whole, which
/// says why or compares, as before.
pub fn against_manifest(
    root: &DirFd,
    label: &str,
    file: std::fs::File,
    shown: &str,
) -> Result<Option<Checked>> {
    use std::io::{Seek, SeekFrom};
    let reread = Box::new(std::os::fd::OwnedFd::from(file.try_clone()?));
    let mut file = file;
    if file.seek(SeekFrom::Start(0)).is_err() {
        return Ok(None);
    }
    let mut r = std::io::BufReader::with_capacity(256 * 1024, file);
    let Ok(header) = crate::manifest::Manifest::read_header(&mut r) else {
        return Ok(None);
    };
    let mut digest = crate::manifest::LineDigest::default();
    let mut each = |path: &[u8], e: &crate::tree::Entry| {
        digest.entry(path, e);
    };
    let Ok(ix) = crate::index::Index::build_each(r, reread, shown.to_string(), &mut each) else {
        return Ok(None);
    };
    if !digest.matches(&header) {
        return Ok(None);
    }
    let rules = Rules::of(&header);
    Ok(
        by_directory(root, label, &ix, rules)?.map(|differences| Checked {
            entries: ix.entries,
            bytes: ix.bytes,
            header,
            differences,
        }),
    )
}

/// Fail with the first differences, nothing published.
fn refuse(diffs: &[Difference]) -> Result<()> {
    if diffs.is_empty() {
        return Ok(());
    }
    anyhow::bail!(
        "--verify: the staged tree differs from the source: {}; nothing was published",
        summarize(diffs, 3)
    )
}

/// The tree below `root` (named `label` in messages) compared with the
/// manifest `ix` indexes, a directory at a time in parallel, every file
/// hashed: the differences `run` finds, in the order it gives them.
/// `None` where files share an inode the manifest has apart, or a group is
/// split (`hardlink joined`, `hardlink broken`): which path of such a set
/// the whole walk names depends on its order, so it is left to `run`.
pub fn by_directory(
    root: &DirFd,
    label: &str,
    ix: &crate::index::Index,
    rules: Rules,
) -> Result<Option<Vec<Difference>>> {
    let st = root
        .fstat()
        .with_context(|| format!("cannot stat {label}"))?;
    let mut first = Vec::new();
    meta_diffs(
        b".",
        Kind::Dir,
        &ix.root,
        &crate::tree::meta_of(&st, 0),
        rules,
        &mut first,
    );
    let v = Checking {
        label,
        ix,
        rules,
        seen: Collected::default(),
        links: Mutex::new(Links::default()),
        diffs: Mutex::new(Vec::new()),
        apart: Mutex::new(crate::distinct::Distinct::default()),
        grouped: Mutex::new(HashMap::new()),
        shared: AtomicBool::new(false),
    };
    crate::walk::run(&v, &[], &[], &root.try_clone()?)?;
    if v.shared.load(Ordering::Relaxed) {
        return Ok(None);
    }
    let mut apart = v.apart.into_inner().unwrap();
    for inode in v.grouped.into_inner().unwrap().into_keys() {
        apart.insert(scan::inode_key(inode.0, inode.1));
    }
    if !apart.all_distinct() {
        return Ok(None);
    }
    let mut diffs = v.diffs.into_inner().unwrap();
    if diffs.iter().any(|d| d.what == "hardlink broken") {
        return Ok(None);
    }
    first.append(&mut diffs);
    in_walk_order(&mut first);
    // What the listing skipped (a FIFO, a socket) is in no manifest: extra.
    for s in v.seen.take_skipped() {
        first.push(Difference {
            what: "extra",
            path: s.path,
            expected: None,
            found: Some(s.what),
        });
    }
    Ok(Some(first))
}

/// One `by_directory` walk, shared by its threads.
struct Checking<'a> {
    label: &'a str,
    ix: &'a crate::index::Index,
    rules: Rules,
    /// What the listings skipped.
    seen: Collected,
    links: Mutex<Links>,
    diffs: Mutex<Vec<Difference>>,
    /// The inodes of files found whose manifest entry is in no group (and
    /// of extra files): none may be two paths'.
    apart: Mutex<crate::distinct::Distinct>,
    /// The inode of each group's files, by inode.
    grouped: Mutex<HashMap<(u64, u64), u32>>,
    /// An inode holds two groups' files: the walk stops.
    shared: AtomicBool,
}

impl crate::walk::Visit for Checking<'_> {
    type Dir = DirFd;
    type Keep = ();

    fn visit(
        &self,
        _: &[Option<&DirFd>],
        dir: &DirFd,
        rel: &[u8],
    ) -> Result<crate::walk::Visited<()>> {
        use rayon::prelude::*;
        let mut found = Dir::list(dir, rel, self.label, 0, &Filter::default(), &self.seen)?;
        found.par_iter_mut().try_for_each(|e| -> Result<()> {
            let size = e.meta.size;
            let Node::File(f) = &mut e.node else {
                return Ok(());
            };
            let path = crate::tree::join(rel, &e.name);
            let shown = || crate::escape::display(self.label, &path);
            f.hash = Some(scan::digest(dir.open_read(&e.name), size, &shown)?);
            Ok(())
        })?;
        let expected = self.ix.entries(rel)?;
        let mut out = Vec::new();
        let both = {
            let mut links = self.links.lock().unwrap();
            let want = |f: &crate::tree::File| f.hash;
            level(
                &expected, &found, rel, self.rules, &want, &mut links, &mut out,
            )
        };
        if self.rules.hardlinks {
            let mut recorded = vec![None; found.len()];
            for &(i, j) in &both {
                if let Node::File(ef) = &expected[i].node {
                    recorded[j] = ef.group;
                }
            }
            let mut keys = Vec::new();
            let mut grouped = self.grouped.lock().unwrap();
            for (e, g) in found.iter().zip(recorded) {
                let Node::File(f) = &e.node else { continue };
                match g {
                    None => keys.push(scan::inode_key(f.dev, f.ino)),
                    Some(g) => {
                        if *grouped.entry((f.dev, f.ino)).or_insert(g) != g {
                            self.shared.store(true, Ordering::Relaxed);
                        }
                    }
                }
            }
            drop(grouped);
            let mut apart = self.apart.lock().unwrap();
            keys.into_iter().for_each(|k| apart.insert(k));
            if apart.seen_twice() {
                self.shared.store(true, Ordering::Relaxed);
            }
        }
        if !out.is_empty() {
            self.diffs.lock().unwrap().append(&mut out);
        }
        let subs = both
            .into_iter()
            .filter(|&(_, j)| matches!(found[j].node, Node::Dir(_)))
            .map(|(_, j)| crate::walk::Sub {
                name: found[j].name.clone(),
                srcs: 0,
                keep: (),
            })
            .collect();
        Ok((0, subs))
    }

    fn enter(&self, dir: &DirFd, _: &(), name: &[u8], path: &[u8]) -> Result<DirFd> {
        crate::walk::open_sub(dir, name, self.label, path)
    }

    fn stopped(&self) -> bool {
        self.shared.load(Ordering::Relaxed)
    }
}

/// The first `n` differences on one line, and how many more.
pub fn summarize(diffs: &[Difference], n: usize) -> String {
    let mut s = diffs
        .iter()
        .take(n)
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if diffs.len() > n {
        s.push_str(&format!(" and {} more", diffs.len() - n));
    }
    s
}

fn fmt_time(t: Time) -> String {
    let s = t.decimal();
    match s.contains('.') {
        true => s,
        false => format!("{s}.000000000"),
    }
}

/// Compare `found` (scanned and hashed) with `expected` (a manifest's tree).
/// Pure. A missing or extra directory is one difference, not one per child.
pub fn compare(expected: &Tree, found: &Tree, rules: Rules) -> Vec<Difference> {
    let mut out = Vec::new();
    // Hardlink followers carry no hash in a manifest: their leader's applies.
    let mut group_hash: HashMap<u32, [u8; 32]> = HashMap::new();
    expected.for_each(&mut |_, e| {
        if let Node::File(f) = &e.node {
            if let (Some(g), Some(h)) = (f.group, f.hash) {
                group_hash.entry(g).or_insert(h);
            }
        }
    });
    meta_diffs(
        b".",
        Kind::Dir,
        &expected.root,
        &found.root,
        rules,
        &mut out,
    );
    let mut links = Links::default();
    walk(
        &expected.entries,
        &found.entries,
        &mut Vec::new(),
        rules,
        &group_hash,
        &mut links,
        &mut out,
    );
    in_walk_order(&mut out);
    out
}

/// Differences in the order of a walk in pre-order (the root's first, each
/// directory's before its children's, names in byte order), each path's
/// in the order they were found: how they are shown, however the
/// directories were compared.
fn in_walk_order(diffs: &mut [Difference]) {
    diffs.sort_by(|a, b| {
        let root = |d: &Difference| d.path != b".";
        root(a)
            .cmp(&root(b))
            .then_with(|| crate::manifest::cmp_preorder(&a.path, &b.path))
    });
}

/// Hardlinks as a compare finds them: each manifest group's inode, and
/// each shared inode's group.
#[derive(Default)]
struct Links {
    inode_of: HashMap<u32, (u64, u64)>,
    group_of: HashMap<(u64, u64), u32>,
}

/// The whole trees compared: `level` at every directory, folded.
fn walk(
    expected: &[Entry],
    found: &[Entry],
    prefix: &mut Vec<u8>,
    rules: Rules,
    group_hash: &HashMap<u32, [u8; 32]>,
    links: &mut Links,
    out: &mut Vec<Difference>,
) {
    let want = |f: &crate::tree::File| {
        f.hash
            .or_else(|| f.group.and_then(|g| group_hash.get(&g).copied()))
    };
    for (i, j) in level(expected, found, prefix, rules, &want, links, out) {
        if let (Node::Dir(ed), Node::Dir(fd)) = (&expected[i].node, &found[j].node) {
            let base = prefix.len();
            if base > 0 {
                prefix.push(b'/');
            }
            prefix.extend_from_slice(&expected[i].name);
            walk(
                &ed.entries,
                &fd.entries,
                prefix,
                rules,
                group_hash,
                links,
                out,
            );
            prefix.truncate(base);
        }
    }
}

/// Compare one directory: the entries its manifest records (`expected`)
/// with those found (`found`, files hashed), both in name order, at
/// `prefix` (empty at the root), their children aside. Appends each
/// difference to `out`, in name order, as the whole walk gives them; a
/// missing or extra entry is one difference, with nothing below it.
/// `want`: the hash a recorded file must have. Returns the (expected,
/// found) index of every name of one kind on both sides: their children
/// are compared next.
fn level(
    expected: &[Entry],
    found: &[Entry],
    prefix: &[u8],
    rules: Rules,
    want: &dyn Fn(&crate::tree::File) -> Option<[u8; 32]>,
    links: &mut Links,
    out: &mut Vec<Difference>,
) -> Vec<(usize, usize)> {
    let mut both = Vec::new();
    let mut path = prefix.to_vec();
    let base = path.len();
    let (mut i, mut j) = (0, 0);
    while i < expected.len() || j < found.len() {
        let ord = match (expected.get(i), found.get(j)) {
            (Some(e), Some(f)) => e.name.cmp(&f.name),
            (Some(_), None) => std::cmp::Ordering::Less,
            _ => std::cmp::Ordering::Greater,
        };
        let name = match ord {
            std::cmp::Ordering::Greater => &found[j].name,
            _ => &expected[i].name,
        };
        path.truncate(base);
        if base > 0 {
            path.push(b'/');
        }
        path.extend_from_slice(name);
        let prefix = &path;
        let diff = |what: &'static str, exp: Option<String>, got: Option<String>| Difference {
            what,
            path: prefix.clone(),
            expected: exp,
            found: got,
        };
        match ord {
            std::cmp::Ordering::Less => {
                out.push(diff("missing", None, None));
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                out.push(diff("extra", None, None));
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                let (e, f) = (&expected[i], &found[j]);
                i += 1;
                j += 1;
                if e.kind() != f.kind() {
                    out.push(diff(
                        "type changed",
                        Some(kind_name(e.kind()).into()),
                        Some(kind_name(f.kind()).into()),
                    ));
                    continue;
                }
                both.push((i - 1, j - 1));
                match (&e.node, &f.node) {
                    (Node::File(ef), Node::File(ff)) => {
                        let want = want(ef);
                        if e.meta.size != f.meta.size {
                            out.push(diff(
                                "modified",
                                Some(format!("{} bytes", e.meta.size)),
                                Some(format!("{} bytes", f.meta.size)),
                            ));
                        } else if want.is_some() && want != ff.hash {
                            out.push(diff(
                                "modified",
                                want.map(|h| format!("sha256 {}", &hex(&h)[..12])),
                                ff.hash.map(|h| format!("sha256 {}", &hex(&h)[..12])),
                            ));
                        }
                        if let Some(g) = ef.group.filter(|_| rules.hardlinks) {
                            let here = (ff.dev, ff.ino);
                            if *links.inode_of.entry(g).or_insert(here) != here {
                                out.push(diff("hardlink broken", None, None));
                            }
                        }
                        // Sharing an inode with another path of the tree
                        // that the manifest has apart (or in another group).
                        if rules.hardlinks && ff.group.is_some() {
                            let here = (ff.dev, ff.ino);
                            let joined = match ef.group {
                                None => true,
                                Some(g) => *links.group_of.entry(here).or_insert(g) != g,
                            };
                            if joined {
                                out.push(diff("hardlink joined", None, None));
                            }
                        }
                    }
                    (Node::Symlink(a), Node::Symlink(b)) if a != b => out.push(diff(
                        "link changed",
                        Some(crate::escape::c_style(a)),
                        Some(crate::escape::c_style(b)),
                    )),
                    _ => {}
                }
                meta_diffs(prefix, e.kind(), &e.meta, &f.meta, rules, out);
            }
        }
    }
    both
}

fn meta_diffs(
    path: &[u8],
    kind: Kind,
    e: &Meta,
    f: &Meta,
    rules: Rules,
    out: &mut Vec<Difference>,
) {
    let diff = |what, exp, got| Difference {
        what,
        path: path.to_vec(),
        expected: Some(exp),
        found: Some(got),
    };
    if kind == Kind::Symlink && !rules.link_meta {
        return; // never set, so never compared (FUSE would have set the target's)
    }
    if kind != Kind::Symlink && e.mode != f.mode {
        out.push(diff(
            "mode changed",
            format!("{:04o}", e.mode),
            format!("{:04o}", f.mode),
        ));
    }
    if rules.owners && (e.uid, e.gid) != (f.uid, f.gid) {
        out.push(diff(
            "owner changed",
            format!("{}:{}", e.uid, e.gid),
            format!("{}:{}", f.uid, f.gid),
        ));
    }
    if !crate::plan::mtime_eq(e.mtime, f.mtime, rules.granularity_ns) {
        out.push(diff("mtime changed", fmt_time(e.mtime), fmt_time(f.mtime)));
    }
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::File => "file",
        Kind::Dir => "directory",
        Kind::Symlink => "symlink",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::{Dir, File};

    fn meta(mode: u32, size: u64) -> Meta {
        Meta {
            mode,
            uid: 1,
            gid: 1,
            size,
            mtime: (100, 5).into(),
            xattrs: Default::default(),
        }
    }

    fn file(name: &str, size: u64, hash: u8, group: Option<u32>, ino: u64) -> Entry {
        Entry {
            name: name.as_bytes().into(),
            meta: meta(0o644, size),
            node: Node::File(File {
                hash: Some([hash; 32]),
                group,
                ino,
                ..Default::default()
            }),
        }
    }

    fn tree(entries: Vec<Entry>) -> Tree {
        Tree {
            root: meta(0o755, 0),
            root_srcs: 1,
            entries,
        }
    }

    const RULES: Rules = Rules {
        owners: true,
        granularity_ns: 1,
        link_meta: true,
        hardlinks: true,
    };

    fn whats(d: &[Difference]) -> Vec<String> {
        d.iter()
            .map(|d| format!("{} {}", d.what, String::from_utf8_lossy(&d.path)))
            .collect()
    }

    #[test]
    fn identical_trees_have_no_differences() {
        let t = tree(vec![
            file("a", 3, 1, None, 1),
            Entry {
                name: b"d".as_slice().into(),
                meta: meta(0o755, 0),
                node: Node::Dir(Dir {
                    srcs: 1,
                    entries: vec![file("b", 3, 2, None, 2)],
                }),
            },
        ]);
        assert!(compare(&t, &t, RULES).is_empty());
    }

    #[test]
    fn each_kind_of_drift_is_named_with_its_path() {
        let expected = tree(vec![
            file("content", 3, 1, None, 1),
            file("gone", 3, 1, None, 2),
            file("mode", 3, 1, None, 3),
            file("size", 3, 1, None, 4),
            Entry {
                name: b"sym".as_slice().into(),
                meta: Meta {
                    mode: 0o777,
                    ..meta(0o777, 1)
                },
                node: Node::Symlink(b"a".as_slice().into()),
            },
        ]);
        let mut found = expected.clone();
        found.entries.remove(1); // gone
        if let Node::File(f) = &mut found.entries[0].node {
            f.hash = Some([9; 32]);
        }
        found.entries[1].meta.mode = 0o600;
        found.entries[1].meta.uid = 0;
        found.entries[1].meta.mtime = (101, 0).into();
        found.entries[2].meta.size = 4;
        found.entries[3].node = Node::Symlink(b"b".as_slice().into());
        found.entries.push(file("zz-extra", 1, 1, None, 9));
        found.root.mode = 0o700;
        let d = compare(&expected, &found, RULES);
        assert_eq!(
            whats(&d),
            vec![
                "mode changed .",
                "modified content",
                "missing gone",
                "mode changed mode",
                "owner changed mode",
                "mtime changed mode",
                "modified size",
                "link changed sym",
                "extra zz-extra",
            ]
        );
        assert_eq!(d[3].expected.as_deref(), Some("0644"));
        assert_eq!(d[3].found.as_deref(), Some("0600"));
    }

    #[test]
    fn owners_and_mtime_granularity_follow_the_rules() {
        let mut expected = tree(vec![file("a", 3, 1, None, 1)]);
        expected.entries[0].meta.mtime = (100, 900).into();
        let mut found = expected.clone();
        found.entries[0].meta.uid = 7;
        // What a volume keeping microseconds stores of 100.000000900 s (and
        // of the root's 100.000000005 s).
        found.entries[0].meta.mtime = (100, 0).into();
        found.root.mtime = (100, 0).into();
        let coarse = Rules {
            owners: false,
            granularity_ns: 1000,
            ..RULES
        };
        assert!(compare(&expected, &found, coarse).is_empty());
        // Exact rules: the owner, the file's mtime and the root's mtime.
        assert_eq!(compare(&expected, &found, RULES).len(), 3);
    }

    #[test]
    fn names_on_one_inode_the_manifest_has_apart_are_joined() {
        // a, b apart; c, d one group; e, f another.
        let expected = tree(vec![
            file("a", 3, 1, None, 0),
            file("b", 3, 1, None, 0),
            file("c", 3, 1, Some(0), 0),
            file("d", 3, 1, Some(0), 0),
            file("e", 3, 1, Some(1), 0),
            file("f", 3, 1, Some(1), 0),
        ]);
        let found_with = |inodes: [u64; 6]| {
            let names = ["a", "b", "c", "d", "e", "f"];
            let mut t = tree(
                names
                    .iter()
                    .zip(inodes)
                    .map(|(n, i)| file(n, 3, 1, None, i))
                    .collect(),
            );
            t.assign_groups_by_inode(); // as `run` does with what it scanned
            whats(&compare(&expected, &t, RULES))
        };
        assert!(found_with([1, 2, 3, 3, 4, 4]).is_empty());
        // a and b joined.
        assert_eq!(
            found_with([1, 1, 3, 3, 4, 4]),
            ["hardlink joined a", "hardlink joined b"]
        );
        // One of the apart ones joined to a group.
        assert_eq!(found_with([1, 3, 3, 3, 4, 4]), ["hardlink joined b"]);
        // The two groups on one inode.
        assert_eq!(
            found_with([1, 2, 3, 3, 3, 3]),
            ["hardlink joined e", "hardlink joined f"]
        );
        // Not looked for where the volume does not show links.
        let no_links = Rules {
            hardlinks: false,
            ..RULES
        };
        let mut t = tree(vec![file("a", 3, 1, None, 1), file("b", 3, 1, None, 1)]);
        t.assign_groups_by_inode();
        let apart = tree(vec![file("a", 3, 1, None, 0), file("b", 3, 1, None, 0)]);
        assert!(compare(&apart, &t, no_links).is_empty());
    }

    #[test]
    fn hardlink_followers_use_the_leaders_hash_and_must_share_its_inode() {
        let mut follower = file("b", 3, 0, Some(0), 1);
        if let Node::File(f) = &mut follower.node {
            f.hash = None;
        }
        let expected = tree(vec![file("a", 3, 1, Some(0), 1), follower.clone()]);
        let mut found = tree(vec![
            file("a", 3, 1, Some(0), 1),
            file("b", 3, 1, Some(0), 1),
        ]);
        assert!(compare(&expected, &found, RULES).is_empty());
        // Same content, but a copy instead of a link.
        found.entries[1] = file("b", 3, 1, None, 2);
        assert_eq!(
            whats(&compare(&expected, &found, RULES)),
            vec!["hardlink broken b"]
        );
        // Different content in the follower.
        found.entries[1] = file("b", 3, 7, None, 1);
        assert_eq!(
            whats(&compare(&expected, &found, RULES)),
            vec!["modified b"]
        );
        // A volume that shows links as separate inodes (sshfs): not compared.
        found.entries[1] = file("b", 3, 1, None, 2);
        let no_links = Rules {
            hardlinks: false,
            ..RULES
        };
        assert!(compare(&expected, &found, no_links).is_empty());
    }

    #[test]
    fn a_missing_directory_is_one_difference() {
        let expected = tree(vec![Entry {
            name: b"d".as_slice().into(),
            meta: meta(0o755, 0),
            node: Node::Dir(Dir {
                srcs: 1,
                entries: vec![file("x", 1, 1, None, 1), file("y", 1, 1, None, 2)],
            }),
        }]);
        let found = tree(vec![]);
        assert_eq!(whats(&compare(&expected, &found, RULES)), vec!["missing d"]);
    }

    /// The manifest `expected` would be, indexed as a streamed stage's body is.
    fn index_of(expected: Tree) -> (tempfile::TempDir, crate::index::Index) {
        use crate::manifest::Manifest;
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("m");
        let mut m = Manifest {
            tree: expected,
            ..Manifest::default()
        };
        let mut out = Vec::new();
        m.write(&mut out).unwrap();
        std::fs::write(&path, &out).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let mut r = std::io::BufReader::new(f.try_clone().unwrap());
        Manifest::read_header(&mut r).unwrap();
        let fd = std::os::fd::OwnedFd::from(f);
        let ix = crate::index::Index::build(r, Box::new(fd), "m".into()).unwrap();
        (tmp, ix)
    }

    #[test]
    fn a_directory_at_a_time_finds_what_the_whole_walk_finds_in_its_order() {
        use std::fs;
        use std::os::unix::fs::PermissionsExt;
        let rules = Rules {
            owners: false,
            granularity_ns: 1,
            link_meta: true,
            hardlinks: true,
        };
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        for (p, body) in [
            ("d/a", "aaa"),
            ("d/b", "bbb"),
            ("e/f", "f"),
            ("deep/er/x", "x"),
            ("g-h", "g"),
            ("g/i", "i"),
        ] {
            fs::create_dir_all(t.join(p).parent().unwrap()).unwrap();
            fs::write(t.join(p), body).unwrap();
        }
        fs::hard_link(t.join("d/a"), t.join("d/a2")).unwrap();
        std::os::unix::fs::symlink("d/a", t.join("s")).unwrap();
        let root = DirFd::open_path(t).unwrap();
        let (expected, _) = read(&root, "t", true).unwrap();
        let (_keep, ix) = index_of(expected.clone());
        assert_eq!(by_directory(&root, "t", &ix, rules).unwrap(), Some(vec![]));

        // Content, kind, mode and presence changed in several directories.
        let keep = fs::metadata(t.join("d/b")).unwrap().modified().unwrap();
        fs::write(t.join("d/b"), "BBB").unwrap();
        fs::File::options()
            .write(true)
            .open(t.join("d/b"))
            .unwrap()
            .set_modified(keep)
            .unwrap();
        fs::remove_file(t.join("e/f")).unwrap();
        fs::create_dir(t.join("e/f")).unwrap();
        fs::set_permissions(t.join("deep/er/x"), fs::Permissions::from_mode(0o600)).unwrap();
        fs::remove_dir_all(t.join("g")).unwrap();
        fs::write(t.join("extra"), "new").unwrap();
        let whole = run(&root, "t", &expected, rules).unwrap();
        assert!(whole.len() >= 5, "{whole:?}");
        assert_eq!(by_directory(&root, "t", &ix, rules).unwrap(), Some(whole));

        // Two paths the manifest has apart now share an inode, a group is
        // split: left to the whole walk, which names the paths.
        fs::remove_file(t.join("g-h")).unwrap();
        fs::hard_link(t.join("extra"), t.join("g-h")).unwrap();
        assert_eq!(by_directory(&root, "t", &ix, rules).unwrap(), None);
        fs::remove_file(t.join("g-h")).unwrap();
        fs::write(t.join("g-h"), "g").unwrap();
        fs::remove_file(t.join("d/a2")).unwrap();
        fs::write(t.join("d/a2"), "aaa").unwrap();
        assert_eq!(by_directory(&root, "t", &ix, rules).unwrap(), None);
        let whole = run(&root, "t", &expected, rules).unwrap();
        assert!(
            whole.iter().any(|d| d.what == "hardlink broken"),
            "{whole:?}"
        );
    }
}
