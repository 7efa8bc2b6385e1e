//! Process-wide credential changes (`setuid`, `setgid`, `setgroups` and
//! their kin, e.g. memcached's `-u`): Linux keeps credentials per kernel
//! thread, so glibc signals every thread of its list (SIGSETXID) and each
//! applies the change in the handler, clearing a flag in its own thread
//! descriptor, found through the thread pointer. A kthread running a
//! program thread has that thread's block in FS, so the flag would be
//! cleared in the wrong descriptor and glibc would signal forever. The
//! handler is wrapped to run on the kthread's own thread pointer (GS), as
//! every runtime entry does (`mode.rs`).

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use ginza_runtime::foreign_tls::{fs_base, gs_base, set_fs_base};
use libc::{c_int, c_void, siginfo_t};

/// glibc's SIGSETXID (`__SIGRTMIN + 1`).
const SIGSETXID: c_int = 33;

/// The kernel's `struct sigaction` on x86-64.
#[repr(C)]
#[derive(Clone, Copy)]
struct KernelSigaction {
    handler: usize,
    flags: u64,
    restorer: usize,
    mask: u64,
}

static GLIBC_HANDLER: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_setxid(sig: c_int, info: *mut siginfo_t, ctx: *mut c_void) {
    let glibc = GLIBC_HANDLER.load(Relaxed);
    if glibc == 0 {
        return;
    }
    // SAFETY: the handler glibc installed with SA_SIGINFO.
    let glibc: extern "C" fn(c_int, *mut siginfo_t, *mut c_void) =
        unsafe { std::mem::transmute(glibc) };
    if crate::mode::caller() != crate::mode::Caller::Uthread {
        glibc(sig, info, ctx);
        return;
    }
    let (fs, gs) = (fs_base(), gs_base());
    // SAFETY: GS is this kthread's own thread pointer; FS goes back to the
    // interrupted program thread's block before returning to it.
    unsafe {
        set_fs_base(gs);
        glibc(sig, info, ctx);
        set_fs_base(fs);
    }
}

/// Wraps glibc's handler; once its threads exist (glibc installs the
/// handler at the first `pthread_create`). Without one, nothing to do.
pub(crate) fn wrap_glibc_handler() {
    let mut old = KernelSigaction {
        handler: 0,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    // SAFETY: reads the current action of SIGSETXID into `old`.
    let r = unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            SIGSETXID,
            std::ptr::null::<KernelSigaction>(),
            &mut old,
            8,
        )
    };
    let handler = old.handler;
    if r != 0 || handler <= 1 || handler == on_setxid as *const () as usize {
        return;
    }
    GLIBC_HANDLER.store(handler, Relaxed);
    let new = KernelSigaction {
        handler: on_setxid as *const () as usize,
        ..old
    };
    // SAFETY: the same action (flags, restorer, mask) with our wrapper.
    let r = unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            SIGSETXID,
            &new,
            std::ptr::null_mut::<KernelSigaction>(),
            8,
        )
    };
    if r != 0 {
        crate::say::line(
            "ginza run",
            "cannot wrap glibc's SIGSETXID handler: setuid and kin may hang",
        );
    }
}
