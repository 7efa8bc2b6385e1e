//! Program threads as uthreads: `pthread_create`, `join`, `detach`,
//! `exit`, and the few calls glibc would answer wrongly for a uthread
//! (names, affinity, cancellation, signals to one thread).
//!
//! A program thread is a uthread that runs its start routine on its own
//! thread control block (`tcb.rs`); `pthread_t` is that block, as in
//! glibc, so `pthread_self` and `pthread_equal` need no help.
//! `pthread_exit` returns to the start routine's caller through the
//! registers saved on entry (`call_c`/`exit_c`): the thread's frames are
//! dropped with its stack, without unwinding (docs/preload.md).

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{
    AtomicU32, AtomicU8, AtomicUsize, Ordering::AcqRel, Ordering::Acquire, Ordering::Relaxed,
    Ordering::Release,
};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use libc::{c_int, c_void, pthread_attr_t, pthread_t, timespec};

use crate::lot::{wait_word, wake_word, Waited};
use crate::mode::{caller, on_thread_pointer, real, serve, Caller};
use crate::say::unsupported_once;
use crate::{key, tcb};

/// A program thread.
pub(crate) struct GThread {
    tcb: usize,
    /// Where `call_c` saved the stack pointer to return to on exit.
    exit_point: AtomicUsize,
    /// 1 once the start routine has returned (a wait word).
    done: AtomicU32,
    flags: AtomicU8,
    result: AtomicUsize,
    /// The uthread's stack, lowest usable address and size: set when it
    /// starts, for `pthread_getattr_np`.
    stack: [AtomicUsize; 2],
}

const DETACHED: u8 = 1;
const FINISHED: u8 = 2;

static THREADS: OnceLock<Mutex<HashMap<usize, Arc<GThread>>>> = OnceLock::new();
/// Program threads alive, `main`'s included (a wait word for a `main`
/// that called `pthread_exit`).
pub(crate) static LIVE: AtomicU32 = AtomicU32::new(0);
/// Program threads started so far.
pub(crate) static STARTED: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The program thread whose thread control block is current.
    static ME: Cell<*const GThread> = const { Cell::new(std::ptr::null()) };
}

fn threads() -> std::sync::MutexGuard<'static, HashMap<usize, Arc<GThread>>> {
    THREADS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn lookup(t: pthread_t) -> Option<Arc<GThread>> {
    ginza_runtime::without_preemption(|| threads().get(&(t as usize)).cloned())
}

/// Forgets a finished thread and frees its block, as C code of `by`
/// (see [`as_c_of`]).
fn forget(g: &GThread, by: Option<usize>) {
    ginza_runtime::without_preemption(|| threads().remove(&g.tcb));
    // SAFETY: the thread has finished; nothing runs on its block.
    as_c_of(by, || unsafe { tcb::free(g.tcb) });
}

/// The calling program thread's own block, for [`as_c_of`]: `Some` for a
/// program thread in C code. Call before `serve`.
fn own_block() -> Option<usize> {
    (caller() == Caller::Uthread).then(crate::mutex::me)
}

/// Runs `f` — glibc's TLS allocator, which calls the program's `malloc` —
/// from runtime code as C code of the program thread whose block is `by`,
/// as glibc's `pthread_create` and `join` run it on the calling thread.
/// On the kthread's own block, a wait inside a program's allocator (its
/// pthread mutex) could move the caller to another kthread, where it would
/// go on with the first kthread's allocator state (docs/preload.md, "The
/// program's allocator"); on its own block, the thread takes its state
/// along. `None` (no program thread calls: `main`'s block, a detached
/// thread's freed at its exit) runs `f` where it is.
fn as_c_of<R>(by: Option<usize>, f: impl FnOnce() -> R) -> R {
    match by {
        // SAFETY: the calling uthread's own block (`own_block`).
        Some(tp) => unsafe { on_thread_pointer(tp, f) },
        None => f(),
    }
}

