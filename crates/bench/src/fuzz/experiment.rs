//! Target `experiment`: experiment files (docs/experiments.md) into the
//! loader (`experiment::spec::parse`) and, when they load, the planner
//! (`Plan::new`, which picks a runner per system, then the estimate and
//! status `ginza bench list` prints). The files are the shipped ones with
//! lines edited (values swapped for others of any type, lines dropped,
//! doubled, inserted, bytes changed) or written from scratch out of the
//! schema's tables, keys and values.
//!
//! Checked: no panic; a refusal names the file and, when it gives a line,
//! a line the file has.

use std::path::Path;

use arbitrary::{Arbitrary, Unstructured};

use super::{describe, List, Outcome};
use crate::experiment::{spec, Plan};

/// Shipped experiments to edit: a sweep, a time series, Shinjuku's
/// scheduling with baselines, and a simulated one.
const FILES: [&str; 4] = [
    include_str!("../../../../bench/experiments/shenango-fig1.toml"),
    include_str!("../../../../bench/experiments/shenango-fig5-steps.toml"),
    include_str!("../../../../bench/experiments/shinjuku-fig1-bimodal.toml"),
    include_str!("../../../../bench/experiments/calisto-fig6-7-sim.toml"),
];

const FILE_NAME: &str = "fuzz.toml";

#[derive(Debug, Arbitrary)]
enum Input {
    Edited { file: u8, edits: List<Edit> },
    Written { tables: List<Table> },
}

#[derive(Debug, Arbitrary)]
enum Edit {
    /// In the first table named `table` (of [`TABLES`]), key `key` (of
    /// that table's) is set to `value`: its line replaced, or one added.
    Set {
        table: u8,
        key: u8,
        value: Value,
    },
    /// Line `line`'s value (after its `=`) becomes `value`.
    Value {
        line: u8,
        value: Value,
    },
    Delete {
        line: u8,
    },
    Double {
        line: u8,
    },
    Insert {
        line: u8,
        key: Key,
        value: Value,
    },
    SetByte {
        at: u16,
        value: u8,
    },
    Truncate {
        at: u16,
    },
}

#[derive(Debug, Arbitrary)]
struct Table {
    header: Header,
    entries: List<(Key, Value)>,
}

#[derive(Debug, Arbitrary)]
enum Header {
    Experiment,
    App,
    System,
    Baseline,
    Load,
    Plot,
    /// `[[load.steps]]`
    Steps,
    Other(String),
}

#[derive(Debug, Arbitrary)]
enum Key {
    Known(u8),
    Other(String),
}

const KEYS: &[&str] = &[
    "name",
    "reproduces",
    "description",
    "rounds",
    "in_all",
    "program",
    "mode",
    "scheduling",
    "label",
    "kind",
    "allocator",
    "steering",
    "policy",
    "quantum",
    "placement",
    "grant_latency",
    "cores",
    "warm_table",
    "generator",
    "protocol",
    "service",
    "mix",
    "connections",
    "flows",
    "offered",
    "unit",
    "steps",
    "duration",
    "warmup",
    "requests",
    "seed",
    "y",
    "log_y",
    "y_max",
    "get",
    "scan_keys",
    "keys",
    "get_slo",
    "scan_slo",
    "mean",
    "sd",
    "p",
    "short",
    "long",
    "value",
];

/// The schema's tables and their keys.
const TABLES: &[(&str, &[&str])] = &[
    (
        "experiment",
        &["name", "reproduces", "description", "rounds", "in_all"],
    ),
    ("app", &["name", "program", "mode", "scheduling"]),
    (
        "system",
        &[
            "label",
            "kind",
            "allocator",
            "steering",
            "mode",
            "policy",
            "quantum",
            "placement",
            "grant_latency",
            "cores",
            "warm_table",
        ],
    ),
    (
        "baseline",
        &[
            "label",
            "kind",
            "allocator",
            "steering",
            "mode",
            "policy",
            "quantum",
            "placement",
            "grant_latency",
            "cores",
            "warm_table",
        ],
    ),
    (
        "load",
        &[
            "generator",
            "protocol",
            "service",
            "mix",
            "connections",
            "flows",
            "offered",
            "unit",
            "steps",
            "duration",
            "warmup",
            "requests",
            "seed",
        ],
    ),
    ("plot", &["y", "log_y", "y_max"]),
];

