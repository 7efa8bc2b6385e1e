//! Blocking system calls of program threads: a call that would block (a
//! read of an empty pipe, `waitpid` for a running child, `poll` with a
//! timeout) runs on a thread of a pool instead, while the program thread
//! parks as a uthread; its kthread goes on with other threads. So a
//! program with more threads blocked in the kernel than it has kthreads
//! does not stop, and an idle kthread gives its core back.
//!
//! A call that will not block runs where it is called: a non-blocking
//! descriptor, or one that `poll` finds ready (one more system call), or a
//! regular file (`poll` says ready; disk reads block the kthread, as any
//! page fault does).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use libc::{c_int, c_void, pid_t, size_t, sockaddr, socklen_t, ssize_t};

use crate::mode::{caller, real, serve, set_errno, Caller};

pub(crate) type Job = Box<dyn FnOnce() + Send>;

struct Queue {
    jobs: VecDeque<Job>,
    /// Pool threads waiting for a job.
    idle: usize,
}

struct Pool {
    queue: Mutex<Queue>,
    ready: Condvar,
}

/// Threads kept at most; more blocked calls than this wait their turn.
const MOST_THREADS: usize = 512;

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool {
        queue: Mutex::new(Queue {
            jobs: VecDeque::new(),
            idle: 0,
        }),
        ready: Condvar::new(),
    })
}

pub(crate) fn submit(job: Job) {
    let p = pool();
    let mut q = p.queue.lock().unwrap_or_else(|e| e.into_inner());
    q.jobs.push_back(job);
    // A thread for every job queued beyond the idle ones. A woken thread
    // leaves `idle` only once it runs, so asking `idle == 0` would let two
    // jobs queued before it ran share one thread: the second would wait
    // behind the first (a watch of kernel descriptors that may never end,
    // `kwatch.rs`), and its caller's wake-up would be lost.
    if q.jobs.len() > q.idle && started() < MOST_THREADS {
        drop(q);
        spawn_thread();
    } else {
        drop(q);
        p.ready.notify_one();
    }
}

static STARTED: AtomicUsize = AtomicUsize::new(0);

fn started() -> usize {
    STARTED.load(Relaxed)
}

fn spawn_thread() {
    STARTED.fetch_add(1, Relaxed);
    let spawned = std::thread::Builder::new()
        .name("ginza-blocking".into())
        // Room for the runtime's wake-up path too (a watch of kernel
        // descriptors wakes a parked uthread from here, `kwatch.rs`).
        .stack_size(256 << 10)
        .spawn(|| {
            ginza_runtime::foreign_tls::mark_runtime_thread();
            let p = pool();
            loop {
                let job = {
                    let mut q = p.queue.lock().unwrap_or_else(|e| e.into_inner());
                    loop {
                        if let Some(j) = q.jobs.pop_front() {
                            break j;
                        }
                        q.idle += 1;
                        q = p.ready.wait(q).unwrap_or_else(|e| e.into_inner());
                        q.idle -= 1;
                    }
                };
                job();
            }
        });
    if spawned.is_err() {
        STARTED.fetch_sub(1, Relaxed);
        crate::say::line("ginza run", "cannot start a thread for blocking calls");
    }
}

/// What a pool thread hands back to the uthread that waits for its call:
/// the value and errno, and whom to wake.
struct Handoff<R> {
    out: Option<(R, c_int)>,
    parked: Option<ginza_runtime::park::Unparker>,
}

