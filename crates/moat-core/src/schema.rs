//! JSON Schemas of the public types, as checked in under `docs/schema/`.

use schemars::schema_for;

/// `(file stem, pretty JSON schema)` for every public wire type.
pub fn all() -> Vec<(&'static str, String)> {
    let schemas = [
        ("sandbox-report", schema_for!(crate::SandboxReport)),
        ("event", schema_for!(crate::Event)),
        ("event-data", schema_for!(crate::EventData)),
        ("limits", schema_for!(crate::Limits)),
        ("sandbox-mode", schema_for!(crate::SandboxMode)),
        ("network-mode", schema_for!(crate::NetworkMode)),
        ("envelope", schema_for!(crate::Envelope)),
        ("op-result", schema_for!(crate::OpResult)),
        ("denial-reason", schema_for!(crate::DenialReason)),
        ("manifest", schema_for!(crate::Manifest)),
        ("signed-manifest", schema_for!(crate::SignedManifest)),
        ("export-rules", schema_for!(crate::exports::ExportRules)),
        (
            "args-artifact-read",
            schema_for!(crate::op::ArtifactReadArgs),
        ),
        (
            "args-artifact-write",
            schema_for!(crate::op::ArtifactWriteArgs),
        ),
        (
            "args-artifact-list",
            schema_for!(crate::op::ArtifactListArgs),
        ),
        ("args-exec-argv", schema_for!(crate::op::ExecArgvArgs)),
        ("args-http-request", schema_for!(crate::op::HttpRequestArgs)),
        ("args-browser-step", schema_for!(crate::op::BrowserStepArgs)),
        ("stored-request", schema_for!(crate::op::StoredRequest)),
        (
            "capability-claims",
            schema_for!(crate::capability::CapabilityClaims),
        ),
    ];
    schemas
        .into_iter()
        .map(|(name, schema)| (name, render(&schema)))
        .collect()
}

/// A schema as checked in: pretty JSON, keys sorted at every level.
pub fn render(schema: &schemars::Schema) -> String {
    let value = serde_json::to_value(schema).map(sorted);
    let text = value
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    text + "\n"
}

/// Keys in sorted order at every level, whether or not another crate in the
/// build turned on serde_json's `preserve_order`.
fn sorted(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<(String, serde_json::Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            serde_json::Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        serde_json::Value::Array(items) => {
            serde_json::Value::Array(items.into_iter().map(sorted).collect())
        }
        other => other,
    }
}
