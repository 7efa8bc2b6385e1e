//! Two processes share one memfd region: the test re-executes its own binary
//! as the "iokerneld" child, which inherits the memfd. Messages flow both
//! ways at once (kthread 0: parent → child, kthread 1: child → parent), and
//! every one must arrive, in order.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::time::{Duration, Instant};

use ginza_shm::{Region, RegionConfig, SendError, ToIokernel, ToKthread};

const ENV_FD: &str = "GINZA_SHM_TEST_CHILD_FD";
const N: u64 = 300_000;
const LIMIT: Duration = Duration::from_secs(50);

fn send_spin<M: ginza_shm::Message>(tx: &mut ginza_shm::CmdTx<M>, m: M, start: Instant) {
    loop {
        match tx.send(m) {
            Ok(()) => return,
            Err(SendError::Full) => {
                assert!(start.elapsed() < LIMIT, "peer stopped consuming");
                std::thread::yield_now();
            }
            Err(e) => panic!("{e}"),
        }
    }
}

fn recv_spin<M: ginza_shm::Message>(rx: &mut ginza_shm::CmdRx<M>, start: Instant) -> M {
    loop {
        match rx.recv() {
            Ok(Some(m)) => return m,
            Ok(None) => {
                assert!(start.elapsed() < LIMIT, "peer stopped producing");
                std::thread::yield_now();
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// The child half; does nothing unless run by `cross_process_in_order`.
#[test]
#[cfg_attr(miri, ignore = "needs memfd and a second process")]
fn cross_process_child() {
    let Ok(fd) = std::env::var(ENV_FD) else {
        return;
    };
    let fd: i32 = fd.parse().unwrap();
    // SAFETY: the parent passed us this descriptor, open and inherited, and
    // nothing else in this process owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let region = Region::attach(fd).unwrap();
    let start = Instant::now();
    let mut k1 = region.iokernel_end(1).unwrap();
    let sender = std::thread::spawn(move || {
        for i in 0..N {
            send_spin(
                &mut k1.to_kthread,
                ToKthread::Wake {
                    core: (i & 0xffff) as u32,
                    decided_ns: i,
                    grant: (i >> 16) as u16,
                },
                start,
            );
        }
    });
    let mut k0 = region.iokernel_end(0).unwrap();
    for i in 0..N {
        let m = recv_spin(&mut k0.from_kthread, start);
        assert_eq!(
            m,
            ToIokernel::Parked {
                next_deadline_ns: Some(i),
                grant: ginza_shm::UNNUMBERED_GRANT,
            }
        );
    }
    // Published before the last message, so visible after it.
    assert_eq!(k0.line.snapshot().counters.rq_tail, N as u32);
    assert_eq!(k0.from_kthread.recv(), Ok(None));
    sender.join().unwrap();
}

#[test]
#[cfg_attr(miri, ignore = "needs memfd and a second process")]
fn cross_process_in_order() {
    let region = Region::create(
        "ginza-shm-xproc",
        &RegionConfig {
            n_kthreads: 2,
            up_capacity: 64,
            down_capacity: 64,
            ..RegionConfig::new(1)
        },
    )
    .unwrap();
    // An inheritable duplicate of the memfd for the child.
    let dup = region.fd().unwrap().try_clone_to_owned().unwrap();
    // SAFETY: plain fcntl on a descriptor we own; clears FD_CLOEXEC.
    assert_eq!(unsafe { libc::fcntl(dup.as_raw_fd(), libc::F_SETFD, 0) }, 0);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "cross_process_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ENV_FD, dup.as_raw_fd().to_string())
        .spawn()
        .unwrap();
    drop(dup);

    let start = Instant::now();
    let mut k0 = region.runtime_end(0).unwrap();
    let producer = std::thread::spawn(move || {
        for i in 0..N {
            if i == N - 1 {
                k0.line.set_rq_tail(N as u32);
            }
            send_spin(
                &mut k0.to_iokernel,
                ToIokernel::Parked {
                    next_deadline_ns: Some(i),
                    grant: ginza_shm::UNNUMBERED_GRANT,
                },
                start,
            );
        }
    });
    let mut k1 = region.runtime_end(1).unwrap();
    let mut got = 0u64;
    let status = loop {
        match k1.from_iokernel.recv() {
            Ok(Some(m)) => {
                assert_eq!(
                    m,
                    ToKthread::Wake {
                        core: (got & 0xffff) as u32,
                        decided_ns: got,
                        grant: (got >> 16) as u16,
                    }
                );
                got += 1;
            }
            Ok(None) => {
                if let Some(st) = child.try_wait().unwrap() {
                    // Drain what the child left before exiting.
                    while let Some(m) = k1.from_iokernel.recv().unwrap() {
                        assert_eq!(
                            m,
                            ToKthread::Wake {
                                core: (got & 0xffff) as u32,
                                decided_ns: got,
                                grant: (got >> 16) as u16,
                            }
                        );
                        got += 1;
                    }
                    break st;
                }
                if start.elapsed() > LIMIT {
                    let _ = child.kill();
                    panic!("child timed out after {got} messages");
                }
                std::thread::yield_now();
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert!(status.success(), "child failed: {status}");
    assert_eq!(got, N);
    producer.join().unwrap();
}
