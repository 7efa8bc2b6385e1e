//! Poll only where nobody waits (docs/idle-poll.md): after a pass's
//! decisions, which applications hold a core that another application is
//! left wanting. A kthread of such an application that runs out of work
//! parks at once rather than polling while idle: polling there would only
//! keep the core from its next owner until a later pass took it back.
//!
//! A latency-critical application granted a core lately counts as wanting
//! one too, though it may hold one or be parked at this pass: a netstack
//! and the protected server behind it are granted a core for every
//! request, and a poller on each managed core made every one of those
//! grants take a core back from a poller (docs/idle-poll.md, "Wanted
//! again soon").

use super::{serves, AppClass, AppSnap, Decision, Topology};

/// For each application (an index into `apps`): once `decisions` are
/// carried out, no managed core is free and another application wants one
/// — a kthread of it displaced (being preempted, by this pass or an
/// earlier one), work queued while it holds no core, or, latency-critical,
/// granted one lately (`AppSnap::granted_lately`). An application's
/// own netstack does not count against it: it never takes a protected
/// application's core (`AppSnap::netstack`). `out` is resized to
/// `apps.len()`.
pub fn wanted_elsewhere(
    topo: &Topology,
    apps: &[AppSnap],
    decisions: &[Decision],
    out: &mut Vec<bool>,
) {
    out.clear();
    out.resize(apps.len(), false);
    let mut owner: Vec<Option<usize>> = vec![None; topo.n_cores];
    // Displaced: neither holding a core nor parked (asked to give it back).
    let mut displaced: Vec<bool> = apps
        .iter()
        .map(|a| a.kthreads.iter().any(|k| k.core.is_none() && !k.parked))
        .collect();
    for (a, app) in apps.iter().enumerate() {
        for c in app.kthreads.iter().filter_map(|k| k.core) {
            if let Some(o) = owner.get_mut(c) {
                *o = Some(a);
            }
        }
    }
    for d in decisions {
        match *d {
            Decision::Preempt { app, core, .. } => {
                if let Some(o) = owner.get_mut(core) {
                    *o = None;
                }
                if let Some(x) = displaced.get_mut(app) {
                    *x = true;
                }
            }
            Decision::Grant { app, core, .. } => {
                if let Some(o) = owner.get_mut(core) {
                    *o = Some(app);
                }
            }
        }
    }
    if owner.iter().any(Option::is_none) {
        return;
    }
    let holds = |a: usize| owner.contains(&Some(a));
    let wanting: Vec<bool> = (0..apps.len())
        .map(|b| {
            displaced[b]
                || (!holds(b) && apps[b].kthreads.iter().any(|k| k.counters.has_items()))
                || (apps[b].class == AppClass::LatencyCritical && apps[b].granted_lately)
        })
        .collect();
    for (a, w) in out.iter_mut().enumerate() {
        *w = (0..apps.len()).any(|b| b != a && wanting[b] && !serves(apps, b, a));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::{AppClass, KthreadSnap, QueueCounters};

    fn app(key: u64, class: AppClass, kthreads: Vec<KthreadSnap>) -> AppSnap {
        AppSnap {
            key,
            class,
            guaranteed: 0,
            max_cores: kthreads.len(),
            kthreads,
            next_timer: None,
            last_yielded_core: None,
            netstack: None,
            granted_lately: false,
        }
    }

    fn on(core: usize) -> KthreadSnap {
        KthreadSnap {
            core: Some(core),
            ..Default::default()
        }
    }

    fn parked(queued: bool) -> KthreadSnap {
        KthreadSnap {
            parked: true,
            counters: QueueCounters {
                rq_tail: u32::from(queued),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// Neither holding a core nor parked: asked to give its core back.
    fn displaced() -> KthreadSnap {
        KthreadSnap::default()
    }

    fn run(n_cores: usize, apps: &[AppSnap], decisions: &[Decision]) -> Vec<bool> {
        let mut out = Vec::new();
        wanted_elsewhere(&Topology::flat(n_cores), apps, decisions, &mut out);
        out
    }

    #[test]
    fn a_core_taken_from_batch_this_pass_is_wanted_back() {
        // The latency-critical server is granted the one core batch held.
        let apps = [
            app(1, AppClass::LatencyCritical, vec![parked(true)]),
            app(2, AppClass::Batch, vec![on(0)]),
        ];
        let decisions = [
            Decision::Preempt {
                app: 1,
                kthread: 0,
                core: 0,
            },
            Decision::Grant {
                app: 0,
                kthread: 0,
                core: 0,
            },
        ];
        assert_eq!(run(1, &apps, &decisions), [true, false]);
    }

    #[test]
    fn a_victim_still_giving_its_core_back_keeps_it_wanted() {
        let apps = [
            app(1, AppClass::LatencyCritical, vec![on(0)]),
            app(2, AppClass::Batch, vec![displaced()]),
        ];
        assert_eq!(run(1, &apps, &[]), [true, false]);
    }

    #[test]
    fn alone_or_beside_a_free_core_nobody_waits() {
        let alone = [app(1, AppClass::LatencyCritical, vec![on(0)])];
        assert_eq!(run(1, &alone, &[]), [false]);
        // Batch is displaced, but a core is free for it.
        let apps = [
            app(1, AppClass::LatencyCritical, vec![on(0)]),
            app(2, AppClass::Batch, vec![displaced()]),
        ];
        assert_eq!(run(2, &apps, &[]), [false, false]);
    }

    #[test]
    fn queued_work_without_a_core_is_a_want_and_a_parked_idle_app_is_not() {
        let idle_batch = [
            app(1, AppClass::LatencyCritical, vec![on(0)]),
            app(2, AppClass::Batch, vec![parked(false)]),
        ];
        assert_eq!(run(1, &idle_batch, &[]), [false, false]);
        let waiting_batch = [
            app(1, AppClass::LatencyCritical, vec![on(0)]),
            app(2, AppClass::Batch, vec![parked(true)]),
        ];
        assert_eq!(run(1, &waiting_batch, &[]), [true, false]);
    }

    #[test]
    fn a_protected_application_s_netstack_does_not_count_against_it() {
        // App 0 is protected; app 1 is its netstack, waiting with work.
        let mut protected = app(1, AppClass::LatencyCritical, vec![on(0)]);
        protected.netstack = Some(2);
        let netstack = app(2, AppClass::LatencyCritical, vec![parked(true)]);
        assert_eq!(run(1, &[protected, netstack], &[]), [false, false]);
        // The other way round: the protected application waits for the
        // netstack's core (it may take it), so the netstack's is wanted.
        let mut protected = app(1, AppClass::LatencyCritical, vec![parked(true)]);
        protected.netstack = Some(2);
        let netstack = app(2, AppClass::LatencyCritical, vec![on(0)]);
        assert_eq!(run(1, &[protected, netstack], &[]), [false, true]);
    }

    #[test]
    fn a_latency_critical_application_granted_lately_wants_a_core_again() {
        // A client polls on core 0 and a protected server on core 1; the
        // server's netstack, parked with nothing queued, was granted a core
        // for the last request and will be for the next.
        let client = app(1, AppClass::LatencyCritical, vec![on(0)]);
        let mut netstack = app(2, AppClass::LatencyCritical, vec![parked(false)]);
        netstack.granted_lately = true;
        let mut server = app(3, AppClass::LatencyCritical, vec![on(1)]);
        server.netstack = Some(2);
        // The client parks rather than poll; its own netstack still does
        // not count against the server.
        let apps = [client, netstack, server];
        assert_eq!(run(2, &apps, &[]), [true, false, false]);
        // Not granted lately: nobody waits.
        let mut quiet = apps.clone();
        quiet[1].granted_lately = false;
        assert_eq!(run(2, &quiet, &[]), [false, false, false]);
        // A core free: nobody waits either.
        assert_eq!(run(3, &apps, &[]), [false, false, false]);
    }

    #[test]
    fn batch_granted_lately_is_no_want() {
        // Batch takes whatever core is left, and is granted one whenever a
        // core frees up: that says nothing of a request to come.
        let mut batch = app(2, AppClass::Batch, vec![parked(false)]);
        batch.granted_lately = true;
        let apps = [app(1, AppClass::LatencyCritical, vec![on(0)]), batch];
        assert_eq!(run(1, &apps, &[]), [false, false]);
    }
}
