//! The export report's JSON Schema under `docs/schema/` matches the code
//! (the rules' is moat-core's). Regenerate with
//! `MOAT_BLESS=1 cargo test -p moat-export --test schema`.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::PathBuf;

use schemars::schema_for;

#[test]
fn checked_in_schemas_match_the_code() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/schema");
    let bless = std::env::var_os("MOAT_BLESS").is_some();
    for (name, schema) in [("export-report", schema_for!(moat_export::ExportReport))] {
        let text = moat_core::schema::render(&schema);
        let path = dir.join(format!("{name}.schema.json"));
        if bless {
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
}
