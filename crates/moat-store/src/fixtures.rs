//! Test fixtures, behind the `test-fixtures` feature: never in a build
//! that ships.

use crate::StoreError;

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
