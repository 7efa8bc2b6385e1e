//! A SYN flood from spoofed addresses: raw IPv4 packets (`IP_HDRINCL`)
//! sent from the namespace to a Ginza server. Each SYN comes from a random
//! address of 198.18.0.0/15 (the benchmarking range, owned by nobody
//! here) and a random port, so the server's SYN-ACKs reach no socket (the
//! namespace does not forward) and every handshake stays half-open, as
//! under a real flood. Run it on a thread in the namespace.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A tiny xorshift generator: the flood needs spread, not quality.
struct Spread(u64);

impl Spread {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// The ones' complement sum of `data` folded into 16 bits, started at
/// `sum`.
fn ones_complement(mut sum: u32, data: &[u8]) -> u32 {
    for pair in data.chunks(2) {
        let word = u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]);
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum
}

/// An IPv4 packet carrying a bare SYN from `src` to `dst` (the kernel fills
/// in the IP header's checksum).
fn syn_packet(src: SocketAddrV4, dst: SocketAddrV4, seq: u32) -> [u8; 40] {
    let mut p = [0u8; 40];
    p[0] = 0x45; // IPv4, 5 words
    p[2..4].copy_from_slice(&40u16.to_be_bytes());
    p[6] = 0x40; // don't fragment
    p[8] = 64; // TTL
    p[9] = libc::IPPROTO_TCP as u8;
    p[12..16].copy_from_slice(&src.ip().octets());
    p[16..20].copy_from_slice(&dst.ip().octets());
    let t = &mut p[20..];
    t[0..2].copy_from_slice(&src.port().to_be_bytes());
    t[2..4].copy_from_slice(&dst.port().to_be_bytes());
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[12] = 5 << 4; // data offset: 5 words
    t[13] = 0x02; // SYN
    t[14..16].copy_from_slice(&64240u16.to_be_bytes());
    let mut pseudo = [0u8; 12];
    pseudo[0..4].copy_from_slice(&src.ip().octets());
    pseudo[4..8].copy_from_slice(&dst.ip().octets());
    pseudo[9] = libc::IPPROTO_TCP as u8;
    pseudo[10..12].copy_from_slice(&20u16.to_be_bytes());
    let sum = ones_complement(ones_complement(0, &pseudo), t);
    t[16..18].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    p
}

/// Sends `count` SYNs to `to` from spoofed addresses, as fast as the
/// socket takes them or at `per_second` (paced in batches of 64); the
/// number sent (a full socket buffer drops some, as a real flood's excess
/// is dropped).
pub fn flood(
    to: SocketAddrV4,
    count: usize,
    per_second: Option<u32>,
    seed: u64,
) -> io::Result<usize> {
    // SAFETY: a new raw socket; no pointers.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let dst = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(*to.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    let mut rng = Spread(seed | 1);
    let mut sent = 0;
    let start = std::time::Instant::now();
    for i in 0..count {
        if let Some(rate) = per_second.filter(|_| i % 64 == 0) {
            // A load generator's pacing, not a wait for a condition.
            let due = start + std::time::Duration::from_secs_f64(i as f64 / f64::from(rate));
            std::thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
        }
        let r = rng.next();
        let ip = Ipv4Addr::from(0xc612_0000u32 | (r as u32 & 0x1_ffff)); // 198.18.0.0/15
        let port = 1024 + ((r >> 20) as u16 % (u16::MAX - 1024));
        let p = syn_packet(SocketAddrV4::new(ip, port), to, (r >> 32) as u32);
        // SAFETY: a packet of ours and the destination above.
        let n = unsafe {
            libc::sendto(
                fd,
                p.as_ptr().cast(),
                p.len(),
                0,
                (&dst as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        if n == p.len() as isize {
            sent += 1;
        }
    }
    // SAFETY: our socket.
    unsafe { libc::close(fd) };
    Ok(sent)
}

/// Whether `ip` is one the flood spoofs.
fn spoofed(ip: Ipv4Addr) -> bool {
    u32::from(ip) & 0xfffe_0000 == 0xc612_0000
}

/// Counts the SYN-ACKs `server` sends to spoofed addresses, seen on the
/// namespace's interface `ifname`, until `stop`: the proof that the flood's
/// SYNs reached the server and each opened a half-open connection. Also
/// the other segments it sent them (a reset, say), for a failure's message.
pub fn count_syn_acks(
    ifname: &str,
    server: SocketAddrV4,
    stop: Arc<AtomicBool>,
) -> io::Result<(usize, usize)> {
    let proto = (libc::ETH_P_IP as u16).to_be();
    // SAFETY: a new packet socket; no pointers.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM, i32::from(proto)) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let name = std::ffi::CString::new(ifname).expect("an interface name");
    // SAFETY: a NUL-terminated name.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    // SAFETY: zeroed is a valid sockaddr_ll before filling it in.
    let mut at: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    at.sll_family = libc::AF_PACKET as u16;
    at.sll_protocol = proto;
    at.sll_ifindex = index as i32;
    let timeout = libc::timeval {
        tv_sec: 0,
        tv_usec: 100_000,
    };
    // SAFETY: our socket, a valid address and option.
    let bad = unsafe {
        libc::bind(
            fd,
            (&at as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        ) != 0
            || libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&timeout as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            ) != 0
    };
    if bad {
        let e = io::Error::last_os_error();
        // SAFETY: our socket.
        unsafe { libc::close(fd) };
        return Err(e);
    }
    let (mut seen, mut others) = (0, 0);
    let mut buf = [0u8; 2048];
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: our socket and buffer.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 40 {
            continue;
        }
        let p = &buf[..n as usize];
        let ihl = usize::from(p[0] & 0x0f) * 4;
        if p[9] != libc::IPPROTO_TCP as u8 || p.len() < ihl + 20 {
            continue;
        }
        let src = Ipv4Addr::new(p[12], p[13], p[14], p[15]);
        let dst = Ipv4Addr::new(p[16], p[17], p[18], p[19]);
        let t = &p[ihl..];
        let port = u16::from_be_bytes([t[0], t[1]]);
        let syn_ack = t[13] & 0x12 == 0x12;
        if src == *server.ip() && port == server.port() && spoofed(dst) {
            if syn_ack {
                seen += 1;
            } else {
                others += 1;
            }
        }
    }
    // SAFETY: our socket.
    unsafe { libc::close(fd) };
    Ok((seen, others))
}
