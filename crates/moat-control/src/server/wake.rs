//! Waking waiting requests (`wait_ms` long polls) when something they wait
//! for may have changed. A change to one run (an operation queued,
//! dispatched or answered) wakes only the requests waiting on that run; a
//! run to claim wakes one claim of its org's runners in its environment
//! (which passes the turn on when it got one); any other change wakes
//! everyone. With many runs in flight, waking every waiter on every change
//! made each of them re-query the store: work that grew with the square of
//! the runs in progress (a new run woke every run's runner, and every
//! claim, of which all but one found nothing).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{Notify, watch};

/// What a waiting request waits for, besides changes of everything.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Topic {
    /// One run's operations and state: every waiter looks again.
    Run(String),
    /// Runs an org's runners may claim in an environment: one waiter
    /// looks again (or the next to wait, if none waits now).
    Queue { org: String, environment: String },
}

/// The change counters: one for everything, one per run being waited on,
/// a turn per queue being waited on.
pub struct Wakes {
    any: watch::Sender<u64>,
    runs: Mutex<HashMap<String, watch::Sender<u64>>>,
    queues: Mutex<HashMap<(String, String), Arc<Notify>>>,
}

/// Counts a change; returns the count it made (read in the same lock, so
/// no other change can come between).
fn bump(sender: &watch::Sender<u64>) -> u64 {
    let mut made = 0;
    sender.send_modify(|n| {
        *n = n.wrapping_add(1);
        made = *n;
    });
    made
}

impl Wakes {
    pub fn new() -> Wakes {
        Wakes {
            any: watch::channel(0).0,
            runs: Mutex::new(HashMap::new()),
            queues: Mutex::new(HashMap::new()),
        }
    }

    /// Something changed that any waiter may care about.
    pub fn all(&self) {
        bump(&self.any);
    }

    /// Run `run` changed: its waiters look again. Returns the change's
    /// count, for [`Watch::saw`] (none: nobody waits on the run).
    pub fn run(&self, run: &str) -> Option<u64> {
        let runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
        runs.get(run).map(bump)
    }

    /// `topic` changed: its waiters look again (one of them, for a queue),
    /// nobody else.
    pub fn topic(&self, topic: &Topic) {
        match topic {
            Topic::Run(run) => {
                self.run(run);
            }
            Topic::Queue { org, environment } => {
                let queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(turn) = queues.get(&(org.clone(), environment.clone())) {
                    turn.notify_one();
                }
            }
        }
    }

    /// A waiter's view: every change, and those of `topic`.
    pub fn watch(&self, topic: Topic) -> Watch<'_> {
        let on = match topic {
            Topic::Run(run) => {
                let receiver = self
                    .runs
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entry(run.clone())
                    .or_insert_with(|| watch::channel(0).0)
                    .subscribe();
                On::Run(run, receiver)
            }
            Topic::Queue { org, environment } => {
                let key = (org, environment);
                let turn = Arc::clone(
                    self.queues
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .entry(key.clone())
                        .or_default(),
                );
                On::Queue(key, turn)
            }
        };
        Watch {
            wakes: self,
            any: self.any.subscribe(),
            on: Some(on),
        }
    }
}

/// A waiter's topic, as it listens to it.
enum On {
    Run(String, watch::Receiver<u64>),
    Queue((String, String), Arc<Notify>),
}

/// What one waiting request listens to; its topic is forgotten once nobody
/// waits on it.
pub struct Watch<'a> {
    wakes: &'a Wakes,
    any: watch::Receiver<u64>,
    on: Option<On>,
}

