//! Start-up: the library takes over `__libc_start_main`, so when glibc is
//! about to call the program's `main` (after every constructor ran), it
//! starts a Ginza runtime and runs `main` as the first program thread.
//! `main`'s return value goes to `exit` from that thread, as glibc does,
//! so the process ends without waiting for kthreads that may be blocked.
//!
//! A runtime that cannot start (a wrong variable, iokerneld unreachable)
//! is reported on stderr and the process exits with status 70
//! (EX_SOFTWARE): the program does not run half on Ginza.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::OnceLock;

use libc::{c_char, c_int};

use crate::mode::real;
use crate::thread::{GThread, LIVE};

type Main = extern "C" fn(c_int, *mut *mut c_char, *mut *mut c_char) -> c_int;
type StartMain = unsafe extern "C" fn(
    Main,
    c_int,
    *mut *mut c_char,
    extern "C" fn(),
    extern "C" fn(),
    extern "C" fn(),
    *mut libc::c_void,
) -> c_int;

static PROGRAM_MAIN: OnceLock<usize> = OnceLock::new();

/// Exit status when the runtime cannot start.
const EX_SOFTWARE: c_int = 70;

#[no_mangle]
pub unsafe extern "C" fn __libc_start_main(
    main: Main,
    argc: c_int,
    argv: *mut *mut c_char,
    init: extern "C" fn(),
    fini: extern "C" fn(),
    rtld_fini: extern "C" fn(),
    stack_end: *mut libc::c_void,
) -> c_int {
    let _ = PROGRAM_MAIN.set(main as usize);
    let real_start = real!(__libc_start_main: StartMain);
    // SAFETY: glibc's own entry, with `main` replaced by ours.
    unsafe { real_start(ginza_main, argc, argv, init, fini, rtld_fini, stack_end) }
}

extern "C" fn ginza_main(argc: c_int, argv: *mut *mut c_char, envp: *mut *mut c_char) -> c_int {
    let program_main = *PROGRAM_MAIN.get().expect("set by __libc_start_main");
    let program = if argc > 0 {
        // SAFETY: argv[0] is a NUL-terminated string.
        unsafe { std::ffi::CStr::from_ptr(*argv) }
            .to_string_lossy()
            .into_owned()
    } else {
        String::from("program")
    };
    let config = match crate::config::from_env(&program) {
        Ok(c) => c,
        Err(e) => fail(&format!("wrong configuration: {e}")),
    };
    if let Err(e) = crate::tcb::init() {
        fail(&e);
    }
    crate::preempt_at::init();
    ginza_runtime::foreign_tls::enable(crate::preempt_at::may_preempt_at);
    // This thread runs the runtime's code from here on.
    ginza_runtime::foreign_tls::mark_runtime_thread();
    crate::signal::start_signal_thread();
    crate::net_stats_file::arm();
    crate::exit_linger::arm();
    let (argv, envp) = (argv as usize, envp as usize);
    let result = ginza_runtime::run(config, move || {
        crate::running::started(ginza_runtime::Handle::current().expect("inside the runtime"));
        crate::setxid::wrap_glibc_handler();
        let Some(g) = ginza_runtime::without_preemption(|| GThread::new(false, None)) else {
            fail("cannot allocate main's thread control block");
        };
        let (ret, exited) = g.run_c(program_main, argc as usize, argv, envp, false);
        let status = if exited {
            // main called pthread_exit: the process lives on until the last
            // thread ends, then exits with status 0.
            while LIVE.load(Relaxed) > 1 {
                crate::lot::wait_word(&LIVE, LIVE.load(Relaxed), false, None);
            }
            0
        } else {
            ret as c_int
        };
        let exit = real!(exit: extern "C" fn(c_int) -> !);
        // SAFETY: on main's own thread pointer, as glibc runs exit after main.
        unsafe { crate::mode::on_thread_pointer(g.tcb(), || exit(status)) }
    });
    match result {
        Ok(()) => fail("main's thread came back from exit"),
        Err(e) => fail(&format!("cannot start the runtime: {e}")),
    }
}

fn fail(why: &str) -> ! {
    crate::say::line("ginza run", why);
    // SAFETY: ends the process without running the program.
    unsafe { libc::_exit(EX_SOFTWARE) }
}
