//! Claims of one org take turns within this process, from the plain look
//! that says whether anything is queued to the claim's commit.
//!
//! Across processes the claim's transaction takes turns on PostgreSQL's
//! advisory locks (see `Store::claim`), but the look comes before the
//! transaction, so two claims here could both see the same queued run and
//! both open a transaction for it: the second found nothing once the first
//! committed, having spent five round trips on it (measured: a third of
//! all claim transactions under four busy runners). Taking the turn here
//! first, the second looks after the first committed, and finds the run
//! gone in one plain read, or finds the next one. Nothing is lost in
//! parallelism: the transactions were serialised by the advisory lock
//! already.

use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Orgs share a turn when their names hash alike: a bounded table, for a
/// process that serves many orgs, at the cost of two orgs' claims here
/// sometimes waiting on each other (claims onto one host wait on each
/// other anyway).
const STRIPES: usize = 64;

pub(crate) struct ClaimTurns {
    stripes: [Mutex<()>; STRIPES],
    hasher: std::collections::hash_map::RandomState,
}

impl ClaimTurns {
    pub(crate) fn new() -> ClaimTurns {
        ClaimTurns {
            stripes: std::array::from_fn(|_| Mutex::new(())),
            hasher: std::collections::hash_map::RandomState::new(),
        }
    }

    /// Waits for `org`'s turn; it ends when the guard is dropped.
    pub(crate) fn take(&self, org: &str) -> MutexGuard<'_, ()> {
        let stripe = (self.hasher.hash_one(org) % STRIPES as u64) as usize;
        // A claim that panicked held nothing the next one relies on.
        self.stripes[stripe]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, mpsc};
    use std::time::Duration;

    use super::ClaimTurns;

    #[test]
    fn a_claim_waits_for_its_orgs_turn() {
        let turns = Arc::new(ClaimTurns::new());
        let first = turns.take("org_a");
        let (took, told) = mpsc::channel();
        let waiting = {
            let turns = Arc::clone(&turns);
            std::thread::spawn(move || {
                let _turn = turns.take("org_a");
                took.send(()).expect("the test listens");
            })
        };
        assert!(
            told.recv_timeout(Duration::from_millis(100)).is_err(),
            "a second claim of the org went ahead while the first held the turn"
        );
        drop(first);
        told.recv_timeout(Duration::from_secs(10))
            .expect("the second claim takes the turn once the first gives it up");
        waiting.join().expect("the second claim's thread");
    }
}
