//! Closed forms the simulator is checked against.

/// Erlang C: probability that an arrival waits in M/M/c with offered load
/// `a = λ/μ` (in servers), `a < c`.
pub fn erlang_c(c: usize, a: f64) -> f64 {
    assert!(a < c as f64, "unstable: a = {a} >= c = {c}");
    // Erlang B by its stable recursion, then C from B.
    let mut b = 1.0;
    for k in 1..=c {
        b = a * b / (k as f64 + a * b);
    }
    let rho = a / c as f64;
    b / (1.0 - rho + rho * b)
}

/// M/M/c FCFS mean waiting time (service rate `mu` per server).
pub fn mmc_mean_wait(c: usize, lambda: f64, mu: f64) -> f64 {
    erlang_c(c, lambda / mu) / (c as f64 * mu - lambda)
}

/// M/M/c FCFS P(W > t).
pub fn mmc_wait_exceeds(c: usize, lambda: f64, mu: f64, t: f64) -> f64 {
    erlang_c(c, lambda / mu) * (-(c as f64 * mu - lambda) * t).exp()
}

/// M/G/1 processor sharing mean sojourn: E[S] / (1 − ρ).
pub fn mg1_ps_mean_sojourn(mean_service: f64, rho: f64) -> f64 {
    mean_service / (1.0 - rho)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        // M/M/1: C = ρ.
        assert!((erlang_c(1, 0.8) - 0.8).abs() < 1e-12);
        // M/M/2 at a = 1: C = 1/3.
        assert!((erlang_c(2, 1.0) - 1.0 / 3.0).abs() < 1e-12);
        assert!((mmc_mean_wait(1, 0.9, 1.0) - 9.0).abs() < 1e-9);
    }
}
