//! Service-time distributions and arrival processes, written as in the
//! papers: `Exp(1)`, `LogNormal(1, 10)` (mean, standard deviation),
//! `Bimodal(99.5-0.5, 0.5-500)` (99.5 % take 0.5 µs, 0.5 % take 500 µs).

use anyhow::{bail, Context};
use rand::Rng;
use rand_distr::{Distribution, Exp1, StandardNormal};
use serde::{Deserialize, Serialize};

/// A service-time distribution in µs.
#[derive(Clone, Debug, PartialEq)]
pub enum Service {
    Constant(f64),
    Exp {
        mean: f64,
    },
    /// Log-normal with the given mean and standard deviation (of the
    /// service time itself, not of its logarithm).
    LogNormal {
        mean: f64,
        sd: f64,
    },
    /// Mixture of fixed values: (probability, µs); classes are the modes.
    Modes(Vec<(f64, f64)>),
}

impl Service {
    /// Parses `Constant(x)`, `Exp(mean)`, `LogNormal(mean, sd)`,
    /// `Bimodal(p1-v1, p2-v2)` and `Trimodal(..)` (percentages, µs).
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        let s = s.trim();
        let (name, rest) = s
            .split_once('(')
            .with_context(|| format!("expected NAME(ARGS): {s}"))?;
        let args = rest
            .strip_suffix(')')
            .with_context(|| format!("missing ')': {s}"))?;
        let args: Vec<&str> = args
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .collect();
        let num = |a: &str| {
            a.parse::<f64>()
                .with_context(|| format!("bad number {a:?} in {s}"))
        };
        let svc = match name.trim().to_ascii_lowercase().as_str() {
            "constant" | "fixed" if args.len() == 1 => Service::Constant(num(args[0])?),
            "exp" | "exponential" if args.len() == 1 => Service::Exp { mean: num(args[0])? },
            "lognormal" | "log-normal" if args.len() == 2 => Service::LogNormal { mean: num(args[0])?, sd: num(args[1])? },
            "bimodal" | "trimodal" | "modes" => {
                let mut modes = Vec::new();
                for a in &args {
                    let (p, v) = a.split_once('-').with_context(|| format!("expected PERCENT-VALUE: {a}"))?;
                    modes.push((num(p)? / 100.0, num(v)?));
                }
                let expect = match name.trim().to_ascii_lowercase().as_str() {
                    "bimodal" => Some(2),
                    "trimodal" => Some(3),
                    _ => None,
                };
                if expect.is_some_and(|n| n != modes.len()) {
                    bail!("{name} needs {} modes: {s}", expect.unwrap_or(0));
                }
                let total: f64 = modes.iter().map(|m| m.0).sum();
                if (total - 1.0).abs() > 1e-6 {
                    bail!("mode percentages sum to {} %, not 100: {s}", total * 100.0);
                }
                Service::Modes(modes)
            }
            _ => bail!("unknown distribution {s}: use Constant(x), Exp(m), LogNormal(m, sd), Bimodal(p-v, p-v), Trimodal(..)"),
        };
        svc.check()?;
        Ok(svc)
    }

    fn check(&self) -> anyhow::Result<()> {
        let ok = match self {
            Service::Constant(v) => *v > 0.0,
            Service::Exp { mean } => *mean > 0.0,
            Service::LogNormal { mean, sd } => *mean > 0.0 && *sd > 0.0,
            Service::Modes(m) => !m.is_empty() && m.iter().all(|&(p, v)| p >= 0.0 && v > 0.0),
        };
        if !ok {
            bail!("service times must be positive: {self:?}");
        }
        Ok(())
    }

    pub fn mean(&self) -> f64 {
        match self {
            Service::Constant(v) => *v,
            Service::Exp { mean } | Service::LogNormal { mean, .. } => *mean,
            Service::Modes(m) => m.iter().map(|(p, v)| p * v).sum(),
        }
    }

    /// E[X²], for M/G/1 formulas.
    pub fn second_moment(&self) -> f64 {
        match self {
            Service::Constant(v) => v * v,
            Service::Exp { mean } => 2.0 * mean * mean,
            Service::LogNormal { mean, sd } => mean * mean + sd * sd,
            Service::Modes(m) => m.iter().map(|(p, v)| p * v * v).sum(),
        }
    }

    /// Number of request classes (modes of a mixture, else one).
    pub fn classes(&self) -> usize {
        match self {
            Service::Modes(m) => m.len(),
            _ => 1,
        }
    }

    pub fn label(&self) -> String {
        let fmt = |x: f64| format!("{x}");
        match self {
            Service::Constant(v) => format!("Constant({})", fmt(*v)),
            Service::Exp { mean } => format!("Exp({})", fmt(*mean)),
            Service::LogNormal { mean, sd } => format!("LogNormal({}, {})", fmt(*mean), fmt(*sd)),
            Service::Modes(m) => {
                let name = match m.len() {
                    2 => "Bimodal",
                    3 => "Trimodal",
                    _ => "Modes",
                };
                let parts: Vec<String> = m
                    .iter()
                    .map(|(p, v)| format!("{}-{}", fmt(p * 100.0), fmt(*v)))
                    .collect();
                format!("{name}({})", parts.join(", "))
            }
        }
    }

    pub fn sampler(&self) -> Sampler {
        match self {
            Service::Constant(v) => Sampler::Constant(*v),
            Service::Exp { mean } => Sampler::Exp(*mean),
            Service::LogNormal { mean, sd } => {
                let s2 = (1.0 + (sd / mean).powi(2)).ln();
                Sampler::LogNormal {
                    mu: mean.ln() - s2 / 2.0,
                    sigma: s2.sqrt(),
                }
            }
            Service::Modes(m) => {
                let mut acc = 0.0;
                let cdf = m
                    .iter()
                    .map(|&(p, v)| {
                        acc += p;
                        (acc, v)
                    })
                    .collect();
                Sampler::Modes(cdf)
            }
        }
    }
}