impl GThread {
    /// A new program thread's record, with its thread control block made
    /// as C code of the creating thread `by` ([`as_c_of`]); runtime code.
    pub(crate) fn new(detached: bool, by: Option<usize>) -> Option<Arc<GThread>> {
        let tcb = as_c_of(by, tcb::allocate)?;
        let g = Arc::new(GThread {
            tcb,
            exit_point: AtomicUsize::new(0),
            done: AtomicU32::new(0),
            flags: AtomicU8::new(if detached { DETACHED } else { 0 }),
            result: AtomicUsize::new(0),
            stack: [const { AtomicUsize::new(0) }; 2],
        });
        ginza_runtime::without_preemption(|| threads().insert(tcb, g.clone()));
        LIVE.fetch_add(1, Relaxed);
        STARTED.fetch_add(1, Relaxed);
        Some(g)
    }

    pub(crate) fn tcb(&self) -> usize {
        self.tcb
    }

    /// Runs `f(a, b, c)` as this thread's C code; returns its result, or
    /// what the thread gave `pthread_exit`, and whether it exited so.
    /// Runtime code, on the uthread that is this program thread.
    pub(crate) fn run_c(
        &self,
        f: usize,
        a: usize,
        b: usize,
        c: usize,
        cleanup: bool,
    ) -> (usize, bool) {
        let mut exited = false;
        let mut sp = 0usize;
        if let Some((low, size)) = ginza_runtime::current_uthread_stack() {
            self.stack[0].store(low, Relaxed);
            self.stack[1].store(size, Release);
        }
        // SAFETY: this uthread's own block, made for it.
        let ret = unsafe {
            on_thread_pointer(self.tcb, || {
                ME.with(|me| me.set(self as *const GThread));
                tcb::init_thread_locals();
                self.exit_point
                    .store(&mut sp as *mut usize as usize, Release);
                // SAFETY: `f` is the program's function; `sp` outlives the call.
                let ret = call_c(f, a, b, c, &mut sp);
                exited = self.flags.load(Acquire) & EXITED_BY_CALL != 0;
                if cleanup {
                    key::run_destructors();
                    call_tls_dtors();
                }
                ret
            })
        };
        (ret, exited)
    }

    /// Publishes the result and wakes a joiner; frees a detached thread.
    /// Runtime code.
    pub(crate) fn finish(&self, result: usize) {
        self.result.store(result, Relaxed);
        self.done.store(1, Release);
        wake_word(&self.done, usize::MAX, false);
        LIVE.fetch_sub(1, AcqRel);
        wake_word(&LIVE, usize::MAX, false);
        if self.flags.fetch_or(FINISHED, AcqRel) & DETACHED != 0 {
            forget(self, None);
        }
    }
}

const EXITED_BY_CALL: u8 = 4;

/// C++ `thread_local` destructors of the thread whose block is current.
fn call_tls_dtors() {
    static ADDR: AtomicUsize = AtomicUsize::new(0);
    let mut a = ADDR.load(Relaxed);
    if a == 0 {
        a = crate::mode::lookup(libc::RTLD_DEFAULT, b"__call_tls_dtors\0");
        ADDR.store(a.max(1), Relaxed);
    }
    if a > 1 {
        // SAFETY: glibc's `void __call_tls_dtors(void)`.
        let f: unsafe extern "C" fn() = unsafe { std::mem::transmute(a) };
        // SAFETY: on the exiting thread's block, as glibc calls it.
        unsafe { f() };
    }
}

/// Calls `f(a, b, c)`, saving the callee-saved registers and the stack
/// pointer (in `*sp`) so that [`exit_c`] can return from this call.
#[unsafe(naked)]
unsafe extern "C" fn call_c(f: usize, a: usize, b: usize, c: usize, sp: *mut usize) -> usize {
    core::arch::naked_asm!(
        "push rbp",
        "push rbx",
        "push r12",
        "push r13",
        "push r14",
        "push r15",
        // 8 (return address) + 48: one more word aligns the call.
        "sub rsp, 8",
        "mov [r8], rsp",
        "mov rax, rdi",
        "mov rdi, rsi",
        "mov rsi, rdx",
        "mov rdx, rcx",
        "call rax",
        "add rsp, 8",
        "pop r15",
        "pop r14",
        "pop r13",
        "pop r12",
        "pop rbx",
        "pop rbp",
        "ret",
    )
}

