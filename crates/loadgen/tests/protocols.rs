//! Request encoders and response parsers: memcached answers (whole, split
//! at every byte, pipelined, errors), HTTP answers framed by
//! Content-Length, the spin header round trip, echo checks.

use std::time::Duration;

use ginza_loadgen::protocol::echo::Echo;
use ginza_loadgen::protocol::http::{parse_response, Http};
use ginza_loadgen::protocol::memcached::{self, Memcached, Mix};
use ginza_loadgen::protocol::spin::{ServiceTime, Spin};
use ginza_loadgen::protocol::{Parsed, Transport, Workload};
use ginza_proto::RequestHeader;
use rand::rngs::SmallRng;
use rand::SeedableRng;

fn done(consumed: usize, ok: bool) -> Parsed {
    Parsed::Done { consumed, ok }
}

/// Every proper prefix of `whole` is incomplete; `whole` parses as `expect`.
fn check_prefixes(parse: impl Fn(&[u8]) -> Parsed, whole: &[u8], expect: Parsed) {
    for cut in 0..whole.len() {
        assert_eq!(
            parse(&whole[..cut]),
            Parsed::Incomplete,
            "prefix of {cut} bytes of {:?}",
            String::from_utf8_lossy(whole)
        );
    }
    assert_eq!(parse(whole), expect);
}

#[test]
fn memcached_answers_parse_whole_and_in_pieces() {
    let hit = b"VALUE usr:0000000000000001 0 2\r\nab\r\nEND\r\n";
    check_prefixes(memcached::parse_response, hit, done(hit.len(), true));
    check_prefixes(memcached::parse_response, b"END\r\n", done(5, true));
    check_prefixes(memcached::parse_response, b"STORED\r\n", done(8, true));
    // A value may contain what looks like the end of the answer: its
    // length decides.
    let tricky = b"VALUE k 5 7 99\r\nEND\r\n\r\n\r\nEND\r\n";
    check_prefixes(memcached::parse_response, tricky, done(tricky.len(), true));
    // Several values (a multi-key get), then pipelined answers.
    let two = b"VALUE a 0 1\r\nx\r\nVALUE b 0 2\r\nyz\r\nEND\r\nSTORED\r\n";
    assert_eq!(memcached::parse_response(two), done(two.len() - 8, true));
    assert_eq!(
        memcached::parse_response(&two[two.len() - 8..]),
        done(8, true)
    );
    // Error answers are answers, not good ones.
    for e in [
        &b"ERROR\r\n"[..],
        b"SERVER_ERROR out of memory storing object\r\n",
        b"CLIENT_ERROR bad data chunk\r\n",
    ] {
        assert_eq!(memcached::parse_response(e), done(e.len(), false));
    }
    assert!(matches!(
        memcached::parse_response(b"HTTP/1.1 200 OK\r\n"),
        Parsed::Invalid(_)
    ));
    assert!(matches!(
        memcached::parse_response(b"VALUE k 0 zz\r\n"),
        Parsed::Invalid(_)
    ));
    assert!(matches!(
        memcached::parse_response(b"VALUE k 0 1\r\nxyEND\r\n"),
        Parsed::Invalid(_)
    ));
    // A line that never ends is not waited for forever.
    assert!(matches!(
        memcached::parse_response(&[b'a'; 5000]),
        Parsed::Invalid(_)
    ));
}