/// Runs `call` on a pool thread, the calling uthread parked meanwhile;
/// its value and errno. Runtime code. A wake-up that is not the pool
/// thread's (a uthread may be woken spuriously) parks it again.
fn on_pool<R: Send + 'static>(call: impl FnOnce() -> R + Send) -> (R, c_int) {
    let call: Box<dyn FnOnce() -> R + Send + '_> = Box::new(call);
    // SAFETY: the caller returns only once `out` is set, after `call` ran,
    // so whatever `call` borrows outlives its use on the pool thread.
    let call: Box<dyn FnOnce() -> R + Send + 'static> = unsafe { std::mem::transmute(call) };
    let handoff = Arc::new(Mutex::new(Handoff {
        out: None,
        parked: None,
    }));
    let theirs = Arc::clone(&handoff);
    submit(Box::new(move || {
        let r = call();
        // SAFETY: this pool thread's errno, right after the call.
        let e = unsafe { *libc::__errno_location() };
        let who = {
            let mut h = theirs.lock().unwrap_or_else(|e| e.into_inner());
            h.out = Some((r, e));
            h.parked.take()
        };
        if let Some(who) = who {
            who.unpark();
        }
    }));
    loop {
        if let Some(out) = handoff.lock().unwrap_or_else(|e| e.into_inner()).out.take() {
            return out;
        }
        ginza_runtime::park::park_until(None, |me| {
            let mut h = handoff.lock().unwrap_or_else(|e| e.into_inner());
            if h.out.is_some() {
                return false;
            }
            h.parked = Some(me);
            true
        });
    }
}

/// Whether `fd` would block for `events` (and is a blocking descriptor).
fn would_block(fd: c_int, events: i16) -> bool {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    let poll = real!(poll: unsafe extern "C" fn(*mut libc::pollfd, libc::nfds_t, c_int) -> c_int);
    // SAFETY: one pollfd, no wait.
    if unsafe { poll(&mut p, 1, 0) } != 0 {
        return false;
    }
    // SAFETY: F_GETFL reads the descriptor's flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    flags >= 0 && flags & libc::O_NONBLOCK == 0
}

/// Serves a call that may block: `direct` when it will not, else on the
/// pool; errno is set on the caller's thread.
fn run<R: Send + Copy + 'static>(
    blocks: impl FnOnce() -> bool,
    call: impl FnOnce() -> R + Send + Copy,
) -> R {
    if caller() != Caller::Uthread || !blocks() {
        return call();
    }
    let (r, e) = serve(|| on_pool(call));
    set_errno(e);
    r
}

macro_rules! fd_call {
    ($name:ident, $events:expr, ($fd:ident : c_int $(, $arg:ident : $ty:ty)*) -> $ret:ty) => {
        pub(crate) unsafe fn $name($fd: c_int $(, $arg: $ty)*) -> $ret {
            let f = real!($name: unsafe extern "C" fn(c_int $(, $ty)*) -> $ret);
            $( let $arg = $arg as usize; )*
            // SAFETY: glibc's call with the caller's arguments (pointers
            // travel as integers to the pool thread; the caller waits).
            run(|| would_block($fd, $events), move || unsafe { f($fd $(, $arg as $ty)*) })
        }
    };
}

