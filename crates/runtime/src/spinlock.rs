//! A short-hold spinlock for the runtime's own queues. Holding it defers
//! preemption, so its holder is never descheduled by the runtime itself;
//! Linux may still deschedule an oversubscribed kthread, hence the yield
//! after a while of spinning.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};

use crate::deferral;

pub(crate) struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the lock serialises all access to `value`, as a Mutex does.
unsafe impl<T: Send> Sync for SpinLock<T> {}
// SAFETY: owning the lock owns the value.
unsafe impl<T: Send> Send for SpinLock<T> {}

pub(crate) struct SpinGuard<'a, T> {
    lock: &'a SpinLock<T>,
    preempt: *const deferral::PreemptState,
}

impl<T> SpinLock<T> {
    pub(crate) const fn new(value: T) -> Self {
        SpinLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    pub(crate) fn lock(&self) -> SpinGuard<'_, T> {
        let preempt = deferral::disable();
        let mut spins = 0u32;
        while self
            .locked
            .compare_exchange_weak(false, true, Acquire, Relaxed)
            .is_err()
        {
            while self.locked.load(Relaxed) {
                spins += 1;
                if spins > 1000 {
                    // The holder's kthread may be descheduled by Linux.
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
        SpinGuard {
            lock: self,
            preempt,
        }
    }

    pub(crate) fn try_lock(&self) -> Option<SpinGuard<'_, T>> {
        let preempt = deferral::disable();
        if self
            .locked
            .compare_exchange(false, true, Acquire, Relaxed)
            .is_ok()
        {
            Some(SpinGuard {
                lock: self,
                preempt,
            })
        } else {
            deferral::enable(preempt);
            None
        }
    }
}

impl<T: Default> Default for SpinLock<T> {
    fn default() -> Self {
        SpinLock::new(T::default())
    }
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: holding the guard means holding the lock.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: holding the guard means holding the lock exclusively.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.locked.store(false, Release);
        deferral::enable(self.preempt);
    }
}
