#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};

use super::*;
use crate::report::{
    Enforcement, ExitStatus, LayerReport, LayerStatus, LimitMechanism, LimitReport, OutputReport,
    SandboxReport,
};
use crate::{Limits, NetworkMode, RootView, SandboxMode};

const HASH: &str = "29db911305723c8dd70225b79265fba753eab334f92c52536e83605c7ba0800e";
const AT: &str = "2026-12-01T21:31:28.229Z";

fn report() -> Value {
    let layer = || LayerReport::enforced("on");
    let limit = || LimitReport {
        status: LayerStatus::Enforced,
        mechanism: LimitMechanism::Cgroup,
        limit: 256,
        detail: "whole tree".into(),
    };
    serde_json::to_value(SandboxReport {
        run_id: "op-17389fc2e3ab5c4f".into(),
        exit: ExitStatus::Exited { code: 0 },
        exit_code: 0,
        wall_ms: 5,
        cpu_ms: 1,
        peak_memory_bytes: 1 << 20,
        timed_out: false,
        oom_killed: false,
        pids_limit_hit: false,
        interrupted: false,
        stdout: OutputReport::default(),
        stderr: OutputReport::default(),
        denied_syscalls: Vec::new(),
        violations: Vec::new(),
        bytes_written: None,
        peak_pids: None,
        write_budget_reached: false,
        launcher_peak_rss_kib: 4096,
        setup_error: None,
        class: crate::WorkloadClass::Namespace,
        vm: None,
        worker: None,
        enforcement: Enforcement {
            mode: SandboxMode::WorkspaceWrite,
            network: NetworkMode::Off,
            root_view: RootView::Minimal,
            host_uid: 100_000,
            host_gid: 100_000,
            host_identity: layer(),
            launch_policy: layer(),
            namespaces: layer(),
            filesystem: layer(),
            landlock: layer(),
            landlock_abi: 5,
            seccomp: layer(),
            evidence: layer(),
            storage: layer(),
            privileges: layer(),
            cgroup: layer(),
            rlimits: layer(),
            memory: limit(),
            pids: limit(),
        },
    })
    .unwrap()
}

/// `value`'s object with `extra` added.
fn with(mut value: Value, extra: Value) -> Value {
    let (Some(map), Value::Object(extra)) = (value.as_object_mut(), extra) else {
        panic!("objects only");
    };
    map.extend(extra);
    value
}

fn relayed() -> Value {
    json!({"runnerId": "runner_1", "runnerHash": HASH, "manifestHash": HASH})
}

