//! The manifest lifecycle, as pure functions of a clock the caller passes
//! in (so tests drive time); the control plane and runners share it:
//!
//! - a runner starts refreshing at min(expiresAt − 24 h, expiresAt − 25% of
//!   the lifetime), retries with exponential backoff (reporting
//!   `runner.manifest.refresh_failed` from the first failure), and swaps a
//!   fresh manifest in at the next operation boundary
//!   (`runner.manifest.refreshed`);
//! - new claims after expiry are rejected (`manifest_expired`);
//! - a run claimed before expiry may finish on its manifest until
//!   expiresAt + grace (grace defaults to the manifest's `timeoutMs`), however
//!   late it was claimed, then it is force-failed
//!   (`manifest_expired_with_grace_exceeded`, to the dead-letter queue);
//! - revocation (of the runner hash or the signing key) takes effect at once.

use std::time::{Duration, SystemTime};

/// Creation and expiry of one manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetime {
    pub created: SystemTime,
    pub expires: SystemTime,
}

const DAY: Duration = Duration::from_secs(24 * 3600);

impl Lifetime {
    /// When refreshing starts.
    pub fn refresh_at(&self) -> SystemTime {
        let life = self
            .expires
            .duration_since(self.created)
            .unwrap_or(Duration::ZERO);
        let by_day = self.expires.checked_sub(DAY).unwrap_or(self.created);
        let by_quarter = self.expires.checked_sub(life / 4).unwrap_or(self.created);
        by_day.min(by_quarter).max(self.created)
    }
}

/// Delay before refresh attempt `failures + 1`: 1 s, 2 s, 4 s… capped at 5 min.
pub fn backoff(failures: u32) -> Duration {
    let cap = Duration::from_secs(300);
    Duration::from_secs(1u64 << failures.min(16)).min(cap)
}

/// Why a claim or a run is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// `manifest_expired`: no new claim on an expired manifest.
    ManifestExpired,
    /// `manifest_expired_with_grace_exceeded`: the run outlived expiresAt + grace.
    GraceExceeded,
    /// The runner hash or the signing key was revoked.
    Revoked,
}

impl Stop {
    pub fn as_str(self) -> &'static str {
        match self {
            Stop::ManifestExpired => "manifest_expired",
            Stop::GraceExceeded => "manifest_expired_with_grace_exceeded",
            Stop::Revoked => "revoked",
        }
    }
}

/// May a run be claimed now? `Ok` carries the time it must be done by.
pub fn claim(
    now: SystemTime,
    manifest: &Lifetime,
    grace: Duration,
    revoked: bool,
) -> Result<SystemTime, Stop> {
    if revoked {
        return Err(Stop::Revoked);
    }
    if now >= manifest.expires {
        return Err(Stop::ManifestExpired);
    }
    // A grace too long to add is a broken manifest: no claim on it.
    manifest
        .expires
        .checked_add(grace)
        .ok_or(Stop::ManifestExpired)
}

/// May a claimed run go on now?
pub fn in_flight(
    now: SystemTime,
    manifest: &Lifetime,
    grace: Duration,
    revoked: bool,
) -> Result<(), Stop> {
    if revoked {
        return Err(Stop::Revoked);
    }
    match manifest.expires.checked_add(grace) {
        Some(end) if now <= end => Ok(()),
        _ => Err(Stop::GraceExceeded),
    }
}

/// What the refresher wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Nothing to do until then.
    WaitUntil(SystemTime),
    /// Fetch a fresh manifest now.
    Fetch,
}

/// A reportable step (the event types of the same names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// `runner.manifest.refresh_failed`: attempt `failures` failed; next at `retry_at`.
    RefreshFailed { failures: u32, retry_at: SystemTime },
    /// `runner.manifest.refreshed`: the new manifest is in use from this operation on.
    Refreshed,
}

/// A runner's refresh state, generic over how it holds a manifest.
#[derive(Debug)]
pub struct Refresher<M> {
    current: (M, Lifetime),
    staged: Option<(M, Lifetime)>,
    failures: u32,
    retry_at: Option<SystemTime>,
}

impl<M> Refresher<M> {
    pub fn new(manifest: M, lifetime: Lifetime) -> Self {
        Refresher {
            current: (manifest, lifetime),
            staged: None,
            failures: 0,
            retry_at: None,
        }
    }

    /// The manifest operations use now.
    pub fn current(&self) -> &M {
        &self.current.0
    }