impl std::fmt::Display for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.label())
    }
}

impl Serialize for Service {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.label())
    }
}

impl<'de> Deserialize<'de> for Service {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Service::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A prepared sampler (no allocation per sample).
#[derive(Clone, Debug)]
pub enum Sampler {
    Constant(f64),
    Exp(f64),
    LogNormal {
        mu: f64,
        sigma: f64,
    },
    /// Cumulative probability and value per mode.
    Modes(Vec<(f64, f64)>),
}

impl Sampler {
    /// One service time in µs and its class.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> (f64, usize) {
        match self {
            Sampler::Constant(v) => (*v, 0),
            Sampler::Exp(m) => {
                let e: f64 = Exp1.sample(rng);
                (e * m, 0)
            }
            Sampler::LogNormal { mu, sigma } => {
                let z: f64 = StandardNormal.sample(rng);
                ((mu + sigma * z).exp(), 0)
            }
            Sampler::Modes(cdf) => {
                let u: f64 = rng.random();
                let i = cdf
                    .iter()
                    .position(|&(c, _)| u < c)
                    .unwrap_or(cdf.len() - 1);
                (cdf[i].1, i)
            }
        }
    }
}

/// Open-loop arrivals: Poisson with a piecewise-constant rate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoadStep {
    /// How long this step lasts, µs (the last step lasts forever).
    pub duration_us: f64,
    /// Arrival rate during the step, requests per µs.
    pub rate_per_us: f64,
}

/// Generates Poisson arrival times (ps) with a rate that can step
/// (baseline → burst → baseline). Memorylessness makes restarting the
/// exponential draw at a step boundary exact.
#[derive(Clone, Debug)]
pub struct Arrivals {
    steps: Vec<(u64, f64)>,
    step: usize,
    now: u64,
}