/// Today's payloads, one per emitting site (and its variants), as each
/// site writes them; a new `EventType` fails to compile here until it has some.
fn samples(t: EventType) -> Vec<Value> {
    let roots = json!([{"inside": "/workspace", "writable": true}]);
    let limits = serde_json::to_value(Limits::default()).unwrap();
    let decision = json!({"decision": "allow", "policyHash": HASH, "manifestHash": HASH,
        "resource": "Moat::Path::\"input/a.txt\"", "sandbox": "workspace-write",
        "policies": ["read-workspace"]});
    let approval = json!({"approvalId": "apr_1", "rule": "data-export", "risk": "high",
        "by": "tok_ab12", "via": "api", "reason": null});
    match t {
        EventType::RunnerSelected => vec![
            json!({"runnerHash": HASH, "binary": "/usr/local/bin/moat-runner"}),
            with(json!({"binary": "/r"}), relayed()),
        ],
        EventType::RunnerStarted => vec![with(
            json!({"bootTime": AT, "version": "0.3.0", "sandboxMode": "workspace-write"}),
            relayed(),
        )],
        EventType::RunnerPolicyLoaded => vec![json!({"policyHash": HASH})],
        EventType::RunnerManifestLoaded => vec![
            json!({"manifestHash": HASH, "expiresAt": AT}),
            json!({"manifestHash": HASH, "expiresAt": AT, "runnerId": "r", "runnerHash": HASH}),
        ],
        EventType::RunnerManifestRefreshed => vec![
            json!({"runnerId": "runner_1", "from": HASH, "manifestHash": HASH, "expiresAt": AT}),
        ],
        EventType::RunnerManifestRefreshFailed => vec![with(
            json!({"failures": 2, "retryAt": AT, "reason": "connection refused", "expiresAt": AT}),
            relayed(),
        )],
        EventType::RunnerRejected => vec![
            json!({"runnerHash": HASH, "manifestHash": HASH, "policyHash": HASH,
                "environment": "local", "version": "0.3.0", "reason": "wrong_version",
                "message": "runner version \"0.2\", manifest \"0.3\""}),
            json!({"runnerId": "runner_1", "runnerHash": HASH, "manifestHash": HASH,
                "reason": "manifest_expired_with_grace_exceeded", "message": "no new claims"}),
        ],
        EventType::CapabilityRequested => vec![
            json!({"op": "artifact_read"}),
            json!({"op": "exec_argv", "argsHash": HASH, "manifestHash": HASH,
                "policyHash": HASH, "mode": "workspace-write"}),
            with(
                json!({"op": null, "argsHash": null, "policyHash": HASH, "mode": "read-only"}),
                relayed(),
            ),
        ],
        EventType::CapabilityGranted => vec![
            decision.clone(),
            with(
                decision.clone(),
                json!({"toolToken": {"crm": HASH}, "toolHash": HASH}),
            ),
            with(
                with(decision.clone(), approval.clone()),
                json!({"rule": "data-export", "risk": "high", "policies": ["data-export"]}),
            ),
            json!({"op": "artifact_read"}),
            with(
                json!({"op": "exec_argv", "capability": {"nonce": "0fc3", "expiresAt": AT}}),
                relayed(),
            ),
        ],
        EventType::CapabilityDenied => vec![
            json!({"op": "artifact_write", "error": "the write could not be published: EIO"}),
            with(
                json!({"op": null, "reason": "invalid_envelope", "message": "not JSON"}),
                relayed(),
            ),
            with(
                approval.clone(),
                json!({"decision": "deny", "reason": "approval_denied", "message": "denied"}),
            ),
            json!({"decision": "deny", "policyHash": HASH, "reason": "unknown_op", "message": "?"}),
            json!({"decision": "deny", "policyHash": HASH, "manifestHash": HASH,
                "resource": "Moat::Tool::\"crm\"", "sandbox": "read-only", "error": "cedar",
                "toolHash": HASH, "reason": "policy_denied", "message": "could not decide"}),
        ],
        EventType::SandboxExecStarted => {
            let started = json!({"program": "/usr/bin/wc", "argc": 2, "mode": "workspace-write",
                "network": "off", "rootView": "minimal", "roots": roots, "limits": limits});
            vec![
                started.clone(),
                with(started.clone(), json!({"class": "microvm"})),
                with(with(started, json!({"sandboxRunId": "op-1"})), relayed()),
            ]
        }
        EventType::SandboxExecDenied => vec![
            json!({"reason": "landlock: not supported by this kernel"}),
            with(
                json!({"reason": "seccomp", "sandboxRunId": "op-1"}),
                relayed(),
            ),
        ],
        EventType::SandboxExecFinished => vec![
            report(),
            with(with(report(), json!({"sandboxRunId": "op-1"})), relayed()),
            with(report(), json!({"setupError": "namespaces: EPERM"})),
        ],
        EventType::SandboxSyscallDenied => vec![json!({"syscall": "ptrace",
            "arch": "0xc000003e", "nr": 101, "layer": "seccomp", "errno": "EPERM"})],
        EventType::SandboxViolation => vec![
            json!({"layer": "wasi", "access": "fs.open", "object": "/etc/passwd",
                "errno": "not-permitted",
                "message": "tried to open /etc/passwd: denied (wasi fs.open)"}),
            json!({"layer": "landlock", "access": "fs.read_file",
                "object": "/root/.aws/credentials", "errno": "EACCES",
                "message": "tried to read /root/.aws/credentials: denied (landlock fs.read_file)"}),
            with(
                json!({"layer": "landlock", "access": "scope.signal", "errno": "EPERM",
                    "message": "tried scope.signal: denied (landlock scope.signal)",
                    "sandboxRunId": "op-1"}),
                relayed(),
            ),
        ],
        EventType::WorkerBinding => vec![
            json!({"binding": "inputs", "call": "names", "bytes": 2, "outcome": "ok"}),
            json!({"binding": "outputs", "call": "write", "name": "result/a.txt",
                "bytes": 9, "outcome": "not-granted"}),
        ],
        EventType::SandboxDangerFullAccess => vec![
            json!({"mode": "danger-full-access", "warning": "the host root is writable"}),
            with(
                json!({"network": "full", "warning": "no proxy", "sandboxRunId": "x"}),
                relayed(),
            ),
        ],
        EventType::ArtifactCreated => vec![
            json!({"sha256": HASH, "size": 8, "kind": "file", "label": "output/summary.txt"}),
            with(
                json!({"sha256": HASH, "size": 9, "kind": "stdout", "label": "wc"}),
                relayed(),
            ),
        ],
        EventType::ArtifactPromoted => vec![
            json!({"path": "output/clean.csv", "sha256": HASH, "size": 8, "exportedAs": "csv"}),
            with(
                json!({"path": "output/s.json", "sha256": HASH, "size": 2, "exportedAs": "json"}),
                relayed(),
            ),
        ],
        EventType::ArtifactValidated => vec![
            json!({"path": "output/client/r.csv", "sha256": HASH, "size": 8,
                "exportedAs": "csv", "approvalId": "apr_1"}),
            with(
                json!({"path": "output/client/s.json", "sha256": HASH, "size": 2,
                    "exportedAs": "json", "approvalId": "apr_2"}),
                relayed(),
            ),
        ],
        EventType::ArtifactRejected => vec![
            json!({"path": "output/tool", "size": 35664, "sha256": HASH,
                "reasons": [{"rule": "executable", "detail": "an executable (ELF) never leaves"}]}),
            with(
                json!({"path": "output/passwd.csv", "size": 11,
                    "reasons": [{"rule": "symlink", "detail": "a symbolic link"}]}),
                relayed(),
            ),
        ],
        EventType::ProcessTimeout => {
            vec![json!({"timeoutMs": 30000, "killed": "process tree", "sandboxRunId": "op-1"})]
        }
        EventType::NetworkDenied => vec![
            json!({"detail": "the egress proxy's records were lost: EOF"}),
            json!({"address": "10.0.0.1:80", "reason": "direct_connection", "detail": "bypass",
                "layer": "seccomp", "errno": "EACCES"}),
            json!({"reason": "egress_limit", "detail": "3 more events", "dropped": 3}),
            json!({"host": "example.com", "port": 443, "method": "CONNECT",
                "reason": "domain_not_allowed", "detail": "not in the allowlist"}),
            with(
                json!({"reason": "network_not_allowed", "message": "off", "sandboxRunId": "e"}),
                relayed(),
            ),
            json!({"profile": "control-plane-tool-proxy", "tool": "crm",
                "reason": "invalid_args", "message": "param id missing", "via": "tool-token"}),
        ],
        EventType::NetworkRequest => vec![
            json!({"host": "example.com", "port": 443, "method": "CONNECT",
                "decision": "denied", "reason": "domain_not_allowed", "detail": "no",
                "bytesOut": 0, "bytesIn": 0, "durationMs": 1}),
            json!({"host": "example.com", "port": 80, "method": "GET", "decision": "failed",
                "reason": "upstream_unreachable", "detail": "refused",
                "bytesOut": 0, "bytesIn": 0, "durationMs": 3}),
            with(
                json!({"host": "example.com", "port": 80, "method": "GET",
                    "decision": "allowed", "address": "93.184.216.34", "status": null,
                    "bytesOut": 10, "bytesIn": 20, "cut": null, "durationMs": 4,
                    "sandboxRunId": "op-1"}),
                relayed(),
            ),
            json!({"host": "example.com", "port": 443, "method": "CONNECT",
                "decision": "allowed", "address": "93.184.216.34", "status": 200,
                "bytesOut": 10, "bytesIn": 20, "cut": "egress_limit", "durationMs": 4}),
            // The tool proxy, once it records the host and port apart and
            // speaks the egress proxy's decisions (see the survey).
            json!({"profile": "control-plane-tool-proxy", "tool": "crm", "method": "GET",
                "host": "api.example.com", "port": 443, "path": "/v1/items", "status": 200,
                "address": "93.184.216.34", "bytesIn": 12, "durationMs": 40,
                "decision": "allowed"}),
            json!({"profile": "control-plane-tool-proxy", "tool": "crm", "method": "GET",
                "host": "10.0.0.1", "port": 443, "path": "/", "decision": "denied",
                "reason": "address_not_allowed", "message": "refused", "via": "tool-token"}),
        ],
        EventType::PathDenied => vec![with(
            json!({"reason": "path_outside_workspace", "message": "../x leaves the workspace"}),
            relayed(),
        )],
        EventType::RunCreated => vec![
            json!({"environment": "local", "maxAttempts": 3,
            "inputs": [{"path": "input/a.txt", "sha256": HASH, "size": 3}]}),
            json!({"environment": "local", "maxAttempts": 3, "inputs": [],
            "volumes": [{"volume": "cache", "path": "state", "readOnly": false, "snapshot": HASH},
                {"volume": "empty", "path": "scratch", "readOnly": true}]}),
        ],
        EventType::RunStarted => vec![json!({})],
        EventType::RunFinished => vec![
            json!({"state": "succeeded", "reason": null, "runnerId": "runner_1", "attempts": 1}),
            json!({"state": "failed", "reason": "idle_timeout", "runnerId": null, "attempts": 0}),
        ],
        EventType::RunClaimed => vec![json!({"runnerId": "runner_1", "manifestHash": HASH,
            "attempt": 1, "leaseUntil": AT})],
        EventType::RunLeaseExpired => {
            vec![json!({"runnerId": "runner_1", "attempt": 1, "maxAttempts": 3})]
        }
        EventType::RunRetried => vec![json!({"attempt": 2})],
        EventType::RunResumed => vec![json!({"attempt": 2, "runnerId": "runner_2",
            "volumes": [{"volume": "cache", "path": "state", "snapshot": HASH,
                "readOnly": false, "files": 3, "bytes": 4096},
                {"volume": "empty", "path": "scratch",
                "readOnly": true, "files": 0, "bytes": 0}]})],
        EventType::VolumeSnapshotted => vec![
            json!({"volume": "cache", "path": "state", "snapshot": HASH,
                "files": 1, "bytes": 10}),
            json!({"volume": "cache", "path": "state", "snapshot": HASH, "parent": HASH,
                "files": 2, "bytes": 20}),
        ],
        EventType::NetworkIngress => vec![
            json!({"port": 8000, "method": "GET", "path": "/index.html", "status": 200,
                "bytesIn": 80, "bytesOut": 512, "durationMs": 3}),
            json!({"port": 8000, "bytesIn": 0, "bytesOut": 0, "durationMs": 0,
                "detail": "nothing listens on port 8000"}),
        ],
        EventType::RunPlacementDenied => vec![
            json!({"runnerId": "runner_1", "reason": "placement_waiting: no co-tenancy"}),
            json!({"runnerId": "runner_1", "hostId": "host-a",
                "reason": "placement_waiting: host-a is dedicated", "policies": ["dedicated"]}),
        ],
        EventType::RunReleased => vec![json!({"runnerId": "runner_1", "attempts": 0})],
        EventType::RunUsage => vec![
            json!({"ops": {"succeeded": 2, "denied": 1},
            "programs": 1, "cpuMs": 1000, "programWallMs": 1100, "peakMemoryBytes": 1048576,
            "egressRequests": 0, "egressBytesOut": 0, "egressBytesIn": 0}),
            json!({"ops": {"succeeded": 1}, "programs": 1, "cpuMs": 10, "programWallMs": 20,
            "peakMemoryBytes": 4096, "egressRequests": 0, "egressBytesOut": 0,
            "egressBytesIn": 0, "violations": 3, "bytesWritten": 8192}),
        ],
        EventType::RunDestroyed => vec![json!({"runnerId": "runner_1", "ok": true,
            "checks": [{"check": "files", "ok": true, "detail": "removed"}]})],
        EventType::RunnerJanitor => vec![json!({"runnerId": "runner_1", "runs": ["run-1"],
            "ok": false, "checks": [{"check": "processes", "ok": false, "detail": "1 left"}]})],
        EventType::QueueMessage => vec![
            json!({"queue": "reports", "messageId": "msg_1", "state": "received", "attempt": 0,
                "idempotencyKey": "k-1"}),
            json!({"queue": "reports", "messageId": "msg_1", "state": "retrying", "attempt": 1,
                "error": "exit status 3", "retryAt": "2026-12-04T10:00:01.000Z"}),
            json!({"queue": "reports", "messageId": "msg_1", "state": "acknowledged",
                "attempt": 2, "kvWrites": 1, "sends": 0}),
        ],
        EventType::RunDeadLettered => vec![json!({"state": "dead_lettered",
            "reason": "lease_expired", "runnerId": "runner_1", "attempts": 3})],
        EventType::RunnerRegistered => vec![json!({"runnerHash": HASH, "manifestHash": HASH,
            "policyHash": HASH, "environment": "local", "version": "0.3.0",
            "runnerId": "runner_1", "ops": ["artifact_read", "exec_argv"],
            "sandboxMode": "workspace-write", "bootTime": AT, "slots": 2})],
        EventType::ManifestPublished => {
            vec![json!({"manifestHash": HASH, "environment": "local", "expiresAt": AT})]
        }
        EventType::ManifestRevoked => vec![
            json!({"manifestHash": HASH}),
            json!({"signingKey": "MCowBQYDK2VwAyEA"}),
        ],
        EventType::OpFinished => vec![
            json!({"status": "ok", "reason": null, "runnerId": "runner_1", "artifacts": [HASH]}),
            json!({"status": "denied", "reason": "not_found", "runnerId": "r", "artifacts": []}),
            json!({"status": "error", "runnerId": "runner_1",
                "profile": "control-plane-tool-proxy", "message": "crm answered 500"}),
        ],
        EventType::ApprovalRequested => vec![json!({"approvalId": "apr_1",
            "rule": "data-export", "risk": "high", "expiresAt": AT, "policyHash": HASH,
            "manifestHash": HASH, "summary": {"op": "artifact_write",
                "resource": "Moat::Path::\"export/a.csv\"", "size": 4096, "network": "off",
                "args": {"path": "export/a.csv", "content": "x"}}})],
        EventType::ApprovalGranted => vec![approval.clone()],
        EventType::ApprovalDenied => vec![with(approval.clone(), json!({"reason": "no"}))],
        EventType::ApprovalExpired => vec![
            with(approval.clone(), json!({"by": null, "via": "expiry"})),
            json!({"approvalId": "apr_1", "reason": "the run ended"}),
        ],
        EventType::RequestRefused => vec![
            json!({"reason": "secret_in_input", "message": "inputs[0] holds the org's secret",
                "secret": "CRM_KEY", "field": "inputs[0]", "path": "/v1/runs"}),
            json!({"reason": "cross_site_request", "message": "cross-site request refused",
                "path": "/inspector/approvals/apr_1", "method": "POST", "by": "tok_ab12",
                "origin": "https://evil.example", "referer": null}),
        ],
    }
}

