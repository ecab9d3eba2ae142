//! Admin and agent tokens this process has found, so that a request's
//! token costs no round trip to the database after its first.
//!
//! Sound because such a token's row never changes once written: nothing in
//! the store updates or deletes an `api` or `agent` token, and neither
//! expires (bootstrap tokens, which are spent and expire, are never looked
//! up here). A feature that revokes them must clear this cache in the same
//! commit, across replicas (the change feed), before it ships.
//!
//! Only tokens found are kept: an unknown token is looked up every time, so
//! a token added on another replica works at once, and guessing fills
//! nothing. An entry is trusted for [`KEPT`] at most, so that a row removed
//! by hand (there is no API for it) stops working on every replica within
//! that time.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::TokenKind;

/// How long a token found stays trusted without a look at its row.
pub(crate) const KEPT: Duration = Duration::from_secs(10);

/// Tokens kept at most: a bound on memory for a replica that serves many
/// orgs. When full the cache starts over (the next request of each token
/// reads its row again).
const MOST: usize = 4096;

pub(crate) struct KnownTokens {
    found: Mutex<HashMap<String, Known>>,
}

struct Known {
    org: String,
    kind: TokenKind,
    at: Instant,
}

impl KnownTokens {
    pub(crate) fn new() -> KnownTokens {
        KnownTokens {
            found: Mutex::new(HashMap::new()),
        }
    }

    /// The org and kind of the token whose hash is `hash`, if it was found
    /// less than [`KEPT`] before `now`.
    pub(crate) fn get(&self, hash: &str, now: Instant) -> Option<(String, TokenKind)> {
        let found = self.found.lock().unwrap_or_else(PoisonError::into_inner);
        found
            .get(hash)
            .filter(|known| now.saturating_duration_since(known.at) < KEPT)
            .map(|known| (known.org.clone(), known.kind))
    }

    /// Keeps what the token whose hash is `hash` was found to be, at `now`.
    pub(crate) fn keep(&self, hash: &str, org: &str, kind: TokenKind, now: Instant) {
        let mut found = self.found.lock().unwrap_or_else(PoisonError::into_inner);
        if found.len() >= MOST && !found.contains_key(hash) {
            found.clear();
        }
        found.insert(
            hash.to_owned(),
            Known {
                org: org.to_owned(),
                kind,
                at: now,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{KEPT, KnownTokens, MOST};
    use crate::TokenKind;

    #[test]
    fn a_token_kept_is_answered_until_it_is_kept_too_long() {
        let known = KnownTokens::new();
        let t0 = Instant::now();
        assert_eq!(known.get("h", t0), None);
        known.keep("h", "org_a", TokenKind::Agent, t0);
        assert_eq!(
            known.get("h", t0 + Duration::from_secs(1)),
            Some(("org_a".to_owned(), TokenKind::Agent))
        );
        assert_eq!(known.get("other", t0), None);
        assert_eq!(known.get("h", t0 + KEPT), None);
        // Kept again once read again.
        known.keep("h", "org_a", TokenKind::Agent, t0 + KEPT);
        assert!(known.get("h", t0 + KEPT).is_some());
    }

    #[test]
    fn a_full_cache_starts_over_rather_than_grow() {
        let known = KnownTokens::new();
        let now = Instant::now();
        for i in 0..MOST {
            known.keep(&format!("h{i}"), "org_a", TokenKind::Api, now);
        }
        assert!(known.get("h0", now).is_some());
        known.keep("one more", "org_b", TokenKind::Agent, now);
        assert_eq!(known.get("h0", now), None);
        assert!(known.get("one more", now).is_some());
        let size = known.found.lock().map(|f| f.len()).unwrap_or(usize::MAX);
        assert_eq!(size, 1);
    }
}