impl Arrivals {
    pub fn poisson(rate_per_us: f64) -> Self {
        Self::steps(&[LoadStep {
            duration_us: f64::INFINITY,
            rate_per_us,
        }])
    }

    pub fn steps(steps: &[LoadStep]) -> Self {
        assert!(!steps.is_empty(), "no load steps");
        let mut end = 0u64;
        let steps = steps
            .iter()
            .map(|s| {
                end = if s.duration_us.is_finite() {
                    end.saturating_add(crate::us_to_ps(s.duration_us))
                } else {
                    u64::MAX
                };
                (end, s.rate_per_us)
            })
            .collect();
        Self {
            steps,
            step: 0,
            now: 0,
        }
    }

    /// The next arrival time in ps.
    pub fn next<R: Rng + ?Sized>(&mut self, rng: &mut R) -> u64 {
        loop {
            let (end, rate) = self.steps[self.step];
            let last = self.step + 1 == self.steps.len();
            if rate <= 0.0 {
                if last {
                    return u64::MAX;
                }
                self.now = end;
                self.step += 1;
                continue;
            }
            let e: f64 = Exp1.sample(rng);
            let t = self.now.saturating_add(crate::us_to_ps(e / rate).max(1));
            if last || t < end {
                self.now = t;
                return t;
            }
            self.now = end;
            self.step += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::SmallRng, SeedableRng};

    #[test]
    fn parse_paper_notation() {
        assert_eq!(
            Service::parse("Bimodal(99.5-0.5, 0.5-500)").unwrap(),
            Service::Modes(vec![(0.995, 0.5), (0.005, 500.0)])
        );
        assert_eq!(
            Service::parse("LogNormal(1, 10)").unwrap(),
            Service::LogNormal {
                mean: 1.0,
                sd: 10.0
            }
        );
        assert_eq!(
            Service::parse("exponential(1)").unwrap(),
            Service::Exp { mean: 1.0 }
        );
        assert!(Service::parse("Trimodal(50-1, 50-2)").is_err());
        assert!(Service::parse("Bimodal(50-1, 40-2)").is_err());
        let s = Service::parse("Trimodal(33-1, 33-10, 34-100)").unwrap();
        assert_eq!(Service::parse(&s.label()).unwrap(), s);
    }

    #[test]
    fn sample_means() {
        let mut rng = SmallRng::seed_from_u64(3);
        for s in [
            "Exp(2)",
            "LogNormal(1, 2)",
            "Bimodal(50-1, 50-100)",
            "Constant(3)",
        ] {
            let svc = Service::parse(s).unwrap();
            let smp = svc.sampler();
            let n = 200_000;
            let m: f64 = (0..n).map(|_| smp.sample(&mut rng).0).sum::<f64>() / n as f64;
            // Loose: LogNormal(1,2) has CV 2, so the sample mean's sd is ~0.5 %.
            assert!((m / svc.mean() - 1.0).abs() < 0.03, "{s}: {m}");
        }
    }

    #[test]
    fn load_steps_change_rate() {
        let mut rng = SmallRng::seed_from_u64(1);
        let steps = [
            LoadStep {
                duration_us: 1000.0,
                rate_per_us: 0.1,
            },
            LoadStep {
                duration_us: 1000.0,
                rate_per_us: 1.0,
            },
            LoadStep {
                duration_us: f64::INFINITY,
                rate_per_us: 0.1,
            },
        ];
        let mut a = Arrivals::steps(&steps);
        let mut counts = [0u32; 3];
        loop {
            let t = a.next(&mut rng);
            if t >= crate::us_to_ps(3000.0) {
                break;
            }
            counts[(t / crate::us_to_ps(1000.0)) as usize] += 1;
        }
        assert!(counts[0] > 60 && counts[0] < 140, "{counts:?}");
        assert!(counts[1] > 900 && counts[1] < 1100, "{counts:?}");
        assert!(counts[2] > 60 && counts[2] < 140, "{counts:?}");
    }
}
