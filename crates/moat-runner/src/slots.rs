//! A runner's slots: how many of its runs may be in progress at once.

use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

/// The default number of slots: two runs per CPU (a run mostly waits: for
/// its agent, a person, the network), bounded by memory at `per_run` bytes
/// each, never less than one.
pub fn default_slots(per_run: u64) -> u16 {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let by_cpu = cpus.saturating_mul(2);
    let by_memory = memory_total().map_or(usize::MAX, |total| {
        usize::try_from(total / per_run.max(1)).unwrap_or(usize::MAX)
    });
    let slots = by_cpu.min(by_memory).clamp(1, 256);
    u16::try_from(slots).unwrap_or(1)
}

/// The CPUs this process may use, in millicores.
pub fn host_cpu_millis() -> u64 {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    u64::try_from(cpus).unwrap_or(1).saturating_mul(1000)
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
pub fn memory_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

pub(crate) struct Slots {
    pub total: usize,
    used: Mutex<usize>,
    freed: Condvar,
}

impl Slots {
    pub fn new(total: usize) -> Slots {
        Slots {
            total,
            used: Mutex::new(0),
            freed: Condvar::new(),
        }
    }

    /// Waits for a free slot and takes it (how many are then in use),
    /// unless `stop` turns true first (looked at every tenth of a second
    /// while all slots are in use): then `None`, and nothing is taken.
    pub fn take_unless(&self, stop: impl Fn() -> bool) -> Option<usize> {
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if stop() {
                return None;
            }
            if *used < self.total {
                *used += 1;
                return Some(*used);
            }
            used = self
                .freed
                .wait_timeout(used, Duration::from_millis(100))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    fn give_back(&self) {
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        *used = used.saturating_sub(1);
        self.freed.notify_one();
    }
}

/// A taken slot, given back when the run's thread ends however it ends.
pub(crate) struct SlotGuard<'a>(pub &'a Slots);

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        self.0.give_back();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_comes_back_however_its_run_ends() {
        let slots = Slots::new(2);
        let take = || slots.take_unless(|| false);
        assert_eq!(take(), Some(1));
        {
            let _guard = SlotGuard(&slots);
            assert_eq!(take(), Some(2));
        }
        assert_eq!(take(), Some(2), "the guard gave one back");
        assert_eq!(slots.take_unless(|| true), None, "a stop wins over a wait");
        let all = Slots::new(1);
        assert_eq!(all.take_unless(|| false), Some(1));
        let asked = std::sync::atomic::AtomicUsize::new(0);
        let stop = || asked.fetch_add(1, std::sync::atomic::Ordering::Relaxed) >= 2;
        assert_eq!(
            all.take_unless(stop),
            None,
            "a full runner stops waiting when told"
        );
        assert!(default_slots(u64::MAX) >= 1);
    }
}
