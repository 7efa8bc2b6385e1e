//! A received frame: ARP learned and answered, ICMP echo answered, a TCP
//! segment to its connection, a SYN to its listener (admission and the
//! passive open), anything else for TCP answered with a RST; and the
//! queue of frames out.

use std::net::Ipv4Addr;

use ginza_net::tcp::{Connection, CookieAnswer, Demux, FourTuple, Opened, Segment, SynAnswer};
use ginza_net::{parse, tx, ArpOperation, Endpoint, Interface, MacAddr, Packet, MAX_FRAME_LEN};
use log::warn;

use super::{Conn, Netstack, OutFrame, Phase};

impl Netstack {
    /// Next frame to send, if any.
    pub fn pop_frame(&mut self) -> Option<OutFrame> {
        self.frames.pop_front()
    }

    /// Frames waiting to be sent.
    pub fn frames_waiting(&self) -> usize {
        self.frames.len()
    }

    fn push_frame(&mut self, f: Vec<u8>) {
        self.stats.frames_out += 1;
        self.frames.push_back(OutFrame::whole(f));
    }

    pub(super) fn build(
        &mut self,
        build: impl FnOnce(&mut [u8]) -> Result<usize, ginza_net::BuildError>,
    ) {
        let mut buf = vec![0u8; MAX_FRAME_LEN];
        match build(&mut buf) {
            Ok(n) => {
                buf.truncate(n);
                self.push_frame(buf);
            }
            Err(e) => warn!("cannot build a frame: {e}"),
        }
    }

    /// One received frame.
    pub fn on_frame(&mut self, frame: &[u8]) {
        self.stats.frames_in += 1;
        let Some(iface) = destination(frame).and_then(|ip| self.addresses.get(&ip).map(|e| e.0))
        else {
            self.stats.frames_not_ours += 1;
            return;
        };
        let pkt = match parse(frame, &iface) {
            Ok(p) => p,
            Err(_) => {
                self.stats.frames_not_ours += 1;
                return;
            }
        };
        match pkt {
            Packet::Arp(m) => {
                self.arp.insert(m.sender_ip, m.sender_mac);
                if m.operation == ArpOperation::Request {
                    self.build(|b| tx::arp_reply(b, &iface, &m));
                }
            }
            Packet::IcmpEchoRequest(e) => self.build(|b| tx::icmp_echo_reply(b, &iface, &e)),
            Packet::Udp(_) => self.stats.frames_not_ours += 1,
            Packet::Tcp(f) => {
                if !f.segment.payload.is_empty() {
                    ginza_sys::hops::stamp(ginza_sys::hops::Hop::NetstackFrameIn);
                }
                self.stats.segments_in += 1;
                self.arp.insert(f.src.ip, f.src_mac);
                let key = FourTuple::of(&f);
                let now = self.now();
                match self.table.demux(&key, &f.segment).cloned() {
                    Demux::Connection(c) => {
                        if let Some(conn) = self.conns.get_mut(c) {
                            conn.peer_mac = Some(f.src_mac);
                            conn.tcb.on_segment(&f.segment, now);
                        }
                        self.settle(c, now);
                    }
                    Demux::Listener(l) => self.on_syn(l, &iface, &f, now),
                    Demux::ListenerAck(l) => self.on_listener_ack(l, &iface, &f, now),
                    Demux::NoSocket { reset } => {
                        self.reset(&iface, f.src_mac, f.dst.port, f.src, reset)
                    }
                }
            }
        }
    }

    fn reset(
        &mut self,
        iface: &Interface,
        mac: MacAddr,
        port: u16,
        to: Endpoint,
        rst: Option<Segment<'static>>,
    ) {
        if let Some(rst) = rst {
            self.stats.resets_sent += 1;
            self.build(|b| tx::tcp_segment(b, iface, mac, port, to, &rst));
        }
    }

    fn on_syn(
        &mut self,
        l: u32,
        iface: &Interface,
        f: &ginza_net::TcpFrame<'_>,
        now: ginza_net::tcp::Instant,
    ) {
        let Some(entry) = self.listeners.get_mut(l) else {
            return;
        };
        let key = FourTuple::of(f);
        let opened = entry.backlog.admit_syn(
            key,
            &f.segment,
            &self.cfg.tcp,
            &self.isn,
            &self.cookies,
            now,
        );
        let (tcb, evicted) = match opened {
            SynAnswer::Known => return,
            SynAnswer::Cookie(syn_ack) => {
                let (mac, port, to) = (f.src_mac, f.dst.port, f.src);
                return self.build(|b| tx::tcp_segment(b, iface, mac, port, to, &syn_ack));
            }
            SynAnswer::Opened(Opened { tcb, evicted }) => (tcb, evicted),
        };
        if let Some(old) = evicted {
            if let Some(c) = self.table.remove(&old) {
                self.forget(c);
            }
        }
        self.open_passive(l, f, tcb, now);
    }

