//! The kernel half of an epoll set, watched for as long as the set lives
//! (`epoll.rs`): one thread per set with kernel descriptors in it, asleep
//! in `poll` on the kernel instance until one of them is ready, then
//! waking the set's `Poller` and waiting to be armed again.
//!
//! Why not a watch per wait (`kwatch.rs`, what `poll` and `select` use):
//! a server such as memcached keeps a kernel descriptor (its notify pipe)
//! in the same set as its Ginza sockets, and waits on the set once per
//! request or two. A watch per wait hands a job to the blocking pool and
//! cancels it through an eventfd on every such wait: two wake-ups of a
//! kernel thread (on the server's own CPU) and three system calls per
//! request, while the pipe stays quiet. Here a quiet kernel half costs
//! nothing per wait: the thread stays in its `poll` across waits, and is
//! armed again only after it fired.
//!
//! Arming: the program thread arms the watcher only after it looked at
//! the kernel instance and found nothing, just before it parks; the
//! watcher fires (sets `fired`, wakes the poller) and then waits for the
//! next arming, so a level-triggered descriptor the program leaves ready
//! does not make it spin.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;

use ginza_runtime::net::PollWaker;
use libc::c_int;

use crate::mode::real;

struct State {
    /// The watcher's own copy of the kernel instance's descriptor (the
    /// program may close, and reuse, its number while the thread polls).
    epfd: c_int,
    /// Arms the thread again, or stops it.
    efd: c_int,
    /// The thread saw the instance ready and has not been armed since.
    fired: AtomicBool,
    stop: AtomicBool,
}

impl State {
    fn signal(&self) {
        let write = real!(write: unsafe extern "C" fn(c_int, *const libc::c_void, usize) -> isize);
        let one = 1u64;
        // SAFETY: writes 8 bytes to our eventfd.
        unsafe { write(self.efd, (&one as *const u64).cast(), 8) };
    }

    fn drain(&self) {
        let read = real!(read: unsafe extern "C" fn(c_int, *mut libc::c_void, usize) -> isize);
        let mut count = 0u64;
        // SAFETY: reads 8 bytes of our non-blocking eventfd into `count`.
        unsafe { read(self.efd, (&mut count as *mut u64).cast(), 8) };
    }
}

impl Drop for State {
    fn drop(&mut self) {
        // SAFETY: closes the two descriptors this state owns (by system
        // call: the library's `close` would look them up as the program's).
        unsafe {
            libc::syscall(libc::SYS_close, self.epfd);
            libc::syscall(libc::SYS_close, self.efd);
        }
    }
}

/// A set's watcher; dropping it stops the thread.
pub(crate) struct EpollWatcher {
    state: Arc<State>,
}

impl EpollWatcher {
    /// Starts watching kernel instance `epfd`, waking `waker` when it is
    /// ready; `None` when no descriptor or thread could be had (the caller
    /// then watches per wait). Runtime code (it starts a thread).
    pub(crate) fn start(epfd: c_int, waker: PollWaker) -> Option<EpollWatcher> {
        // SAFETY: duplicates a descriptor number (by system call: the
        // library's `fcntl` would give the copy the program's epoll set).
        let own = unsafe { libc::syscall(libc::SYS_fcntl, epfd, libc::F_DUPFD_CLOEXEC, 0) };
        if own < 0 {
            return None;
        }
        let own = own as c_int;
        // SAFETY: a new eventfd; no pointers.
        let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if efd < 0 {
            // SAFETY: our copy, not shared yet.
            unsafe { libc::syscall(libc::SYS_close, own) };
            return None;
        }
        let state = Arc::new(State {
            epfd: own,
            efd,
            fired: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        });
        let theirs = Arc::clone(&state);
        std::thread::Builder::new()
            .name("ginza-epwatch".into())
            // Room for the runtime's wake-up path (as the blocking pool's).
            .stack_size(256 << 10)
            .spawn(move || {
                ginza_runtime::foreign_tls::mark_runtime_thread();
                watch(&theirs, &waker);
            })
            .ok()?;
        Some(EpollWatcher { state })
    }

    /// Whether the watcher saw the kernel instance ready since it was last
    /// armed (then the instance may hold events; else it held none when
    /// armed, and one that came since wakes the waiter).
    pub(crate) fn fired(&self) -> bool {
        self.state.fired.load(SeqCst)
    }

    /// Called by a program thread about to park, which has just found the
    /// kernel instance empty: arms the watcher again if it fired since it
    /// was last armed (one eventfd write); else nothing.
    pub(crate) fn arm(&self) {
        if self.state.fired.swap(false, SeqCst) {
            self.state.signal();
        }
    }
}

impl Drop for EpollWatcher {
    fn drop(&mut self) {
        self.state.stop.store(true, SeqCst);
        self.state.signal();
    }
}

/// The watcher thread: polls the instance while armed, the eventfd always.
fn watch(state: &State, waker: &PollWaker) {
    let poll = real!(poll: unsafe extern "C" fn(*mut libc::pollfd, libc::nfds_t, c_int) -> c_int);
    let mut fds = [
        libc::pollfd {
            fd: state.efd,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: state.epfd,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    while !state.stop.load(SeqCst) {
        let armed = !state.fired.load(SeqCst);
        let n = if armed { 2 } else { 1 };
        // SAFETY: a poll over our own array's first `n` entries.
        let r = unsafe { poll(fds.as_mut_ptr(), n, -1) };
        if r < 0 {
            continue; // EINTR
        }
        if fds[0].revents != 0 {
            state.drain();
        }
        if armed && fds[1].revents != 0 && !state.stop.load(SeqCst) {
            state.fired.store(true, SeqCst);
            waker.wake();
        }
    }
}