fd_call!(read, libc::POLLIN, (fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t);
fd_call!(readv, libc::POLLIN, (fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t);
fd_call!(write, libc::POLLOUT, (fd: c_int, buf: *const c_void, n: size_t) -> ssize_t);
fd_call!(writev, libc::POLLOUT, (fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t);
fd_call!(recvfrom, libc::POLLIN, (fd: c_int, buf: *mut c_void, n: size_t, flags: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> ssize_t);
fd_call!(recvmsg, libc::POLLIN, (fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> ssize_t);
fd_call!(sendto, libc::POLLOUT, (fd: c_int, buf: *const c_void, n: size_t, flags: c_int, addr: *const sockaddr, len: socklen_t) -> ssize_t);
fd_call!(sendmsg, libc::POLLOUT, (fd: c_int, msg: *const libc::msghdr, flags: c_int) -> ssize_t);
fd_call!(accept4, libc::POLLIN, (fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int);

pub(crate) unsafe fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    let f = real!(connect: unsafe extern "C" fn(c_int, *const sockaddr, socklen_t) -> c_int);
    let a = addr as usize;
    // SAFETY: F_GETFL reads the descriptor's flags.
    let blocking = || unsafe { libc::fcntl(fd, libc::F_GETFL) } & libc::O_NONBLOCK == 0;
    // SAFETY: glibc's call with the caller's arguments.
    run(blocking, move || unsafe {
        f(fd, a as *const sockaddr, len)
    })
}

#[no_mangle]
pub unsafe extern "C" fn waitpid(pid: pid_t, status: *mut c_int, options: c_int) -> pid_t {
    // SAFETY: the same call with a null rusage.
    unsafe { wait4(pid, status, options, std::ptr::null_mut()) }
}

#[no_mangle]
pub unsafe extern "C" fn wait(status: *mut c_int) -> pid_t {
    // SAFETY: as above.
    unsafe { wait4(-1, status, 0, std::ptr::null_mut()) }
}

#[no_mangle]
pub unsafe extern "C" fn wait4(
    pid: pid_t,
    status: *mut c_int,
    options: c_int,
    usage: *mut libc::rusage,
) -> pid_t {
    let f =
        real!(wait4: unsafe extern "C" fn(pid_t, *mut c_int, c_int, *mut libc::rusage) -> pid_t);
    let (s, u) = (status as usize, usage as usize);
    // SAFETY: glibc's call with the caller's arguments.
    run(
        || options & libc::WNOHANG == 0,
        move || unsafe { f(pid, s as *mut c_int, options, u as *mut libc::rusage) },
    )
}

pub(crate) unsafe fn poll(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int) -> c_int {
    let f = real!(poll: unsafe extern "C" fn(*mut libc::pollfd, libc::nfds_t, c_int) -> c_int);
    if caller() != Caller::Uthread || timeout == 0 {
        // SAFETY: forwarding.
        return unsafe { f(fds, n, timeout) };
    }
    // SAFETY: a first look that does not wait.
    let now = unsafe { f(fds, n, 0) };
    if now != 0 {
        return now;
    }
    let p = fds as usize;
    // SAFETY: the caller's array, written by the pool thread while it waits.
    run(
        || true,
        move || unsafe { f(p as *mut libc::pollfd, n, timeout) },
    )
}

pub(crate) unsafe fn select(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    let f = real!(select: unsafe extern "C" fn(c_int, *mut libc::fd_set, *mut libc::fd_set, *mut libc::fd_set, *mut libc::timeval) -> c_int);
    // SAFETY: reading the caller's timeout, if any.
    let zero = !timeout.is_null() && unsafe { (*timeout).tv_sec == 0 && (*timeout).tv_usec == 0 };
    if caller() != Caller::Uthread || zero {
        // SAFETY: forwarding.
        return unsafe { f(n, r, w, e, timeout) };
    }
    let (r, w, e, t) = (r as usize, w as usize, e as usize, timeout as usize);
    // SAFETY: the caller's sets, written by the pool thread while it waits.
    run(
        || true,
        move || unsafe {
            f(
                n,
                r as *mut libc::fd_set,
                w as *mut libc::fd_set,
                e as *mut libc::fd_set,
                t as *mut libc::timeval,
            )
        },
    )
}

pub(crate) unsafe fn epoll_wait(
    epfd: c_int,
    events: *mut libc::epoll_event,
    most: c_int,
    timeout: c_int,
) -> c_int {
    let f = real!(epoll_wait: unsafe extern "C" fn(c_int, *mut libc::epoll_event, c_int, c_int) -> c_int);
    if caller() != Caller::Uthread || timeout == 0 {
        // SAFETY: forwarding.
        return unsafe { f(epfd, events, most, timeout) };
    }
    // SAFETY: a first look that does not wait.
    let now = unsafe { f(epfd, events, most, 0) };
    if now != 0 {
        return now;
    }
    let ev = events as usize;
    // SAFETY: the caller's array, written by the pool thread while it waits.
    run(
        || true,
        move || unsafe { f(epfd, ev as *mut libc::epoll_event, most, timeout) },
    )
}
