//! Counts a metrics scrape asks for: what is waiting now, across orgs.

use crate::{Store, StoreError};

/// What waits, at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Waiting {
    /// Queued runs by environment.
    pub queued_runs: Vec<(String, u64)>,
    /// Approval requests nobody has decided yet.
    pub pending_approvals: u64,
}

impl Store {
    /// Queued runs by environment and pending approvals (two statements,
    /// read-only).
    pub fn waiting(&self) -> Result<Waiting, StoreError> {
        self.read(|tx| {
            let queued = tx.query(
                "SELECT environment, COUNT(*) AS n FROM runs WHERE state = 'queued'
                 GROUP BY environment ORDER BY environment",
                &[],
            )?;
            let pending = tx.query_one(
                "SELECT COUNT(*) AS n FROM approvals WHERE state = 'pending'",
                &[],
            )?;
            let count = |n: i64| u64::try_from(n).unwrap_or(0);
            Ok(Waiting {
                queued_runs: queued
                    .iter()
                    .map(|row| Ok((row.text("environment")?, count(row.int("n")?))))
                    .collect::<Result<_, StoreError>>()?,
                pending_approvals: match pending {
                    Some(row) => count(row.int("n")?),
                    None => 0,
                },
            })
        })
    }
}
