//! Sleeps and `sched_yield`: a program thread that sleeps is a uthread on
//! a timer, and its kthread runs other work (or parks and gives its core
//! back). Also the conversion of C deadlines to the runtime's clock.

use std::time::{Duration, Instant};

use libc::{c_int, c_uint, clockid_t, timespec};

use crate::mode::{caller, real, serve, set_errno, Caller};

const NSEC: i64 = 1_000_000_000;

/// A `timespec` as a duration; EINVAL for a negative or malformed one.
pub(crate) fn duration(ts: &timespec) -> Result<Duration, c_int> {
    if ts.tv_sec < 0 || ts.tv_nsec < 0 || ts.tv_nsec >= NSEC {
        return Err(libc::EINVAL);
    }
    Ok(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// The instant at which `clock` reads `abstime`; EINVAL for a malformed
/// time or a clock one cannot wait on.
pub(crate) fn deadline(clock: clockid_t, abstime: &timespec) -> Result<Instant, c_int> {
    let at = duration(abstime)?;
    let mut now = timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec.
    if unsafe { libc::clock_gettime(clock, &mut now) } != 0 {
        return Err(libc::EINVAL);
    }
    let now_i = Instant::now();
    let now_d = Duration::new(now.tv_sec.max(0) as u64, now.tv_nsec as u32);
    Ok(match at.checked_sub(now_d) {
        Some(left) => now_i + left,
        None => now_i,
    })
}

/// A deadline `ts` from now (a relative timeout, never negative).
pub(crate) fn after(d: Duration) -> Instant {
    Instant::now()
        .checked_add(d)
        .unwrap_or_else(|| Instant::now() + Duration::from_secs(1 << 32))
}

fn sleep_uthread(until: Instant) {
    serve(|| ginza_runtime::sleep_until(until));
}

#[no_mangle]
pub unsafe extern "C" fn nanosleep(req: *const timespec, rem: *mut timespec) -> c_int {
    if caller() != Caller::Uthread {
        let f = real!(nanosleep: unsafe extern "C" fn(*const timespec, *mut timespec) -> c_int);
        // SAFETY: forwarding the caller's arguments.
        return unsafe { f(req, rem) };
    }
    // SAFETY: C's contract: `req` points to a timespec.
    match duration(unsafe { &*req }) {
        Ok(d) => {
            sleep_uthread(after(d));
            if !rem.is_null() {
                // SAFETY: C's contract: a writable timespec.
                unsafe {
                    *rem = timespec {
                        tv_sec: 0,
                        tv_nsec: 0,
                    }
                };
            }
            0
        }
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn clock_nanosleep(
    clock: clockid_t,
    flags: c_int,
    req: *const timespec,
    rem: *mut timespec,
) -> c_int {
    let waitable = matches!(
        clock,
        libc::CLOCK_REALTIME | libc::CLOCK_MONOTONIC | libc::CLOCK_BOOTTIME | libc::CLOCK_TAI
    );
    if caller() != Caller::Uthread || !waitable {
        // The kernel's answer for CPU-time clocks (EINVAL, ENOTSUP) too.
        let f = real!(clock_nanosleep: unsafe extern "C" fn(clockid_t, c_int, *const timespec, *mut timespec) -> c_int);
        // SAFETY: forwarding the caller's arguments.
        return unsafe { f(clock, flags, req, rem) };
    }
    // SAFETY: C's contract: `req` points to a timespec.
    let req = unsafe { &*req };
    let until = if flags & libc::TIMER_ABSTIME != 0 {
        deadline(clock, req)
    } else {
        duration(req).map(after)
    };
    match until {
        Ok(t) => {
            sleep_uthread(t);
            0
        }
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn usleep(usec: libc::useconds_t) -> c_int {
    if caller() != Caller::Uthread {
        let f = real!(usleep: unsafe extern "C" fn(libc::useconds_t) -> c_int);
        // SAFETY: forwarding.
        return unsafe { f(usec) };
    }
    sleep_uthread(after(Duration::from_micros(usec.into())));
    0
}

#[no_mangle]
pub unsafe extern "C" fn sleep(secs: c_uint) -> c_uint {
    if caller() != Caller::Uthread {
        let f = real!(sleep: unsafe extern "C" fn(c_uint) -> c_uint);
        // SAFETY: forwarding.
        return unsafe { f(secs) };
    }
    sleep_uthread(after(Duration::from_secs(secs.into())));
    0
}

#[no_mangle]
pub unsafe extern "C" fn sched_yield() -> c_int {
    if caller() != Caller::Uthread {
        let f = real!(sched_yield: unsafe extern "C" fn() -> c_int);
        // SAFETY: forwarding.
        return unsafe { f() };
    }
    serve(ginza_runtime::yield_now);
    0
}
