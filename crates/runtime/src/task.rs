//! `spawn` and `JoinHandle`: the std::thread-shaped face of uthreads.

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use crate::error::JoinError;
use crate::preempt;
use crate::sched::{self, Shared, URef};
use crate::sync::spinlock::SpinLock;

enum Waiter {
    UThread(URef),
    Thread(std::thread::Thread),
}

struct JoinState {
    done: bool,
    waiter: Option<Waiter>,
}

/// Where a uthread leaves its result for its `JoinHandle`.
struct Packet<T> {
    state: SpinLock<JoinState>,
    result: UnsafeCell<Option<std::thread::Result<T>>>,
}

// SAFETY: `result` is written once by the uthread before `done` is set under
// the lock, and read only by the joiner after it saw `done` under the lock.
unsafe impl<T: Send> Sync for Packet<T> {}

impl<T> Packet<T> {
    fn complete(&self, result: std::thread::Result<T>) {
        // SAFETY: only the spawned uthread writes, once, before `done`.
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

/// An owned permission to wait for a uthread and take its result. Dropping
/// it detaches the uthread.
pub struct JoinHandle<T> {
    packet: Arc<Packet<T>>,
}

impl<T> JoinHandle<T> {
    /// Waits for the uthread to finish. From a uthread this blocks only the
    /// uthread; from an ordinary thread it blocks that thread. A panic in the
    /// uthread comes back as [`JoinError::Panicked`].
    pub fn join(self) -> Result<T, JoinError> {
        let guard = preempt::Guard::new();
        let mut st = self.packet.state.lock();
        if !st.done {
            match sched::current_uthread() {
                Some(me) => {
                    st.waiter = Some(Waiter::UThread(me));
                    drop(st);
                    sched::park_current();
                }
                None => {
                    st.waiter = Some(Waiter::Thread(std::thread::current()));
                    drop(st);
                    drop(guard);
                    while !self.packet.state.lock().done {
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
        self.packet.state.lock().done
    }

    fn take(self) -> Result<T, JoinError> {
        // SAFETY: `done` was observed under the lock, so the write happened
        // before; we are the only reader (join consumes the handle).
        let result = unsafe { (*self.packet.result.get()).take() };
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

/// `f` as a uthread entry that leaves its result (or panic) for the handle.
fn packaged<F, T>(f: F) -> (Box<dyn FnOnce() + Send>, JoinHandle<T>)
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let packet = Arc::new(Packet {
        state: SpinLock::new(JoinState {
            done: false,
            waiter: None,
        }),
        result: UnsafeCell::new(None),
    });
    let theirs = Arc::clone(&packet);
    let entry = Box::new(move || theirs.complete(catch_unwind(AssertUnwindSafe(f))));
    (entry, JoinHandle { packet })
}
