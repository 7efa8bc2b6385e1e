//! The workspace's files form layers: no import circle between the files of
//! a crate, at any depth (docs/architecture.md, docs/runtime.md "How the
//! modules depend on each other"), and no function longer than
//! [`MAX_FN_LINES`]. Reads the sources of every crate under `crates/`, so it
//! needs no runtime and runs in milliseconds.
//!
//! A file's module is its path under `src/` (`nic/linux.rs` is `nic::linux`,
//! `kv/mod.rs` is `kv`). An edge is a path in code (not in comments or
//! strings) that starts at `crate::`, `super::` or `self::`, resolved to the
//! deepest module it names; a name a module imports (`pub use linux::Foo`)
//! is followed to the module it comes from. The edges are read level by
//! level: under each module, its children are the nodes (each with all its
//! descendants) and an edge from a file in one child to a file in another is
//! an edge between the two children. A module's own file (`mod.rs`, the
//! crate root) declares, re-exports and holds what its children share, so
//! its edges to and from its descendants are not circles.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// No function in the workspace is longer than this (from its `fn` line to
/// its closing brace): a longer one holds several mechanisms.
const MAX_FN_LINES: usize = 200;

type Module = Vec<String>;

/// One source file of a crate's library or binary (not its `src/bin/`
/// programs, which are crates of their own).
struct Source {
    krate: String,
    module: Module,
    code: String,
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn crate_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(workspace().join("crates"))
        .expect("read crates/")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.join("Cargo.toml").exists())
        .collect();
    dirs.sort();
    dirs
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
}

/// The module of a file at `rel` under `src/`.
fn module_of(rel: &Path) -> Module {
    let mut parts: Module = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    let stem = last.strip_suffix(".rs").unwrap_or(&last);
    let is_root = parts.is_empty() && (stem == "lib" || stem == "main");
    if stem != "mod" && !is_root {
        parts.push(stem.to_owned());
    }
    parts
}

fn sources() -> Vec<Source> {
    let mut all = Vec::new();
    for dir in crate_dirs() {
        let krate = dir.file_name().unwrap().to_string_lossy().into_owned();
        let src = dir.join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        for path in files {
            let rel = path.strip_prefix(&src).unwrap();
            if rel.starts_with("bin") {
                continue;
            }
            let text = fs::read_to_string(&path).expect("read a source file");
            all.push(Source {
                krate: krate.clone(),
                module: module_of(rel),
                code: code_only(&text),
            });
        }
    }
    all
}

