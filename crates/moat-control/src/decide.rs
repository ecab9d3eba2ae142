//! Deciding one operation envelope: checked against the org's published
//! manifest (its ops, its tools), then put to the Cedar policy; the outcome
//! (queued, denied with a reason, or waiting for a person) and the record
//! stored with the op. Plain functions of the policy, the run, the
//! manifest and the envelope: no store, no HTTP.

use std::collections::BTreeMap;

use moat_core::element::ElementFacts;
use moat_core::event_data::{CapabilityDenied, CapabilityGranted, PolicyDecision};
use moat_core::{
    DenialReason, Envelope, EventType, OpKind, OpResult, OpStatus, SandboxMode, SignedManifest,
    WorkloadClass,
};
use moat_store::{OpState, RunRow};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::describe::describe;
use crate::policy::{Decision, OpRequest, PolicyEngine, Resource};
use crate::tools::ToolDef;

/// The record of a decision: stored with the op (`decision`), and the
/// substance of its `capability.granted` or `.denied` event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DecisionRecord {
    pub decision: PolicyDecision,
    pub policy_hash: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_hash: Option<String>,
    /// The Cedar resource the operation acts on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxMode>,
    /// The workload class the program runs in (`exec_argv` only): the
    /// weakest the manifest lists that is as strong as the policy asks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<WorkloadClass>,
    /// The policies that decided (for a denial by policy, those that
    /// forbade it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policies: Option<Vec<String>>,
    /// The rule that asks for a person, and its risk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub risk: Option<String>,
    /// Why the policy could not decide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The hash of each tool definition a program's token is good for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_token: Option<BTreeMap<String, String>>,
    /// The hash of the tool definition a tool call was decided under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_hash: Option<String>,
    /// An acting browser step let through to be decided on its element.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub element_check: bool,
    /// The element an acting browser step was decided on: its capability
    /// binds that element's fingerprint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub element: Option<ElementFacts>,
}

/// The browser actions that change a page (and may send what it holds):
/// decided on the element they act on.
pub const ACTING: [&str; 4] = ["click", "type", "select", "fill_secret"];

impl DecisionRecord {
    fn denial(policy_hash: &str, manifest_hash: Option<&str>) -> DecisionRecord {
        DecisionRecord {
            decision: PolicyDecision::Deny,
            policy_hash: policy_hash.to_owned(),
            manifest_hash: manifest_hash.map(str::to_owned),
            resource: None,
            sandbox: None,
            class: None,
            policies: None,
            rule: None,
            risk: None,
            error: None,
            tool_token: None,
            tool_hash: None,
            element_check: false,
            element: None,
        }
    }

    /// The record as stored with the op.
    pub fn to_json(&self) -> Value {
        // Plain strings, maps and enums: serialising cannot fail.
        serde_json::to_value(self).unwrap_or_default()
    }

    /// Its `capability.granted` payload.
    pub fn granted(&self) -> CapabilityGranted {
        CapabilityGranted {
            decision: Some(self.decision),
            policy_hash: Some(self.policy_hash.clone()),
            manifest_hash: self.manifest_hash.clone(),
            resource: self.resource.clone(),
            sandbox: self.sandbox,
            class: self.class,
            policies: self.policies.clone(),
            rule: self.rule.clone(),
            risk: self.risk.clone(),
            tool_token: self.tool_token.clone(),
            tool_hash: self.tool_hash.clone(),
            element_check: self.element_check.then_some(true),
            element: self.element.clone(),
            ..CapabilityGranted::default()
        }
    }

    /// Its `capability.denied` payload, with the denial.
    pub fn denied(&self, reason: DenialReason, message: String) -> CapabilityDenied {
        CapabilityDenied {
            reason: Some(reason),
            message: Some(message),
            error: self.error.clone(),
            decision: Some(self.decision),
            policy_hash: Some(self.policy_hash.clone()),
            manifest_hash: self.manifest_hash.clone(),
            resource: self.resource.clone(),
            sandbox: self.sandbox,
            class: self.class,
            policies: self.policies.clone(),
            rule: self.rule.clone(),
            risk: self.risk.clone(),
            tool_hash: self.tool_hash.clone(),
            element: self.element.clone(),
            ..CapabilityDenied::default()
        }
    }
}

/// What the control plane decided for one envelope.
pub struct Decided {
    pub state: OpState,
    /// The decision record (stored with the op, and in its events).
    pub record: DecisionRecord,
    pub denial: Option<(DenialReason, String)>,
    /// `(rule, risk)` when a person must approve first.
    pub approval: Option<(String, String)>,
    /// What the operation acts on and moves (for an approver to read).
    pub described: Option<crate::describe::Described>,
}

impl Decided {
    fn denied(record: DecisionRecord, reason: DenialReason, message: String) -> Decided {
        Decided {
            state: OpState::Denied,
            record,
            denial: Some((reason, message)),
            approval: None,
            described: None,
        }
    }
}

