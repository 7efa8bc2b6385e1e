//! The steering policies on crafted sequences (docs/design.md, "Packet steering").

use ginza_policy::alloc::KthreadSnap;
use ginza_policy::steer::{
    AppSteering, FlowAffinity, Indirection, Steered, Steering, SteeringKind, SteeringOptions,
    AFFINITY_WAYS,
};
use proptest::prelude::*;

const SETS: [[bool; 4]; 6] = [
    [true, true, true, false],
    [true, false, true, false],
    [true, false, true, true],
    [false, false, false, true],
    [true, true, true, true],
    [false, true, false, false],
];

fn steer_all(st: &mut AppSteering, flows: &[u64], now: u64) -> Vec<usize> {
    flows
        .iter()
        .map(|&h| match st.steer(h, now) {
            Steered::Active(k) => k,
            s => panic!("{s:?}"),
        })
        .collect()
}

/// Over every change of the active set, a flow whose kthread stays active
/// keeps it — except, if `newcomers_take_share`, for flows moved to a
/// kthread that just became active — and the policy counts exactly the
/// flows that moved.
fn affinity_holds(policy: Box<dyn Steering + Send>, flows: &[u64], newcomers_take_share: bool) {
    let mut st = AppSteering::new(policy, 4);
    let mut before: Vec<usize> = Vec::new();
    let mut moved = 0;
    let mut was_active = [false; 4];
    for (t, set) in SETS.into_iter().enumerate() {
        st.sync(set, t as u64);
        let now = steer_all(&mut st, flows, t as u64);
        for (i, &k) in now.iter().enumerate() {
            assert!(set[k], "flow {i} on inactive kthread {k}");
            if let Some(&was) = before.get(i) {
                if set[was] && k != was {
                    assert!(
                        newcomers_take_share && !was_active[k],
                        "flow {i} left active kthread {was} for {k} in {set:?}"
                    );
                }
                if k != was {
                    moved += 1;
                }
            }
        }
        // Steered again, nothing moves.
        assert_eq!(steer_all(&mut st, flows, t as u64), now);
        assert_eq!(st.flows_moved(), moved, "after {set:?}");
        before = now;
        was_active = set;
    }
    assert!(moved > 0);
}

#[test]
fn flow_affinity_keeps_flows_on_kthreads_that_stay_active() {
    let flows: Vec<u64> = (0..300).map(|i| i * 7919 + 1).collect();
    affinity_holds(Box::new(FlowAffinity::new(4096)), &flows, false);
}

#[test]
fn indirection_keeps_flows_on_kthreads_that_stay_active_but_for_a_newcomers_share() {
    // Flows 0..300 have distinct move-counter slots, so the count is exact.
    let flows: Vec<u64> = (0..300).collect();
    affinity_holds(Box::new(Indirection::new(512)), &flows, true);
}

#[test]
fn flow_affinity_assigns_new_flows_round_robin_and_later_packets_follow() {
    let mut fa = FlowAffinity::new(64);
    let active = [0, 2, 3];
    let first: Vec<usize> = (100..106).map(|h| fa.pick(h, &active, 0)).collect();
    assert_eq!(first, [0, 2, 3, 0, 2, 3]);
    let again: Vec<usize> = (100..106).map(|h| fa.pick(h, &active, 1)).collect();
    assert_eq!(again, first);
    let s = fa.stats();
    assert_eq!(
        (s.table_inserts, s.table_hits, s.table_evictions),
        (6, 6, 0)
    );
    // Kthread 2 loses its core: its flows take the next round-robin ones.
    let active = [0, 3];
    assert_eq!(fa.pick(101, &active, 2), 0); // round-robin position 6
    assert_eq!(fa.pick(104, &active, 2), 3);
    assert_eq!(fa.pick(101, &[0, 2, 3], 3), 0); // and stays there
    assert_eq!(fa.stats().flows_moved, 2);
}

#[test]
fn the_flow_table_stays_bounded_under_a_flood_and_counts_evictions() {
    let mut fa = FlowAffinity::new(64);
    assert_eq!(fa.capacity(), 64);
    let bytes = fa.stats().table_bytes;
    assert_eq!(bytes, 64 * 24);
    let active = [0, 1, 2];
    for (t, h) in (0..10_000u64)
        .map(|i| i.wrapping_mul(0x2545_F491_4F6C_DD1D))
        .enumerate()
    {
        let k = fa.pick(h, &active, t as u64);
        assert!(active.contains(&k));
    }
    let s = fa.stats();
    assert_eq!(s.table_inserts, 10_000);
    assert!(s.table_evictions >= 10_000 - 64, "{s:?}");
    assert_eq!(s.table_evictions, s.table_inserts - 64, "{s:?}"); // every set full
    assert_eq!(s.table_bytes, bytes);
    assert_eq!(fa.capacity(), 64);
}