#[test]
fn memcached_requests_follow_the_mix_and_udp_frames_carry_the_id() {
    let m = Memcached {
        mix: Mix::Usr,
        keys: 1000,
        preload: true,
    };
    assert_eq!(m.key(7).len(), 20);
    let w = Workload::Memcached(m.clone());
    let mut rng = SmallRng::seed_from_u64(1);
    let (mut gets, n) = (0, 100_000);
    for seq in 0..n {
        let mut out = Vec::new();
        let p = w.encode(Transport::Tcp, seq, 0, &mut rng, &mut out);
        let text = String::from_utf8(out).unwrap();
        if p.class == memcached::GET {
            gets += 1;
            assert!(
                text.starts_with("get usr:") && text.ends_with("\r\n"),
                "{text}"
            );
        } else {
            assert!(text.starts_with("set usr:"), "{text}");
            assert!(
                text.ends_with(" 0 0 2\r\n") || text.contains(" 0 0 2\r\n"),
                "{text}"
            );
        }
    }
    // 99.8 % gets: 200 sets expected, σ ≈ 14.
    let sets = n - gets;
    assert!((130..=270).contains(&sets), "{sets} sets of {n}");
    // UDP: the frame header, request id = seq mod 2^16, one datagram.
    let mut out = Vec::new();
    let p = w.encode(Transport::Udp, 0x1_0005, 0, &mut rng, &mut out);
    assert_eq!(p.id, 5);
    assert_eq!(&out[..8], &[0, 5, 0, 0, 0, 1, 0, 0]);
    assert_eq!(memcached::udp_id(&out), Some(5));
    let mut answer = vec![0, 5, 0, 0, 0, 1, 0, 0];
    answer.extend_from_slice(b"END\r\n");
    assert_eq!(
        w.parse(Transport::Udp, &p, &answer),
        done(answer.len(), true)
    );
    // ETC: fewer gets, keys of several lengths, values up to 1 KiB.
    let etc = Memcached {
        mix: Mix::Etc,
        keys: 1000,
        preload: true,
    };
    let lens: std::collections::BTreeSet<usize> = (0..1000).map(|i| etc.key(i).len()).collect();
    assert!(lens.len() > 10 && *lens.first().unwrap() >= 20 && *lens.last().unwrap() <= 44);
    assert!((0.96..0.975).contains(&Mix::Etc.get_ratio()));
}

#[test]
fn memcached_preload_sets_every_key_and_reads_each_answer() {
    // A stream that answers STORED to every set it is given, in pieces.
    struct Fake {
        written: Vec<u8>,
        answers: Vec<u8>,
    }
    impl std::io::Write for Fake {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.written.extend_from_slice(b);
            let sets = b.windows(4).filter(|w| w == b"set ").count();
            for _ in 0..sets {
                self.answers.extend_from_slice(b"STORED\r\n");
            }
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    impl std::io::Read for Fake {
        fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
            // Three bytes at a time: partial answers.
            let n = self.answers.len().min(b.len()).min(3);
            b[..n].copy_from_slice(&self.answers[..n]);
            self.answers.drain(..n);
            Ok(n)
        }
    }
    let m = Memcached {
        mix: Mix::Usr,
        keys: 1000,
        preload: true,
    };
    let mut fake = Fake {
        written: Vec::new(),
        answers: Vec::new(),
    };
    assert_eq!(m.preload_on(&mut fake, 64).unwrap(), 1000);
    let text = String::from_utf8(fake.written).unwrap();
    assert_eq!(text.matches("set ").count(), 1000);
    assert!(text.contains(&format!("set {} 0 0 2\r\n", m.key(999))));
}

