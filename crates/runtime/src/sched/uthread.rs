//! Uthreads: making one ([`UThread`]; the type and its handle [`URef`] are
//! in `kthread.rs`, beside the kthread state they point into), the switch
//! between contexts (`switch_to`, `finish_switch`, a uthread's first run),
//! and the caches that keep exited uthreads and their stacks for the next
//! spawn.

use std::cell::UnsafeCell;
use std::ptr::{null_mut, NonNull};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Acquire, Ordering::Relaxed};

use crossbeam_deque::Steal;

use super::{
    current_kthread_ref, pick_next, Entry, Mode, Owner, Shared, URef, UThread, SPARE_STACKS,
};
use crate::arch;
use crate::deferral::{self, PreemptState};
use crate::uthread_stack::Stack;

impl UThread {
    /// A new uthread, recycled (with its stack) from the calling kthread's
    /// cache when there is one.
    pub(super) fn new_boxed(rt: *const Shared, entry: Entry) -> URef {
        let recycled = {
            let deferred = deferral::Guard::new();
            Owner::current(&deferred)
                .filter(|owner| owner.rt == rt)
                .and_then(|owner| owner.take_cached_uthread())
        };
        if let Some(mut u) = recycled {
            // Exited uthreads are cached with sp null (not started), their
            // count at 1, no entry, and their stack kept.
            *u.entry.get_mut() = Some(entry);
            *u.serial.get_mut() = 0;
            return URef(NonNull::from(Box::leak(u)));
        }
        let u = Box::new(UThread {
            sp: UnsafeCell::new(null_mut()),
            on_cpu: AtomicBool::new(false),
            // New contexts start deferred; their entry lowers the count.
            preempt: PreemptState::new(1),
            stack: UnsafeCell::new(None),
            entry: UnsafeCell::new(Some(entry)),
            rt,
            serial: AtomicU64::new(0),
            #[cfg(debug_assertions)]
            queued: AtomicBool::new(false),
        });
        URef(NonNull::from(Box::leak(u)))
    }
}

/// Worker mode: a request context that exited, kept with its stack for the
/// dispatcher's next request. It goes back to the dispatcher in the
/// worker's report instead of being freed on the worker: no allocation on
/// one thread freed on another, and no shared stack pool, per request.
pub(crate) struct SpareContext(Box<UThread>);

impl SpareContext {
    /// Keeps the exited context `u` (None if it has no stack to keep, or
    /// is null), reset to its never-run state.
    ///
    /// # Safety
    /// `u` exited, is off its CPU, and is referenced from nowhere else.
    pub(super) unsafe fn of_exited(u: *mut UThread) -> Option<SpareContext> {
        if u.is_null() {
            return None;
        }
        // SAFETY: the caller's contract: ours alone.
        let mut u = unsafe { Box::from_raw(u) };
        u.stack.get_mut().as_ref()?;
        *u.sp.get_mut() = null_mut();
        *u.entry.get_mut() = None;
        u.preempt = PreemptState::new(1);
        Some(SpareContext(u))
    }

    /// As a pointer, to travel through a mailbox.
    pub(crate) fn into_raw(self) -> NonNull<UThread> {
        NonNull::from(Box::leak(self.0))
    }

    /// # Safety
    /// `u` came from [`SpareContext::into_raw`], and is taken back once.
    pub(crate) unsafe fn from_raw(u: NonNull<UThread>) -> SpareContext {
        // SAFETY: the caller's contract.
        SpareContext(unsafe { Box::from_raw(u.as_ptr()) })
    }

    /// A new context that runs `entry` on this one's stack.
    pub(crate) fn reuse(self, entry: Entry) -> URef {
        let mut u = self.0;
        *u.entry.get_mut() = Some(entry);
        *u.serial.get_mut() = 0;
        URef(NonNull::from(Box::leak(u)))
    }
}

impl URef {
    /// Whether it has never run (freshly spawned). Only for a uthread that
    /// is in a queue, where nobody runs it.
    pub(crate) fn never_ran(self) -> bool {
        // SAFETY: a queued uthread's fields are not being written.
        unsafe { (*self.ptr()).sp.get().read().is_null() }
    }

    /// Whether it is still saving its registers on some kthread (woken
    /// before its switch out ended).
    pub(crate) fn still_switching_out(self) -> bool {
        // SAFETY: a URef names a live uthread; the field is atomic.
        unsafe { (*self.ptr()).on_cpu.load(Acquire) }
    }