#[test]
fn every_event_type_has_its_payload_and_todays_shapes_read_back_unchanged() {
    for &t in EventType::ALL {
        let samples = samples(t);
        assert!(!samples.is_empty(), "{}", t.as_str());
        for sample in samples {
            let parsed = EventData::parse(t, &sample)
                .unwrap_or_else(|e| panic!("{}: {e}: {sample}", t.as_str()));
            assert_eq!(parsed.event_type(), t);
            let data = parsed.clone().into_data();
            // The same keys as today, no more: a `null` today is left out.
            let mut expected = sample.as_object().unwrap().clone();
            expected.retain(|_, v| !v.is_null());
            let keys = |m: &serde_json::Map<String, Value>| {
                let mut keys: Vec<_> = m.keys().cloned().collect();
                keys.sort_unstable();
                keys
            };
            assert_eq!(
                keys(data.as_object().unwrap()),
                keys(&expected),
                "{}",
                t.as_str()
            );
            assert_eq!(EventData::parse(t, &data).unwrap(), parsed);
            // As a whole, it is the `type` and `data` of an event.
            let whole = serde_json::to_value(&parsed).unwrap();
            assert_eq!(whole, json!({"type": t.as_str(), "data": data}));
            assert_eq!(serde_json::from_value::<EventData>(whole).unwrap(), parsed);
        }
    }
}

