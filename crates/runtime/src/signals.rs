//! Signal handlers: preemption (the handler switches away from the
//! interrupted uthread) and stack-overflow reports (the fault handler runs on
//! an alternate stack and names the uthread's guard page). What the handlers
//! do is the scheduler's, given to [`install`] (`preempt::install`): this
//! module imports nothing of the crate, so the scheduler can use
//! [`fatal`] and [`send_preempt`] without an import circle.

use std::io;
use std::mem::MaybeUninit;
use std::sync::{Once, OnceLock};

/// The preemption signal. SIGURG's default action is to ignore it, so a
/// stray one never kills a process.
pub(crate) const PREEMPT_SIGNAL: libc::c_int = libc::SIGURG;

/// What the handlers ask of the scheduler; set once, before the handlers
/// are installed (reading it is one atomic load: async-signal-safe).
struct Hooks {
    /// The preemption handler's body (`preempt::preempt_from_signal`).
    preempt: fn(),
    /// Whether a fault address is in the guard page of the running
    /// uthread's stack: the kthread id and the stack's usable size.
    guard_page_hit: fn(usize) -> Option<(usize, usize)>,
}

static HOOKS: OnceLock<Hooks> = OnceLock::new();
static INSTALL: Once = Once::new();
static mut INSTALL_ERROR: Option<i32> = None;
static mut PREVIOUS_SEGV: MaybeUninit<libc::sigaction> = MaybeUninit::uninit();
static mut PREVIOUS_BUS: MaybeUninit<libc::sigaction> = MaybeUninit::uninit();

/// Installs the handlers once per process: `preempt` runs on a preemption
/// signal, `guard_page_hit` names the stack a fault overflowed.
pub(crate) fn install(
    preempt: fn(),
    guard_page_hit: fn(usize) -> Option<(usize, usize)>,
) -> io::Result<()> {
    INSTALL.call_once(|| {
        let _ = HOOKS.set(Hooks {
            preempt,
            guard_page_hit,
        });
        // SAFETY: runs once, before any handler can read PREVIOUS_*; the
        // handlers are async-signal-safe functions with the SA_SIGINFO signature.
        unsafe {
            let result = set_handler(
                PREEMPT_SIGNAL,
                on_preempt as *const () as usize,
                // The handler re-enters the scheduler: it must run on the
                // interrupted uthread's stack (no SA_ONSTACK). The signal is
                // blocked while it runs (no SA_NODEFER) until it has deferred
                // the uthread and unblocks it ([`unblock_preempt`]): a signal
                // nested before that would preempt the uthread from inside
                // the handler, leaving the outer one's view of the kthread
                // stale after a move, and a storm of them overflows a stack.
                libc::SA_SIGINFO | libc::SA_RESTART,
                None,
            )
            .and_then(|_| {
                set_handler(
                    libc::SIGSEGV,
                    on_fault as *const () as usize,
                    libc::SA_SIGINFO | libc::SA_ONSTACK,
                    Some(&raw mut PREVIOUS_SEGV),
                )
            })
            .and_then(|_| {
                set_handler(
                    libc::SIGBUS,
                    on_fault as *const () as usize,
                    libc::SA_SIGINFO | libc::SA_ONSTACK,
                    Some(&raw mut PREVIOUS_BUS),
                )
            });
            if let Err(e) = result {
                INSTALL_ERROR = Some(e.raw_os_error().unwrap_or(libc::EINVAL));
            }
        }
    });
    // SAFETY: written only inside call_once, which has completed.
    match unsafe { INSTALL_ERROR } {
        Some(code) => Err(io::Error::from_raw_os_error(code)),
        None => Ok(()),
    }
}

