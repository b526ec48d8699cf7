//! Extended attributes an entry carries (an image layer's
//! `SCHILY.xattr.*` records; a directory source's with `--xattrs`): plain
//! data, no I/O here (`sys` reads and sets them).
//!
//! Most trees carry none, and the few that do repeat a handful of sets
//! (one `security.capability` on a few binaries), so a set is interned
//! once per process and an entry's `Meta` holds only its 4-byte id: two
//! entries carry the same attributes exactly when their ids are equal, so
//! every comparer compares them with the rest of the metadata. Id 0 is the
//! empty set, what every entry has unless a source gave it more.
//!
//! In a manifest a set is one token after the entry's path (and a
//! symlink's target), written only when the set is not empty, so that the
//! manifests (and digests) of trees without attributes stay as they were:
//! `x:NAME=HEX;NAME=HEX`, names sorted, escaped as paths are and with `=`
//! and `;` escaped too, values in hex.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{bail, Context, Result};

/// Attributes one entry may carry, as the tar reader bounds them.
pub const MAX_PER_ENTRY: usize = 1024;
/// Bytes of one value (Linux: `XATTR_SIZE_MAX`).
pub const MAX_VALUE: usize = 65536;
/// Bytes of one name (Linux: `XATTR_NAME_MAX`).
pub const MAX_NAME: usize = 255;

/// (name, value) pairs sorted by name, each name once.
pub type Pairs = Arc<[(Box<[u8]>, Box<[u8]>)]>;

/// An interned set of attributes; `Set::default()` is the empty one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Set(u32);

#[derive(Default)]
struct Table {
    sets: Vec<Pairs>,
    ids: HashMap<Pairs, u32>,
}

fn table() -> &'static Mutex<Table> {
    static TABLE: OnceLock<Mutex<Table>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let empty: Pairs = Arc::from(Vec::new());
        let mut t = Table::default();
        t.ids.insert(empty.clone(), 0);
        t.sets.push(empty);
        Mutex::new(t)
    })
}

impl Set {
    /// The number this process's table knows the set by (`from_number`).
    pub fn number(self) -> u32 {
        self.0
    }

    /// The set `number` gave, where this process's table has one.
    pub fn from_number(n: u32) -> Option<Set> {
        // The empty set, nearly every file's, without the table's lock.
        if n == 0 {
            return Some(Set(0));
        }
        let t = table().lock().unwrap_or_else(|e| e.into_inner());
        ((n as usize) < t.sets.len()).then_some(Set(n))
    }

    /// The set of these pairs: sorted by name; a name given twice keeps its
    /// last value (as a later PAX record replaces an earlier one).
    pub fn of(mut pairs: Vec<(Vec<u8>, Vec<u8>)>) -> Set {
        if pairs.is_empty() {
            return Set(0);
        }
        pairs.reverse();
        pairs.sort_by(|a, b| a.0.cmp(&b.0)); // stable: the last value first
        pairs.dedup_by(|later, first| later.0 == first.0);
        let pairs: Pairs = pairs
            .into_iter()
            .map(|(n, v)| (n.into_boxed_slice(), v.into_boxed_slice()))
            .collect();
        let mut t = table().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&id) = t.ids.get(&pairs) {
            return Set(id);
        }
        let id = t.sets.len() as u32;
        t.sets.push(pairs.clone());
        t.ids.insert(pairs, id);
        Set(id)
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn pairs(self) -> Pairs {
        let t = table().lock().unwrap_or_else(|e| e.into_inner());
        t.sets[self.0 as usize].clone()
    }

    /// The manifest token (`x:…`), or `None` for the empty set.
    pub fn token(self) -> Option<String> {
        if self.is_empty() {
            return None;
        }
        let mut s = String::from("x:");
        for (i, (name, value)) in self.pairs().iter().enumerate() {
            if i > 0 {
                s.push(';');
            }
            for &b in name.iter() {
                if (0x21..=0x7e).contains(&b) && !b"%=;".contains(&b) {
                    s.push(b as char);
                } else {
                    s.push_str(&format!("%{b:02X}"));
                }
            }
            s.push('=');
            s.push_str(&crate::escape::hex(value));
        }
        Some(s)
    }

    /// The set a manifest token names; hostile until parsed: every name
    /// and value bounded, names unique and sorted, nothing else accepted.
    pub fn parse(token: &str) -> Result<Set> {
        let body = token.strip_prefix("x:").context("bad xattr field")?;
        let mut pairs = Vec::new();
        for item in body.split(';') {
            if pairs.len() == MAX_PER_ENTRY {
                bail!("more than {MAX_PER_ENTRY} xattrs");
            }
            let (name, value) = item.split_once('=').context("bad xattr field")?;
            let name = crate::escape::unpercent(name)?;
            if name.is_empty() || name.len() > MAX_NAME || name.contains(&0) {
                bail!("bad xattr name");
            }
            if value.len() % 2 != 0 || value.len() / 2 > MAX_VALUE {
                bail!("bad xattr value");
            }
            let value = (0..value.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(value.get(i..i + 2)?, 16).ok())
                .collect::<Option<Vec<u8>>>()
                .context("bad xattr value")?;
            if pairs
                .last()
                .is_some_and(|(last, _): &(Vec<u8>, Vec<u8>)| *last >= name)
            {
                bail!("xattr names out of order or twice");
            }
            pairs.push((name, value));
        }
        Ok(Set::of(pairs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(pairs: &[(&[u8], &[u8])]) -> Set {
        Set::of(
            pairs
                .iter()
                .map(|(n, v)| (n.to_vec(), v.to_vec()))
                .collect(),
        )
    }

    #[test]
    fn equal_sets_share_an_id_whatever_their_order() {
        let a = set(&[(b"user.b", b"2"), (b"user.a", b"1")]);
        let b = set(&[(b"user.a", b"1"), (b"user.b", b"2")]);
        assert_eq!(a, b);
        assert_ne!(a, set(&[(b"user.a", b"1")]));
        assert_ne!(a, set(&[(b"user.a", b"1"), (b"user.b", b"3")]));
        assert!(set(&[]).is_empty());
        assert_eq!(Set::default(), set(&[]));
    }

    #[test]
    fn a_name_given_twice_keeps_its_last_value() {
        let s = set(&[(b"user.a", b"old"), (b"user.a", b"new")]);
        assert_eq!(&*s.pairs()[0].1, b"new");
        assert_eq!(s.pairs().len(), 1);
    }

    #[test]
    fn a_token_round_trips_and_hostile_ones_are_refused() {
        let cap: &[u8] = &[
            1, 0, 0, 2, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        let s = set(&[
            (b"security.capability", cap),
            (b"user.odd name=;%", b"a b\n"),
        ]);
        let t = s.token().unwrap();
        assert!(!t.contains(' ') && !t.contains('\n'), "{t}");
        assert_eq!(Set::parse(&t).unwrap(), s);
        assert_eq!(Set::default().token(), None);
        for bad in [
            "x:",
            "y:user.a=00",
            "x:user.a",
            "x:user.a=0",
            "x:user.a=zz",
            "x:=00",
            "x:user.b=00;user.a=00",
            "x:user.a=00;user.a=00",
            "x:user.%00=00",
        ] {
            assert!(Set::parse(bad).is_err(), "{bad} accepted");
        }
        let long = format!("x:user.a={}", "00".repeat(MAX_VALUE + 1));
        assert!(Set::parse(&long).is_err());
    }
}