    /// Debug builds: notes that it was made runnable (put on a runqueue).
    /// A second time before a kthread took it to run is the runtime's bug:
    /// two kthreads could then run it at once, on one stack.
    #[inline]
    pub(crate) fn note_queued(self) {
        #[cfg(debug_assertions)]
        {
            // SAFETY: a URef names a live uthread; the field is atomic.
            let twice = unsafe {
                (*self.ptr())
                    .queued
                    .swap(true, std::sync::atomic::Ordering::AcqRel)
            };
            if twice {
                crate::signals::fatal(&format!(
                    "uthread {:p} made runnable a second time before it ran\n{}",
                    self.ptr(),
                    std::backtrace::Backtrace::force_capture()
                ));
            }
        }
    }

    /// Debug builds: notes that a kthread took it off a queue to run it
    /// (or to queue it again).
    #[inline]
    pub(crate) fn note_taken(self) {
        #[cfg(debug_assertions)]
        // SAFETY: a URef names a live uthread; the field is atomic.
        unsafe {
            (*self.ptr())
                .queued
                .store(false, std::sync::atomic::Ordering::Release)
        };
    }

    /// The identity the Shinjuku dispatcher gave it (0: none yet).
    pub(crate) fn serial(self) -> u64 {
        // SAFETY: a URef names a live uthread; the field is atomic.
        unsafe { (*self.ptr()).serial.load(Relaxed) }
    }

    /// Gives a uthread that has never run the stack it will start on (the
    /// Shinjuku dispatcher, at admission, so that a stack that cannot be
    /// mapped is a refusal there and not an abort at first run). The
    /// assignment publishes the store.
    pub(crate) fn give_stack(self, stack: Stack) {
        debug_assert!(self.never_ran());
        // SAFETY: a uthread that has never run is touched by nobody but its
        // creator (the dispatcher, our caller) until it is assigned.
        let slot = unsafe { &mut *(*self.ptr()).stack.get() };
        debug_assert!(slot.is_none(), "a fresh request context had a stack");
        *slot = Some(stack);
    }

    /// Gives it an identity (the Shinjuku dispatcher, before it first runs
    /// the context: the assignment publishes the store).
    pub(crate) fn set_serial(self, serial: u64) {
        // SAFETY: as in `serial`.
        unsafe { (*self.ptr()).serial.store(serial, Relaxed) }
    }
}

/// Switches from `from` (running on `k`) to `to`. Both have preemption
/// deferred. Returns when `from` is resumed — possibly on another kthread,
/// so a uthread gives up its token first (see [`switch_away`]).
///
/// # Safety
/// `from` must be the context running on `k`; `to` must be runnable and in no
/// queue.
pub(crate) unsafe fn switch_to(k: &Owner<'_>, from: *mut UThread, to: *mut UThread) {
    // SAFETY: `to` is a live context handed to us by a queue or the kthread.
    let target = unsafe { &*to };
    if to != k.sched_ptr() {
        // Only a scheduler context may wait for a uthread still switching
        // out (`pick_next`): two uthreads doing so could wait for each other.
        debug_assert!(
            from == k.sched_ptr() || !target.on_cpu.load(Acquire),
            "a uthread switching to one still switching out"
        );
        // It may still be saving its registers on another core.
        while target.on_cpu.load(Acquire) {
            std::hint::spin_loop();
        }
        // SAFETY: `to` is a live uthread (the caller's contract).
        URef(unsafe { NonNull::new_unchecked(to) }).note_taken();
        // SAFETY: the target is not running anywhere, so we own its fields.
        if unsafe { (*target.sp.get()).is_null() } {
            // SAFETY: as above: a uthread that has never run.
            unsafe { prepare_first_run(k, to) };
        }
    }
    target.on_cpu.store(true, Relaxed);
    k.current.set(to);
    deferral::set_current_state(&target.preempt);
    // SAFETY: `from` is running here, `to` is suspended with a saved stack
    // pointer on a mapped stack (or the scheduler's pthread stack).
    unsafe { arch::switch((*from).sp.get(), *target.sp.get(), &(*from).on_cpu) };
}

