//! JSON Schemas of the public types, as checked in under `docs/schema/`.

use schemars::schema_for;

/// `(file stem, pretty JSON schema)` for every public wire type.
pub fn all() -> Vec<(&'static str, String)> {
    let schemas = [
        ("sandbox-report", schema_for!(crate::SandboxReport)),
        ("event", schema_for!(crate::Event)),
        ("limits", schema_for!(crate::Limits)),
        ("sandbox-mode", schema_for!(crate::SandboxMode)),
        ("network-mode", schema_for!(crate::NetworkMode)),
        ("envelope", schema_for!(crate::Envelope)),
        ("op-result", schema_for!(crate::OpResult)),
        ("denial-reason", schema_for!(crate::DenialReason)),
        ("manifest", schema_for!(crate::Manifest)),
        ("signed-manifest", schema_for!(crate::SignedManifest)),
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
        ("stored-request", schema_for!(crate::op::StoredRequest)),
        (
            "capability-claims",
            schema_for!(crate::capability::CapabilityClaims),
        ),
    ];
    schemas
        .into_iter()
        .map(|(name, schema)| {
            let text = serde_json::to_string_pretty(&schema)
                .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
            (name, text + "\n")
        })
        .collect()
}
