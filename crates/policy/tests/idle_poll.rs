//! A kthread that polls while idle (docs/idle-poll.md) holds a core nobody
//! needs: the allocator hands it to any application that wants one — batch
//! too, guaranteed or not — before it preempts anyone busy, and never takes
//! a busy core for batch. The simulator and iokerneld run this same code.

use ginza_policy::alloc::{
    AppClass, AppSnap, CoreAllocator, Decision, KthreadSnap, QueueCounters, Shenango, Topology,
};

fn polling(core: usize) -> KthreadSnap {
    KthreadSnap {
        core: Some(core),
        last_core: Some(core),
        idle_polling: true,
        ..Default::default()
    }
}

fn busy(core: usize) -> KthreadSnap {
    KthreadSnap {
        idle_polling: false,
        ..polling(core)
    }
}

fn parked(last: Option<usize>) -> KthreadSnap {
    KthreadSnap {
        parked: true,
        last_core: last,
        ..Default::default()
    }
}

/// Work queued since before the previous pass: congested at the second.
fn backlog(mut k: KthreadSnap) -> KthreadSnap {
    k.counters = QueueCounters {
        rq_head: 0,
        rq_tail: 1,
        ..Default::default()
    };
    k
}

fn app(key: u64, class: AppClass, guaranteed: usize, kthreads: Vec<KthreadSnap>) -> AppSnap {
    AppSnap {
        key,
        class,
        guaranteed,
        max_cores: kthreads.len(),
        kthreads,
        next_timer: None,
        last_yielded_core: None,
        netstack: None,
        granted_lately: false,
    }
}

/// Two passes over the same snapshots (the second finds the congestion).
fn decide(cores: usize, apps: &[AppSnap]) -> Vec<Decision> {
    let topo = Topology::flat(cores);
    let mut alloc = Shenango::new(5_000, 7);
    let mut out = Vec::new();
    alloc.pass(0, &topo, apps, &mut out);
    out.clear();
    alloc.pass(5_000, &topo, apps, &mut out);
    out
}

#[test]
fn congested_batch_takes_the_core_a_latency_critical_kthread_polls_on() {
    for guaranteed in [0, 1] {
        let apps = [
            app(1, AppClass::LatencyCritical, guaranteed, vec![polling(0)]),
            app(2, AppClass::Batch, 0, vec![backlog(parked(None))]),
        ];
        assert_eq!(
            decide(1, &apps),
            vec![
                Decision::Preempt {
                    app: 0,
                    kthread: 0,
                    core: 0
                },
                Decision::Grant {
                    app: 1,
                    kthread: 0,
                    core: 0
                },
            ],
            "guaranteed {guaranteed}"
        );
    }
}

#[test]
fn batch_never_takes_a_busy_core() {
    let apps = [
        app(1, AppClass::LatencyCritical, 0, vec![busy(0)]),
        app(2, AppClass::Batch, 0, vec![backlog(parked(None))]),
    ];
    assert!(decide(1, &apps).is_empty());
}

#[test]
fn a_free_core_goes_first_and_nobody_is_preempted() {
    let apps = [
        app(1, AppClass::LatencyCritical, 0, vec![polling(0)]),
        app(2, AppClass::Batch, 0, vec![backlog(parked(None))]),
    ];
    assert_eq!(
        decide(2, &apps),
        vec![Decision::Grant {
            app: 1,
            kthread: 0,
            core: 1
        }]
    );
}

#[test]
fn a_latency_critical_app_takes_a_polled_core_before_preempting_a_busy_one() {
    // App 0 polls on core 1; app 1 (bursting) is busy on core 0, the core
    // app 2 last gave up and would otherwise take back by preemption.
    let mut wanting = app(
        3,
        AppClass::LatencyCritical,
        0,
        vec![backlog(parked(Some(0)))],
    );
    wanting.last_yielded_core = Some(0);
    let apps = [
        app(1, AppClass::LatencyCritical, 0, vec![polling(1)]),
        app(2, AppClass::LatencyCritical, 0, vec![busy(0)]),
        wanting,
    ];
    for _ in 0..20 {
        assert_eq!(
            decide(2, &apps),
            vec![
                Decision::Preempt {
                    app: 0,
                    kthread: 0,
                    core: 1
                },
                Decision::Grant {
                    app: 2,
                    kthread: 0,
                    core: 1
                },
            ]
        );
    }
}

#[test]
fn an_application_never_takes_its_own_polled_core() {
    // Kthread 0 polls; kthread 1 holds queued work from before it parked
    // (a preempted uthread): the poller steals it, so nothing to decide on
    // the one core.
    let apps = [app(
        1,
        AppClass::LatencyCritical,
        0,
        vec![polling(0), backlog(parked(Some(0)))],
    )];
    assert!(decide(1, &apps).is_empty());
}
