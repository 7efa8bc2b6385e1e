//! The client against a fake iokerneld whose acceptance is wrong: a wake
//! page announced without its descriptor, or slots outside the page, or a
//! descriptor that is no sealed page. Each is refused with a message that
//! says what was wrong; a good one maps the page.

use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ginza_proto::client::{self, ClientError};
use ginza_proto::messages::{encode, Class, Registration, Response};
use ginza_shm::{Region, RegionConfig, WakePage};
use ginza_sys::{eventfd, memfd, socket};

/// A socket path of its own for each case.
fn socket_path(case: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!(
        "ginza-bad-acceptance-{}-{case}.sock",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&p);
    p
}

/// Registers one kthread with a fake iokerneld that answers `reply` with
/// `fds` attached; the client's result.
fn register_against(
    case: &str,
    reply: Response,
    fds: Vec<OwnedFd>,
) -> Result<client::Connection, ClientError> {
    let path = socket_path(case);
    let listener = socket::listen_seqpacket(&path, 1).unwrap();
    let fake = std::thread::spawn(move || {
        let t0 = Instant::now();
        let conn = loop {
            if let Some(c) = socket::accept(listener.as_fd()).unwrap() {
                break c;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "no client came");
            std::thread::yield_now();
        };
        let mut buf = vec![0u8; 8192];
        let t0 = Instant::now();
        while socket::recv_with_fds(conn.as_fd(), &mut buf, 4, true)
            .unwrap()
            .is_none()
        {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "no registration came"
            );
            std::thread::yield_now();
        }
        let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
        // The answer stays queued for the client after this end closes.
        socket::send_with_fds(conn.as_fd(), &encode(&reply), &borrowed).unwrap();
    });
    let region = Region::create(case, &RegionConfig::new(1)).unwrap();
    let efd = eventfd::new().unwrap();
    let reg = Registration {
        wake_page: true,
        bell: false,
        ..Registration::new(case, Class::Batch, 1)
    };
    let r = client::register_region(&path, &reg, &region, &[efd]);
    fake.join().unwrap();
    let _ = std::fs::remove_file(&path);
    r
}

fn accepted(wake_slots: Option<u32>) -> Response {
    Response::Accepted {
        app_id: 1,
        ingress_buffers: 0,
        wake_slots,
        busy_time: None,
    }
}

fn page_fd() -> OwnedFd {
    let page = WakePage::create().unwrap();
    page.fd().try_clone_to_owned().unwrap()
}

#[test]
#[cfg_attr(miri, ignore = "sockets and memfds are not supported by Miri")]
fn a_wake_page_announced_without_its_descriptor_is_refused() {
    let err = register_against("no-fd", accepted(Some(0)), Vec::new()).unwrap_err();
    assert!(matches!(err, ClientError::BadReply(_)), "{err}");
    assert!(err.to_string().contains("descriptors"), "{err}");
}

#[test]
#[cfg_attr(miri, ignore = "sockets and memfds are not supported by Miri")]
fn slots_outside_the_page_are_refused() {
    let err = register_against("far-slot", accepted(Some(u32::MAX)), vec![page_fd()]).unwrap_err();
    assert!(matches!(err, ClientError::WakePage(_)), "{err}");
    assert!(err.to_string().contains("outside the page"), "{err}");
}

#[test]
#[cfg_attr(miri, ignore = "sockets and memfds are not supported by Miri")]
fn a_descriptor_that_is_no_sealed_page_is_refused() {
    let unsealed = memfd::create("not-a-page", 4096).unwrap();
    let err = register_against("unsealed", accepted(Some(0)), vec![unsealed]).unwrap_err();
    assert!(matches!(err, ClientError::WakePage(_)), "{err}");
    assert!(err.to_string().contains("seals"), "{err}");
}

#[test]
#[cfg_attr(miri, ignore = "sockets and memfds are not supported by Miri")]
fn a_good_acceptance_maps_the_page() {
    let mut conn = register_against("good", accepted(Some(256)), vec![page_fd()]).unwrap();
    let (page, first) = conn.take_wake_page().expect("the page");
    assert_eq!(first, 256);
    assert_eq!(page.seen(first), 0);
    assert!(!page.bump(first), "mapped read-only");
}
