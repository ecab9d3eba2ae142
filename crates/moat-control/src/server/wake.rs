//! Waking waiting requests (`wait_ms` long polls) when something they wait
//! for may have changed. A change to one run (an operation queued,
//! dispatched or answered) wakes only the requests waiting on that run; any
//! other change wakes everyone. With many runs in flight, waking every
//! waiter on every operation made each of them re-query the store: work
//! that grew with the square of the runs in progress.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use tokio::sync::watch;

/// The change counters: one for everything, one per run being waited on.
pub struct Wakes {
    any: watch::Sender<u64>,
    runs: Mutex<HashMap<String, watch::Sender<u64>>>,
}

fn bump(sender: &watch::Sender<u64>) {
    sender.send_modify(|n| *n = n.wrapping_add(1));
}

impl Wakes {
    pub fn new() -> Wakes {
        Wakes {
            any: watch::channel(0).0,
            runs: Mutex::new(HashMap::new()),
        }
    }

    /// Something changed that any waiter may care about.
    pub fn all(&self) {
        bump(&self.any);
    }

    /// Run `run` changed: its waiters look again, nobody else.
    pub fn run(&self, run: &str) {
        let runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sender) = runs.get(run) {
            bump(sender);
        }
    }

    /// A waiter's view: every change, and those of `run` if given.
    pub fn watch(&self, run: Option<&str>) -> Watch<'_> {
        let run = run.map(|id| {
            let mut runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
            let receiver = runs
                .entry(id.to_owned())
                .or_insert_with(|| watch::channel(0).0)
                .subscribe();
            (id.to_owned(), receiver)
        });
        Watch {
            wakes: self,
            any: self.any.subscribe(),
            run,
        }
    }
}

/// What one waiting request listens to; its run's counter is forgotten
/// once nobody waits on that run.
pub struct Watch<'a> {
    wakes: &'a Wakes,
    any: watch::Receiver<u64>,
    run: Option<(String, watch::Receiver<u64>)>,
}

impl Watch<'_> {
    /// From now on, only changes after this call wake `changed`.
    pub fn mark_unchanged(&mut self) {
        self.any.mark_unchanged();
        if let Some((_, receiver)) = &mut self.run {
            receiver.mark_unchanged();
        }
    }

    /// Returns when a change this waiter listens to happens.
    pub async fn changed(&mut self) {
        match &mut self.run {
            Some((_, run)) => {
                tokio::select! {
                    _ = self.any.changed() => {}
                    _ = run.changed() => {}
                }
            }
            None => {
                let _ = self.any.changed().await;
            }
        }
    }
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        if let Some((id, receiver)) = self.run.take() {
            drop(receiver);
            let mut runs = self
                .wakes
                .runs
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if runs.get(&id).is_some_and(|s| s.receiver_count() == 0) {
                runs.remove(&id);
            }
        }
    }
}
