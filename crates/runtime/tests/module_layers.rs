//! The runtime's modules form layers: no import circle between them
//! (docs/runtime.md, "How the modules depend on each other"). A module is a
//! top-level file or directory of `src/` (`sched/` is one module: its files
//! are one mechanism each, but share private fields); an edge is any
//! `crate::X` mention in code (not in comments). Reads the sources, so it
//! needs no runtime and runs in milliseconds.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The top-level module `path` (relative to `src/`) belongs to; `None` for
/// the crate root, which only declares and re-exports.
fn module_of(rel: &Path) -> Option<String> {
    let first = rel.components().next()?.as_os_str().to_str()?.to_owned();
    match first.strip_suffix(".rs") {
        Some("lib") => None,
        Some(name) => Some(name.to_owned()),
        None => Some(first),
    }
}

/// The modules named after `crate::` in `line` (`crate::a::b`,
/// `crate::{a, b::c}`).
fn mentions(line: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut found = Vec::new();
    for (at, _) in line.match_indices("crate::") {
        if at > 0 {
            let before = line[..at].chars().next_back().unwrap_or(' ');
            if before.is_alphanumeric() || matches!(before, '_' | ':' | '$') {
                continue; // `ginza_crate::`, `$crate::`, a longer path
            }
        }
        let rest = &line[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            found.extend(
                group
                    .split(',')
                    .map(|item| ident(item.trim()))
                    .filter(|n| !n.is_empty()),
            );
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                found.push(name);
            }
        }
    }
    found
}

fn collect(dir: &Path, src: &Path, graph: &mut Graph) {
    for entry in fs::read_dir(dir).expect("read src/") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            collect(&path, src, graph);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let rel = path.strip_prefix(src).expect("under src/");
        let Some(module) = module_of(rel) else {
            continue;
        };
        let text = fs::read_to_string(&path).expect("read a source file");
        // Comments dropped, lines joined: a `use crate::{…}` group that
        // rustfmt spreads over several lines is read whole.
        let code: String = text
            .lines()
            .map(|line| line.split("//").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join(" ");
        let edges = graph.entry(module.clone()).or_default();
        for target in mentions(&code) {
            if target != module {
                edges.insert(target);
            }
        }
    }
}

fn runtime_graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph = Graph::new();
    collect(&src, &src, &mut graph);
    graph
}

/// The modules `from` reaches through imports.
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

/// The groups of modules that import each other, directly or not (strongly
/// connected components with more than one module).
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

/// Each module's layer: 0 for a leaf, else one above its highest import.
fn layers(graph: &Graph) -> BTreeMap<String, usize> {
    fn layer(node: &str, graph: &Graph, memo: &mut BTreeMap<String, usize>) -> usize {
        if let Some(&l) = memo.get(node) {
            return l;
        }
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

#[test]
fn mentions_are_parsed() {
    assert_eq!(mentions("use crate::sched::{self, Owner};"), ["sched"]);
    assert_eq!(mentions("    crate::signals::fatal(\"x\")"), ["signals"]);
    assert_eq!(
        mentions("use crate::{config, net::Stack};"),
        ["config", "net"]
    );
    // A group rustfmt spread over lines, as `collect` joins it.
    assert_eq!(
        mentions("use crate::{     config,     net::Stack, };"),
        ["config", "net"]
    );
    assert!(mentions("use ginza_crate::x; $crate::y").is_empty());
}

#[test]
fn runtime_modules_form_layers() {
    let graph = runtime_graph();
    let listing: String = graph
        .iter()
        .map(|(m, to)| {
            let to: Vec<_> = to.iter().cloned().collect();
            format!("  {m} -> {}\n", to.join(", "))
        })
        .collect();
    let found = circles(&graph);
    assert!(
        found.is_empty(),
        "import circles between {found:?}\nthe runtime's module graph:\n{listing}"
    );
    let mut by_layer: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for (module, l) in layers(&graph) {
        by_layer.entry(l).or_default().push(module);
    }
    for (l, modules) in &by_layer {
        println!("layer {l}: {}", modules.join(", "));
    }
    // The lowest pieces stay low: the count every deferred section raises,
    // the spinlock, the signal plumbing, the configuration, the timer heap,
    // the shared region with iokerneld (below the scheduler, which holds
    // each kthread's end of it).
    for (leaf, may_use) in [
        ("deferral", &[][..]),
        ("spinlock", &["deferral"][..]),
        ("signals", &[][..]),
        ("config", &["error"][..]),
        ("timer", &["spinlock"][..]),
        ("link", &["config", "spinlock"][..]),
        ("arch", &[][..]),
        ("stack", &[][..]),
    ] {
        let uses = graph.get(leaf).cloned().unwrap_or_default();
        assert!(
            uses.iter().all(|m| may_use.contains(&m.as_str())),
            "{leaf} imports {uses:?}, only {may_use:?} allowed:\n{listing}"
        );
    }
}
