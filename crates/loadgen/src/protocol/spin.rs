//! Requests that carry their own service time: `ginza_proto::RequestHeader`
//! at the start of the payload, as spin-server expects (it spins for
//! `service_ns`, then echoes the payload). The header's `seq` is the
//! request's id, so an answer is parsed like an echo.

use std::time::Duration;

use ginza_proto::{RequestHeader, REQUEST_HEADER_LEN};
use rand::rngs::SmallRng;
use rand::Rng;
use rand_distr::{Distribution, Exp};

use super::{echo, Transport};

/// A service-time distribution.
#[derive(Debug, Clone, PartialEq)]
pub enum ServiceTime {
    /// Always the same.
    Fixed(Duration),
    /// Exponential with this mean.
    Exponential(Duration),
    /// `short` with probability `p`, else `long` (Shinjuku's bimodal
    /// workloads); reported as two classes.
    Bimodal {
        p: f64,
        short: Duration,
        long: Duration,
    },
}

impl ServiceTime {
    /// Parses `fixed:10us`, `exp:10us` or `bimodal:0.995:5us:500us`.
    pub fn parse(s: &str) -> Result<ServiceTime, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let d = ginza_proto::parse_duration;
        match parts.as_slice() {
            ["fixed", t] => Ok(ServiceTime::Fixed(d(t)?)),
            ["exp", t] => Ok(ServiceTime::Exponential(d(t)?)),
            ["bimodal", p, short, long] => {
                let p: f64 = p
                    .parse()
                    .ok()
                    .filter(|p: &f64| (0.0..=1.0).contains(p))
                    .ok_or_else(|| format!("{s:?}: the probability {p:?} is not within 0..1"))?;
                Ok(ServiceTime::Bimodal {
                    p,
                    short: d(short)?,
                    long: d(long)?,
                })
            }
            _ => Err(format!(
                "{s:?} is not a service time (fixed:10us, exp:10us, bimodal:0.995:5us:500us)"
            )),
        }
    }

    /// A service time, and its class.
    fn sample(&self, rng: &mut SmallRng) -> (Duration, u8) {
        match *self {
            ServiceTime::Fixed(t) => (t, 0),
            ServiceTime::Exponential(mean) => {
                let ns = mean.as_nanos() as f64;
                if ns == 0.0 {
                    return (Duration::ZERO, 0);
                }
                let e = Exp::new(1.0 / ns).expect("positive mean");
                (Duration::from_nanos(e.sample(rng) as u64), 0)
            }
            ServiceTime::Bimodal { p, short, long } => {
                if rng.random_bool(p) {
                    (short, 0)
                } else {
                    (long, 1)
                }
            }
        }
    }
}

/// Spin requests of `size` bytes (at least the header).
#[derive(Debug, Clone)]
pub struct Spin {
    pub service: ServiceTime,
    pub size: usize,
}

impl Spin {
    pub fn classes(&self) -> Vec<&'static str> {
        match self.service {
            ServiceTime::Bimodal { .. } => vec!["short", "long"],
            _ => vec!["spin"],
        }
    }

    pub fn check(&self, transport: Transport) -> Result<(), String> {
        echo::check_size(self.size, REQUEST_HEADER_LEN, transport)
    }

    /// Appends request `seq`: the header (its `send_ns` the scheduled time)
    /// and zero padding. Gives its class and id.
    pub fn encode(
        &self,
        seq: u64,
        scheduled_ns: u64,
        rng: &mut SmallRng,
        out: &mut Vec<u8>,
    ) -> (u8, u64) {
        let (service, class) = self.service.sample(rng);
        let start = out.len();
        out.resize(start + self.size.max(REQUEST_HEADER_LEN), 0);
        RequestHeader {
            seq,
            send_ns: scheduled_ns,
            service_ns: service.as_nanos() as u64,
        }
        .encode(&mut out[start..]);
        (class, seq)
    }
}
