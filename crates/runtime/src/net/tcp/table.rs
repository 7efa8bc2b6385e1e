//! The socket table: connections by 4-tuple, listeners by port, and the
//! choice of ephemeral ports for `connect`. Generic over what it stores so
//! it is tested without a runtime; the stack keeps one behind a spinlock.

use std::collections::HashMap;
use std::io;

use ginza_net::Endpoint;

/// Ports `connect` picks from (IANA's dynamic range, as UDP's `bind(0)`).
pub(crate) const EPHEMERAL_FIRST: u16 = 49152;

/// A connection's identity: our end and the peer's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct FourTuple {
    pub(crate) local: Endpoint,
    pub(crate) remote: Endpoint,
}

pub(crate) struct Table<C, L> {
    conns: HashMap<FourTuple, C>,
    listeners: HashMap<u16, L>,
    /// Connections per local port (an ephemeral port is free when none).
    port_use: HashMap<u16, u32>,
    next_ephemeral: u16,
}

impl<C: Clone, L: Clone> Table<C, L> {
    pub(crate) fn new() -> Self {
        Table {
            conns: HashMap::new(),
            listeners: HashMap::new(),
            port_use: HashMap::new(),
            next_ephemeral: EPHEMERAL_FIRST,
        }
    }

    pub(crate) fn get(&self, key: &FourTuple) -> Option<C> {
        self.conns.get(key).cloned()
    }

    /// Adds a connection; `false` (and nothing changed) if the 4-tuple is
    /// taken.
    pub(crate) fn insert(&mut self, key: FourTuple, conn: C) -> bool {
        if self.conns.contains_key(&key) {
            return false;
        }
        self.conns.insert(key, conn);
        *self.port_use.entry(key.local.port).or_default() += 1;
        true
    }

    pub(crate) fn remove(&mut self, key: &FourTuple) -> Option<C> {
        let conn = self.conns.remove(key)?;
        if let Some(n) = self.port_use.get_mut(&key.local.port) {
            *n -= 1;
            if *n == 0 {
                self.port_use.remove(&key.local.port);
            }
        }
        Some(conn)
    }

    /// Connections in the table.
    pub(crate) fn len(&self) -> usize {
        self.conns.len()
    }

    pub(crate) fn conns(&self) -> impl Iterator<Item = &C> {
        self.conns.values()
    }

    pub(crate) fn listener(&self, port: u16) -> Option<L> {
        self.listeners.get(&port).cloned()
    }

    /// Makes `port` a listening port (`AddrInUse` if it is one already;
    /// connections on it do not count, as with `SO_REUSEADDR`, which std
    /// sets on Unix).
    pub(crate) fn listen(&mut self, port: u16, listener: L) -> io::Result<()> {
        if self.listeners.contains_key(&port) {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("TCP port {port} is already listening"),
            ));
        }
        self.listeners.insert(port, listener);
        Ok(())
    }

    /// Stops listening on `port` if `is_it` says the listener there is the
    /// one closing.
    pub(crate) fn unlisten(&mut self, port: u16, is_it: impl FnOnce(&L) -> bool) -> Option<L> {
        if self.listeners.get(&port).is_some_and(is_it) {
            return self.listeners.remove(&port);
        }
        None
    }

    /// A port for a connection to `remote`: an ephemeral one no listener
    /// and no connection uses, or, when all are used, one whose 4-tuple with
    /// `remote` is still free.
    pub(crate) fn ephemeral_port(
        &mut self,
        local_ip: std::net::Ipv4Addr,
        remote: Endpoint,
    ) -> io::Result<u16> {
        let n = u32::from(u16::MAX - EPHEMERAL_FIRST) + 1;
        let start = u32::from(self.next_ephemeral - EPHEMERAL_FIRST);
        let candidates = (0..n).map(|i| EPHEMERAL_FIRST + ((start + i) % n) as u16);
        let unused = candidates
            .clone()
            .find(|p| !self.listeners.contains_key(p) && !self.port_use.contains_key(p));
        let port = unused.or_else(|| {
            candidates.clone().find(|&p| {
                !self.listeners.contains_key(&p)
                    && !self.conns.contains_key(&FourTuple {
                        local: Endpoint::new(local_ip, p),
                        remote,
                    })
            })
        });
        let Some(port) = port else {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("no free ephemeral TCP port for a connection to {remote}: {EPHEMERAL_FIRST}-65535 are all used"),
            ));
        };
        self.next_ephemeral = port.checked_add(1).unwrap_or(EPHEMERAL_FIRST);
        Ok(port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const US: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

    fn key(local: u16, remote_port: u16) -> FourTuple {
        FourTuple {
            local: Endpoint::new(US, local),
            remote: Endpoint::new(Ipv4Addr::new(10, 0, 0, 2), remote_port),
        }
    }

    #[test]
    fn connections_are_found_by_their_four_tuple() {
        let mut t: Table<u32, ()> = Table::new();
        assert!(t.insert(key(80, 1000), 1));
        assert!(t.insert(key(80, 1001), 2));
        assert!(!t.insert(key(80, 1000), 3), "a 4-tuple is taken once");
        assert_eq!(t.get(&key(80, 1000)), Some(1));
        assert_eq!(t.get(&key(81, 1000)), None);
        assert_eq!(t.remove(&key(80, 1000)), Some(1));
        assert_eq!(t.remove(&key(80, 1000)), None);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn a_port_listens_once() {
        let mut t: Table<(), u32> = Table::new();
        t.listen(80, 1).unwrap();
        assert_eq!(
            t.listen(80, 2).unwrap_err().kind(),
            io::ErrorKind::AddrInUse
        );
        assert_eq!(t.unlisten(80, |l| *l == 2), None, "not the one listening");
        assert_eq!(t.unlisten(80, |l| *l == 1), Some(1));
        t.listen(80, 2).unwrap();
        assert_eq!(t.listener(80), Some(2));
    }

    #[test]
    fn ephemeral_ports_skip_used_ones_and_wrap() {
        let mut t: Table<(), ()> = Table::new();
        let remote = key(0, 7).remote;
        t.listen(EPHEMERAL_FIRST, ()).unwrap();
        t.insert(key(EPHEMERAL_FIRST + 1, 9), ());
        assert_eq!(t.ephemeral_port(US, remote).unwrap(), EPHEMERAL_FIRST + 2);
        assert_eq!(t.ephemeral_port(US, remote).unwrap(), EPHEMERAL_FIRST + 3);
        t.next_ephemeral = u16::MAX;
        assert_eq!(t.ephemeral_port(US, remote).unwrap(), u16::MAX);
        assert_eq!(
            t.ephemeral_port(US, remote).unwrap(),
            EPHEMERAL_FIRST + 2,
            "wrapped"
        );
    }

    #[test]
    fn with_every_ephemeral_port_used_a_free_four_tuple_is_reused() {
        let mut t: Table<(), ()> = Table::new();
        for p in EPHEMERAL_FIRST..=u16::MAX {
            assert!(t.insert(key(p, 7), ()));
        }
        let other = key(0, 8).remote;
        let p = t.ephemeral_port(US, other).unwrap();
        assert!(t.insert(
            FourTuple {
                local: Endpoint::new(US, p),
                remote: other
            },
            ()
        ));
        let same = key(0, 7).remote;
        assert_eq!(
            t.ephemeral_port(US, same).unwrap_err().kind(),
            io::ErrorKind::AddrInUse
        );
    }
}