#[test]
fn http_answers_are_framed_by_content_length() {
    let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nServer: x\r\n\r\nhello";
    check_prefixes(parse_response, ok, done(ok.len(), true));
    let mut two = ok.to_vec();
    two.extend_from_slice(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n");
    assert_eq!(parse_response(&two), done(ok.len(), true));
    assert_eq!(
        parse_response(&two[ok.len()..]),
        done(two.len() - ok.len(), false)
    );
    assert_eq!(
        parse_response(b"HTTP/1.1 304 Not Modified\r\n\r\n"),
        done(29, true)
    );
    assert!(matches!(
        parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"),
        Parsed::Invalid(_)
    ));
    assert!(matches!(
        parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: many\r\n\r\n"),
        Parsed::Invalid(_)
    ));
    assert!(matches!(
        parse_response(b"HTTP/1.1 200 OK\r\n\r\n"),
        Parsed::Invalid(_)
    ));
    assert!(matches!(
        parse_response(b"\x00\x01garbage\r\n\r\n"),
        Parsed::Invalid(_)
    ));
    let h = Http::new("/bytes/64", "10.0.0.1").unwrap();
    let mut out = Vec::new();
    h.encode(1, &mut out);
    assert_eq!(out, b"GET /bytes/64 HTTP/1.1\r\nHost: 10.0.0.1\r\n\r\n");
    assert!(Http::new("no-slash", "h").is_err());
    assert!(Http::new("/a b", "h").is_err());
    assert!(Workload::Http(h).check(Transport::Udp).is_err());
}

#[test]
fn spin_requests_carry_the_header_spin_server_reads() {
    let w = Workload::Spin(Spin {
        service: ServiceTime::Fixed(Duration::from_micros(25)),
        size: 64,
    });
    let mut rng = SmallRng::seed_from_u64(1);
    let mut out = Vec::new();
    let p = w.encode(Transport::Udp, 42, 123_456_789, &mut rng, &mut out);
    assert_eq!(out.len(), 64);
    let h = RequestHeader::decode(&out).unwrap();
    assert_eq!(
        h,
        RequestHeader {
            seq: 42,
            send_ns: 123_456_789,
            service_ns: 25_000
        }
    );
    assert_eq!(p.id, 42);
    // spin-server echoes the payload: that is the answer.
    assert_eq!(w.udp_id(&out), Some(42));
    assert_eq!(w.parse(Transport::Udp, &p, &out), done(64, true));
    // Bimodal service times: two classes in the asked proportion.
    let b = ServiceTime::parse("bimodal:0.9:5us:500us").unwrap();
    let w = Workload::Spin(Spin {
        service: b,
        size: 24,
    });
    assert_eq!(w.classes(), vec!["short", "long"]);
    let mut long = 0;
    for seq in 0..10_000 {
        out.clear();
        let p = w.encode(Transport::Udp, seq, 0, &mut rng, &mut out);
        let h = RequestHeader::decode(&out).unwrap();
        if p.class == 1 {
            long += 1;
            assert_eq!(h.service_ns, 500_000);
        } else {
            assert_eq!(h.service_ns, 5_000);
        }
    }
    assert!((850..1150).contains(&long), "{long} long requests of 10000");
    assert_eq!(
        ServiceTime::parse("exp:10us").unwrap(),
        ServiceTime::Exponential(Duration::from_micros(10))
    );
    assert!(ServiceTime::parse("bimodal:2:1us:2us").is_err());
    assert!(ServiceTime::parse("gauss:5us").is_err());
    // The header does not fit in fewer than 24 bytes.
    let small = Workload::Spin(Spin {
        service: ServiceTime::Fixed(Duration::ZERO),
        size: 10,
    });
    assert!(small.check(Transport::Udp).is_err());
}

#[test]
fn an_echo_is_checked_against_its_request() {
    let w = Workload::Echo(Echo { size: 16 });
    let mut rng = SmallRng::seed_from_u64(1);
    let mut out = Vec::new();
    let p = w.encode(Transport::Tcp, 9, 0, &mut rng, &mut out);
    check_prefixes(|b| w.parse(Transport::Tcp, &p, b), &out, done(16, true));
    let mut other = out.clone();
    other[7] ^= 1;
    assert_eq!(w.parse(Transport::Tcp, &p, &other), done(16, false));
    assert!(Workload::Echo(Echo { size: 4 })
        .check(Transport::Udp)
        .is_err());
    assert!(Workload::Echo(Echo { size: 9000 })
        .check(Transport::Udp)
        .is_err());
    assert!(Workload::Echo(Echo { size: 9000 })
        .check(Transport::Tcp)
        .is_ok());
}
