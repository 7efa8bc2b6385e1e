//! Packet steering end to end (docs/design.md, "Packet steering"): the
//! generator's UDP requests of 1,000 flows reach an application played by
//! the test while its kthreads lose and regain their cores, once per policy;
//! iokerneld counts flows moved per change of the active set and its ns per
//! decision, the generator counts replies out of order within their flow.
//!
//! The actuator records grants (no thread is woken), so iokerneld manages 4
//! cores whether or not the machine has them: with 4 active kthreads a
//! change of the active set is 4 ⇄ 3, where `rss-mod` moves most flows and
//! the consistent policies about a quarter (with at most 2 active kthreads,
//! `rss-mod`'s modulo is as consistent as `indirection`).
//!
//! The test plays each kthread's queue line as the runtime would: a parked
//! kthread holds no core; one with an item queued for a pass makes the
//! application congested, and iokerneld grants it a core.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ginza_iokernel::nic::ServiceTime;
use ginza_iokernel::raw_app::RawApp;
use ginza_iokernel::{Config, Iokerneld, LoadReport, LoadRun, RecordingActuator};
use ginza_net::{Interface, Ipv4Addr, MacAddr, Packet};
use ginza_policy::steer::SteeringKind;
use ginza_proto::messages::{NetStats, SteeringStats};
use ginza_proto::{client, StatsReport};
use ginza_shm::LineFlags;

#[allow(dead_code)] // only the lock is used here
mod common;
use common::lock;

const KTHREADS: usize = 4;
const FLOWS: u32 = 1_000;
/// How long a kthread stays parked, and how long all hold a core between
/// two parks: long enough that most flows send a packet in each phase (a
/// flow's requests are 50 ms apart on average), so the moves counted are
/// most of the moves the policy made.
const PHASE: Duration = Duration::from_millis(60);

/// iokerneld on a thread, managing `KTHREADS` cores that need not exist
/// (grants are recorded, never carried out).
struct Daemon {
    stop: ginza_iokernel::StopHandle,
    thread: Option<std::thread::JoinHandle<StatsReport>>,
    socket: std::path::PathBuf,
    generator: ginza_iokernel::GeneratorHandle,
    dir: std::path::PathBuf,
}

impl Daemon {
    fn start(tag: &str) -> Daemon {
        let dir = std::env::temp_dir().join(format!("ginza-steer-{}-{tag}", std::process::id()));
        let socket = dir.join("iokerneld.sock");
        let cores: Vec<usize> = (0..KTHREADS).collect();
        let mut cfg = Config::new(cores.clone());
        cfg.socket = socket.clone();
        cfg.idle_sleep = Some(Duration::from_millis(1));
        cfg.validate(&cores).unwrap();
        let d = Iokerneld::bind(cfg, RecordingActuator::new()).unwrap();
        let stop = d.stop_handle();
        let generator = d.generator();
        let thread = std::thread::spawn(move || d.run().unwrap());
        Daemon {
            stop,
            thread: Some(thread),
            socket,
            generator,
            dir,
        }
    }

