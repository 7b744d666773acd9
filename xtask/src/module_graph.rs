//! The file-level module graph of each crate (who names whom through `crate::` and `super::`
//! paths, tests left out) and its circles, plus the non-test length of every source file: the
//! layering rules `tidy` enforces inside crates.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A non-test source file longer than this must say why in its `//!` header (a line containing
/// "long because").
pub(crate) const MAX_LINES: usize = 500;

/// The module path of a source file under a crate's `src/` (`lib.rs`/`main.rs` -> "",
/// `a/mod.rs` -> "a", `a/b.rs` -> "a::b"); `None` for a file under `bin/` or a build script.
pub(crate) fn module_of(rel_to_src: &Path) -> Option<String> {
    let mut parts: Vec<String> = rel_to_src.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if parts.first().is_some_and(|p| p == "bin") {
        return None;
    }
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs")?;
    if !(stem == "mod" || (parts.is_empty() && (stem == "lib" || stem == "main"))) {
        parts.push(stem.to_owned());
    }
    Some(parts.join("::"))
}

/// The part of a file that is not its test module (everything before the first `#[cfg(test)]`
/// line: test modules sit at the end of a file by convention).
pub(crate) fn non_test(text: &str) -> &str {
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        if line.trim() == "#[cfg(test)]" {
            return &text[..at];
        }
        at += line.len();
    }
    text
}

/// Every path a file names that starts with `crate::` or `super::`, as absolute segment lists
/// (grouped `use` trees expanded).
fn named_paths(module: &str, text: &str, is_file: &dyn Fn(&str) -> bool) -> Vec<Vec<String>> {
    let here: Vec<String> = module.split("::").filter(|s| !s.is_empty()).map(str::to_owned).collect();
    let code = strip_comments(text);
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        // Paths start at ASCII; inside a multi-byte char (a `▁` in a string) there is none.
        if !code.is_char_boundary(i) {
            i += 1;
            continue;
        }
        let starts_word =
            i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_' || bytes[i - 1] == b':');
        let rest = &code[i..];
        let root = if !starts_word {
            None
        } else if rest.starts_with("crate::") {
            Some(Vec::new())
        } else if rest.starts_with("super::") || rest.starts_with("self::") {
            Some(here.clone())
        } else {
            // A path through a child file module (`x::Y` in the module declaring `mod x;`).
            let word: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            let child = here.iter().cloned().chain([word.clone()]).collect::<Vec<_>>().join("::");
            (!word.is_empty() && rest[word.len()..].starts_with("::") && is_file(&child)).then(|| here.clone())
        };
        let Some(mut base) = root else {
            i += 1;
            continue;
        };
        // Walk `super::super::...` upwards from the current module.
        let mut j = i;
        if rest.starts_with("crate::") {
            j += "crate::".len();
        } else if rest.starts_with("self::") {
            j += "self::".len();
        } else {
            while code[j..].starts_with("super::") {
                base.pop();
                j += "super::".len();
            }
        }
        let (paths, end) = tree(&code, j);
        for p in paths {
            let mut full = base.clone();
            full.extend(p);
            out.push(full);
        }
        i = end.max(i + 1);
    }
    out
}

/// Parses a path tree at `at` (`a::b::C`, `a::{b, c::D}`, `*`); returns the expanded paths and
/// where it ended.
fn tree(code: &str, mut at: usize) -> (Vec<Vec<String>>, usize) {
    let bytes = code.as_bytes();
    let mut prefix = Vec::new();
    loop {
        while at < bytes.len() && bytes[at].is_ascii_whitespace() {
            at += 1;
        }
        if at < bytes.len() && bytes[at] == b'{' {
            at += 1;
            let mut all = Vec::new();
            loop {
                while at < bytes.len() && (bytes[at].is_ascii_whitespace() || bytes[at] == b',') {
                    at += 1;
                }
                if at >= bytes.len() || bytes[at] == b'}' {
                    return (
                        all.into_iter().map(|p: Vec<String>| prefix.iter().cloned().chain(p).collect()).collect(),
                        at + 1,
                    );
                }
                let (sub, end) = tree(code, at);
                all.extend(sub);
                // Skip an `as name` alias.
                at = end;
                while at < bytes.len() && !matches!(bytes[at], b',' | b'}') {
                    at += 1;
                }
            }
        }
        let start = at;
        while at < bytes.len() && (bytes[at].is_ascii_alphanumeric() || bytes[at] == b'_') {
            at += 1;
        }
        if start == at {
            return (vec![prefix], at);
        }
        prefix.push(code[start..at].to_owned());
        if code[at..].starts_with("::") {
            at += 2;
        } else {
            return (vec![prefix], at);
        }
    }
}

