//! The attach handshake over the real unix socket: what an application
//! gets (a channel that works, an rx pool it can only read), what is
//! refused, and that hanging up detaches it.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use ginza_netstack::server::{lock, Server, ServerConfig};
use ginza_proto::netstack::{
    attach, AttachError, AttachRequest, Command, Event, NETSTACK_PROTOCOL,
};
use ginza_shm::netstack::{Channel, RxPoolView, TxPool};

fn server(dir: &tempfile::TempDir) -> (Server, Arc<Mutex<ginza_netstack::Netstack>>) {
    let cfg = ServerConfig {
        path: dir.path().join("netstack.sock"),
        interface: app_iface(),
        other_addresses: false,
    };
    let mut ns = netstack();
    ns.add_address(app_iface());
    (Server::bind(cfg).unwrap(), Arc::new(Mutex::new(ns)))
}

fn request(ip: std::net::Ipv4Addr) -> AttachRequest {
    AttachRequest {
        protocol: NETSTACK_PROTOCOL,
        name: "t".into(),
        interface: ginza_net::Interface { mac: APP_MAC, ip },
        kthreads: 2,
        doorbells: false,
    }
}

/// Runs the server until `f` (on another thread) is done.
fn with_server<R: Send + 'static>(
    srv: &mut Server,
    ns: &Arc<Mutex<ginza_netstack::Netstack>>,
    f: impl FnOnce() -> R + Send + 'static,
) -> R {
    let h = std::thread::spawn(f);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !h.is_finished() {
        srv.poll(ns, Duration::from_millis(5));
        assert!(Instant::now() < deadline, "client did not finish");
    }
    h.join().unwrap()
}

#[test]
fn attach_gives_a_working_channel_and_a_read_only_rx_pool() {
    let dir = tempfile::tempdir().unwrap();
    let (mut srv, ns) = server(&dir);
    let path = srv.path().to_path_buf();
    let tx = TxPool::create("tx", 1 << 16).unwrap();
    let tx_fd = tx.fd().try_clone_to_owned().unwrap();
    let p = path.clone();
    let att = with_server(&mut srv, &ns, move || {
        attach(
            &p,
            &request(std::net::Ipv4Addr::UNSPECIFIED),
            tx_fd.as_fd_ref(),
            &[],
        )
    })
    .unwrap();
    assert_eq!(att.pairs, 2);
    assert_eq!(srv.attached(), 1);
    // The rx pool descriptor is read-only: no writable mapping.
    assert!(ginza_sys::memfd::is_read_only(att.rx_pool.as_fd_ref()).unwrap());
    assert!(ginza_sys::memfd::map(att.rx_pool.as_fd_ref(), att.rx_pool_bytes as usize).is_err());
    let _rx = RxPoolView::map(att.rx_pool, att.rx_pool_bytes).unwrap();
    let ch = Channel::attach(att.channel).unwrap();
    let mut pair = ch.app_pair(1).unwrap();
    pair.commands
        .push(
            Command::Listen {
                cookie: 3,
                port: 99,
                backlog: 4,
            }
            .encode(),
        )
        .unwrap();
    lock(&ns).poll();
    let ev = Event::decode(&pair.events.pop().unwrap().unwrap()).unwrap();
    assert!(matches!(ev, Event::Listening { cookie: 3, .. }), "{ev:?}");
    // Hanging up detaches.
    drop(att.socket);
    let deadline = Instant::now() + Duration::from_secs(5);
    while srv.attached() > 0 {
        srv.poll(&ns, Duration::from_millis(5));
        assert!(Instant::now() < deadline);
    }
    assert!(lock(&ns).app_ids().is_empty());
}

#[test]
fn attach_refusals_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let (mut srv, ns) = server(&dir);
    let path = srv.path().to_path_buf();
    let tx = TxPool::create("tx", 1 << 16).unwrap();
    // Another address than the netstack's.
    let (p, fd) = (path.clone(), tx.fd().try_clone_to_owned().unwrap());
    let e = with_server(&mut srv, &ns, move || {
        attach(
            &p,
            &request(std::net::Ipv4Addr::new(10, 9, 9, 9)),
            fd.as_fd_ref(),
            &[],
        )
    })
    .unwrap_err();
    assert!(
        matches!(&e, AttachError::Refused(r) if r.contains("its own address")),
        "{e}"
    );
    // A tx pool that is not sealed.
    let plain = ginza_sys::memfd::create("plain", 4096).unwrap();
    let p = path.clone();
    let e = with_server(&mut srv, &ns, move || {
        attach(&p, &request(APP_IP), plain.as_fd_ref(), &[])
    })
    .unwrap_err();
    assert!(
        matches!(&e, AttachError::Refused(r) if r.contains("tx pool refused")),
        "{e}"
    );
    // A wrong protocol version.
    let (p, fd) = (path.clone(), tx.fd().try_clone_to_owned().unwrap());
    let e = with_server(&mut srv, &ns, move || {
        let mut r = request(APP_IP);
        r.protocol = 99;
        attach(&p, &r, fd.as_fd_ref(), &[])
    })
    .unwrap_err();
    assert!(
        matches!(&e, AttachError::Refused(r) if r.contains("protocol 99")),
        "{e}"
    );
    assert_eq!(srv.attached(), 0);
}

trait AsFdRef {
    fn as_fd_ref(&self) -> std::os::fd::BorrowedFd<'_>;
}

impl AsFdRef for std::os::fd::OwnedFd {
    fn as_fd_ref(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(self)
    }
}