/// `offered`: the classes of the runner that holds the run (`None`: no
/// runner holds it yet; the claim then looks for one that offers them).
#[expect(
    clippy::too_many_arguments,
    reason = "each is one input of the decision, from its own place in the store or the request"
)]
pub fn decide(
    policy: &PolicyEngine,
    org_name: &str,
    run: &RunRow,
    manifest: Option<&SignedManifest>,
    envelope: &Envelope,
    tool: Option<&ToolDef>,
    offered: Option<&[WorkloadClass]>,
    element: Option<&ElementFacts>,
) -> Decided {
    let policy_hash = policy.hash().to_owned();
    let described = match describe(envelope) {
        Ok(d) => d,
        Err(e) => {
            let reason = if matches!(e, crate::describe::DescribeError::UnknownOp(_)) {
                DenialReason::UnknownOp
            } else {
                DenialReason::InvalidArgs
            };
            return Decided::denied(
                DecisionRecord::denial(&policy_hash, None),
                reason,
                e.to_string(),
            );
        }
    };
    let Some(manifest) = manifest else {
        return Decided::denied(
            DecisionRecord::denial(&policy_hash, None),
            DenialReason::OpNotInManifest,
            format!("no manifest is published for {:?}", run.environment),
        );
    };
    if !manifest.manifest.allowed_ops.contains(&described.op) {
        return Decided::denied(
            DecisionRecord::denial(&policy_hash, Some(&manifest.manifest_hash)),
            DenialReason::OpNotInManifest,
            format!(
                "{} is not in the manifest's allowedOps",
                described.op.as_str()
            ),
        );
    }
    let mut method = described.method.clone();
    let mut tool_approval = None;
    if let (Resource::Tool(name), true) = (
        &described.resource,
        envelope.args["profile"] == crate::tools::PROFILE,
    ) {
        let record = DecisionRecord::denial(&policy_hash, Some(&manifest.manifest_hash));
        let Some(def) = tool else {
            return Decided::denied(
                record,
                DenialReason::InvalidArgs,
                format!("no tool {name:?} is defined in this org"),
            );
        };
        if !manifest.manifest.allowed_tools.contains(name) {
            return Decided::denied(
                record,
                DenialReason::OpNotInManifest,
                format!("tool {name} is not in the manifest's allowedTools"),
            );
        }
        method.clone_from(&def.method);
        if def.approval {
            tool_approval = Some(format!("tool:{name}"));
        }
    }
    let sandbox = sandbox_of(manifest);
    let request = OpRequest {
        org: org_name,
        runner: run.runner_id.as_deref().unwrap_or("unassigned"),
        op: described.op,
        resource: described.resource.clone(),
        size: described.size,
        network: described.network,
        sandbox,
        origin: match &described.resource {
            Resource::Executable(path) => manifest.manifest.origin_of(path),
            _ => moat_core::ExecutableOrigin::Trusted,
        },
        path: &described.path,
        method: &method,
        action: &described.action,
        domain: &element
            .and_then(|e| crate::describe::host_of(&e.origin))
            .unwrap_or_else(|| described.domain.clone()),
        element,
    };
    let acting = described.op == OpKind::BrowserStep && ACTING.contains(&described.action.as_str());
    let decision = policy.decide(&request);
    let class = match decision {
        // A program and a browser run in a class; the rest is the shell's.
        Ok(Decision::Allow { .. } | Decision::RequireApproval { .. })
            if matches!(described.op, OpKind::ExecArgv | OpKind::BrowserStep) =>
        {
            match class_of(policy, &request, &manifest.manifest, offered) {
                Ok(class) => Some(class),
                Err(refused) => {
                    let record = DecisionRecord {
                        manifest_hash: Some(manifest.manifest_hash.clone()),
                        resource: Some(described.resource.to_string()),
                        sandbox: Some(sandbox),
                        class: refused.class,
                        error: refused.error,
                        ..DecisionRecord::denial(&policy_hash, None)
                    };
                    return Decided::denied(record, refused.reason, refused.message);
                }
            }
        }
        _ => None,
    };
    let with = |decision: PolicyDecision, policies: Vec<String>| DecisionRecord {
        decision,
        manifest_hash: Some(manifest.manifest_hash.clone()),
        resource: Some(described.resource.to_string()),
        sandbox: Some(sandbox),
        class,
        policies: Some(policies),
        element: element.cloned(),
        ..DecisionRecord::denial(&policy_hash, None)
    };
    // An acting step is decided on the element it would act on, which only
    // the runner's browser can find: until then, anything but a forbid lets
    // it through to be looked at (a rule about the element cannot permit it
    // yet; a person, if one must, approves it seeing that element, not
    // before).
    if acting && element.is_none() {
        let looked_at = match &decision {
            Ok(Decision::Allow { policies }) => Some(policies.clone()),
            // Nothing permits it yet: a rule about its element cannot.
            Ok(Decision::Deny { policies }) if policies.is_empty() => Some(Vec::new()),
            Ok(Decision::RequireApproval { rule, .. }) => Some(vec![rule.clone()]),
            // A forbid, or a policy that cannot decide.
            _ => None,
        };
        if let Some(policies) = looked_at {
            return Decided {
                state: OpState::Queued,
                record: DecisionRecord {
                    element_check: true,
                    ..with(PolicyDecision::Allow, policies)
                },
                denial: None,
                approval: None,
                described: Some(described),
            };
        }
    }
    match decision {
        Ok(Decision::Allow { policies }) if tool_approval.is_some() => {
            let rule = tool_approval.unwrap_or_default();
            Decided {
                state: OpState::PendingApproval,
                record: DecisionRecord {
                    rule: Some(rule.clone()),
                    risk: Some("high".into()),
                    ..with(PolicyDecision::RequireApproval, policies)
                },
                denial: None,
                approval: Some((rule, "high".to_owned())),
                described: Some(described),
            }
        }
        Ok(Decision::Allow { policies }) => Decided {
            state: OpState::Queued,
            record: with(PolicyDecision::Allow, policies),
            denial: None,
            approval: None,
            described: Some(described),
        },
        Ok(Decision::Deny { policies }) => {
            let message = if policies.is_empty() {
                "no policy permits this operation".to_owned()
            } else {
                format!("forbidden by {}", policies.join(", "))
            };
            Decided::denied(
                with(PolicyDecision::Deny, policies),
                DenialReason::PolicyDenied,
                message,
            )
        }
        Ok(Decision::RequireApproval { rule, risk }) => Decided {
            state: OpState::PendingApproval,
            record: DecisionRecord {
                rule: Some(rule.clone()),
                risk: Some(risk.clone()),
                ..with(PolicyDecision::RequireApproval, vec![rule.clone()])
            },
            denial: None,
            approval: Some((rule, risk)),
            described: Some(described),
        },
        Err(e) => Decided::denied(
            DecisionRecord {
                policies: None,
                error: Some(e.to_string()),
                ..with(PolicyDecision::Deny, Vec::new())
            },
            DenialReason::PolicyDenied,
            format!("the policy could not decide: {e}"),
        ),
    }
}