/// The text with `//` comments and string literals blanked (so doc prose and messages naming
/// `crate::x` do not count).
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_str = false;
        let mut prev = ' ';
        let mut kept = String::new();
        let chars: Vec<char> = line.chars().collect();
        let mut k = 0;
        while k < chars.len() {
            let c = chars[k];
            if !in_str && c == '/' && chars.get(k + 1) == Some(&'/') {
                break;
            }
            if c == '"' && prev != '\\' && !(prev == '\'' && chars.get(k + 1) == Some(&'\'')) {
                in_str = !in_str;
                kept.push(' ');
            } else {
                kept.push(if in_str { ' ' } else { c });
            }
            prev = if prev == '\\' && c == '\\' { ' ' } else { c };
            k += 1;
        }
        out.push_str(&kept);
        out.push('\n');
    }
    out
}

/// A file's re-exports (`pub use ...;`, any visibility) and the rest of its text.
fn split_reexports(text: &str) -> (Vec<String>, String) {
    let mut reexports = Vec::new();
    let mut rest = String::with_capacity(text.len());
    let mut pending: Option<String> = None;
    for line in text.lines() {
        let t = line.trim_start();
        let starts = t.starts_with("pub use ") || (t.starts_with("pub(") && t.contains(") use "));
        if let Some(mut stmt) = pending.take().or_else(|| starts.then(String::new)) {
            stmt.push_str(line);
            stmt.push('\n');
            if line.contains(';') {
                reexports.push(stmt);
            } else {
                pending = Some(stmt);
            }
            rest.push('\n');
        } else {
            rest.push_str(line);
            rest.push('\n');
        }
    }
    (reexports, rest)
}

/// What a module re-exports: exported name -> the absolute path it shows, and glob sources.
type Exports = (BTreeMap<String, Vec<String>>, Vec<Vec<String>>);

/// The file-level edges of one crate: module -> modules (other files) whose items it uses.
/// Paths through a re-export (`pub use`) lead to the file that defines the item, and a re-export
/// itself is not a use: a facade does not depend on what it shows.
pub(crate) fn edges(files: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let is_file = |m: &str| files.contains_key(m);
    let mut exports: BTreeMap<&str, Exports> = BTreeMap::new();
    let mut bodies = BTreeMap::new();
    for (module, text) in files {
        let (reexports, rest) = split_reexports(non_test(text));
        let entry = exports.entry(module.as_str()).or_default();
        for stmt in reexports {
            let stmt = stmt.split_once(" use ").map_or(stmt.as_str(), |(_, s)| s).to_owned();
            // `pub use x::Y;` names a child without a root keyword: make it relative.
            let rooted = if stmt.trim_start().starts_with("crate::") || stmt.trim_start().starts_with("super::") {
                stmt
            } else {
                format!("self::{}", stmt.trim_start())
            };
            for path in named_paths(module, &rooted, &is_file) {
                match path.last() {
                    Some(name) if is_file(&path.join("::")) || path.len() > 1 => {
                        entry.0.insert(name.clone(), path.clone());
                    }
                    _ => {}
                }
                if stmt_is_glob(&rooted) {
                    entry.1.push(path);
                }
            }
        }
        bodies.insert(module.clone(), rest);
    }
    let resolve = |path: &[String]| -> Option<String> {
        let mut path = path.to_vec();
        for _ in 0..8 {
            let n = (0..=path.len()).rev().find(|&n| is_file(&path[..n].join("::")))?;
            let module = path[..n].join("::");
            let Some(next) = path.get(n) else { return Some(module) };
            match exports.get(module.as_str()).and_then(|(named, _)| named.get(next)) {
                Some(target) if target.as_slice() != &path[..=n] => {
                    let mut followed = target.clone();
                    followed.extend_from_slice(&path[n + 1..]);
                    path = followed;
                }
                _ => {
                    // Through a single glob re-export, if that is all the module shows.
                    let globs = exports.get(module.as_str()).map(|(_, g)| g.as_slice()).unwrap_or_default();
                    let defines = files[&module].contains(&format!(" {next}"));
                    if globs.len() == 1 && !defines {
                        let mut followed = globs[0].clone();
                        followed.extend_from_slice(&path[n..]);
                        path = followed;
                    } else {
                        return Some(module);
                    }
                }
            }
        }
        None
    };
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, body) in &bodies {
        let targets = graph.entry(module.clone()).or_default();
        for path in named_paths(module, body, &is_file) {
            if let Some(t) = resolve(&path)
                && &t != module
            {
                targets.insert(t);
            }
        }
    }
    graph
}

