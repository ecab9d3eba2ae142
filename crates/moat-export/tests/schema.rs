//! The export report's JSON Schema under `docs/schema/` matches the code
//! (the rules' is moat-core's). Regenerate with
//! `MOAT_BLESS=1 cargo test -p moat-export --test schema`.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::PathBuf;

use schemars::schema_for;

#[test]
fn checked_in_schema_matches_the_code() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs/schema/export-report.schema.json");
    let text = moat_core::schema::render(&schema_for!(moat_export::ExportReport));
    if std::env::var_os("MOAT_BLESS").is_some() {
        std::fs::write(&path, &text).unwrap();
    } else {
        assert_eq!(
            std::fs::read_to_string(&path).ok().as_deref(),
            Some(text.as_str()),
            "{} is out of date: run MOAT_BLESS=1 cargo test -p moat-export --test schema",
            path.display()
        );
    }
}