impl Watch<'_> {
    /// From now on, only changes after this call wake `changed` (a queue's
    /// turn already handed to this waiter is kept: it is one run to claim).
    pub fn mark_unchanged(&mut self) {
        self.any.mark_unchanged();
        if let Some(On::Run(_, receiver)) = &mut self.on {
            receiver.mark_unchanged();
        }
    }

    /// The change counted `own` (see [`Wakes::run`]) was this waiter's own
    /// doing: it does not wake it. A change counted after it still does.
    pub fn saw(&mut self, own: u64) {
        if let Some(On::Run(_, receiver)) = &mut self.on {
            // Value and version are read together: a later change cannot
            // be marked seen with it.
            if *receiver.borrow_and_update() != own {
                receiver.mark_changed();
            }
        }
    }

    /// Returns when a change this waiter listens to happens.
    pub async fn changed(&mut self) {
        match &mut self.on {
            Some(On::Run(_, run)) => {
                tokio::select! {
                    _ = self.any.changed() => {}
                    _ = run.changed() => {}
                }
            }
            Some(On::Queue(_, turn)) => {
                tokio::select! {
                    _ = self.any.changed() => {}
                    () = turn.notified() => {}
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
        match self.on.take() {
            Some(On::Run(run, receiver)) => {
                drop(receiver);
                let mut runs = self
                    .wakes
                    .runs
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if runs.get(&run).is_some_and(|s| s.receiver_count() == 0) {
                    runs.remove(&run);
                }
            }
            Some(On::Queue(key, turn)) => {
                drop(turn);
                let mut queues = self
                    .wakes
                    .queues
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                // Only the map holds it: nobody waits on this queue.
                if queues.get(&key).is_some_and(|t| Arc::strong_count(t) == 1) {
                    queues.remove(&key);
                }
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Topic, Wakes};

    /// Whether `watch` wakes within a short time.
    async fn woken(watch: &mut super::Watch<'_>) -> bool {
        tokio::time::timeout(Duration::from_millis(50), watch.changed())
            .await
            .is_ok()
    }

    fn queue(org: &str) -> Topic {
        Topic::Queue {
            org: org.into(),
            environment: "default".into(),
        }
    }

    #[tokio::test]
    async fn a_run_wakes_its_waiters_only_and_everything_wakes_all() {
        let wakes = Wakes::new();
        let mut run = wakes.watch(Topic::Run("r1".into()));
        let mut again = wakes.watch(Topic::Run("r1".into()));
        let mut other = wakes.watch(Topic::Run("r2".into()));
        let mut claims = wakes.watch(queue("org_a"));

        wakes.topic(&Topic::Run("r1".into()));
        assert!(woken(&mut run).await);
        assert!(woken(&mut again).await);
        assert!(!woken(&mut other).await);
        assert!(!woken(&mut claims).await);

        wakes.all();
        for watch in [&mut run, &mut again, &mut other, &mut claims] {
            assert!(woken(watch).await);
        }
    }

    #[tokio::test]
    async fn a_waiter_is_not_woken_by_its_own_change_but_by_one_after_it() {
        let wakes = Wakes::new();
        let mut own = wakes.watch(Topic::Run("r1".into()));
        let mut other = wakes.watch(Topic::Run("r1".into()));
        let made = wakes.run("r1").expect("someone waits on r1");
        own.saw(made);
        assert!(!woken(&mut own).await);
        assert!(woken(&mut other).await);

        // Another change came between its own and its looking: it wakes.
        let made = wakes.run("r1").expect("someone waits on r1");
        wakes.run("r1");
        own.saw(made);
        assert!(woken(&mut own).await);
        assert_eq!(wakes.run("r2"), None, "nobody waits on r2");
    }

    #[tokio::test]
    async fn a_queue_wakes_one_claim_of_its_org_and_keeps_a_turn_for_the_next() {
        let wakes = Wakes::new();
        let mut first = wakes.watch(queue("org_a"));
        let mut second = wakes.watch(queue("org_a"));
        let mut elsewhere = wakes.watch(queue("org_b"));
        let mut run = wakes.watch(Topic::Run("r1".into()));

        wakes.topic(&queue("org_a"));
        let (a, b) = tokio::join!(woken(&mut first), woken(&mut second));
        assert!(a ^ b, "exactly one claim looks again ({a}, {b})");
        assert!(!woken(&mut elsewhere).await);
        assert!(!woken(&mut run).await);

        // Nobody waiting when it came: the next to wait has the turn.
        wakes.topic(&queue("org_a"));
        assert!(woken(&mut first).await);
        assert!(!woken(&mut second).await);
    }

    #[tokio::test]
    async fn a_topic_nobody_waits_on_is_forgotten() {
        let wakes = Wakes::new();
        let first = wakes.watch(queue("org_a"));
        let second = wakes.watch(queue("org_a"));
        let run = wakes.watch(Topic::Run("r1".into()));
        drop(first);
        let len = |w: &Wakes| {
            let count = |n: Result<usize, ()>| n.unwrap_or(usize::MAX);
            (
                count(w.runs.lock().map(|t| t.len()).map_err(drop)),
                count(w.queues.lock().map(|t| t.len()).map_err(drop)),
            )
        };
        assert_eq!(len(&wakes), (1, 1));
        drop((second, run));
        assert_eq!(len(&wakes), (0, 0));
        // A change of a topic nobody waits on costs nothing and keeps nothing.
        wakes.topic(&Topic::Run("gone".into()));
        wakes.topic(&queue("gone"));
        assert_eq!(len(&wakes), (0, 0));
    }
}
