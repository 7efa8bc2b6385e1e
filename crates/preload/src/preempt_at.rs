//! Where a program thread may be preempted: only in the program's own
//! code (the executable's text). Inside glibc or another library it may
//! hold a lock of the C library (malloc's arena, a stdio lock) that another
//! uthread on the same kthread would then wait for; there the preemption
//! waits for the thread's next call into Ginza, or iokerneld's deadline.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

const RANGES: usize = 4;
static START: [AtomicUsize; RANGES] = [const { AtomicUsize::new(0) }; RANGES];
static END: [AtomicUsize; RANGES] = [const { AtomicUsize::new(0) }; RANGES];

unsafe extern "C" fn first_object(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    _data: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: the dynamic linker passes a valid info; the first object is
    // the executable.
    let info = unsafe { &*info };
    let mut n = 0;
    for i in 0..info.dlpi_phnum as usize {
        // SAFETY: dlpi_phdr has dlpi_phnum entries.
        let ph = unsafe { &*info.dlpi_phdr.add(i) };
        if ph.p_type == libc::PT_LOAD && ph.p_flags & libc::PF_X != 0 && n < RANGES {
            let start = info.dlpi_addr as usize + ph.p_vaddr as usize;
            START[n].store(start, Relaxed);
            END[n].store(start + ph.p_memsz as usize, Relaxed);
            n += 1;
        }
    }
    1 // the first object only
}

/// Finds the executable's text; before the runtime starts.
pub(crate) fn init() {
    // SAFETY: the callback only reads what the linker hands it.
    unsafe { libc::dl_iterate_phdr(Some(first_object), std::ptr::null_mut()) };
}

/// Async-signal-safe: a few relaxed loads.
pub(crate) fn may_preempt_at(rip: usize) -> bool {
    (0..RANGES).any(|i| {
        let (s, e) = (START[i].load(Relaxed), END[i].load(Relaxed));
        s <= rip && rip < e
    })
}
