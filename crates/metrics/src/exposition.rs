//! Writing metrics with `prometheus-client`'s OpenMetrics encoder from a
//! snapshot: a daemon's [`prometheus_client::collector::Collector`] hands
//! its encoder to a [`Writer`] and writes one family per call. Names are
//! given without their unit and `_total` suffixes: the encoder appends
//! them (`ginza_app_grants` + counter → `ginza_app_grants_total`;
//! `ginza_iokernel_loop_cpu` + seconds + counter →
//! `ginza_iokernel_loop_cpu_seconds_total`).

use std::fmt;

use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeLabelSet, MetricEncoder,
    NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use crate::Buckets;

/// The label set of a family's only sample.
const NO_LABELS: [(&str, &str); 0] = [];

/// One histogram's figures, in seconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Histogram {
    pub sum: f64,
    pub count: u64,
    /// (upper bound, samples in that bucket alone), the last bound
    /// infinite.
    pub buckets: Vec<(f64, u64)>,
}

impl From<&Buckets> for Histogram {
    fn from(b: &Buckets) -> Histogram {
        Histogram {
            sum: b.sum_seconds(),
            count: b.count(),
            buckets: b.seconds(),
        }
    }
}

/// Writes metric families into a collector's encoder.
pub struct Writer<'a> {
    enc: DescriptorEncoder<'a>,
}

impl<'a> Writer<'a> {
    pub fn new(enc: DescriptorEncoder<'a>) -> Writer<'a> {
        Writer { enc }
    }

    /// A counter without labels.
    pub fn counter<V: EncodeCounterValue>(
        &mut self,
        name: &str,
        help: &str,
        unit: Option<Unit>,
        v: V,
    ) -> fmt::Result {
        self.counters(name, help, unit, [(NO_LABELS, v)])
    }

    /// A counter family, one sample per label set.
    pub fn counters<L: EncodeLabelSet, V: EncodeCounterValue>(
        &mut self,
        name: &str,
        help: &str,
        unit: Option<Unit>,
        items: impl IntoIterator<Item = (L, V)>,
    ) -> fmt::Result {
        self.family(name, help, unit, MetricType::Counter, items, |m, (l, v)| {
            m.encode_family(&l)?
                .encode_counter::<NoLabelSet, V, f64>(&v, None)
        })
    }

    /// A gauge without labels.
    pub fn gauge<V: EncodeGaugeValue>(
        &mut self,
        name: &str,
        help: &str,
        unit: Option<Unit>,
        v: V,
    ) -> fmt::Result {
        self.gauges(name, help, unit, [(NO_LABELS, v)])
    }

    /// A gauge family, one sample per label set.
    pub fn gauges<L: EncodeLabelSet, V: EncodeGaugeValue>(
        &mut self,
        name: &str,
        help: &str,
        unit: Option<Unit>,
        items: impl IntoIterator<Item = (L, V)>,
    ) -> fmt::Result {
        self.family(name, help, unit, MetricType::Gauge, items, |m, (l, v)| {
            m.encode_family(&l)?.encode_gauge(&v)
        })
    }

    /// A histogram family, one histogram per label set.
    pub fn histograms<L: EncodeLabelSet>(
        &mut self,
        name: &str,
        help: &str,
        unit: Option<Unit>,
        items: impl IntoIterator<Item = (L, Histogram)>,
    ) -> fmt::Result {
        self.family(
            name,
            help,
            unit,
            MetricType::Histogram,
            items,
            |m, (l, h)| {
                m.encode_family(&l)?
                    .encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets, None)
            },
        )
    }

    /// An info metric (`NAME_info{labels} 1`).
    pub fn info(&mut self, name: &str, help: &str, labels: impl EncodeLabelSet) -> fmt::Result {
        self.infos(name, help, [labels])
    }

    /// An info family, one sample per label set.
    pub fn infos<L: EncodeLabelSet>(
        &mut self,
        name: &str,
        help: &str,
        items: impl IntoIterator<Item = L>,
    ) -> fmt::Result {
        self.family(name, help, None, MetricType::Info, items, |m, l| {
            m.encode_info(&l)
        })
    }

    /// Every family: its descriptor, then one sample per item, written by
    /// `sample`.
    fn family<T>(
        &mut self,
        name: &str,
        help: &str,
        unit: Option<Unit>,
        kind: MetricType,
        items: impl IntoIterator<Item = T>,
        mut sample: impl FnMut(&mut MetricEncoder<'_>, T) -> fmt::Result,
    ) -> fmt::Result {
        let mut m = self
            .enc
            .encode_descriptor(name, help, unit.as_ref(), kind)?;
        for item in items {
            sample(&mut m, item)?;
        }
        Ok(())
    }
}

/// The registry's metrics as OpenMetrics text (ending in `# EOF`).
pub fn render(registry: &Registry) -> Result<String, String> {
    let mut s = String::new();
    prometheus_client::encoding::text::encode(&mut s, registry)
        .map_err(|_| "encoding the metrics failed".to_string())?;
    Ok(s)
}
