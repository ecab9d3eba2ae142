//! Each org's quotas, as the deployment's admin set them, and the org's use
//! against them: read inside a claim's transaction, so that two claims
//! cannot both take the last concurrent run.

use moat_core::quota::{Exceeded, OverQuota, Quota, QuotaPeriod, QuotaUse};

use crate::db::Tx;
use crate::{Store, StoreError};

fn signed(n: Option<u64>) -> crate::Value {
    n.map(|n| i64::try_from(n).unwrap_or(i64::MAX)).into()
}

fn unsigned(n: Option<i64>) -> Option<u64> {
    n.map(|n| u64::try_from(n).unwrap_or(0))
}

/// The org's quota (`None`: none set).
pub(crate) fn get(tx: &mut dyn Tx, org: &str) -> Result<Option<Quota>, StoreError> {
    tx.query_one(
        &format!("SELECT {COLUMNS} FROM org_quotas WHERE org_id = ?"),
        &[org.into()],
    )?
    .as_ref()
    .map(decode)
    .transpose()
}

/// A quota's columns (in a select list that may join them to others).
pub(crate) const COLUMNS: &str =
    "concurrent_runs, cpu_seconds, storage_bytes, egress_bytes, period, over";

/// The quota's columns of `org_quotas` joined as `table` (`LEFT JOIN`),
/// with `quota_org` saying whether a row joined: for [`decode_joined`].
pub(crate) fn joined_columns(table: &str) -> String {
    let columns = COLUMNS
        .split(',')
        .map(|c| format!("{table}.{}", c.trim()))
        .collect::<Vec<_>>()
        .join(", ");
    format!("{table}.org_id AS quota_org, {columns}")
}

/// The quota of a row with [`joined_columns`] (`None`: none set).
pub(crate) fn decode_joined(row: &crate::Row) -> Result<Option<Quota>, StoreError> {
    match row.opt_text("quota_org")? {
        Some(_) => decode(row).map(Some),
        None => Ok(None),
    }
}

/// A quota from its [`COLUMNS`].
pub(crate) fn decode(row: &crate::Row) -> Result<Quota, StoreError> {
    let period = row.text("period")?;
    let over = row.text("over")?;
    Ok(Quota {
        concurrent_runs: unsigned(row.opt_int("concurrent_runs")?),
        cpu_seconds: unsigned(row.opt_int("cpu_seconds")?),
        storage_bytes: unsigned(row.opt_int("storage_bytes")?),
        egress_bytes: unsigned(row.opt_int("egress_bytes")?),
        period: QuotaPeriod::parse(&period)
            .ok_or_else(|| StoreError::Corrupt(format!("quota period {period:?}")))?,
        over: OverQuota::parse(&over)
            .ok_or_else(|| StoreError::Corrupt(format!("quota over {over:?}")))?,
    })
}

/// What `org` has used in the period of `quota` that holds `now`: its
/// live runs, and the usage of its runs that ended in the period.
pub(crate) fn used(
    tx: &mut dyn Tx,
    org: &str,
    period: QuotaPeriod,
    now: i64,
) -> Result<QuotaUse, StoreError> {
    let today: String = moat_core::time::stamp_ms(now).chars().take(10).collect();
    let row = tx.query_one(
        "SELECT (SELECT COUNT(*) FROM runs WHERE org_id = ?
                   AND state IN ('claimed', 'running', 'paused')) AS live,
                CAST(COALESCE(SUM(cpu_ms), 0) AS BIGINT) AS cpu_ms,
                CAST(COALESCE(SUM(bytes_written), 0) AS BIGINT) AS storage,
                CAST(COALESCE(SUM(egress_bytes_out + egress_bytes_in), 0) AS BIGINT) AS egress
         FROM usage_days WHERE org_id = ? AND day >= ?",
        &[org.into(), org.into(), period.start(&today).into()],
    )?;
    let n = |name: &str| -> Result<u64, StoreError> {
        Ok(match &row {
            Some(row) => u64::try_from(row.int(name)?).unwrap_or(0),
            None => 0,
        })
    };
    Ok(QuotaUse {
        concurrent_runs: n("live")?,
        cpu_ms: n("cpu_ms")?,
        storage_bytes: n("storage")?,
        egress_bytes: n("egress")?,
    })
}

/// The quota `org` has reached, if any (and its setting).
pub(crate) fn reached(
    tx: &mut dyn Tx,
    org: &str,
    now: i64,
) -> Result<Option<(Exceeded, OverQuota)>, StoreError> {
    let quota = get(tx, org)?;
    reached_of(tx, org, quota, now)
}

/// As [`reached`], with the org's quota already read.
pub(crate) fn reached_of(
    tx: &mut dyn Tx,
    org: &str,
    quota: Option<Quota>,
    now: i64,
) -> Result<Option<(Exceeded, OverQuota)>, StoreError> {
    let Some(quota) = quota.filter(|q| !q.is_empty()) else {
        return Ok(None);
    };
    let used = used(tx, org, quota.period, now)?;
    Ok(quota.exceeded(&used).map(|e| (e, quota.over)))
}

impl Store {
    /// Sets `org`'s quota (an empty one removes it).
    pub fn set_quota(&self, org: &str, quota: &Quota, now: i64) -> Result<(), StoreError> {
        self.tx(|tx| {
            if quota.is_empty() {
                tx.execute("DELETE FROM org_quotas WHERE org_id = ?", &[org.into()])?;
                return Ok(());
            }
            tx.execute(
                "INSERT INTO org_quotas (org_id, concurrent_runs, cpu_seconds, storage_bytes,
                     egress_bytes, period, over, updated_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
                 ON CONFLICT (org_id) DO UPDATE SET concurrent_runs = excluded.concurrent_runs,
                     cpu_seconds = excluded.cpu_seconds, storage_bytes = excluded.storage_bytes,
                     egress_bytes = excluded.egress_bytes, period = excluded.period,
                     over = excluded.over, updated_ms = excluded.updated_ms",
                &[
                    org.into(),
                    signed(quota.concurrent_runs),
                    signed(quota.cpu_seconds),
                    signed(quota.storage_bytes),
                    signed(quota.egress_bytes),
                    quota.period.as_str().into(),
                    quota.over.as_str().into(),
                    now.into(),
                ],
            )?;
            Ok(())
        })
    }

    /// `org`'s quota (`None`: no limit) and its use in the current period.
    pub fn quota(&self, org: &str, now: i64) -> Result<(Option<Quota>, QuotaUse), StoreError> {
        self.read(|tx| {
            let quota = get(tx, org)?;
            let period = quota.as_ref().map(|q| q.period).unwrap_or_default();
            Ok((quota.clone(), used(tx, org, period, now)?))
        })
    }

    /// The quota `org` has reached now, if any, and what over-quota runs do.
    pub fn quota_reached(
        &self,
        org: &str,
        now: i64,
    ) -> Result<Option<(Exceeded, OverQuota)>, StoreError> {
        self.read(|tx| reached(tx, org, now))
    }
}
