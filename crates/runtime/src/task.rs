//! `spawn` and `JoinHandle`: the std::thread-shaped face of uthreads.
//!
//! A spawned closure, its result slot and the joiner's bookkeeping share one
//! allocation (`Task`), seen by the uthread as a [`Runnable`] and by the
//! handle as a [`Joinable`].

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use crate::deferral;
use crate::error::JoinError;
use crate::sched::{self, Runnable, Shared, URef};
use crate::spinlock::SpinLock;

enum Waiter {
    UThread(URef),
    Thread(std::thread::Thread),
}

struct JoinState {
    done: bool,
    waiter: Option<Waiter>,
}

struct Task<F, T> {
    func: UnsafeCell<Option<F>>,
    state: SpinLock<JoinState>,
    result: UnsafeCell<Option<std::thread::Result<T>>>,
}

// SAFETY: `func` is taken once by the uthread that runs the task; `result`
// is written once by it before `done` is set under the lock, and read only
// by the joiner after it saw `done` under the lock.
unsafe impl<F: Send, T: Send> Sync for Task<F, T> {}

impl<F, T> Runnable for Task<F, T>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    fn run(&self) {
        // SAFETY: run is called once, by the task's own uthread.
        let Some(f) = (unsafe { (*self.func.get()).take() }) else {
            return;
        };
        let result = catch_unwind(AssertUnwindSafe(f));
        // SAFETY: the only write, before `done` is published.
        unsafe { *self.result.get() = Some(result) };
        let waiter = {
            let mut st = self.state.lock();
            st.done = true;
            st.waiter.take()
        };
        match waiter {
            Some(Waiter::UThread(u)) => sched::wake(u),
            Some(Waiter::Thread(t)) => t.unpark(),
            None => {}
        }
    }
}

/// The joiner's view of a task.
trait Joinable<T>: Send + Sync {
    fn state(&self) -> &SpinLock<JoinState>;
    /// # Safety
    /// Only after `done` was seen under the lock, and only once.
    unsafe fn take_result(&self) -> Option<std::thread::Result<T>>;
}

impl<F: Send, T: Send> Joinable<T> for Task<F, T> {
    fn state(&self) -> &SpinLock<JoinState> {
        &self.state
    }
    unsafe fn take_result(&self) -> Option<std::thread::Result<T>> {
        // SAFETY: the caller saw `done`, so the write happened before; the
        // handle is consumed by the one call.
        unsafe { (*self.result.get()).take() }
    }
}

/// An owned permission to wait for a uthread and take its result. Dropping
/// it detaches the uthread.
pub struct JoinHandle<T> {
    task: Arc<dyn Joinable<T>>,
}

impl<T> JoinHandle<T> {
    /// Waits for the uthread to finish. From a uthread this blocks only the
    /// uthread; from an ordinary thread it blocks that thread. A panic in the
    /// uthread comes back as [`JoinError::Panicked`].
    pub fn join(self) -> Result<T, JoinError> {
        let guard = deferral::Guard::new();
        let mut st = self.task.state().lock();
        if !st.done {
            match sched::current_uthread(&guard) {
                Some(me) => {
                    st.waiter = Some(Waiter::UThread(me));
                    drop(st);
                    sched::park_current(&guard);
                }
                None => {
                    st.waiter = Some(Waiter::Thread(std::thread::current()));
                    drop(st);
                    drop(guard);
                    while !self.task.state().lock().done {
                        std::thread::park();
                    }
                    return self.take();
                }
            }
        } else {
            drop(st);
        }
        drop(guard);
        self.take()
    }

    /// Whether the uthread has finished.
    pub fn is_finished(&self) -> bool {
        self.task.state().lock().done
    }

    fn take(self) -> Result<T, JoinError> {
        // SAFETY: every caller saw `done` under the lock; `self` is consumed.
        let result = unsafe { self.task.take_result() };
        match result.expect("join: finished uthread left no result") {
            Ok(v) => Ok(v),
            Err(payload) => Err(JoinError::from_panic(payload)),
        }
    }
}

/// Spawns a uthread on the caller's runtime. Panics outside a Ginza runtime
/// (use [`crate::Handle::spawn`] from ordinary threads).
pub fn spawn<F, T>(f: F) -> JoinHandle<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let rt = sched::current_runtime()
        .expect("ginza_runtime::spawn called outside a Ginza runtime: call it from a uthread, or use Handle::spawn");
    spawn_on(rt, f)
}

/// As [`spawn`], with a stack of at least `stack_size` usable bytes (the
/// runtime's `Config::stack_size` when that is larger). Fails when the
/// stack cannot be mapped. Panics outside a Ginza runtime.
pub fn spawn_with_stack_size<F, T>(stack_size: usize, f: F) -> std::io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let rt = sched::current_runtime()
        .expect("ginza_runtime::spawn_with_stack_size called outside a Ginza runtime");
    let (entry, handle) = packaged(f);
    sched::spawn_erased_with_stack(rt, entry, stack_size)?;
    Ok(handle)
}

pub(crate) fn spawn_on<F, T>(rt: *const Shared, f: F) -> JoinHandle<T>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let (entry, handle) = packaged(f);
    sched::spawn_erased(rt, entry);
    handle
}

/// A uthread for `f` that is not queued anywhere: the Shinjuku dispatcher
/// decides where and when it runs.
pub(crate) fn unqueued<F, T>(rt: *const Shared, f: F) -> (URef, JoinHandle<T>)
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let (entry, handle) = packaged(f);
    (sched::new_unqueued(rt, entry), handle)
}

/// As [`unqueued`], on the context (and stack) of a request that exited.
pub(crate) fn unqueued_on<F, T>(spare: sched::SpareContext, f: F) -> (URef, JoinHandle<T>)
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let (entry, handle) = packaged(f);
    (spare.reuse(entry), handle)
}

fn packaged<F, T>(f: F) -> (sched::Entry, JoinHandle<T>)
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let task = Arc::new(Task {
        func: UnsafeCell::new(Some(f)),
        state: SpinLock::new(JoinState {
            done: false,
            waiter: None,
        }),
        result: UnsafeCell::new(None),
    });
    let entry: sched::Entry = task.clone();
    (entry, JoinHandle { task })
}
