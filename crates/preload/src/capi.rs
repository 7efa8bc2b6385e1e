//! `include/ginza.h`: a preemption point, yield, the calling thread's core
//! and the application's counters, for programs that want more than
//! POSIX.

use libc::c_int;

use crate::mode::{caller, serve, serve_preemptible, set_errno, Caller};

/// Mirrors `struct ginza_app_stats` of `include/ginza.h`.
#[repr(C)]
pub struct GinzaAppStats {
    kthreads: u32,
    cores_now: u32,
    uthreads: u64,
    preemptions: u64,
    steals: u64,
    parks: u64,
    grants: u64,
    reserved: [u64; 8],
}

#[no_mangle]
pub extern "C" fn ginza_preempt_point() {
    if caller() == Caller::Uthread {
        serve_preemptible(ginza_runtime::preempt_point);
    }
}

#[no_mangle]
pub extern "C" fn ginza_yield() {
    // SAFETY: our own sched_yield.
    unsafe { crate::time::sched_yield() };
}

#[no_mangle]
pub extern "C" fn ginza_current_core() -> c_int {
    if !crate::running::running() {
        return -1;
    }
    // SAFETY: sched_getcpu has no preconditions.
    unsafe { libc::sched_getcpu() }
}

#[no_mangle]
pub unsafe extern "C" fn ginza_app_stats(out: *mut GinzaAppStats) -> c_int {
    let Some(h) = crate::running::handle().filter(|_| crate::running::running()) else {
        set_errno(libc::ENOSYS);
        return -1;
    };
    let stats = serve(|| h.stats());
    let mut s = GinzaAppStats {
        kthreads: stats.len() as u32,
        cores_now: stats
            .iter()
            .filter(|k| k.state == "running" || k.state == "spinning")
            .count() as u32,
        uthreads: crate::thread::STARTED.load(std::sync::atomic::Ordering::Relaxed) as u64,
        preemptions: 0,
        steals: 0,
        parks: 0,
        grants: 0,
        reserved: [0; 8],
    };
    for k in &stats {
        s.preemptions += k.preemptions;
        s.steals += k.steals;
        s.parks += k.parks;
        s.grants += k.grants;
    }
    // SAFETY: C's contract: a writable struct of this layout.
    unsafe { out.write(s) };
    0
}