#[test]
fn a_key_no_emitter_writes_is_refused_for_every_type() {
    for &t in EventType::ALL {
        let sample = with(samples(t).remove(0), json!({"secretValue": "x"}));
        let error = EventData::parse(t, &sample).err().map(|e| e.to_string());
        assert!(
            error
                .as_deref()
                .is_some_and(|e| e.contains("unknown field `secretValue`")),
            "{}: {error:?}",
            t.as_str()
        );
    }
}

#[test]
fn missing_required_keys_wrong_types_and_unknown_values_are_refused() {
    let without = |t: EventType, key: &str| {
        let mut sample = samples(t).remove(0);
        sample.as_object_mut().unwrap().remove(key);
        (t, sample)
    };
    let mut nested_extra = samples(EventType::ApprovalRequested).remove(0);
    nested_extra["summary"]["extra"] = json!(1);
    let mut capability_extra = samples(EventType::CapabilityGranted).remove(4);
    capability_extra["capability"]["extra"] = json!(1);
    let mut limits_extra = samples(EventType::SandboxExecStarted).remove(0);
    limits_extra["limits"]["extra"] = json!(1);
    let mut wrong_type = samples(EventType::RunClaimed).remove(0);
    wrong_type["attempt"] = json!("1");
    let mut tool_decision = samples(EventType::NetworkRequest).remove(4);
    tool_decision["decision"] = json!("allow");
    let mut rejection = samples(EventType::RunnerRejected).remove(0);
    rejection["reason"] = json!("felt_like_it");
    let cases = [
        without(EventType::RunClaimed, "runnerId"),
        without(EventType::NetworkRequest, "decision"),
        without(EventType::NetworkRequest, "port"),
        without(EventType::SandboxExecFinished, "exitCode"),
        without(EventType::SandboxExecFinished, "enforcement"),
        without(EventType::SandboxExecStarted, "limits"),
        without(EventType::ApprovalRequested, "summary"),
        without(EventType::ApprovalGranted, "by"),
        without(EventType::RunnerRejected, "reason"),
        without(EventType::PathDenied, "message"),
        without(EventType::RunRetried, "attempt"),
        (EventType::ApprovalRequested, nested_extra),
        (EventType::CapabilityGranted, capability_extra),
        (EventType::SandboxExecStarted, limits_extra),
        (EventType::RunClaimed, wrong_type),
        (EventType::NetworkRequest, tool_decision),
        (EventType::RunnerRejected, rejection),
        (EventType::RunRetried, json!(2)),
        (EventType::RunStarted, json!(null)),
    ];
    for (t, data) in cases {
        assert!(
            EventData::parse(t, &data).is_err(),
            "{} accepted {data}",
            t.as_str()
        );
    }
}

