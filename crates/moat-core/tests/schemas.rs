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

/// The denial reasons table in docs/protocol.md is generated from the code.
#[test]
fn the_denial_reason_table_matches_the_code() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/protocol.md");
    let mut table = String::from("| reason | meaning |\n|---|---|\n");
    for reason in moat_core::DenialReason::ALL {
        table.push_str(&format!(
            "| `{}` | {} |\n",
            reason.as_str(),
            reason.describe()
        ));
    }
    let doc = std::fs::read_to_string(&path).unwrap_or_default();
    let (start, end) = (
        "<!-- denial-reasons:start -->\n",
        "<!-- denial-reasons:end -->",
    );
    let (Some(a), Some(b)) = (doc.find(start), doc.find(end)) else {
        panic!("docs/protocol.md lacks the denial-reasons markers");
    };
    let current = &doc[a + start.len()..b];
    if std::env::var_os("MOAT_BLESS").is_some() {
        let updated = format!("{}{table}{}", &doc[..a + start.len()], &doc[b..]);
        std::fs::write(&path, updated).unwrap();
    } else {
        assert_eq!(
            current, table,
            "run MOAT_BLESS=1 cargo test -p moat-core --test schemas"
        );
    }
}