/// `src` with comments blanked and string and character literals emptied,
/// line breaks kept: braces and paths are then read from code only.
fn code_only(src: &str) -> String {
    let s: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut i = 0;
    // Copies the line breaks of `s[from..to]`, so that line numbers hold.
    let breaks = |out: &mut String, from: usize, to: usize| {
        out.extend(s[from..to.min(s.len())].iter().filter(|&&c| c == '\n'));
    };
    while i < s.len() {
        let c = s[i];
        let next = s.get(i + 1).copied().unwrap_or(' ');
        if c == '/' && next == '/' {
            while i < s.len() && s[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == '*' {
            let (start, mut depth) = (i, 0);
            while i < s.len() {
                if s[i] == '/' && s.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if s[i] == '*' && s.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
            breaks(&mut out, start, i);
        } else if (c == 'r' || (c == 'b' && next == 'r')) && (i == 0 || !ident(s[i - 1])) && {
            let mut j = i + if c == 'b' { 2 } else { 1 };
            while s.get(j) == Some(&'#') {
                j += 1;
            }
            s.get(j) == Some(&'"')
        } {
            // A raw string: ends at `"` and as many `#` as it opened with.
            let start = i;
            i += if c == 'b' { 2 } else { 1 };
            let mut hashes = 0;
            while s[i] == '#' {
                hashes += 1;
                i += 1;
            }
            i += 1;
            loop {
                if i >= s.len() {
                    break;
                }
                if s[i] == '"' && (0..hashes).all(|k| s.get(i + 1 + k) == Some(&'#')) {
                    i += 1 + hashes;
                    break;
                }
                i += 1;
            }
            out.push_str("\"\"");
            breaks(&mut out, start, i);
        } else if c == '"' {
            let start = i;
            i += 1;
            while i < s.len() && s[i] != '"' {
                i += if s[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
            breaks(&mut out, start, i);
        } else if c == '\'' {
            // A character literal (`'a'`, `'\n'`, `'\u{7f}'`), or a lifetime.
            let end = if next == '\\' {
                (i + 2..s.len().min(i + 12)).find(|&j| s[j] == '\'')
            } else if s.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(end) => {
                    out.push_str("' '");
                    i = end + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// A cursor over code (from [`code_only`]).
struct Cursor<'a> {
    s: &'a [char],
    at: usize,
}

impl Cursor<'_> {
    fn skip_space(&mut self) {
        while self.s.get(self.at).is_some_and(|c| c.is_whitespace()) {
            self.at += 1;
        }
    }

    fn eat(&mut self, token: &str) -> bool {
        self.skip_space();
        let n = token.chars().count();
        let matches = self.at + n <= self.s.len()
            && self.s[self.at..self.at + n]
                .iter()
                .copied()
                .eq(token.chars());
        if matches {
            self.at += n;
        }
        matches
    }

    fn ident(&mut self) -> Option<String> {
        self.skip_space();
        let start = self.at;
        while self.s.get(self.at).copied().is_some_and(is_ident) {
            self.at += 1;
        }
        (self.at > start).then(|| self.s[start..self.at].iter().collect())
    }

    /// The paths of a use tree (`a::{b, c::d as e, *}`) or of a path in an
    /// expression (which ends at the first thing that is not a segment),
    /// each with the name it binds. `prefix` is what came before.
    fn tree(&mut self, prefix: Module, out: &mut Vec<(Module, Option<String>)>) {
        if self.eat("{") {
            loop {
                if self.eat("}") {
                    return;
                }
                self.tree(prefix.clone(), out);
                if !self.eat(",") {
                    self.eat("}");
                    return;
                }
            }
        }
        let before = self.at;
        match self.ident() {
            Some(name) if name != "as" => {
                let mut path = prefix;
                path.push(name.clone());
                if self.eat("::") {
                    self.tree(path, out);
                    return;
                }
                let bound = if self.eat("as") { self.ident() } else { None };
                out.push((path, Some(bound.unwrap_or(name))));
            }
            _ => {
                self.at = before;
                out.push((prefix, None));
            }
        }
    }
}

/// What one file names: each path with the module it is written in (inline
/// modules such as `mod tests { … }` included) and, for a `use`, the name it
/// binds.
struct Mention {
    /// The module the path is read from (`crate::` → the root).
    base: Module,
    path: Module,
    /// `Some` for a `use` in the file's own module (not an inline one).
    binds: Option<String>,
    /// A `use` starting with a name that may be a child module.
    relative: bool,
    /// A `use …::*` in the file's own module.
    glob: bool,
}

fn mentions_in(code: &str, module: &Module) -> Vec<Mention> {
    let s: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    // The inline modules open at this point, each with the brace depth its
    // body starts at.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut pending_mod: Option<String> = None;
    let mut depth = 0usize;
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        if c == '{' {
            depth += 1;
            if let Some(name) = pending_mod.take() {
                inline.push((name, depth));
            }
            i += 1;
            continue;
        }
        if c == '}' {
            if inline.last().is_some_and(|&(_, d)| d == depth) {
                inline.pop();
            }
            depth = depth.saturating_sub(1);
            i += 1;
            continue;
        }
        if c == ';' {
            pending_mod = None;
        }
        let boundary = i == 0 || !(is_ident(s[i - 1]) || s[i - 1] == ':' || s[i - 1] == '$');
        if !is_ident(c) || !boundary {
            i += 1;
            continue;
        }
        let mut cur = Cursor { s: &s, at: i };
        let word = cur.ident().expect("an identifier");
        let here: Module = module
            .iter()
            .cloned()
            .chain(inline.iter().map(|(n, _)| n.clone()))
            .collect();
        match word.as_str() {
            "mod" => {
                pending_mod = cur.ident();
                i = cur.at;
            }
            "use" => {
                let mut paths = Vec::new();
                cur.tree(Vec::new(), &mut paths);
                for (path, bound) in paths {
                    // `use a::b::{self}` binds `b`.
                    let bound = match (bound.as_deref(), path.len()) {
                        (Some("self"), n) if n >= 2 => Some(path[n - 2].clone()),
                        _ => bound,
                    };
                    let Some((base, path, relative)) = anchor(&here, &path) else {
                        continue;
                    };
                    found.push(Mention {
                        base,
                        path,
                        glob: bound.is_none() && inline.is_empty(),
                        binds: if inline.is_empty() { bound } else { None },
                        relative,
                    });
                }
                i = cur.at;
            }
            "crate" | "super" | "self" if cur.eat("::") => {
                let mut paths = Vec::new();
                cur.tree(vec![word], &mut paths);
                for (path, _) in paths {
                    if let Some((base, path, _)) = anchor(&here, &path) {
                        found.push(Mention {
                            base,
                            path,
                            binds: None,
                            relative: false,
                            glob: false,
                        });
                    }
                }
                i = cur.at;
            }
            _ => i = cur.at,
        }
    }
    found
}

/// The module a path is read from and the rest of it: `crate::a` → (root,
/// `a`); `super::super::a` from `x::y::z` → (`x`, `a`); `a::b` → (`here`,
/// `a::b`, relative: `a` may be a child module or an outside crate).
fn anchor(here: &Module, path: &Module) -> Option<(Module, Module, bool)> {
    let first = path.first()?;
    match first.as_str() {
        "crate" => Some((Vec::new(), path[1..].to_vec(), false)),
        "self" => Some((here.clone(), path[1..].to_vec(), false)),
        "super" => {
            let ups = path.iter().take_while(|p| *p == "super").count();
            let base = here[..here.len().checked_sub(ups)?].to_vec();
            Some((base, path[ups..].to_vec(), false))
        }
        _ => Some((here.clone(), path.clone(), true)),
    }
}

/// The names of the items a file defines at its top level (what a glob
/// import of its module brings in, with its own imports).
fn definitions(code: &str) -> BTreeSet<String> {
    let s: Vec<char> = code.chars().collect();
    let (mut found, mut depth, mut i) = (BTreeSet::new(), 0usize, 0);
    while i < s.len() {
        match s[i] {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            c if depth == 0 && is_ident(c) && (i == 0 || !is_ident(s[i - 1])) => {
                let mut cur = Cursor { s: &s, at: i };
                let word = cur.ident().expect("an identifier");
                let item = matches!(
                    word.as_str(),
                    "fn" | "struct" | "enum" | "trait" | "type" | "const" | "static" | "union"
                );
                if let Some(name) = item.then(|| cur.ident()).flatten() {
                    found.insert(name);
                }
                i = cur.at;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    found
}

/// One crate's modules, what each file imports and which names each binds
/// or defines.
struct Crate {
    modules: BTreeSet<Module>,
    mentions: BTreeMap<Module, Vec<Mention>>,
    defines: BTreeMap<Module, BTreeSet<String>>,
}

impl Crate {
    /// The deepest module `base::path` names, and the item after it.
    fn resolve(&self, base: &Module, path: &Module) -> (Module, Option<String>) {
        let mut module = base.clone();
        let mut rest = path.iter();
        for segment in rest.by_ref() {
            if segment == "self" {
                continue;
            }
            let mut deeper = module.clone();
            deeper.push(segment.clone());
            if !self.modules.contains(&deeper) {
                return (module, Some(segment.clone()));
            }
            module = deeper;
        }
        (module, None)
    }

    /// The module an import names, `None` for an outside crate's.
    fn imported(&self, import: &Mention) -> Option<(Module, Option<String>)> {
        if import.relative {
            let mut child = import.base.clone();
            child.push(import.path[0].clone());
            if !self.modules.contains(&child) {
                return None;
            }
        }
        Some(self.resolve(&import.base, &import.path))
    }

    /// Where `module`'s name `name` comes from when `module` imports it:
    /// by name (`pub use linux::Foo`), or by a glob (`pub use kthread::*`)
    /// of a module that defines it.
    fn import_of(&self, module: &Module, name: &str) -> Option<(Module, Option<String>)> {
        let mentions = self.mentions.get(module)?;
        if let Some(import) = mentions.iter().find(|m| m.binds.as_deref() == Some(name)) {
            return self.imported(import);
        }
        // A glob brings in what the module defines (its private imports
        // stay private; a glob of re-exports is not followed).
        mentions
            .iter()
            .filter(|m| m.glob)
            .filter_map(|m| self.imported(m))
            .map(|(from, _)| from)
            .find(|from| self.defines.get(from).is_some_and(|d| d.contains(name)))
            .map(|from| (from, None))
    }

    /// The module `mention` leads to, following a name a module imports
    /// to where it comes from. `None` for an outside crate.
    fn target(&self, mention: &Mention) -> Option<Module> {
        let (mut module, mut item) = self.imported(mention)?;
        // A few hops: re-exports of re-exports; no more, so a `use` circle
        // cannot loop.
        for _ in 0..4 {
            let Some(name) = item else { break };
            let Some(next) = self.import_of(&module, &name) else {
                break;
            };
            (module, item) = next;
        }
        Some(module)
    }
}

impl Crate {
    fn add(&mut self, module: Module, code: &str) {
        self.modules.insert(module.clone());
        self.defines
            .entry(module.clone())
            .or_default()
            .extend(definitions(code));
        let found = mentions_in(code, &module);
        self.mentions.entry(module).or_default().extend(found);
    }
}

fn crates() -> BTreeMap<String, Crate> {
    let mut crates: BTreeMap<String, Crate> = BTreeMap::new();
    for source in sources() {
        crates
            .entry(source.krate.clone())
            .or_insert(Crate {
                modules: BTreeSet::new(),
                mentions: BTreeMap::new(),
                defines: BTreeMap::new(),
            })
            .add(source.module, &source.code);
    }
    crates
}

type Graph = BTreeMap<String, BTreeSet<String>>;

/// Per crate and per parent module, the graph between that module's
/// children (see the file's doc).
fn levels(crates: &BTreeMap<String, Crate>) -> BTreeMap<(String, Module), Graph> {
    let mut levels: BTreeMap<(String, Module), Graph> = BTreeMap::new();
    for (name, krate) in crates {
        for module in &krate.modules {
            if let Some((_, parent)) = module.split_last() {
                levels
                    .entry((name.clone(), parent.to_vec()))
                    .or_default()
                    .entry(module.last().unwrap().clone())
                    .or_default();
            }
        }
        for (from, mentions) in &krate.mentions {
            for mention in mentions {
                let Some(to) = krate.target(mention) else {
                    continue;
                };
                let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
                if common == from.len() || common == to.len() {
                    continue; // a module and its own descendant
                }
                levels
                    .entry((name.clone(), from[..common].to_vec()))
                    .or_default()
                    .entry(from[common].clone())
                    .or_default()
                    .insert(to[common].clone());
            }
        }
    }
    levels
}

/// The nodes `from` reaches.
fn reachable(from: &str, graph: &Graph) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![from.to_owned()];
    while let Some(node) = todo.pop() {
        for next in graph.get(&node).into_iter().flatten() {
            if seen.insert(next.clone()) {
                todo.push(next.clone());
            }
        }
    }
    seen
}

/// The groups of nodes that import each other, directly or not (strongly
/// connected components with more than one node).
fn circles(graph: &Graph) -> BTreeSet<BTreeSet<String>> {
    let reach: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|m| (m, reachable(m, graph))).collect();
    graph
        .keys()
        .filter(|m| reach[m].contains(*m))
        .map(|m| {
            reach[m]
                .iter()
                .filter(|other| reach.get(other).is_some_and(|r| r.contains(m)))
                .cloned()
                .collect()
        })
        .collect()
}

/// One circle through `group`, written `a -> b -> a` (shortest, from its
/// first node).
fn one_circle(group: &BTreeSet<String>, graph: &Graph) -> String {
    let start = group.first().expect("a non-empty group");
    let mut came_from: BTreeMap<String, String> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start.clone()]);
    while let Some(node) = queue.pop_front() {
        for next in graph.get(&node).into_iter().flatten() {
            if !group.contains(next) || came_from.contains_key(next) {
                continue;
            }
            came_from.insert(next.clone(), node.clone());
            if next == start {
                let mut path = vec![start.clone()];
                let mut at = came_from[start].clone();
                while &at != start {
                    path.push(at.clone());
                    at = came_from[&at].clone();
                }
                path.push(start.clone());
                path.reverse();
                return path.join(" -> ");
            }
            queue.push_back(next.clone());
        }
    }
    unreachable!("a strongly connected group has a circle")
}

fn listing(graph: &Graph) -> String {
    graph
        .iter()
        .map(|(m, to)| {
            let to: Vec<_> = to.iter().cloned().collect();
            format!("  {m} -> {}\n", to.join(", "))
        })
        .collect()
}

fn place(krate: &str, parent: &Module) -> String {
    if parent.is_empty() {
        format!("crates/{krate}/src")
    } else {
        format!("crates/{krate}/src/{}", parent.join("/"))
    }
}

/// Each node's layer: 0 for a leaf, else one above its highest import.
fn layers(graph: &Graph) -> BTreeMap<String, usize> {
    fn layer(node: &str, graph: &Graph, memo: &mut BTreeMap<String, usize>) -> usize {
        if let Some(&l) = memo.get(node) {
            return l;
        }
        memo.insert(node.to_owned(), 0); // a circle, reported elsewhere
        let l = graph
            .get(node)
            .into_iter()
            .flatten()
            .map(|next| layer(next, graph, memo) + 1)
            .max()
            .unwrap_or(0);
        memo.insert(node.to_owned(), l);
        l
    }
    let mut memo = BTreeMap::new();
    for node in graph.keys() {
        layer(node, graph, &mut memo);
    }
    memo
}

/// The functions of `code`: (name, first line, line count).
fn functions(code: &str) -> Vec<(String, usize, usize)> {
    let s: Vec<char> = code.chars().collect();
    let line_at = |at: usize| 1 + s[..at].iter().filter(|&&c| c == '\n').count();
    let mut found = Vec::new();
    let mut i = 0;
    while i + 2 < s.len() {
        let boundary = i == 0 || !is_ident(s[i - 1]);
        if !(boundary && s[i] == 'f' && s[i + 1] == 'n' && !is_ident(s[i + 2])) {
            i += 1;
            continue;
        }
        let mut cur = Cursor { s: &s, at: i + 2 };
        let Some(name) = cur.ident() else {
            i += 2; // a `fn(…)` type
            continue;
        };
        // The body opens at the first `{` outside the signature's brackets;
        // a `;` there first means a declaration without a body.
        let (mut j, mut nesting) = (cur.at, 0i32);
        while j < s.len() {
            match s[j] {
                '(' | '[' => nesting += 1,
                ')' | ']' => nesting -= 1,
                '{' | ';' if nesting == 0 => break,
                _ => {}
            }
            j += 1;
        }
        if j >= s.len() || s[j] == ';' {
            i = j;
            continue;
        }
        let mut depth = 0;
        let mut end = j;
        while end < s.len() {
            match s[end] {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                _ => {}
            }
            end += 1;
        }
        let first = line_at(i);
        found.push((name, first, line_at(end.min(s.len() - 1)) - first + 1));
        i = cur.at; // nested functions are measured too
    }
    found
}

#[test]
fn paths_are_read() {
    let here: Module = vec!["nic".into(), "linux".into()];
    let paths = |code: &str| -> Vec<String> {
        mentions_in(&code_only(code), &here)
            .into_iter()
            .filter(|m| !m.relative)
            .map(|m| format!("{}|{}", m.base.join("::"), m.path.join("::")))
            .collect()
    };
    assert_eq!(
        paths("use crate::sched::{self, Owner};"),
        ["|sched::self", "|sched::Owner"]
    );
    assert_eq!(
        paths("    crate::signals::fatal(\"x\")"),
        ["|signals::fatal"]
    );
    assert_eq!(
        paths("use crate::{\n    config,\n    net::{Stack, tcp::Tcp as T},\n};"),
        ["|config", "|net::Stack", "|net::tcp::Tcp"]
    );
    assert_eq!(
        paths("use super::af_packet::Ring;"),
        ["nic|af_packet::Ring"]
    );
    assert_eq!(paths("mod tests { use super::*; }"), ["nic::linux|"]);
    assert_eq!(
        paths("let x = super::super::Config::default();"),
        ["|Config::default"]
    );
    assert!(paths("use ginza_crate::x; $crate::y(); // crate::z").is_empty());
    assert_eq!(paths("mod tests { use super::super::kv; }"), ["nic|kv"]);
    assert!(paths("let s = \"crate::a\"; let c = 'c'; fn f<'a>() {}").is_empty());
}

#[test]
fn imports_are_followed_to_the_file_that_defines_the_name() {
    let mut krate = Crate {
        modules: BTreeSet::new(),
        mentions: BTreeMap::new(),
        defines: BTreeMap::new(),
    };
    let m = |path: &str| -> Module {
        path.split('/')
            .filter(|p| !p.is_empty())
            .map(String::from)
            .collect()
    };
    krate.add(m(""), "mod s; mod nic;");
    krate.add(
        m("s"),
        "mod k; mod u;\npub(crate) use k::*;\npub(crate) use u::*;",
    );
    krate.add(m("s/k"), "use super::U;\npub(crate) struct K { u: U }");
    krate.add(
        m("s/u"),
        "pub(crate) struct U;\nfn f() { let _ = super::K::new(); }",
    );
    krate.add(m("nic"), "mod a; mod b;\npub use a::Ring;");
    krate.add(m("nic/a"), "pub struct Ring;");
    krate.add(m("nic/b"), "use super::Ring;");
    let levels = levels(&BTreeMap::from([("c".to_owned(), krate)]));
    let s = &levels[&("c".to_owned(), m("s"))];
    assert_eq!(circles(s).len(), 1, "k and u import each other: {s:?}");
    let nic = &levels[&("c".to_owned(), m("nic"))];
    assert!(nic["b"].contains("a"), "b's Ring is a's: {nic:?}");
}

#[test]
fn functions_are_measured() {
    let code = code_only(
        "fn a() {\n    let s = \"}\";\n}\nfn b<const N: usize>(x: [u8; N]) -> u8 {\n x[0]\n}\n\
         trait T { fn c(&self); }\nfn d(f: fn(u8) -> u8) { let c = '}'; }\n",
    );
    let found: Vec<_> = functions(&code)
        .into_iter()
        .map(|(n, at, len)| format!("{n}@{at}+{len}"))
        .collect();
    assert_eq!(found, ["a@1+3", "b@4+3", "d@8+1"]);
}

#[test]
fn no_import_circle_between_files_of_a_crate() {
    let levels = levels(&crates());
    let mut failures = Vec::new();
    for ((krate, parent), graph) in &levels {
        for group in circles(graph) {
            failures.push(format!(
                "{}: import circle {} (among {group:?}); the graph there:\n{}",
                place(krate, parent),
                one_circle(&group, graph),
                listing(graph)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn no_function_is_longer_than_the_limit() {
    let mut long = Vec::new();
    for dir in crate_dirs() {
        let mut files = Vec::new();
        for sub in ["src", "tests", "benches", "examples"] {
            rust_files(&dir.join(sub), &mut files);
        }
        for path in files {
            let code = code_only(&fs::read_to_string(&path).expect("read a source file"));
            let shown = path
                .strip_prefix(workspace())
                .unwrap()
                .display()
                .to_string();
            for (name, line, len) in functions(&code) {
                if len > MAX_FN_LINES {
                    long.push(format!("{shown}:{line} fn {name}: {len} lines"));
                }
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines (split them by mechanism):\n{}",
        long.join("\n")
    );
}

#[test]
fn runtime_modules_form_layers() {
    let levels = levels(&crates());
    let graph = &levels[&("runtime".to_owned(), Vec::new())];
    let listing = listing(graph);
    let mut by_layer: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for (module, l) in layers(graph) {
        by_layer.entry(l).or_default().push(module);
    }
    for (l, modules) in &by_layer {
        println!("layer {l}: {}", modules.join(", "));
    }
    // The lowest pieces stay low: the count every deferred section raises
    // (and the one-instruction thread-local read it stands on), the
    // spinlock, the signal plumbing (and the program threads' own
    // thread pointers, which a handler restores first), the configuration,
    // the timer heap, the shared region with iokerneld (below the
    // scheduler, which holds each kthread's end of it) and the
    // application's own AF_XDP socket (the direct path: a kthread's packet
    // rings hold it beside their ends of the region).
    for (leaf, may_use) in [
        ("deferral", &["thread_word"][..]),
        ("thread_word", &[][..]),
        ("spinlock", &["deferral"][..]),
        ("signals", &["foreign_tls"][..]),
        ("foreign_tls", &[][..]),
        ("config", &["error"][..]),
        ("timer", &["spinlock"][..]),
        ("link", &["config", "own_socket", "spinlock"][..]),
        ("own_socket", &["config", "spinlock"][..]),
        ("arch", &[][..]),
        ("uthread_stack", &[][..]),
    ] {
        let uses = graph.get(leaf).cloned().unwrap_or_default();
        assert!(
            uses.iter().all(|m| may_use.contains(&m.as_str())),
            "{leaf} imports {uses:?}, only {may_use:?} allowed:\n{listing}"
        );
    }
}
