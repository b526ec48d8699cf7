//! How bytes are shown: a path in a message or log line (`c_style`,
//! `display`), and the manifest's forms, which keep a path or a header value
//! one word on one line (`percent`, `unpercent`) and a hash as `hex`. Pure,
//! and a leaf: the report, the scan, the manifest and the sources all use it,
//! so it imports nothing of the crate.

use anyhow::{Context, Result};

/// A path for a line-oriented log: printable UTF-8 as is; control bytes,
/// backslashes and invalid UTF-8 as C-style escapes (`\n`, `\t`, `\\`, `\xff`).
pub fn c_style(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '\r' => out.push_str("\\r"),
                c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// `label/rel` for messages, with unprintable bytes escaped.
pub fn display(label: &str, rel: &[u8]) -> String {
    if rel.is_empty() {
        label.to_string()
    } else {
        format!("{}/{}", label.trim_end_matches('/'), c_style(rel))
    }
}

/// A manifest's path, target or header value: every byte outside `!`..`~`,
/// and `%` itself, as `%HH`.
pub fn percent(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len());
    for &b in bytes {
        if (0x21..=0x7e).contains(&b) && b != b'%' {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s
}

/// The bytes `percent` wrote.
pub fn unpercent(s: &str) -> Result<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3).context("truncated %-escape")?;
            out.push(u8::from_str_radix(hex, 16).context("bad %-escape")?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Ok(out)
}

/// Lowercase hex, as hashes are written.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_style_keeps_one_path_on_one_line() {
        assert_eq!(c_style(b"a b/\xff\n\\c\td"), "a b/\\xff\\n\\\\c\\td");
        assert_eq!(c_style("é".as_bytes()), "é");
    }

    #[test]
    fn percent_round_trips_every_byte() {
        let all: Vec<u8> = (1..=255u8).collect();
        let e = percent(&all);
        assert!(!e.contains(' ') && !e.contains('\n'));
        assert_eq!(unpercent(&e).unwrap(), all);
    }
}
