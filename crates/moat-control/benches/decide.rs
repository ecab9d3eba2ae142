#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A policy decision plus the capability it grants, in process (target:
//! median under 1 ms).
//!
//!   cargo bench -p moat-control --bench decide

use std::time::{Duration, SystemTime};

use criterion::{Criterion, criterion_group, criterion_main};
use moat_control::{Decision, OpRequest, PolicyEngine, Resource};
use moat_core::sign::PrivateKey;
use moat_core::{Envelope, NetworkMode, OpKind, SandboxMode};

/// A policy set of some size: 200 per-path permits, forbids, an approval rule.
fn policies() -> String {
    let mut text = String::new();
    for i in 0..200 {
        text.push_str(&format!(
            "@id(\"read-{i}\") permit(principal in Moat::Org::\"org-{i}\", \
             action == Moat::Action::\"artifact_read\", resource) when {{ context.size <= 1048576 }};\n"
        ));
    }
    text.push_str("forbid(principal, action, resource == Moat::Path::\"input/secrets.env\");\n");
    text.push_str(
        "@approval(\"required\") permit(principal, action == Moat::Action::\"exec_argv\", resource) \
         when { context.network != \"off\" };\n",
    );
    text
}

fn bench(c: &mut Criterion) {
    let engine = PolicyEngine::new(&policies()).unwrap();
    let key = PrivateKey::from_seed([1; 32]);
    let envelope: Envelope = serde_json::from_value(serde_json::json!({
        "id": "1", "runId": "run-1", "correlationId": "c", "op": "artifact_read",
        "args": {"path": "input/a.csv", "maxBytes": 4096}, "createdAt": "2026-11-29T12:00:00Z"
    }))
    .unwrap();
    let request = OpRequest {
        org: "org-150",
        runner: "runner-1",
        op: OpKind::ArtifactRead,
        resource: Resource::Path("input/a.csv".into()),
        size: 4096,
        network: NetworkMode::Off,
        sandbox: SandboxMode::WorkspaceWrite,
        origin: moat_core::ExecutableOrigin::Trusted,
        path: "input/a.csv",
        method: "",
        action: "",
        domain: "",
        element: None,
    };
    c.bench_function("decide + sign capability (202 policies)", |b| {
        b.iter(|| {
            let decision = engine.decide(&request).unwrap();
            assert!(matches!(decision, Decision::Allow { .. }));
            engine
                .grant(
                    (
                        &envelope,
                        OpKind::ArtifactRead,
                        moat_core::WorkloadClass::Namespace,
                        None,
                    ),
                    &key,
                    SystemTime::now(),
                    Duration::from_secs(30),
                    "nonce".into(),
                )
                .unwrap()
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