/// Returns `value` from the [`call_c`] that saved `sp`, dropping the frames
/// above it.
#[unsafe(naked)]
unsafe extern "C" fn exit_c(sp: usize, value: usize) -> ! {
    core::arch::naked_asm!(
        "mov rsp, rdi",
        "mov rax, rsi",
        "add rsp, 8",
        "pop r15",
        "pop r14",
        "pop r13",
        "pop r12",
        "pop rbx",
        "pop rbp",
        "ret",
    )
}

/// The stack size and detach state `attr` asks for.
fn attributes(attr: *const pthread_attr_t) -> (usize, bool) {
    if attr.is_null() {
        return (0, false);
    }
    let getstacksize = real!(pthread_attr_getstacksize: unsafe extern "C" fn(*const pthread_attr_t, *mut usize) -> c_int);
    let getdetach = real!(pthread_attr_getdetachstate: unsafe extern "C" fn(*const pthread_attr_t, *mut c_int) -> c_int);
    let getstack = real!(pthread_attr_getstack: unsafe extern "C" fn(*const pthread_attr_t, *mut *mut c_void, *mut usize) -> c_int);
    let (mut size, mut detach, mut addr, mut len) = (0usize, 0, std::ptr::null_mut(), 0usize);
    // SAFETY: glibc reads the caller's attribute object.
    unsafe {
        getstacksize(attr, &mut size);
        getdetach(attr, &mut detach);
        getstack(attr, &mut addr, &mut len);
    }
    // glibc reports the stack's lowest address as the one set minus the
    // size, so an attribute with no stack memory set gives 0 - size.
    if (addr as usize).wrapping_add(len) != 0 {
        unsupported_once!(
            "pthread_attr_setstack",
            "the program's own stack memory is not used: the thread gets a stack of the same size from Ginza"
        );
    }
    (size, detach == libc::PTHREAD_CREATE_DETACHED)
}

#[no_mangle]
pub unsafe extern "C" fn pthread_create(
    out: *mut pthread_t,
    attr: *const pthread_attr_t,
    start: extern "C" fn(*mut c_void) -> *mut c_void,
    arg: *mut c_void,
) -> c_int {
    let who = caller();
    if who == Caller::Runtime || !crate::running::running() {
        return os_thread(out, attr, start, arg);
    }
    let (stack, detached) = attributes(attr);
    let (start, arg) = (start as usize, arg as usize);
    let by = own_block();
    let made = serve(|| {
        let g = GThread::new(detached, by).ok_or(libc::EAGAIN)?;
        let tcb = g.tcb;
        let body = move || {
            let (ret, _) = g.run_c(start, arg, 0, 0, true);
            // glibc frees the thread's block: not to be moved meanwhile.
            ginza_runtime::without_preemption(|| g.finish(ret));
        };
        let spawned = if who == Caller::Uthread {
            ginza_runtime::spawn_with_stack_size(stack, body).map(drop)
        } else {
            crate::running::handle()
                .map(|h| drop(h.spawn(body)))
                .ok_or_else(|| std::io::Error::other("no runtime"))
        };
        match spawned {
            Ok(()) => Ok(tcb),
            Err(_) => {
                if let Some(g) = lookup(tcb as pthread_t) {
                    LIVE.fetch_sub(1, Relaxed);
                    forget(&g, by);
                }
                Err(libc::EAGAIN)
            }
        }
    });
    match made {
        Ok(tcb) => {
            // SAFETY: C's contract: a writable pthread_t.
            unsafe { *out = tcb as pthread_t };
            0
        }
        Err(e) => e,
    }
}

/// What a thread made by glibc starts with: its start routine and argument.
struct OsStart {
    start: extern "C" fn(*mut c_void) -> *mut c_void,
    arg: *mut c_void,
}

