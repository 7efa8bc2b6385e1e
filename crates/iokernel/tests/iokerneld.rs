//! iokerneld end to end: an in-process iokerneld on a thread, clients in the
//! test (and in a child process), real memfd regions, eventfds and a real
//! SOCK_SEQPACKET socket.
//!
//! Tests that start iokerneld hold `LOCK` (its loop spins while anything
//! holds a core), and run it with `idle_sleep` so that it sleeps when idle.

use std::io::{BufRead, BufReader};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ginza_iokernel::{Action, Config, Iokerneld, LinuxActuator, RecordingActuator};
use ginza_proto::client::{self, ClientError};
use ginza_proto::messages::{Envelope, Latency, Request, Response};
use ginza_proto::{Class, Registration, StatsReport, PROTOCOL_VERSION};
use ginza_shm::{PreemptReason, RawMsg, Region, RegionConfig, ToIokernel, ToKthread};

mod common;
use common::{lock, test_cores, Daemon};

fn reg(name: &str, class: Class, guaranteed: u32, max_cores: u32, kthreads: u32) -> Registration {
    Registration {
        name: name.into(),
        class,
        guaranteed,
        max_cores,
        kthreads,
        net: None,
        steering: None,
        dispatch: None,
        wake_page: false,
        bell: false,
    }
}

/// A runtime's side: region and eventfds.
struct App {
    region: Region,
    efds: Vec<OwnedFd>,
}

fn app(kthreads: u32) -> App {
    App {
        region: Region::create("test-app", &RegionConfig::new(kthreads)).unwrap(),
        efds: (0..kthreads)
            .map(|_| ginza_sys::eventfd::new().unwrap())
            .collect(),
    }
}

fn register(d: &Daemon, a: &App, r: &Registration) -> Result<client::Connection, ClientError> {
    client::register_region(&d.socket, r, &a.region, &a.efds)
}

fn refused(r: Result<client::Connection, ClientError>) -> String {
    match r {
        Err(ClientError::Refused { reason }) => reason,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn app_named<'a>(s: &'a StatsReport, name: &str) -> Option<&'a ginza_proto::AppStats> {
    s.apps.iter().find(|a| a.name == name)
}

#[test]
fn registration_accepted_end_to_end_and_disconnect_reclaims() {
    let _g = lock();
    let rec = RecordingActuator::new();
    let d = Daemon::start(rec.clone());
    let a = app(2);
    let conn = register(&d, &a, &reg("web", Class::LatencyCritical, 1, 2, 2)).unwrap();
    assert!(conn.app_id() >= 1);
    let s = d.stats();
    let st = app_named(&s, "web").expect("registered app in stats");
    assert_eq!(st.app_id, conn.app_id());
    assert_eq!(st.pid, std::process::id() as i32);
    assert_eq!((st.guaranteed, st.max_cores, st.kthreads), (1, 2, 2));
    assert_eq!(st.class, Class::LatencyCritical);
    assert_eq!((st.cores_now, st.parked_kthreads), (0, 2));
    assert_eq!(s.policy, "shenango");

    // Same name twice: refused.
    let b = app(1);
    let why = refused(register(&d, &b, &reg("web", Class::Batch, 0, 1, 1)));
    assert!(why.contains("already registered"), "{why}");

    let id = conn.app_id();
    drop(conn);
    let s = d.wait_for("web removed", |s| s.apps.is_empty());
    let r = s.recent_removals.last().unwrap();
    assert_eq!(
        (r.app_id, r.name.as_str(), r.reason.as_str()),
        (id, "web", "connection closed")
    );
    assert!(rec.actions().contains(&Action::Removed {
        app_id: id,
        app: "web".into()
    }));
    // The name and the guarantee are free again.
    let conn = register(
        &d,
        &a_fresh(2),
        &reg("web", Class::LatencyCritical, 1, 2, 2),
    )
    .unwrap();
    assert!(conn.app_id() > id);
    assert!(!conn.closed_by_iokerneld());
    let fin = d.finish();
    assert_eq!(fin.apps.len(), 1);
    // iokerneld stopped: the runtime can tell.
    assert!(conn.closed_by_iokerneld());
    assert!(fin.registrations_refused >= 1);
}

fn a_fresh(k: u32) -> App {
    app(k)
}

#[test]
fn version_mismatch_is_refused_with_its_message() {
    let _g = lock();
    let d = Daemon::start(RecordingActuator::new());
    let a = app(1);
    let env = Envelope {
        protocol: PROTOCOL_VERSION + 98,
        request: Request::Register(reg("old", Class::Batch, 0, 1, 1)),
    };
    let mut fds = vec![a.region.fd().unwrap()];
    fds.extend(a.efds.iter().map(|e| e.as_fd()));
    let e = client::register_with(&d.socket, &env, &fds).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains(
            &format!("iokerneld refused the registration: protocol version {}, iokerneld speaks {PROTOCOL_VERSION}", PROTOCOL_VERSION + 98)
        ),
        "{text}"
    );
    assert!(d.stats().apps.is_empty());
}

#[test]
fn oversubscribed_guarantees_are_refused() {
    let _g = lock();
    let d = Daemon::start(RecordingActuator::new());
    let n = test_cores().len() as u32;
    let a = app(n);
    let ca = register(&d, &a, &reg("a", Class::LatencyCritical, n, n, n)).unwrap();
    let b = app(1);
    let why = refused(register(&d, &b, &reg("b", Class::Batch, 1, 1, 1)));
    assert!(why.contains("guaranteed cores oversubscribed"), "{why}");
    assert!(
        why.contains(&format!("{n} of the {n} managed cores")),
        "{why}"
    );
    // Guarantee 0 still fits.
    let cb = register(&d, &b, &reg("b", Class::Batch, 0, 1, 1)).unwrap();
    drop(cb);
    drop(ca);
    d.wait_for("both gone", |s| s.apps.is_empty());
    register(&d, &app(1), &reg("b", Class::Batch, 1, 1, 1)).unwrap();
}

