//! A value published to signal handlers: readers are wait-free and allocation-free (they run in
//! SIGSEGV/SIGTRAP handlers, on the trap's hit path); writers replace the whole value and wait for
//! every reader of the old one before dropping it (a two-counter grace period, as userspace RCU).

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::SeqCst};
use std::sync::Mutex;

pub(crate) struct EpochCell<T> {
    ptr: AtomicPtr<T>,
    epoch: AtomicUsize,
    readers: [AtomicUsize; 2],
    writer: Mutex<()>,
}

impl<T> EpochCell<T> {
    pub(crate) const fn new() -> Self {
        EpochCell {
            ptr: AtomicPtr::new(std::ptr::null_mut()),
            epoch: AtomicUsize::new(0),
            readers: [AtomicUsize::new(0), AtomicUsize::new(0)],
            writer: Mutex::new(()),
        }
    }

    /// Run `f` on the current value. Async-signal-safe: two atomic increments, no lock, no allocation.
    pub(crate) fn read<R>(&self, f: impl FnOnce(Option<&T>) -> R) -> R {
        let parity = loop {
            let e = self.epoch.load(SeqCst);
            self.readers[e & 1].fetch_add(1, SeqCst);
            // Confirm the epoch did not move between the load and the increment: then the writer
            // that moves it away from `e` is guaranteed to see our increment and wait for us.
            if self.epoch.load(SeqCst) == e {
                break e & 1;
            }
            self.readers[e & 1].fetch_sub(1, SeqCst);
        };
        let p = self.ptr.load(SeqCst);
        // SAFETY: `p` is null or came from `Box::into_raw` in `replace`; it is dropped only after
        // the grace period that waits for `readers[parity]`, which we hold until after `f`.
        let r = f(unsafe { p.as_ref() });
        self.readers[parity].fetch_sub(1, SeqCst);
        r
    }

    /// Publish `new` and drop the old value once no reader can still see it.
    pub(crate) fn replace(&self, new: Option<T>) {
        let _w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let new_ptr = new.map_or(std::ptr::null_mut(), |v| Box::into_raw(Box::new(v)));
        let old = self.ptr.swap(new_ptr, SeqCst);
        let old_parity = self.epoch.fetch_add(1, SeqCst) & 1;
        let mut spins = 0u32;
        while self.readers[old_parity].load(SeqCst) != 0 {
            spins += 1;
            if spins < 1000 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        if !old.is_null() {
            // SAFETY: `old` came from `Box::into_raw` and every reader that could have loaded it
            // has finished (the grace period above).
            drop(unsafe { Box::from_raw(old) });
        }
    }

    /// In the child of a `fork`: no reader of the parent's other threads exists here.
    pub(crate) fn reset_readers_after_fork(&self) {
        self.readers[0].store(0, SeqCst);
        self.readers[1].store(0, SeqCst);
    }

    /// Clone of the current value (writer side).
    pub(crate) fn snapshot(&self) -> Option<T>
    where
        T: Clone,
    {
        self.read(|v| v.cloned())
    }

    /// Serialise read-modify-write updates: `f` gets the current value and returns the new one.
    pub(crate) fn update<E>(
        &self,
        f: impl FnOnce(Option<&T>) -> Result<Option<T>, E>,
    ) -> Result<(), E>
    where
        T: Clone,
    {
        // One updater at a time; `replace` takes the writer lock itself, so use a second lock.
        static UPDATE: Mutex<()> = Mutex::new(());
        let _u = UPDATE.lock().unwrap_or_else(|e| e.into_inner());
        let cur = self.snapshot();
        let next = f(cur.as_ref())?;
        self.replace(next);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn readers_never_see_a_freed_value_while_writers_replace_it() {
        static CELL: EpochCell<Vec<u64>> = EpochCell::new();
        CELL.replace(Some(vec![7; 64]));
        let stop = Arc::new(AtomicBool::new(false));
        let started = Arc::new(AtomicUsize::new(0));
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let (stop, started) = (stop.clone(), started.clone());
                std::thread::spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(SeqCst) {
                        if n == 1 {
                            started.fetch_add(1, SeqCst);
                        }
                        CELL.read(|v| {
                            let v = v.expect("always published");
                            // Every element equal: a torn or freed vector would break this.
                            assert!(v.iter().all(|&x| x == v[0]));
                        });
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        while started.load(SeqCst) < 3 {
            std::thread::yield_now();
        }
        for i in 0..2000u64 {
            CELL.replace(Some(vec![i; 64]));
        }
        stop.store(true, SeqCst);
        for r in readers {
            assert!(r.join().unwrap() > 0);
        }
        assert_eq!(CELL.snapshot().unwrap()[0], 1999);
    }
}
