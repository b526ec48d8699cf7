//! `--semver RANGE`: which tag of an image to publish, chosen as Flux's
//! OCIRepository chooses it. Pure: no I/O.
//!
//! A tag is a version when, with one leading `v` taken off, it is a strict
//! semantic version (`MAJOR.MINOR.PATCH`, an optional `-pre.release`, no
//! leading zeros): what Flux's `version.ParseVersion` accepts. `latest`,
//! `1.2` and `sha-abc` are not versions and are never chosen.
//!
//! RANGE is a Masterminds/semver (v3) constraint, the syntax Flux takes:
//! comparisons (`=`, `!=`, `>`, `<`, `>=`, `=>`, `<=`, `=<`), `~` (`~>`),
//! `^`, wildcards (`1.x`, `1.2.*`, `*`), hyphen ranges (`1.2 - 1.4`),
//! constraints joined by spaces or commas (all must hold) and groups joined
//! by `||` (one must hold). A pre-release matches only a group that names a
//! pre-release itself. The rules below follow Masterminds' `constraints.go`
//! function by function (their check functions, ported), not Cargo's
//! `semver` crate, which reads `1.2` as `^1.2`, has no `||`, and treats
//! pre-releases otherwise.

use std::cmp::Ordering;
use std::fmt;

/// A semantic version as Masterminds compares it (build metadata ignored).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
    /// The pre-release, without its `-` (empty: a release).
    pub pre: String,
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)?;
        if !self.pre.is_empty() {
            write!(f, "-{}", self.pre)?;
        }
        Ok(())
    }
}