fn stmt_is_glob(stmt: &str) -> bool {
    stmt.contains("::*")
}

/// The circles of a graph: each strongly connected set of two or more files, sorted.
pub(crate) fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Tarjan's algorithm, recursive: module graphs are small.
    struct State<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut set = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                set.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if set.len() > 1 {
                set.sort();
                s.out.push(set);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out.sort();
    s.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crate_of(files: &[(&str, &str)]) -> BTreeMap<String, String> {
        files.iter().map(|(m, t)| ((*m).to_owned(), (*t).to_owned())).collect()
    }

    #[test]
    fn file_paths_map_to_modules() {
        assert_eq!(module_of(Path::new("lib.rs")).as_deref(), Some(""));
        assert_eq!(module_of(Path::new("a/mod.rs")).as_deref(), Some("a"));
        assert_eq!(module_of(Path::new("a/b.rs")).as_deref(), Some("a::b"));
        assert_eq!(module_of(Path::new("bin/x.rs")), None);
    }

    #[test]
    fn grouped_uses_super_paths_and_inline_paths_are_edges() {
        let files = crate_of(&[
            ("", "mod a; mod b; mod c;"),
            ("a", "use crate::{b::{X, Y as Z}, c};\n"),
            ("b", "fn f() { super::c::g(); } // crate::a::nothing\nconst S: &str = \"crate::a\";"),
            ("c", "fn g() {}\n#[cfg(test)]\nmod tests { use crate::a::*; }"),
        ]);
        let g = edges(&files);
        assert_eq!(g["a"], BTreeSet::from(["b".to_owned(), "c".to_owned()]));
        assert_eq!(g["b"], BTreeSet::from(["c".to_owned()]), "comments, strings and tests do not count");
        assert!(g["c"].is_empty());
        assert!(circles(&g).is_empty());
    }

    #[test]
    fn non_ascii_code_is_read_past() {
        let files = crate_of(&[
            ("", "mod a; mod c;"),
            ("a", "fn f(s: &str) { s.replace('▁', \" \"); crate::c::g(); }"),
            ("c", ""),
        ]);
        assert_eq!(edges(&files)["a"], BTreeSet::from(["c".to_owned()]));
    }

    #[test]
    fn a_circle_through_super_is_found() {
        let files = crate_of(&[
            ("", ""),
            ("m", "pub use self::x::X; pub struct T;"),
            ("m::x", "use super::T; use super::y::Y;"),
            ("m::y", "pub struct Y; fn f() -> crate::m::x::X { todo!() }"),
        ]);
        assert_eq!(circles(&edges(&files)), vec![vec!["m::x".to_owned(), "m::y".to_owned()]]);
    }
}
