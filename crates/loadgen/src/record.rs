//! What a run measures: per request class an HDR histogram of latency
//! counted from the request's *scheduled* send time (so a server that
//! stalls is charged for every request it delayed, not just the first:
//! no coordinated omission), the counts of answers, error answers,
//! timeouts and errors, and the generator's own send lag (how late it sent
//! against the schedule), which tells whether the generator kept up.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;

use crate::protocol::Pending;

/// Latencies up to an hour, 3 significant digits.
const MAX_NS: u64 = 3_600_000_000_000;

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_NS, 3).expect("valid bounds")
}

/// The measurements of one load step (all classes together).
#[derive(Debug, Clone)]
pub struct StepRecorder {
    pub latency: Histogram<u64>,
    pub send_lag: Histogram<u64>,
    pub sent: u64,
    pub ok: u64,
}

impl StepRecorder {
    fn new() -> StepRecorder {
        StepRecorder {
            latency: histogram(),
            send_lag: histogram(),
            sent: 0,
            ok: 0,
        }
    }
}

/// One worker's (or, merged, the run's) measurements. Requests scheduled
/// before `measure_from_ns` (the warm-up) are sent but not counted.
#[derive(Debug, Clone)]
pub struct Recorder {
    pub measure_from_ns: u64,
    /// Latency of good answers, ns, by class.
    pub latency: Vec<Histogram<u64>>,
    /// How late each request went out against its schedule, ns.
    pub send_lag: Histogram<u64>,
    /// Requests sent (or queued on a connection to send).
    pub sent: u64,
    /// Good answers.
    pub ok: u64,
    /// Answers that report an error (memcached's `SERVER_ERROR`, HTTP 5xx,
    /// an echo that differs).
    pub error_answers: u64,
    /// Requests with no answer within the timeout.
    pub timeouts: u64,
    /// Requests lost to a failed or closed connection or a failed send.
    pub errors: u64,
    /// Requests never sent: the generator was still behind its schedule
    /// when the run's time (schedule plus timeout) was up.
    pub unsent: u64,
    /// Answers that matched no pending request (late after a timeout, or
    /// bogus).
    pub unmatched: u64,
    /// Why connections failed, and how often.
    pub error_kinds: BTreeMap<String, u64>,
    /// Where each load step ends (ns on the generator's clock), ascending.
    pub step_ends_ns: Vec<u64>,
    /// By load step.
    pub steps: Vec<StepRecorder>,
}

impl Recorder {
    pub fn new(classes: usize, measure_from_ns: u64) -> Recorder {
        Recorder {
            measure_from_ns,
            latency: (0..classes).map(|_| histogram()).collect(),
            send_lag: histogram(),
            sent: 0,
            ok: 0,
            error_answers: 0,
            timeouts: 0,
            errors: 0,
            unsent: 0,
            unmatched: 0,
            error_kinds: BTreeMap::new(),
            step_ends_ns: Vec::new(),
            steps: Vec::new(),
        }
    }

    /// Measures from `measure_from_ns`, by the steps that end at
    /// `step_ends_ns`.
    pub fn set_window(&mut self, measure_from_ns: u64, step_ends_ns: Vec<u64>) {
        self.measure_from_ns = measure_from_ns;
        self.steps = step_ends_ns.iter().map(|_| StepRecorder::new()).collect();
        self.step_ends_ns = step_ends_ns;
    }

    fn step(&mut self, scheduled_ns: u64) -> Option<&mut StepRecorder> {
        let i = self
            .step_ends_ns
            .partition_point(|&end| end <= scheduled_ns);
        self.steps.get_mut(i)
    }

    fn measured(&self, p: &Pending) -> bool {
        p.scheduled_ns >= self.measure_from_ns
    }

    /// A request went out at `now_ns`.
    pub fn sent(&mut self, p: &Pending, now_ns: u64) {
        if self.measured(p) {
            self.sent += 1;
            let lag = now_ns.saturating_sub(p.scheduled_ns).max(1);
            self.send_lag.saturating_record(lag);
            if let Some(s) = self.step(p.scheduled_ns) {
                s.sent += 1;
                s.send_lag.saturating_record(lag);
            }
        }
    }

    /// The answer to `p` came at `now_ns`.
    pub fn answered(&mut self, p: &Pending, now_ns: u64, ok: bool) {
        if !self.measured(p) {
            return;
        }
        if ok {
            self.ok += 1;
            let lat = now_ns.saturating_sub(p.scheduled_ns).max(1);
            if let Some(h) = self.latency.get_mut(p.class as usize) {
                h.saturating_record(lat);
            }
            if let Some(s) = self.step(p.scheduled_ns) {
                s.ok += 1;
                s.latency.saturating_record(lat);
            }
        } else {
            self.error_answers += 1;
        }
    }

    pub fn timed_out(&mut self, p: &Pending) {
        if self.measured(p) {
            self.timeouts += 1;
        }
    }

    /// `p` is lost to an error of kind `why`.
    pub fn failed(&mut self, p: &Pending) {
        if self.measured(p) {
            self.errors += 1;
        }
    }

    /// The requests scheduled at `scheduled_ns` will not be sent.
    pub fn unsent(&mut self, scheduled_ns: impl Iterator<Item = u64>) {
        let from = self.measure_from_ns;
        self.unsent += scheduled_ns.filter(|&t| t >= from).count() as u64;
    }

    /// Notes an error of kind `why` (a connection failing, say).
    pub fn error_kind(&mut self, why: impl Into<String>) {
        *self.error_kinds.entry(why.into()).or_insert(0) += 1;
    }

    pub fn merge(&mut self, other: &Recorder) {
        for (a, b) in self.latency.iter_mut().zip(&other.latency) {
            a.add(b).expect("same bounds");
        }
        self.send_lag.add(&other.send_lag).expect("same bounds");
        self.sent += other.sent;
        self.ok += other.ok;
        self.error_answers += other.error_answers;
        self.timeouts += other.timeouts;
        self.errors += other.errors;
        self.unmatched += other.unmatched;
        self.unsent += other.unsent;
        if self.steps.is_empty() {
            self.set_window(other.measure_from_ns, other.step_ends_ns.clone());
        }
        for (a, b) in self.steps.iter_mut().zip(&other.steps) {
            a.latency.add(&b.latency).expect("same bounds");
            a.send_lag.add(&b.send_lag).expect("same bounds");
            a.sent += b.sent;
            a.ok += b.ok;
        }
        for (k, v) in &other.error_kinds {
            *self.error_kinds.entry(k.clone()).or_insert(0) += v;
        }
    }
}
