//! An org's quotas and whether its use is over them: what decides that its
//! new runs wait (or are refused) until use falls back or a period turns.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Over how long CPU time, storage and egress add up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum QuotaPeriod {
    /// The UTC day.
    #[default]
    Day,
    /// The UTC calendar month.
    Month,
}

impl QuotaPeriod {
    pub fn as_str(self) -> &'static str {
        match self {
            QuotaPeriod::Day => "day",
            QuotaPeriod::Month => "month",
        }
    }

    pub fn parse(text: &str) -> Option<QuotaPeriod> {
        match text {
            "day" => Some(QuotaPeriod::Day),
            "month" => Some(QuotaPeriod::Month),
            _ => None,
        }
    }

    /// The first `YYYY-MM-DD` of the period that holds `day` (a
    /// `YYYY-MM-DD`): usage days from it on count.
    pub fn start(self, day: &str) -> String {
        match self {
            QuotaPeriod::Day => day.to_owned(),
            QuotaPeriod::Month => format!("{}-01", day.get(..7).unwrap_or(day)),
        }
    }
}

/// What happens to a new run while the org is over a quota.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OverQuota {
    /// It is created and waits in the queue until the org is under quota.
    #[default]
    Wait,
    /// Creating it is refused (`429 quota_exceeded`).
    Refuse,
}

impl OverQuota {
    pub fn as_str(self) -> &'static str {
        match self {
            OverQuota::Wait => "wait",
            OverQuota::Refuse => "refuse",
        }
    }

    pub fn parse(text: &str) -> Option<OverQuota> {
        match text {
            "wait" => Some(OverQuota::Wait),
            "refuse" => Some(OverQuota::Refuse),
            _ => None,
        }
    }
}

/// An org's quotas; an absent limit is no limit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Quota {
    /// Runs held by runners at once (claimed, running or paused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent_runs: Option<u64>,
    /// CPU time of the programs of runs that ended in the period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<u64>,
    /// Bytes written into writable roots by runs that ended in the period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_bytes: Option<u64>,
    /// Egress bytes, out and in, of runs that ended in the period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_bytes: Option<u64>,
    #[serde(default)]
    pub period: QuotaPeriod,
    #[serde(default)]
    pub over: OverQuota,
}

/// An org's use, against its quota.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuotaUse {
    pub concurrent_runs: u64,
    pub cpu_ms: u64,
    pub storage_bytes: u64,
    pub egress_bytes: u64,
}

/// Which quota is reached, and how far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exceeded {
    /// `concurrent_runs`, `cpu_seconds`, `storage_bytes` or `egress_bytes`.
    pub quota: &'static str,
    pub limit: u64,
    pub used: u64,
}

impl std::fmt::Display for Exceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Exceeded { quota, limit, used } = self;
        write!(f, "quota_exceeded: {quota} {used} of {limit}")
    }
}

impl Quota {
    /// Whether a limit is set at all.
    pub fn is_empty(&self) -> bool {
        self.concurrent_runs.is_none()
            && self.cpu_seconds.is_none()
            && self.storage_bytes.is_none()
            && self.egress_bytes.is_none()
    }

    /// The first quota `used` has reached (`None`: room for one more run).
    /// A limit is reached at equality: a quota of 4 concurrent runs lets a
    /// fifth wait, and a CPU budget spent to the second lets nothing more
    /// start.
    pub fn exceeded(&self, used: &QuotaUse) -> Option<Exceeded> {
        let checks = [
            (
                "concurrent_runs",
                self.concurrent_runs,
                used.concurrent_runs,
            ),
            ("cpu_seconds", self.cpu_seconds, used.cpu_ms / 1000),
            ("storage_bytes", self.storage_bytes, used.storage_bytes),
            ("egress_bytes", self.egress_bytes, used.egress_bytes),
        ];
        checks.into_iter().find_map(|(quota, limit, used)| {
            let limit = limit?;
            (used >= limit).then_some(Exceeded { quota, limit, used })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_limit_reached_is_named_and_absent_limits_never_are() {
        let used = QuotaUse {
            concurrent_runs: 3,
            cpu_ms: 59_999,
            storage_bytes: 10,
            egress_bytes: 500,
        };
        // (quota, what it names as reached: quota, limit, used)
        type Case = (Quota, Option<(&'static str, u64, u64)>);
        let cases: [Case; 8] = [
            (Quota::default(), None),
            (
                Quota {
                    concurrent_runs: Some(4),
                    ..Quota::default()
                },
                None,
            ),
            (
                Quota {
                    concurrent_runs: Some(3),
                    ..Quota::default()
                },
                Some(("concurrent_runs", 3, 3)),
            ),
            (
                Quota {
                    concurrent_runs: Some(0),
                    ..Quota::default()
                },
                Some(("concurrent_runs", 0, 3)),
            ),
            // 59.999 s is 59 whole seconds: under a 60 s budget.
            (
                Quota {
                    cpu_seconds: Some(60),
                    ..Quota::default()
                },
                None,
            ),
            (
                Quota {
                    cpu_seconds: Some(59),
                    ..Quota::default()
                },
                Some(("cpu_seconds", 59, 59)),
            ),
            (
                Quota {
                    storage_bytes: Some(11),
                    egress_bytes: Some(500),
                    ..Quota::default()
                },
                Some(("egress_bytes", 500, 500)),
            ),
            (
                Quota {
                    concurrent_runs: Some(1),
                    egress_bytes: Some(1),
                    ..Quota::default()
                },
                Some(("concurrent_runs", 1, 3)),
            ),
        ];
        for (quota, expected) in cases {
            let got = quota.exceeded(&used);
            let got = got.as_ref().map(|e| (e.quota, e.limit, e.used));
            assert_eq!(got, expected, "{quota:?}");
        }
    }

    #[test]
    fn a_period_starts_on_its_first_day() {
        assert_eq!(QuotaPeriod::Day.start("2026-12-03"), "2026-12-03");
        assert_eq!(QuotaPeriod::Month.start("2026-12-03"), "2026-12-01");
    }

    #[test]
    fn unknown_fields_and_settings_are_refused() {
        assert!(serde_json::from_str::<Quota>(r#"{"concurrentRun": 2}"#).is_err());
        assert!(serde_json::from_str::<Quota>(r#"{"period": "week"}"#).is_err());
        let q: Quota = serde_json::from_str(r#"{"cpuSeconds": 60, "over": "refuse"}"#).unwrap();
        assert_eq!(q.over, OverQuota::Refuse);
        assert_eq!(q.period, QuotaPeriod::Day);
    }
}
