//! The program's signal handlers. A handler must not run on top of the
//! runtime's own code (it may hold a runqueue lock, and a handler that
//! posts a semaphore would then deadlock it), so the library installs each
//! handler behind a trampoline: a signal that interrupts a program thread's
//! C code, or a thread that is not the runtime's, runs the handler there
//! and then, as on Linux; one that lands on runtime code is passed, with
//! its `siginfo` (`si_code` then reads SI_QUEUE), to a signal thread of
//! the library, which runs it. A program's SIGSEGV or SIGBUS handler
//! takes the runtime's place, so the trampoline does the runtime's part
//! first: a uthread stack overflow is named and aborts, and a fault in the
//! runtime's own code is reported before the program's handler runs.

use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering::Relaxed};

use libc::{c_int, c_void, siginfo_t};

type Action = libc::sigaction;

use crate::mode::{caller, real, Caller};

const NSIG: usize = 65;

/// Per signal: the program's handler (0: none of ours) and its flags.
static HANDLER: [AtomicUsize; NSIG] = [const { AtomicUsize::new(0) }; NSIG];
static FLAGS: [AtomicI32; NSIG] = [const { AtomicI32::new(0) }; NSIG];
thread_local! {
    /// Program signal handlers running on this thread pointer.
    static IN_HANDLER: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    /// The alternate signal stack this program thread asked for
    /// (`sigaltstack`): base, size and flags, reported back, never
    /// installed.
    static ALT_STACK: std::cell::Cell<(usize, usize, c_int)> =
        const { std::cell::Cell::new((0, 0, libc::SS_DISABLE)) };
}

/// Whether the thread whose pointer is current runs a handler of the
/// program's (it must not be preempted then: `preempt_at.rs`).
pub(crate) fn in_program_handler() -> bool {
    IN_HANDLER.with(|h| h.get() != 0)
}

/// The signal thread's tid; 0 until it runs.
static SIGNAL_TID: AtomicI32 = AtomicI32::new(0);

type RealSigaction = unsafe extern "C" fn(c_int, *const Action, *mut Action) -> c_int;

extern "C" fn trampoline(sig: c_int, info: *mut siginfo_t, ctx: *mut c_void) {
    let i = sig as usize;
    let synchronous = matches!(
        sig,
        libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE | libc::SIGTRAP
    );
    let tid = SIGNAL_TID.load(Relaxed);
    if caller() == Caller::Runtime && !synchronous && tid != 0 {
        // SAFETY: the kernel passes a valid siginfo; a copy is re-queued to
        // the signal thread with its sender's pid and uid and value. The
        // kernel lets only the main thread queue a kernel or kill() si_code,
        // so the copy says SI_QUEUE.
        unsafe {
            let mut copy = *info;
            copy.si_code = libc::SI_QUEUE;
            libc::syscall(libc::SYS_rt_tgsigqueueinfo, libc::getpid(), tid, sig, &copy);
        }
        return;
    }
    if is_fault(sig) {
        // SAFETY: the kernel's siginfo and ucontext for this handler,
        // installed with SA_SIGINFO.
        unsafe {
            ginza_runtime::abort_if_stack_overflow(info);
            if caller() == Caller::Runtime {
                ginza_runtime::report_fault_in_runtime(sig, info, ctx);
            }
        }
    }
    let h = HANDLER.get(i).map_or(0, |h| h.load(Relaxed));
    if h <= 1 {
        return;
    }
    IN_HANDLER.with(|n| n.set(n.get() + 1));
    if FLAGS[i].load(Relaxed) & libc::SA_SIGINFO != 0 {
        // SAFETY: the program installed an SA_SIGINFO handler.
        let f: extern "C" fn(c_int, *mut siginfo_t, *mut c_void) =
            unsafe { std::mem::transmute(h) };
        f(sig, info, ctx);
    } else {
        // SAFETY: the program installed a plain handler.
        let f: extern "C" fn(c_int) = unsafe { std::mem::transmute(h) };
        f(sig);
    }
    IN_HANDLER.with(|n| n.set(n.get() - 1));
    if crate::wait_mask::any_armed() {
        // Waits whose signal mask lets `sig` in end with EINTR.
        crate::mode::serve(|| crate::wait_mask::signal_taken(sig));
    }
}

/// The signals a memory fault raises, which the runtime's own handler
/// took before the program installed one of its own.
fn is_fault(sig: c_int) -> bool {
    sig == libc::SIGSEGV || sig == libc::SIGBUS
}

/// Starts the signal thread: a thread with every signal open that only
/// waits; handlers passed to it run there.
pub(crate) fn start_signal_thread() {
    let spawned = std::thread::Builder::new()
        .name("ginza-signals".into())
        .spawn(|| {
            // Not the runtime's: the trampoline runs handlers here.
            ginza_runtime::foreign_tls::unmark_thread();
            // SAFETY: an empty set unblocks every signal on this thread.
            unsafe {
                let mut none: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut none);
                libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            }
            SIGNAL_TID.store(
                // SAFETY: gettid has no preconditions.
                unsafe { libc::gettid() },
                Relaxed,
            );
            loop {
                // SAFETY: waits for a signal; handlers run in between.
                unsafe { libc::pause() };
            }
        });
    if let Err(e) = spawned {
        crate::say::line("ginza run", &format!("cannot start the signal thread: {e}"));
    }
}

