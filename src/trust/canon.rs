//! The bytes OPA hashes for a structured bundle file (`data.json`,
//! `data.yaml`, `.manifest`): the JSON value as Go's `encoding/json`
//! decodes it with `UseNumber` (OPA's `util.Unmarshal`), written back as
//! OPA's `bundle/hash.go` walks it: objects with their keys sorted
//! bytewise, `{`, `key:value` pairs joined by `,`, `}`; arrays `[`, `,`, `]`;
//! no whitespace; numbers exactly as written (a `json.Number` keeps its
//! text); strings as Go's encoder writes them with HTML escaping off. So a
//! file reformatted (whitespace, key order, escapes) hashes the same, and
//! any changed value does not.
//!
//! Go's decoding rules kept here: a UTF-8 byte order mark is dropped;
//! invalid UTF-8 and lone surrogate escapes become U+FFFD; a key given
//! twice keeps its last value; nothing but whitespace may follow the value.
//! Refused, where OPA would go on: text that is not JSON (OPA reads it as
//! YAML, which is not replicated) and nesting deeper than `MAX_DEPTH`.

/// Deepest nesting taken (Go allows 10000; a bundle's data needs far less).
pub const MAX_DEPTH: usize = 512;

enum Value {
    Object(Vec<(String, Value)>),
    Array(Vec<Value>),
    String(String),
    Number(String),
    Literal(&'static str),
}

/// The canonical bytes of the JSON document `text`.
pub fn canonical(text: &[u8]) -> Result<Vec<u8>, String> {
    let text = text.strip_prefix(b"\xef\xbb\xbf").unwrap_or(text);
    let mut p = Parser { s: text, at: 0 };
    p.ws();
    let v = p.value(0)?;
    p.ws();
    if p.at != text.len() {
        return Err(p.err("data after the JSON value"));
    }
    let mut out = Vec::with_capacity(text.len());
    write(&v, &mut out);
    Ok(out)
}

struct Parser<'a> {
    s: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn err(&self, what: &str) -> String {
        format!(
            "not JSON at byte {}: {what} (YAML data is not verified)",
            self.at
        )
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.s.get(self.at) {
            self.at += 1;
        }
    }

    fn eat(&mut self, b: u8) -> bool {
        if self.s.get(self.at) == Some(&b) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, String> {
        if depth > MAX_DEPTH {
            return Err(self.err("nested too deep"));
        }
        match self.s.get(self.at) {
            Some(b'{') => {
                self.at += 1;
                let mut pairs: Vec<(String, Value)> = Vec::new();
                self.ws();
                if !self.eat(b'}') {
                    loop {
                        self.ws();
                        if self.s.get(self.at) != Some(&b'"') {
                            return Err(self.err("expected a key"));
                        }
                        let k = self.string()?;
                        self.ws();
                        if !self.eat(b':') {
                            return Err(self.err("expected ':'"));
                        }
                        self.ws();
                        let v = self.value(depth + 1)?;
                        pairs.push((k, v));
                        self.ws();
                        if self.eat(b',') {
                            continue;
                        }
                        if self.eat(b'}') {
                            break;
                        }
                        return Err(self.err("expected ',' or '}'"));
                    }
                }
                // Sorted, and the last of equal keys kept (a stable sort
                // keeps their order; the last one wins).
                pairs.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
                let mut kept: Vec<(String, Value)> = Vec::with_capacity(pairs.len());
                for (k, v) in pairs {
                    match kept.last_mut() {
                        Some(last) if last.0 == k => last.1 = v,
                        _ => kept.push((k, v)),
                    }
                }
                Ok(Value::Object(kept))
            }
            Some(b'[') => {
                self.at += 1;
                let mut items = Vec::new();
                self.ws();
                if !self.eat(b']') {
                    loop {
                        self.ws();
                        items.push(self.value(depth + 1)?);
                        self.ws();
                        if self.eat(b',') {
                            continue;
                        }
                        if self.eat(b']') {
                            break;
                        }
                        return Err(self.err("expected ',' or ']'"));
                    }
                }
                Ok(Value::Array(items))
            }
            Some(b'"') => Ok(Value::String(self.string()?)),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => {
                for lit in ["true", "false", "null"] {
                    if self.s[self.at..].starts_with(lit.as_bytes()) {
                        self.at += lit.len();
                        return Ok(Value::Literal(lit));
                    }
                }
                Err(self.err("expected a value"))
            }
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.at;
        while self.s.get(self.at).is_some_and(u8::is_ascii_digit) {
            self.at += 1;
        }
        self.at - start
    }

    fn number(&mut self) -> Result<Value, String> {
        let start = self.at;
        self.eat(b'-');
        if self.eat(b'0') {
            // A leading zero stands alone.
        } else if self.digits() == 0 {
            return Err(self.err("bad number"));
        }
        if self.eat(b'.') && self.digits() == 0 {
            return Err(self.err("bad number"));
        }
        if self.eat(b'e') || self.eat(b'E') {
            if !self.eat(b'+') {
                self.eat(b'-');
            }
            if self.digits() == 0 {
                return Err(self.err("bad number"));
            }
        }
        let text = std::str::from_utf8(&self.s[start..self.at]).expect("ASCII");
        Ok(Value::Number(text.to_string()))
    }

    fn hex4(&mut self) -> Option<u32> {
        let h = self.s.get(self.at..self.at + 4)?;
        let v = u32::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok()?;
        if !h.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        self.at += 4;
        Some(v)
    }

    /// A string, unescaped; invalid UTF-8 becomes U+FFFD a byte at a time.
    fn string(&mut self) -> Result<String, String> {
        self.at += 1; // the opening quote
        let mut raw: Vec<u8> = Vec::new();
        let mut out = String::new();
        let flush = |raw: &mut Vec<u8>, out: &mut String| {
            for chunk in raw.utf8_chunks() {
                out.push_str(chunk.valid());
                for _ in chunk.invalid() {
                    out.push('\u{fffd}');
                }
            }
            raw.clear();
        };
        loop {
            let Some(&b) = self.s.get(self.at) else {
                return Err(self.err("unterminated string"));
            };
            self.at += 1;
            match b {
                b'"' => break,
                b'\\' => {
                    flush(&mut raw, &mut out);
                    let Some(&e) = self.s.get(self.at) else {
                        return Err(self.err("unterminated string"));
                    };
                    self.at += 1;
                    match e {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hi = self.hex4().ok_or_else(|| self.err("bad \\u escape"))?;
                            let c = if (0xd800..0xdc00).contains(&hi) {
                                // A pair, if a low surrogate follows (Go's rule).
                                let save = self.at;
                                let lo = (self.eat(b'\\') && self.eat(b'u'))
                                    .then(|| self.hex4())
                                    .flatten();
                                match lo {
                                    Some(lo) if (0xdc00..0xe000).contains(&lo) => char::from_u32(
                                        0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00),
                                    ),
                                    _ => {
                                        self.at = save;
                                        None
                                    }
                                }
                            } else {
                                char::from_u32(hi)
                            };
                            out.push(c.unwrap_or('\u{fffd}'));
                        }
                        _ => return Err(self.err("bad escape")),
                    }
                }
                0..=0x1f => return Err(self.err("control character in a string")),
                _ => raw.push(b),
            }
        }
        flush(&mut raw, &mut out);
        Ok(out)
    }
}