#[test]
fn busy_flows_survive_a_flood_when_idle_ones_are_the_only_victims() {
    // One set: every flow competes for the same ways.
    let mut fa = FlowAffinity::new(AFFINITY_WAYS).min_idle(10);
    let active = [0, 1, 2, 3, 4];
    let busy: Vec<u64> = (0..AFFINITY_WAYS as u64).collect();
    let home: Vec<usize> = busy.iter().map(|&h| fa.pick(h, &active, 0)).collect();
    for t in 1..1000u64 {
        // A flood packet of a new flow, then the busy flows' packets.
        fa.pick(1_000_000 + t, &active, t);
        for (&h, &k) in busy.iter().zip(&home) {
            assert_eq!(fa.pick(h, &active, t), k);
        }
    }
    let s = fa.stats();
    assert_eq!(s.table_evictions, 0);
    assert_eq!(s.table_full, 999);
    // Once they go quiet, new flows evict them.
    fa.pick(7_000_000, &active, 2000);
    assert_eq!(fa.stats().table_evictions, 1);
}

#[test]
fn warm_up_round_robin_inserts_every_other_new_flow() {
    let mut fa = FlowAffinity::new(1024).warm_up_round_robin(100);
    for h in 0..50 {
        fa.pick(h, &[0, 1], 10);
    }
    assert_eq!(fa.stats().table_inserts, 25);
    for h in 50..100 {
        fa.pick(h, &[0, 1], 100); // warm
    }
    assert_eq!(fa.stats().table_inserts, 75);
}

#[test]
fn a_prepopulated_table_inserts_only_flows_that_leave_their_range() {
    let mut fa = FlowAffinity::new(1024).prepopulated(4);
    let all = [0, 1, 2, 3];
    let flows: Vec<u64> = (0..400).collect();
    let home: Vec<usize> = flows.iter().map(|&h| fa.pick(h, &all, 0)).collect();
    assert_eq!(fa.stats().table_inserts, 0);
    for k in all {
        let n = home.iter().filter(|&&h| h == k).count();
        assert!((50..150).contains(&n), "kthread {k}: {n} of 400 flows");
    }
    // Kthread 1 goes: only its flows get entries; the others stay home.
    let three = [0, 2, 3];
    let now: Vec<usize> = flows.iter().map(|&h| fa.pick(h, &three, 1)).collect();
    let leavers = home.iter().filter(|&&k| k == 1).count() as u64;
    assert_eq!(fa.stats().table_inserts, leavers);
    for (h, k) in home.iter().zip(&now) {
        if *h != 1 {
            assert_eq!(h, k);
        } else {
            assert_ne!(*k, 1);
        }
    }
}

#[test]
fn indirection_moves_only_the_buckets_that_must_move() {
    let mut ind = Indirection::new(512);
    let mut active = Vec::new();
    let owners = |ind: &Indirection| ind.owners().collect::<Vec<_>>();
    for k in 0..4 {
        active.push(k);
        let before = owners(&ind);
        ind.activated(k, &active, 0);
        let after = owners(&ind);
        for (b, a) in before.iter().zip(&after) {
            if b.is_some() && b != a {
                assert_eq!(*a, Some(k), "a bucket moved between old kthreads");
            }
        }
        for &j in &active {
            let n = after.iter().filter(|&&o| o == Some(j)).count();
            assert!(n.abs_diff(512 / active.len()) <= 1, "kthread {j}: {n}");
        }
    }
    assert_eq!(ind.stats().buckets_moved, 256 + 170 + 128);
    // Kthread 2 goes: only its buckets move, spread over the others.
    active.retain(|&k| k != 2);
    let before = owners(&ind);
    ind.deactivated(2, &active, 0);
    let after = owners(&ind);
    for (b, a) in before.iter().zip(&after) {
        if b != a {
            assert_eq!(*b, Some(2));
        }
    }
    for &j in &active {
        let n = after.iter().filter(|&&o| o == Some(j)).count();
        assert!(n.abs_diff(512 / 3) <= 1, "kthread {j}: {n}");
    }
}

