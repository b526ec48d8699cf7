//! `--label`: the version a generation records, and the ordering that keeps
//! an old replica from putting an older tree back over a newer live one.
//! Pure: no I/O.
//!
//! A version is an optional `v`, dot-separated numbers (`1.10`, `2024.05.01`;
//! missing numbers count as 0, so `1.2` equals `1.2.0`), then optionally a
//! pre-release after `-` or directly after the numbers (`1.2.0-rc1`,
//! `1.2.0rc1`), then optionally `+build` (ignored). Ordering is semver's,
//! with the numbers inside pre-release identifiers compared as numbers
//! (`rc2 < rc10`): `v1.9 < v1.10`, `1.2.0-rc1 < 1.2.0`, `1.2.0-alpha < 1.2.0-beta`.

use std::cmp::Ordering;

/// `--label TEXT`: the text a generation records, and the version it
/// orders by (`None` with `--allow-downgrade`: nothing is compared).
#[derive(Clone, Debug)]
pub struct Label {
    pub text: String,
    pub version: Option<Version>,
    /// The tag `--semver` chose, standing in for a `--label` not given.
    pub from_tag: bool,
}

/// A parsed version label.
#[derive(Clone, Debug)]
pub struct Version {
    release: Vec<u64>,
    pre: Vec<String>,
}

/// Parse a label as a version; `None` if it is not one.
pub fn parse(label: &str) -> Option<Version> {
    let s = label.strip_prefix(['v', 'V']).unwrap_or(label);
    let s = match s.split_once('+') {
        Some((v, build)) if !build.is_empty() && build.bytes().all(ident_byte_or_dot) => v,
        Some(_) => return None,
        None => s,
    };
    let end = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (nums, rest) = s.split_at(end);
    let mut release = Vec::new();
    for part in nums.split('.') {
        // Leading-zero parts are fine (`2024.05.01`); empty ones are not.
        release.push(part.parse::<u64>().ok()?);
    }
    let pre_text = if let Some(p) = rest.strip_prefix('-') {
        p
    } else if rest.starts_with(|c: char| c.is_ascii_alphabetic()) {
        rest
    } else if rest.is_empty() {
        ""
    } else {
        return None;
    };
    if !rest.is_empty() && pre_text.is_empty() {
        return None; // `1.2-`
    }
    let mut pre = Vec::new();
    if !pre_text.is_empty() {
        for ident in pre_text.split(['.', '-']) {
            if ident.is_empty() || !ident.bytes().all(|b| b.is_ascii_alphanumeric()) {
                return None;
            }
            pre.push(ident.to_string());
        }
    }
    Some(Version { release, pre })
}

fn ident_byte_or_dot(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'.' || b == b'-'
}

impl PartialEq for Version {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Version {}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        let n = self.release.len().max(other.release.len());
        for i in 0..n {
            let a = self.release.get(i).copied().unwrap_or(0);
            let b = other.release.get(i).copied().unwrap_or(0);
            match a.cmp(&b) {
                Ordering::Equal => {}
                o => return o,
            }
        }
        // A pre-release orders before its release.
        match (self.pre.is_empty(), other.pre.is_empty()) {
            (true, true) => return Ordering::Equal,
            (true, false) => return Ordering::Greater,
            (false, true) => return Ordering::Less,
            _ => {}
        }
        for (a, b) in self.pre.iter().zip(&other.pre) {
            match ident_cmp(a, b) {
                Ordering::Equal => {}
                o => return o,
            }
        }
        self.pre.len().cmp(&other.pre.len())
    }
}

/// Semver's identifier order (numbers before words), with natural order
/// inside words: runs of digits compare as numbers.
fn ident_cmp(a: &str, b: &str) -> Ordering {
    let num = |s: &str| s.bytes().all(|c| c.is_ascii_digit());
    match (num(a), num(b)) {
        (true, true) => cmp_digits(a, b),
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        (false, false) => natural(a, b),
    }
}

fn cmp_digits(a: &str, b: &str) -> Ordering {
    let a = a.trim_start_matches('0');
    let b = b.trim_start_matches('0');
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

fn natural(a: &str, b: &str) -> Ordering {
    let runs = |s: &str| -> Vec<(bool, String)> {
        let mut out: Vec<(bool, String)> = Vec::new();
        for c in s.chars() {
            let d = c.is_ascii_digit();
            match out.last_mut() {
                Some((ld, run)) if *ld == d => run.push(c),
                _ => out.push((d, c.to_string())),
            }
        }
        out
    };
    let (ra, rb) = (runs(a), runs(b));
    for ((da, x), (db, y)) in ra.iter().zip(&rb) {
        let o = match (da, db) {
            (true, true) => cmp_digits(x, y),
            _ => x.cmp(y),
        };
        if o != Ordering::Equal {
            return o;
        }
    }
    ra.len().cmp(&rb.len())
}

/// Why a sync with `new` may not replace a live generation labelled `live`.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Go ahead.
    Allowed,
    /// `new` orders below `live`.
    Downgrade,
    /// `live` is not a version, so `new` cannot be shown not to be older.
    Unordered,
}

/// The downgrade guard: only a sync that names a `--label` is checked, and
/// only against a live generation that has one.
pub fn check(new: Option<&Version>, live: Option<&str>) -> Verdict {
    let (Some(new), Some(live)) = (new, live) else {
        return Verdict::Allowed;
    };
    match parse(live) {
        Some(l) if *new < l => Verdict::Downgrade,
        Some(_) => Verdict::Allowed,
        None => Verdict::Unordered,
    }
}