    pub fn next(&self, now: SystemTime) -> Next {
        if self.staged.is_some() {
            return Next::WaitUntil(self.current.1.expires);
        }
        let due = self.retry_at.unwrap_or_else(|| self.current.1.refresh_at());
        if now >= due {
            Next::Fetch
        } else {
            Next::WaitUntil(due)
        }
    }

    /// A fetch failed.
    pub fn failed(&mut self, now: SystemTime) -> Report {
        let retry_at = now + backoff(self.failures);
        self.failures += 1;
        self.retry_at = Some(retry_at);
        Report::RefreshFailed {
            failures: self.failures,
            retry_at,
        }
    }

    /// A fetch brought a (verified) manifest: kept until the next operation boundary.
    pub fn fetched(&mut self, manifest: M, lifetime: Lifetime) {
        self.staged = Some((manifest, lifetime));
        self.failures = 0;
        self.retry_at = None;
    }

    /// Called between operations: swaps a staged manifest in.
    pub fn at_op_boundary(&mut self) -> Option<Report> {
        let staged = self.staged.take()?;
        self.current = staged;
        Some(Report::Refreshed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `hours` after a fixed instant.
    fn at(hours: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + hours * 3600)
    }

    #[test]
    fn the_refresh_window_is_the_earlier_of_a_day_and_a_quarter_before_expiry() {
        // 7 days: a day before expiry is later than a quarter (42 h) before.
        let week = Lifetime {
            created: at(0),
            expires: at(168),
        };
        assert_eq!(week.refresh_at(), at(126));
        // 2 days: a day before (24 h) is earlier than a quarter (12 h) before.
        let two = Lifetime {
            created: at(0),
            expires: at(48),
        };
        assert_eq!(two.refresh_at(), at(24));
        // 8 hours: a day before would precede creation; a quarter is 2 h.
        let short = Lifetime {
            created: at(0),
            expires: at(8),
        };
        assert_eq!(short.refresh_at(), at(0));
    }

    #[test]
    fn claims_and_runs_follow_expiry_grace_and_revocation() {
        let m = Lifetime {
            created: at(0),
            expires: at(10),
        };
        let grace = Duration::from_secs(600);
        let one_second_before = at(10) - Duration::from_secs(1);
        // Claimed 1 s before expiry: the full grace after expiry.
        assert_eq!(
            claim(one_second_before, &m, grace, false),
            Ok(at(10) + grace)
        );
        assert_eq!(claim(at(10), &m, grace, false), Err(Stop::ManifestExpired));
        assert_eq!(claim(at(1), &m, grace, true), Err(Stop::Revoked));
        assert_eq!(in_flight(at(10) + grace, &m, grace, false), Ok(()));
        assert_eq!(
            in_flight(at(10) + grace + Duration::from_secs(1), &m, grace, false),
            Err(Stop::GraceExceeded)
        );
        assert_eq!(in_flight(at(2), &m, grace, true), Err(Stop::Revoked));
        assert_eq!(
            Stop::GraceExceeded.as_str(),
            "manifest_expired_with_grace_exceeded"
        );
    }

    #[test]
    fn refresh_retries_with_backoff_and_swaps_at_an_operation_boundary() {
        let m = Lifetime {
            created: at(0),
            expires: at(48),
        };
        let mut r = Refresher::new("v1", m);
        assert_eq!(r.next(at(1)), Next::WaitUntil(at(24)));
        assert_eq!(r.next(at(24)), Next::Fetch);
        let t = at(24);
        assert_eq!(
            r.failed(t),
            Report::RefreshFailed {
                failures: 1,
                retry_at: t + Duration::from_secs(1)
            }
        );
        assert_eq!(r.next(t), Next::WaitUntil(t + Duration::from_secs(1)));
        let t2 = t + Duration::from_secs(1);
        assert_eq!(
            r.failed(t2),
            Report::RefreshFailed {
                failures: 2,
                retry_at: t2 + Duration::from_secs(2)
            }
        );
        assert_eq!(backoff(40), Duration::from_secs(300));
        // A fetch lands; operations still use v1 until the boundary.
        r.fetched(
            "v2",
            Lifetime {
                created: at(24),
                expires: at(72),
            },
        );
        assert_eq!(*r.current(), "v1");
        assert_eq!(r.at_op_boundary(), Some(Report::Refreshed));
        assert_eq!(*r.current(), "v2");
        assert_eq!(r.at_op_boundary(), None);
        assert_eq!(r.next(at(25)), Next::WaitUntil(at(48)));
    }
}
