//! An application without a runtime: registers with an address and drives
//! its region's packet rings directly. Tests use it to play applications
//! whose every move they control, and `ginza bench forward` to load
//! iokerneld's dataplane with senders and receivers that cost almost
//! nothing, so that iokerneld is what the benchmark measures.

use std::os::fd::OwnedFd;
use std::path::Path;

use ginza_net::{tx, Endpoint, Interface, MacAddr, Packet};
use ginza_shm::{IngressPool, LineFlags, PacketDesc, Region, RegionConfig, RuntimeEnd, ToIokernel};

use ginza_proto::client::{self, ClientError, Connection};
use ginza_proto::messages::{Class, DispatchSpec, Registration};

/// A registered application and the runtime's end of each kthread.
pub struct RawApp {
    /// The shared region (its memfd: tests write garbage through it).
    pub region: Region,
    pub conn: Connection,
    pub ends: Vec<RuntimeEnd>,
    pub pool: IngressPool,
    pub interface: Interface,
    /// Kept for the eventfds' lifetime: iokerneld writes them on grants.
    _eventfds: Vec<OwnedFd>,
}

impl RawApp {
    /// Registers `name` with `interface` and `kthreads` kthreads.
    pub fn register(
        socket: &Path,
        name: &str,
        interface: Interface,
        kthreads: u32,
    ) -> Result<RawApp, ClientError> {
        Self::register_steered(socket, name, interface, kthreads, None)
    }

    /// [`RawApp::register`], asking for the packet steering policy named
    /// `steering` (`None`: iokerneld's configured one).
    pub fn register_steered(
        socket: &Path,
        name: &str,
        interface: Interface,
        kthreads: u32,
        steering: Option<&str>,
    ) -> Result<RawApp, ClientError> {
        let class = Class::LatencyCritical;
        Self::register_class(socket, name, interface, kthreads, steering, None, class)
    }

    /// [`RawApp::register`] as a batch application (`Class::Batch`).
    pub fn register_batch(
        socket: &Path,
        name: &str,
        interface: Interface,
        kthreads: u32,
    ) -> Result<RawApp, ClientError> {
        Self::register_class(socket, name, interface, kthreads, None, None, Class::Batch)
    }

    /// [`RawApp::register`] for an application whose requests iokerneld
    /// dispatches (docs/colocate.md): the test plays its workers.
    pub fn register_dispatched(
        socket: &Path,
        name: &str,
        interface: Interface,
        kthreads: u32,
        dispatch: DispatchSpec,
    ) -> Result<RawApp, ClientError> {
        let (dispatch, class) = (Some(dispatch), Class::LatencyCritical);
        Self::register_class(socket, name, interface, kthreads, None, dispatch, class)
    }

