//! Verify: re-read a tree on the volume and compare it with what its manifest
//! says, content included. The live tree for `packsync verify`, a retained
//! generation before `rollback` publishes it, the staged tree before commit
//! with `sync --verify`.
//!
//! Reading and hashing go through `scan` (handles, no symlink followed, files
//! hashed in parallel); `compare` is pure and holds the rules. Nothing here
//! writes.

use std::collections::HashMap;

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
    let diffs = run(&fd, "staging", tree, rules)?;
    if diffs.is_empty() {
        return Ok(());
    }
    anyhow::bail!(
        "--verify: the staged tree differs from the source: {}; nothing was published",
        summarize(&diffs, 3)
    )
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
    out
}

/// Hardlinks as a compare finds them: each manifest group's inode, and
/// each shared inode's group.
#[derive(Default)]
struct Links {
    inode_of: HashMap<u32, (u64, u64)>,
    group_of: HashMap<(u64, u64), u32>,
}

fn walk(
    expected: &[Entry],
    found: &[Entry],
    prefix: &mut Vec<u8>,
    rules: Rules,
    group_hash: &HashMap<u32, [u8; 32]>,
    links: &mut Links,
    out: &mut Vec<Difference>,
) {
    let (mut i, mut j) = (0, 0);
    while i < expected.len() || j < found.len() {
        let ord = match (expected.get(i), found.get(j)) {
            (Some(e), Some(f)) => e.name.cmp(&f.name),
            (Some(_), None) => std::cmp::Ordering::Less,
            _ => std::cmp::Ordering::Greater,
        };
        let base = prefix.len();
        let name = match ord {
            std::cmp::Ordering::Greater => &found[j].name,
            _ => &expected[i].name,
        };
        if base > 0 {
            prefix.push(b'/');
        }
        prefix.extend_from_slice(name);
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
                } else {
                    match (&e.node, &f.node) {
                        (Node::File(ef), Node::File(ff)) => {
                            let want = ef
                                .hash
                                .or_else(|| ef.group.and_then(|g| group_hash.get(&g).copied()));
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
                    if let (Node::Dir(ed), Node::Dir(fd)) = (&e.node, &f.node) {
                        walk(
                            &ed.entries,
                            &fd.entries,
                            prefix,
                            rules,
                            group_hash,
                            links,
                            out,
                        );
                    }
                }
            }
        }
        prefix.truncate(base);
    }
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
}
