//! The module graph of `src/` has no circle (docs/architecture.md, "The
//! modules and what each may import").
//!
//! A module is a file (`a/mod.rs` is `a`, `a/b.rs` is `a::b`). Its edges are
//! the paths it spells through `crate::` (in `use` trees and in expressions),
//! through `super::` and `self::`, which name the same modules relatively,
//! and through the bare name of a module of its own (`dir::Dir` in
//! `source/mod.rs`, after `mod dir;`). A path ends at the deepest module it
//! names, so `crate::source::store::Store` is an edge to
//! `source::store`, not to `source`. A `pub use` re-export is an edge
//! like any other `use`. Items under `#[cfg(test)]` are left out: tests may
//! reach across to build their fixtures, and are not part of the binary.
//!
//! The strongly connected components of that graph (Tarjan's algorithm) must
//! be single modules, with one allowance: a directory module and its own
//! files may name each other (the trait in `mod.rs`, a kind in each file, the
//! one `match` that picks the kind), so a component made only of one
//! directory's modules counts only the circles its files make without the
//! parent naming its parts. The failure names each circle's modules and, for
//! every edge inside it, where it is spelled.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Path,
    Punct(char),
}

/// The tokens of one file with their line numbers; comments, strings and
/// character literals dropped, lifetimes reduced to their name.
fn lex(src: &str) -> Vec<(Tok, usize)> {
    let b: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    let skip_to = |i: &mut usize, line: &mut usize, end: usize| {
        for c in &b[*i..end.min(b.len())] {
            if *c == '\n' {
                *line += 1;
            }
        }
        *i = end.min(b.len());
    };
    while i < b.len() {
        let c = b[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && b.get(i + 1) == Some(&'/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && b.get(i + 1) == Some(&'*') {
            let (mut depth, mut j) = (1, i + 2);
            while j < b.len() && depth > 0 {
                if b[j] == '/' && b.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 2;
                } else if b[j] == '*' && b.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            skip_to(&mut i, &mut line, j);
        } else if let Some(end) = raw_string_end(&b, i) {
            skip_to(&mut i, &mut line, end);
        } else if c == '"' || (c == 'b' && b.get(i + 1) == Some(&'"')) {
            let mut j = if c == 'b' { i + 2 } else { i + 1 };
            while j < b.len() && b[j] != '"' {
                j += if b[j] == '\\' { 2 } else { 1 };
            }
            skip_to(&mut i, &mut line, j + 1);
        } else if c == '\'' || (c == 'b' && b.get(i + 1) == Some(&'\'')) {
            let j = if c == 'b' { i + 1 } else { i };
            if b.get(j + 1) == Some(&'\\') {
                let mut k = j + 3;
                while k < b.len() && b[k] != '\'' {
                    k += 1;
                }
                i = k + 1;
            } else if b.get(j + 2) == Some(&'\'') {
                i = j + 3;
            } else {
                i = j + 1; // a lifetime: its name lexes as an identifier
            }
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_') {
                i += 1;
            }
            let word: String = b[start..i].iter().collect();
            let word = word.strip_prefix("r#").map(str::to_string).unwrap_or(word);
            out.push((Tok::Ident(word), line));
        } else if c == ':' && b.get(i + 1) == Some(&':') {
            out.push((Tok::Path, line));
            i += 2;
        } else {
            out.push((Tok::Punct(c), line));
            i += 1;
        }
    }
    out
}