fn write(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Object(pairs) => {
            out.push(b'{');
            for (i, (k, v)) in pairs.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(k, out);
                out.push(b':');
                write(v, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(v, out);
            }
            out.push(b']');
        }
        Value::String(s) => write_string(s, out),
        Value::Number(n) => out.extend_from_slice(n.as_bytes()),
        Value::Literal(l) => out.extend_from_slice(l.as_bytes()),
    }
}

/// A string as Go's `json.Encoder` writes it with `SetEscapeHTML(false)`
/// (Go 1.22 and later: `\b` and `\f` short).
fn write_string(s: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push(b'"');
    for c in s.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\r' => out.extend_from_slice(b"\\r"),
            '\t' => out.extend_from_slice(b"\\t"),
            '\u{8}' => out.extend_from_slice(b"\\b"),
            '\u{c}' => out.extend_from_slice(b"\\f"),
            '\u{0}'..='\u{1f}' => {
                let b = c as u8;
                out.extend_from_slice(b"\\u00");
                out.push(HEX[(b >> 4) as usize]);
                out.push(HEX[(b & 0xf) as usize]);
            }
            '\u{2028}' => out.extend_from_slice(b"\\u2028"),
            '\u{2029}' => out.extend_from_slice(b"\\u2029"),
            c => {
                let mut buf = [0; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::canonical;

    fn c(s: &str) -> String {
        String::from_utf8(canonical(s.as_bytes()).unwrap()).unwrap()
    }

    #[test]
    fn sorts_keys_drops_whitespace_and_keeps_numbers_as_written() {
        assert_eq!(
            c("\u{feff} { \"b\" : [1, 2.50, -0, 1E+3], \"a\": {\"z\":null,\"y\":true} }\n"),
            r#"{"a":{"y":true,"z":null},"b":[1,2.50,-0,1E+3]}"#
        );
        assert_eq!(c(r#"{"é":1,"z":2,"Z":3}"#), r#"{"Z":3,"z":2,"é":1}"#);
        assert_eq!(c(r#"{"a":1,"a":2}"#), r#"{"a":2}"#);
        assert_eq!(c("[]"), "[]");
        assert_eq!(c("{}"), "{}");
        assert_eq!(c(" \"x\" "), "\"x\"");
    }

    #[test]
    fn writes_strings_as_gos_encoder_does_without_html_escaping() {
        assert_eq!(
            c(r#""<a&b> \u0041\/ \" \\ \n\r\t\b\f \u0001 \u001f \u007f é \u2028\u2029""#),
            "\"<a&b> A/ \\\" \\\\ \\n\\r\\t\\b\\f \\u0001 \\u001f \u{7f} é \\u2028\\u2029\""
        );
        // A pair joins; a lone surrogate is U+FFFD; invalid UTF-8 too.
        assert_eq!(c(r#""\ud83d\ude00""#), "\"😀\"");
        assert_eq!(c(r#""\ud800x""#), "\"\u{fffd}x\"");
        assert_eq!(
            String::from_utf8(canonical(b"\"a\xffb\"").unwrap()).unwrap(),
            "\"a\u{fffd}b\""
        );
    }

    #[test]
    fn refuses_what_is_not_one_json_value() {
        for bad in [
            "",
            "{",
            "[1,]",
            "{\"a\":1,}",
            "01",
            "1.",
            "-",
            "+1",
            "1e",
            "tru",
            "{a:1}",
            "\"\t\"",
            "\"\\x\"",
            "1 2",
            "key: value",
            "[1]x",
            "NaN",
        ] {
            assert!(canonical(bad.as_bytes()).is_err(), "{bad:?}");
        }
        let deep = "[".repeat(super::MAX_DEPTH + 2) + &"]".repeat(super::MAX_DEPTH + 2);
        assert!(canonical(deep.as_bytes()).unwrap_err().contains("deep"));
    }
}