impl Ord for Version {
    fn cmp(&self, o: &Self) -> Ordering {
        (self.major, self.minor, self.patch)
            .cmp(&(o.major, o.minor, o.patch))
            .then_with(|| match (self.pre.is_empty(), o.pre.is_empty()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => compare_pre(&self.pre, &o.pre),
            })
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// Masterminds' `comparePrerelease`: part by part, a missing part lower,
/// numbers below words, numbers as numbers, words by their bytes.
fn compare_pre(a: &str, b: &str) -> Ordering {
    let (pa, pb): (Vec<&str>, Vec<&str>) = (a.split('.').collect(), b.split('.').collect());
    for i in 0..pa.len().max(pb.len()) {
        let (s, o) = (
            pa.get(i).copied().unwrap_or(""),
            pb.get(i).copied().unwrap_or(""),
        );
        if s == o {
            continue;
        }
        if s.is_empty() {
            return Ordering::Less;
        }
        if o.is_empty() {
            return Ordering::Greater;
        }
        return match (s.parse::<u64>(), o.parse::<u64>()) {
            (Ok(x), Ok(y)) => x.cmp(&y),
            (Ok(_), Err(_)) => Ordering::Less,
            (Err(_), Ok(_)) => Ordering::Greater,
            (Err(_), Err(_)) => s.as_bytes().cmp(o.as_bytes()),
        };
    }
    Ordering::Equal
}

fn all_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

fn ident_ok(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// Masterminds' `validatePrerelease`.
fn valid_pre(p: &str) -> bool {
    p.split('.').all(|part| {
        if all_digits(part) {
            part.len() == 1 || !part.starts_with('0')
        } else {
            ident_ok(part)
        }
    })
}

/// Masterminds' `validateMetadata`.
fn valid_meta(m: &str) -> bool {
    m.split('.').all(ident_ok)
}

/// A tag as a version: one leading `v` off, then Masterminds'
/// `StrictNewVersion`. `None` for anything else.
pub fn parse_tag(tag: &str) -> Option<Version> {
    strict(tag.strip_prefix('v').unwrap_or(tag))
}

/// Masterminds' `StrictNewVersion`.
fn strict(v: &str) -> Option<Version> {
    let mut parts = v.splitn(3, '.');
    let (major, minor, rest) = (parts.next()?, parts.next()?, parts.next()?);
    let (rest, meta) = match rest.split_once('+') {
        Some((r, m)) => (r, Some(m)),
        None => (rest, None),
    };
    if meta.is_some_and(|m| !valid_meta(m)) {
        return None;
    }
    let (patch, pre) = match rest.split_once('-') {
        Some((p, pre)) => (p, pre),
        None => (rest, ""),
    };
    if !pre.is_empty() && !valid_pre(pre) || rest.ends_with('-') && pre.is_empty() {
        return None;
    }
    let num = |s: &str| -> Option<u64> {
        if !all_digits(s) || (s.len() > 1 && s.starts_with('0')) {
            return None;
        }
        s.parse().ok()
    };
    Some(Version {
        major: num(major)?,
        minor: num(minor)?,
        patch: num(patch)?,
        pre: pre.to_string(),
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// `` or `=`: equal, or `~` where the version has wildcards.
    TildeOrEqual,
    NotEqual,
    Greater,
    Less,
    GreaterEqual,
    LessEqual,
    Tilde,
    Caret,
}

/// One comparison, as Masterminds' `constraint`.
#[derive(Clone, Debug)]
struct Constraint {
    op: Op,
    con: Version,
    /// The minor (and so the patch) was a wildcard or missing.
    minor_dirty: bool,
    /// The patch was a wildcard or missing.
    patch_dirty: bool,
    /// Any part was a wildcard or missing.
    dirty: bool,
}

/// A parsed `--semver` RANGE: groups joined by `||`, each a list of
/// constraints that must all hold, and whether the group names a
/// pre-release (then pre-releases may match it).
#[derive(Clone, Debug)]
pub struct Range {
    groups: Vec<(Vec<Constraint>, bool)>,
    text: String,
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// The longest a RANGE may be: far beyond any real one.
const MAX_RANGE: usize = 1024;

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0c)
}

/// A cursor over one `||` group.
struct Cursor<'a> {
    s: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }

    fn spaces(&mut self) -> usize {
        let from = self.at;
        while self.peek().is_some_and(is_space) {
            self.at += 1;
        }
        self.at - from
    }

    fn eat(&mut self, lit: &str) -> bool {
        if self.s[self.at..].starts_with(lit.as_bytes()) {
            self.at += lit.len();
            true
        } else {
            false
        }
    }

    fn op(&mut self) -> Op {
        // Longest first, as the alternatives of Masterminds' regex end up matching.
        for (lit, op) in [
            ("!=", Op::NotEqual),
            (">=", Op::GreaterEqual),
            ("=>", Op::GreaterEqual),
            ("<=", Op::LessEqual),
            ("=<", Op::LessEqual),
            ("~>", Op::Tilde),
            ("=", Op::TildeOrEqual),
            (">", Op::Greater),
            ("<", Op::Less),
            ("~", Op::Tilde),
            ("^", Op::Caret),
        ] {
            if self.eat(lit) {
                return op;
            }
        }
        Op::TildeOrEqual
    }

    /// `[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*`, as text.
    fn idents(&mut self) -> Option<&str> {
        let from = self.at;
        loop {
            let start = self.at;
            while self
                .peek()
                .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'-')
            {
                self.at += 1;
            }
            if self.at == start {
                return None;
            }
            if self.peek() == Some(b'.') {
                self.at += 1;
            } else {
                break;
            }
        }
        std::str::from_utf8(&self.s[from..self.at]).ok()
    }

    /// One version of a constraint (`v?`, up to three parts each a number
    /// or a wildcard, then `-pre` and `+meta`), as Masterminds'
    /// `parseConstraint` turns it into the version compared with.
    fn version(&mut self, op: Op) -> Result<Constraint, String> {
        self.eat("v");
        let mut parts: Vec<Option<u64>> = Vec::new(); // None: a wildcard
        loop {
            match self.peek() {
                Some(b'x' | b'X' | b'*') => {
                    self.at += 1;
                    parts.push(None);
                }
                Some(b) if b.is_ascii_digit() => {
                    let from = self.at;
                    while self.peek().is_some_and(|b| b.is_ascii_digit()) {
                        self.at += 1;
                    }
                    let text = std::str::from_utf8(&self.s[from..self.at]).expect("digits");
                    let n = text
                        .parse::<u64>()
                        .map_err(|_| format!("{text} is too large a number"))?;
                    parts.push(Some(n));
                }
                _ => return Err("expected a version".into()),
            }
            if parts.len() < 3
                && self.peek() == Some(b'.')
                && self
                    .s
                    .get(self.at + 1)
                    .is_some_and(|b| b.is_ascii_digit() || b"xX*".contains(b))
            {
                self.at += 1;
                continue;
            }
            break;
        }
        let pre = if self.eat("-") {
            let p = self.idents().ok_or("an empty pre-release")?.to_string();
            if !valid_pre(&p) {
                return Err(format!("{p:?} is not a pre-release"));
            }
            p
        } else {
            String::new()
        };
        if self.eat("+") {
            self.idents().ok_or("empty build metadata")?;
        }
        let part = |i: usize| parts.get(i).copied().flatten();
        let wild = |i: usize| parts.get(i).is_none_or(|p| p.is_none());
        let (con, dirty, minor_dirty, patch_dirty) = if wild(0) {
            ((0, 0, 0), true, false, false)
        } else if wild(1) {
            ((part(0).unwrap_or(0), 0, 0), true, true, false)
        } else if wild(2) {
            (
                (part(0).unwrap_or(0), part(1).unwrap_or(0), 0),
                true,
                false,
                true,
            )
        } else {
            (
                (
                    part(0).unwrap_or(0),
                    part(1).unwrap_or(0),
                    part(2).unwrap_or(0),
                ),
                false,
                false,
                false,
            )
        };
        Ok(Constraint {
            op,
            con: Version {
                major: con.0,
                minor: con.1,
                patch: con.2,
                pre,
            },
            minor_dirty,
            patch_dirty,
            dirty,
        })
    }
}

/// Parse RANGE. The error says what is wrong, for a line naming the flag.
pub fn parse_range(text: &str) -> Result<Range, String> {
    if text.len() > MAX_RANGE {
        return Err(format!("longer than {MAX_RANGE} bytes"));
    }
    if text.trim().is_empty() {
        return Err("empty".into());
    }
    let mut groups = Vec::new();
    for group in text.split("||") {
        let mut c = Cursor {
            s: group.as_bytes(),
            at: 0,
        };
        let mut list: Vec<Constraint> = Vec::new();
        c.spaces();
        loop {
            let op = c.op();
            c.spaces();
            let first = c
                .version(op)
                .map_err(|e| format!("{e} in {:?}", group.trim()))?;
            // `A - B` (spaces on both sides of the hyphen): `>= A, <= B`.
            let save = c.at;
            let spaced = c.spaces() > 0;
            if op == Op::TildeOrEqual && spaced && c.eat("-") && c.spaces() > 0 {
                let second = c
                    .version(Op::LessEqual)
                    .map_err(|e| format!("{e} in {:?}", group.trim()))?;
                list.push(Constraint {
                    op: Op::GreaterEqual,
                    ..first
                });
                list.push(second);
            } else {
                c.at = save;
                list.push(first);
            }
            let sep = c.spaces() > 0;
            if c.peek().is_none() {
                break;
            }
            let comma = c.eat(",");
            c.spaces();
            if !sep && !comma {
                return Err(format!(
                    "unexpected {:?} in {:?}",
                    &group[c.at..],
                    group.trim()
                ));
            }
            if c.peek().is_none() {
                return Err(format!("nothing after a comma in {:?}", group.trim()));
            }
        }
        let pre = list.iter().any(|c| !c.con.pre.is_empty());
        groups.push((list, pre));
    }
    Ok(Range {
        groups,
        text: text.to_string(),
    })
}

impl Range {
    /// Whether `v` satisfies the range: every constraint of one group.
    pub fn matches(&self, v: &Version) -> bool {
        self.groups
            .iter()
            .any(|(list, pre)| list.iter().all(|c| c.check(v, *pre)))
    }
}

impl Constraint {
    fn check(&self, v: &Version, include_pre: bool) -> bool {
        if !v.pre.is_empty() && !include_pre {
            return false;
        }
        let c = &self.con;
        match self.op {
            Op::TildeOrEqual if self.dirty => self.tilde(v),
            Op::TildeOrEqual => v == c,
            Op::NotEqual => self.not_equal(v),
            Op::Greater => self.greater(v),
            Op::Less => v < c,
            Op::GreaterEqual => v >= c,
            Op::LessEqual => self.less_equal(v),
            Op::Tilde => self.tilde(v),
            Op::Caret => self.caret(v),
        }
    }