/// The workload classes a new run needs: those it asks for, and the class
/// the policy gives each program the manifest allows (run offline, the
/// context known at creation: no network, no size). A class
/// an operation needs beyond these is found when it is decided: it is then
/// refused unless the runner holding the run offers it.
pub fn run_classes(
    policy: &PolicyEngine,
    org_name: &str,
    manifest: Option<&SignedManifest>,
    asked: &[WorkloadClass],
) -> Result<Vec<WorkloadClass>, String> {
    let mut needed: Vec<WorkloadClass> = Vec::new();
    let mut add = |class: WorkloadClass| {
        if !needed.contains(&class) {
            needed.push(class);
        }
    };
    let Some(signed) = manifest else {
        if let Some(class) = asked.iter().find(|c| !c.is_namespace()) {
            return Err(format!(
                "workloadClasses: no manifest is published for the run's environment, so \
                 none lists {class}"
            ));
        }
        asked.iter().copied().for_each(&mut add);
        return Ok(needed);
    };
    let manifest = &signed.manifest;
    for class in asked {
        let fitted = manifest.fit(*class).ok_or_else(|| {
            format!(
                "workloadClasses: {class} is not among the manifest's workloadClasses ({})",
                WorkloadClass::names(&manifest.classes())
            )
        })?;
        add(fitted);
    }
    // What the run may ask for, as known at creation (offline, no size):
    // each program the manifest allows, and a browser's `open` (a session's
    // class is its open's; no page yet: no domain, no element).
    // Without classification rules every ask is `namespace`, unevaluated:
    // none adds a class.
    let mut asks: Vec<(OpKind, Resource, moat_core::ExecutableOrigin, &str)> = Vec::new();
    if policy.classifies() && manifest.allowed_ops.contains(&OpKind::ExecArgv) {
        asks.extend(manifest.allowed_executables.iter().map(|exe| {
            (
                OpKind::ExecArgv,
                Resource::Executable(exe.path.clone()),
                exe.origin.unwrap_or_default(),
                "",
            )
        }));
    }
    if policy.classifies() && manifest.allowed_ops.contains(&OpKind::BrowserStep) {
        asks.push((
            OpKind::BrowserStep,
            Resource::Run(String::new()),
            moat_core::ExecutableOrigin::Trusted,
            "open",
        ));
    }
    for (op, resource, origin, action) in asks {
        let request = OpRequest {
            org: org_name,
            runner: "unassigned",
            op,
            resource,
            size: 0,
            network: moat_core::NetworkMode::Off,
            sandbox: sandbox_of(signed),
            origin,
            path: "",
            method: "",
            action,
            domain: "",
            element: None,
        };
        // What the policy cannot classify, or that no listed class fits, is
        // refused when asked for: it needs no runner.
        if let Some(class) = policy.classify(&request).ok().and_then(|c| manifest.fit(c)) {
            add(class);
        }
    }
    needed.sort_by_key(|c| c.bit());
    Ok(needed)
}

/// The class the policy gives an `exec_argv` or a `browser_step` under
/// `manifest` (`None`: another operation). For a dispatch under another manifest than the
/// decision's: a class it cannot tell, or that the manifest cannot give,
/// is the strongest there is (the shell then refuses what it cannot give).
pub fn reclassify(
    policy: &PolicyEngine,
    org_name: &str,
    runner: &str,
    manifest: &SignedManifest,
    envelope: &Envelope,
) -> Option<WorkloadClass> {
    let described = describe(envelope).ok()?;
    let origin = match (&described.resource, described.op) {
        (Resource::Executable(path), _) => manifest.manifest.origin_of(path),
        (_, OpKind::BrowserStep) => moat_core::ExecutableOrigin::Trusted,
        _ => return None,
    };
    let request = OpRequest {
        org: org_name,
        runner,
        op: described.op,
        resource: described.resource.clone(),
        size: described.size,
        network: described.network,
        sandbox: sandbox_of(manifest),
        origin,
        path: &described.path,
        method: &described.method,
        action: &described.action,
        domain: &described.domain,
        element: None,
    };
    let strongest = WorkloadClass::ALL
        .iter()
        .copied()
        .max_by_key(|c| c.bit())
        .unwrap_or(WorkloadClass::Microvm);
    Some(
        policy
            .classify(&request)
            .ok()
            .and_then(|c| manifest.manifest.fit(c))
            .unwrap_or(strongest),
    )
}