/// # Safety
/// `handler` must be a valid SA_SIGINFO handler; `previous` must be writable.
unsafe fn set_handler(
    sig: libc::c_int,
    handler: usize,
    flags: libc::c_int,
    previous: Option<*mut MaybeUninit<libc::sigaction>>,
) -> io::Result<()> {
    // SAFETY: sigaction is plain data; zeroed is valid before filling it in.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = handler;
    action.sa_flags = flags;
    // SAFETY: sa_mask is a valid sigset_t.
    unsafe { libc::sigemptyset(&mut action.sa_mask) };
    let old = previous.map_or(std::ptr::null_mut(), |p| p.cast::<libc::sigaction>());
    // SAFETY: `action` is initialised; `old` is null or writable.
    if unsafe { libc::sigaction(sig, &action, old) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

extern "C" fn on_preempt(_sig: libc::c_int, _info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // Before any thread-local is read: C code of a preload uthread runs on
    // its own thread pointer (foreign_tls.rs).
    let entry = crate::foreign_tls::enter_handler(ctx);
    if matches!(entry, crate::foreign_tls::Entry::Unsafe) {
        // Inside libc: the revocation waits for the uthread's next call
        // into the runtime, or iokerneld's eviction deadline.
        return;
    }
    // SAFETY: __errno_location returns this thread's errno slot.
    let errno = unsafe { *libc::__errno_location() };
    if let Some(hooks) = HOOKS.get() {
        (hooks.preempt)();
    }
    // The uthread may resume on another thread; restore errno there, where
    // the interrupted code will read it.
    // SAFETY: as above, for the thread we are on now.
    unsafe { *libc::__errno_location() = errno };
    crate::foreign_tls::leave_handler(entry);
}

extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel's siginfo for this SA_SIGINFO handler.
    unsafe { abort_if_stack_overflow(info) };
    // Not ours: hand the fault to whoever had the handler before us.
    let previous = if sig == libc::SIGSEGV {
        &raw const PREVIOUS_SEGV
    } else {
        &raw const PREVIOUS_BUS
    };
    // SAFETY: PREVIOUS_* were written by sigaction before our handler was installed.
    let prev = unsafe { (*previous).assume_init_ref() };
    let handler = prev.sa_sigaction;
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // Reinstate the default and return: the fault repeats and kills us
        // with the right signal.
        // SAFETY: resetting a handler to SIG_DFL.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    } else if prev.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous handler was installed with this signature.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(handler) };
        f(sig, info, ctx);
    } else {
        // SAFETY: a plain handler installed without SA_SIGINFO.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
        f(sig);
    }
}

/// Names a uthread stack overflow and aborts if the fault `info` reports
/// hit the guard page of the running uthread's stack; returns otherwise.
/// Async-signal-safe. For a library that puts a program's own fault
/// handler in front of the runtime's (`ginza run`'s `sigaction`), so that
/// an overflow is still named rather than handled on the stack it
/// exhausted.
///
/// # Safety
/// `info` is the siginfo the kernel passed to a SA_SIGINFO handler.
pub unsafe fn abort_if_stack_overflow(info: *const libc::siginfo_t) {
    // SAFETY: the caller's contract.
    let addr = unsafe { (*info).si_addr() } as usize;
    // C code of a preload uthread runs on its own thread pointer: the
    // running uthread is found on the kthread's.
    let hit = crate::foreign_tls::on_kthread_pointer_in_handler(|| {
        HOOKS.get().and_then(|hooks| (hooks.guard_page_hit)(addr))
    });
    if let Some((kthread, size)) = hit {
        let mut msg = Buf::new();
        msg.push(b"ginza: uthread stack overflow on kthread ");
        msg.push_num(kthread as u64);
        msg.push(b" (stack of ");
        msg.push_num(size as u64);
        msg.push(b" bytes, fault at 0x");
        msg.push_hex(addr as u64);
        msg.push(b"); raise the stack size (Config::stack_size; under ginza run GINZA_STACK_SIZE or the thread's attribute)\n");
        msg.write_stderr();
        // SAFETY: abort is async-signal-safe.
        unsafe { libc::abort() };
    }
}

