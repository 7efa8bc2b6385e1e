//! `ginza bench corealloc`: how fast iokerneld moves a core, next to the
//! floor this machine sets, in one run.
//!
//! iokerneld runs in this process on its own CPU (`--iokernel-core`,
//! default: the first allowed CPU), spinning, with the 5 µs Shenango
//! allocator; it manages one core (`--core`, default: the last allowed
//! CPU). Every figure is a distribution over `--grants` events, reported as
//! p50/p99:
//!
//! * `eventfd_floor_us`: a thread blocked in `ppoll` on an eventfd on the
//!   managed core, woken by an eventfd write from iokerneld's CPU; write →
//!   woken thread running. Gaps between wakes are drawn as for `grant_us`,
//!   so the vCPU has idled alike (a halted vCPU is slow to wake).
//! * `grant_us`: an application with one kthread whose only uthread sleeps
//!   for a random gap: the kthread parks (`Parked` with its timer) and
//!   blocks; iokerneld sees the timer expire and grants the core. From the
//!   decision (the time carried in `Wake`) to the kthread running, measured
//!   by the kthread.
//! * `grant_spinning_us`: the same with the kthread lingering after it
//!   parked (`linger_after_park`) and short gaps, so the grant finds it
//!   still polling its grant word: no wake-up from halt.
//! * `iokernel_ns_per_grant`: iokerneld's own time to carry out one grant
//!   (bookkeeping, command ring, `sched_setaffinity` unless the kthread is
//!   still pinned to that CPU, the grant word, and the eventfd write if the
//!   kthread sleeps), from its stats, over both grant runs: half of them
//!   to a lingering kthread, half to a blocked one, so its p50 falls
//!   between the two kinds and says little alone. Hence by how the grant
//!   was delivered (docs/runtime.md, "Grants without a system call"), over
//!   the same runs: `iokernel_ns_per_grant_lingering` (the grant word alone,
//!   no system call) and `iokernel_ns_per_grant_blocked` (the eventfd
//!   write that wakes a sleeping thread); and
//!   `iokernel_ns_per_grant_handover`, every grant of the hand-over run.
//! * `iokernel_ns_per_pass`: an allocation pass that decided nothing
//!   (drain the rings, read the queue lines, run the policy), over the grant
//!   runs: the fixed cost iokerneld pays every 5 µs.
//! * `preempt_handover_us` and `reallocs_per_s`: a batch application spins
//!   on the managed core while the latency-critical one sleeps short gaps
//!   (`--handover-gap-us`, default 5–15 µs: with gaps of mean g at most
//!   2/g moves a second are possible, reported as `reallocs_ceiling_per_s`);
//!   every wake of the latter preempts the former (signal), and the core is
//!   handed over when the victim reports `Yielded` (or at once from a
//!   SCHED_IDLE victim); then the batch application takes the core back
//!   when the other parks. Both applications are configured as their class
//!   is by default (the batch one lingers `BATCH_LINGER` after it gives
//!   the core back, `--handover-batch-linger-us` changes it, 0: it blocks
//!   at once, as it once did). Hand-over time
//!   from iokerneld's stats (preemption sent → receiving kthread woken);
//!   reallocations per second = core moves between the two applications
//!   over the run's wall time.

use std::fmt::Write as _;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ginza_iokernel::{Config as IokConfig, PolicyKind};
use ginza_proto::{client, StatsReport};
use ginza_runtime::{Class, Config};
use ginza_sys::{clock, eventfd};
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::harness::app::{app_config, App};
use crate::harness::figures::{allowed_cpus, emit, percentile};
use crate::harness::iokerneld::{socket_dir, Iokerneld};

/// Arguments of `ginza bench corealloc`.
#[derive(clap::Args, Debug)]
pub struct CoreallocArgs {
    /// Print one JSON object on stdout (the table then goes to stderr).
    #[arg(long)]
    json: bool,
    /// Events per measurement.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(10..))]
    grants: u64,
    /// iokerneld's CPU (default: the first allowed CPU).
    #[arg(long)]
    iokernel_core: Option<usize>,
    /// The managed core (default: the last allowed CPU).
    #[arg(long)]
    core: Option<usize>,
    /// Length of the preemption/hand-over run.
    #[arg(long, default_value = "2s", value_parser = humantime_like)]
    handover_for: Duration,
    /// The latency-critical application's sleeps in the hand-over run:
    /// `LO,HI` µs, uniform. Every sleep moves the core twice (to the batch
    /// application and back), so the gaps bound `reallocs_per_s`.
    #[arg(long, default_value = "5,15", value_parser = gap_range)]
    handover_gap_us: (u64, u64),
    /// The batch application's linger after it gives the core back in the
    /// hand-over run, µs [default: the runtime's `BATCH_LINGER`].
    #[arg(long)]
    handover_batch_linger_us: Option<u64>,
    /// iokerneld's grace before it signals a SCHED_IDLE batch kthread whose
    /// core went to the latency-critical one, µs; a core given back
    /// within it withdraws the preemption [default: iokerneld's; 0: signal
    /// at once, the mechanism before] (docs/runtime.md, "Preemptions
    /// withdrawn").
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=60_000_000))]
    idle_victim_grace_us: Option<u64>,
}