    /// Masterminds' `constraintNotEqual`.
    fn not_equal(&self, v: &Version) -> bool {
        let c = &self.con;
        if self.dirty {
            if c.major != v.major {
                return true;
            }
            if c.minor != v.minor && !self.minor_dirty {
                return true;
            } else if self.minor_dirty {
                return false;
            } else if c.patch != v.patch && !self.patch_dirty {
                return true;
            } else if self.patch_dirty {
                if !v.pre.is_empty() || !c.pre.is_empty() {
                    return compare_pre(&v.pre, &c.pre) != Ordering::Equal;
                }
                return false;
            }
        }
        v != c
    }

    /// Masterminds' `constraintGreaterThan`.
    fn greater(&self, v: &Version) -> bool {
        let c = &self.con;
        if !self.dirty {
            return v > c;
        }
        if v.major > c.major {
            return true;
        } else if v.major < c.major || self.minor_dirty {
            return false;
        } else if self.patch_dirty {
            return v.minor > c.minor;
        }
        v > c
    }

    /// Masterminds' `constraintLessThanEqual`.
    fn less_equal(&self, v: &Version) -> bool {
        let c = &self.con;
        if !self.dirty {
            return v <= c;
        }
        if v.major > c.major {
            return false;
        }
        !(v.major == c.major && v.minor > c.minor && !self.minor_dirty)
    }

    /// Masterminds' `constraintTilde`.
    fn tilde(&self, v: &Version) -> bool {
        let c = &self.con;
        if v < c {
            return false;
        }
        if c.major == 0 && c.minor == 0 && c.patch == 0 && !self.minor_dirty && !self.patch_dirty {
            return true;
        }
        if v.major != c.major {
            return false;
        }
        v.minor == c.minor || self.minor_dirty
    }

    /// Masterminds' `constraintCaret`.
    fn caret(&self, v: &Version) -> bool {
        let c = &self.con;
        if v < c {
            return false;
        }
        if c.major > 0 || self.minor_dirty {
            return v.major == c.major;
        }
        if v.major > 0 {
            return false;
        }
        if c.minor > 0 || self.patch_dirty {
            return v.minor == c.minor;
        }
        if v.minor > 0 {
            return false;
        }
        c.patch == v.patch
    }
}

/// The tag `--semver` chose, and its version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chosen {
    pub tag: String,
    pub version: Version,
}

/// Why no tag was chosen: how many there were, how many were versions
/// (after the filter), and the highest few of those.
#[derive(Debug, PartialEq, Eq)]
pub struct NoMatch {
    pub tags: usize,
    pub versions: usize,
    pub highest: Vec<String>,
}

