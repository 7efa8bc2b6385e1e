//! Events onto their rings: they wait in the netstack while a ring is full
//! (counted, never dropped), and the application's doorbell rings when it
//! waits.

use std::os::fd::AsFd;

use ginza_proto::netstack::Event;

use super::Netstack;

impl Netstack {
    pub(super) fn emit(&mut self, app_id: u64, pair: u32, ev: Event) {
        if let Some(app) = self.apps.get_mut(&app_id) {
            if let Some(q) = app.waiting.get_mut(pair as usize) {
                q.push_back(ev);
            }
        }
    }

    /// Pushes waiting events on their rings; rings found full are counted
    /// and the events wait (never dropped).
    pub(super) fn flush_events(&mut self) {
        let ids: Vec<u64> = self.apps.keys().copied().collect();
        for id in ids {
            let pairs = self.apps.get(&id).map_or(0, |a| a.pairs.len());
            for p in 0..pairs {
                self.flush_pair(id, p);
            }
        }
    }

    /// Pushes pair `p`'s waiting events; true if none is left waiting.
    pub(super) fn flush_pair(&mut self, id: u64, p: usize) -> bool {
        let Some(app) = self.apps.get_mut(&id) else {
            return true;
        };
        let q = &mut app.waiting[p];
        if q.is_empty() {
            return true;
        }
        let ring = &mut app.pairs[p];
        let mut n = 0;
        while let Some(ev) = q.front() {
            if matches!(ev, Event::NewData { .. }) {
                // Before the push: the application may take it at once.
                ginza_sys::hops::stamp(ginza_sys::hops::Hop::NetstackEventOut);
            }
            match ring.events.push(ev.encode()) {
                Ok(()) => {
                    q.pop_front();
                    n += 1;
                }
                Err(ginza_shm::PushError::Full(_)) => {
                    self.stats.event_ring_full += 1;
                    ring.line.count_event_ring_full();
                    break;
                }
                Err(ginza_shm::PushError::Corrupt(e)) => {
                    app.doomed
                        .get_or_insert_with(|| format!("event ring {p} corrupt: {e}"));
                    break;
                }
            }
        }
        self.stats.events += n;
        if n > 0 && ring.line.app_waiting() {
            ring.line.set_app_waiting(false);
            if let Some(fd) = app.doorbells.get(p) {
                let _ = ginza_sys::eventfd::write(fd.as_fd(), 1);
            }
        }
        q.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use ginza_proto::netstack::{Event, ListenId};

    use super::super::testing::App;
    use super::super::{Netstack, NetstackConfig};

    #[test]
    fn events_wait_while_their_ring_is_full_and_none_is_dropped() {
        let mut ns = Netstack::new(NetstackConfig {
            ring_capacity: 4,
            ..NetstackConfig::default()
        });
        let mut app = App::attach(&mut ns, "events-full");
        let listener = ListenId::new(1).unwrap();
        for cookie in 0..10 {
            ns.emit(app.id, 0, Event::Listening { cookie, listener });
        }
        ns.flush_events();
        assert!(ns.stats().event_ring_full >= 1);
        let mut cookies = Vec::new();
        for _ in 0..10 {
            let got = app.events();
            cookies.extend(got.iter().map(|e| match e {
                Event::Listening { cookie, .. } => *cookie,
                e => panic!("{e:?}"),
            }));
            ns.flush_events();
        }
        assert_eq!(cookies, (0..10).collect::<Vec<_>>(), "all, in order");
        assert_eq!(ns.stats().events, 10);
    }
}