/// Writes one line naming a fault taken in the runtime's own code: the
/// signal, the address and the instruction, and the thread. Async-signal-
/// safe. A fault there is Ginza's bug whatever the program's handler then
/// makes of it (it may not survive running on top of the runtime).
///
/// # Safety
/// `info` and `ctx` are the siginfo and ucontext the kernel passed to a
/// SA_SIGINFO handler.
pub unsafe fn report_fault_in_runtime(
    sig: libc::c_int,
    info: *const libc::siginfo_t,
    ctx: *const libc::c_void,
) {
    // SAFETY: the caller's contract.
    let (addr, ip) = unsafe {
        let uc = ctx.cast::<libc::ucontext_t>();
        (
            (*info).si_addr() as u64,
            (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] as u64,
        )
    };
    let mut msg = Buf::new();
    msg.push(if sig == libc::SIGBUS {
        b"ginza: SIGBUS"
    } else {
        b"ginza: SIGSEGV"
    });
    msg.push(b" in the runtime's code: address 0x");
    msg.push_hex(addr);
    msg.push(b", instruction 0x");
    msg.push_hex(ip);
    msg.push(b", thread ");
    // SAFETY: gettid has no preconditions.
    msg.push_num(unsafe { libc::gettid() } as u64);
    msg.push(b"; a bug of Ginza's, please report it\n");
    msg.write_stderr();
}

/// Gives the calling thread an alternate signal stack if it has none, so
/// the fault handler can run when a stack is exhausted.
pub(crate) fn ensure_altstack() {
    // SAFETY: stack_t is plain data; sigaltstack only reads/writes it.
    unsafe {
        let mut current: libc::stack_t = std::mem::zeroed();
        if libc::sigaltstack(std::ptr::null(), &mut current) == 0
            && current.ss_flags & libc::SS_DISABLE == 0
        {
            return;
        }
        // Room for a program's own fault handler too (`ginza run` runs it
        // here); pages are touched only as used.
        let size = 256 * 1024;
        let mem = libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if mem == libc::MAP_FAILED {
            return;
        }
        // Deliberately never unmapped: the thread may take a signal until it exits.
        let stack = libc::stack_t {
            ss_sp: mem,
            ss_flags: 0,
            ss_size: size,
        };
        libc::sigaltstack(&stack, std::ptr::null_mut());
    }
}

/// Unblocks the preemption signal on the calling thread. The handler calls
/// it once its uthread is deferred, before switching away: the kthread goes
/// on with the signal blocked otherwise, until the uthread returns from the
/// handler, maybe elsewhere. A signal that comes after it finds the uthread
/// deferred and leaves only a note (`pending`).
pub(crate) fn unblock_preempt() {
    // SAFETY: sigset_t is plain data, filled by sigemptyset/sigaddset;
    // pthread_sigmask is async-signal-safe and only reads the set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, PREEMPT_SIGNAL);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
}

/// Sends the preemption signal to thread `tid` of this process.
pub(crate) fn send_preempt(tid: libc::pid_t) -> io::Result<()> {
    // A stale tid gets ESRCH.
    ginza_sys::signal::tgkill(ginza_sys::process::getpid(), tid, PREEMPT_SIGNAL)
}

/// Reports an unrecoverable runtime failure and aborts.
pub(crate) fn fatal(message: &str) -> ! {
    eprintln!("ginza: fatal: {message}");
    std::process::abort()
}

/// A fixed buffer for messages built inside signal handlers (no allocation).
struct Buf {
    bytes: [u8; 256],
    len: usize,
}

impl Buf {
    fn new() -> Self {
        Buf {
            bytes: [0; 256],
            len: 0,
        }
    }
    fn push(&mut self, s: &[u8]) {
        let n = s.len().min(self.bytes.len() - self.len);
        self.bytes[self.len..self.len + n].copy_from_slice(&s[..n]);
        self.len += n;
    }
    fn push_num(&mut self, mut v: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }
    fn push_hex(&mut self, v: u64) {
        let mut digits = [0u8; 16];
        for (i, d) in digits.iter_mut().enumerate() {
            let nib = (v >> (60 - 4 * i)) & 0xf;
            *d = b"0123456789abcdef"[nib as usize];
        }
        self.push(&digits);
    }
    fn write_stderr(&self) {
        // SAFETY: writing our own initialised bytes; write is async-signal-safe.
        unsafe { libc::write(2, self.bytes.as_ptr().cast(), self.len) };
    }
}