impl fmt::Display for NoMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} tag{}, {} of them version{}",
            self.tags,
            if self.tags == 1 { "" } else { "s" },
            self.versions,
            if self.versions == 1 { "" } else { "s" }
        )?;
        if !self.highest.is_empty() {
            write!(f, "; the highest: {}", self.highest.join(", "))?;
        }
        Ok(())
    }
}

/// How many of the highest versions a `NoMatch` names.
const SHOWN: usize = 5;

/// The highest tag that `filter` keeps (it matches somewhere in the tag,
/// as Flux's `filterTags`), that is a version, and that `range` matches.
/// Of versions that are equal (`1.2.3`, `v1.2.3`), the tag that sorts last.
pub fn choose<'a>(
    tags: impl IntoIterator<Item = &'a str>,
    range: &Range,
    filter: Option<&regex::bytes::Regex>,
) -> Result<Chosen, NoMatch> {
    let mut seen = 0;
    let mut versions: Vec<(Version, &str)> = Vec::new();
    for t in tags {
        seen += 1;
        if filter.is_some_and(|f| !f.is_match(t.as_bytes())) {
            continue;
        }
        if let Some(v) = parse_tag(t) {
            versions.push((v, t));
        }
    }
    let best = versions
        .iter()
        .filter(|(v, _)| range.matches(v))
        .max_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(b.1)));
    match best {
        Some((v, t)) => Ok(Chosen {
            tag: t.to_string(),
            version: v.clone(),
        }),
        None => {
            versions.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| b.1.cmp(a.1)));
            Err(NoMatch {
                tags: seen,
                versions: versions.len(),
                highest: versions
                    .iter()
                    .take(SHOWN)
                    .map(|(_, t)| t.to_string())
                    .collect(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version as a constraint test writes it: Masterminds' tests parse
    /// them with the lenient `NewVersion` (`1`, `1.4` are 1.0.0, 1.4.0).
    fn lenient(s: &str) -> Version {
        let (nums, pre) = match s.split_once('-') {
            Some((n, p)) => (n, p.to_string()),
            None => (s, String::new()),
        };
        let mut n = nums.split('.').map(|x| x.parse::<u64>().unwrap());
        Version {
            major: n.next().unwrap(),
            minor: n.next().unwrap_or(0),
            patch: n.next().unwrap_or(0),
            pre,
        }
    }

    fn check(range: &str, version: &str) -> bool {
        parse_range(range)
            .unwrap_or_else(|e| panic!("{range:?}: {e}"))
            .matches(&lenient(version))
    }

    /// Masterminds/semver v3, `constraints_test.go`, `TestConstraintsCheck`:
    /// every case, as (constraint, version, whether it matches).
    const CONSTRAINTS_CHECK: &[(&str, &str, bool)] = &[
        ("*", "1.2.3", true),
        ("~0.0.0", "1.2.3", true),
        ("0.x.x", "1.2.3", false),
        ("0.0.x", "1.2.3", false),
        ("0.0.0", "1.2.3", false),
        ("^0.0.0", "1.2.3", false),
        ("= 2.0", "1.2.3", false),
        ("= 2.0", "2.0.0", true),
        ("4.1", "4.1.0", true),
        ("4.1.x", "4.1.3", true),
        ("1.x", "1.4", true),
        ("!=4.1", "4.1.0", false),
        ("!=4.1-alpha", "4.1.0-alpha", false),
        ("!=4.1-alpha", "4.1.1-alpha", false),
        ("!=4.1-alpha", "4.1.0", true),
        ("!=4.1", "5.1.0", true),
        ("!=4.x", "5.1.0", true),
        ("!=4.x", "4.1.0", false),
        ("!=4.1.x", "4.2.0", true),
        ("!=4.2.x", "4.2.3", false),
        (">1.1", "4.1.0", true),
        (">1.1", "1.1.0", false),
        ("<1.1", "0.1.0", true),
        ("<1.1", "1.1.0", false),
        ("<1.1", "1.1.1", false),
        ("<1.x", "1.1.1", false),
        ("<1.x", "0.1.1", true),
        ("<1.x", "2.0.0", false),
        ("<1.1.x", "1.2.1", false),
        ("<1.1.x", "1.1.500", false),
        ("<1.1.x", "1.0.500", true),
        ("<1.2.x", "1.1.1", true),
        (">=1.1", "4.1.0", true),
        (">=1.1", "4.1.0-beta", false),
        (">=1.1", "1.1.0", true),
        (">=1.1", "0.0.9", false),
        ("<=1.1", "0.1.0", true),
        ("<=1.1", "0.1.0-alpha", false),
        ("<=1.1-a", "0.1.0-alpha", true),
        ("<=1.1", "1.1.0", true),
        ("<=1.x", "1.1.0", true),
        ("<=2.x", "3.0.0", false),
        ("<=1.1", "1.1.1", true),
        ("<=1.1.x", "1.2.500", false),
        ("<=4.5", "3.4.0", true),
        ("<=4.5", "3.7.0", true),
        ("<=4.5", "4.6.3", false),
        (">1.1, <2", "1.1.1", false),
        (">1.1, <2", "1.2.1", true),
        (">1.1, <3", "4.3.2", false),
        (">=1.1, <2, !=1.2.3", "1.2.3", false),
        (">1.1 <2", "1.1.1", false),
        (">1.1 <2", "1.2.1", true),
        (">1.1    <3", "4.3.2", false),
        (">=1.1    <2    !=1.2.3", "1.2.3", false),
        (">=1.1, <2, !=1.2.3 || > 3", "4.1.2", true),
        (">=1.1, <2, !=1.2.3 || > 3", "3.1.2", false),
        (">=1.1, <2, !=1.2.3 || >= 3", "3.0.0", true),
        (">=1.1, <2, !=1.2.3 || > 3", "3.0.0", false),
        (">=1.1, <2, !=1.2.3 || > 3", "1.2.3", false),
        (">=1.1 <2 !=1.2.3", "1.2.3", false),
        (">=1.1 <2 !=1.2.3 || > 3", "4.1.2", true),
        (">=1.1 <2 !=1.2.3 || > 3", "3.1.2", false),
        (">=1.1 <2 !=1.2.3 || >= 3", "3.0.0", true),
        (">=1.1 <2 !=1.2.3 || > 3", "3.0.0", false),
        (">=1.1 <2 !=1.2.3 || > 3", "1.2.3", false),
        ("> 1.1, <     2", "1.1.1", false),
        (">   1.1, <2", "1.2.1", true),
        (">1.1, <  3", "4.3.2", false),
        (">= 1.1, <     2, !=1.2.3", "1.2.3", false),
        ("> 1.1 < 2", "1.1.1", false),
        (">1.1 < 2", "1.2.1", true),
        ("> 1.1    <3", "4.3.2", false),
        (">=1.1    < 2    != 1.2.3", "1.2.3", false),
        (">= 1.1, <2, !=1.2.3 || > 3", "4.1.2", true),
        (">= 1.1, <2, != 1.2.3 || > 3", "3.1.2", false),
        (">= 1.1, <2, != 1.2.3 || >= 3", "3.0.0", true),
        (">= 1.1, <2, !=1.2.3 || > 3", "3.0.0", false),
        (">= 1.1, <2, !=1.2.3 || > 3", "1.2.3", false),
        (">= 1.1 <2 != 1.2.3", "1.2.3", false),
        (">= 1.1 <2 != 1.2.3 || > 3", "4.1.2", true),
        (">= 1.1 <2 != 1.2.3 || > 3", "3.1.2", false),
        (">= 1.1 <2 != 1.2.3 || >= 3", "3.0.0", true),
        (">= 1.1 < 2 !=1.2.3 || > 3", "3.0.0", false),
        (">=1.1 < 2 !=1.2.3 || > 3", "1.2.3", false),
        (">= 1.0.0  <= 2.0.0-beta", "1.0.1-beta", true),
        (">= 1.0.0  <= 2.0.0-beta", "1.0.1", true),
        (">= 1.0.0  <= 2.0.0-beta", "3.0.0", false),
        (">= 1.0.0  <= 2.0.0-beta || > 3", "1.0.1-beta", true),
        (">= 1.0.0  <= 2.0.0-beta || > 3", "3.0.1-beta", false),
        (
            ">= 1.0.0  <= 2.0.0-beta != 1.0.1 || > 3",
            "1.0.1-beta",
            true,
        ),
        (
            ">= 1.0.0  <= 2.0.0-beta != 1.0.1-beta || > 3",
            "1.0.1-beta",
            false,
        ),
        (">= 1.0.0-0  <= 2.0.0", "1.0.1-beta", true),
        ("1.1 - 2", "1.1.1", true),
        ("1.5.0 - 4.5", "3.7.0", true),
        ("1.1-3", "4.3.2", false),
        ("^1.1", "1.1.1", true),
        ("^1.1", "4.3.2", false),
        ("^1.x", "1.1.1", true),
        ("^2.x", "1.1.1", false),
        ("^1.x", "2.1.1", false),
        ("^1.x", "1.1.1-beta1", false),
        ("^1.1.2-alpha", "1.2.1-beta1", true),
        ("^1.2.x-alpha", "1.1.1-beta1", false),
        ("^0.0.1", "0.0.1", true),
        ("^0.0.1", "0.3.1", false),
        ("~*", "2.1.1", true),
        ("~1", "2.1.1", false),
        ("~1", "1.3.5", true),
        ("~1", "1.4", true),
        ("~1.x", "2.1.1", false),
        ("~1.x", "1.3.5", true),
        ("~1.x", "1.4", true),
        ("~1.1", "1.1.1", true),
        ("~1.1", "1.1.1-alpha", false),
        ("~1.1-alpha", "1.1.1-beta", true),
        ("~1.1.1-beta", "1.1.1-alpha", false),
        ("~1.1.1-beta", "1.1.1", true),
        ("~1.2.3", "1.2.5", true),
        ("~1.2.3", "1.2.2", false),
        ("~1.2.3", "1.3.2", false),
        ("~1.1", "1.2.3", false),
        ("~1.3", "2.4.5", false),
        ("1.0.0 - 2.0.0 <=2.0.0", "1.5.0", true),
        ("1.0.0 - 2.0.0, <=2.0.0", "1.5.0", true),
    ];

    /// Masterminds/semver v3, `constraints_test.go`, `TestConstraintCheck`
    /// (one constraint each, pre-releases included where it names one, as
    /// a whole range does): every case but the empty constraint, which
    /// `--semver` refuses.
    const CONSTRAINT_CHECK: &[(&str, &str, bool)] = &[
        ("=2.0.0", "1.2.3", false),
        ("=2.0.0", "2.0.0", true),
        ("=2.0", "1.2.3", false),
        ("=2.0", "2.0.0", true),
        ("=2.0", "2.0.1", true),
        ("4.1", "4.1.0", true),
        ("!=4.1.0", "4.1.0", false),
        ("!=4.1.0", "4.1.1", true),
        ("!=4.1", "4.1.0", false),
        ("!=4.1", "4.1.1", false),
        ("!=4.1", "5.1.0-alpha.1", false),
        ("!=4.1.0", "5.1.0-alpha.1", false),
        ("!=4.1-alpha", "4.1.0", true),
        ("!=4.1", "5.1.0", true),
        ("<11", "0.1.0", true),
        ("<11", "11.1.0", false),
        ("<1.1", "0.1.0", true),
        ("<1.1", "1.1.0", false),
        ("<1.1", "1.1.1", false),
        ("<=11", "1.2.3", true),
        ("<=11", "12.2.3", false),
        ("<=11", "11.2.3", true),
        ("<=1.1", "1.2.3", false),
        ("<=1.1", "0.1.0", true),
        ("<=1.1", "1.1.0", true),
        ("<=1.1", "1.1.1", true),
        (">1.1", "4.1.0", true),
        (">1.1", "1.1.0", false),
        (">0", "0", false),
        (">0", "1", true),
        (">0", "0.0.1-alpha", false),
        (">0.0", "0.0.1-alpha", false),
        (">0-0", "0.0.1-alpha", false),
        (">0.0-0", "0.0.1-alpha", false),
        (">0", "0.0.0-alpha", false),
        (">0-0", "0.0.0-alpha", false),
        (">0.0.0-0", "0.0.0-alpha", true),
        (">1.2.3-alpha.1", "1.2.3-alpha.2", true),
        (">1.2.3-alpha.1", "1.3.3-alpha.2", true),
        (">11", "11.1.0", false),
        (">11.1", "11.1.0", false),
        (">11.1", "11.1.1", false),
        (">11.1", "11.2.1", true),
        (">=11", "11.1.2", true),
        (">=11.1", "11.1.2", true),
        (">=11.1", "11.0.2", false),
        (">=1.1", "4.1.0", true),
        (">=1.1", "1.1.0", true),
        (">=1.1", "0.0.9", false),
        (">=0", "0.0.1-alpha", false),
        (">=0.0", "0.0.1-alpha", false),
        (">=0-0", "0.0.1-alpha", true),
        (">=0.0-0", "0.0.1-alpha", true),
        (">=0", "0.0.0-alpha", false),
        (">=0-0", "0.0.0-alpha", true),
        (">=0.0.0-0", "0.0.0-alpha", true),
        (">=0.0.0-0", "1.2.3", true),
        (">=0.0.0-0", "3.4.5-beta.1", true),
        ("<0", "0.0.0-alpha", false),
        ("<0-z", "0.0.0-alpha", true),
        (">=0", "0", true),
        ("=0", "1", false),
        ("*", "1", true),
        ("*", "4.5.6", true),
        ("*", "1.2.3-alpha.1", false),
        ("*-0", "1.2.3-alpha.1", true),
        ("2.*", "1", false),
        ("2.*", "3.4.5", false),
        ("2.*", "2.1.1", true),
        ("2.1.*", "2.1.1", true),
        ("2.1.*", "2.2.1", false),
        ("2", "1", false),
        ("2", "3.4.5", false),
        ("2", "2.1.1", true),
        ("2.1", "2.1.1", true),
        ("2.1", "2.2.1", false),
        ("~1.2.3", "1.2.4", true),
        ("~1.2.3", "1.3.4", false),
        ("~1.2", "1.2.4", true),
        ("~1.2", "1.3.4", false),
        ("~1", "1.2.4", true),
        ("~1", "2.3.4", false),
        ("~0.2.3", "0.2.5", true),
        ("~0.2.3", "0.3.5", false),
        ("~1.2.3-beta.2", "1.2.3-beta.4", true),
        ("~1.2.3-beta.2", "1.2.4-beta.2", true),
        ("~1.2.3-beta.2", "1.3.4-beta.2", false),
        ("^1.2.3", "1.8.9", true),
        ("^1.2.3", "2.8.9", false),
        ("^1.2.3", "1.2.1", false),
        ("^1.1.0", "2.1.0", false),
        ("^1.2.0", "2.2.1", false),
        ("^1.2.0", "1.2.1-alpha.1", false),
        ("^1.2.0-alpha.0", "1.2.1-alpha.1", true),
        ("^1.2.0-alpha.0", "1.2.1-alpha.0", true),
        ("^1.2.0-alpha.2", "1.2.0-alpha.1", false),
        ("^1.2", "1.8.9", true),
        ("^1.2", "2.8.9", false),
        ("^1", "1.8.9", true),
        ("^1", "2.8.9", false),
        ("^0.2.3", "0.2.5", true),
        ("^0.2.3", "0.5.6", false),
        ("^0.2", "0.2.5", true),
        ("^0.2", "0.5.6", false),
        ("^0.0.3", "0.0.3", true),
        ("^0.0.3", "0.0.4", false),
        ("^0.0", "0.0.3", true),
        ("^0.0", "0.1.4", false),
        ("^0.0", "1.0.4", false),
        ("^0", "0.2.3", true),
        ("^0", "1.1.4", false),
        ("^0.2.3-beta.2", "0.2.3-beta.4", true),
        ("^0.2.3-beta.2", "0.2.4-beta.2", true),
        ("^0.2.3-beta.2", "0.3.4-beta.2", false),
        ("^0.2.3-beta.2", "0.2.3-beta.2", true),
    ];

    #[test]
    fn masterminds_constraints_check() {
        for (range, version, want) in CONSTRAINTS_CHECK.iter().chain(CONSTRAINT_CHECK) {
            assert_eq!(check(range, version), *want, "{range:?} with {version:?}");
        }
    }

    /// Masterminds/semver v3, `constraints_test.go`, `TestNewConstraint`:
    /// which inputs parse, into how many `||` groups and how many
    /// constraints in the first.
    /// The fuzz target's invariants over every range and version pair of
    /// the tables above (versions written as tags: `1.4` is none).
    #[test]
    fn the_fuzz_invariants_hold_on_the_tables() {
        let all: Vec<&(&str, &str, bool)> =
            CONSTRAINTS_CHECK.iter().chain(CONSTRAINT_CHECK).collect();
        for (range, a, _) in &all {
            for (_, b, _) in all.iter().step_by(7) {
                crate::fuzzing::semver(range, a, b);
                crate::fuzzing::semver(range, &format!("v{a}"), b);
            }
        }
    }

    #[test]
    fn masterminds_new_constraint() {
        for (input, ors, count, err) in [
            (">= 1.1", 1, 1, false),
            (">40.50.60, < 50.70", 1, 2, false),
            ("2.0", 1, 1, false),
            ("v2.3.5-20161202202307-sha.e8fc5e5", 1, 1, false),
            ("v1.2.3-0abc", 1, 1, false),
            ("v1.2.3-beta.01", 0, 0, true),
            (">= bar", 0, 0, true),
            ("BAR >= 1.2.3", 0, 0, true),
            (">= 1.2.3 < 2.0", 1, 2, false),
            (">= 1.2.3 < 2.0 || => 3.0 < 4", 2, 2, false),
            (">= 1.2.3, < 2.0", 1, 2, false),
            (">= 1.2.3, < 2.0 || => 3.0, < 4", 2, 2, false),
            ("3 - 4 || => 3.0, < 4", 2, 2, false),
            ("12.3.4.1234", 0, 0, true),
            ("12.23.4.1234", 0, 0, true),
            ("12.3.34.1234", 0, 0, true),
            ("12.3.34 ~1.2.3", 1, 2, false),
            ("12.3.34~ 1.2.3", 0, 0, true),
            ("1.0.0 - 2.0.0, <=2.0.0", 1, 3, false),
        ] {
            match parse_range(input) {
                Ok(r) => {
                    assert!(!err, "{input:?} parsed");
                    assert_eq!(r.groups.len(), ors, "{input:?}");
                    assert_eq!(r.groups[0].0.len(), count, "{input:?}");
                }
                Err(e) => assert!(err, "{input:?}: {e}"),
            }
        }
    }

    #[test]
    fn ranges_that_are_not() {
        for bad in [
            "",
            " ",
            "latest",
            "1.0 ||",
            "|| 1.0",
            ">=1.0,",
            ">= 1.0 , ,<2",
            "1.0 -",
            ">=1 - 2",
            "~",
            "1.2.3.4",
            "1.0-",
            "1.0+",
            "1.0 & 2.0",
            "99999999999999999999999.0",
        ] {
            assert!(parse_range(bad).is_err(), "{bad:?} parsed");
        }
        assert!(parse_range(&"1".repeat(2000)).is_err());
    }

    /// Masterminds/semver v3, `version_test.go`, `TestStrictNewVersion`:
    /// which strings are strict versions (a leading `v` is refused there;
    /// `parse_tag` takes one off first, as Flux does).
    #[test]
    fn masterminds_strict_versions() {
        for (v, ok) in [
            ("1.2.3", true),
            ("1.2.3-alpha.01", false),
            ("1.2.3+test.01", true),
            ("1.2.3-alpha.-1", true),
            ("1.0", false),
            ("1", false),
            ("1.2", false),
            ("1.2.beta", false),
            ("foo", false),
            ("1.2-5", false),
            ("1.2-beta.5", false),
            ("\n1.2", false),
            ("1.2.0-x.Y.0+metadata", true),
            ("1.2.0-x.Y.0+metadata-width-hypen", true),
            ("1.2.3-rc1-with-hypen", true),
            ("1.2.3-0abc123", true),
            ("1.2.3-beta.01", false),
            ("1.2.3.4", false),
            ("1.2.2147483648", true),
            ("1.2147483648.3", true),
            ("2147483648.3.0", true),
            ("20221209-update-renovatejson-v4", false),
            ("1.1.2+.123", false),
            ("1.0.0-alpha_beta", false),
            ("1.0.0-alpha..", false),
            ("1.0.0-alpha..1", false),
            ("01.1.1", false),
            ("1.01.1", false),
            ("1.1.01", false),
            ("9.8.7+meta+meta", false),
            ("1.2.31----RC-SNAPSHOT.12.09.1--.12+788", false),
            ("1.2.3-0123", false),
            ("1.2.3-0123.0123", false),
            ("+invalid", false),
            ("-invalid", false),
            ("-invalid.01", false),
            ("alpha+beta", false),
            ("1.2.3-alpha_beta+foo", false),
        ] {
            assert_eq!(strict(v).is_some(), ok, "{v:?}");
        }
        // Flux's `version.ParseVersion`: one `v` off, then strict.
        assert_eq!(parse_tag("v1.2.3"), strict("1.2.3"));
        assert_eq!(parse_tag("vv1.2.3"), None);
        assert_eq!(parse_tag("V1.2.3"), None);
        assert_eq!(parse_tag("v1.2"), None);
        assert_eq!(parse_tag("latest"), None);
    }

    #[test]
    fn versions_order_as_semver_says() {
        let ordered = [
            "1.0.0-alpha",
            "1.0.0-alpha.1",
            "1.0.0-alpha.beta",
            "1.0.0-beta",
            "1.0.0-beta.2",
            "1.0.0-beta.11",
            "1.0.0-rc.1",
            "1.0.0",
            "1.0.1",
            "1.10.0",
            "2.0.0",
        ];
        for w in ordered.windows(2) {
            assert!(
                strict(w[0]).unwrap() < strict(w[1]).unwrap(),
                "{} < {}",
                w[0],
                w[1]
            );
        }
        // Words compare by their bytes (Masterminds, as the spec says): rc10 < rc2.
        assert!(strict("1.0.0-rc10").unwrap() < strict("1.0.0-rc2").unwrap());
    }

    fn pick(tags: &[&str], range: &str, filter: Option<&str>) -> Result<String, NoMatch> {
        let re = filter.map(|f| regex::bytes::Regex::new(f).unwrap());
        choose(
            tags.iter().copied(),
            &parse_range(range).unwrap(),
            re.as_ref(),
        )
        .map(|c| c.tag)
    }

    #[test]
    fn the_highest_matching_tag_is_chosen() {
        let tags = [
            "latest",
            "1.3.9",
            "v1.4.0",
            "1.4.2",
            "1.4.10",
            "1.5.0-rc.1",
            "2.0.0",
            "1.2",
            "sha-1",
        ];
        assert_eq!(pick(&tags, ">=1.4.0 <2.0.0", None).unwrap(), "1.4.10");
        assert_eq!(pick(&tags, "~1.4", None).unwrap(), "1.4.10");
        assert_eq!(pick(&tags, "^1.2", None).unwrap(), "1.4.10");
        assert_eq!(pick(&tags, "1.x", None).unwrap(), "1.4.10");
        assert_eq!(pick(&tags, "1.4.0", None).unwrap(), "v1.4.0");
        assert_eq!(pick(&tags, "*", None).unwrap(), "2.0.0");
        // A pre-release only where the range names one.
        assert_eq!(pick(&tags, ">=1.5.0-0 <2.0.0", None).unwrap(), "1.5.0-rc.1");
        assert_eq!(pick(&tags, ">=1.4.1 <1.4.5 || >=3", None).unwrap(), "1.4.2");
        // The filter first: only tags it matches are versions to choose from.
        assert_eq!(pick(&tags, "*", Some(r"^1\.4\.")).unwrap(), "1.4.10");
        let none = pick(&tags, ">=3", None).unwrap_err();
        assert_eq!(
            none.to_string(),
            "9 tags, 6 of them versions; the highest: 2.0.0, 1.5.0-rc.1, 1.4.10, 1.4.2, v1.4.0"
        );
        let none = pick(&tags, ">=3", Some("^nothing")).unwrap_err();
        assert_eq!(none.to_string(), "9 tags, 0 of them versions");
        // Equal versions: the tag that sorts last, whatever the order listed.
        assert_eq!(pick(&["v1.0.0", "1.0.0"], "1", None).unwrap(), "v1.0.0");
        assert_eq!(pick(&["1.0.0", "v1.0.0"], "1", None).unwrap(), "v1.0.0");
    }
}