fn gap_range(s: &str) -> Result<(u64, u64), String> {
    let (lo, hi) = s
        .split_once(',')
        .ok_or_else(|| format!("{s:?}: expected LO,HI (µs)"))?;
    let num = |x: &str| {
        x.trim()
            .parse::<u64>()
            .map_err(|e| format!("{x:?} in {s:?}: {e}"))
    };
    let (lo, hi) = (num(lo)?, num(hi)?);
    if lo == 0 || lo > hi || hi > 1_000_000 {
        return Err(format!("{s:?}: need 0 < LO <= HI <= 1000000 µs"));
    }
    Ok((lo, hi))
}

fn humantime_like(s: &str) -> Result<Duration, String> {
    ginza_proto::parse_duration(s)
}

/// Gaps between grants when the kthread blocks (µs, uniform).
const BLOCKED_GAP_US: (u64, u64) = (100, 300);
/// Gaps when the kthread lingers (µs, uniform), well inside the linger.
const LINGER_GAP_US: (u64, u64) = (10, 40);
const LINGER: Duration = Duration::from_millis(2);

#[derive(Clone, Copy, Debug, Serialize)]
struct Pct {
    p50: f64,
    p99: f64,
    mean: f64,
    n: usize,
}

impl Pct {
    fn of_latency(l: &ginza_proto::messages::Latency, scale: f64) -> Option<Pct> {
        (l.count > 0).then(|| Pct {
            p50: l.p50_ns as f64 / scale,
            p99: l.p99_ns as f64 / scale,
            mean: l.mean_ns as f64 / scale,
            n: l.count as usize,
        })
    }

    fn of_ns(mut v: Vec<u64>, scale: f64) -> Option<Pct> {
        v.sort_unstable();
        Some(Pct {
            p50: percentile(&v, 50.0)? as f64 / scale,
            p99: percentile(&v, 99.0)? as f64 / scale,
            mean: v.iter().sum::<u64>() as f64 / v.len() as f64 / scale,
            n: v.len(),
        })
    }
}

#[derive(Debug, Serialize)]
struct Report {
    grant_us: Option<Pct>,
    grant_spinning_us: Option<Pct>,
    eventfd_floor_us: Option<Pct>,
    iokernel_ns_per_grant: Option<Pct>,
    /// The grants delivered by the grant word alone (a lingering kthread).
    iokernel_ns_per_grant_lingering: Option<Pct>,
    /// The grants that wrote the eventfd (a sleeping kthread).
    iokernel_ns_per_grant_blocked: Option<Pct>,
    /// Every grant of the hand-over run (to the latency-critical kthread
    /// after a preemption, to the batch one when the other parks).
    iokernel_ns_per_grant_handover: Option<Pct>,
    iokernel_ns_per_pass: Option<Pct>,
    preempt_handover_us: Option<Pct>,
    reallocs_per_s: f64,
    /// The most the hand-over run's gaps allow: two moves per gap of mean
    /// length.
    reallocs_ceiling_per_s: f64,
    handover_gap_us: (u64, u64),
    /// The batch application's linger in the hand-over run (µs).
    handover_batch_linger_us: u64,
    /// iokerneld's time per preemption it sent (line flag, command ring,
    /// signal) is inside `preempt_handover_us`; these are the run's counts.
    preemptions: u64,
    handovers: u64,
    /// Preemptions of the batch kthread withdrawn (the core came back
    /// before it was signalled), and the grace that allowed it (µs).
    preemptions_withdrawn: u64,
    idle_victim_grace_us: u64,
    /// The latency-critical kthread's grants in the hand-over run, from
    /// iokerneld's wake (once the victim gave the core back) to running.
    grant_after_preemption_us: Option<Pct>,
    iokernel_cpu: usize,
    managed_core: usize,
}

