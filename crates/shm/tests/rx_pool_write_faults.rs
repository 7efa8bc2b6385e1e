//! A protected application that writes to its receive pool gets SIGSEGV
//! (docs/protected.md, "Memory"). The write happens in a child process (this
//! test binary run again with `GINZA_RX_WRITE_CHILD` set), and the parent
//! asserts the signal that ended it.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

use ginza_shm::netstack::{RxPool, RxPoolView, RX_CHUNK};

const CHILD: &str = "GINZA_RX_WRITE_CHILD";

/// The child: maps an rx pool as an application does (the O_RDONLY
/// descriptor the netstack hands out), then stores through the mapping.
fn child() -> ! {
    let mut rx = RxPool::create("segv-test", 2).unwrap();
    rx.chunk_mut(0).unwrap()[0] = 1;
    let view = RxPoolView::map(rx.app_fd().unwrap(), 2 * u64::from(RX_CHUNK)).unwrap();
    let p = view.base_ptr() as *mut u8;
    // SAFETY: deliberately not safe: a store to a read-only shared mapping,
    // which the kernel must refuse with SIGSEGV (the point of the test).
    // No Rust reference to these bytes is alive.
    unsafe { p.write_volatile(42) };
    // Not reached if the mapping is read-only.
    std::process::exit(0);
}

#[test]
#[cfg_attr(miri, ignore = "needs memfd and a second process")]
fn writing_the_rx_pool_is_sigsegv() {
    if std::env::var_os(CHILD).is_some() {
        child();
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "writing_the_rx_pool_is_sigsegv", "--nocapture"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGSEGV),
        "the child must die of SIGSEGV; status {:?}, stderr {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