#[test]
fn malformed_requests_are_refused_and_iokerneld_survives() {
    let _g = lock();
    let d = Daemon::start(RecordingActuator::new());
    let ask = |bytes: &[u8]| -> String {
        let s = client::connect(&d.socket).unwrap();
        client::send_raw(s.as_fd(), bytes, &[]).unwrap();
        match client::recv_response(s.as_fd()).unwrap() {
            Response::Refused { reason } => reason,
            r => panic!("expected a refusal, got {r:?}"),
        }
    };
    assert!(ask(b"\x00\xffgarbage").contains("not JSON"));
    assert!(ask(br#"{"protocol": 2, "request": {"register": {"name": "x"#).contains("not JSON"));
    assert!(ask(br#"{"request": "stats"}"#).contains("no numeric `protocol`"));
    let why = ask(br#"{"protocol": 2, "request": {"register": {"name": "x", "class": "batch"}}}"#);
    assert!(
        why.contains("malformed request") && why.contains("guaranteed"),
        "{why}"
    );
    assert!(ask(&vec![b'{'; 10_000]).contains("longer than 4096 bytes"));
    // A registration without any descriptor.
    let env = Envelope {
        protocol: PROTOCOL_VERSION,
        request: Request::Register(reg("nofd", Class::Batch, 0, 1, 1)),
    };
    assert!(ask(&serde_json::to_vec(&env).unwrap()).contains("expected 2 descriptors"));
    // Connect and hang up without a word; connect and send an empty message.
    drop(client::connect(&d.socket).unwrap());
    let s = client::connect(&d.socket).unwrap();
    client::send_raw(s.as_fd(), b"", &[]).unwrap();
    drop(s);
    // Bad field values.
    let a = app(2);
    assert!(refused(register(&d, &a, &reg("", Class::Batch, 0, 1, 2))).contains("name"));
    assert!(refused(register(&d, &a, &reg("a b", Class::Batch, 0, 1, 2))).contains("may only use"));
    assert!(refused(register(&d, &a, &reg("x", Class::Batch, 2, 1, 2)))
        .contains("guaranteed (2) <= max_cores (1)"));
    assert!(refused(register(&d, &a, &reg("x", Class::Batch, 0, 3, 2)))
        .contains("max_cores (3) <= kthreads (2)"));
    assert!(refused(register(&d, &a, &reg("x", Class::Batch, 0, 0, 2))).contains("max_cores >= 1"));
    // Random bytes (some JSON-looking), some with descriptors attached:
    // every one refused, none accepted, iokerneld unharmed.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..200 {
        let len = (next() % 300) as usize;
        let mut msg: Vec<u8> = if i % 2 == 0 {
            br#"{"protocol": 2, "request": {"register": {"#.to_vec()
        } else {
            Vec::new()
        };
        msg.extend((0..len).map(|_| (next() % 256) as u8));
        let s = client::connect(&d.socket).unwrap();
        let fds: Vec<_> = if i % 3 == 0 {
            vec![a.region.fd().unwrap(), a.efds[0].as_fd()]
        } else {
            Vec::new()
        };
        client::send_raw(s.as_fd(), &msg, &fds).unwrap();
        match client::recv_response(s.as_fd()) {
            Ok(Response::Refused { .. }) | Err(ClientError::Closed) => {}
            other => panic!("random request {i} got {other:?}"),
        }
    }
    // Still serving.
    let c = register(&d, &a, &reg("fine", Class::Batch, 0, 2, 2)).unwrap();
    let s = d.stats();
    assert_eq!(s.apps.len(), 1);
    assert!(s.registrations_refused >= 10, "{}", s.registrations_refused);
    drop(c);
}

#[test]
fn wrong_descriptors_are_refused() {
    let _g = lock();
    let d = Daemon::start(RecordingActuator::new());
    let a = app(2);
    let r2 = reg("x", Class::Batch, 0, 2, 2);
    // One eventfd for two kthreads.
    let why = refused(client::register(
        &d.socket,
        &r2,
        a.region.fd().unwrap(),
        &a.efds[..1],
    ));
    assert!(
        why.contains("expected 3 descriptors (the region memfd and 2 eventfds), got 2"),
        "{why}"
    );
    // Three eventfds for two kthreads.
    let extra = [
        ginza_sys::eventfd::new().unwrap(),
        ginza_sys::eventfd::new().unwrap(),
        ginza_sys::eventfd::new().unwrap(),
    ];
    let why = refused(client::register(
        &d.socket,
        &r2,
        a.region.fd().unwrap(),
        &extra,
    ));
    assert!(why.contains("got 4"), "{why}");
    // Something that is not an eventfd.
    let null = std::fs::File::open("/dev/null").unwrap();
    let fds = [a.efds[0].as_fd(), null.as_fd()];
    let why = refused(client::register(
        &d.socket,
        &r2,
        a.region.fd().unwrap(),
        &fds,
    ));
    assert!(
        why.contains("kthread 1's eventfd) is not an eventfd but /dev/null"),
        "{why}"
    );
    // An eventfd where the memfd should be.
    let why = refused(client::register(&d.socket, &r2, a.efds[0].as_fd(), &a.efds));
    assert!(why.contains("descriptor 0 (the region memfd)"), "{why}");
    // The region has 2 kthreads, the registration says 1.
    let why = refused(client::register(
        &d.socket,
        &reg("x", Class::Batch, 0, 1, 1),
        a.region.fd().unwrap(),
        &a.efds[..1],
    ));
    assert!(
        why.contains("the region has 2 kthreads, the registration says 1"),
        "{why}"
    );
    // A memfd whose header is broken.
    let bad = app(2);
    corrupt_header(&bad.region);
    let why = refused(register(&d, &bad, &r2));
    assert!(why.contains("bad magic"), "{why}");
    assert!(d.stats().apps.is_empty());
}

/// Maps a region's memfd a second time, as a hostile runtime would.
struct Alias {
    base: *mut u8,
    len: usize,
}

impl Alias {
    fn new(region: &Region) -> Alias {
        let len = region.len();
        // SAFETY: maps the memfd shared, read-write, at a fresh address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                region.fd().unwrap().as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        Alias {
            base: p.cast(),
            len,
        }
    }

    fn write_u32(&self, off: u64, v: u32) {
        assert!(off as usize + 4 <= self.len);
        // SAFETY: inside the mapping, 4-aligned (callers pass ring index
        // offsets); the region's memory is shared and accessed atomically
        // by its users, a plain volatile store is the hostile write.
        unsafe { std::ptr::write_volatile(self.base.add(off as usize).cast::<u32>(), v) }
    }
}

impl Drop for Alias {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

fn corrupt_header(region: &Region) {
    let a = Alias::new(region);
    a.write_u32(0, 0xdead_beef);
}

#[test]
fn corrupt_regions_are_disconnected_others_unaffected() {
    let _g = lock();
    let d = Daemon::start(RecordingActuator::new());
    let good = app(1);
    let _cg = register(&d, &good, &reg("good", Class::Batch, 0, 1, 1)).unwrap();

    // An undecodable command.
    let a = app(1);
    let _ca = register(&d, &a, &reg("badtag", Class::Batch, 0, 1, 1)).unwrap();
    let mut ra = a.region.runtime_end(0).unwrap();
    ra.to_iokernel
        .raw()
        .push(RawMsg {
            tag: 77,
            arg32: 0,
            arg64: 0,
        })
        .unwrap();
    let s = d.wait_for("badtag removed", |s| app_named(s, "badtag").is_none());
    let r = s
        .recent_removals
        .iter()
        .find(|r| r.name == "badtag")
        .unwrap();
    assert!(
        r.reason.contains(
            "kthread 0 sent an undecodable command: unknown kthread→iokerneld message tag 77"
        ),
        "{}",
        r.reason
    );

    // A ring whose producer index runs past the consumer by more than the
    // capacity.
    let b = app(2);
    let _cb = register(&d, &b, &reg("badring", Class::Batch, 0, 2, 2)).unwrap();
    let alias = Alias::new(&b.region);
    let up = b.region.layout().up_ring_offset(1);
    alias.write_u32(up + 64, 1_000_000); // tail, on the second cache line
    let s = d.wait_for("badring removed", |s| app_named(s, "badring").is_none());
    let r = s
        .recent_removals
        .iter()
        .find(|r| r.name == "badring")
        .unwrap();
    assert!(
        r.reason.contains("kthread 1's command ring is corrupt"),
        "{}",
        r.reason
    );

    // A tid that is not one of its threads (pid 1's main thread).
    let c = app(1);
    let _cc = register(&d, &c, &reg("badtid", Class::Batch, 0, 1, 1)).unwrap();
    let mut rc = c.region.runtime_end(0).unwrap();
    rc.to_iokernel.send(ToIokernel::Started { tid: 1 }).unwrap();
    let s = d.wait_for("badtid removed", |s| app_named(s, "badtid").is_none());
    let r = s
        .recent_removals
        .iter()
        .find(|r| r.name == "badtid")
        .unwrap();
    assert!(
        r.reason
            .contains("reported tid 1, which is not a thread of pid"),
        "{}",
        r.reason
    );

    // Its own tid is fine; the good app never noticed anything.
    let mut rg = good.region.runtime_end(0).unwrap();
    rg.to_iokernel
        .send(ToIokernel::Started {
            tid: ginza_sys::process::gettid() as u32,
        })
        .unwrap();
    let s = d.wait_passes(10);
    assert_eq!(s.apps.len(), 1);
    assert_eq!(s.apps[0].name, "good");
    assert_eq!(s.apps_disconnected, 3);
}

#[test]
fn congestion_is_granted_and_parking_gives_cores_back() {
    let _g = lock();
    let rec = RecordingActuator::new();
    let d = Daemon::start(rec.clone());
    let cores = test_cores();
    let n = cores.len();
    let a = app(2);
    let conn = register(&d, &a, &reg("lc", Class::LatencyCritical, 0, 2, 2)).unwrap();
    let id = conn.app_id();
    let mut k0 = a.region.runtime_end(0).unwrap();
    let mut k1 = a.region.runtime_end(1).unwrap();
    // Three uthreads queued on kthread 0 and never taken: with no core, a
    // grant at once; then congestion at every pass.
    k0.line.set_rq_tail(3);
    let s = d.wait_for("a grant", |s| {
        app_named(s, "lc").is_some_and(|a| a.cores_now as usize == n)
    });
    let st = app_named(&s, "lc").unwrap();
    assert!(st.congestion_events >= 1);
    assert_eq!(st.grants as usize, n);
    let acts = rec.actions();
    assert_eq!(
        acts[0],
        Action::Grant {
            app_id: id,
            app: "lc".into(),
            kthread: 0,
            cpu: cores[0]
        }
    );
    if n > 1 {
        // The second core went to the parked kthread, by congestion.
        assert_eq!(
            acts[1],
            Action::Grant {
                app_id: id,
                app: "lc".into(),
                kthread: 1,
                cpu: cores[1]
            }
        );
        assert_eq!(
            k1.from_iokernel
                .recv()
                .unwrap()
                .and_then(ToKthread::wake_core),
            Some(cores[1] as u32)
        );
    }
    assert_eq!(
        k0.from_iokernel
            .recv()
            .unwrap()
            .and_then(ToKthread::wake_core),
        Some(cores[0] as u32)
    );
    // Congestion keeps being seen while the items wait.
    let before = st.congestion_events;
    d.wait_for("more congestion", |s| {
        app_named(s, "lc").unwrap().congestion_events > before + 2
    });

    // The runtime drains its queue and parks both kthreads.
    k0.line.set_rq_head(3);
    k0.to_iokernel
        .send(ToIokernel::Parked {
            next_deadline_ns: None,
            grant: ginza_shm::UNNUMBERED_GRANT,
        })
        .unwrap();
    k1.to_iokernel
        .send(ToIokernel::Parked {
            next_deadline_ns: None,
            grant: ginza_shm::UNNUMBERED_GRANT,
        })
        .unwrap();
    let s = d.wait_for("cores given back", |s| {
        let a = app_named(s, "lc").unwrap();
        a.cores_now == 0 && a.parked_kthreads == 2
    });
    assert_eq!(app_named(&s, "lc").unwrap().preemptions, 0);
    drop(conn);
}

/// A kthread granted a core before it reported its tid (the grant had
/// nothing to pin) is pinned to that core's CPU when its `Started` comes;
/// a kthread that starts holding no core is not pinned (its next grant
/// pins it).
#[test]
fn a_kthread_granted_before_its_start_is_pinned_when_it_starts() {
    let _g = lock();
    let rec = RecordingActuator::new();
    let d = Daemon::start(rec.clone());
    let a = app(2);
    let _conn = register(&d, &a, &reg("early", Class::LatencyCritical, 0, 1, 2)).unwrap();
    let mut k0 = a.region.runtime_end(0).unwrap();
    let mut k1 = a.region.runtime_end(1).unwrap();
    k0.line.set_rq_tail(1);
    d.wait_for("kthread 0 granted", |s| {
        app_named(s, "early").is_some_and(|a| a.cores_now == 1)
    });
    let granted = rec
        .actions()
        .iter()
        .find_map(|act| match act {
            Action::Grant {
                app,
                kthread: 0,
                cpu,
                ..
            } if app == "early" => Some(*cpu),
            _ => None,
        })
        .expect("a grant recorded");
    let pins = |rec: &RecordingActuator| -> Vec<(usize, usize)> {
        rec.actions()
            .iter()
            .filter_map(|act| match act {
                Action::Pin { kthread, cpu, .. } => Some((*kthread, *cpu)),
                _ => None,
            })
            .collect()
    };
    assert!(pins(&rec).is_empty(), "nothing to pin before a tid");

    let tid = ginza_sys::process::gettid() as u32;
    for end in [&mut k0, &mut k1] {
        end.to_iokernel.send(ToIokernel::Started { tid }).unwrap();
    }
    let t0 = Instant::now();
    while pins(&rec).is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "kthread 0 never pinned after its start: {:?}",
            rec.actions()
        );
        d.wait_passes(1);
    }
    // Both `Started` read by now (one drain takes every ring's messages).
    d.wait_passes(2);
    assert_eq!(
        pins(&rec),
        vec![(0, granted)],
        "only the kthread holding a core, to its CPU"
    );
}

#[test]
fn grants_are_timed_reallocations_counted_and_reset_stats_starts_a_window() {
    let _g = lock();
    let d = Daemon::start(RecordingActuator::new());
    let n = test_cores().len() as u64;
    let a = app(2);
    let conn = register(&d, &a, &reg("lc", Class::LatencyCritical, 0, 2, 2)).unwrap();
    let mut k0 = a.region.runtime_end(0).unwrap();
    let mut k1 = a.region.runtime_end(1).unwrap();
    k0.line.set_rq_tail(3);
    let s = d.wait_for("lc holds every core", |s| {
        app_named(s, "lc").unwrap().cores_now as u64 == n
    });
    let al = &s.alloc;
    assert_eq!(al.grants, n);
    assert_eq!(al.grant_cost.count, al.grants, "{al:#?}");
    assert!(al.grant_cost.p50_ns > 0, "{al:#?}");
    assert!(al.grant_cost.mean_ns > 0 && al.grant_cost.p50_ns <= al.grant_cost.max_ns);
    // The first grant of a core moves it from no application.
    assert_eq!(al.reallocations, 0);
    assert_eq!((al.preemptions, al.handovers, al.handover.count), (0, 0, 0));
    // Every pass is timed, in one histogram or the other.
    assert!(al.pass_cost_with_decisions.count >= 1);
    assert!(al.pass_cost_with_decisions.p50_ns > 0);
    assert_eq!(
        al.pass_cost_with_decisions.count + al.pass_cost_idle.count,
        s.passes
    );
    // Not reset yet: the window is iokerneld's life.
    assert_eq!(
        (al.window_ns, al.window_cpu_ns),
        (s.uptime_ns, s.loop_cpu_ns)
    );

    // lc parks; another application gets the cores lc held.
    k0.line.set_rq_head(3);
    for k in [&mut k0, &mut k1] {
        k.to_iokernel
            .send(ToIokernel::Parked {
                next_deadline_ns: None,
                grant: ginza_shm::UNNUMBERED_GRANT,
            })
            .unwrap();
    }
    d.wait_for("lc parked", |s| app_named(s, "lc").unwrap().cores_now == 0);
    let b = app(2);
    let cb = register(&d, &b, &reg("other", Class::Batch, 0, 2, 2)).unwrap();
    b.region.line(0).unwrap().set_rq_tail(1);
    let s = d.wait_for("other holds every core", |s| {
        app_named(s, "other").unwrap().cores_now as u64 == n
    });
    assert_eq!(s.alloc.grants, 2 * n);
    assert_eq!(s.alloc.reallocations, n);
    assert_eq!(s.alloc.grant_cost.count, 2 * n);

    // The reset answers with the window it ends, then counts from zero.
    let ended = client::reset_stats(&d.socket).unwrap();
    assert_eq!(ended.alloc.grants, 2 * n);
    let s = d.stats();
    let al = &s.alloc;
    assert_eq!(
        (
            al.grants,
            al.preemptions,
            al.reallocations,
            al.handovers,
            al.handovers_abandoned
        ),
        (0, 0, 0, 0, 0)
    );
    assert_eq!(al.grant_cost, Latency::default());
    assert_eq!(al.handover, Latency::default());
    assert!(al.window_ns < s.uptime_ns && al.window_cpu_ns < s.loop_cpu_ns);
    assert!(al.pass_cost_with_decisions.count + al.pass_cost_idle.count < s.passes);
    // Per-application totals are not the window's.
    assert_eq!(app_named(&s, "lc").unwrap().grants, n);

    // The new window counts: other leaves, lc gets work again.
    drop(cb);
    d.wait_for("other gone", |s| app_named(s, "other").is_none());
    k0.line.set_rq_tail(4);
    let s = d.wait_for("lc holds every core again", |s| {
        app_named(s, "lc").unwrap().cores_now as u64 == n
    });
    assert_eq!(
        (
            s.alloc.grants,
            s.alloc.reallocations,
            s.alloc.grant_cost.count
        ),
        (n, n, n)
    );

    // A registered application's own connection may reset too.
    let env = Envelope {
        protocol: PROTOCOL_VERSION,
        request: Request::ResetStats,
    };
    client::send_raw(conn.as_fd(), &serde_json::to_vec(&env).unwrap(), &[]).unwrap();
    match client::recv_response(conn.as_fd()).unwrap() {
        Response::Stats(ended) => assert_eq!(ended.alloc.grants, n),
        r => panic!("expected stats, got {r:?}"),
    }
    assert_eq!(d.stats().alloc.grant_cost.count, 0);
    k0.line.set_rq_head(4);
    drop(conn);
}

/// A batch application holds every managed core (bursting); a
/// latency-critical one gets work: one batch kthread is preempted and its
/// core is granted to the latency-critical one once it is given back.
/// Returns the victim's kthread index and the core.
struct Burst {
    b: App,
    a: App,
    _cb: client::Connection,
    _ca: client::Connection,
    victim: u32,
    cpu: usize,
}

fn burst(d: &Daemon, rec: &RecordingActuator) -> Burst {
    let n = test_cores().len() as u32;
    let b = app(n);
    let cb = register(d, &b, &reg("batch", Class::Batch, 0, n, n)).unwrap();
    b.region.line(0).unwrap().set_rq_tail(100);
    d.wait_for("batch holds every core", |s| {
        app_named(s, "batch").unwrap().cores_now == n
    });
    let a = app(1);
    let ca = register(d, &a, &reg("lc", Class::LatencyCritical, 0, 1, 1)).unwrap();
    a.region.line(0).unwrap().set_rq_tail(1);
    let s = d.wait_for("lc is assigned a core", |s| {
        app_named(s, "lc").unwrap().cores_now == 1
    });
    assert_eq!(app_named(&s, "batch").unwrap().cores_now, n - 1);
    assert_eq!(app_named(&s, "batch").unwrap().preemptions, 1);
    let acts = rec.actions();
    let p = acts
        .iter()
        .position(|a| matches!(a, Action::Preempt { app, .. } if app == "batch"))
        .expect("a preemption");
    let Action::Preempt {
        cpu,
        reason,
        kthread,
        ..
    } = acts[p].clone()
    else {
        unreachable!()
    };
    assert_eq!(reason, PreemptReason::CoreNeeded);
    // The victim was told on its line flag (and its command ring).
    assert!(b
        .region
        .line(kthread as u32)
        .unwrap()
        .flags()
        .contains(ginza_shm::LineFlags::PREEMPT_PENDING));
    Burst {
        b,
        a,
        _cb: cb,
        _ca: ca,
        victim: kthread as u32,
        cpu,
    }
}

fn lc_granted(rec: &RecordingActuator, cpu: usize) -> bool {
    rec.actions()
        .iter()
        .any(|a| matches!(a, Action::Grant { app, cpu: c, .. } if app == "lc" && *c == cpu))
}

#[test]
fn latency_critical_app_preempts_a_bursting_batch_app() {
    let _g = lock();
    let rec = RecordingActuator::new();
    // A deadline this test never reaches (the next test covers it).
    let d = Daemon::start_with(rec.clone(), |c| {
        c.preempt_deadline = Duration::from_secs(10)
    });
    let x = burst(&d, &rec);
    // The preemption happened before `burst` saw it in the stats.
    let preempted = Instant::now();
    // The core is not handed over while the victim still holds it: not
    // after many passes either.
    let s = d.wait_passes(50);
    assert!(!lc_granted(&rec, x.cpu), "{:?}", rec.actions());
    assert_eq!(app_named(&s, "lc").unwrap().cores_now, 1, "{s:#?}");
    let mut ra = x.a.region.runtime_end(0).unwrap();
    assert_eq!(ra.from_iokernel.recv().unwrap(), None);
    let mut rv = x.b.region.runtime_end(x.victim).unwrap();
    let mut got = Vec::new();
    while let Some(m) = rv.from_iokernel.recv().unwrap() {
        got.push(m);
    }
    assert_eq!(
        got.last(),
        Some(&ToKthread::Preempt {
            reason: PreemptReason::CoreNeeded
        })
    );
    // It yields: it is parked, and the core goes to lc.
    let waited = preempted.elapsed();
    rv.to_iokernel
        .send(ToIokernel::Yielded {
            next_deadline_ns: None,
            grant: ginza_shm::UNNUMBERED_GRANT,
        })
        .unwrap();
    d.wait_for("victim parked", |s| {
        app_named(s, "batch").unwrap().parked_kthreads == 1
    });
    let t0 = Instant::now();
    while !lc_granted(&rec, x.cpu) {
        assert!(t0.elapsed() < Duration::from_secs(5), "no hand-over");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        ra.from_iokernel
            .recv()
            .unwrap()
            .and_then(ToKthread::wake_core),
        Some(x.cpu as u32)
    );
    assert!(!x
        .b
        .region
        .line(x.victim)
        .unwrap()
        .flags()
        .contains(ginza_shm::LineFlags::PREEMPT_PENDING));
    let s = d.stats();
    assert_eq!(app_named(&s, "batch").unwrap().preempt_overdue, 0);
    // One hand-over, timed from the preemption to lc's wake: at least as
    // long as the victim took to yield.
    let al = &s.alloc;
    assert_eq!(
        (al.preemptions, al.handovers, al.handovers_abandoned),
        (1, 1, 0)
    );
    assert_eq!(al.handover.count, 1);
    assert!(
        al.handover.max_ns >= waited.as_nanos() as u64,
        "hand-over {} ns, waited {waited:?}",
        al.handover.max_ns
    );
    assert_eq!(al.handover.p50_ns, al.handover.max_ns);
    // Only lc's grant moved a core between applications; every grant,
    // the handed-over one included, has been carried out and timed.
    assert_eq!(al.reallocations, 1);
    assert_eq!(al.grant_cost.count, al.grants);
}

#[test]
fn a_kthread_that_ignores_preemption_is_evicted_and_its_core_handed_over() {
    let _g = lock();
    let rec = RecordingActuator::new();
    let d = Daemon::start_with(rec.clone(), |c| {
        c.preempt_deadline = Duration::from_millis(20)
    });
    let t0 = Instant::now();
    let x = burst(&d, &rec);
    // The victim never answers.
    let s = d.wait_for("the victim is overdue", |s| {
        app_named(s, "batch").unwrap().preempt_overdue == 1
    });
    assert!(t0.elapsed() >= Duration::from_millis(20));
    assert_eq!(app_named(&s, "lc").unwrap().cores_now, 1);
    let acts = rec.actions();
    let e = acts
        .iter()
        .position(|a| matches!(a, Action::Evict { app, .. } if app == "batch"))
        .expect("an eviction");
    assert!(
        matches!(&acts[e], Action::Evict { kthread, cpu, .. } if *kthread == x.victim as usize && *cpu == x.cpu)
    );
    let g = acts
        .iter()
        .position(|a| matches!(a, Action::Grant { app, cpu, .. } if app == "lc" && *cpu == x.cpu))
        .expect("the hand-over after the eviction");
    assert!(g > e);
    // Both applications still registered: only the kthread was punished.
    assert_eq!(s.apps.len(), 2);
    // The hand-over completed in the pass that evicted the victim, a
    // deadline after the preemption (counted from the pass's start, a few
    // µs before the signal: hence the margin).
    assert_eq!((s.alloc.handovers, s.alloc.handover.count), (1, 1));
    assert!(
        s.alloc.handover.max_ns >= 19_000_000,
        "{:?}",
        s.alloc.handover
    );
    // Still not given back: asked again a deadline later, so that a signal
    // that went astray cannot leave it running without a core for good.
    ginza_iokernel::testing::wait_for("the evicted victim asked again", || {
        rec.actions()[e + 1..]
            .iter()
            .any(|a| matches!(a, Action::Preempt { app, kthread, .. } if app == "batch" && *kthread == x.victim as usize))
            .then_some(())
    });
}

#[test]
fn linux_actuator_grant_writes_the_eventfd() {
    let _g = lock();
    let d = Daemon::start(LinuxActuator::default());
    let a = app(1);
    let conn = register(&d, &a, &reg("real", Class::Batch, 0, 1, 1)).unwrap();
    let line = a.region.line(0).unwrap();
    line.set_rq_tail(1);
    let t0 = Instant::now();
    loop {
        if let Some(v) = ginza_sys::eventfd::read(a.efds[0].as_fd()).unwrap() {
            assert_eq!(v, 1);
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "eventfd never written"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let s = d.stats();
    assert_eq!(s.alloc.grant_cost.count, 1);
    assert!(s.alloc.grant_cost.p50_ns > 0);
    line.set_rq_head(1);
    drop(conn);
}

/// A thread of this process that plays a kthread's thread: it reports its
/// tid and, when asked, the CPUs it may run on or a new affinity.
struct FakeKthread {
    tid: i32,
    ask: std::sync::mpsc::Sender<Option<Vec<usize>>>,
    answer: std::sync::mpsc::Receiver<Vec<usize>>,
}

impl FakeKthread {
    fn spawn() -> FakeKthread {
        let (ask, asked) = std::sync::mpsc::channel::<Option<Vec<usize>>>();
        let (tell, answer) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            tell.send(vec![ginza_sys::process::gettid() as usize])
                .unwrap();
            // Ends when the test drops its sender.
            while let Ok(req) = asked.recv() {
                if let Some(cpus) = req {
                    ginza_sys::affinity::set_thread_affinity(0, &cpus).unwrap();
                }
                tell.send(ginza_sys::affinity::allowed_cpus().unwrap())
                    .unwrap();
            }
        });
        let tid = answer.recv().unwrap()[0] as i32;
        FakeKthread { tid, ask, answer }
    }

    /// Its allowed CPUs, after setting them to `set` if given.
    fn cpus(&self, set: Option<Vec<usize>>) -> Vec<usize> {
        self.ask.send(set).unwrap();
        self.answer.recv().unwrap()
    }
}

/// A kthread whose thread no longer exists (a SIGKILLed process whose
/// connection has not closed yet, a runtime that lost a thread): the first
/// call on it that says so (`ESRCH`, here the signal of its preemption)
/// removes its application, with the reason, and the core goes to the
/// application that wanted it. Before, iokerneld signalled it again once a
/// deadline, with a warning each time, for as long as the connection stayed
/// open (the soak in session 36: once a millisecond for minutes).
#[test]
fn an_application_whose_kthread_thread_is_gone_is_removed_at_its_preemption() {
    let _g = lock();
    let cpu = test_cores()[0];
    let d = Daemon::start_with(LinuxActuator::default(), |c| c.cores = vec![cpu]);
    let b = app(1);
    let _cb = register(&d, &b, &reg("gone", Class::Batch, 0, 1, 1)).unwrap();
    let mut kb = b.region.runtime_end(0).unwrap();
    let t = FakeKthread::spawn();
    let tid = t.tid;
    kb.to_iokernel
        .send(ToIokernel::Started { tid: tid as u32 })
        .unwrap();
    d.wait_passes(2);
    b.region.line(0).unwrap().set_rq_tail(100);
    assert_eq!(wait_eventfd(&b.efds[0], "the batch kthread's grant"), 1);
    assert_eq!(t.cpus(None), vec![cpu]);
    // Its thread ends; the process (this one) and its connection stay.
    drop(t);
    let task = format!("/proc/self/task/{tid}");
    ginza_iokernel::testing::wait_for("the kthread's thread to end", || {
        (!Path::new(&task).exists()).then_some(())
    });
    let a = app(1);
    let _ca = register(&d, &a, &reg("lc", Class::LatencyCritical, 0, 1, 1)).unwrap();
    a.region.line(0).unwrap().set_rq_tail(1);
    let s = d.wait_for("gone removed", |s| app_named(s, "gone").is_none());
    let r = s.recent_removals.iter().find(|r| r.name == "gone").unwrap();
    assert_eq!(
        r.reason,
        format!("kthread 0's thread (tid {tid}) no longer exists"),
        "{s:#?}"
    );
    assert_eq!(wait_eventfd(&a.efds[0], "lc's grant"), 1);
    d.wait_for("lc holds the core", |s| {
        app_named(s, "lc").is_some_and(|l| l.cores_now == 1)
    });
}

fn wait_eventfd(efd: &OwnedFd, what: &str) -> u64 {
    let t0 = Instant::now();
    loop {
        if let Some(v) = ginza_sys::eventfd::read(efd.as_fd()).unwrap() {
            return v;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "no {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_kthread_still_pinned_to_its_core_is_granted_without_pinning_it_again() {
    let _g = lock();
    let d = Daemon::start(LinuxActuator::default());
    let all = ginza_sys::affinity::allowed_cpus().unwrap();
    let cpu = test_cores()[0];
    let a = app(1);
    let conn = register(&d, &a, &reg("pinned", Class::Batch, 0, 1, 1)).unwrap();
    let mut k = a.region.runtime_end(0).unwrap();
    let t = FakeKthread::spawn();
    k.to_iokernel
        .send(ToIokernel::Started { tid: t.tid as u32 })
        .unwrap();
    // A pass that began before the `Started` and saw the work would grant
    // a kthread with no tid yet, which there is nothing to pin (seen once).
    d.wait_passes(2);
    let line = a.region.line(0).unwrap();
    line.set_rq_tail(1);
    assert_eq!(wait_eventfd(&a.efds[0], "first grant"), 1);
    // The first grant pins the thread.
    assert_eq!(t.cpus(None), vec![cpu]);
    line.set_rq_head(1);
    k.to_iokernel
        .send(ToIokernel::Parked {
            next_deadline_ns: None,
            grant: ginza_shm::UNNUMBERED_GRANT,
        })
        .unwrap();
    d.wait_for("parked", |s| app_named(s, "pinned").unwrap().cores_now == 0);
    // Widened behind iokerneld's back (a managed runtime never does this):
    // iokerneld still believes it pinned, so the next grant of the same CPU
    // makes no `sched_setaffinity` call and the widening shows.
    if all.len() > 1 {
        assert_eq!(t.cpus(Some(all.clone())), all);
    }
    line.set_rq_tail(2);
    assert_eq!(wait_eventfd(&a.efds[0], "second grant"), 1);
    assert_eq!(t.cpus(None), all);
    let s = d.stats();
    assert_eq!(app_named(&s, "pinned").unwrap().grants, 2);
    line.set_rq_head(2);
    drop(conn);
}

/// A kthread that sleeps on the wake page is granted only once iokerneld
/// has read its `Started`. The runtime registers as soon as its kthreads
/// have thread ids, which they take before their `begin_park` and
/// `Started`: a grant made in between is a `GRANTED` in the word that the
/// `begin_park` overwrites, and the page (unlike an eventfd) keeps no
/// wake. Then the kthread sleeps for good while iokerneld believes it holds
/// the core; preempted off it, it waits for a `Yielded` that never comes
/// and is never granted again (the hang of `ginza bench colocate`).
#[test]
fn a_kthread_on_the_wake_page_is_granted_only_after_its_started() {
    let _g = lock();
    let d = Daemon::start_with(LinuxActuator::default(), |c| {
        c.cores = vec![test_cores()[0]];
    });
    let a = app(1);
    let mut r = reg("early", Class::Batch, 0, 1, 1);
    r.wake_page = true;
    let mut conn = register(&d, &a, &r).unwrap();
    let (page, slot) = conn.take_wake_page().expect("iokerneld sends its page");
    let line = a.region.line(0).unwrap();
    // Work waits, the core is free, the kthread has not reported yet.
    line.set_rq_tail(1);
    let s = d.wait_passes(10);
    assert_eq!(
        app_named(&s, "early").unwrap().grants,
        0,
        "granted before its Started was read"
    );
    // The kthread begins its park, reports and goes to sleep on the page,
    // as `wait_for_first_grant` does.
    let word = line.wake();
    word.begin_park();
    let t = FakeKthread::spawn();
    let mut k = a.region.runtime_end(0).unwrap();
    k.to_iokernel
        .send(ToIokernel::Started { tid: t.tid as u32 })
        .unwrap();
    assert_eq!(word.before_sleep(), ginza_shm::BeforeSleep::Sleep);
    // Its grant is in the word, and its slot is bumped to end the sleep.
    let t0 = Instant::now();
    while !word.take_grant() {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the grant never reached the word: {word:?}, {:?}",
            app_named(&d.stats(), "early")
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(page.seen(slot), 1, "its slot bumped once");
    let s = d.stats();
    assert_eq!(app_named(&s, "early").unwrap().grants, 1);
    line.set_rq_head(1);
    drop(conn);
}

#[test]
fn a_hand_over_is_carried_out_when_the_victim_yields_not_at_the_next_pass() {
    let _g = lock();
    let rec = RecordingActuator::new();
    // Passes far apart: the hand-over must not wait for one.
    let d = Daemon::start_with(rec.clone(), |c| {
        c.interval = Duration::from_millis(400);
        c.preempt_deadline = Duration::from_secs(20);
    });
    let x = burst(&d, &rec);
    assert!(!lc_granted(&rec, x.cpu));
    // Just after a pass: the next one is an interval away.
    let s = d.wait_passes(1);
    let mut rv = x.b.region.runtime_end(x.victim).unwrap();
    rv.to_iokernel
        .send(ToIokernel::Yielded {
            next_deadline_ns: None,
            grant: ginza_shm::UNNUMBERED_GRANT,
        })
        .unwrap();
    let t0 = Instant::now();
    while !lc_granted(&rec, x.cpu) {
        assert!(t0.elapsed() < Duration::from_secs(5), "no hand-over");
        std::thread::sleep(Duration::from_micros(200));
    }
    let after = d.stats();
    assert_eq!(
        after.passes,
        s.passes,
        "the hand-over waited for a pass ({:?} after the victim yielded)",
        t0.elapsed()
    );
    assert_eq!(after.alloc.handovers, 1);
    assert_eq!(app_named(&after, "batch").unwrap().preempt_overdue, 0);
}

const CHILD_ENV: &str = "GINZA_IOK_TEST_CHILD_SOCKET";

/// Not a test by itself: the body of the child process of
/// `sigkill_of_a_registered_process_is_noticed` (does nothing otherwise).
#[test]
fn child_registers_and_waits() {
    let Some(socket) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let a = app(1);
    let conn = client::register_region(
        Path::new(&socket),
        &reg("child", Class::Batch, 0, 1, 1),
        &a.region,
        &a.efds,
    )
    .unwrap();
    // Straight to the process's stdout (libtest captures `println!`).
    use std::io::Write;
    let mut out = std::io::stdout();
    writeln!(out, "REGISTERED {}", conn.app_id()).unwrap();
    out.flush().unwrap();
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn sigkill_of_a_registered_process_is_noticed() {
    let _g = lock();
    let d = Daemon::start(RecordingActuator::new());
    /// Kills the child if the test fails half-way.
    struct Reap(std::process::Child);
    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_registers_and_waits",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &d.socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let mut child = Reap(child);
    let mut id = None;
    for line in out.lines() {
        let line = line.unwrap();
        // libtest prints "test name ... " on the same line first.
        if let Some((_, rest)) = line.split_once("REGISTERED ") {
            id = Some(rest.trim().parse::<u64>().unwrap());
            break;
        }
    }
    let id = id.expect("the child registered");
    let s = d.stats();
    let st = app_named(&s, "child").unwrap();
    assert_eq!(st.app_id, id);
    assert_eq!(st.pid, child.0.id() as i32);
    child.0.kill().unwrap(); // SIGKILL
    child.0.wait().unwrap();
    let s = d.wait_for("child removed", |s| app_named(s, "child").is_none());
    let r = s.recent_removals.last().unwrap();
    assert_eq!((r.app_id, r.reason.as_str()), (id, "connection closed"));
}

#[test]
fn a_second_iokerneld_on_the_same_socket_is_refused() {
    let _g = lock();
    let d = Daemon::start(RecordingActuator::new());
    let mut cfg = Config::new(test_cores());
    cfg.socket = d.socket.clone();
    let e = Iokerneld::bind(cfg, RecordingActuator::new())
        .err()
        .unwrap();
    assert!(e.to_string().contains("already listening"), "{e}");
    // The first one still answers.
    assert!(d.stats().apps.is_empty());
}

#[test]
fn an_expired_timer_of_a_parked_app_wakes_it() {
    let _g = lock();
    let rec = RecordingActuator::new();
    let d = Daemon::start(rec.clone());
    let a = app(1);
    let conn = register(&d, &a, &reg("sleepy", Class::Batch, 0, 1, 1)).unwrap();
    let mut k = a.region.runtime_end(0).unwrap();
    let t0 = Instant::now();
    let deadline = ginza_sys::clock::monotonic_ns() + 30_000_000;
    k.to_iokernel
        .send(ToIokernel::Parked {
            next_deadline_ns: Some(deadline),
            grant: ginza_shm::UNNUMBERED_GRANT,
        })
        .unwrap();
    d.wait_for("a grant at the deadline", |s| {
        app_named(s, "sleepy").unwrap().grants == 1
    });
    assert!(
        ginza_sys::clock::monotonic_ns() >= deadline,
        "granted before the deadline"
    );
    assert!(t0.elapsed() < Duration::from_secs(2));
    assert_eq!(
        k.from_iokernel
            .recv()
            .unwrap()
            .and_then(ToKthread::wake_core),
        Some(test_cores()[0] as u32)
    );
    k.to_iokernel
        .send(ToIokernel::Parked {
            next_deadline_ns: None,
            grant: ginza_shm::UNNUMBERED_GRANT,
        })
        .unwrap();
    d.wait_for("parked again", |s| {
        app_named(s, "sleepy").unwrap().cores_now == 0
    });
    drop(conn);
}

#[test]
fn idle_sleep_keeps_an_idle_iokerneld_off_the_cpu() {
    let _g = lock();
    let d = Daemon::start(RecordingActuator::new());
    let a = app(1);
    let _conn = register(&d, &a, &reg("idle", Class::Batch, 0, 1, 1)).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let s = d.stats();
    assert!(s.uptime_ns >= 300_000_000);
    assert!(
        s.loop_cpu_ns < 100_000_000,
        "idle iokerneld used {} ms of CPU in {} ms",
        s.loop_cpu_ns / 1_000_000,
        s.uptime_ns / 1_000_000
    );
}

#[test]
fn the_binary_runs_for_a_while_and_refuses_bad_configs() {
    let _g = lock();
    let bin = env!("CARGO_BIN_EXE_iokerneld");
    let n = 0; // one binary run per test process
    let dir = std::env::temp_dir().join(format!("ginza-iok-bin-{}-{n}", std::process::id()));
    let sock = dir.join("s.sock");
    let cores = ginza_sys::cpulist::format(&test_cores());
    let out = Command::new(bin)
        .args([
            "--cores",
            &cores,
            "--idle-sleep",
            "1ms",
            "--run-for",
            "100ms",
        ])
        .arg("--socket")
        .arg(&sock)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: StatsReport = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report.passes > 0);
    assert_eq!(report.managed_cores, test_cores());
    // The final summaries are printed too: every pass is timed.
    let al = &report.alloc;
    assert_eq!(
        al.pass_cost_idle.count + al.pass_cost_with_decisions.count,
        report.passes
    );
    assert!(al.pass_cost_idle.p50_ns > 0);
    assert!(!sock.exists(), "socket file removed at exit");

    let fail = |args: &[&str]| -> String {
        let out = Command::new(bin).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = fail(&["--cores", "99999"]);
    assert!(e.contains("core 99999 is unknown"), "{e}");
    let c0 = test_cores()[0].to_string();
    let e = fail(&["--cores", &c0, "--core", &c0]);
    assert!(e.contains("also a managed core"), "{e}");
    let e = fail(&["--cores", &c0, "--interval", "0us"]);
    assert!(e.contains("interval"), "{e}");
    let e = fail(&["--cores", &c0, "--interval", "5 fortnights"]);
    assert!(e.contains("unknown unit"), "{e}");
    let e = fail(&["--cores", &c0, "--min-residency", "61s"]);
    assert!(e.contains("min_residency"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A `SCHED_IDLE` batch kthread holds the only core when two
/// latency-critical applications get work between two passes: the first
/// is granted the core at once (an idle-class victim holds nobody off it,
/// docs/runtime.md). The second once preempted the first in the same
/// pass, before the first's wake went out, and iokerneld had to park the
/// first again silently rather than wait for a `Yielded` it would never
/// send (the netstack beside kv-server and batch in `ginza bench memcached
/// --systems ginza-protected`, docs/protected.md). Now a core granted in a
/// pass is not taken back in it (issue 35): the first runs, and the
/// second gets the core once the first parks.
#[test]
fn a_core_granted_in_a_pass_is_not_taken_back_in_it() {
    let _g = lock();
    let rec = RecordingActuator::new();
    let d = Daemon::start_with(rec.clone(), |c| {
        c.cores = vec![test_cores()[0]];
        // Long enough that both get their work between the same two passes.
        c.interval = Duration::from_millis(100);
        c.preempt_deadline = Duration::from_secs(10);
    });
    // The batch kthread's thread, under SCHED_IDLE like a runtime's.
    let (tell, tid) = std::sync::mpsc::channel();
    let (_keep, hold) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let idle = ginza_sys::sched_class::set_current_idle();
        tell.send(idle.map(|()| ginza_sys::process::gettid()))
            .unwrap();
        // Ends when the test drops `_keep`.
        let _ = hold.recv();
    });
    let Ok(tid) = tid.recv().unwrap() else {
        return ginza_iokernel::testing::skip("cannot put a thread under SCHED_IDLE");
    };
    let b = app(1);
    let _cb = register(&d, &b, &reg("batch", Class::Batch, 0, 1, 1)).unwrap();
    let mut kb = b.region.runtime_end(0).unwrap();
    kb.to_iokernel
        .send(ToIokernel::Started { tid: tid as u32 })
        .unwrap();
    b.region.line(0).unwrap().set_rq_tail(100);
    d.wait_for("batch holds the core", |s| {
        app_named(s, "batch").unwrap().cores_now == 1
    });
    let first = app(1);
    let _c1 = register(&d, &first, &reg("first", Class::LatencyCritical, 0, 1, 1)).unwrap();
    let second = app(1);
    let _c2 = register(&d, &second, &reg("second", Class::LatencyCritical, 0, 1, 1)).unwrap();
    d.wait_for("both registered", |s| s.apps.len() == 3);
    let l1 = first.region.line(0).unwrap();
    let l2 = second.region.line(0).unwrap();
    l1.set_rq_tail(1);
    l2.set_rq_tail(1);
    let granted = |name: &str| {
        rec.actions()
            .iter()
            .any(|a| matches!(a, Action::Grant { app, .. } if app == name))
    };
    let t0 = Instant::now();
    while !granted("first") {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "first, with work, was not woken: {:?}",
            rec.actions()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // Whether a pass came between the two stores or not, `first` is
    // granted first and keeps its grant; `second` has not run.
    assert!(!granted("second"), "{:?}", rec.actions());
    // `first` runs, drains its work and parks; `second` still has work.
    let mut k1 = first.region.runtime_end(0).unwrap();
    l1.set_rq_head(1);
    k1.to_iokernel
        .send(ToIokernel::Parked {
            next_deadline_ns: None,
            grant: ginza_shm::UNNUMBERED_GRANT,
        })
        .unwrap();
    let t0 = Instant::now();
    while !granted("second") {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "second, with work, never granted the core: {:?}\n{:#?}",
            rec.actions(),
            d.stats()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    l2.set_rq_head(1);
}

/// Issue 35: a kthread whose only reason to run is a timer (a protected
/// application whose netstack is gone, its main uthread polling a stop
/// flag every 10 ms) is granted a core still held by a preempted holder.
/// Before the fix a third latency-critical application with work took
/// that grant away before it ran ("back to parked, silently"), and the
/// timer went with the grant: nothing ever woke the kthread again. Now
/// the grant waiting for its hand-over is not taken, and the kthread runs
/// when the holder yields.
#[test]
fn a_grant_waiting_for_its_hand_over_is_not_taken_and_runs() {
    let _g = lock();
    let rec = RecordingActuator::new();
    let d = Daemon::start_with(rec.clone(), |c| {
        c.cores = vec![test_cores()[0]];
        // The holder gives its core back when the test says so.
        c.preempt_deadline = Duration::from_secs(30);
    });
    let granted = |name: &str| {
        rec.actions()
            .iter()
            .filter(|a| matches!(a, Action::Grant { app, .. } if app == name))
            .count()
    };
    let park = |k: &mut ginza_shm::RuntimeEnd, timer: Option<u64>| {
        k.to_iokernel
            .send(ToIokernel::Parked {
                next_deadline_ns: timer,
                grant: ginza_shm::UNNUMBERED_GRANT,
            })
            .unwrap();
    };
    let holder = app(1);
    let _ch = register(&d, &holder, &reg("holder", Class::LatencyCritical, 0, 1, 1)).unwrap();
    let lh = holder.region.line(0).unwrap();
    lh.set_rq_tail(100);
    d.wait_for("holder holds the core", |s| {
        app_named(s, "holder").unwrap().cores_now == 1
    });
    let other = app(1);
    let _co = register(&d, &other, &reg("other", Class::LatencyCritical, 0, 1, 1)).unwrap();
    let mut ko = other.region.runtime_end(0).unwrap();
    park(&mut ko, None);
    let sleepy = app(1);
    let _cs = register(&d, &sleepy, &reg("sleepy", Class::LatencyCritical, 0, 1, 1)).unwrap();
    let mut ks = sleepy.region.runtime_end(0).unwrap();
    park(&mut ks, Some(ginza_sys::clock::monotonic_ns() + 20_000_000));
    // Its timer is due: granted the holder's core, not woken until the
    // holder yields.
    d.wait_for("sleepy granted the holder's core for its timer", |s| {
        app_named(s, "sleepy").unwrap().cores_now == 1
            && app_named(s, "holder").unwrap().preemptions == 1
    });
    assert_eq!(granted("sleepy"), 0, "woken before the holder yielded");
    // Work for `other`: it does not take the core `sleepy` waits for,
    // however many passes go by.
    let lo = other.region.line(0).unwrap();
    lo.set_rq_tail(1);
    let s = d.wait_passes(200);
    assert_eq!(app_named(&s, "sleepy").unwrap().cores_now, 1, "{s:#?}");
    assert_eq!(app_named(&s, "other").unwrap().cores_now, 0, "{s:#?}");
    assert_eq!(app_named(&s, "sleepy").unwrap().grants, 1, "{s:#?}");
    // The holder yields: the core goes to `sleepy`.
    lh.set_rq_head(100);
    let mut kh = holder.region.runtime_end(0).unwrap();
    kh.to_iokernel
        .send(ToIokernel::Yielded {
            next_deadline_ns: None,
            grant: ginza_shm::UNNUMBERED_GRANT,
        })
        .unwrap();
    let t0 = Instant::now();
    while granted("sleepy") == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "sleepy, its timer due, was never woken: {:?}\n{:#?}",
            rec.actions(),
            d.stats()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(granted("other"), 0);
    assert_eq!(
        ks.from_iokernel
            .recv()
            .unwrap()
            .and_then(ToKthread::wake_core),
        Some(test_cores()[0] as u32)
    );
    // `sleepy` fires its timer and parks: `other`, waiting, gets the core.
    park(&mut ks, None);
    let t0 = Instant::now();
    while granted("other") == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "other, with work, never got the free core: {:?}",
            rec.actions()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    lo.set_rq_head(1);
}

/// A `SCHED_IDLE` batch kthread under `with(thread id)`, ending when the
/// returned sender is dropped; `None` if the class cannot be set here.
fn idle_class_thread() -> Option<(u32, std::sync::mpsc::Sender<()>)> {
    let (tell, tid) = std::sync::mpsc::channel();
    let (keep, hold) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let idle = ginza_sys::sched_class::set_current_idle();
        tell.send(idle.map(|()| ginza_sys::process::gettid()))
            .unwrap();
        let _ = hold.recv();
    });
    let tid = tid.recv().unwrap().ok()?;
    Some((tid as u32, keep))
}

/// Batch (one kthread under `SCHED_IDLE`) holding the one managed core,
/// then a latency-critical application with a request queued, asking for
/// it; `None` if a thread cannot be put under `SCHED_IDLE` here.
struct IdleVictimScene {
    b: App,
    lc: App,
    /// lc's registration (dropping it would make lc leave).
    _cl: client::Connection,
    /// lc's kthread's end (it reported `Started`).
    kl: ginza_shm::RuntimeEnd,
    /// The wake page as lc maps it, and lc's kthread's slot.
    lc_wake: (ginza_shm::WakePage, u32),
    _batch: (
        client::Connection,
        ginza_shm::RuntimeEnd,
        std::sync::mpsc::Sender<()>,
    ),
}

fn batch_then_lc(d: &Daemon) -> Option<IdleVictimScene> {
    let (tid, keep) = idle_class_thread()?;
    let b = app(1);
    // Both sleep on the wake page and answer its doorbells (as runtimes do).
    let on_page = |mut r: Registration| {
        r.wake_page = true;
        r
    };
    let cb = register(d, &b, &on_page(reg("batch", Class::Batch, 0, 1, 1))).unwrap();
    let mut kb = b.region.runtime_end(0).unwrap();
    kb.to_iokernel.send(ToIokernel::Started { tid }).unwrap();
    b.region.line(0).unwrap().set_rq_tail(100);
    d.wait_for("batch holds the core", |s| {
        app_named(s, "batch").unwrap().cores_now == 1
    });
    let lc = app(1);
    let mut cl = register(d, &lc, &on_page(reg("lc", Class::LatencyCritical, 0, 1, 1))).unwrap();
    let lc_wake = cl.take_wake_page().expect("iokerneld sends its wake page");
    // On the page it is granted only once it reported (this thread plays
    // it: the recording actuator pins nothing).
    let mut kl = lc.region.runtime_end(0).unwrap();
    let tid = ginza_sys::process::gettid() as u32;
    kl.to_iokernel.send(ToIokernel::Started { tid }).unwrap();
    lc.region.line(0).unwrap().set_rq_tail(1);
    Some(IdleVictimScene {
        b,
        lc,
        _cl: cl,
        kl,
        lc_wake,
        _batch: (cb, kb, keep),
    })
}

/// docs/runtime.md, "Preemptions withdrawn": a latency-critical kthread
/// takes the core of a `SCHED_IDLE` batch kthread and gives it back within
/// `idle_victim_grace`: the batch kthread is never signalled, keeps the
/// core (its preemption flag cleared), and the move back counts as a
/// reallocation and a withdrawal. Past the grace, the victim is signalled.
#[test]
fn a_preemption_of_an_idle_class_kthread_is_withdrawn_when_the_core_comes_back_first() {
    for grace in [Duration::from_secs(30), Duration::from_millis(1)] {
        let _g = lock();
        let rec = RecordingActuator::new();
        let d = Daemon::start_with(rec.clone(), |c| {
            c.cores = vec![test_cores()[0]];
            c.preempt_deadline = Duration::from_secs(10);
            c.idle_victim_grace = grace;
        });
        let Some(mut scene) = batch_then_lc(&d) else {
            return ginza_iokernel::testing::skip("cannot put a thread under SCHED_IDLE");
        };
        let (b, lc) = (&scene.b, &scene.lc);
        let line = lc.region.line(0).unwrap();
        d.wait_for("lc holds the core", |s| {
            app_named(s, "lc").unwrap().cores_now == 1
        });
        let batch_line = b.region.line(0).unwrap();
        assert!(
            batch_line
                .flags()
                .contains(ginza_shm::LineFlags::PREEMPT_PENDING),
            "batch is asked (by its queue line) to give the core back"
        );
        let signalled = || {
            rec.actions()
                .iter()
                .any(|a| matches!(a, Action::Preempt { app, .. } if app == "batch"))
        };
        if grace < Duration::from_millis(500) {
            // lc keeps the core past the grace: batch is signalled.
            let t0 = Instant::now();
            while !signalled() {
                assert!(
                    t0.elapsed() < Duration::from_secs(5),
                    "batch never signalled after its grace: {:?}",
                    rec.actions()
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            continue;
        }
        // lc serves its request and parks, well within the grace.
        line.set_rq_head(1);
        scene
            .kl
            .to_iokernel
            .send(ToIokernel::Parked {
                next_deadline_ns: None,
                grant: ginza_shm::UNNUMBERED_GRANT,
            })
            .unwrap();
        d.wait_for("batch keeps the core", |s| {
            app_named(s, "batch").unwrap().cores_now == 1 && s.alloc.preemptions_withdrawn == 1
        });
        assert!(!signalled(), "no signal to batch: {:?}", rec.actions());
        assert!(!batch_line
            .flags()
            .contains(ginza_shm::LineFlags::PREEMPT_PENDING));
        // Two moves: batch → lc, and back (the first grant of the core to
        // batch is not one).
        assert_eq!(d.stats().alloc.reallocations, 2);
        // Batch was never told to stop, so it gets no new grant.
        let batch_grants = rec
            .actions()
            .iter()
            .filter(|a| matches!(a, Action::Grant { app, .. } if app == "batch"))
            .count();
        assert_eq!(batch_grants, 1, "{:?}", rec.actions());
    }
}

/// docs/runtime.md, "Local wakes": with `local_wake_wait`, the wake of a
/// latency-critical kthread that sleeps on the wake page, onto the core of
/// a `SCHED_IDLE` batch kthread that maps it, is a doorbell in the batch
/// kthread's queue line naming lc's slot. Taken by the batch kthread, it
/// is counted as a local wake and iokerneld wakes nothing; left there,
/// iokerneld takes it after the wait and wakes the slot itself. Either way
/// lc's word is bumped exactly once and its eventfd is not written.
#[test]
fn a_local_wake_is_rung_on_the_idle_class_kthread_and_answered_once() {
    for batch_answers in [true, false] {
        let _g = lock();
        let rec = RecordingActuator::new();
        let d = Daemon::start_with(rec.clone(), |c| {
            c.cores = vec![test_cores()[0]];
            c.preempt_deadline = Duration::from_secs(10);
            c.idle_victim_grace = Duration::from_secs(30);
            c.local_wake_wait = Some(Duration::from_millis(if batch_answers { 5_000 } else { 2 }));
        });
        let Some(scene) = batch_then_lc(&d) else {
            return ginza_iokernel::testing::skip("cannot put a thread under SCHED_IDLE");
        };
        let (b, lc) = (&scene.b, &scene.lc);
        let (page, lc_slot) = &scene.lc_wake;
        let batch_line = b.region.line(0).unwrap();
        d.wait_for("lc holds the core", |s| {
            app_named(s, "lc").unwrap().cores_now == 1
        });
        if batch_answers {
            // The batch kthread's preemption point: it wakes the slot the
            // doorbell names.
            let t0 = Instant::now();
            let slot = loop {
                if let Some(slot) = batch_line.take_doorbell() {
                    break slot;
                }
                assert!(
                    t0.elapsed() < Duration::from_secs(5),
                    "no doorbell rung on batch"
                );
                std::thread::yield_now();
            };
            assert_eq!(slot, *lc_slot, "the doorbell names lc's slot");
            page.wake(slot).unwrap();
            d.wait_for("the local wake counted", |s| s.alloc.local_wakes == 1);
            assert_eq!(d.stats().alloc.local_wakes_by_iokernel, 0);
        } else {
            d.wait_for("iokerneld woke lc itself", |s| {
                s.alloc.local_wakes_by_iokernel == 1
            });
            assert!(!batch_line.doorbell_rung(), "iokerneld took the doorbell");
            assert_eq!(d.stats().alloc.local_wakes, 0);
        }
        assert_eq!(
            page.seen(*lc_slot),
            1,
            "lc's word bumped once, for its one grant"
        );
        assert_eq!(ginza_sys::eventfd::read(lc.efds[0].as_fd()).unwrap(), None);
    }
}

/// Each application that sleeps on the wake page gets slots of its own,
/// and the block of one that left is given again: more registrations than
/// there are blocks all get one, as long as few are registered at once.
#[test]
fn wake_page_blocks_are_owned_by_one_app_and_freed_when_it_leaves() {
    let _g = lock();
    let d = Daemon::start(RecordingActuator::new());
    let on_page = |name: &str, kthreads: u32| {
        let mut r = reg(name, Class::Batch, 0, 1, kthreads);
        r.wake_page = true;
        r
    };
    let a = app(3);
    let mut ca = register(&d, &a, &on_page("a", 3)).unwrap();
    let (_, first_a) = ca.take_wake_page().unwrap();
    let b = app(1);
    let mut cb = register(&d, &b, &on_page("b", 1)).unwrap();
    let (_, first_b) = cb.take_wake_page().unwrap();
    // Slots `first..first + n` of two applications.
    let apart = |(a, n): (u32, u32), (b, m): (u32, u32)| a + n <= b || b + m <= a;
    assert!(
        apart((first_a, 3), (first_b, 1)),
        "b's slot {first_b} is one of a's ({first_a}..{})",
        first_a + 3
    );
    // Without asking, no page (it sleeps on its eventfds).
    let c = app(1);
    let mut cc = register(&d, &c, &reg("c", Class::Batch, 0, 1, 1)).unwrap();
    assert!(cc.take_wake_page().is_none());
    drop(cc);
    for round in 0..(ginza_shm::WAKE_PAGE_BLOCKS + 20) {
        drop(ca);
        d.wait_for("a left", |s| app_named(s, "a").is_none());
        ca = register(&d, &a, &on_page("a", 3))
            .unwrap_or_else(|e| panic!("registration {round}: {e}"));
        let (_, first) = ca.take_wake_page().unwrap();
        assert!(
            apart((first, 3), (first_b, 1)),
            "round {round}: a took b's slot"
        );
    }
}