/// A kernel thread made by glibc (for the runtime's own threads, and for
/// threads made before the runtime runs or in a forked child).
fn os_thread(
    out: *mut pthread_t,
    attr: *const pthread_attr_t,
    start: extern "C" fn(*mut c_void) -> *mut c_void,
    arg: *mut c_void,
) -> c_int {
    let f = real!(pthread_create: unsafe extern "C" fn(*mut pthread_t, *const pthread_attr_t, extern "C" fn(*mut c_void) -> *mut c_void, *mut c_void) -> c_int);
    let boxed = Box::into_raw(Box::new(OsStart { start, arg }));
    // SAFETY: glibc's pthread_create; `os_thread_start` takes the box back.
    let r = unsafe { f(out, attr, os_thread_start, boxed.cast()) };
    if r != 0 {
        // SAFETY: the thread was not made: the box is still ours.
        drop(unsafe { Box::from_raw(boxed) });
    }
    r
}

/// A new kernel thread inherits its creator's GS base: it starts as no
/// thread of the runtime's, whatever made it (a kthread marks itself).
extern "C" fn os_thread_start(boxed: *mut c_void) -> *mut c_void {
    ginza_runtime::foreign_tls::unmark_thread();
    // SAFETY: made by os_thread, taken once.
    let s = unsafe { Box::from_raw(boxed.cast::<OsStart>()) };
    (s.start)(s.arg)
}

/// Waits for `g` to finish, until `deadline`; its result.
fn wait_done(g: &GThread, deadline: Option<Instant>) -> Result<usize, c_int> {
    serve(|| {
        while g.done.load(Acquire) == 0 {
            if wait_word(&g.done, 0, false, deadline) == Waited::TimedOut
                && g.done.load(Acquire) == 0
            {
                return Err(libc::ETIMEDOUT);
            }
        }
        Ok(g.result.load(Relaxed))
    })
}

fn join(
    t: pthread_t,
    retval: *mut *mut c_void,
    deadline: Option<Instant>,
    try_only: bool,
) -> Option<c_int> {
    let g = lookup(t)?;
    if t as usize == crate::mutex::me() {
        return Some(libc::EDEADLK);
    }
    if g.flags.load(Acquire) & DETACHED != 0 {
        return Some(libc::EINVAL);
    }
    if try_only && g.done.load(Acquire) == 0 {
        return Some(libc::EBUSY);
    }
    match wait_done(&g, deadline) {
        Ok(v) => {
            if !retval.is_null() {
                // SAFETY: C's contract: a writable pointer.
                unsafe { *retval = v as *mut c_void };
            }
            let by = own_block();
            serve(|| forget(&g, by));
            Some(0)
        }
        Err(e) => Some(e),
    }
}