/// Refuse (exit 3) a sync whose `--label` (`new`) would replace a newer
/// live generation, or a live one whose label cannot be ordered.
pub fn guard(
    dest: &str,
    new: Option<&Label>,
    live_gen: Option<&str>,
    live_label: Option<&str>,
) -> anyhow::Result<()> {
    let gen = live_gen.unwrap_or("-");
    let live = live_label.unwrap_or("");
    let new_label = new.map_or("", |l| l.text.as_str());
    match check(new.and_then(|l| l.version.as_ref()), live_label) {
        Verdict::Allowed => Ok(()),
        Verdict::Downgrade => Err(crate::error::refused(format!(
            "{dest}: refusing to replace live generation {gen} labelled {live} with older {new_label} \
             (pass --allow-downgrade if that is intended)"
        ))),
        Verdict::Unordered => Err(crate::error::refused(format!(
            "{dest}: live generation {gen} is labelled {live:?}, which is not a version, so \
             {new_label} cannot be shown to be newer (pass --allow-downgrade to replace it)"
        ))),
    }
}

/// What a sync that passed the guard should still say, when it is about
/// to publish a new generation (`changes`) over a labelled live one: a sync
/// without `--label` turns the guard off for every later sync (an unlabelled
/// live generation is replaced by any label), and the live label on other
/// content means a replica of either content replaces the other unchecked
/// (the label was not bumped).
pub fn warnings(
    dest: &str,
    new: Option<&Label>,
    live_gen: Option<&str>,
    live_label: Option<&str>,
    changes: bool,
) -> Vec<String> {
    let (true, Some(live)) = (changes, live_label) else {
        return Vec::new();
    };
    let gen = live_gen.unwrap_or("-");
    match new {
        None => vec![format!(
            "{dest}: replacing live generation {gen} labelled {live} with an unlabelled one: \
             the downgrade guard is off until a sync names a --label again"
        )],
        Some(n) if n.text == live || parse(&n.text).is_some_and(|v| Some(v) == parse(live)) => {
            vec![format!(
                "{dest}: live generation {gen} is labelled {live} too, but its content differs: \
                 bump the label with the content, or the guard cannot tell the two apart"
            )]
        }
        Some(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        parse(s).unwrap_or_else(|| panic!("{s:?} should parse"))
    }

    #[test]
    fn orders_like_versions_not_strings() {
        let ordered = [
            "0.9",
            "v1.2.0-alpha",
            "1.2.0-alpha.1",
            "1.2.0-alpha.beta",
            "1.2.0-beta",
            "1.2.0-rc1",
            "1.2.0rc2",
            "1.2.0-rc10",
            "1.2.0",
            "1.2.1",
            "v1.9",
            "v1.10",
            "2",
            "2024.05.01",
            "2024.06.01",
        ];
        for w in ordered.windows(2) {
            assert!(v(w[0]) < v(w[1]), "{} < {}", w[0], w[1]);
        }
    }

    #[test]
    fn equal_versions_written_differently() {
        assert_eq!(v("v1.2"), v("1.2.0"));
        assert_eq!(v("1.2.0+build.5"), v("V1.2.0"));
        assert_eq!(v("1.02"), v("1.2"));
    }

    fn label(text: &str) -> Label {
        Label {
            text: text.to_string(),
            version: parse(text),
            from_tag: false,
        }
    }

    #[test]
    fn warns_when_the_guard_is_weakened() {
        let w = |new: Option<&str>, live: Option<&str>, changes: bool| {
            warnings("D", new.map(label).as_ref(), Some("g1"), live, changes)
        };
        let off = w(None, Some("1.2.0"), true);
        assert_eq!(off.len(), 1);
        assert!(
            off[0].contains("labelled 1.2.0 with an unlabelled one"),
            "{off:?}"
        );
        for same in ["1.2.0", "v1.2"] {
            let got = w(Some(same), Some("1.2.0"), true);
            assert_eq!(got.len(), 1, "{same}");
            assert!(got[0].contains("content differs"), "{got:?}");
        }
        // Nothing to say: a newer label, nothing published, or no live label.
        assert!(w(Some("1.3.0"), Some("1.2.0"), true).is_empty());
        assert!(w(None, Some("1.2.0"), false).is_empty());
        assert!(w(Some("1.2.0"), Some("1.2.0"), false).is_empty());
        assert!(w(None, None, true).is_empty());
        assert!(w(Some("latest"), Some("latest"), true).len() == 1);
    }

    #[test]
    fn words_are_not_versions() {
        for bad in [
            "",
            "latest",
            "v",
            "stable-1",
            "1..2",
            ".1",
            "1.",
            "1.2-",
            "1.2-rc_1",
            "1.2 ",
            "1.2+",
            "sha-abc123",
            "1/2",
        ] {
            assert!(parse(bad).is_none(), "{bad:?} parsed");
        }
    }

    #[test]
    fn the_guard() {
        let new = v("v1.9");
        assert_eq!(check(Some(&new), Some("v1.10")), Verdict::Downgrade);
        assert_eq!(check(Some(&new), Some("v1.9.0")), Verdict::Allowed);
        assert_eq!(check(Some(&new), Some("v1.8")), Verdict::Allowed);
        assert_eq!(check(Some(&new), None), Verdict::Allowed);
        assert_eq!(check(None, Some("v2")), Verdict::Allowed);
        assert_eq!(check(Some(&new), Some("hotfix")), Verdict::Unordered);
    }
}
