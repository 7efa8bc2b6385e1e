//! What `ginza demo` prints and writes: the header describing the run, the
//! CSV and PNG, the table with where the requests' time went, and the JSON.

use std::path::Path;

use ginza_sys::cpulist;
use serde::Serialize;

use super::args::{DemoArgs, Policy, Service, MEAN_SERVICE};
use super::harness::Setup;
use super::report::{self, Row};
use super::{phases, plot, quiet};

/// The JSON output.
#[derive(Serialize)]
pub(super) struct Report<'a> {
    iokernel_core: usize,
    managed_cores: &'a [usize],
    mean_service_us: f64,
    warmup_ms: f64,
    duration_ms: f64,
    seed: u64,
    /// The park/wake settings of the run.
    lc_spin_us: f64,
    lc_linger_us: f64,
    batch_sched_idle: bool,
    batch_linger_us: f64,
    handover_at_once: bool,
    idle_victim_grace_us: f64,
    /// `--local-wake`'s wait, µs (absent: off).
    local_wake_us: Option<f64>,
    csv: String,
    png: String,
    rows: &'a [Row],
}

/// The lines above the table: the CPUs, the applications, the load and the
/// park/wake settings of the run.
pub(super) fn header(setup: &Setup) -> String {
    let iokernel_core = setup.iokernel_core;
    let n = setup.managed.len();
    let mut head = format!(
        "ginza demo: iokerneld on CPU {iokernel_core} (spinning), {n} managed core(s) (CPU {}) \
         shared by lc (latency-critical) and batch\n",
        cpulist::format(&setup.managed)
    );
    if n == 1 {
        head.push_str(
            "  only one managed core on this machine: the two applications take turns on it\n",
        );
    }
    head.push_str(&format!(
        "  lc: spin-server (UDP, a uthread per request spinning for the time the request carries); \
         batch: Monte Carlo option pricing; load: iokerneld's generator, Poisson arrivals; \
         {:?} warm-up + {:?} measured per point\n",
        setup.warmup, setup.duration
    ));
    head.push_str(
        "  latency: reply − injection at iokerneld (open loop); achieved: LC service time spent \
         / capacity;\n  realloc/s: cores moved between lc and batch; LC ans/sent: requests \
         answered / sent\n",
    );
    let t = &setup.tuning;
    head.push_str(&format!(
        "  parking: lc spins {:?} before parking, lingers {:?}; batch {}, lingers {:?}; \
         iokerneld {}\n  ×static: p50 over static's at the same load; batch/spare: batch's \
         paths/s over its paths/s alone on the managed cores (measured after each point) × \
         (1 − achieved)\n",
        t.lc_spin,
        t.lc_linger,
        if t.batch_sched_idle {
            "under SCHED_IDLE"
        } else {
            "at the default Linux class"
        },
        t.batch_linger,
        if t.handover_at_once {
            format!(
                "wakes lc at once on a core taken from a SCHED_IDLE kthread, signals that \
                 kthread after {:?} unless lc gave the core back (withdrawn)",
                t.idle_victim_grace
            )
        } else {
            "waits for every preempted kthread before waking lc".to_string()
        }
    ));
    if let Some(w) = t.local_wake {
        head.push_str(&format!(
            "  local wakes: batch's kthread on the core wakes lc (iokerneld's doorbell, taken at \
             batch's preemption points); iokerneld wakes lc itself after {w:?}\n"
        ));
    }

    head
}

/// Writes `demo.csv` and `demo.png` under `--out` and prints the table
/// (with `--json`, the table on stderr and the JSON on stdout).
pub(super) fn write(
    args: &DemoArgs,
    setup: &Setup,
    policies: &[Policy],
    services: &[Service],
    head: String,
    rows: &[Row],
) -> anyhow::Result<()> {
    let n = setup.managed.len();
    let iokernel_core = setup.iokernel_core;
    let csv = args.out.join("demo.csv");
    let png = args.out.join("demo.png");
    report::write_csv(&csv, rows)?;
    let names: Vec<&str> = policies.iter().map(|p| p.name()).collect();
    let service_names: Vec<&str> = services.iter().map(|s| s.name()).collect();
    plot::write_png(
        &png,
        rows,
        &service_names,
        &names,
        &format!(
            "ginza demo: {n} managed core(s), UDP spin-server (mean 10 µs) + batch, {:?} per point",
            setup.duration
        ),
    )?;
    let table = head + &table(rows, policies, services, n, (&csv, &png));
    if args.json {
        eprint!("{table}");
        let report = Report {
            iokernel_core,
            managed_cores: &setup.managed,
            mean_service_us: MEAN_SERVICE.as_secs_f64() * 1e6,
            warmup_ms: setup.warmup.as_secs_f64() * 1e3,
            duration_ms: setup.duration.as_secs_f64() * 1e3,
            seed: setup.seed,
            lc_spin_us: setup.tuning.lc_spin.as_secs_f64() * 1e6,
            lc_linger_us: setup.tuning.lc_linger.as_secs_f64() * 1e6,
            batch_sched_idle: setup.tuning.batch_sched_idle,
            batch_linger_us: setup.tuning.batch_linger.as_secs_f64() * 1e6,
            handover_at_once: setup.tuning.handover_at_once,
            idle_victim_grace_us: setup.tuning.idle_victim_grace.as_secs_f64() * 1e6,
            local_wake_us: setup.tuning.local_wake.map(|w| w.as_secs_f64() * 1e6),
            csv: csv.display().to_string(),
            png: png.display().to_string(),
            rows,
        };
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{table}");
    }
    Ok(())
}

/// The table of rows, where the requests' time went, a warning for the
/// points that did not run quietly, and where the files went.
fn table(
    rows: &[Row],
    policies: &[Policy],
    services: &[Service],
    n: usize,
    (csv, png): (&Path, &Path),
) -> String {
    let described: Vec<(&'static str, String)> =
        policies.iter().map(|p| (p.name(), p.describe(n))).collect();
    let service_described: Vec<(&'static str, String)> = services
        .iter()
        .map(|s| (s.name(), s.describe().to_string()))
        .collect();
    let mut table = String::new();
    table.push_str(&report::render_table(rows, &service_described, &described));
    table.push_str("\nwhere the requests' time went (p50s, µs; `phases` in the JSON):\n");
    for r in rows {
        if let Some(p) = &r.phases {
            table.push_str(&format!(
                "  {} {} @ {:.2}: {}\n",
                r.service,
                r.policy,
                r.offered_load,
                phases::describe(p)
            ));
        }
    }
    let noisy = rows.iter().filter(|r| r.quiet == "no").count();
    if noisy > 0 {
        table.push_str(&format!(
            "\nWARNING: {noisy} of {} points ran while other processes competed for the demo's CPUs \
             (rows marked NOT QUIET; `quiet` in the CSV/JSON, over {:.0} % foreign or stolen time): \
             their latencies are not a result of the allocator; rerun on a quiet machine\n",
            rows.len(),
            quiet::NOT_QUIET_PCT
        ));
    }
    table.push_str(&format!(
        "\nwrote {} and {}\n",
        csv.display(),
        png.display()
    ));
    table
}