    /// An ACK for a listening endpoint without a connection: a SYN
    /// cookie's connection is made if it carries one, else it is reset.
    fn on_listener_ack(
        &mut self,
        l: u32,
        iface: &Interface,
        f: &ginza_net::TcpFrame<'_>,
        now: ginza_net::tcp::Instant,
    ) {
        let Some(entry) = self.listeners.get_mut(l) else {
            return;
        };
        let key = FourTuple::of(f);
        match entry
            .backlog
            .admit_cookie(key, &f.segment, &self.cfg.tcp, &self.cookies, now)
        {
            CookieAnswer::Opened(tcb) => self.open_passive(l, f, tcb, now),
            // One thread makes every connection here: not reached.
            CookieAnswer::Known => {}
            CookieAnswer::NotACookie => {
                let rst = ginza_net::tcp::reset_for(&f.segment);
                self.reset(iface, f.src_mac, f.dst.port, f.src, rst);
            }
        }
    }

    /// A connection the listener `l` opened, half-open as far as the
    /// listener knows, into the table; settled (its SYN-ACK out, or, made
    /// from a SYN cookie, announced to the application).
    fn open_passive(
        &mut self,
        l: u32,
        f: &ginza_net::TcpFrame<'_>,
        tcb: Connection,
        now: ginza_net::tcp::Instant,
    ) {
        let Some(entry) = self.listeners.get(l) else {
            return;
        };
        let key = FourTuple::of(f);
        let (app, pair) = (entry.app, entry.pair);
        let conn = Conn::new(
            app,
            pair,
            key,
            Some(f.src_mac),
            tcb,
            Phase::HalfOpen { listener: l },
        );
        let Some(c) = self.conns.insert(conn) else {
            if let Some(entry) = self.listeners.get_mut(l) {
                entry.backlog.forget(f.src);
            }
            return;
        };
        self.table.insert(key, c);
        if let Some(a) = self.apps.get_mut(&app) {
            a.conns.push(c);
        }
        self.settle(c, now);
    }

    /// Drops a connection the application never knew of.
    fn forget(&mut self, c: u32) {
        if let Some(conn) = self.conns.remove(c) {
            self.table.remove(&conn.key);
            if let Some(a) = self.apps.get_mut(&conn.app) {
                a.conns.retain(|x| *x != c);
            }
        }
    }
}

