//! Which CPUs a launch runs on while the sandbox is being set up.
//!
//! init's setup (planning and building the root) and the launcher's work
//! meanwhile (ids, the network namespace helper, cgroup) run side by side,
//! and together they are the critical path of a launch. Left to the
//! scheduler, init is often cloned onto the launcher's CPU and runs first
//! there, or stays there (a pipe write is a "sync" wake-up that keeps the
//! woken task on the waker's CPU), while another CPU idles. So when the
//! launcher may use more than one CPU, init moves itself onto one CPU first
//! thing, the launcher keeps off that CPU from right after the clone (not
//! before: a clone inherits the CPU set, and would then have to start on the
//! launcher's CPU), and both restore the launcher's original set once the
//! setup is over: the program never sees the pinning.

use std::cell::Cell;

use crate::error::{Layer, SetupError};

pub(crate) struct Placement {
    /// The launcher's own CPU set, which the program gets.
    original: libc::cpu_set_t,
    /// init's CPU during setup, when there is a second one to give it.
    init_cpu: Option<usize>,
    /// Whether this process (launcher or init: each has its own copy) is
    /// pinned now, so that restoring is a no-op when it is not.
    pinned: Cell<bool>,
}

impl Placement {
    /// Reads the launcher's CPU set and picks a CPU for init other than the
    /// current one, spread by pid so concurrent launches do not all pick the
    /// same. Any failure just means no pinning.
    pub(crate) fn plan() -> Placement {
        let mut original = empty();
        // SAFETY: original is a valid cpu_set_t of the size passed.
        let ok = unsafe {
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut original)
        } == 0;
        // SAFETY: plain queries.
        let (current, pid) = unsafe { (libc::sched_getcpu(), libc::getpid()) };
        let others: Vec<usize> = if ok && current >= 0 {
            (0..libc::CPU_SETSIZE as usize)
                // SAFETY: CPU_ISSET reads an in-range bit of a valid set.
                .filter(|&cpu| {
                    cpu != current as usize && unsafe { libc::CPU_ISSET(cpu, &original) }
                })
                .collect()
        } else {
            Vec::new()
        };
        let init_cpu =
            (!others.is_empty()).then(|| others[pid.unsigned_abs() as usize % others.len()]);
        Placement {
            original,
            init_cpu,
            pinned: Cell::new(false),
        }
    }

    /// In the launcher, right after the clone: keep off init's CPU (it is
    /// not the current one, so this moves nothing). Best effort, as is
    /// [`Placement::take_init_cpu`]: a failure only costs time.
    pub(crate) fn keep_off_init_cpu(&self) {
        if let Some(cpu) = self.init_cpu {
            let mut others = self.original;
            // SAFETY: clears an in-range bit of a valid set.
            unsafe { libc::CPU_CLR(cpu, &mut others) };
            self.pinned.set(set(0, &others));
        }
    }

    /// In init, first thing: onto its own CPU.
    pub(crate) fn take_init_cpu(&self) {
        if let Some(cpu) = self.init_cpu {
            let mut only = empty();
            // SAFETY: sets an in-range bit of a valid set.
            unsafe { libc::CPU_SET(cpu, &mut only) };
            self.pinned.set(set(0, &only));
        }
    }

    /// The launcher's original set again, for the calling process (the
    /// launcher once init is set up, init before it starts the program).
    pub(crate) fn restore(&self) -> Result<(), SetupError> {
        if !self.pinned.get() || set(0, &self.original) {
            self.pinned.set(false);
            return Ok(());
        }
        Err(SetupError::io(
            Layer::Launcher,
            "restoring the CPU set",
            std::io::Error::last_os_error(),
        ))
    }
}

fn empty() -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is plain old data; all zeroes is the empty set.
    unsafe { std::mem::zeroed() }
}

fn set(pid: libc::pid_t, cpus: &libc::cpu_set_t) -> bool {
    // SAFETY: cpus is a valid cpu_set_t of the size passed.
    unsafe { libc::sched_setaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), cpus) == 0 }
}