/// Words the schema's enums and names accept.
const WORDS: &[&str] = &[
    "spin-server",
    "scan-server",
    "kv-server",
    "http-server",
    "echo",
    "batch",
    "in-process",
    "protected",
    "run-to-completion",
    "d-FCFS",
    "c-FCFS",
    "PS",
    "c-PRE-SQ",
    "c-PRE-MQ",
    "head",
    "tail",
    "ginza",
    "linux",
    "simulator",
    "shenango",
    "static",
    "slow",
    "rss-mod",
    "flow-affinity",
    "indirection",
    "builtin",
    "loadgen",
    "in-process",
    "simulated",
    "ping-pong",
    "udp",
    "tcp",
    "memcached-udp",
    "memcached-tcp",
    "http",
    "capacity",
    "cores",
    "rps",
    "bytes",
    "p99_us",
    "p50_us",
    "achieved",
    "flows_moved",
    "fuzz",
];

/// Values at the edges of what the schema's types hold.
const EDGES: &[&str] = &[
    "0",
    "1",
    "-1",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "-9223372036854775808",
    "1e308",
    "-0.0",
    "nan",
    "\"0s\"",
    "\"999999999s\"",
    "\"1000000000s\"",
    "\"999999999999999999ns\"",
    "\"0.000000001ns\"",
    "[]",
    "{}",
    "\"\"",
];

/// A value: at an edge half the time.
#[derive(Debug, Arbitrary)]
struct Value {
    edge: Option<u8>,
    kind: ValueKind,
}

#[derive(Debug, Arbitrary)]
enum ValueKind {
    Word(u8),
    Text(String),
    Int(i64),
    Small(u8),
    Float(f64),
    Bool(bool),
    /// A duration: a number and a unit.
    Duration(u32, u8),
    Array(List<Scalar>),
    /// `{ key = value, ... }`, one level deep (a service distribution's).
    Inline(List<(Key, Scalar)>),
    /// `{ exponential = { mean = ... } }` and the like.
    Service(u8, List<(Key, Scalar)>),
}

#[derive(Debug, Arbitrary)]
enum Scalar {
    Edge(u8),
    Word(u8),
    Int(i64),
    Small(u8),
    Float(f64),
    Duration(u32, u8),
}

const UNITS: &[&str] = &["ns", "us", "ms", "s", "m", "h", "", "µs", "d"];