/// The destination IPv4 address of a frame (IPv4 or ARP), to find the
/// interface it is for.
fn destination(frame: &[u8]) -> Option<Ipv4Addr> {
    use smoltcp::wire::{ArpPacket, EthernetFrame, EthernetProtocol, Ipv4Packet};
    let eth = EthernetFrame::new_checked(frame).ok()?;
    match eth.ethertype() {
        EthernetProtocol::Ipv4 => {
            let ip = Ipv4Packet::new_checked(eth.payload()).ok()?;
            Some(ip.dst_addr())
        }
        EthernetProtocol::Arp => {
            let arp = ArpPacket::new_checked(eth.payload()).ok()?;
            let t = arp.target_protocol_addr();
            (t.len() == 4).then(|| Ipv4Addr::new(t[0], t[1], t[2], t[3]))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use ginza_net::tcp::{FourTuple, Instant, Segment, Seq};
    use ginza_net::{tx, Endpoint, MAX_FRAME_LEN};
    use ginza_proto::netstack::Event;

    const US_END: Endpoint = Endpoint::new(US.ip, 80);

    use super::super::testing::{client, deliver, frame_of, sent, App, PEER, US};
    use super::super::{Netstack, NetstackConfig, Phase};

    #[test]
    fn arp_is_learned_and_answered_for_our_addresses_only() {
        let mut ns = Netstack::new(NetstackConfig::default());
        ns.add_address(US);
        let mut b = vec![0u8; MAX_FRAME_LEN];
        let n = tx::arp_request(&mut b, &PEER, US.ip).unwrap();
        ns.on_frame(&b[..n]);
        assert_eq!(ns.frames_waiting(), 1, "the reply");
        assert_eq!(ns.arp.get(&PEER.ip), Some(&PEER.mac), "learned");
        let n = tx::arp_request(&mut b, &PEER, Ipv4Addr::new(10, 0, 0, 77)).unwrap();
        ns.on_frame(&b[..n]);
        assert_eq!(ns.frames_waiting(), 1, "not ours: no reply");
        assert_eq!(ns.stats().frames_not_ours, 1);
    }

    #[test]
    fn a_segment_for_no_socket_is_answered_with_a_reset_and_a_reset_is_not() {
        let mut ns = Netstack::new(NetstackConfig::default());
        ns.add_address(US);
        deliver(&mut ns, &mut client(40000, 80));
        let (segs, other) = sent(&mut ns);
        assert_eq!((segs.len(), other), (1, 0));
        let (to, rst) = &segs[0];
        assert_eq!(*to, Endpoint::new(PEER.ip, 40000));
        assert!(rst.flags.rst && rst.ack == Some(Seq(5001)), "{rst:?}");
        let mut r = Segment::new(Seq(1));
        r.flags.rst = true;
        ns.on_frame(&frame_of(&r, 40000, 80));
        assert_eq!(ns.frames_waiting(), 0);
        assert_eq!(ns.stats().resets_sent, 1);
    }

    #[test]
    fn a_syn_for_a_listener_opens_one_half_open_connection() {
        let mut ns = Netstack::new(NetstackConfig::default());
        let app = App::attach(&mut ns, "input-syn");
        app.listen_on_80(&mut ns, 4);
        let mut c = client(40000, 80);
        let syn = c.poll_transmit(Instant(0)).unwrap().to_owned_payload().0;
        ns.on_frame(&frame_of(&syn, 40000, 80));
        ns.on_frame(&frame_of(&syn, 40000, 80));
        assert_eq!(ns.conns.len(), 1, "the second SYN went to the connection");
        let handle = ns.conns.handles()[0];
        let conn = ns.conns.get(handle).unwrap();
        assert!(matches!(conn.phase, Phase::HalfOpen { .. }));
        assert_eq!(ns.table.get(&conn.key), Some(&handle));
        let (segs, _) = sent(&mut ns);
        assert!(!segs.is_empty());
        for (to, s) in &segs {
            assert_eq!(*to, Endpoint::new(PEER.ip, 40000));
            assert!(s.flags.syn && s.ack == Some(Seq(5001)), "a SYN-ACK: {s:?}");
        }
    }

    #[test]
    fn with_the_half_open_set_full_a_syn_cookie_makes_the_connection() {
        let mut ns = Netstack::new(NetstackConfig::default());
        let mut app = App::attach(&mut ns, "input-cookie");
        app.listen_on_80(&mut ns, 4); // 64 half-open at most
        for port in 1000..1064 {
            deliver(&mut ns, &mut client(port, 80));
        }
        let _ = sent(&mut ns);
        assert_eq!(ns.conns.len(), 64);
        let mut c = client(40000, 80);
        deliver(&mut ns, &mut c);
        let (segs, _) = sent(&mut ns);
        let [(to, syn_ack)] = &segs[..] else {
            panic!("one SYN-ACK: {segs:?}");
        };
        assert_eq!(*to, Endpoint::new(PEER.ip, 40000));
        assert!(syn_ack.flags.syn && syn_ack.window_scale.is_none());
        assert_eq!(ns.conns.len(), 64, "nothing kept for it");
        c.on_segment(syn_ack, Instant(0));
        assert_eq!(c.send(b"hi"), Ok(2));
        deliver(&mut ns, &mut c);
        assert_eq!(ns.conns.len(), 65, "made from the cookie");
        let handle = *ns.table.get(&FourTuple::new(US_END, c.local())).unwrap();
        let conn = ns.conns.get(handle).unwrap();
        assert!(
            matches!(conn.phase, Phase::Announced { .. }),
            "queued for accept"
        );
        ns.flush_events();
        assert!(
            app.events()
                .iter()
                .any(|e| matches!(e, Event::NewConn { .. })),
            "the application told"
        );
        // A forged ACK from another port is reset.
        let mut forged = Segment::new(Seq(5001));
        forged.ack = Some(syn_ack.seq + 1u32);
        ns.on_frame(&frame_of(&forged, 40001, 80));
        let (segs, _) = sent(&mut ns);
        assert!(matches!(&segs[..], [(_, r)] if r.flags.rst), "{segs:?}");
    }
}