#[no_mangle]
pub unsafe extern "C" fn sigaction(sig: c_int, act: *const Action, old: *mut Action) -> c_int {
    let real_sigaction = real!(sigaction: RealSigaction);
    let i = sig as usize;
    if caller() == Caller::Runtime
        || i == 0
        || i >= NSIG
        || sig == libc::SIGURG
        || sig == libc::SIGKILL
        || sig == libc::SIGSTOP
    {
        // The runtime's own handlers, and what the kernel refuses, as is.
        // SAFETY: forwarding the caller's arguments.
        return unsafe { real_sigaction(sig, act, old) };
    }
    // SAFETY: reading the kernel's current action.
    let mut current: Action = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { real_sigaction(sig, std::ptr::null(), &mut current) } != 0 {
        return -1;
    }
    if !old.is_null() {
        let mut seen = current;
        if current.sa_sigaction == trampoline as *const () as usize {
            seen.sa_sigaction = HANDLER[i].load(Relaxed);
            seen.sa_flags = FLAGS[i].load(Relaxed);
        }
        // SAFETY: C's contract: writable.
        unsafe { *old = seen };
    }
    if act.is_null() {
        return 0;
    }
    // SAFETY: C's contract: a valid action.
    let mut new = unsafe { *act };
    let h = new.sa_sigaction;
    if h != libc::SIG_DFL && h != libc::SIG_IGN {
        HANDLER[i].store(h, Relaxed);
        FLAGS[i].store(new.sa_flags, Relaxed);
        new.sa_sigaction = trampoline as *const () as usize;
        new.sa_flags |= libc::SA_SIGINFO;
        if is_fault(sig) {
            // The runtime's check for a uthread stack overflow runs in
            // the trampoline first, and needs a stack that is not the
            // exhausted one; the program's handler runs there too.
            new.sa_flags |= libc::SA_ONSTACK;
        }
    } else {
        HANDLER[i].store(0, Relaxed);
    }
    // SAFETY: an initialized action.
    unsafe { real_sigaction(sig, &new, std::ptr::null_mut()) }
}

#[no_mangle]
pub unsafe extern "C" fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    if caller() == Caller::Runtime {
        let f =
            real!(signal: unsafe extern "C" fn(c_int, libc::sighandler_t) -> libc::sighandler_t);
        // SAFETY: forwarding.
        return unsafe { f(sig, handler) };
    }
    // glibc's signal(): BSD semantics, restarting system calls.
    // SAFETY: zeroed is a valid sigaction before filling it in.
    let mut act: Action = unsafe { std::mem::zeroed() };
    act.sa_sigaction = handler;
    act.sa_flags = libc::SA_RESTART;
    // SAFETY: as above.
    let mut old: Action = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers.
    if unsafe { sigaction(sig, &act, &mut old) } != 0 {
        return libc::SIG_ERR;
    }
    old.sa_sigaction
}

/// The auxiliary vector's entry for the kernel's smallest signal stack
/// (`<linux/auxvec.h>`), and the flag that disarms an alternate stack
/// while a handler runs on it (`<linux/signal.h>`): not in the `libc`
/// crate.
const AT_MINSIGSTKSZ: libc::c_ulong = 51;
const SS_AUTODISARM: c_int = 1 << 31;

/// A program thread's `sigaltstack` is its own: recorded per thread and
/// reported back, with Linux's checks and errors, but never installed. The
/// kthread's real alternate stack stays the runtime's, for two reasons:
/// * a kthread runs many program threads, so a stack one thread installed
///   there would serve the others' handlers too, and could be freed
///   under them;
/// * a thread that disabled it would leave the runtime's check for a
///   uthread stack overflow (the trampoline above) no stack to run on.
///
/// So a handler installed with `SA_ONSTACK` runs on the kthread's
/// alternate stack (256 KiB), never on the thread's own, which is never
/// reported as in use (`SS_ONSTACK`). Threads that are not the runtime's
/// get the kernel's call.
#[no_mangle]
pub unsafe extern "C" fn sigaltstack(ss: *const libc::stack_t, old: *mut libc::stack_t) -> c_int {
    if caller() != Caller::Uthread {
        let real = real!(sigaltstack: unsafe extern "C" fn(*const libc::stack_t, *mut libc::stack_t) -> c_int);
        // SAFETY: forwarding the caller's arguments.
        return unsafe { real(ss, old) };
    }
    let new = if ss.is_null() {
        None
    } else {
        // SAFETY: C's contract: a valid stack_t.
        let ss = unsafe { *ss };
        let mode = ss.ss_flags & !SS_AUTODISARM;
        if mode == libc::SS_DISABLE {
            Some((0, 0, libc::SS_DISABLE))
        } else if mode != 0 && mode != libc::SS_ONSTACK {
            return fail(libc::EINVAL);
        } else if ss.ss_size < smallest_signal_stack() {
            return fail(libc::ENOMEM);
        } else {
            Some((ss.ss_sp as usize, ss.ss_size, ss.ss_flags & SS_AUTODISARM))
        }
    };
    let (sp, size, flags) = ALT_STACK.with(std::cell::Cell::get);
    if !old.is_null() {
        // SAFETY: C's contract: writable.
        unsafe {
            *old = libc::stack_t {
                ss_sp: sp as *mut c_void,
                ss_flags: flags,
                ss_size: size,
            };
        }
    }
    if let Some(new) = new {
        ALT_STACK.with(|a| a.set(new));
    }
    0
}

/// The smallest alternate stack the kernel accepts.
fn smallest_signal_stack() -> usize {
    // SAFETY: getauxval has no preconditions (0 for an absent entry).
    let kernel = unsafe { libc::getauxval(AT_MINSIGSTKSZ) } as usize;
    kernel.max(libc::MINSIGSTKSZ)
}

/// -1 with `errno` set, as a libc call fails.
fn fail(errno: c_int) -> c_int {
    crate::mode::set_errno(errno);
    -1
}
