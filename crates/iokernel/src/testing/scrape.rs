//! A Prometheus endpoint as the tests read it: every scrape parsed by the
//! reference parser (`ginza_metrics::testing::reference_parse`, the Python
//! `prometheus_client` package), a test skipped visibly where that parser
//! is not installed.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ginza_metrics::testing::{reference_parse, scrape, value, ParseError, Sample};

use super::skip;

/// The samples of `text` as the reference parser reads them; `None` when
/// it is not installed (the test says so, or fails under CI, and returns).
/// Panics, with the text, when the parser refuses it.
pub fn reference_samples(text: &str) -> Option<Vec<Sample>> {
    match reference_parse(text) {
        Ok(s) => Some(s),
        Err(ParseError::Unavailable(why)) => {
            skip(format!("the reference parser is missing: {why}"));
            None
        }
        Err(ParseError::Rejected(why)) => panic!("the reference parser refused it: {why}\n{text}"),
    }
}

/// Scrapes `addr` until `f` holds for the parsed samples (20 s at most,
/// then the test fails naming `what` and showing the last scrape); `None`
/// as [`reference_samples`].
pub fn scrape_until(
    addr: SocketAddr,
    what: &str,
    f: impl Fn(&[Sample]) -> bool,
) -> Option<Vec<Sample>> {
    let t0 = Instant::now();
    loop {
        let text = scrape(addr).expect("a scrape");
        let samples = reference_samples(&text)?;
        if f(&samples) {
            return Some(samples);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "timed out waiting for {what}; last scrape:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The value of sample `name` with `labels`; the test fails without it.
pub fn sample(s: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    value(s, name, labels).unwrap_or_else(|| panic!("no sample {name}{labels:?}"))
}
