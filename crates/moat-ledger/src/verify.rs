//! Recomputing the chain.

use crate::{GENESIS, Ledger, LedgerError, chain_hash};

/// What a successful verification saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub events: i64,
    pub head: String,
}

/// The first place the chain breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("event #{0} is missing (deleted)")]
    Missing(i64),
    #[error("event #{0} was edited (its content does not match its hash)")]
    Edited(i64),
    #[error("event #{0} is out of place (reordered, or its predecessor was replaced)")]
    Reordered(i64),
    #[error("the newest events after #{last} were deleted (the head says #{head})")]
    TruncatedTail { last: i64, head: i64 },
    #[error("the head record does not match event #{0}")]
    HeadMismatch(i64),
}

impl Ledger {
    /// Recomputes every hash in order. `Ok(Err(_))` names the first break.
    pub fn verify(&self) -> Result<Result<Verified, VerifyError>, LedgerError> {
        let (head_seq, head_hash) = self.head()?;
        let mut stmt = self
            .conn
            .prepare("SELECT seq, body, prev_hash, hash FROM events ORDER BY seq")?;
        let mut rows = stmt.query([])?;
        let mut walk = Walk::new();
        while let Some(row) = rows.next()? {
            let seq: i64 = row.get(0)?;
            let body = row.get_ref(1)?.as_bytes().map_err(rusqlite::Error::from)?;
            let prev_hash = row.get_ref(2)?.as_str().map_err(rusqlite::Error::from)?;
            let hash = row.get_ref(3)?.as_str().map_err(rusqlite::Error::from)?;
            if let Err(broken) = walk.step(seq, prev_hash, hash, body) {
                return Ok(Err(broken));
            }
        }
        Ok(walk.finish(head_seq, &head_hash))
    }
}

/// Walks a chain link by link, in sequence order, from the genesis hash
/// (the control plane's store checks its shared chain with the same rule).
pub struct Walk {
    expected: i64,
    prev: String,
}

impl Default for Walk {
    fn default() -> Self {
        Walk::new()
    }
}

impl Walk {
    pub fn new() -> Self {
        Walk {
            expected: 1,
            prev: GENESIS.to_owned(),
        }
    }

    /// The sequence number the next link must have.
    pub fn expected(&self) -> i64 {
        self.expected
    }

    /// One stored link; `hashed` is what its hash covers.
    pub fn step(
        &mut self,
        seq: i64,
        prev_hash: &str,
        hash: &str,
        hashed: &[u8],
    ) -> Result<(), VerifyError> {
        if seq != self.expected {
            return Err(VerifyError::Missing(self.expected));
        }
        if prev_hash != self.prev {
            return Err(VerifyError::Reordered(seq));
        }
        if chain_hash(&self.prev, seq, hashed) != hash {
            return Err(VerifyError::Edited(seq));
        }
        hash.clone_into(&mut self.prev);
        self.expected += 1;
        Ok(())
    }

    /// The end of the walk against the head record.
    pub fn finish(self, head_seq: i64, head_hash: &str) -> Result<Verified, VerifyError> {
        let last = self.expected - 1;
        if last < head_seq {
            return Err(VerifyError::TruncatedTail {
                last,
                head: head_seq,
            });
        }
        if last != head_seq || self.prev != head_hash {
            return Err(VerifyError::HeadMismatch(last));
        }
        Ok(Verified {
            events: last,
            head: self.prev,
        })
    }
}
