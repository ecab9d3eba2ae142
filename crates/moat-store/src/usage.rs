//! What each org's runs used, by UTC day: added to as each run ends, read
//! by the Inspector's usage page.

use moat_core::event_data::RunUsage;

use crate::db::Dialect;
use crate::{Store, StoreError, Value};

/// One org's totals for one UTC day.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageDay {
    /// `YYYY-MM-DD`.
    pub day: String,
    pub runs: u64,
    pub ops: u64,
    /// Operations that did not succeed (denied, failed, timed out...).
    pub ops_failed: u64,
    pub programs: u64,
    pub cpu_ms: u64,
    pub program_wall_ms: u64,
    /// The largest peak of one program that day.
    pub peak_memory_bytes: u64,
    pub egress_requests: u64,
    pub egress_bytes_out: u64,
    pub egress_bytes_in: u64,
    pub violations: u64,
    /// Bytes written into writable roots under a storage budget.
    pub bytes_written: u64,
}

const COUNTED: [&str; 11] = [
    "runs",
    "ops",
    "ops_failed",
    "programs",
    "cpu_ms",
    "program_wall_ms",
    "egress_requests",
    "egress_bytes_out",
    "egress_bytes_in",
    "violations",
    "bytes_written",
];

const MAX: i64 = i64::MAX;

fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The statement that adds one ended run's `used` to its org's day, and
/// its parameters (run in the caller's transaction, alone or in a `WITH`).
pub(crate) fn add_statement(
    dialect: Dialect,
    org: &str,
    now: i64,
    used: &RunUsage,
) -> (String, Vec<Value>) {
    let day: String = moat_core::time::stamp_ms(now).chars().take(10).collect();
    let ops = used.ops.values().fold(0u64, |a, n| a.saturating_add(*n));
    let failed = ops.saturating_sub(used.ops.get("succeeded").copied().unwrap_or(0));
    let larger = match dialect {
        Dialect::Postgres => "GREATEST",
        Dialect::Sqlite => "MAX",
    };
    let sums: Vec<String> = COUNTED
        .iter()
        // Saturating: the figures come from runners' reports, and an
        // overflow would fail every later run end of the org's day.
        .map(|c| {
            format!(
                "{c} = CASE WHEN usage_days.{c} > {MAX} - excluded.{c} THEN {MAX} \
                 ELSE usage_days.{c} + excluded.{c} END"
            )
        })
        .collect();
    let sql = format!(
        "INSERT INTO usage_days (org_id, day, {}, peak_memory_bytes)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
         ON CONFLICT (org_id, day) DO UPDATE SET {},
           peak_memory_bytes = {larger}(usage_days.peak_memory_bytes, excluded.peak_memory_bytes)",
        COUNTED.join(", "),
        sums.join(", ")
    );
    let params = vec![
        org.into(),
        day.as_str().into(),
        1i64.into(),
        signed(ops).into(),
        signed(failed).into(),
        signed(used.programs).into(),
        signed(used.cpu_ms).into(),
        signed(used.program_wall_ms).into(),
        signed(used.egress_requests).into(),
        signed(used.egress_bytes_out).into(),
        signed(used.egress_bytes_in).into(),
        signed(used.violations).into(),
        signed(used.bytes_written).into(),
        signed(used.peak_memory_bytes).into(),
    ];
    (sql, params)
}

impl Store {
    /// `org`'s last `days` days with runs that ended, newest first.
    pub fn usage_days(&self, org: &str, days: i64) -> Result<Vec<UsageDay>, StoreError> {
        self.read(|tx| {
            let rows = tx.query(
                &format!(
                    "SELECT day, {}, peak_memory_bytes FROM usage_days WHERE org_id = ?
                     ORDER BY day DESC LIMIT ?",
                    COUNTED.join(", ")
                ),
                &[org.into(), days.into()],
            )?;
            rows.iter()
                .map(|row| {
                    let n = |c: &str| row.int(c).map(|v| u64::try_from(v).unwrap_or(0));
                    Ok(UsageDay {
                        day: row.text("day")?,
                        runs: n("runs")?,
                        ops: n("ops")?,
                        ops_failed: n("ops_failed")?,
                        programs: n("programs")?,
                        cpu_ms: n("cpu_ms")?,
                        program_wall_ms: n("program_wall_ms")?,
                        peak_memory_bytes: n("peak_memory_bytes")?,
                        egress_requests: n("egress_requests")?,
                        egress_bytes_out: n("egress_bytes_out")?,
                        egress_bytes_in: n("egress_bytes_in")?,
                        violations: n("violations")?,
                        bytes_written: n("bytes_written")?,
                    })
                })
                .collect()
        })
    }
}