    fn stats(&self) -> StatsReport {
        client::stats(&self.socket).unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The test's side of the kthreads' queue lines.
struct Lines {
    /// Per kthread: items ever queued (the line's tail).
    queued: Vec<u32>,
}

impl Lines {
    /// Queues one item on `k` that is never taken: iokerneld sees the
    /// application congested and grants `k` a core if it has none.
    fn busy(&mut self, app: &RawApp, k: usize) {
        self.queued[k] += 1;
        let line = &app.ends[k].line;
        line.set_rq_tail(self.queued[k]);
        line.remove_flags(LineFlags::PARKED);
    }

    /// Takes `k`'s queued items: it keeps its core, but wants no more.
    fn settle(&self, app: &RawApp, k: usize) {
        app.ends[k].line.set_rq_head(self.queued[k]);
    }

    /// `k` parks: it gives its core back.
    fn park(&self, app: &mut RawApp, k: usize) {
        self.settle(app, k);
        app.ends[k].line.insert_flags(LineFlags::PARKED);
        app.report_parked(k);
    }
}

/// How long the generator sends.
const SENDING: Duration = Duration::from_millis(720);

/// Echoes every UDP datagram waiting on any kthread's ring back to its
/// sender, as a runtime's active kthreads would (a parked kthread's ring is
/// stolen from, and the reply leaves by the thief's egress ring); returns
/// how many.
fn echo(app: &mut RawApp, parked: Option<usize>) -> u64 {
    let mut echoed = 0;
    for k in 0..KTHREADS {
        let out = if parked == Some(k) {
            (k + 1) % KTHREADS
        } else {
            k
        };
        while let Some((bytes, desc)) = app.recv(k) {
            if let Ok(Packet::Udp(d)) = ginza_net::parse(&bytes, &app.interface) {
                let (mac, src, port) = (d.src_mac, d.src, d.dst.port);
                let payload = d.payload.to_vec();
                echoed += u64::from(app.send_udp(out, mac, src, port, &payload));
            }
            app.give_back(k, desc.buf);
        }
    }
    echoed
}

/// What one policy's run measured.
#[derive(Debug)]
struct Outcome {
    report: LoadReport,
    steering: SteeringStats,
    net: NetStats,
    echoed: u64,
}

/// 1,000 flows of requests at 20,000/s for 720 ms to a 4-kthread
/// application steered by `policy`; every 2 [`PHASE`]s one kthread parks
/// for a phase and is then granted a core again.
fn run(policy: SteeringKind) -> Outcome {
    let d = Daemon::start(policy.name());
    let me = Interface {
        mac: MacAddr([0x02, 0, 0, 0, 0, 1]),
        ip: Ipv4Addr::new(10, 9, 0, 1),
    };
    let mut app = RawApp::register_steered(
        &d.socket,
        "steered",
        me,
        KTHREADS as u32,
        Some(policy.name()),
    )
    .unwrap();
    let mut lines = Lines {
        queued: vec![0; KTHREADS],
    };
    // Every kthread gets a core before the load starts.
    for k in 0..KTHREADS {
        lines.busy(&app, k);
    }
    let t0 = Instant::now();
    while d.stats().apps[0].cores_now < KTHREADS as u32 {
        assert!(t0.elapsed() < Duration::from_secs(5), "{:#?}", d.stats());
        std::thread::sleep(Duration::from_millis(1));
    }
    for k in 0..KTHREADS {
        lines.settle(&app, k);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let driver = std::thread::spawn(move || {
        let mut echoed = 0u64;
        let mut step = 0usize;
        let mut phase_start = Instant::now();
        let mut parked: Option<usize> = None;
        let started = Instant::now();
        while !stop2.load(Ordering::Acquire) {
            echoed += echo(&mut app, parked);
            if started.elapsed() > SENDING {
                // The load is over: every kthread gets its core back.
                if let Some(k) = parked.take() {
                    lines.busy(&app, k);
                }
                continue;
            }
            if phase_start.elapsed() < PHASE {
                continue;
            }
            phase_start = Instant::now();
            match parked.take() {
                None => {
                    for k in 0..KTHREADS {
                        lines.settle(&app, k);
                    }
                    let k = step % KTHREADS;
                    lines.park(&mut app, k);
                    parked = Some(k);
                    step += 1;
                }
                Some(k) => lines.busy(&app, k),
            }
        }
        (echoed, step, app)
    });
    let mut load = LoadRun::poisson(me, 7, 20_000.0, ServiceTime::Constant { ns: 0 }, SENDING);
    load.config.flows = FLOWS;
    load.config.seed = 11;
    load.drain = Duration::from_millis(300);
    let report = d
        .generator
        .run(load.clone(), Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}: {:#?}", d.stats()));
    stop.store(true, Ordering::Release);
    let (mut echoed, steps, mut app) = driver.join().unwrap();
    // Replies the drain did not wait for: echo them so the app's counts add
    // up (the generator's report is already taken).
    echoed += echo(&mut app, None);
    let stats = d.stats();
    let steering = stats
        .dataplane
        .steering
        .iter()
        .find(|s| s.st == policy.code())
        .copied()
        .unwrap_or_else(|| panic!("no steering stats for {policy}: {stats:#?}"));
    eprintln!(
        "{policy}: {steps} parks; {:?}; {:?}; {steering:?}; moved/change {:.1}, ns/decision {:.0}, reordered {} of {} replies",
        report.stats,
        stats.apps[0].net,
        steering.moved_per_change().unwrap_or(f64::NAN),
        steering.ns_per_decision().unwrap_or(f64::NAN),
        report.stats.reordered,
        report.stats.replies,
    );
    assert!(steps >= 4, "{policy}: the cores changed only {steps} times");
    Outcome {
        report,
        steering,
        net: stats.apps[0].net.unwrap(),
        echoed,
    }
}

#[test]
fn cores_come_and_go_under_1000_flows_and_each_policy_is_measured() {
    let _g = lock();
    let outcomes: Vec<(SteeringKind, Outcome)> =
        SteeringKind::ALL.into_iter().map(|p| (p, run(p))).collect();
    for (policy, o) in &outcomes {
        let st = o.report.stats;
        assert!(st.sent > 8_000, "{policy}: {st:?}");
        // Every request iokerneld delivered was answered; on a loaded
        // machine the echo thread may lose its CPU long enough for a ring
        // to fill, and those requests are counted drops (printed above).
        let net = o.net;
        assert_eq!(
            st.replies + net.drop_ingress,
            st.sent,
            "{policy}: every request answered or counted dropped: {st:?} {net:?}"
        );
        assert!(net.drop_ingress * 2 < st.sent, "{policy}: {net:?}");
        assert_eq!(st.unmatched_replies + st.malformed_replies, 0, "{st:?}");
        assert!(o.echoed >= st.replies, "{policy}: echoed {}", o.echoed);
        // The reorder counter is computed on every reply and is one of them.
        assert!(st.reordered <= st.replies, "{policy}: {st:?}");
        let s = &o.steering;
        assert_eq!(s.apps, 1);
        // Each park and each grant back is one change.
        assert!(s.ch >= 8, "{policy}: {s:?}");
        // Decisions timed: all but those of preempted bursts.
        assert!(s.sd > 0 && s.sd <= st.sent, "{policy}: {s:?} {net:?}");
        assert!(s.sn > 0, "{policy}: {s:?}");
    }
    let moved = |p: SteeringKind| {
        outcomes
            .iter()
            .find(|(q, _)| *q == p)
            .and_then(|(_, o)| o.steering.moved_per_change())
            .unwrap()
    };
    // `flow-affinity` moves a flow only when its kthread leaves, and never
    // back. `indirection` is not compared: a parked kthread with packets
    // waiting on its siblings' rings is granted again within a pass or two
    // (congestion), so few packets see the smaller set, and its moves
    // (a quarter of the buckets, away and back, plus rebalancing) come out
    // near `rss-mod`'s on this harness (printed above; docs/results.md,
    // "Steering").
    let rss = moved(SteeringKind::RssMod);
    let affinity = moved(SteeringKind::FlowAffinity);
    assert!(
        affinity < rss,
        "flow-affinity moved {affinity:.1} flows per change, rss-mod {rss:.1}"
    );
    let table = |p: SteeringKind| {
        outcomes
            .iter()
            .find(|(q, _)| *q == p)
            .map(|(_, o)| o.steering.tb)
            .unwrap()
    };
    assert_eq!(table(SteeringKind::RssMod), 0);
    assert!(table(SteeringKind::FlowAffinity) > 0);
    assert!(table(SteeringKind::Indirection) > 0);
}
