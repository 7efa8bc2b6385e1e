//! For tests of the daemons' endpoints: a raw HTTP exchange, a scrape,
//! and the reference parser (the Python `prometheus_client` package's
//! OpenMetrics and Prometheus text parsers, run as `python3`).

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Sends `request` as is and returns every byte the server sends until it
/// closes the connection (10 s at most for each read).
pub fn exchange(addr: SocketAddr, request: &[u8]) -> io::Result<Vec<u8>> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(request)?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    Ok(out)
}

/// `GET /metrics`: the body of a 200 answer, or what went wrong.
pub fn scrape(addr: SocketAddr) -> Result<String, String> {
    let r = exchange(
        addr,
        b"GET /metrics HTTP/1.1\r\nHost: ginza\r\nConnection: close\r\n\r\n",
    )
    .map_err(|e| format!("scraping {addr}: {e}"))?;
    let r = String::from_utf8(r).map_err(|e| format!("scraping {addr}: not UTF-8: {e}"))?;
    let Some((head, body)) = r.split_once("\r\n\r\n") else {
        return Err(format!("scraping {addr}: no end of head in {r:?}"));
    };
    if !head.starts_with("HTTP/1.1 200 ") {
        return Err(format!("scraping {addr}: {head}"));
    }
    Ok(body.to_string())
}

/// One sample as the reference parser read it.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Its family's name (without `_total`, unit suffixes kept).
    pub family: String,
    /// The family's type: counter, gauge, histogram, info…
    pub kind: String,
    /// The sample's own name (`…_total`, `…_bucket`, `…_count`).
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Why the reference parser gave no samples.
#[derive(Debug)]
pub enum ParseError {
    /// `python3` or its `prometheus_client` package is missing: the test
    /// cannot run here (it says so, or fails under CI).
    Unavailable(String),
    /// The parser refused the text.
    Rejected(String),
}

const PARSE_PY: &str = r#"
import json, sys
try:
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as om
    from prometheus_client.parser import text_string_to_metric_families as prom
except Exception as e:
    print("prometheus_client: %s" % e, file=sys.stderr)
    sys.exit(3)
text = sys.stdin.read()
out = []
try:
    for fam in om(text):
        for s in fam.samples:
            out.append([fam.name, fam.type, s.name, s.labels, s.value])
except Exception as e:
    print("the OpenMetrics parser refused it: %r" % e, file=sys.stderr)
    sys.exit(4)
try:
    n = sum(len(f.samples) for f in prom(text))
except Exception as e:
    print("the Prometheus text parser refused it: %r" % e, file=sys.stderr)
    sys.exit(4)
if n != len(out):
    print("the Prometheus text parser read %d samples, the OpenMetrics one %d" % (n, len(out)), file=sys.stderr)
    sys.exit(4)
print(json.dumps(out))
"#;

/// Parses `text` with the Python `prometheus_client` package's OpenMetrics
/// parser (strict: names, types, units, `_total`, bucket order, `# EOF`),
/// and checks that its Prometheus text parser reads as many samples.
pub fn reference_parse(text: &str) -> Result<Vec<Sample>, ParseError> {
    let mut child = Command::new("python3")
        .args(["-c", PARSE_PY])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| ParseError::Unavailable(format!("python3: {e}")))?;
    let mut stdin = child.stdin.take().expect("piped");
    let text = text.to_string();
    let writer = std::thread::spawn(move || stdin.write_all(text.as_bytes()));
    let out = child
        .wait_with_output()
        .map_err(|e| ParseError::Unavailable(format!("python3: {e}")))?;
    let _ = writer.join();
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    match out.status.code() {
        Some(0) => {}
        Some(3) => {
            return Err(ParseError::Unavailable(format!(
                "{stderr} (pip install prometheus-client)"
            )))
        }
        _ => return Err(ParseError::Rejected(stderr)),
    }
    let rows: Vec<Row> = serde_json::from_slice(&out.stdout)
        .map_err(|e| ParseError::Rejected(format!("the parser's output: {e}")))?;
    Ok(rows
        .into_iter()
        .map(|(family, kind, name, labels, value)| Sample {
            family,
            kind,
            name,
            labels,
            value,
        })
        .collect())
}

/// One sample as the Python script prints it: family, type, sample name,
/// labels, value.
type Row = (String, String, String, BTreeMap<String, String>, f64);

/// The value of sample `name` whose labels include `labels`.
pub fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .find(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
}