pub fn run(args: CoreallocArgs) -> anyhow::Result<()> {
    let allowed = allowed_cpus()?;
    anyhow::ensure!(
        allowed.len() >= 2,
        "this process may only run on CPUs {allowed:?}; iokerneld and the managed core need two"
    );
    let io_cpu = args.iokernel_core.unwrap_or(allowed[0]);
    let core = args.core.unwrap_or(allowed[allowed.len() - 1]);
    for c in [io_cpu, core] {
        anyhow::ensure!(
            allowed.contains(&c),
            "CPU {c} is not among the allowed CPUs {allowed:?}"
        );
    }
    anyhow::ensure!(
        io_cpu != core,
        "iokerneld's CPU and the managed core must differ"
    );
    let n = args.grants as usize;
    eprintln!("corealloc: iokerneld on CPU {io_cpu}, managed core {core}, {n} events per figure");

    eprintln!("corealloc: eventfd floor");
    let floor = eventfd_floor(io_cpu, core, n)?;

    let dir = socket_dir("corealloc");
    let mut cfg = IokConfig::new(vec![core]);
    cfg.own_core = Some(io_cpu);
    cfg.policy = PolicyKind::Shenango;
    cfg.socket = dir.join("iokerneld.sock");
    if let Some(us) = args.idle_victim_grace_us {
        cfg.idle_victim_grace = Duration::from_micros(us);
    }
    let grace = cfg.idle_victim_grace;
    cfg.validate(&allowed).context("iokerneld configuration")?;
    let daemon = Iokerneld::start(cfg)
        .context("starting iokerneld")?
        .removing(dir);
    let socket = daemon.socket().to_path_buf();

    eprintln!("corealloc: grants to a blocked kthread");
    client::reset_stats(&socket)?;
    let (blocked, _) = sleeper(
        &socket,
        "grant",
        n,
        GrantKind::Blocked,
        BLOCKED_GAP_US,
        Duration::ZERO,
    )?;
    // Not a reset: the lingering run adds to this window.
    eprintln!("corealloc: grants to a lingering kthread");
    let (_, lingering) = sleeper(
        &socket,
        "grant-linger",
        n,
        GrantKind::Lingering,
        LINGER_GAP_US,
        LINGER,
    )?;
    // iokerneld's cost per grant over both grant runs.
    let st_grants = daemon.stats()?;

    eprintln!(
        "corealloc: preemption hand-overs for {:?}",
        args.handover_for
    );
    let batch_linger = args
        .handover_batch_linger_us
        .map_or(ginza_runtime::BATCH_LINGER, Duration::from_micros);
    let (after_preempt, st_hand) = handover(
        &socket,
        args.handover_for,
        args.handover_gap_us,
        batch_linger,
    )?;
    drop(daemon);

    let hand = &st_hand.alloc;
    let report = Report {
        grant_us: Pct::of_ns(blocked, 1e3),
        grant_spinning_us: Pct::of_ns(lingering, 1e3),
        eventfd_floor_us: Pct::of_ns(floor, 1e3),
        iokernel_ns_per_grant: Pct::of_latency(&st_grants.alloc.grant_cost, 1.0),
        iokernel_ns_per_grant_lingering: Pct::of_latency(&st_grants.alloc.grant_cost_by_word, 1.0),
        iokernel_ns_per_grant_blocked: Pct::of_latency(&st_grants.alloc.grant_cost_by_eventfd, 1.0),
        iokernel_ns_per_grant_handover: Pct::of_latency(&hand.grant_cost, 1.0),
        iokernel_ns_per_pass: Pct::of_latency(&st_grants.alloc.pass_cost_idle, 1.0),
        preempt_handover_us: Pct::of_latency(&hand.handover, 1e3),
        reallocs_per_s: hand.reallocations as f64 / (hand.window_ns.max(1) as f64 / 1e9),
        // Two moves per mean gap (µs).
        reallocs_ceiling_per_s: 2e6
            / ((args.handover_gap_us.0 + args.handover_gap_us.1) as f64 / 2.0),
        handover_gap_us: args.handover_gap_us,
        handover_batch_linger_us: batch_linger.as_micros() as u64,
        preemptions: hand.preemptions,
        handovers: hand.handovers,
        preemptions_withdrawn: hand.preemptions_withdrawn,
        idle_victim_grace_us: grace.as_micros() as u64,
        grant_after_preemption_us: Pct::of_ns(after_preempt, 1e3),
        iokernel_cpu: io_cpu,
        managed_core: core,
    };
    emit(args.json, &render(&report), &report)
}

fn gap(rng: &mut impl Rng, (lo, hi): (u64, u64)) -> Duration {
    Duration::from_micros(rng.random_range(lo..=hi))
}

