//! Where a program thread may be preempted: only in the program's own
//! code (the executable's text) and the kernel's vDSO (`clock_gettime`;
//! it takes no lock), and not while the thread runs one of its signal
//! handlers (moved to another kthread mid-handler, it would take the
//! signal mask of the kthread it was interrupted on along). Inside glibc or
//! another library it may hold a lock of the C library (malloc's arena, a
//! stdio lock) that another uthread on the same kthread would then wait
//! for; there the preemption waits: the time slicer asks again a few
//! times, and the thread's next call into Ginza takes a preemption that
//! came meanwhile.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

const RANGES: usize = 8;
static START: [AtomicUsize; RANGES] = [const { AtomicUsize::new(0) }; RANGES];
static END: [AtomicUsize; RANGES] = [const { AtomicUsize::new(0) }; RANGES];

static FOUND: AtomicUsize = AtomicUsize::new(0);
static SEEN_EXECUTABLE: AtomicBool = AtomicBool::new(false);

unsafe extern "C" fn text_of(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    _data: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: the dynamic linker passes a valid info.
    let info = unsafe { &*info };
    // SAFETY: a NUL-terminated name (empty for the executable).
    let name = unsafe { std::ffi::CStr::from_ptr(info.dlpi_name) }.to_bytes();
    // The executable comes first; the vDSO goes by its name.
    let executable = !SEEN_EXECUTABLE.swap(true, Relaxed);
    if !executable && !name.starts_with(b"linux-vdso") {
        return 0;
    }
    for i in 0..info.dlpi_phnum as usize {
        // SAFETY: dlpi_phdr has dlpi_phnum entries.
        let ph = unsafe { &*info.dlpi_phdr.add(i) };
        let n = FOUND.load(Relaxed);
        if ph.p_type == libc::PT_LOAD && ph.p_flags & libc::PF_X != 0 && n < RANGES {
            let start = info.dlpi_addr as usize + ph.p_vaddr as usize;
            START[n].store(start, Relaxed);
            END[n].store(start + ph.p_memsz as usize, Relaxed);
            FOUND.store(n + 1, Relaxed);
        }
    }
    0
}

/// Finds the executable's and the vDSO's text; before the runtime starts.
pub(crate) fn init() {
    // SAFETY: the callback only reads what the linker hands it.
    unsafe { libc::dl_iterate_phdr(Some(text_of), std::ptr::null_mut()) };
}

/// Called by the preemption handler on the interrupted thread's pointer:
/// async-signal-safe (relaxed loads and this library's static TLS). A
/// kernel thread glibc made past the library (`mode.rs`) is never a
/// program thread to preempt, even before its first call clears its GS.
pub(crate) fn may_preempt_at(rip: usize) -> bool {
    crate::tcb::is_program_thread_block(ginza_runtime::foreign_tls::fs_base())
        && !crate::signal::in_program_handler()
        && (0..RANGES).any(|i| {
            let (s, e) = (START[i].load(Relaxed), END[i].load(Relaxed));
            s <= rip && rip < e
        })
}