/// What runs in a class, as a refusal names it.
fn what(op: OpKind) -> &'static str {
    match op {
        OpKind::BrowserStep => "browser step",
        _ => "program",
    }
}

/// Why a program cannot be given the class the policy asks for.
struct ClassRefused {
    reason: DenialReason,
    message: String,
    /// The class asked for, when the policy could say.
    class: Option<WorkloadClass>,
    error: Option<String>,
}

/// The class a program runs in: the policy's minimum, fitted to the
/// manifest's classes, and offered by the runner that holds the run.
fn class_of(
    policy: &PolicyEngine,
    request: &OpRequest<'_>,
    manifest: &moat_core::Manifest,
    offered: Option<&[WorkloadClass]>,
) -> Result<WorkloadClass, ClassRefused> {
    let needed = policy.classify(request).map_err(|e| ClassRefused {
        reason: DenialReason::PolicyDenied,
        message: format!(
            "the policy could not classify the {}: {e}",
            what(request.op)
        ),
        class: None,
        error: Some(e.to_string()),
    })?;
    let class = manifest.fit(needed).ok_or_else(|| ClassRefused {
        reason: DenialReason::ClassNotAvailable,
        message: format!(
            "the policy runs this {} in workload class {needed} at least; the manifest's \
             workloadClasses ({}) has none as strong",
            what(request.op),
            WorkloadClass::names(&manifest.classes())
        ),
        class: Some(needed),
        error: None,
    })?;
    match offered {
        Some(offered) if !offered.contains(&class) => Err(ClassRefused {
            reason: DenialReason::ClassNotAvailable,
            message: format!(
                "the policy runs this {} in workload class {class}; the runner holding the run \
                 offers {}",
                what(request.op),
                WorkloadClass::names(offered)
            ),
            class: Some(class),
            error: None,
        }),
        _ => Ok(class),
    }
}

/// A program's `toolToken`: each tool must exist, be in the manifest's
/// `allowedTools` and be allowed by policy as a call of its own (an
/// approval any of them needs, the operation needs); the decision records
/// the hash of each definition the token will be good for.
pub fn decide_token_tools(
    policy: &PolicyEngine,
    org_name: &str,
    run: &RunRow,
    manifest: Option<&SignedManifest>,
    tools: &[(String, Option<moat_store::ToolRow>)],
    decided: &mut Decided,
) {
    if !matches!(decided.state, OpState::Queued | OpState::PendingApproval) {
        return;
    }
    let Some(manifest) = manifest else { return };
    // The record of a refusal: what was decided about the operation, as a
    // denial (no approval it would have waited for, no policy that allowed it).
    let deny_record = DecisionRecord {
        decision: PolicyDecision::Deny,
        rule: None,
        risk: None,
        policies: None,
        ..decided.record.clone()
    };
    let sandbox = sandbox_of(manifest);
    let mut hashes = BTreeMap::new();
    let mut approval: Option<(String, String)> = None;
    for (name, row) in tools {
        let Some(def) = row
            .as_ref()
            .and_then(|t| ToolDef::parse(&t.definition).ok())
        else {
            *decided = Decided::denied(
                deny_record,
                DenialReason::InvalidArgs,
                format!("toolToken: no tool {name:?} is defined in this org"),
            );
            return;
        };
        if !manifest.manifest.allowed_tools.contains(name) {
            *decided = Decided::denied(
                deny_record,
                DenialReason::OpNotInManifest,
                format!("toolToken: tool {name} is not in the manifest's allowedTools"),
            );
            return;
        }
        let request = OpRequest {
            org: org_name,
            runner: run.runner_id.as_deref().unwrap_or("unassigned"),
            op: moat_core::OpKind::HttpRequest,
            resource: Resource::Tool(name.clone()),
            size: 0,
            network: moat_core::NetworkMode::Off,
            sandbox,
            origin: moat_core::ExecutableOrigin::Trusted,
            path: "",
            method: &def.method,
            action: "",
            domain: "",
            element: None,
        };
        match policy.decide(&request) {
            Ok(Decision::Allow { .. }) if def.approval => {
                approval.get_or_insert((format!("tool:{name}"), "high".into()));
            }
            Ok(Decision::Allow { .. }) => {}
            Ok(Decision::RequireApproval { rule, risk }) => {
                approval.get_or_insert((rule, risk));
            }
            Ok(Decision::Deny { policies }) => {
                *decided = Decided::denied(
                    DecisionRecord {
                        policies: Some(policies.clone()),
                        ..deny_record
                    },
                    DenialReason::PolicyDenied,
                    format!(
                        "toolToken: calling {name} is not permitted ({})",
                        policies.join(", ")
                    ),
                );
                return;
            }
            Err(e) => {
                *decided = Decided::denied(
                    deny_record,
                    DenialReason::PolicyDenied,
                    format!("toolToken: the policy could not decide on {name}: {e}"),
                );
                return;
            }
        }
        hashes.insert(name.clone(), def.hash());
    }
    decided.record.tool_token = Some(hashes);
    if let (Some((rule, risk)), OpState::Queued) = (approval, decided.state) {
        decided.state = OpState::PendingApproval;
        decided.record.decision = PolicyDecision::RequireApproval;
        decided.record.rule = Some(rule.clone());
        decided.record.risk = Some(risk.clone());
        decided.approval = Some((rule, risk));
    }
}