#[test]
fn rebalance_moves_load_off_a_hot_kthread() {
    let mut st = AppSteering::new(Box::new(Indirection::new(64)), 2);
    st.sync([true, true], 0);
    let owner_of = |st: &mut AppSteering, h: u64| match st.steer(h, 0) {
        Steered::Active(k) => k,
        s => panic!("{s:?}"),
    };
    // Kthread 0's buckets get 100 packets each, kthread 1's one each.
    let mut load = [0u64; 2];
    let mut hot_buckets = Vec::new();
    for b in 0..64u64 {
        let k = owner_of(&mut st, b);
        let n = if k == 0 { 100 } else { 1 };
        for _ in 1..n {
            owner_of(&mut st, b);
        }
        load[k] += n;
        if k == 0 {
            hot_buckets.push(b);
        }
    }
    assert!(load[0] > 10 * load[1], "{load:?}");
    let snaps = vec![KthreadSnap::default(); 2];
    let at_start = st.stats().buckets_moved; // kthread 1's share
    assert_eq!(at_start, 32);
    st.rebalance(1, &snaps);
    let moved = st.stats().buckets_moved - at_start;
    assert!(moved > 0 && moved <= 8, "{moved}");
    // Buckets moved from 0 to 1 only; kthread 1's own stayed.
    let mut after = [0u64; 2];
    for b in 0..64u64 {
        let k = owner_of(&mut st, b);
        if !hot_buckets.contains(&b) {
            assert_eq!(k, 1);
        }
        after[k] += if hot_buckets.contains(&b) { 100 } else { 1 };
    }
    assert!(after[1] > load[1] + 700, "{load:?} -> {after:?}");
    assert!(after[0] < load[0], "{load:?} -> {after:?}");
    // Too few packets since (one per bucket) to look again.
    let before = st.stats().buckets_moved;
    st.rebalance(2, &snaps);
    assert_eq!(st.stats().buckets_moved, before);
    // Even load (20 buckets of each kthread, 10 packets each), enough
    // packets: a look moves nothing.
    let mut used = [0; 2];
    for b in 0..64u64 {
        let k = owner_of(&mut st, b);
        if used[k] < 20 {
            used[k] += 1;
            for _ in 0..10 {
                owner_of(&mut st, b);
            }
        }
    }
    assert_eq!(used, [20, 20]);
    st.rebalance(3, &snaps);
    assert_eq!(st.stats().buckets_moved, before);
}

#[test]
fn steering_kinds_parse_and_build() {
    for kind in SteeringKind::ALL {
        assert_eq!(kind.name().parse::<SteeringKind>(), Ok(kind));
        assert_eq!(SteeringKind::from_code(kind.code()), Some(kind));
        let policy = kind.build(4, &SteeringOptions::default());
        assert_eq!(policy.name(), kind.name());
    }
    assert_eq!(SteeringKind::default(), SteeringKind::RssMod);
    assert!("fifo".parse::<SteeringKind>().is_err());
    assert_eq!(SteeringKind::from_code(9), None);
    let fa = SteeringKind::FlowAffinity.build(4, &SteeringOptions::default());
    assert_eq!(fa.stats().table_bytes, 8192 * 24);
    let ind = SteeringKind::Indirection.build(4, &SteeringOptions::default());
    // Owner, home and packet count per bucket.
    assert_eq!(ind.stats().table_bytes, 512 * 12);
}

#[derive(Clone, Debug)]
enum Op {
    Set(Vec<bool>),
    Pick(u64),
    Rebalance,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        proptest::collection::vec(any::<bool>(), 6).prop_map(Op::Set),
        any::<u64>().prop_map(Op::Pick),
        (0..1000u64).prop_map(Op::Pick),
        Just(Op::Rebalance),
    ]
}

