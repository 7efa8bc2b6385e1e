//! `fork`: the child has one thread, the one that forked, and no runtime
//! (its kthreads were not copied). It goes on as a plain Linux process:
//! the thread is marked as no thread of the runtime's, so every call of
//! the library serves it as the thread it is (blocking blocks it) and
//! threads it creates are glibc's. `exec` needs nothing: the new program
//! inherits `LD_PRELOAD` and the `GINZA_*` variables and starts on Ginza
//! of its own (docs/preload.md).

use libc::pid_t;

use crate::mode::real;

#[no_mangle]
pub unsafe extern "C" fn fork() -> pid_t {
    let f = real!(fork: unsafe extern "C" fn() -> pid_t);
    // SAFETY: glibc's fork, from the program's thread pointer (its atfork
    // handlers and the child's bookkeeping see the thread that forks).
    let pid = unsafe { f() };
    if pid == 0 {
        crate::running::forked();
        crate::fdtable::forked();
        ginza_runtime::foreign_tls::unmark_thread();
    }
    pid
}