/// A uthread's side of [`switch_to`]: it gives up its token, since it may
/// resume on another kthread, and finishes the switch when it resumes.
///
/// # Safety
/// As for [`switch_to`].
pub(crate) unsafe fn switch_away(owner: Owner<'_>, from: *mut UThread, to: *mut UThread) {
    /// Takes the token, so that it ends with the switch.
    ///
    /// # Safety
    /// As for [`switch_to`].
    unsafe fn switch_giving_up(owner: Owner<'_>, from: *mut UThread, to: *mut UThread) {
        // SAFETY: the caller's contract.
        unsafe { switch_to(&owner, from, to) }
    }
    // SAFETY: the caller's contract.
    unsafe { switch_giving_up(owner, from, to) };
    finish_switch();
}

/// Called by a context right after it resumes: frees a uthread that exited
/// on the way here (its stack could not be freed while in use).
pub(crate) fn finish_switch() {
    // SAFETY: preemption is deferred in every context that resumes from a
    // switch, until after this returns.
    let k = unsafe { Owner::current_deferred() };
    super::bump(&k.stats.switches);
    let dead = k.exited.replace(null_mut());
    if !dead.is_null() {
        // SAFETY: the exited uthread is off-CPU (we are running) and in no queue.
        let mut u = unsafe { Box::from_raw(dead) };
        if k.mode == Mode::Shenango && u.stack.get_mut().is_some() {
            *u.sp.get_mut() = null_mut();
            u.preempt = PreemptState::new(1);
            if let Some(mut u) = k.cache_uthread(u) {
                if let Some(stack) = u.stack.get_mut().take() {
                    k.rt().put_spare_stack(stack);
                }
            }
        } else if let Some(stack) = u.stack.get_mut().take() {
            // Shinjuku requests are created by the dispatcher, which is no
            // kthread: their stacks go back through the runtime-wide pool.
            k.rt().put_spare_stack(stack);
        }
    }
}

/// Gives `u`, which has not started, a stack of at least `size` usable
/// bytes when the runtime's default is smaller; on failure frees `u`.
///
/// # Safety
/// `u` was just made by [`UThread::new_boxed`] and is in no queue.
pub(super) unsafe fn ensure_stack(u: URef, size: usize) -> std::io::Result<URef> {
    // SAFETY: `u` is ours until queued (caller's contract).
    let (stack, rt) = unsafe { (&mut *(*u.ptr()).stack.get(), &*(*u.ptr()).rt) };
    let big_enough = match stack {
        Some(s) => s.usable_size() >= size,
        None => size <= rt.stack_size,
    };
    if big_enough {
        return Ok(u);
    }
    match Stack::new(size) {
        Ok(s) => {
            *stack = Some(s);
            Ok(u)
        }
        Err(e) => {
            // SAFETY: made by Box::leak in new_boxed, never queued.
            drop(unsafe { Box::from_raw(u.ptr()) });
            Err(e)
        }
    }
}

const UTHREAD_CACHE: usize = 64;

/// Gives a uthread that has never run a stack (unless it kept one from a
/// previous life) and lays out its first frame.
///
/// # Safety
/// `u` must not be running and must never have run since it was (re)spawned.
unsafe fn prepare_first_run(k: &Owner<'_>, u: *mut UThread) {
    // SAFETY: `u` is ours until it runs (caller's contract).
    let stack = unsafe { &mut *(*u).stack.get() };
    if stack.is_none() {
        let rt = k.rt();
        *stack = Some(rt.take_spare_stack().unwrap_or_else(|| {
            Stack::new(rt.stack_size).unwrap_or_else(|e| {
                crate::signals::fatal(&format!(
                    "cannot map a uthread stack: {e} (every started, unfinished uthread \
                     holds one: check vm.max_map_count and memory, or bound the requests in flight)"
                ))
            })
        }));
    }
    let top = stack
        .as_ref()
        .map(Stack::top)
        .expect("stack assigned above");
    // SAFETY: the stack is ours and unused; `u` is not running.
    unsafe { *(*u).sp.get() = arch::init_stack(top, uthread_entry, u.cast()) };
}

/// First Rust code of every uthread.
unsafe extern "C" fn uthread_entry(arg: *mut u8) -> ! {
    let u = arg.cast::<UThread>();
    finish_switch();
    // SAFETY: `u` is the running uthread; its entry is taken exactly once.
    let entry = unsafe { (*(*u).entry.get()).take() };
    // SAFETY: as above; `u` lives until exit below.
    deferral::enable(unsafe { &(*u).preempt });
    if let Some(task) = entry {
        task.run(); // catches its own panics (see task.rs)
    }
    deferral::disable();
    // SAFETY: preemption deferred (for good: this context ends here).
    let mut k = unsafe { Owner::current_deferred() };
    k.exited.set(u);
    let next = pick_next(&mut k);
    // SAFETY: `u` runs on `k`; `next` is runnable and dequeued.
    unsafe { switch_to(&k, u, next) };
    crate::signals::fatal("an exited uthread was resumed")
}

