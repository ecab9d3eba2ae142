//! Test fixtures, behind the `test-fixtures` feature: never in a build
//! that ships.

use crate::{RunnerRow, StoreError};

/// A PostgreSQL database of its own for one test, dropped afterwards.
/// The server comes from `MOAT_TEST_POSTGRES` (a libpq `key=value` string;
/// default: the local server's socket as the current user); `tests/suite.sh`
/// starts a throwaway server and sets it.
pub struct TempPostgres {
    admin: String,
    pub name: String,
    pub url: String,
}

impl TempPostgres {
    pub fn create() -> Result<TempPostgres, StoreError> {
        let admin = std::env::var("MOAT_TEST_POSTGRES")
            .unwrap_or_else(|_| "host=/var/run/postgresql dbname=postgres".to_owned());
        let name = moat_core::random::new_id("moat_test_");
        let mut client = admin
            .parse::<postgres::Config>()
            .map_err(|_| StoreError::Url(admin.clone()))?
            .connect(postgres::NoTls)?;
        client.batch_execute(&format!("CREATE DATABASE {name}"))?;
        // libpq key=value strings: a later key overrides an earlier one.
        let url = format!("{admin} dbname={name}");
        Ok(TempPostgres { admin, name, url })
    }
}

impl Drop for TempPostgres {
    fn drop(&mut self) {
        if let Ok(config) = self.admin.parse::<postgres::Config>()
            && let Ok(mut client) = config.connect(postgres::NoTls)
        {
            let _ = client.batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ));
        }
    }
}

/// A registered runner `id` of `org` as tests need one: environment
/// `test`, one workload class, four slots, key `k`, no host, nothing held.
pub fn runner_row(org: &str, id: &str) -> RunnerRow {
    RunnerRow {
        id: id.into(),
        org_id: org.into(),
        runner_hash: "h".into(),
        manifest_hash: "m".into(),
        policy_hash: "p".into(),
        version: "1".into(),
        environment: "test".into(),
        ops: serde_json::json!([]),
        sandbox_mode: "workspace-write".into(),
        boot_time: "t".into(),
        public_key: "k".into(),
        registered_ms: 1,
        seen_ms: 1,
        slots: 4,
        slots_used: 0,
        enrolment_id: None,
        classes: 1,
        host_features: None,
        host_id: None,
        labels: None,
        cpu_millis: 0,
        memory_bytes: 0,
        draining: false,
        cpu_reserved: 0,
        memory_reserved: 0,
    }
}