proptest! {
    /// Whatever the sequence, a packet goes to an active kthread (or, with
    /// none active, to a parked one of the application).
    #[test]
    fn pick_always_returns_an_active_kthread(
        kind in proptest::sample::select(SteeringKind::ALL.to_vec()),
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        let options = SteeringOptions { flow_table_capacity: 16, buckets: 8, ..Default::default() };
        let mut st = AppSteering::new(kind.build(6, &options), 6);
        let snaps = vec![KthreadSnap::default(); 6];
        for (t, op) in ops.into_iter().enumerate() {
            match op {
                Op::Set(set) => st.sync(set, t as u64),
                Op::Pick(h) => match st.steer(h, t as u64) {
                    Steered::Active(k) => prop_assert!(st.active().contains(&k)),
                    Steered::Parked(k) => {
                        prop_assert!(st.active().is_empty());
                        prop_assert!(k < 6);
                    }
                },
                Op::Rebalance => st.rebalance(t as u64, &snaps),
            }
        }
    }
}

proptest! {
    /// For any sequence of active sets: a `flow-affinity` flow whose
    /// kthread stays active never moves; an `indirection` flow moves only
    /// off a kthread that left or onto one that just came; and
    /// `indirection`'s buckets stay spread within one of even.
    #[test]
    fn flows_keep_their_kthread_across_any_core_changes(
        sets in proptest::collection::vec(proptest::collection::vec(any::<bool>(), 5), 1..30),
    ) {
        let flows: Vec<u64> = (0..200).map(|i| i * 0x9E37 + 3).collect();
        for kind in [SteeringKind::FlowAffinity, SteeringKind::Indirection] {
            let mut st = AppSteering::new(kind.build(5, &SteeringOptions::default()), 5);
            let mut ind = Indirection::new(64);
            let mut before: Vec<Option<usize>> = vec![None; flows.len()];
            let mut was = vec![false; 5];
            for (t, set) in sets.iter().enumerate() {
                st.sync(set.iter().copied(), t as u64);
                if !set.iter().any(|&on| on) {
                    was.clone_from(set); // all come back as newcomers
                    continue;
                }
                for (i, &h) in flows.iter().enumerate() {
                    let Steered::Active(k) = st.steer(h, t as u64) else {
                        panic!("no active kthread");
                    };
                    if let Some(b) = before[i] {
                        if b != k && set[b] {
                            prop_assert!(
                                kind == SteeringKind::Indirection && !was[k],
                                "{kind}: flow {i} moved from active {b} to {k}"
                            );
                        }
                    }
                    before[i] = Some(k);
                }
                was.clone_from(set);
            }
            // Bucket balance, on a bare table driven by the same sets.
            let mut active: Vec<usize> = Vec::new();
            for set in &sets {
                for (k, &want) in set.iter().enumerate() {
                    let on = active.contains(&k);
                    if on && !want {
                        active.retain(|&j| j != k);
                        ind.deactivated(k, &active, 0);
                    } else if !on && want {
                        active.push(k);
                        active.sort_unstable();
                        ind.activated(k, &active, 0);
                    }
                }
                if !active.is_empty() {
                    let owners: Vec<Option<usize>> = ind.owners().collect();
                    let counts: Vec<usize> = active
                        .iter()
                        .map(|&k| owners.iter().filter(|&&o| o == Some(k)).count())
                        .collect();
                    prop_assert_eq!(counts.iter().sum::<usize>(), 64, "{:?}", owners);
                    let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
                    prop_assert!(hi - lo <= 1, "{:?} over {:?}", counts, active);
                }
            }
        }
    }
}

/// `indirection`: a kthread that loses its core and gets it back takes back
/// the buckets it had (its flows come home), not a fresh share, so a core
/// that comes and goes moves the same quarter of the flows each time.
#[test]
fn indirection_gives_a_returning_kthread_its_own_buckets_back() {
    let mut st = AppSteering::new(
        SteeringKind::Indirection.build(4, &SteeringOptions::default()),
        4,
    );
    st.sync([true; 4], 0);
    let flows: Vec<u64> = (0..2000u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9) + 1)
        .collect();
    let at = |st: &mut AppSteering| -> Vec<usize> {
        flows
            .iter()
            .map(|&h| match st.steer(h, 0) {
                Steered::Active(k) => k,
                s => panic!("{s:?}"),
            })
            .collect()
    };
    let first = at(&mut st);
    for k in 0..4 {
        let mut set = [true; 4];
        set[k] = false;
        st.sync(set, 0);
        let away = at(&mut st);
        // Only kthread k's flows moved.
        for (a, b) in first.iter().zip(&away) {
            assert!(a == b || *a == k, "{a} -> {b} while {k} is away");
        }
        st.sync([true; 4], 0);
        assert_eq!(at(&mut st), first, "kthread {k} came back");
    }
}
