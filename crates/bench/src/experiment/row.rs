//! One measured (or simulated) point: the CSV's row. The columns are
//! stable (a test pins them): add new ones at the end.

use serde::Serialize;

/// The CSV's header, in order.
pub const COLUMNS: [&str; 23] = [
    "experiment",
    "system",
    "kind",
    "round",
    "offered",
    "unit",
    "achieved",
    "p50_us",
    "p99_us",
    "p999_us",
    "p99_class0_us",
    "p99_class1_us",
    "batch_ops_per_s",
    "lc_cores",
    "batch_cores",
    "efficiency",
    "reallocations_per_s",
    "flows_moved",
    "reordered_pct",
    "sent",
    "answered",
    "t_ms",
    "note",
];

/// The numeric columns a plot may put on its y axis: every column after
/// `unit` but the final `note`.
pub const METRICS: &[&str] = match COLUMNS.split_at(6).1.split_last() {
    Some((_note, metrics)) => metrics,
    None => &[],
};

/// A row; `None` is an empty cell (the runner has no such figure).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Row {
    pub experiment: String,
    pub system: String,
    /// `ginza`, `linux` or `simulator` (a simulated row is a model's
    /// prediction, never a measurement).
    pub kind: &'static str,
    pub round: u64,
    pub offered: f64,
    pub unit: &'static str,
    /// Achieved load, in the unit of `offered` where the runner can tell.
    pub achieved: Option<f64>,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub p999_us: Option<f64>,
    pub p99_class0_us: Option<f64>,
    pub p99_class1_us: Option<f64>,
    pub batch_ops_per_s: Option<f64>,
    pub lc_cores: Option<f64>,
    pub batch_cores: Option<f64>,
    pub efficiency: Option<f64>,
    pub reallocations_per_s: Option<f64>,
    pub flows_moved: Option<f64>,
    pub reordered_pct: Option<f64>,
    pub sent: Option<f64>,
    pub answered: Option<f64>,
    /// Load steps: when the sample was read, ms since the first step.
    pub t_ms: Option<f64>,
    pub note: String,
}

impl Row {
    /// The value of metric column `name`.
    pub fn metric(&self, name: &str) -> Option<f64> {
        match name {
            "achieved" => self.achieved,
            "p50_us" => self.p50_us,
            "p99_us" => self.p99_us,
            "p999_us" => self.p999_us,
            "p99_class0_us" => self.p99_class0_us,
            "p99_class1_us" => self.p99_class1_us,
            "batch_ops_per_s" => self.batch_ops_per_s,
            "lc_cores" => self.lc_cores,
            "batch_cores" => self.batch_cores,
            "efficiency" => self.efficiency,
            "reallocations_per_s" => self.reallocations_per_s,
            "flows_moved" => self.flows_moved,
            "reordered_pct" => self.reordered_pct,
            "sent" => self.sent,
            "answered" => self.answered,
            "t_ms" => self.t_ms,
            _ => None,
        }
    }

    fn set_metric(&mut self, name: &str, v: Option<f64>) {
        let slot = match name {
            "achieved" => &mut self.achieved,
            "p50_us" => &mut self.p50_us,
            "p99_us" => &mut self.p99_us,
            "p999_us" => &mut self.p999_us,
            "p99_class0_us" => &mut self.p99_class0_us,
            "p99_class1_us" => &mut self.p99_class1_us,
            "batch_ops_per_s" => &mut self.batch_ops_per_s,
            "lc_cores" => &mut self.lc_cores,
            "batch_cores" => &mut self.batch_cores,
            "efficiency" => &mut self.efficiency,
            "reallocations_per_s" => &mut self.reallocations_per_s,
            "flows_moved" => &mut self.flows_moved,
            "reordered_pct" => &mut self.reordered_pct,
            "sent" => &mut self.sent,
            "answered" => &mut self.answered,
            "t_ms" => &mut self.t_ms,
            _ => return,
        };
        *slot = v;
    }

    /// The row's cells, in [`COLUMNS`] order.
    pub fn cells(&self) -> Vec<String> {
        let num = |v: Option<f64>| v.map_or(String::new(), |x| format!("{:.4}", x));
        let mut out = vec![
            self.experiment.clone(),
            self.system.clone(),
            self.kind.to_string(),
            self.round.to_string(),
            format!("{}", self.offered),
            self.unit.to_string(),
        ];
        for m in METRICS {
            out.push(num(self.metric(m)));
        }
        // The note may hold commas: quote it.
        out.push(format!("\"{}\"", self.note.replace('"', "'")));
        out
    }

    /// The median over rounds of each metric of `rows` (same system and
    /// offered load), round 0, notes joined.
    pub fn median_of(rows: &[&Row]) -> Option<Row> {
        let first = rows.first()?;
        let mut out = Row {
            round: 0,
            note: String::new(),
            ..(*first).clone()
        };
        for m in METRICS {
            let vals: Vec<f64> = rows.iter().filter_map(|r| r.metric(m)).collect();
            out.set_metric(m, crate::harness::figures::median(&vals));
        }
        let mut notes: Vec<&str> = Vec::new();
        for r in rows {
            if !r.note.is_empty() && !notes.contains(&r.note.as_str()) {
                notes.push(&r.note);
            }
        }
        out.note = notes.join(" | ");
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_column_has_a_field() {
        assert_eq!(METRICS.first(), Some(&"achieved"));
        assert_eq!(METRICS.last(), Some(&"t_ms"));
        let mut r = Row::default();
        for (i, m) in METRICS.iter().enumerate() {
            r.set_metric(m, Some(i as f64));
        }
        for (i, m) in METRICS.iter().enumerate() {
            assert_eq!(r.metric(m), Some(i as f64), "{m}");
        }
        assert_eq!(r.cells().len(), COLUMNS.len());
    }
}