fn quote(s: &str) -> String {
    // TOML basic strings: escape what would end or break them.
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            c if c.is_control() => q.push_str(&format!("\\u{:04x}", c as u32)),
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

fn float(f: f64) -> String {
    if f.is_nan() {
        "nan".into()
    } else if f.is_infinite() {
        if f > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        format!("{f:?}")
    }
}

impl Key {
    fn render(&self) -> String {
        match self {
            Key::Known(k) => KEYS[usize::from(*k) % KEYS.len()].into(),
            Key::Other(s) => quote(s),
        }
    }
}

impl Scalar {
    fn render(&self) -> String {
        match self {
            Scalar::Edge(e) => EDGES[usize::from(*e) % EDGES.len()].into(),
            Scalar::Word(w) => quote(WORDS[usize::from(*w) % WORDS.len()]),
            Scalar::Int(i) => i.to_string(),
            Scalar::Small(i) => i.to_string(),
            Scalar::Float(f) => float(*f),
            Scalar::Duration(n, u) => {
                quote(&format!("{n}{}", UNITS[usize::from(*u) % UNITS.len()]))
            }
        }
    }
}

fn inline(entries: &[(Key, Scalar)]) -> String {
    let parts: Vec<String> = entries
        .iter()
        .map(|(k, v)| format!("{} = {}", k.render(), v.render()))
        .collect();
    format!("{{ {} }}", parts.join(", "))
}

impl Value {
    fn render(&self) -> String {
        if let Some(e) = self.edge {
            return EDGES[usize::from(e) % EDGES.len()].into();
        }
        match &self.kind {
            ValueKind::Word(w) => quote(WORDS[usize::from(*w) % WORDS.len()]),
            ValueKind::Text(s) => quote(s),
            ValueKind::Int(i) => i.to_string(),
            ValueKind::Small(i) => i.to_string(),
            ValueKind::Float(f) => float(*f),
            ValueKind::Bool(b) => b.to_string(),
            ValueKind::Duration(n, u) => {
                quote(&format!("{n}{}", UNITS[usize::from(*u) % UNITS.len()]))
            }
            ValueKind::Array(items) => {
                let parts: Vec<String> = items.iter().map(Scalar::render).collect();
                format!("[{}]", parts.join(", "))
            }
            ValueKind::Inline(entries) => inline(entries),
            ValueKind::Service(kind, entries) => {
                let kinds = [
                    "exponential",
                    "constant",
                    "bimodal",
                    "lognormal",
                    "shinjuku",
                ];
                let kind = kinds[usize::from(*kind) % kinds.len()];
                format!("{{ {kind} = {} }}", inline(entries))
            }
        }
    }
}

fn edited(file: u8, edits: &[Edit]) -> String {
    let text = FILES[usize::from(file) % FILES.len()];
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for e in edits {
        let at = |line: u8| usize::from(line) % lines.len().max(1);
        match e {
            Edit::Set { table, key, value } => set(&mut lines, *table, *key, value),
            Edit::Value { line, value } => {
                let i = at(*line);
                if let Some(l) = lines.get_mut(i) {
                    if let Some((k, _)) = l.split_once('=') {
                        *l = format!("{k}= {}", value.render());
                    }
                }
            }
            Edit::Delete { line } => {
                if !lines.is_empty() {
                    let i = at(*line);
                    lines.remove(i);
                }
            }
            Edit::Double { line } => {
                if !lines.is_empty() {
                    let i = at(*line);
                    let l = lines[i].clone();
                    lines.insert(i, l);
                }
            }
            Edit::Insert { line, key, value } => {
                let i = at(*line).min(lines.len());
                lines.insert(i, format!("{} = {}", key.render(), value.render()));
            }
            Edit::SetByte { at, value } => {
                let mut bytes = lines.join("\n").into_bytes();
                if !bytes.is_empty() {
                    let i = usize::from(*at) % bytes.len();
                    bytes[i] = *value;
                }
                lines = String::from_utf8_lossy(&bytes)
                    .lines()
                    .map(str::to_string)
                    .collect();
            }
            Edit::Truncate { at } => {
                let joined = lines.join("\n");
                let mut cut = usize::from(*at).min(joined.len());
                while !joined.is_char_boundary(cut) {
                    cut -= 1;
                }
                lines = joined[..cut].lines().map(str::to_string).collect();
            }
        }
    }
    lines.join("\n")
}

/// `key = value` in the first table named `table`.
fn set(lines: &mut Vec<String>, table: u8, key: u8, value: &Value) {
    let (name, keys) = TABLES[usize::from(table) % TABLES.len()];
    let key = keys[usize::from(key) % keys.len()];
    let is_header = |l: &str| l.trim_start().starts_with('[');
    let Some(start) = lines.iter().position(|l| {
        let l = l.trim();
        l == format!("[{name}]") || l == format!("[[{name}]]")
    }) else {
        return;
    };
    let end = lines[start + 1..]
        .iter()
        .position(|l| is_header(l))
        .map_or(lines.len(), |i| start + 1 + i);
    let line = format!("{key} = {}", value.render());
    match (start + 1..end).find(|&i| {
        lines[i]
            .split_once('=')
            .is_some_and(|(k, _)| k.trim() == key)
    }) {
        Some(i) => lines[i] = line,
        None => lines.insert(start + 1, line),
    }
}

fn written(tables: &[Table]) -> String {
    let mut text = String::new();
    for t in tables {
        let header = match &t.header {
            Header::Experiment => "[experiment]".to_string(),
            Header::App => "[[app]]".to_string(),
            Header::System => "[system]".to_string(),
            Header::Baseline => "[[baseline]]".to_string(),
            Header::Load => "[load]".to_string(),
            Header::Plot => "[plot]".to_string(),
            Header::Steps => "[[load.steps]]".to_string(),
            Header::Other(s) => format!("[{}]", quote(s)),
        };
        text.push_str(&header);
        text.push('\n');
        for (k, v) in &t.entries {
            text.push_str(&format!("{} = {}\n", k.render(), v.render()));
        }
    }
    text
}

/// A refusal names the file, and a line the file has.
fn check_error(text: &str, e: &anyhow::Error) {
    let message = format!("{e:#}");
    let rest = message
        .strip_prefix(FILE_NAME)
        .unwrap_or_else(|| panic!("the error does not name the file: {message}"));
    if let Some(after) = rest.strip_prefix(':') {
        let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
        if let Ok(line) = digits.parse::<usize>() {
            let lines = text.lines().count().max(1);
            assert!(
                line >= 1 && line <= lines + 1,
                "the error names line {line} of {lines}: {message}"
            );
        }
    }
}

pub(super) fn case(u: &mut Unstructured<'_>, out: &mut Option<String>) -> Outcome {
    let Ok(input) = Input::arbitrary(u) else {
        return "no-input".into();
    };
    describe(out, &input);
    let text = match &input {
        Input::Edited { file, edits } => edited(*file, edits),
        Input::Written { tables } => written(tables),
    };
    if let Some(s) = out {
        s.push_str("\nthe file:\n");
        s.push_str(&text);
    }
    let loaded = match spec::parse(Path::new(FILE_NAME), &text) {
        Ok(l) => l,
        Err(e) => {
            check_error(&text, &e);
            return "refused by the loader".into();
        }
    };
    let mut outcome = "refused by the planner";
    for tiny in [false, true] {
        match Plan::new(loaded.clone(), tiny) {
            Ok(plan) => {
                let _ = plan.estimate();
                outcome = plan.status();
            }
            Err(e) => check_error(&text, &e),
        }
    }
    outcome.into()
}
