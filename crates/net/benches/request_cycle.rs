//! The server's side of one small request on an established connection,
//! in the sans-IO TCP: the request's segment in, its bytes read, the reply
//! written and its segment out (with the connection's next deadline, which
//! the runtime reads to arm its timer). That is the TCP part of what a
//! Ginza runtime does for each memcached request (docs/results.md,
//! "Session 40").
//!
//! Measured hot (cycle after cycle, as in a back-to-back ping-pong) and
//! after the caches were swept between cycles, as a batch job, the kernel
//! and the rest of the runtime sweep them between requests at low load:
//! once with a buffer twice the size of this VM's L2 (the connection's
//! lines then come from L3), once with one four times its L3, and once
//! with that and then another connection's request served (the code warm
//! again, the connection's data still cold). The client's side and the
//! sweep are outside the timed part.

use std::hint::black_box;
use std::time::{Duration, Instant as WallClock};

use criterion::{criterion_group, criterion_main, Criterion};
use ginza_net::tcp::testing::{CLIENT, SERVER};
use ginza_net::tcp::{Connection, Instant, Segment, Seq, State, TcpConfig};

/// A memcached `get` and its hit, 32-byte value.
const REQUEST: &[u8] = b"get key:00000000000000001234\r\n";
const REPLY: &[u8] =
    b"VALUE key:00000000000000001234 0 32\r\n0123456789abcdef0123456789abcdef\r\nEND\r\n";

/// The time between two requests on the connection (10k requests/s on
/// one connection of ten).
const GAP: Duration = Duration::from_micros(1_000);

/// A segment as it leaves a connection: its header and a copy of its
/// payload (the connection's buffer is borrowed only until the next call).
type Owned = (Segment<'static>, Vec<u8>);

/// The segment `owned` holds, to hand to `on_segment`.
fn view((header, payload): &Owned) -> Segment<'_> {
    Segment { payload, ..*header }
}

struct Pair {
    client: Connection,
    server: Connection,
    now: Instant,
    read: Vec<u8>,
}

/// Moves everything `from` has to send now into `to`; how many segments.
fn deliver(from: &mut Connection, to: &mut Connection, now: Instant) -> usize {
    let mut n = 0;
    while let Some(segment) = from.poll_transmit(now) {
        let owned = segment.to_owned_payload();
        to.on_segment(&view(&owned), now);
        n += 1;
    }
    n
}

impl Pair {
    fn established() -> Pair {
        let config = TcpConfig::default();
        let now = Instant::from_nanos(1_000_000_000);
        let mut client = Connection::connect(&config, CLIENT, SERVER, Seq(1_000), now);
        let syn = client
            .poll_transmit(now)
            .expect("the SYN")
            .to_owned_payload()
            .0;
        let mut server = Connection::accept(&config, SERVER, CLIENT, &syn, Seq(500_000), now);
        while deliver(&mut server, &mut client, now) + deliver(&mut client, &mut server, now) > 0 {}
        assert_eq!(
            (client.state(), server.state()),
            (State::Established, State::Established)
        );
        Pair {
            client,
            server,
            now,
            read: vec![0; 4096],
        }
    }

    /// The next request's segment, as the client sends it (not timed).
    fn request(&mut self) -> Owned {
        self.now = Instant::from_nanos(self.now.as_nanos() + GAP.as_nanos() as u64);
        self.client.send(REQUEST).expect("the client's send");
        let segment = self
            .client
            .poll_transmit(self.now)
            .expect("the request's segment");
        segment.to_owned_payload()
    }

    /// The server's side of one request: what is timed. The reply's
    /// segment is copied out, as the runtime copies it into its frame.
    fn serve(&mut self, request: &Segment<'_>) -> Owned {
        let now = self.now;
        self.server.on_segment(request, now);
        black_box(self.server.take_events());
        let n = self.server.recv(&mut self.read).expect("the server's read");
        assert_eq!(&self.read[..n], REQUEST);
        self.server.send(REPLY).expect("the server's send");
        let reply = self
            .server
            .poll_transmit(now)
            .expect("the reply's segment")
            .to_owned_payload();
        black_box(self.server.next_deadline());
        reply
    }

    /// The client takes the reply (not timed); its ACK rides on the next
    /// request, as memcached's clients' do.
    fn answer(&mut self, reply: Owned) {
        self.client.on_segment(&view(&reply), self.now);
        let n = self.client.recv(&mut self.read).expect("the client's read");
        assert_eq!(&self.read[..n], REPLY);
    }

    /// `iters` cycles with `between(i)` run after each request is sent and
    /// before the server takes it; the time the server's side took.
    fn cycles(&mut self, iters: u64, mut between: impl FnMut(u64)) -> Duration {
        let mut spent = Duration::ZERO;
        for i in 0..iters {
            let request = self.request();
            between(i);
            let t0 = WallClock::now();
            let reply = self.serve(&view(&request));
            spent += t0.elapsed();
            self.answer(reply);
        }
        spent
    }
}

/// Writes a line of every 64 bytes of `sweep`: evicts what the caches held.
fn sweep_caches(sweep: &mut [u8], round: u8) {
    for line in sweep.chunks_mut(64) {
        line[0] = round;
    }
    black_box(sweep);
}

fn request_cycle(c: &mut Criterion) {
    let mut group = c.benchmark_group("tcp_server_request");
    group.bench_function("hot", |b| {
        let mut pair = Pair::established();
        b.iter_custom(|iters| pair.cycles(iters, |_| {}))
    });
    // The buffers: twice this VM's L2 (1 MiB for its two cores' 512 KiB
    // each), four times its L3 (8 MiB).
    group.sample_size(20);
    for (name, bytes) in [
        ("after_l2_sweep", 2usize << 20),
        ("after_l3_sweep", 32 << 20),
    ] {
        let mut sweep = vec![0u8; bytes];
        group.bench_function(name, |b| {
            let mut pair = Pair::established();
            b.iter_custom(|iters| pair.cycles(iters, |i| sweep_caches(&mut sweep, i as u8)))
        });
    }
    // The code warm, the data cold: after the sweep another connection
    // serves a request (same code, its own data), then the timed one.
    let mut sweep = vec![0u8; 32 << 20];
    group.bench_function("after_l3_sweep_code_warm", |b| {
        let (mut pair, mut other) = (Pair::established(), Pair::established());
        b.iter_custom(|iters| {
            pair.cycles(iters, |i| {
                sweep_caches(&mut sweep, i as u8);
                other.cycles(1, |_| {});
            })
        })
    });
    group.finish();
}

criterion_group!(benches, request_cycle);
criterion_main!(benches);
