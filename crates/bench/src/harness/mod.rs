//! What the benchmarks and the demo share, so that none imports another's
//! internals: one way to start iokerneld ([`iokerneld`]), one handle on a
//! Ginza application ([`app`]), the direct path's veth setup
//! ([`direct`]), the round trips' shape and quantiles ([`rtt`]), figures
//! and their printing ([`figures`]), the bench's weight against other
//! sessions ([`autogroup`]), the Shinjuku-mode work and CPUs
//! ([`work`]), Linux's batch peer ([`linux_batch`]), the generator's CPU
//! kept awake ([`cpu_keeper`]), where a round-trip client runs
//! ([`client_cpu`]), the loop every load sweep runs through
//! ([`sweep`]) and how the binary was built ([`build_kind`]).

pub(crate) mod app;
pub(crate) mod autogroup;
pub(crate) mod client_cpu;
pub(crate) mod cpu_keeper;
pub(crate) mod cpu_split;
pub(crate) mod direct;
pub(crate) mod figures;
pub(crate) mod iokerneld;
pub(crate) mod linux_batch;
pub(crate) mod rtt;
pub(crate) mod sweep;
pub(crate) mod work;

/// [`build_kind`] of a build without optimisations.
pub(crate) const DEBUG_BUILD: &str = "debug";

/// How this binary was built, for the reports: a debug build's figures, or
/// a profile-guided build's (`packaging/build-pgo` sets `GINZA_PGO`), are
/// not those of the plain release build.
pub(crate) fn build_kind() -> &'static str {
    if cfg!(debug_assertions) {
        DEBUG_BUILD
    } else if option_env!("GINZA_PGO").is_some() {
        "release, profile-guided (packaging/build-pgo)"
    } else {
        "release"
    }
}