/// Where a raw string (`r"…"`, `r#"…"#`, `br#"…"#`) that starts at `i` ends.
fn raw_string_end(b: &[char], i: usize) -> Option<usize> {
    if i > 0 && (b[i - 1].is_alphanumeric() || b[i - 1] == '_') {
        return None;
    }
    let mut j = i;
    if b.get(j) == Some(&'b') {
        j += 1;
    }
    if b.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while b.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    if b.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < b.len() {
        if b[j] == '"' && (1..=hashes).all(|k| b.get(j + k) == Some(&'#')) {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(b.len())
}

/// Drop every item under `#[cfg(test)]`: up to its `;`, or its braced body.
fn drop_test_items(toks: Vec<(Tok, usize)>) -> Vec<(Tok, usize)> {
    let attr: Vec<Tok> = ["#", "[", "cfg", "(", "test", ")", "]"]
        .iter()
        .map(|s| match *s {
            "cfg" | "test" => Tok::Ident(s.to_string()),
            p => Tok::Punct(p.chars().next().unwrap()),
        })
        .collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let here = toks[i..].iter().take(attr.len()).map(|t| &t.0);
        if toks.len() - i >= attr.len() && here.eq(attr.iter()) {
            i += attr.len();
            let mut depth = 0;
            while i < toks.len() {
                match toks[i].0 {
                    Tok::Punct('{') => depth += 1,
                    Tok::Punct('}') => {
                        depth -= 1;
                        if depth == 0 {
                            i += 1;
                            break;
                        }
                    }
                    Tok::Punct(';') if depth == 0 => {
                        i += 1;
                        break;
                    }
                    _ => {}
                }
                i += 1;
            }
        } else {
            out.push(toks[i].clone());
            i += 1;
        }
    }
    out
}

fn ident(t: Option<&(Tok, usize)>) -> Option<&str> {
    match t {
        Some((Tok::Ident(s), _)) => Some(s),
        _ => None,
    }
}

/// Parse the path (or `use` tree) at `toks[i..]`, whose segments so far are
/// `prefix`; push every full path it names onto `out`; return the index after it.
fn path_tree(
    toks: &[(Tok, usize)],
    mut i: usize,
    prefix: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    let mut segs = prefix;
    loop {
        match toks.get(i).map(|t| &t.0) {
            Some(Tok::Punct('{')) => {
                i += 1;
                loop {
                    match toks.get(i).map(|t| &t.0) {
                        Some(Tok::Punct('}')) | None => return i + 1,
                        Some(Tok::Punct(',')) => i += 1,
                        Some(Tok::Ident(s)) if s == "as" => i += 2,
                        Some(Tok::Ident(s)) if s == "self" => {
                            out.push(segs.clone());
                            i += 1;
                        }
                        Some(Tok::Ident(_)) => i = path_tree(toks, i, segs.clone(), out),
                        _ => i += 1,
                    }
                }
            }
            Some(Tok::Ident(s)) if s != "as" => {
                segs.push(s.clone());
                i += 1;
                if toks.get(i).map(|t| &t.0) == Some(&Tok::Path) {
                    i += 1;
                    continue;
                }
                out.push(segs);
                return i;
            }
            _ => {
                out.push(segs);
                return i;
            }
        }
    }
}

/// A module's name from its file below `src/`: `a/mod.rs` is `a`, `a/b.rs` is `a::b`.
fn module_of(rel: &Path) -> String {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.strip_suffix(".rs").unwrap();
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    if parts.is_empty() {
        "crate".to_string()
    } else {
        parts.join("::")
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// One reference: from a module to another, spelled at `file:line`.
struct Edge {
    from: String,
    to: String,
    at: String,
}

impl Edge {
    /// A module naming one of its own parts (`source` → `source::dir`).
    fn to_part(&self) -> bool {
        self.from == "crate" || self.to.starts_with(&format!("{}::", self.from))
    }
}

fn edges(src: &Path) -> (BTreeSet<String>, Vec<Edge>) {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    // main.rs is the binary, another crate: it reaches the library by name.
    files.retain(|f| f.strip_prefix(src).unwrap() != Path::new("main.rs"));
    let modules: BTreeSet<String> = files
        .iter()
        .map(|f| module_of(f.strip_prefix(src).unwrap()))
        .collect();
    let mut all = Vec::new();
    for file in &files {
        let rel = file.strip_prefix(src).unwrap();
        let me = module_of(rel);
        let me_segs: Vec<String> = if me == "crate" {
            vec![]
        } else {
            me.split("::").map(str::to_string).collect()
        };
        let toks = drop_test_items(lex(&std::fs::read_to_string(file).unwrap()));
        for i in 0..toks.len() {
            let Some(first) = ident(toks.get(i)) else {
                continue;
            };
            // A bare name is a path only where it is a module of this file's
            // own (`dir::Dir` in `source/mod.rs`, after `mod dir;`).
            let own = match me.as_str() {
                "crate" => first.to_string(),
                _ => format!("{me}::{first}"),
            };
            let bare = !matches!(first, "crate" | "super" | "self");
            if bare && !modules.contains(&own) {
                continue;
            }
            // Only where a path starts: not `x::self`, not `$crate`, not `pub(crate)`.
            if i > 0 && matches!(toks[i - 1].0, Tok::Path | Tok::Punct('$')) {
                continue;
            }
            if toks.get(i + 1).map(|t| &t.0) != Some(&Tok::Path) {
                continue;
            }
            let mut base = me_segs.clone();
            let mut j = i;
            match first {
                "crate" => base.clear(),
                "self" => {}
                _ if bare => j -= 2,
                _ => {
                    // `super::super::…`
                    while ident(toks.get(j)) == Some("super")
                        && toks.get(j + 1).map(|t| &t.0) == Some(&Tok::Path)
                    {
                        base.pop();
                        j += 2;
                    }
                    j -= 2;
                }
            }
            let mut paths = Vec::new();
            path_tree(&toks, j + 2, base, &mut paths);
            for path in paths {
                let to = (0..=path.len())
                    .rev()
                    .map(|n| {
                        if n == 0 {
                            "crate".to_string()
                        } else {
                            path[..n].join("::")
                        }
                    })
                    .find(|m| modules.contains(m))
                    .unwrap();
                if to != me {
                    all.push(Edge {
                        from: me.clone(),
                        to,
                        at: format!("src/{}:{}", rel.display(), toks[i].1),
                    });
                }
            }
        }
    }
    (modules, all)
}

/// Tarjan's strongly connected components, each sorted, in a stable order.
fn components(
    nodes: &BTreeSet<String>,
    adj: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<Vec<String>> {
    struct State<'a> {
        adj: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<String, usize>,
        low: BTreeMap<String, usize>,
        stack: Vec<String>,
        on: BTreeSet<String>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit(s: &mut State, v: &str) {
        s.index.insert(v.to_string(), s.next);
        s.low.insert(v.to_string(), s.next);
        s.next += 1;
        s.stack.push(v.to_string());
        s.on.insert(v.to_string());
        let succ: Vec<String> = s
            .adj
            .get(v)
            .map(|x| x.iter().cloned().collect())
            .unwrap_or_default();
        for w in succ {
            if !s.index.contains_key(&w) {
                visit(s, &w);
                let lw = s.low[&w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on.contains(&w) {
                let iw = s.index[&w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on.remove(&w);
                let done = w == v;
                comp.push(w);
                if done {
                    break;
                }
            }
            comp.sort();
            s.out.push(comp);
        }
    }
    let mut s = State {
        adj,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in nodes {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out.sort();
    s.out
}

/// The circles of the graph. A directory module and its own files may name
/// each other (the trait in `mod.rs`, a kind in each file, the one `match`
/// that picks the kind): a component of the whole graph made only of one
/// directory's modules is a circle only where its files make one without
/// the parent naming its parts. Any other component is a circle.
fn find_circles(src: &Path) -> (Vec<Vec<String>>, Vec<Edge>) {
    let (modules, edges) = edges(src);
    let graph = |keep: &dyn Fn(&Edge) -> bool| {
        let mut adj: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for e in edges.iter().filter(|e| keep(e)) {
            adj.entry(e.from.clone()).or_default().insert(e.to.clone());
        }
        adj
    };
    let whole = graph(&|_| true);
    let mut circles = Vec::new();
    for c in components(&modules, &whole) {
        if c.len() < 2 {
            continue;
        }
        let inside: BTreeSet<String> = c.iter().cloned().collect();
        let dir = c.iter().find(|d| {
            c.iter()
                .all(|m| m == *d || m.starts_with(&format!("{d}::")))
        });
        match dir {
            Some(_) => {
                let parts =
                    graph(&|e| !e.to_part() && inside.contains(&e.from) && inside.contains(&e.to));
                circles.extend(
                    components(&inside, &parts)
                        .into_iter()
                        .filter(|c| c.len() > 1),
                );
            }
            None => circles.push(c),
        }
    }
    circles.sort();
    (circles, edges)
}

#[test]
fn module_graph_has_no_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (circles, edges) = find_circles(&src);
    let mut report = String::new();
    for c in &circles {
        report += &format!("circle of {} modules: {}\n", c.len(), c.join(", "));
        let inside: BTreeSet<&String> = c.iter().collect();
        let mut seen = BTreeMap::<(&str, &str), Vec<&str>>::new();
        for e in edges
            .iter()
            .filter(|e| inside.contains(&e.from) && inside.contains(&e.to))
        {
            seen.entry((&e.from, &e.to)).or_default().push(&e.at);
        }
        for ((from, to), at) in seen {
            let more = if at.len() > 1 {
                format!(" (+{} more)", at.len() - 1)
            } else {
                String::new()
            };
            report += &format!("  {from} -> {to}  at {}{more}\n", at[0]);
        }
    }
    assert!(
        circles.is_empty(),
        "the module graph of src/ has circles:\n{report}"
    );
}

/// The measure itself: it finds a circle spelled each way it reads, and no
/// circle where there is none.
#[test]
fn measure_finds_circles() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    let write = |rel: &str, text: &str| {
        let p = src.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write("lib.rs", "mod a; mod b; mod c; mod d;\n");
    write(
        "a.rs",
        "use crate::{b::{self, X as Y}, c};\n// crate::d::Y in a comment\n",
    );
    write(
        "b.rs",
        "pub fn f() { let _ = \"crate::d::x\"; crate::d::e::g::<u8>(); }\n",
    );
    write("c.rs", "#[cfg(test)]\nmod tests { use crate::a; }\n");
    write("d/mod.rs", "pub mod e;\n");
    write(
        "d/e.rs",
        "use super::super::a::Thing;\nfn g<'a>(c: char) { let _ = 'x'; }\n",
    );
    let (circles, _) = find_circles(src);
    assert_eq!(circles, vec![vec!["a", "b", "d::e"]]);

    write("d/e.rs", "fn g() {}\n");
    let (circles, _) = find_circles(src);
    assert!(circles.is_empty(), "{circles:?}");

    // A directory and its parts may name each other...
    write(
        "d/mod.rs",
        "pub mod e;\npub mod f;\npub trait T {}\nfn pick() { e::E; f::F; }\n",
    );
    write("d/e.rs", "use super::T;\npub struct E;\n");
    write("d/f.rs", "use crate::d::T;\npub struct F;\n");
    let (circles, _) = find_circles(src);
    assert!(circles.is_empty(), "{circles:?}");
    // ...but two of its files may not,
    write("d/f.rs", "use super::e::E;\npub struct F;\n");
    write("d/e.rs", "use super::{f::F, T};\npub struct E;\n");
    let (circles, _) = find_circles(src);
    assert_eq!(circles, vec![vec!["d::e", "d::f"]]);
    // and a circle that leaves the directory is one, the parent naming its
    // part (here through a re-export) counted.
    write("d/e.rs", "use super::T;\npub struct E;\n");
    write("d/f.rs", "pub struct F(crate::c::C);\n");
    write("c.rs", "pub struct C;\nfn k() { crate::d::F; }\n");
    write(
        "d/mod.rs",
        "pub mod e;\npub mod f;\npub use f::F;\npub trait T {}\n",
    );
    let (circles, _) = find_circles(src);
    assert_eq!(circles, vec![vec!["c", "d", "d::f"]]);
}
