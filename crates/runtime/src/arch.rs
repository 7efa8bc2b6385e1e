//! Stack switching between execution contexts (x86-64 System V only).
//!
//! A cooperative switch saves only the callee-saved registers: the caller of
//! [`switch`] has already spilled everything else, as for any function call.
//! Preemption reaches [`switch`] from inside a signal handler, where the
//! kernel has already saved the full register state (general registers,
//! flags, SSE/AVX) in the signal frame on the interrupted stack; resuming the
//! context returns into the handler and `sigreturn` restores all of it.

#[cfg(not(target_arch = "x86_64"))]
compile_error!("ginza-runtime's context switch is written for x86-64 only");

use core::arch::naked_asm;
use std::sync::atomic::AtomicBool;

/// Suspends the running context and resumes another.
///
/// Pushes the callee-saved registers on the current stack, stores the stack
/// pointer in `*from_sp`, moves to `to_sp`, and only then clears
/// `*from_on_cpu` — the old stack fully written and no longer in use, so
/// another core that sees `false` may resume it — and continues there.
///
/// # Safety
/// `to_sp` must be a stack pointer produced by this function or by
/// [`init_stack`], whose stack stays mapped; `from_sp` and `from_on_cpu` must
/// be valid for writes.
#[unsafe(naked)]
pub(crate) unsafe extern "C" fn switch(
    from_sp: *mut *mut u8,
    to_sp: *mut u8,
    from_on_cpu: *const AtomicBool,
) {
    naked_asm!(
        "push rbp",
        "push rbx",
        "push r12",
        "push r13",
        "push r14",
        "push r15",
        "mov [rdi], rsp",
        // Onto the new stack before the flag drops: once it is down another
        // core may resume the old context, and a signal taken here before
        // the move would push its frame onto that context's stack, in use
        // there (the handler runs on the interrupted stack).
        "mov rsp, rsi",
        // x86 stores are not reordered with older stores: everything above is
        // visible before the flag drops.
        "mov byte ptr [rdx], 0",
        "pop r15",
        "pop r14",
        "pop r13",
        "pop r12",
        "pop rbx",
        "pop rbp",
        "ret",
    )
}

/// First code a new context runs: calls `r13(r12)`, which never returns.
#[unsafe(naked)]
unsafe extern "C" fn trampoline() -> ! {
    naked_asm!("mov rdi, r12", "call r13", "ud2")
}

/// Lays out a fresh stack so that [`switch`] into the returned stack pointer
/// calls `entry(arg)` with a correctly aligned stack.
///
/// # Safety
/// `top` must be the high end of a writable region of at least 128 bytes.
pub(crate) unsafe fn init_stack(
    top: *mut u8,
    entry: unsafe extern "C" fn(*mut u8) -> !,
    arg: *mut u8,
) -> *mut u8 {
    let top = (top as usize & !15) as *mut usize;
    // Low to high: r15 r14 r13 r12 rbx rbp, return address, two padding words.
    // After the six pops and `ret`, rsp = top - 16 (16-byte aligned), as the
    // ABI wants before the trampoline's `call`.
    let frame: [usize; 9] = [
        0,
        0,
        entry as *const () as usize,
        arg as usize,
        0,
        0,
        trampoline as *const () as usize,
        0,
        0,
    ];
    // SAFETY: the caller guarantees at least 128 writable bytes below `top`;
    // we write 72.
    unsafe {
        let sp = top.sub(frame.len());
        sp.copy_from_nonoverlapping(frame.as_ptr(), frame.len());
        sp.cast()
    }
}
