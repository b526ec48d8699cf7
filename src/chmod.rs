//! `--chmod RULES`: rsync's syntax, parsed once, applied to the modes of the
//! scanned tree before planning (so the plan, the staged tree and the
//! manifest all carry the changed modes, and the next sync is up to date).
//! Pure: no I/O.
//!
//! RULES is a comma-separated list applied in order. Each rule may start with
//! `D` (directories only) or `F` (files only), then is either an octal mode
//! (`D755`, `F0644`, `2775`) that replaces the permission bits, or a symbolic
//! change as in chmod(1): who (`u`, `g`, `o`, `a`; none means `a`, with no
//! umask), then one or more operations (`+`, `-`, `=`) each with permissions
//! (`r`, `w`, `x`, `X`, `s`, `t`). `X` means execute for directories and for
//! files that some class may already execute. Symlinks have no mode of their
//! own and are left alone.

use anyhow::{bail, Result};

use crate::tree::{Meta, Node, Tree};

/// Parsed `--chmod` rules, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rules(Vec<Rule>);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    All,
    Dirs,
    Files,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Rule {
    target: Target,
    action: Action,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Action {
    /// An octal mode: replaces all of `0o7777`.
    Set(u32),
    /// Who (`u`/`g`/`o` as bits 4/2/1), then operations in order.
    Symbolic { who: u8, ops: Vec<(char, Perms)> },
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Perms {
    r: bool,
    w: bool,
    x: bool,
    big_x: bool,
    s: bool,
    t: bool,
}

const WHO_U: u8 = 4;
const WHO_G: u8 = 2;
const WHO_O: u8 = 1;

/// Parse RULES such as `D755,F644` or `u+w,go-w,Da+X`.
pub fn parse(rules: &str) -> Result<Rules> {
    let mut out = Vec::new();
    for clause in rules.split(',') {
        out.push(parse_rule(clause)?);
    }
    Ok(Rules(out))
}

fn parse_rule(clause: &str) -> Result<Rule> {
    if clause.is_empty() {
        bail!("empty rule (rules are separated by single commas, e.g. D755,F644)");
    }
    let (target, rest) = match clause.as_bytes()[0] {
        b'D' => (Target::Dirs, &clause[1..]),
        b'F' => (Target::Files, &clause[1..]),
        _ => (Target::All, clause),
    };
    if rest.is_empty() {
        bail!("rule {clause:?} has no mode after D/F");
    }
    if rest.bytes().all(|b| b.is_ascii_digit()) {
        let mode = u32::from_str_radix(rest, 8)
            .ok()
            .filter(|m| *m <= 0o7777 && rest.len() <= 4)
            .ok_or_else(|| {
                anyhow::anyhow!("{rest:?} in rule {clause:?} is not an octal mode up to 7777")
            })?;
        return Ok(Rule {
            target,
            action: Action::Set(mode),
        });
    }
    let mut chars = rest.chars().peekable();
    let mut who = 0u8;
    while let Some(&c) = chars.peek() {
        match c {
            'u' => who |= WHO_U,
            'g' => who |= WHO_G,
            'o' => who |= WHO_O,
            'a' => who |= WHO_U | WHO_G | WHO_O,
            _ => break,
        }
        chars.next();
    }
    if who == 0 {
        who = WHO_U | WHO_G | WHO_O;
    }
    let mut ops = Vec::new();
    while let Some(op) = chars.next() {
        if !matches!(op, '+' | '-' | '=') {
            bail!("unexpected {op:?} in rule {clause:?} (expected who [ugoa], then +, - or =)");
        }
        let mut p = Perms::default();
        while let Some(&c) = chars.peek() {
            match c {
                'r' => p.r = true,
                'w' => p.w = true,
                'x' => p.x = true,
                'X' => p.big_x = true,
                's' => p.s = true,
                't' => p.t = true,
                '+' | '-' | '=' => break,
                _ => bail!(
                    "unexpected {c:?} in rule {clause:?} (permissions are r, w, x, X, s and t)"
                ),
            }
            chars.next();
        }
        ops.push((op, p));
    }
    if ops.is_empty() {
        bail!("rule {clause:?} has no operation (+, - or =)");
    }
    Ok(Rule {
        target,
        action: Action::Symbolic { who, ops },
    })
}

impl Rules {
    /// The mode an entry gets (`mode` holds `0o7777` bits).
    pub fn mode(&self, mut mode: u32, is_dir: bool) -> u32 {
        for rule in &self.0 {
            let applies = match rule.target {
                Target::All => true,
                Target::Dirs => is_dir,
                Target::Files => !is_dir,
            };
            if !applies {
                continue;
            }
            match &rule.action {
                Action::Set(m) => mode = *m,
                Action::Symbolic { who, ops } => {
                    for (op, p) in ops {
                        mode = apply_op(mode, is_dir, *who, *op, p);
                    }
                }
            }
        }
        mode & 0o7777
    }

    /// Apply to every directory and file of `tree`, its root included.
    pub fn apply(&self, tree: &mut Tree) {
        let apply = |m: &mut Meta, is_dir: bool| m.mode = self.mode(m.mode, is_dir);
        apply(&mut tree.root, true);
        tree.for_each_mut(&mut |_, e| match e.node {
            Node::Dir(_) => apply(&mut e.meta, true),
            Node::File(_) => apply(&mut e.meta, false),
            Node::Symlink(_) => {}
        });
    }
}

fn apply_op(mode: u32, is_dir: bool, who: u8, op: char, p: &Perms) -> u32 {
    // The bits each class owns: its rwx and its special bit.
    let mut rwx_mask = 0;
    let mut special = 0;
    if who & WHO_U != 0 {
        rwx_mask |= 0o700;
        special |= 0o4000;
    }
    if who & WHO_G != 0 {
        rwx_mask |= 0o070;
        special |= 0o2000;
    }
    if who & WHO_O != 0 {
        rwx_mask |= 0o007;
        special |= 0o1000;
    }
    let mut bits = 0;
    if p.r {
        bits |= 0o444;
    }
    if p.w {
        bits |= 0o222;
    }
    if p.x || (p.big_x && (is_dir || mode & 0o111 != 0)) {
        bits |= 0o111;
    }
    bits &= rwx_mask;
    if p.s {
        bits |= special & 0o6000;
    }
    if p.t {
        bits |= special & 0o1000;
    }
    match op {
        '+' => mode | bits,
        '-' => mode & !bits,
        _ => {
            // `=`: the class's bits are replaced; as in chmod(1), a
            // directory keeps setuid/setgid unless `s` is named.
            let mut clear = rwx_mask | special;
            if is_dir && !p.s {
                clear &= !0o6000;
            }
            (mode & !clear) | bits
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(rules: &str, mode: u32, is_dir: bool) -> u32 {
        parse(rules).unwrap().mode(mode, is_dir)
    }

    #[test]
    fn octal_rules_by_type() {
        assert_eq!(m("D755,F644", 0o700, true), 0o755);
        assert_eq!(m("D755,F644", 0o700, false), 0o644);
        assert_eq!(m("F0600", 0o4755, false), 0o600);
        assert_eq!(m("D2775", 0o755, true), 0o2775);
        assert_eq!(m("640", 0o777, true), 0o640);
    }

    #[test]
    fn symbolic_rules_follow_chmod() {
        assert_eq!(m("u+w", 0o444, false), 0o644);
        assert_eq!(m("go-w", 0o777, false), 0o755);
        assert_eq!(m("a+r", 0o600, false), 0o644);
        assert_eq!(m("+x", 0o644, false), 0o755);
        assert_eq!(m("o=", 0o777, false), 0o770);
        assert_eq!(m("u=rw,go=r", 0o777, false), 0o644);
        assert_eq!(m("ug+rw-x", 0o755, false), 0o665);
        assert_eq!(m("g+s", 0o755, true), 0o2755);
        assert_eq!(m("u+s", 0o755, false), 0o4755);
        assert_eq!(m("o+t", 0o777, true), 0o1777);
        // `t` belongs to "other": `u+t` sets nothing.
        assert_eq!(m("u+t", 0o755, true), 0o755);
        // `=` on a directory keeps setgid unless `s` is named.
        assert_eq!(m("g=rx", 0o2775, true), 0o2755);
        assert_eq!(m("g=rx", 0o2775, false), 0o755);
    }

    #[test]
    fn big_x_only_for_directories_and_executables() {
        assert_eq!(m("Da+X", 0o700, true), 0o711);
        assert_eq!(m("Da+X", 0o600, false), 0o600);
        assert_eq!(m("a+X", 0o600, false), 0o600);
        assert_eq!(m("a+X", 0o700, false), 0o711);
        assert_eq!(m("go+rX", 0o600, true), 0o655);
    }

    #[test]
    fn rules_apply_in_order() {
        assert_eq!(m("F644,u+x", 0o777, false), 0o744);
        assert_eq!(m("u+x,F644", 0o777, false), 0o644);
        assert_eq!(m("Fa-w,Dgo-w", 0o777, true), 0o755);
    }

    #[test]
    fn malformed_rules_are_refused() {
        for bad in [
            "",
            ",",
            "D755,",
            "D",
            "F",
            "8",
            "77777",
            "u",
            "u+z",
            "Du+w,x",
            "uw",
            "z+r",
            "D755x",
            "g=u",
            "Q644",
            "a+rw,,go-w",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn symlinks_keep_their_mode() {
        let mut tree = Tree {
            root: Meta {
                mode: 0o700,
                ..Default::default()
            },
            root_srcs: 1,
            entries: vec![
                crate::tree::Entry {
                    name: b"f".as_slice().into(),
                    meta: Meta {
                        mode: 0o600,
                        ..Default::default()
                    },
                    node: Node::File(Default::default()),
                },
                crate::tree::Entry {
                    name: b"l".as_slice().into(),
                    meta: Meta {
                        mode: 0o777,
                        ..Default::default()
                    },
                    node: Node::Symlink(b"f".as_slice().into()),
                },
            ],
        };
        parse("D755,F644").unwrap().apply(&mut tree);
        assert_eq!(tree.root.mode, 0o755);
        assert_eq!(tree.entries[0].meta.mode, 0o644);
        assert_eq!(tree.entries[1].meta.mode, 0o777);
    }
}
