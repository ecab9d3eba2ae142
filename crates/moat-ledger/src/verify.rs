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
        let mut expected_seq = 1i64;
        let mut prev = GENESIS.to_owned();
        while let Some(row) = rows.next()? {
            let seq: i64 = row.get(0)?;
            let body = row.get_ref(1)?.as_bytes().map_err(rusqlite::Error::from)?;
            let prev_hash = row.get_ref(2)?.as_str().map_err(rusqlite::Error::from)?;
            let hash = row.get_ref(3)?.as_str().map_err(rusqlite::Error::from)?;
            if seq != expected_seq {
                return Ok(Err(VerifyError::Missing(expected_seq)));
            }
            if prev_hash != prev {
                return Ok(Err(VerifyError::Reordered(seq)));
            }
            if chain_hash(&prev, seq, body) != hash {
                return Ok(Err(VerifyError::Edited(seq)));
            }
            prev = hash.to_owned();
            expected_seq += 1;
        }
        let last = expected_seq - 1;
        if last < head_seq {
            return Ok(Err(VerifyError::TruncatedTail {
                last,
                head: head_seq,
            }));
        }
        if last != head_seq || prev != head_hash {
            return Ok(Err(VerifyError::HeadMismatch(last)));
        }
        Ok(Ok(Verified {
            events: last,
            head: prev,
        }))
    }
}