/// Write → running of a thread blocked on an eventfd on `core`, written
/// from `writer_cpu`.
fn eventfd_floor(writer_cpu: usize, core: usize, n: usize) -> anyhow::Result<Vec<u64>> {
    let fd = Arc::new(eventfd::new_blocking().context("eventfd")?);
    let sent = Arc::new(AtomicU64::new(0));
    // Wakes the waiter has taken: the writer waits for each one before the
    // next gap, so two writes never coalesce into one read.
    let taken = Arc::new(AtomicU64::new(0));
    let waiter = {
        let (fd, sent, taken) = (Arc::clone(&fd), Arc::clone(&sent), Arc::clone(&taken));
        std::thread::spawn(move || -> anyhow::Result<Vec<u64>> {
            ginza_sys::affinity::pin_current_thread(core)
                .with_context(|| format!("pinning the eventfd waiter to CPU {core}"))?;
            let mut out = Vec::with_capacity(n);
            while out.len() < n {
                // Blocks until written.
                eventfd::read(fd.as_fd()).context("eventfd read")?;
                out.push(clock::monotonic_ns().saturating_sub(sent.load(Ordering::Acquire)));
                taken.fetch_add(1, Ordering::Release);
            }
            Ok(out)
        })
    };
    // The writer gets a thread of its own, so the caller's affinity is left alone.
    let writer = std::thread::spawn(move || -> anyhow::Result<()> {
        ginza_sys::affinity::pin_current_thread(writer_cpu)
            .with_context(|| format!("pinning the eventfd writer to CPU {writer_cpu}"))?;
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for i in 0..n as u64 {
            let t = Instant::now();
            while taken.load(Ordering::Acquire) < i {
                anyhow::ensure!(
                    t.elapsed() < Duration::from_secs(5),
                    "the eventfd waiter on CPU {core} did not run for 5 s"
                );
                std::thread::yield_now();
            }
            std::thread::sleep(gap(&mut rng, BLOCKED_GAP_US));
            sent.store(clock::monotonic_ns(), Ordering::Release);
            eventfd::write(fd.as_fd(), 1).context("eventfd write")?;
        }
        Ok(())
    });
    writer
        .join()
        .map_err(|_| anyhow::anyhow!("eventfd writer panicked"))??;
    waiter
        .join()
        .map_err(|_| anyhow::anyhow!("eventfd waiter panicked"))?
}

fn app(socket: &std::path::Path, name: &str, class: Class, linger: Duration) -> Config {
    let mut cfg = app_config(socket, name, class, 1);
    if let Some(io) = cfg.iokernel.as_mut() {
        io.linger_after_park = linger;
        // Every gap must end in a park, or there is no grant to measure.
        io.poll_while_idle = Duration::ZERO;
    }
    cfg
}

/// Which grants a [`sleeper`] run counts toward its `n`.
#[derive(Clone, Copy)]
enum GrantKind {
    Blocked,
    Lingering,
}

/// An application whose one uthread sleeps random gaps until its kthread
/// measured `n` grants of `kind` (a gap can end without one: the timer
/// expired before the kthread blocked, or after it stopped lingering), at
/// most `4 n` gaps; the grant latencies of both kinds.
fn sleeper(
    socket: &std::path::Path,
    name: &str,
    n: usize,
    kind: GrantKind,
    gaps: (u64, u64),
    linger: Duration,
) -> anyhow::Result<(Vec<u64>, Vec<u64>)> {
    let lat = ginza_runtime::run(
        app(socket, name, Class::LatencyCritical, linger),
        move || {
            let h = ginza_runtime::Handle::current().expect("inside the runtime");
            let mut rng = rand::rngs::StdRng::seed_from_u64(2);
            // Warm-up grants are not measured.
            for _ in 0..20 {
                ginza_runtime::sleep(gap(&mut rng, gaps));
            }
            h.take_grant_latencies();
            let mut all = ginza_runtime::GrantLatencies::default();
            for _ in 0..4 * n {
                ginza_runtime::sleep(gap(&mut rng, gaps));
                let mut l = h.take_grant_latencies();
                all.from_blocked_ns.append(&mut l.from_blocked_ns);
                all.while_lingering_ns.append(&mut l.while_lingering_ns);
                let counted = match kind {
                    GrantKind::Blocked => all.from_blocked_ns.len(),
                    GrantKind::Lingering => all.while_lingering_ns.len(),
                };
                if counted >= n {
                    break;
                }
            }
            all
        },
    )?;
    let widen = |v: Vec<u32>| v.into_iter().map(u64::from).collect::<Vec<_>>();
    Ok((widen(lat.from_blocked_ns), widen(lat.while_lingering_ns)))
}

