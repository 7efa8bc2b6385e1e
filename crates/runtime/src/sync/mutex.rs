use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU32, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};

use super::{wait_on, WaitQueue, Waited};
use crate::sched;

const LOCKED: u32 = 1;
const WAITERS: u32 = 2;

/// A mutual-exclusion lock whose waiters are suspended uthreads. Unlocking
/// with waiters hands the lock directly to the oldest one (FIFO, no barging
/// past a woken waiter).
pub struct Mutex<T: ?Sized> {
    // u32 rather than u8: a full-register CAS operand avoids a partial-register
    // merge on the uncontended path.
    state: AtomicU32,
    waiters: WaitQueue,
    value: UnsafeCell<T>,
}

// SAFETY: the lock gives exclusive access to `value`, as std's Mutex does.
unsafe impl<T: ?Sized + Send> Send for Mutex<T> {}
// SAFETY: as above.
unsafe impl<T: ?Sized + Send> Sync for Mutex<T> {}

/// Access to a locked [`Mutex`]'s value; unlocks on drop.
pub struct MutexGuard<'a, T: ?Sized> {
    pub(super) mutex: &'a Mutex<T>,
}

impl<T> Mutex<T> {
    pub const fn new(value: T) -> Self {
        Mutex {
            state: AtomicU32::new(0),
            waiters: WaitQueue::new(std::collections::VecDeque::new()),
            value: UnsafeCell::new(value),
        }
    }

    pub fn into_inner(self) -> T {
        self.value.into_inner()
    }
}

impl<T: ?Sized> Mutex<T> {
    pub fn lock(&self) -> MutexGuard<'_, T> {
        if self
            .state
            .compare_exchange(0, LOCKED, Acquire, Relaxed)
            .is_err()
        {
            self.lock_slow();
        }
        MutexGuard { mutex: self }
    }

    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        self.try_acquire().then_some(MutexGuard { mutex: self })
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.value.get_mut()
    }

    fn try_acquire(&self) -> bool {
        let mut s = self.state.load(Relaxed);
        while s & LOCKED == 0 {
            match self
                .state
                .compare_exchange_weak(s, s | LOCKED, Acquire, Relaxed)
            {
                Ok(_) => return true,
                Err(now) => s = now,
            }
        }
        false
    }

    #[cold]
    fn lock_slow(&self) {
        // A short spin catches holders on other kthreads about to unlock.
        for _ in 0..64 {
            if self.try_acquire() {
                return;
            }
            std::hint::spin_loop();
        }
        loop {
            let waited = wait_on(&self.waiters, || {
                // With the wait queue locked: take the lock, or announce a
                // waiter, atomically with respect to unlock_slow.
                loop {
                    let s = self.state.load(Relaxed);
                    if s & LOCKED == 0 {
                        if self
                            .state
                            .compare_exchange(s, s | LOCKED, Acquire, Relaxed)
                            .is_ok()
                        {
                            return false;
                        }
                    } else if self
                        .state
                        .compare_exchange(s, s | WAITERS, Relaxed, Relaxed)
                        .is_ok()
                    {
                        return true;
                    }
                }
            });
            match waited {
                // Woken by unlock_slow, which handed the lock over; or took it.
                Waited::Woken | Waited::Declined => return,
                // An ordinary thread: no uthread to suspend.
                Waited::NotAUthread => {
                    if self.try_acquire() {
                        return;
                    }
                    std::thread::yield_now();
                }
            }
        }
    }

    /// # Safety
    /// The caller holds the lock.
    pub(super) unsafe fn unlock(&self) {
        if self
            .state
            .compare_exchange(LOCKED, 0, Release, Relaxed)
            .is_err()
        {
            self.unlock_slow();
        }
    }

    #[cold]
    fn unlock_slow(&self) {
        let mut q = self.waiters.lock();
        match q.pop_front() {
            Some(next) => {
                // Hand over: the lock stays LOCKED, now owned by `next`.
                if q.is_empty() {
                    self.state.store(LOCKED, Relaxed);
                }
                drop(q);
                sched::wake(next);
            }
            None => self.state.store(0, Release),
        }
    }
}

impl<T: ?Sized> Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the guard proves the lock is held.
        unsafe { &*self.mutex.value.get() }
    }
}

impl<T: ?Sized> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: the guard proves the lock is held exclusively.
        unsafe { &mut *self.mutex.value.get() }
    }
}

impl<T: ?Sized> Drop for MutexGuard<'_, T> {
    fn drop(&mut self) {
        // SAFETY: the guard proves the lock is held.
        unsafe { self.mutex.unlock() };
    }
}

impl<T: Default> Default for Mutex<T> {
    fn default() -> Self {
        Mutex::new(T::default())
    }
}