#[no_mangle]
pub unsafe extern "C" fn pthread_join(t: pthread_t, retval: *mut *mut c_void) -> c_int {
    join(t, retval, None, false).unwrap_or_else(|| {
        let f = real!(pthread_join: unsafe extern "C" fn(pthread_t, *mut *mut c_void) -> c_int);
        // SAFETY: a thread glibc made: glibc joins it.
        unsafe { f(t, retval) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn pthread_tryjoin_np(t: pthread_t, retval: *mut *mut c_void) -> c_int {
    join(t, retval, None, true).unwrap_or_else(|| {
        let f =
            real!(pthread_tryjoin_np: unsafe extern "C" fn(pthread_t, *mut *mut c_void) -> c_int);
        // SAFETY: as in pthread_join.
        unsafe { f(t, retval) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn pthread_timedjoin_np(
    t: pthread_t,
    retval: *mut *mut c_void,
    abstime: *const timespec,
) -> c_int {
    if lookup(t).is_none() {
        let f = real!(pthread_timedjoin_np: unsafe extern "C" fn(pthread_t, *mut *mut c_void, *const timespec) -> c_int);
        // SAFETY: as in pthread_join.
        return unsafe { f(t, retval, abstime) };
    }
    // SAFETY: C's contract: a valid timespec.
    match crate::time::deadline(libc::CLOCK_REALTIME, unsafe { &*abstime }) {
        Ok(d) => join(t, retval, Some(d), false).unwrap_or(libc::ESRCH),
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn pthread_detach(t: pthread_t) -> c_int {
    let Some(g) = lookup(t) else {
        let f = real!(pthread_detach: unsafe extern "C" fn(pthread_t) -> c_int);
        // SAFETY: a thread glibc made.
        return unsafe { f(t) };
    };
    let before = g.flags.fetch_or(DETACHED, AcqRel);
    if before & DETACHED != 0 {
        return libc::EINVAL;
    }
    if before & FINISHED != 0 {
        let by = own_block();
        serve(|| forget(&g, by));
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn pthread_exit(value: *mut c_void) -> ! {
    let me = ME.with(|m| m.get());
    if caller() != Caller::Uthread || me.is_null() {
        let f = real!(pthread_exit: unsafe extern "C" fn(*mut c_void) -> !);
        // SAFETY: a thread glibc made.
        unsafe { f(value) }
    }
    // SAFETY: ME points to the running program thread, alive while it runs.
    let g = unsafe { &*me };
    g.flags.fetch_or(EXITED_BY_CALL, AcqRel);
    // SAFETY: the stack pointer run_c's call_c saved, on this uthread's
    // stack, below which every frame belongs to the exiting thread.
    unsafe {
        exit_c(
            *(g.exit_point.load(Acquire) as *const usize),
            value as usize,
        )
    }
}

#[no_mangle]
pub unsafe extern "C" fn pthread_cancel(_t: pthread_t) -> c_int {
    unsupported_once!(
        "pthread_cancel",
        "threads cannot be cancelled under Ginza; returned ENOTSUP"
    );
    libc::ENOTSUP
}

#[no_mangle]
pub unsafe extern "C" fn pthread_setname_np(t: pthread_t, name: *const libc::c_char) -> c_int {
    if lookup(t).is_none() {
        let f = real!(pthread_setname_np: unsafe extern "C" fn(pthread_t, *const libc::c_char) -> c_int);
        // SAFETY: a thread glibc made.
        return unsafe { f(t, name) };
    }
    // A uthread runs on whichever kthread is free: naming that kthread
    // would name the wrong thread.
    0
}

#[no_mangle]
pub unsafe extern "C" fn pthread_setaffinity_np(
    t: pthread_t,
    size: usize,
    set: *const libc::cpu_set_t,
) -> c_int {
    if lookup(t).is_none() {
        let f = real!(pthread_setaffinity_np: unsafe extern "C" fn(pthread_t, usize, *const libc::cpu_set_t) -> c_int);
        // SAFETY: a thread glibc made.
        return unsafe { f(t, size, set) };
    }
    unsupported_once!(
        "pthread_setaffinity_np",
        "ignored: Ginza decides which cores the program's threads run on"
    );
    0
}

/// A program thread's descriptor carries a tid of its own (`tcb.rs`), which
/// glibc would ask the kernel about: it gets the CPUs of the kthread it
/// runs on now, as `sched_getaffinity(0)` does.
#[no_mangle]
pub unsafe extern "C" fn pthread_getaffinity_np(
    t: pthread_t,
    size: usize,
    set: *mut libc::cpu_set_t,
) -> c_int {
    if lookup(t).is_none() {
        let f = real!(pthread_getaffinity_np: unsafe extern "C" fn(pthread_t, usize, *mut libc::cpu_set_t) -> c_int);
        // SAFETY: a thread glibc made.
        return unsafe { f(t, size, set) };
    }
    // SAFETY: the caller's buffer of `size` bytes.
    if unsafe { libc::sched_getaffinity(0, size, set) } == 0 {
        0
    } else {
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL)
    }
}

/// A program thread's attributes, from what Ginza gave it: glibc's own
/// would read its stack from fields of the descriptor nobody set (and then
/// report the initial thread's) and ask the kernel for the affinity of its
/// tid, which no kernel thread has (`tcb.rs`).
#[no_mangle]
pub unsafe extern "C" fn pthread_getattr_np(t: pthread_t, attr: *mut pthread_attr_t) -> c_int {
    let Some(g) = lookup(t) else {
        let f = real!(pthread_getattr_np: unsafe extern "C" fn(pthread_t, *mut pthread_attr_t) -> c_int);
        // SAFETY: a thread glibc made.
        return unsafe { f(t, attr) };
    };
    let size = g.stack[1].load(Acquire);
    let low = g.stack[0].load(Relaxed);
    let detached = g.flags.load(Acquire) & DETACHED != 0;
    // SAFETY: cpu_set_t is plain bits; all zero is the empty set.
    let mut cpus: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: a program thread (looked up above) and a cpu_set_t of the
    // size given.
    let affinity =
        unsafe { pthread_getaffinity_np(t, std::mem::size_of_val(&cpus), &mut cpus) } == 0;
    // SAFETY: the caller's attribute object, which pthread_attr_init
    // initializes as pthread_getattr_np does.
    unsafe {
        let rc = libc::pthread_attr_init(attr);
        if rc != 0 {
            return rc;
        }
        if size != 0 {
            libc::pthread_attr_setstack(attr, low as *mut c_void, size);
            libc::pthread_attr_setguardsize(attr, libc::sysconf(libc::_SC_PAGESIZE) as usize);
        }
        if detached {
            libc::pthread_attr_setdetachstate(attr, libc::PTHREAD_CREATE_DETACHED);
        }
        if affinity {
            libc::pthread_attr_setaffinity_np(attr, std::mem::size_of_val(&cpus), &cpus);
        }
    }
    0
}

/// A program thread runs under Ginza's scheduling: the kernel's policy of
/// its own is the default one.
#[no_mangle]
pub unsafe extern "C" fn pthread_getschedparam(
    t: pthread_t,
    policy: *mut c_int,
    param: *mut libc::sched_param,
) -> c_int {
    if lookup(t).is_none() {
        let f = real!(pthread_getschedparam: unsafe extern "C" fn(pthread_t, *mut c_int, *mut libc::sched_param) -> c_int);
        // SAFETY: a thread glibc made.
        return unsafe { f(t, policy, param) };
    }
    // SAFETY: C's contract: writable outputs.
    unsafe {
        *policy = libc::SCHED_OTHER;
        (*param).sched_priority = 0;
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn pthread_setschedparam(
    t: pthread_t,
    policy: c_int,
    param: *const libc::sched_param,
) -> c_int {
    if lookup(t).is_none() {
        let f = real!(pthread_setschedparam: unsafe extern "C" fn(pthread_t, c_int, *const libc::sched_param) -> c_int);
        // SAFETY: a thread glibc made.
        return unsafe { f(t, policy, param) };
    }
    unsupported_once!(
        "pthread_setschedparam",
        "ignored: Ginza schedules the program's threads"
    );
    0
}

/// A program thread has no kernel thread of its own to clock: `ENOENT`,
/// the answer for a system without per-thread CPU clocks.
#[no_mangle]
pub unsafe extern "C" fn pthread_getcpuclockid(t: pthread_t, clock: *mut libc::clockid_t) -> c_int {
    if lookup(t).is_none() {
        let f = real!(pthread_getcpuclockid: unsafe extern "C" fn(pthread_t, *mut libc::clockid_t) -> c_int);
        // SAFETY: a thread glibc made.
        return unsafe { f(t, clock) };
    }
    libc::ENOENT
}

#[no_mangle]
pub unsafe extern "C" fn pthread_kill(t: pthread_t, sig: c_int) -> c_int {
    if lookup(t).is_none() {
        let f = real!(pthread_kill: unsafe extern "C" fn(pthread_t, c_int) -> c_int);
        // SAFETY: a thread glibc made.
        return unsafe { f(t, sig) };
    }
    if sig == 0 {
        return 0;
    }
    if t as usize == crate::mutex::me() {
        // SAFETY: raise runs the handler on this thread before returning.
        return if unsafe { libc::raise(sig) } == 0 {
            0
        } else {
            libc::EINVAL
        };
    }
    unsupported_once!(
        "pthread_kill",
        "a signal to another program thread is sent to the process (uthreads have no kernel thread of their own)"
    );
    // SAFETY: kill to our own process.
    if unsafe { libc::kill(libc::getpid(), sig) } == 0 {
        0
    } else {
        libc::EINVAL
    }
}