/// A spinning batch application and a latency-critical sleeper share the
/// core for `length`. Returns the sleeper's grant latencies and iokerneld's
/// stats of the run (its window starts when the sleeper starts).
fn handover(
    socket: &std::path::Path,
    length: Duration,
    gaps: (u64, u64),
    batch_linger: Duration,
) -> anyhow::Result<(Vec<u64>, StatsReport)> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut hog = {
        let stop = Arc::clone(&stop);
        let cfg = app(socket, "hog", Class::Batch, batch_linger);
        App::spawn("hog", cfg, move || {
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                while t.elapsed() < Duration::from_micros(20) {
                    std::hint::spin_loop();
                }
                ginza_runtime::yield_now();
            }
        })?
    };
    // Let the hog take the core first.
    let t0 = Instant::now();
    while !client::stats(socket)?
        .apps
        .iter()
        .any(|a| a.name == "hog" && a.cores_now == 1)
    {
        anyhow::ensure!(
            t0.elapsed() < Duration::from_secs(5),
            "the batch application got no core"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    client::reset_stats(socket)?;
    let lat = ginza_runtime::run(
        app(socket, "probe", Class::LatencyCritical, Duration::ZERO),
        move || {
            let h = ginza_runtime::Handle::current().expect("inside the runtime");
            let mut rng = rand::rngs::StdRng::seed_from_u64(3);
            let t = Instant::now();
            while t.elapsed() < length {
                ginza_runtime::sleep(gap(&mut rng, gaps));
            }
            h.take_grant_latencies()
        },
    )?;
    let st = client::stats(socket)?;
    stop.store(true, Ordering::Relaxed);
    hog.join()?;
    let lat = lat.from_blocked_ns.into_iter().map(u64::from).collect();
    Ok((lat, st))
}

fn render(r: &Report) -> String {
    let mut t = String::new();
    let row = |t: &mut String, what: &str, p: &Option<Pct>, unit: &str| {
        let _ = match p {
            Some(p) => writeln!(
                t,
                "{what:<34} {:>9.2} {:>9.2} {unit:<3} (n={})",
                p.p50, p.p99, p.n
            ),
            None => writeln!(t, "{what:<34} {:>9} {:>9}", "-", "-"),
        };
    };
    let _ = writeln!(
        t,
        "core allocation (iokerneld on CPU {}, managed core {}); medians of single events",
        r.iokernel_cpu, r.managed_core
    );
    let _ = writeln!(t, "{:<34} {:>9} {:>9}", "", "p50", "p99");
    row(&mut t, "eventfd wake floor", &r.eventfd_floor_us, "µs");
    row(&mut t, "grant, kthread blocked", &r.grant_us, "µs");
    row(
        &mut t,
        "grant, kthread lingering",
        &r.grant_spinning_us,
        "µs",
    );
    row(
        &mut t,
        "iokerneld time per grant",
        &r.iokernel_ns_per_grant,
        "ns",
    );
    row(
        &mut t,
        "  to a lingering kthread (word)",
        &r.iokernel_ns_per_grant_lingering,
        "ns",
    );
    row(
        &mut t,
        "  to a blocked kthread (eventfd)",
        &r.iokernel_ns_per_grant_blocked,
        "ns",
    );
    row(
        &mut t,
        "  in the hand-over run",
        &r.iokernel_ns_per_grant_handover,
        "ns",
    );
    row(
        &mut t,
        "iokerneld pass, nothing decided",
        &r.iokernel_ns_per_pass,
        "ns",
    );
    row(
        &mut t,
        "preemption → core handed over",
        &r.preempt_handover_us,
        "µs",
    );
    row(
        &mut t,
        "hand-over wake → running",
        &r.grant_after_preemption_us,
        "µs",
    );
    let _ = writeln!(
        t,
        "{:<34} {:>9.0} /s (gaps {}–{} µs allow at most {:.0} /s; batch linger {} µs; {} preemptions, {} hand-overs, {} withdrawn within {} µs)",
        "reallocations",
        r.reallocs_per_s,
        r.handover_gap_us.0,
        r.handover_gap_us.1,
        r.reallocs_ceiling_per_s,
        r.handover_batch_linger_us,
        r.preemptions,
        r.handovers,
        r.preemptions_withdrawn,
        r.idle_victim_grace_us
    );
    if let (Some(g), Some(f)) = (&r.grant_us, &r.eventfd_floor_us) {
        let _ = writeln!(
            t,
            "grant / floor (p50): {:.2} (goal: within 1.25); Shenango: 5.9 µs per reallocation, < 2 µs of IOKernel time",
            g.p50 / f.p50
        );
    }
    t
}