/// The sandbox mode a manifest's operations run in (its first one).
pub fn sandbox_of(manifest: &SignedManifest) -> SandboxMode {
    manifest
        .manifest
        .sandbox_modes
        .first()
        .copied()
        .unwrap_or(SandboxMode::WorkspaceWrite)
}

/// The result of an operation that was denied (stored as its result).
pub fn denied_result(id: &str, reason: DenialReason, message: String) -> Value {
    serde_json::to_value(OpResult {
        id: id.to_owned(),
        status: OpStatus::Denied,
        result: None,
        reason: Some(reason),
        message: Some(message),
        event_type: Some(EventType::CapabilityDenied.as_str().to_owned()),
        artifacts: Vec::new(),
    })
    .unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used, clippy::unwrap_used)]

    use super::*;
    use moat_core::sign::PrivateKey;
    use moat_core::{Manifest, OpKind};
    use moat_store::RunState;
    use serde_json::json;

    const POLICY: &str = r#"
        @id("read") permit(principal, action == Moat::Action::"artifact_read", resource);
        @id("write") permit(principal, action == Moat::Action::"artifact_write", resource)
            when { context.path like "output/*" };
        @id("export") @approval("required") @risk("high")
        permit(principal, action == Moat::Action::"artifact_write", resource)
            when { context.path like "export/*" };
        @id("exec") permit(principal, action == Moat::Action::"exec_argv", resource);
        @id("no-curl") forbid(principal, action == Moat::Action::"exec_argv",
            resource == Moat::Executable::"/usr/bin/curl");
        @id("crm") permit(principal, action == Moat::Action::"http_request",
            resource == Moat::Tool::"crm");
        @id("billing") permit(principal, action == Moat::Action::"http_request",
            resource == Moat::Tool::"billing");
    "#;

    fn manifest(ops: &[OpKind], tools: &[&str]) -> SignedManifest {
        let m: Manifest = serde_json::from_value(json!({
            "runnerVersion": "1.0.0", "environment": "prod",
            "policyHash": moat_core::hash::sha256_hex(POLICY.as_bytes()),
            "allowedOps": ops, "allowedExecutables": [], "allowedTools": tools,
            "sandboxModes": ["workspace-write"],
            "networkPolicy": {"mode": "off", "allowDomains": []},
            "filesystem": {"readRoots": ["."], "writeRoots": ["output", "export"]},
            "limits": {"timeoutMs": 60000, "memoryBytes": 1, "pids": 1, "maxOutputBytes": 1,
                       "tmpSizeBytes": 1, "openFiles": 1, "fileSizeBytes": 1},
            "createdAt": "2030-01-01T00:00:00Z", "expiresAt": "2030-02-01T00:00:00Z",
            "controlPlanePublicKey": PrivateKey::from_seed([7; 32]).public().to_base64(),
        }))
        .expect("manifest");
        m.sign(&PrivateKey::from_seed([7; 32])).expect("sign")
    }

    fn run() -> RunRow {
        RunRow {
            id: "run-1".into(),
            org_id: "org".into(),
            state: RunState::Running,
            environment: "prod".into(),
            runner_id: Some("runner-1".into()),
            manifest_hash: None,
            lease_until_ms: 0,
            attempts: 1,
            max_attempts: 3,
            finish_wanted: false,
            inputs: json!([]),
            error: None,
            created_ms: 0,
            claimed_ms: 0,
            updated_ms: 0,
            needs_classes: 0,
            cpu_millis: 0,
            memory_bytes: 0,
            placement_note: None,
            volumes: Vec::new(),
        }
    }

    fn envelope(op: &str, args: Value) -> Envelope {
        serde_json::from_value(json!({
            "id": "op-1", "runId": "run-1", "correlationId": "op-1", "op": op, "args": args,
            "createdAt": "2030-01-02T00:00:00Z",
        }))
        .expect("envelope")
    }

    fn tool(name: &str, approval: bool) -> ToolDef {
        ToolDef::parse(&json!({
            "name": name, "method": "GET", "url": "https://api.example.com/v1/x",
            "approval": approval,
        }))
        .expect("tool")
    }

    /// What a case expects: the state, and the denial reason or approval rule.
    #[derive(Debug, PartialEq)]
    enum Outcome {
        Queued,
        Denied(DenialReason),
        Approval(String, String),
    }

    fn approval(rule: &str, risk: &str) -> Outcome {
        Outcome::Approval(rule.into(), risk.into())
    }

    fn outcome(d: &Decided) -> Outcome {
        match (d.state, &d.denial, &d.approval) {
            (OpState::Queued, None, None) => Outcome::Queued,
            (OpState::Denied, Some((reason, _)), None) => Outcome::Denied(*reason),
            (OpState::PendingApproval, None, Some((rule, risk))) => {
                Outcome::Approval(rule.clone(), risk.clone())
            }
            other => panic!("an inconsistent decision: {other:?}"),
        }
    }

    /// What a case is about, the manifest, the envelope, the org's tool,
    /// and what it should come to.
    type Case<'a> = (
        &'static str,
        Option<SignedManifest>,
        Envelope,
        Option<&'a ToolDef>,
        Outcome,
    );

    #[test]
    fn an_acting_browser_step_is_decided_on_the_element_it_acts_on() {
        use moat_core::element::ElementFacts;
        let policy = PolicyEngine::new(
            r#"
            @id("links") permit(principal, action == Moat::Action::"browser_step", resource)
            when { context.element.tag == "a" && context.domain == "app.example" };
            @id("sends") @approval("required") @risk("high")
            permit(principal, action == Moat::Action::"browser_step", resource)
            when { context.element.submits };
            @id("no-select") forbid(principal, action == Moat::Action::"browser_step", resource)
            when { context.action == "select" };
            "#,
        )
        .expect("policy");
        let m = manifest(&[OpKind::BrowserStep], &[]);
        let click = envelope(
            "browser_step",
            json!({"action": "click", "sessionId": "s", "selector": "#x"}),
        );
        let facts = |tag: &str, origin: &str, submits: bool| ElementFacts {
            origin: origin.into(),
            tag: tag.into(),
            submits,
            ..ElementFacts::default()
        };
        let on = |element: Option<&ElementFacts>, envelope: &Envelope| {
            decide(
                &policy,
                "org",
                &run(),
                Some(&m),
                envelope,
                None,
                None,
                element,
            )
        };
        // Asked for: nothing is known of the element, so a rule about it
        // cannot permit it yet; it is let through to be looked at.
        let asked = on(None, &click);
        assert_eq!(outcome(&asked), Outcome::Queued);
        assert!(asked.record.element_check, "{:?}", asked.record);
        // A forbid that needs no element refuses it at once.
        let select = envelope(
            "browser_step",
            json!({"action": "select", "sessionId": "s", "selector": "#x", "value": "v"}),
        );
        assert_eq!(
            outcome(&on(None, &select)),
            Outcome::Denied(DenialReason::PolicyDenied)
        );
        // On its element: a link on the site, a submit, anything else.
        let link = facts("a", "https://App.example:8443", false);
        let decided = on(Some(&link), &click);
        assert_eq!(outcome(&decided), Outcome::Queued);
        assert_eq!(decided.record.element.as_ref(), Some(&link));
        assert!(!decided.record.element_check);
        assert_eq!(
            outcome(&on(
                Some(&facts("a", "https://elsewhere.example", false)),
                &click
            )),
            Outcome::Denied(DenialReason::PolicyDenied)
        );
        assert_eq!(
            outcome(&on(
                Some(&facts("button", "https://app.example", true)),
                &click
            )),
            approval("sends", "high")
        );
        assert_eq!(
            outcome(&on(
                Some(&facts("div", "https://app.example", false)),
                &click
            )),
            Outcome::Denied(DenialReason::PolicyDenied)
        );
    }

    #[test]
    fn decisions_over_manifest_and_policy() {
        use OpKind::*;
        let policy = PolicyEngine::new(POLICY).expect("policy");
        let all = [ArtifactRead, ArtifactWrite, ExecArgv, HttpRequest];
        let crm = tool("crm", false);
        let billing = tool("billing", true);
        let write = |path: &str| json!({"path": path, "content": "x", "maxBytes": 10});
        let call = |name: &str| json!({"profile": crate::tools::PROFILE, "tool": name});
        let cases: Vec<Case> = vec![
            (
                "a read the policy permits",
                Some(manifest(&all, &[])),
                envelope("artifact_read", json!({"path": "input/a", "maxBytes": 10})),
                None,
                Outcome::Queued,
            ),
            (
                "a write under output/",
                Some(manifest(&all, &[])),
                envelope("artifact_write", write("output/r.txt")),
                None,
                Outcome::Queued,
            ),
            (
                "a write under export/ waits for a person",
                Some(manifest(&all, &[])),
                envelope("artifact_write", write("export/r.csv")),
                None,
                approval("export", "high"),
            ),
            (
                "a write nothing permits",
                Some(manifest(&all, &[])),
                envelope("artifact_write", write("input/r.txt")),
                None,
                Outcome::Denied(DenialReason::PolicyDenied),
            ),
            (
                "a forbid wins over a permit",
                Some(manifest(&all, &[])),
                envelope("exec_argv", json!({"argv": ["/usr/bin/curl", "x"]})),
                None,
                Outcome::Denied(DenialReason::PolicyDenied),
            ),
            (
                "a program the policy permits",
                Some(manifest(&all, &[])),
                envelope("exec_argv", json!({"argv": ["/usr/bin/wc", "-l"]})),
                None,
                Outcome::Queued,
            ),
            (
                "an unknown op",
                Some(manifest(&all, &[])),
                envelope("format_disk", json!({})),
                None,
                Outcome::Denied(DenialReason::UnknownOp),
            ),
            (
                "arguments of the wrong shape",
                Some(manifest(&all, &[])),
                envelope("artifact_read", json!({"path": 7})),
                None,
                Outcome::Denied(DenialReason::InvalidArgs),
            ),
            (
                "no manifest is published",
                None,
                envelope("artifact_read", json!({"path": "a", "maxBytes": 1})),
                None,
                Outcome::Denied(DenialReason::OpNotInManifest),
            ),
            (
                "an op the manifest leaves out",
                Some(manifest(&[ArtifactRead], &[])),
                envelope("exec_argv", json!({"argv": ["/usr/bin/wc"]})),
                None,
                Outcome::Denied(DenialReason::OpNotInManifest),
            ),
            (
                "a tool the org does not define",
                Some(manifest(&all, &["crm"])),
                envelope("http_request", call("crm")),
                None,
                Outcome::Denied(DenialReason::InvalidArgs),
            ),
            (
                "a tool the manifest leaves out",
                Some(manifest(&all, &[])),
                envelope("http_request", call("crm")),
                Some(&crm),
                Outcome::Denied(DenialReason::OpNotInManifest),
            ),
            (
                "a tool call the policy permits",
                Some(manifest(&all, &["crm"])),
                envelope("http_request", call("crm")),
                Some(&crm),
                Outcome::Queued,
            ),
            (
                "a tool that always asks a person",
                Some(manifest(&all, &["billing"])),
                envelope("http_request", call("billing")),
                Some(&billing),
                approval("tool:billing", "high"),
            ),
        ];
        for (what, manifest, envelope, tool, expected) in cases {
            let decided = decide(
                &policy,
                "org",
                &run(),
                manifest.as_ref(),
                &envelope,
                tool,
                None,
                None,
            );
            assert_eq!(outcome(&decided), expected, "{what}: {:?}", decided.record);
            assert_eq!(
                decided.record.to_json()["policyHash"],
                policy.hash(),
                "{what}"
            );
            let word = match &expected {
                Outcome::Queued => "allow",
                Outcome::Denied(_) => "deny",
                Outcome::Approval(..) => "require_approval",
            };
            assert_eq!(decided.record.to_json()["decision"], word, "{what}");
        }
    }

    #[test]
    fn the_policy_puts_untrusted_programs_in_a_stronger_class_the_runner_must_offer() {
        const CLASSES: &str = r#"
            @id("programs") permit(principal, action == Moat::Action::"exec_argv", resource)
            when { resource != Moat::Executable::"/usr/bin/forbidden" };
            @id("untrusted-in-a-vm") @workload_class("microvm")
            permit(principal, action == Moat::Action::"exec_argv", resource)
            when { context.origin != "trusted" };
        "#;
        let policy = PolicyEngine::new(CLASSES).expect("policy");
        let with = |classes: Value| -> SignedManifest {
            let mut m = manifest(&[OpKind::ExecArgv], &[]).manifest;
            m.policy_hash = policy.hash().to_owned();
            m.allowed_executables = serde_json::from_value(json!([
                {"path": "/usr/bin/wc"},
                {"path": "/usr/bin/python3", "origin": "generated"},
                {"path": "/usr/bin/forbidden", "origin": "third-party"},
            ]))
            .expect("executables");
            m.workload_classes = serde_json::from_value(classes).expect("classes");
            m.sign(&PrivateKey::from_seed([7; 32])).expect("sign")
        };
        let both = with(json!(["namespace", "microvm"]));
        let exec = |program: &str| envelope("exec_argv", json!({"argv": [program]}));
        let class = |d: &Decided| d.record.class;
        let ns_and_vm = [WorkloadClass::Namespace, WorkloadClass::Microvm];
        let decided = |m: &SignedManifest, program: &str, offered: Option<&[WorkloadClass]>| {
            decide(
                &policy,
                "org",
                &run(),
                Some(m),
                &exec(program),
                None,
                offered,
                None,
            )
        };
        // A trusted tool stays in the namespace class; generated code goes
        // to a VM, in the record and the capability.granted event.
        let wc = decided(&both, "/usr/bin/wc", Some(&ns_and_vm));
        assert_eq!(
            (outcome(&wc), class(&wc)),
            (Outcome::Queued, Some(WorkloadClass::Namespace))
        );
        let py = decided(&both, "/usr/bin/python3", Some(&ns_and_vm));
        assert_eq!(
            (outcome(&py), class(&py)),
            (Outcome::Queued, Some(WorkloadClass::Microvm))
        );
        assert_eq!(py.record.granted().class, Some(WorkloadClass::Microvm));
        // Not yet claimed: decided, and the claim looks for a runner.
        let unclaimed = decided(&both, "/usr/bin/python3", None);
        assert_eq!(class(&unclaimed), Some(WorkloadClass::Microvm));
        // A runner that offers only namespace: refused, never run weaker.
        let weak = decided(&both, "/usr/bin/python3", Some(&[WorkloadClass::Namespace]));
        assert_eq!(
            outcome(&weak),
            Outcome::Denied(DenialReason::ClassNotAvailable)
        );
        assert_eq!(class(&weak), Some(WorkloadClass::Microvm));
        // A manifest without the class: refused, saying which it lists.
        let only_ns = with(json!([]));
        let refused = decided(&only_ns, "/usr/bin/python3", None);
        assert_eq!(
            outcome(&refused),
            Outcome::Denied(DenialReason::ClassNotAvailable)
        );
        assert!(
            refused
                .denial
                .as_ref()
                .is_some_and(|(_, m)| m.contains("(namespace)")),
            "{:?}",
            refused.denial
        );
        // A manifest with only microvm runs even trusted tools there.
        let only_vm = with(json!(["microvm"]));
        let wc = decided(&only_vm, "/usr/bin/wc", None);
        assert_eq!(class(&wc), Some(WorkloadClass::Microvm));
        // A classification rule grants nothing: what no permit allows stays
        // denied, third-party or not.
        let forbidden = decided(&both, "/usr/bin/forbidden", Some(&ns_and_vm));
        assert_eq!(
            outcome(&forbidden),
            Outcome::Denied(DenialReason::PolicyDenied)
        );
        // The classes a new run needs: those of the programs it may run.
        assert_eq!(
            run_classes(&policy, "org", Some(&both), &[]),
            Ok(vec![WorkloadClass::Namespace, WorkloadClass::Microvm])
        );
        assert_eq!(
            run_classes(&policy, "org", Some(&only_ns), &[]),
            Ok(vec![WorkloadClass::Namespace])
        );
        assert!(run_classes(&policy, "org", Some(&only_ns), &[WorkloadClass::Microvm]).is_err());
        assert!(run_classes(&policy, "org", None, &[WorkloadClass::Microvm]).is_err());
    }

    #[test]
    fn a_rule_on_browser_steps_puts_the_session_in_a_vm() {
        const RULES: &str = r#"
            permit(principal, action == Moat::Action::"browser_step", resource);
            @id("browsers-in-a-vm") @workload_class("microvm")
            permit(principal, action == Moat::Action::"browser_step", resource);
        "#;
        let policy = PolicyEngine::new(RULES).expect("policy");
        let mut m = manifest(&[OpKind::BrowserStep], &[]).manifest;
        m.policy_hash = policy.hash().to_owned();
        m.workload_classes = vec![WorkloadClass::Namespace, WorkloadClass::Microvm];
        let signed = m.sign(&PrivateKey::from_seed([7; 32])).expect("sign");
        let open = envelope("browser_step", json!({"action": "open", "sessionId": "s"}));
        let decided = |offered: &[WorkloadClass]| {
            decide(
                &policy,
                "org",
                &run(),
                Some(&signed),
                &open,
                None,
                Some(offered),
                None,
            )
        };
        let in_vm = decided(&[WorkloadClass::Namespace, WorkloadClass::Microvm]);
        assert_eq!(outcome(&in_vm), Outcome::Queued);
        assert_eq!(in_vm.record.class, Some(WorkloadClass::Microvm));
        assert_eq!(in_vm.record.granted().class, Some(WorkloadClass::Microvm));
        // Never run weaker: a runner without the class refuses it.
        let refused = decided(&[WorkloadClass::Namespace]);
        assert_eq!(
            outcome(&refused),
            Outcome::Denied(DenialReason::ClassNotAvailable)
        );
        assert!(
            refused
                .denial
                .as_ref()
                .is_some_and(|(_, m)| m.contains("browser step")),
            "{:?}",
            refused.denial
        );
        // A run that may browse (and run no program) needs the class.
        assert_eq!(
            run_classes(&policy, "org", Some(&signed), &[]),
            Ok(vec![WorkloadClass::Microvm])
        );
    }

    #[test]
    fn a_classification_rule_must_be_a_plain_permit_with_a_known_class() {
        for bad in [
            r#"@workload_class("gvisor") permit(principal, action, resource);"#,
            r#"@workload_class("worker") permit(principal, action, resource);"#,
            r#"@workload_class("microvm") forbid(principal, action, resource);"#,
            r#"@workload_class("microvm") @approval("required") permit(principal, action, resource);"#,
        ] {
            assert!(
                matches!(
                    PolicyEngine::new(bad),
                    Err(crate::policy::PolicyError::Class { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_tool_token_needs_every_tool_defined_listed_and_permitted() {
        let policy = PolicyEngine::new(POLICY).expect("policy");
        let m = manifest(&[OpKind::ExecArgv], &["crm", "billing"]);
        let exec = envelope(
            "exec_argv",
            json!({"argv": ["/usr/bin/wc"], "toolToken": ["crm"]}),
        );
        let row = |name: &str, approval: bool| moat_store::ToolRow {
            name: name.into(),
            definition: json!({"name": name, "method": "GET",
                               "url": "https://api.example.com/v1/x", "approval": approval}),
            updated_ms: 0,
        };
        let token = |tools: &[(String, Option<moat_store::ToolRow>)]| {
            let mut decided = decide(&policy, "org", &run(), Some(&m), &exec, None, None, None);
            decide_token_tools(&policy, "org", &run(), Some(&m), tools, &mut decided);
            decided
        };
        let granted = token(&[("crm".into(), Some(row("crm", false)))]);
        assert_eq!(outcome(&granted), Outcome::Queued);
        assert!(
            granted.record.to_json()["toolToken"]["crm"].is_string(),
            "{:?}",
            granted.record
        );
        let asks = token(&[("billing".into(), Some(row("billing", true)))]);
        assert_eq!(outcome(&asks), approval("tool:billing", "high"));
        let undefined = token(&[("ghost".into(), None)]);
        assert_eq!(
            outcome(&undefined),
            Outcome::Denied(DenialReason::InvalidArgs)
        );
        let unlisted = token(&[("erp".into(), Some(row("erp", false)))]);
        assert_eq!(
            outcome(&unlisted),
            Outcome::Denied(DenialReason::OpNotInManifest)
        );
        // A refusal reads as one, whatever the operation alone would have
        // been (it is recorded as `capability.denied`).
        for refused in [&undefined, &unlisted] {
            assert_eq!(
                refused.record.to_json()["decision"],
                "deny",
                "{:?}",
                refused.record
            );
            assert!(
                refused.record.to_json().get("rule").is_none(),
                "{:?}",
                refused.record
            );
        }
    }
}
