//! The JSON Schemas under `docs/schema/` match the code. Regenerate them with
//! `MOAT_BLESS=1 cargo test -p moat-core --test schemas`.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::PathBuf;

#[test]
fn checked_in_schemas_match_the_code() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/schema");
    let bless = std::env::var_os("MOAT_BLESS").is_some();
    if bless {
        std::fs::create_dir_all(&dir).unwrap();
    }
    let mut stale = Vec::new();
    for (name, schema) in moat_core::schema::all() {
        let path = dir.join(format!("{name}.schema.json"));
        if bless {
            std::fs::write(&path, &schema).unwrap();
        } else if std::fs::read_to_string(&path).ok().as_deref() != Some(schema.as_str()) {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "out of date: {stale:?}; run MOAT_BLESS=1 cargo test -p moat-core --test schemas"
    );
}