    fn register_class(
        socket: &Path,
        name: &str,
        interface: Interface,
        kthreads: u32,
        steering: Option<&str>,
        dispatch: Option<DispatchSpec>,
        class: Class,
    ) -> Result<RawApp, ClientError> {
        let region = Region::create(name, &RegionConfig::new(kthreads))
            .map_err(|e| ClientError::Local(format!("cannot create the shared region: {e}")))?;
        let eventfds = (0..kthreads)
            .map(|_| ginza_sys::eventfd::new())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ClientError::Local(format!("cannot create an eventfd: {e}")))?;
        let reg = Registration {
            name: name.into(),
            class,
            guaranteed: 0,
            max_cores: kthreads,
            kthreads,
            net: Some(interface),
            steering: steering.map(Into::into),
            dispatch,
            // It polls its rings and reads its eventfds.
            wake_page: false,
            bell: false,
        };
        let mut conn = client::register_region(socket, &reg, &region, &eventfds)?;
        let pool = conn
            .take_ingress_pool()
            .ok_or_else(|| ClientError::IngressPool("accepted without an ingress pool".into()))?;
        let ends = (0..kthreads)
            .map(|k| region.runtime_end(k))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ClientError::Local(e.to_string()))?;
        Ok(RawApp {
            region,
            conn,
            ends,
            pool,
            interface,
            _eventfds: eventfds,
        })
    }

    /// Makes kthread `k` look busy for ever (an item that never leaves its
    /// runqueue), so that iokerneld grants it a core and keeps polling its
    /// egress ring.
    pub fn stay_busy(&self, k: usize) {
        let line = &self.ends[k].line;
        line.set_rq_tail(1);
        line.remove_flags(LineFlags::PARKED);
    }

    /// Tells iokerneld kthread `k` parked: it drains its egress ring once.
    pub fn report_parked(&mut self, k: usize) {
        let _ = self.ends[k].to_iokernel.send(ToIokernel::Parked {
            next_deadline_ns: None,
            grant: ginza_shm::UNNUMBERED_GRANT,
        });
    }

    /// Pops one received frame from kthread `k`'s ring: a copy of its bytes
    /// and its descriptor (give the buffer back with [`give_back`](Self::give_back)).
    pub fn recv(&mut self, k: usize) -> Option<(Vec<u8>, PacketDesc)> {
        let desc = self.ends[k].ingress.pop().ok()??;
        let bytes = self.pool.frame(desc)?.to_vec();
        Some((bytes, desc))
    }

    /// Pops up to `max` descriptors from kthread `k`'s ring and gives their
    /// buffers straight back, without reading them; returns how many.
    pub fn drop_received(&mut self, k: usize, max: usize) -> usize {
        drop_received(&mut self.ends[k], max)
    }

    /// Queues up to `n` copies of a prebuilt frame on kthread `k`'s egress
    /// ring, published together; returns how many fit.
    pub fn send_frames(&mut self, k: usize, frame: &[u8], n: usize) -> usize {
        send_copies(&mut self.ends[k], frame, n)
    }

    pub fn give_back(&mut self, k: usize, buf: u32) {
        let _ = self.ends[k].done.push(buf);
    }

    /// Queues a prebuilt frame on kthread `k`'s egress ring; false if the
    /// ring is full or the frame is longer than a buffer.
    pub fn send_frame(&mut self, k: usize, frame: &[u8]) -> bool {
        self.send_built(k, |buf| {
            let dst = buf.get_mut(..frame.len())?;
            dst.copy_from_slice(frame);
            Some(frame.len())
        })
    }

    /// Queues a UDP datagram on kthread `k`'s egress ring; false if the
    /// ring is full.
    pub fn send_udp(
        &mut self,
        k: usize,
        dst_mac: MacAddr,
        dst: Endpoint,
        src_port: u16,
        payload: &[u8],
    ) -> bool {
        let interface = self.interface;
        self.send_built(k, |buf| {
            tx::udp_datagram(buf, &interface, dst_mac, src_port, dst, payload).ok()
        })
    }

    /// Builds a frame in the egress buffer of kthread `k`'s next slot and
    /// pushes it; false if the ring is full or `build` fails.
    fn send_built(&mut self, k: usize, build: impl FnOnce(&mut [u8]) -> Option<usize>) -> bool {
        let end = &mut self.ends[k];
        if end.egress.free().unwrap_or(0) == 0 {
            return false;
        }
        let seq = end.egress.next_seq();
        let Some(len) = build(end.egress_buffers.buffer_mut(seq)) else {
            return false;
        };
        end.egress
            .push(PacketDesc {
                len: len as u32,
                ..Default::default()
            })
            .is_ok()
    }

    /// Echoes every UDP datagram waiting on any kthread back to its
    /// sender, from the same kthread; returns how many. A datagram is taken
    /// off its ingress ring only while the egress ring has room for its
    /// echo: when iokerneld falls behind, the rest wait on the ingress ring
    /// (where a drop is iokerneld's to count) instead of being lost here.
    pub fn echo_waiting(&mut self) -> u64 {
        let mut echoed = 0;
        for k in 0..self.ends.len() {
            while self.ends[k].egress.free().unwrap_or(0) > 0 {
                let Some((bytes, desc)) = self.recv(k) else {
                    break;
                };
                if let Ok(Packet::Udp(d)) = ginza_net::parse(&bytes, &self.interface) {
                    let (mac, src, port) = (d.src_mac, d.src, d.dst.port);
                    let payload = d.payload.to_vec();
                    echoed += u64::from(self.send_udp(k, mac, src, port, &payload));
                }
                self.give_back(k, desc.buf);
            }
        }
        echoed
    }
}

/// Descriptors or buffer indices handled per ring index store by
/// [`send_copies`] and [`drop_received`] (on the stack: no allocation).
const CHUNK: usize = 64;

/// Pops up to `max` descriptors from `end`'s ingress ring and gives their
/// buffers straight back on its done ring, without reading the frames, in
/// chunks of 64 (one index store per ring and chunk); returns how many.
/// The driver of `ginza bench forward` and of its copy floor.
pub fn drop_received(end: &mut RuntimeEnd, max: usize) -> usize {
    let mut dropped = 0;
    let mut bufs = [0u32; CHUNK];
    while dropped < max {
        let waiting = end.ingress.len().unwrap_or(0) as usize;
        let n = waiting.min(max - dropped).min(CHUNK);
        if n == 0 {
            break;
        }
        for (i, buf) in bufs[..n].iter_mut().enumerate() {
            *buf = end.ingress.peek_nth(i as u32).map_or(0, |(_, d)| d.buf);
        }
        end.ingress.release_n(n as u32);
        // The done ring holds every buffer of the pool: it has room.
        let _ = end.done.push_slice(&bufs[..n]);
        dropped += n;
    }
    dropped
}

/// Queues up to `n` copies of `frame` on `end`'s egress ring, each chunk
/// of 64 published with one index store; returns how many fit (0 for a
/// frame longer than a buffer).
pub fn send_copies(end: &mut RuntimeEnd, frame: &[u8], n: usize) -> usize {
    if frame.len() > ginza_shm::PKT_BUFFER_SIZE as usize {
        return 0;
    }
    let room = (end.egress.free().unwrap_or(0) as usize).min(n);
    let descs = [PacketDesc {
        len: frame.len() as u32,
        ..Default::default()
    }; CHUNK];
    let mut queued = 0;
    while queued < room {
        let chunk = (room - queued).min(CHUNK);
        let first = end.egress.next_seq();
        for i in 0..chunk as u32 {
            end.egress_buffers.buffer_mut(first.wrapping_add(i))[..frame.len()]
                .copy_from_slice(frame);
        }
        let pushed = end.egress.push_slice(&descs[..chunk]).unwrap_or(0);
        queued += pushed;
        if pushed < chunk {
            break;
        }
    }
    queued
}
