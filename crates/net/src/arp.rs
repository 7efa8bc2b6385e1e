//! The ARP table: IPv4 → MAC for the hosts we send to.
//!
//! Pure bookkeeping: the caller passes the time, sends the ARP requests this
//! table asks for and transmits the datagrams it releases. Datagrams are a
//! type parameter so the runtime can queue buffer handles rather than copies.

use crate::MacAddr;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// A fixed mapping from configuration; never expires, never overwritten.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticArpEntry {
    pub ip: Ipv4Addr,
    pub mac: MacAddr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpConfig {
    /// At most this many learned or pending entries (static ones are extra).
    pub capacity: usize,
    /// How long a learned mapping is trusted.
    pub entry_ttl: Duration,
    /// Datagrams queued per address while it is being resolved; more are refused.
    pub max_pending_per_ip: usize,
    /// Datagrams queued over all addresses: what bounds the queues' memory
    /// when many addresses are pending at once (replies to spoofed sources).
    pub max_pending_total: usize,
    /// While unresolved, ask again at most this often.
    pub retry_interval: Duration,
    /// Give up on an address (and drop its queue) after this long unanswered.
    pub pending_timeout: Duration,
}

impl Default for ArpConfig {
    // Linux-like: entries are reconfirmed about once a minute, requests
    // retried each second, three tries before giving up; a burst of replies
    // to a new peer is queued, not lost (Linux queues about 100 packets per
    // neighbour), while the total stays a few hundred datagrams.
    fn default() -> Self {
        ArpConfig {
            capacity: 1024,
            entry_ttl: Duration::from_secs(60),
            max_pending_per_ip: 64,
            max_pending_total: 256,
            retry_interval: Duration::from_secs(1),
            pending_timeout: Duration::from_secs(3),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArpCounters {
    pub requests_asked: u64,
    pub learned: u64,
    pub queued: u64,
    pub refused_queue_full: u64,
    pub refused_table_full: u64,
    /// Queued datagrams dropped because their address never answered.
    pub timed_out: u64,
    /// Learned entries pushed out to make room.
    pub evicted: u64,
}

/// What to do with a datagram for an address.
#[derive(Debug, PartialEq, Eq)]
pub enum Resolution<T> {
    /// Send it to this MAC now.
    Known { mac: MacAddr, datagram: T },
    /// Queued until the address answers; send an ARP request if `send_request`.
    Queued { send_request: bool },
    /// Not queued (the queue for this address, or the table, is full); it is
    /// handed back so its buffer can be released.
    Refused { datagram: T, send_request: bool },
}

#[derive(Debug)]
enum Dynamic<T> {
    Learned {
        mac: MacAddr,
        expires: Instant,
    },
    Pending {
        first_asked: Instant,
        last_asked: Instant,
        queue: VecDeque<T>,
    },
}

#[derive(Debug)]
pub struct ArpTable<T> {
    config: ArpConfig,
    statics: HashMap<Ipv4Addr, MacAddr>,
    dynamic: HashMap<Ipv4Addr, Dynamic<T>>,
    /// Datagrams in all pending queues.
    pending_total: usize,
    counters: ArpCounters,
}

impl<T> ArpTable<T> {
    pub fn new(config: ArpConfig, statics: &[StaticArpEntry]) -> Self {
        ArpTable {
            config,
            statics: statics.iter().map(|entry| (entry.ip, entry.mac)).collect(),
            dynamic: HashMap::new(),
            pending_total: 0,
            counters: ArpCounters::default(),
        }
    }

    pub fn counters(&self) -> &ArpCounters {
        &self.counters
    }

    /// The MAC for `ip` if known and fresh, without queuing anything.
    pub fn lookup(&self, ip: Ipv4Addr, now: Instant) -> Option<MacAddr> {
        if let Some(&mac) = self.statics.get(&ip) {
            return Some(mac);
        }
        match self.dynamic.get(&ip) {
            Some(&Dynamic::Learned { mac, expires }) if now < expires => Some(mac),
            _ => None,
        }
    }

    /// Where `datagram` for `ip` goes: a known MAC, or a queue (with an ARP
    /// request to send when one is due).
    pub fn resolve(&mut self, ip: Ipv4Addr, now: Instant, datagram: T) -> Resolution<T> {
        if let Some(mac) = self.lookup(ip, now) {
            return Resolution::Known { mac, datagram };
        }
        let is_new = !self.dynamic.contains_key(&ip);
        if is_new && !self.make_room(now) {
            self.counters.refused_table_full += 1;
            return Resolution::Refused {
                datagram,
                send_request: false,
            };
        }
        let retry_interval = self.config.retry_interval;
        let entry = self.dynamic.entry(ip).or_insert_with(|| Dynamic::Pending {
            first_asked: now,
            last_asked: now,
            queue: VecDeque::new(),
        });
        // An expired learned entry starts over as a fresh pending one.
        let restarted = matches!(entry, Dynamic::Learned { .. });
        if restarted {
            *entry = Dynamic::Pending {
                first_asked: now,
                last_asked: now,
                queue: VecDeque::new(),
            };
        }
        let Dynamic::Pending {
            last_asked, queue, ..
        } = entry
        else {
            unreachable!("the entry was made pending above")
        };
        let is_fresh = is_new || restarted;
        let retry_due = now.saturating_duration_since(*last_asked) >= retry_interval;
        if retry_due {
            *last_asked = now;
        }
        let send_request = is_fresh || retry_due;
        if send_request {
            self.counters.requests_asked += 1;
        }
        if queue.len() >= self.config.max_pending_per_ip
            || self.pending_total >= self.config.max_pending_total
        {
            self.counters.refused_queue_full += 1;
            return Resolution::Refused {
                datagram,
                send_request,
            };
        }
        queue.push_back(datagram);
        self.pending_total += 1;
        self.counters.queued += 1;
        Resolution::Queued { send_request }
    }

    /// Records `ip` is at `mac` (from an ARP request or reply addressed to
    /// us) and returns the datagrams that were waiting for it, oldest first.
    /// Static entries win over what the network says.
    pub fn learn(&mut self, ip: Ipv4Addr, mac: MacAddr, now: Instant) -> VecDeque<T> {
        if self.statics.contains_key(&ip) {
            return VecDeque::new();
        }
        if !self.dynamic.contains_key(&ip) && !self.make_room(now) {
            self.counters.refused_table_full += 1;
            return VecDeque::new();
        }
        self.counters.learned += 1;
        let learned = Dynamic::Learned {
            mac,
            expires: now + self.config.entry_ttl,
        };
        match self.dynamic.insert(ip, learned) {
            Some(Dynamic::Pending { queue, .. }) => {
                self.pending_total -= queue.len();
                queue
            }
            _ => VecDeque::new(),
        }
    }

    /// Forgets expired entries and gives up on addresses that never answered,
    /// passing their queued datagrams to `on_dropped`.
    pub fn expire(&mut self, now: Instant, mut on_dropped: impl FnMut(T)) {
        let pending_timeout = self.config.pending_timeout;
        let counters = &mut self.counters;
        let pending_total = &mut self.pending_total;
        self.dynamic.retain(|_, entry| match entry {
            Dynamic::Learned { expires, .. } => now < *expires,
            Dynamic::Pending {
                first_asked, queue, ..
            } => {
                if now.saturating_duration_since(*first_asked) < pending_timeout {
                    return true;
                }
                counters.timed_out += queue.len() as u64;
                *pending_total -= queue.len();
                queue.drain(..).for_each(&mut on_dropped);
                false
            }
        });
    }

    /// Makes room for one more dynamic entry: drops an expired learned entry,
    /// else the one closest to expiry. Pending entries are kept — they hold
    /// datagrams — so a table full of them refuses new addresses.
    fn make_room(&mut self, now: Instant) -> bool {
        if self.dynamic.len() < self.config.capacity {
            return true;
        }
        let victim = self
            .dynamic
            .iter()
            .filter_map(|(ip, entry)| match entry {
                Dynamic::Learned { expires, .. } => Some((*expires, *ip)),
                Dynamic::Pending { .. } => None,
            })
            .min();
        match victim {
            Some((expires, ip)) => {
                if now < expires {
                    self.counters.evicted += 1;
                }
                self.dynamic.remove(&ip);
                true
            }
            None => false,
        }
    }

    /// Number of learned and pending entries (static ones not included).
    pub fn dynamic_len(&self) -> usize {
        self.dynamic.len()
    }

    #[cfg(test)]
    fn is_pending(&self, ip: Ipv4Addr) -> bool {
        matches!(self.dynamic.get(&ip), Some(Dynamic::Pending { .. }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
    const PEER_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);
    const SECOND: Duration = Duration::from_secs(1);

    fn table(config: ArpConfig) -> ArpTable<u32> {
        ArpTable::new(
            config,
            &[StaticArpEntry {
                ip: Ipv4Addr::new(10, 0, 0, 254),
                mac: MacAddr([2, 0, 0, 0, 0, 0xfe]),
            }],
        )
    }

    #[test]
    fn static_entries_resolve_and_are_not_overwritten() {
        let mut arp = table(ArpConfig::default());
        let now = Instant::now();
        let gateway = Ipv4Addr::new(10, 0, 0, 254);
        assert_eq!(
            arp.resolve(gateway, now, 1),
            Resolution::Known {
                mac: MacAddr([2, 0, 0, 0, 0, 0xfe]),
                datagram: 1
            }
        );
        assert!(arp.learn(gateway, PEER_MAC, now).is_empty());
        assert_eq!(
            arp.lookup(gateway, now + 1000 * SECOND),
            Some(MacAddr([2, 0, 0, 0, 0, 0xfe]))
        );
    }

    #[test]
    fn pending_queues_are_bounded_in_total_and_freed_on_learn_and_expiry() {
        let mut arp = table(ArpConfig {
            max_pending_per_ip: 3,
            max_pending_total: 4,
            ..ArpConfig::default()
        });
        let now = Instant::now();
        let a = Ipv4Addr::new(10, 0, 0, 10);
        let b = Ipv4Addr::new(10, 0, 0, 11);
        let queued = |r: &Resolution<u32>| matches!(r, Resolution::Queued { .. });
        assert!((0..3).all(|d| queued(&arp.resolve(a, now, d))));
        assert!(queued(&arp.resolve(b, now, 3)));
        // Room for b alone, but the table holds four datagrams already.
        assert!(!queued(&arp.resolve(b, now, 4)));
        assert_eq!(arp.counters().refused_queue_full, 1);
        assert_eq!(arp.learn(a, PEER_MAC, now).len(), 3);
        assert!(queued(&arp.resolve(b, now, 5)));
        arp.expire(now + 10 * SECOND, drop);
        // b's two datagrams were given up: the total has room for four again.
        let later = now + 100 * SECOND;
        assert!((6..9).all(|d| queued(&arp.resolve(a, later, d))));
        assert!(queued(&arp.resolve(b, later, 9)));
    }

    #[test]
    fn unknown_address_queues_asks_once_then_releases_on_learn() {
        let mut arp = table(ArpConfig {
            max_pending_per_ip: 2,
            ..ArpConfig::default()
        });
        let now = Instant::now();
        assert_eq!(
            arp.resolve(PEER, now, 1),
            Resolution::Queued { send_request: true }
        );
        assert_eq!(
            arp.resolve(PEER, now, 2),
            Resolution::Queued {
                send_request: false
            }
        );
        assert_eq!(
            arp.resolve(PEER, now, 3),
            Resolution::Refused {
                datagram: 3,
                send_request: false
            }
        );
        assert_eq!(arp.counters().refused_queue_full, 1);
        // Still unanswered a retry interval later: ask again.
        assert_eq!(
            arp.resolve(PEER, now + SECOND, 4),
            Resolution::Refused {
                datagram: 4,
                send_request: true
            }
        );
        assert_eq!(arp.counters().requests_asked, 2);
        let released: Vec<u32> = arp
            .learn(PEER, PEER_MAC, now + SECOND)
            .into_iter()
            .collect();
        assert_eq!(released, [1, 2]);
        assert_eq!(
            arp.resolve(PEER, now + 2 * SECOND, 5),
            Resolution::Known {
                mac: PEER_MAC,
                datagram: 5
            }
        );
    }

    #[test]
    fn learned_entries_expire() {
        let config = ArpConfig::default();
        let mut arp = table(config);
        let now = Instant::now();
        assert!(arp.learn(PEER, PEER_MAC, now).is_empty());
        assert_eq!(
            arp.lookup(PEER, now + config.entry_ttl - SECOND),
            Some(PEER_MAC)
        );
        let later = now + config.entry_ttl;
        assert_eq!(arp.lookup(PEER, later), None);
        assert_eq!(
            arp.resolve(PEER, later, 9),
            Resolution::Queued { send_request: true }
        );
        assert!(arp.is_pending(PEER));
    }

    #[test]
    fn unanswered_addresses_time_out_and_drop_their_queue() {
        let config = ArpConfig::default();
        let mut arp = table(config);
        let now = Instant::now();
        arp.resolve(PEER, now, 1);
        arp.resolve(PEER, now, 2);
        let mut dropped = Vec::new();
        arp.expire(now + config.pending_timeout - SECOND, |d| dropped.push(d));
        assert!(dropped.is_empty() && arp.is_pending(PEER));
        arp.expire(now + config.pending_timeout, |d| dropped.push(d));
        assert_eq!(dropped, [1, 2]);
        assert_eq!(arp.counters().timed_out, 2);
        assert_eq!(arp.dynamic_len(), 0);
    }

    #[test]
    fn table_is_bounded() {
        let mut arp = table(ArpConfig {
            capacity: 2,
            ..ArpConfig::default()
        });
        let now = Instant::now();
        let host = |n: u8| Ipv4Addr::new(10, 0, 1, n);
        arp.learn(host(1), PEER_MAC, now);
        arp.learn(host(2), PEER_MAC, now + SECOND);
        // Full of learned entries: the one closest to expiry makes room.
        assert_eq!(
            arp.resolve(host(3), now + SECOND, 1),
            Resolution::Queued { send_request: true }
        );
        assert_eq!(arp.lookup(host(1), now + SECOND), None);
        assert_eq!(arp.counters().evicted, 1);
        // host(2) goes next; then two pending entries fill the table and a
        // third address is refused rather than dropping queued datagrams.
        assert_eq!(
            arp.resolve(host(4), now + SECOND, 2),
            Resolution::Queued { send_request: true }
        );
        assert_eq!(
            arp.resolve(host(5), now + SECOND, 3),
            Resolution::Refused {
                datagram: 3,
                send_request: false
            }
        );
        assert_eq!(arp.counters().refused_table_full, 1);
        assert_eq!(arp.dynamic_len(), 2);
    }

    #[test]
    fn static_entries_from_toml() {
        #[derive(Deserialize)]
        struct Config {
            arp: Vec<StaticArpEntry>,
        }
        let config: Config =
            toml::from_str("[[arp]]\nip = \"10.0.0.9\"\nmac = \"02:00:00:00:00:09\"\n").unwrap();
        assert_eq!(
            config.arp,
            [StaticArpEntry {
                ip: Ipv4Addr::new(10, 0, 0, 9),
                mac: MacAddr([2, 0, 0, 0, 0, 9])
            }]
        );
    }
}
