//! Who may ask for a run now: the claiming loop, and a slot whose run ends
//! with its finish (`FinishBody::then_claim_ms`), within the runner's
//! `max_runs`, counting the asks still in flight.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

pub(crate) struct Claims {
    max: Option<u64>,
    counts: Mutex<Counts>,
    settled: Condvar,
}

#[derive(Default)]
struct Counts {
    claimed: u64,
    asking: u64,
    loop_over: bool,
}

impl Counts {
    fn room(&self, max: Option<u64>) -> bool {
        max.is_none_or(|max| self.claimed.saturating_add(self.asking) < max)
    }
}

/// One ask for a run in flight: counted as claimed if [`Ask::took`], given
/// back otherwise when dropped.
pub(crate) struct Ask<'a>(&'a Claims);

impl Claims {
    pub fn new(max: Option<u64>) -> Claims {
        Claims {
            max,
            counts: Mutex::new(Counts::default()),
            settled: Condvar::new(),
        }
    }

    fn counts(&self) -> MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An ask for one run, if one more may still be claimed: for a run's
    /// last report, which never waits for room (`None`: it asks for
    /// nothing). Once the claiming loop has ended (`max_runs` reached, a
    /// drain, a refusal or an error), nothing more is asked for.
    pub fn ask(&self) -> Option<Ask<'_>> {
        let mut counts = self.counts();
        if counts.loop_over || !counts.room(self.max) {
            return None;
        }
        counts.asking += 1;
        Some(Ask(self))
    }

    /// An ask for one run for the claiming loop: while the asks in flight
    /// leave no room it waits for them to settle (one that comes back
    /// empty gives its room back); `None` once `max_runs` were claimed.
    pub fn ask_or_wait(&self) -> Option<Ask<'_>> {
        let mut counts = self.counts();
        loop {
            if counts.room(self.max) {
                counts.asking += 1;
                return Some(Ask(self));
            }
            if counts.asking == 0 {
                return None;
            }
            counts = self
                .settled
                .wait(counts)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// The claiming loop has ended.
    pub fn end_loop(&self) {
        self.counts().loop_over = true;
        self.settled.notify_all();
    }

    /// No run can be claimed here any more: the claiming loop has ended and
    /// no ask is in flight (runs are given back only then, or an ask could
    /// claim one of them again).
    pub fn over(&self) -> bool {
        let counts = self.counts();
        counts.loop_over && counts.asking == 0
    }
}

impl Ask<'_> {
    /// A run came: it counts towards `max_runs`.
    pub fn took(self) {
        self.0.counts().claimed += 1;
    }
}

impl Drop for Ask<'_> {
    fn drop(&mut self) {
        let mut counts = self.0.counts();
        counts.asking = counts.asking.saturating_sub(1);
        drop(counts);
        self.0.settled.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_maximum_every_ask_may_go() {
        let claims = Claims::new(None);
        let asks: Vec<_> = (0..100).filter_map(|_| claims.ask()).collect();
        assert_eq!(asks.len(), 100);
        for ask in asks {
            ask.took();
        }
        assert!(claims.ask_or_wait().is_some());
    }

    #[test]
    fn asks_in_flight_count_towards_the_maximum_until_they_come_back_empty() {
        let claims = Claims::new(Some(2));
        let first = claims.ask();
        let second = claims.ask();
        assert!(first.is_some() && second.is_some());
        assert!(claims.ask().is_none(), "two asks in flight fill two runs");
        drop(second);
        let third = claims.ask();
        assert!(third.is_some(), "an empty answer gives its room back");
        if let (Some(first), Some(third)) = (first, third) {
            first.took();
            third.took();
        }
        assert!(claims.ask().is_none());
        assert!(
            claims.ask_or_wait().is_none(),
            "two claimed, none in flight"
        );
    }

    #[test]
    fn the_loop_waits_for_an_ask_in_flight_then_takes_its_room() {
        let claims = Claims::new(Some(1));
        let finishing = claims.ask();
        assert!(finishing.is_some());
        std::thread::scope(|scope| {
            let looping = scope.spawn(|| claims.ask_or_wait().is_some());
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert!(!looping.is_finished(), "room may still be filled");
            drop(finishing);
            assert!(looping.join().unwrap_or(false));
        });
    }

    #[test]
    fn the_loop_stops_waiting_when_the_ask_in_flight_takes_the_last_run() {
        let claims = Claims::new(Some(1));
        let finishing = claims.ask();
        std::thread::scope(|scope| {
            let looping = scope.spawn(|| claims.ask_or_wait().is_none());
            std::thread::sleep(std::time::Duration::from_millis(50));
            if let Some(ask) = finishing {
                ask.took();
            }
            assert!(looping.join().unwrap_or(false));
        });
    }

    #[test]
    fn nothing_is_asked_for_once_the_loop_has_ended() {
        let claims = Claims::new(None);
        claims.end_loop();
        assert!(claims.ask().is_none());
        assert!(claims.over());
    }

    #[test]
    fn claims_are_over_only_once_the_loop_ended_and_no_ask_is_in_flight() {
        let claims = Claims::new(None);
        let ask = claims.ask();
        assert!(!claims.over());
        claims.end_loop();
        assert!(!claims.over(), "a finish's ask could still claim a run");
        drop(ask);
        assert!(claims.over());
    }
}