impl Owner<'_> {
    fn take_cached_uthread(&self) -> Option<Box<UThread>> {
        // SAFETY: owner-only field (the token); no other borrow of it lives
        // across this call.
        unsafe { &mut *self.k.free_uthreads.get() }.pop()
    }

    /// Keeps `u` (exited, with its stack) for the next spawn, if there is
    /// room; else gives it back.
    fn cache_uthread(&self, u: Box<UThread>) -> Option<Box<UThread>> {
        // SAFETY: as in `take_cached_uthread`.
        let cache = unsafe { &mut *self.k.free_uthreads.get() };
        if cache.len() >= UTHREAD_CACHE {
            return Some(u);
        }
        cache.push(u);
        None
    }
}

impl Shared {
    /// Keeps the stack of an exited uthread for any kthread's next first
    /// run, up to `spare_limit`; beyond that it is unmapped.
    fn put_spare_stack(&self, stack: Stack) {
        if self.spare_count.fetch_add(1, Relaxed) < self.spare_limit.load(Relaxed) {
            self.spare_stacks.push(stack);
        } else {
            self.spare_count.fetch_sub(1, Relaxed);
        }
    }

    /// Keeps up to `n` spare stacks (never fewer than `SPARE_STACKS`).
    ///
    /// Shinjuku mode bounds its requests in flight, each holding a stack:
    /// keeping that many spares means that after a burst its stacks are
    /// reused, not unmapped one by one as the backlog drains. An unmapping
    /// (a TLB shootdown across the process's CPUs) and the next request's
    /// new mapping and page faults cost the worker ~10 µs a request on a
    /// VM, more than the work of a short request, so a backlog once over
    /// the default never drained (docs/results.md, "Shinjuku policies": a
    /// backlog that never drained).
    pub(crate) fn keep_spare_stacks(&self, n: usize) {
        self.spare_limit.store(n.max(SPARE_STACKS), Relaxed);
    }

    /// A stack for a new request context: a spare one, else a new mapping.
    pub(crate) fn stack_for_request(&self) -> std::io::Result<Stack> {
        match self.take_spare_stack() {
            Some(stack) => Ok(stack),
            None => {
                self.request_stacks_mapped.fetch_add(1, Relaxed);
                Stack::new(self.stack_size)
            }
        }
    }

    fn take_spare_stack(&self) -> Option<Stack> {
        loop {
            match self.spare_stacks.steal() {
                Steal::Success(stack) => {
                    self.spare_count.fetch_sub(1, Relaxed);
                    return Some(stack);
                }
                Steal::Empty => return None,
                Steal::Retry => std::hint::spin_loop(),
            }
        }
    }
}

/// `f` of the running uthread's stack and its kthread's id; `None` on a
/// kthread's own stack. Async-signal-safe (the fault handler calls it).
fn with_running_stack<R>(f: impl FnOnce(usize, &Stack) -> R) -> Option<R> {
    let k = current_kthread_ref()?;
    let cur = k.current.get();
    if cur.is_null() || cur == k.sched_ptr() {
        return None;
    }
    // SAFETY: the running uthread's stack is not modified while it runs.
    let stack = unsafe { (*(*cur).stack.get()).as_ref() }?;
    Some(f(k.id, stack))
}

/// The running uthread's stack: its lowest usable address and its usable
/// size (a guard page lies below); `None` on a kthread's own stack.
pub fn current_uthread_stack() -> Option<(usize, usize)> {
    with_running_stack(|_, stack| (stack.guard_range().1, stack.usable_size()))
}

/// If `addr` is in the guard page of the running uthread's stack: the
/// kthread id and the stack's usable size.
pub(crate) fn guard_page_hit(addr: usize) -> Option<(usize, usize)> {
    with_running_stack(|id, stack| {
        let (lo, hi) = stack.guard_range();
        (lo..hi).contains(&addr).then(|| (id, stack.usable_size()))
    })
    .flatten()
}