#[test]
fn an_event_of_typed_data_carries_its_type_and_payload() {
    let data = EventData::RunRetried(RunRetried { attempt: 2 });
    let event = Event::of(data.clone(), AT.into(), "run-1".into());
    assert_eq!(event.event_type, EventType::RunRetried);
    assert_eq!(event.data, json!({"attempt": 2}));
    assert_eq!((event.op_id, event.correlation_id), (None, None));
    assert_eq!(
        EventData::parse(event.event_type, &event.data).unwrap(),
        data
    );
}

#[test]
fn the_schema_has_one_closed_shape_per_event_type() {
    let schema = serde_json::to_value(schemars::schema_for!(EventData)).unwrap();
    let shapes = schema["oneOf"].as_array().expect("oneOf");
    let mut names: Vec<&str> = shapes
        .iter()
        .filter_map(|s| s["properties"]["type"]["const"].as_str())
        .collect();
    names.sort_unstable();
    let mut expected: Vec<&str> = EventType::ALL.iter().map(|t| t.as_str()).collect();
    expected.sort_unstable();
    assert_eq!(names, expected);
    let definition = |name: &str| &schema["$defs"][name];
    let finished = definition("SandboxExecFinished");
    assert_eq!(finished["additionalProperties"], false, "{finished}");
    for key in ["exitCode", "enforcement", "sandboxRunId", "runnerId"] {
        assert!(finished["properties"][key].is_object(), "{key}: {finished}");
    }
    assert_eq!(definition("NetworkRequest")["additionalProperties"], false);
}
