//! Policy decisions with Cedar, and the capability an allow grants.

use std::str::FromStr;
use std::time::{Duration, SystemTime};

use cedar_policy::{
    Authorizer, Context, Decision as CedarDecision, Entities, EntityId, EntityTypeName, EntityUid,
    PolicySet, Request,
};
use moat_core::capability::{CapabilityClaims, MAX_LIFETIME, args_hash};
use moat_core::element::ElementFacts;
use moat_core::sign::PrivateKey;
use moat_core::{Envelope, ExecutableOrigin, NetworkMode, OpKind, SandboxMode, WorkloadClass};
use serde_json::json;

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("the policies do not parse: {0}")]
    Parse(String),
    #[error("policy {id}: @approval takes \"required\" only")]
    Annotation { id: String },
    #[error("policy {id}: @risk takes low, medium, high or critical")]
    Risk { id: String },
    #[error("policy {id}: {why}")]
    Class { id: String, why: String },
    #[error("building the request: {0}")]
    Request(String),
    #[error("evaluating the policies: {0}")]
    Evaluation(String),
    #[error("a capability lives at most {} s", MAX_LIFETIME.as_secs())]
    Lifetime,
}

/// What an operation acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resource {
    Path(String),
    Executable(String),
    Domain(String),
    Tool(String),
    /// An org secret, by name (`browser_step` `fill_secret`).
    Secret(String),
    /// Operations with no narrower resource.
    Run(String),
}

/// As Cedar names it: `Moat::Path::"input/a.csv"`.
impl std::fmt::Display for Resource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (kind, id) = self.parts();
        write!(f, "Moat::{kind}::{id:?}")
    }
}

impl Resource {
    fn parts(&self) -> (&'static str, &str) {
        match self {
            Resource::Path(p) => ("Path", p),
            Resource::Executable(p) => ("Executable", p),
            Resource::Domain(d) => ("Domain", d),
            Resource::Tool(t) => ("Tool", t),
            Resource::Secret(s) => ("Secret", s),
            Resource::Run(r) => ("Run", r),
        }
    }

    fn uid(&self) -> Result<EntityUid, PolicyError> {
        let (kind, id) = self.parts();
        uid(kind, id)
    }
}

/// One operation to decide on.
#[derive(Debug, Clone)]
pub struct OpRequest<'a> {
    pub org: &'a str,
    pub runner: &'a str,
    pub op: OpKind,
    pub resource: Resource,
    /// Bytes the operation may move (maxBytes, maxOutputBytes...); 0 if none.
    pub size: u64,
    pub network: NetworkMode,
    pub sandbox: SandboxMode,
    /// `context.origin`: where the code an executable runs comes from (the
    /// manifest says; `trusted` for every operation that runs none).
    pub origin: ExecutableOrigin,
    /// `context.path`, `context.method`, `context.action` (see [`crate::describe::Described`]).
    pub path: &'a str,
    pub method: &'a str,
    pub action: &'a str,
    /// `context.domain`: the host a browser step goes to or acts on ("" if none).
    pub domain: &'a str,
    /// `context.element`: what an acting browser step would act on, once
    /// the runner's browser has found it (see [`element_context`]).
    pub element: Option<&'a ElementFacts>,
}

/// `context.element`: always there, so that a rule about it evaluates for
/// every request; `checked` says whether it is a found element's.
fn element_context(element: Option<&ElementFacts>) -> serde_json::Value {
    let none = ElementFacts::default();
    let e = element.unwrap_or(&none);
    json!({
        "checked": element.is_some(),
        "url": e.url,
        "tag": e.tag,
        "type": e.kind,
        "role": e.role,
        "text": e.text,
        "href": e.href,
        "formMethod": e.form_method,
        "formAction": e.form_action,
        "submits": e.submits,
    })
}

/// The action a file's way out of the export boundary is decided as.
pub const EXPORT_ACTION: &str = "export";

/// Where promoted files go: the org's store on the control plane.
pub const ORG_STORE: &str = "org-store";

/// A file that passed the export rules, to decide on.
#[derive(Debug, Clone)]
pub struct ExportRequest<'a> {
    pub org: &'a str,
    pub runner: &'a str,
    /// Relative to the run's workspace (`output/clean.csv`).
    pub path: &'a str,
    /// The type it was validated as (`csv`, `json`...).
    pub exported_as: &'a str,
    pub size: u64,
    /// Where it would go ([`ORG_STORE`]).
    pub destination: &'a str,
}

/// The outcome, with the policies that made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow {
        policies: Vec<String>,
    },
    /// `policies` is empty when nothing permitted the request.
    Deny {
        policies: Vec<String>,
    },
    RequireApproval {
        rule: String,
        /// The rule's `@risk` (`medium` if it has none).
        risk: String,
    },
}

/// The default policy set: `policies/default.cedar` (what `moat up` runs with).
pub const DEFAULT_POLICY: &str = include_str!("../../../policies/default.cedar");

/// The risk levels a policy's `@risk` may name.
pub const RISKS: [&str; 4] = ["low", "medium", "high", "critical"];

fn uid(kind: &str, id: &str) -> Result<EntityUid, PolicyError> {
    let kind = EntityTypeName::from_str(&format!("Moat::{kind}"))
        .map_err(|e| PolicyError::Request(e.to_string()))?;
    Ok(EntityUid::from_type_name_and_id(kind, EntityId::new(id)))
}

/// The annotation that makes a policy a classification rule.
pub const CLASS_ANNOTATION: &str = "workload_class";

/// A parsed policy set, and its hash (what manifests name as `policyHash`).
///
/// Policies annotated `@workload_class("...")` are classification rules:
/// they grant nothing, and an operation they match needs at least that
/// workload class (the strongest of those that match). Kept apart so that
/// a rule written to classify can never widen what is permitted.
pub struct PolicyEngine {
    policies: PolicySet,
    classes: PolicySet,
    hash: String,
    authorizer: Authorizer,
}

impl PolicyEngine {
    pub fn new(source: &str) -> Result<Self, PolicyError> {
        let all = PolicySet::from_str(source).map_err(|e| PolicyError::Parse(format!("{e:?}")))?;
        let mut policies = PolicySet::new();
        let mut classes = PolicySet::new();
        for policy in all.policies() {
            let id = || policy.id().to_string();
            let class_error = |why: &str| PolicyError::Class {
                id: id(),
                why: why.to_owned(),
            };
            let target = match policy.annotation(CLASS_ANNOTATION) {
                None => &mut policies,
                Some(value) => {
                    let class = value
                        .parse::<WorkloadClass>()
                        .map_err(|e| class_error(&e.to_string()))?;
                    if !class.runs_programs() {
                        return Err(class_error(
                            "worker is the class of WebAssembly components, which no operation \
                             is run as: an operation's class is namespace or microvm",
                        ));
                    }
                    if policy.effect() != cedar_policy::Effect::Permit {
                        return Err(class_error(
                            "@workload_class classifies with a permit (it grants nothing); \
                             a forbid cannot carry it",
                        ));
                    }
                    if policy.annotation("approval").is_some() {
                        return Err(class_error(
                            "@workload_class rules grant nothing, so they cannot ask for an \
                             approval: put @approval on a permit of its own",
                        ));
                    }
                    &mut classes
                }
            };
            target
                .add(policy.clone())
                .map_err(|e| PolicyError::Parse(e.to_string()))?;
        }
        for policy in policies.policies() {
            if let Some(value) = policy.annotation("approval")
                && value != "required"
            {
                return Err(PolicyError::Annotation {
                    id: policy.id().to_string(),
                });
            }
            if let Some(value) = policy.annotation("risk")
                && !RISKS.contains(&value)
            {
                return Err(PolicyError::Risk {
                    id: policy.id().to_string(),
                });
            }
        }
        Ok(PolicyEngine {
            policies,
            classes,
            hash: moat_core::hash::sha256_hex(source.as_bytes()),
            authorizer: Authorizer::new(),
        })
    }

    /// A policy's `@id("...")` if it has one, else Cedar's own id.
    fn name(&self, id: &cedar_policy::PolicyId) -> String {
        self.policies
            .policy(id)
            .and_then(|p| p.annotation("id"))
            .map_or_else(|| id.to_string(), str::to_owned)
    }

    /// SHA-256 of the policy text, hex.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    pub fn decide(&self, request: &OpRequest<'_>) -> Result<Decision, PolicyError> {
        let (principal, action, resource, context, entities) = Self::op_request(request)?;
        self.evaluate(principal, action, resource, context, &entities)
    }

    /// The weakest workload class a program of this operation may run in:
    /// the strongest class of the classification rules that match it
    /// (`namespace` when none does).
    pub fn classify(&self, request: &OpRequest<'_>) -> Result<WorkloadClass, PolicyError> {
        // Every exec_argv's decision asks: without rules, nothing to evaluate.
        if !self.classifies() {
            return Ok(WorkloadClass::Namespace);
        }
        let (principal, action, resource, context, entities) = Self::op_request(request)?;
        let response = self.authorizer.is_authorized(
            &Request::new(principal, action, resource, context, None)
                .map_err(|e| PolicyError::Request(e.to_string()))?,
            &self.classes,
            &entities,
        );
        if let Some(error) = response.diagnostics().errors().next() {
            // A rule that cannot be evaluated might have asked for more:
            // nothing is run on a guess.
            return Err(PolicyError::Evaluation(error.to_string()));
        }
        Ok(response
            .diagnostics()
            .reason()
            .filter_map(|id| self.classes.policy(id))
            .filter_map(|p| p.annotation(CLASS_ANNOTATION))
            .filter_map(|c| c.parse::<WorkloadClass>().ok())
            .fold(WorkloadClass::Namespace, |strongest, c| {
                if c.satisfies(strongest) { c } else { strongest }
            }))
    }

    /// Whether any classification rule exists (none: every operation is
    /// `namespace`, with no evaluation).
    pub fn classifies(&self) -> bool {
        self.classes.policies().next().is_some()
    }

    fn op_request(
        request: &OpRequest<'_>,
    ) -> Result<(EntityUid, EntityUid, EntityUid, Context, Entities), PolicyError> {
        Self::parts(
            request.org,
            request.runner,
            request.op.as_str(),
            request.resource.uid()?,
            json!({
                "size": i64::try_from(request.size).unwrap_or(i64::MAX),
                "network": request.network.as_str(),
                "sandbox": request.sandbox.as_str(),
                "origin": request.origin.as_str(),
                "path": request.path,
                "method": request.method,
                "action": request.action,
                "domain": request.domain,
                "element": element_context(request.element),
            }),
        )
    }

    /// Whether a file a program wrote, which passed the export rules, may
    /// leave: action `Moat::Action::"export"` on `Moat::Path::"<path>"`,
    /// with `context.path`, `.size`, `.type` and `.destination` (and the
    /// other keys every request has, empty, so that a rule written for
    /// any action still evaluates).
    pub fn decide_export(&self, request: &ExportRequest<'_>) -> Result<Decision, PolicyError> {
        let (principal, action, resource, context, entities) = Self::parts(
            request.org,
            request.runner,
            EXPORT_ACTION,
            Resource::Path(request.path.to_owned()).uid()?,
            json!({
                "size": i64::try_from(request.size).unwrap_or(i64::MAX),
                // Empty, not "off": an older rule without a scope on the
                // action (`when { context.network == "off" }`) must not
                // permit exports by accident.
                "network": "",
                "sandbox": "",
                "origin": "",
                "path": request.path,
                "method": "",
                "action": "",
                "domain": "",
                "element": element_context(None),
                "type": request.exported_as,
                "destination": request.destination,
            }),
        )?;
        self.evaluate(principal, action, resource, context, &entities)
    }

    /// A request's principal, action, resource, context and entities.
    fn parts(
        org: &str,
        runner: &str,
        action: &str,
        resource: EntityUid,
        context: serde_json::Value,
    ) -> Result<(EntityUid, EntityUid, EntityUid, Context, Entities), PolicyError> {
        let principal = uid("Runner", runner)?;
        let entities = Entities::from_json_value(
            json!([
                {"uid": {"type": "Moat::Runner", "id": runner}, "attrs": {},
                 "parents": [{"type": "Moat::Org", "id": org}]},
                {"uid": {"type": "Moat::Org", "id": org}, "attrs": {}, "parents": []},
            ]),
            None,
        )
        .map_err(|e| PolicyError::Request(e.to_string()))?;
        let context = Context::from_json_value(context, None)
            .map_err(|e| PolicyError::Request(e.to_string()))?;
        Ok((
            principal,
            uid("Action", action)?,
            resource,
            context,
            entities,
        ))
    }

    fn evaluate(
        &self,
        principal: EntityUid,
        action: EntityUid,
        resource: EntityUid,
        context: Context,
        entities: &Entities,
    ) -> Result<Decision, PolicyError> {
        let cedar_request = Request::new(principal, action, resource, context, None)
            .map_err(|e| PolicyError::Request(e.to_string()))?;
        let response = self
            .authorizer
            .is_authorized(&cedar_request, &self.policies, entities);
        if let Some(error) = response.diagnostics().errors().next() {
            // A policy that cannot be evaluated decides nothing: fail closed.
            return Err(PolicyError::Evaluation(error.to_string()));
        }
        let reasons: Vec<String> = response
            .diagnostics()
            .reason()
            .map(|id| self.name(id))
            .collect();
        Ok(match response.decision() {
            CedarDecision::Deny => Decision::Deny { policies: reasons },
            CedarDecision::Allow => {
                let approval = response.diagnostics().reason().find(|id| {
                    self.policies
                        .policy(id)
                        .and_then(|p| p.annotation("approval"))
                        .is_some()
                });
                match approval {
                    Some(rule) => Decision::RequireApproval {
                        rule: self.name(rule),
                        risk: self
                            .policies
                            .policy(rule)
                            .and_then(|p| p.annotation("risk"))
                            .unwrap_or("medium")
                            .to_owned(),
                    },
                    None => Decision::Allow { policies: reasons },
                }
            }
        })
    }

    /// The capability for an allowed operation: bound to its run, id, kind,
    /// arguments and this policy set, valid `ttl` from `now`, naming the
    /// workload class its program must run in.
    pub fn grant(
        &self,
        (envelope, op, class, element): (&Envelope, OpKind, WorkloadClass, Option<String>),
        key: &PrivateKey,
        now: SystemTime,
        ttl: Duration,
        nonce: String,
    ) -> Result<String, PolicyError> {
        if ttl > MAX_LIFETIME {
            return Err(PolicyError::Lifetime);
        }
        let stamp = moat_core::time::stamp;
        let claims = CapabilityClaims {
            run_id: envelope.run_id.clone(),
            op_id: envelope.id.clone(),
            op,
            args_hash: args_hash(envelope),
            policy_hash: self.hash.clone(),
            issued_at: stamp(now),
            expires_at: stamp(now + ttl),
            nonce,
            class,
            element,
        };
        Ok(claims.sign(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICIES: &str = r#"
        @id("read-inputs")
        permit(principal in Moat::Org::"acme", action == Moat::Action::"artifact_read", resource)
        when { context.size <= 1048576 };

        @id("python")
        permit(principal in Moat::Org::"acme", action == Moat::Action::"exec_argv",
               resource == Moat::Executable::"/usr/bin/python3")
        when { context.network == "off" };

        @id("exec-with-network") @approval("required") @risk("high")
        permit(principal in Moat::Org::"acme", action == Moat::Action::"exec_argv",
               resource == Moat::Executable::"/usr/bin/python3")
        when { context.network != "off" };

        @id("no-secrets")
        forbid(principal, action, resource == Moat::Path::"input/secrets.env");
    "#;

    fn request(op: OpKind, resource: Resource) -> OpRequest<'static> {
        OpRequest {
            org: "acme",
            runner: "r1",
            op,
            resource,
            size: 4096,
            network: NetworkMode::Off,
            sandbox: SandboxMode::WorkspaceWrite,
            origin: ExecutableOrigin::Trusted,
            path: "",
            method: "",
            action: "",
            domain: "",
            element: None,
        }
    }

    #[test]
    fn permit_forbid_default_deny_and_approval() {
        let engine = PolicyEngine::new(POLICIES).unwrap();
        let read = request(OpKind::ArtifactRead, Resource::Path("input/a.csv".into()));
        assert_eq!(
            engine.decide(&read).unwrap(),
            Decision::Allow {
                policies: vec!["read-inputs".into()]
            }
        );
        // forbid wins over permit.
        let secret = request(
            OpKind::ArtifactRead,
            Resource::Path("input/secrets.env".into()),
        );
        assert_eq!(
            engine.decide(&secret).unwrap(),
            Decision::Deny {
                policies: vec!["no-secrets".into()]
            }
        );
        // Context: too large.
        let big = OpRequest {
            size: 1 << 30,
            ..read.clone()
        };
        assert_eq!(
            engine.decide(&big).unwrap(),
            Decision::Deny { policies: vec![] }
        );
        // Another org's runner gets nothing.
        let foreign = OpRequest {
            org: "globex",
            ..read.clone()
        };
        assert_eq!(
            engine.decide(&foreign).unwrap(),
            Decision::Deny { policies: vec![] }
        );
        // The same program with network asks for an approval.
        let python = request(
            OpKind::ExecArgv,
            Resource::Executable("/usr/bin/python3".into()),
        );
        assert!(matches!(
            engine.decide(&python).unwrap(),
            Decision::Allow { .. }
        ));
        let online = OpRequest {
            network: NetworkMode::Allowlist,
            ..python
        };
        assert_eq!(
            engine.decide(&online).unwrap(),
            Decision::RequireApproval {
                rule: "exec-with-network".into(),
                risk: "high".into(),
            }
        );
        // No policy for this operation: denied.
        let http = request(
            OpKind::HttpRequest,
            Resource::Domain("api.example.com".into()),
        );
        assert_eq!(
            engine.decide(&http).unwrap(),
            Decision::Deny { policies: vec![] }
        );
    }

    #[test]
    fn bad_policies_and_annotations_are_refused_at_load() {
        assert!(matches!(
            PolicyEngine::new("permit(principal,"),
            Err(PolicyError::Parse(_))
        ));
        assert!(matches!(
            PolicyEngine::new(r#"@approval("maybe") permit(principal, action, resource);"#),
            Err(PolicyError::Annotation { .. })
        ));
        assert!(matches!(
            PolicyEngine::new(r#"@risk("scary") permit(principal, action, resource);"#),
            Err(PolicyError::Risk { .. })
        ));
    }

    #[test]
    fn an_allow_becomes_a_capability_the_runner_accepts() {
        let engine = PolicyEngine::new(POLICIES).unwrap();
        let key = PrivateKey::from_seed([9; 32]);
        let envelope: Envelope = serde_json::from_value(json!({
            "id": "1", "runId": "run-1", "correlationId": "c", "op": "artifact_read",
            "args": {"path": "input/a.csv", "maxBytes": 4096}, "createdAt": "2026-11-29T12:00:00Z"
        }))
        .unwrap();
        let now = SystemTime::now();
        let token = engine
            .grant(
                (
                    &envelope,
                    OpKind::ArtifactRead,
                    WorkloadClass::Namespace,
                    None,
                ),
                &key,
                now,
                Duration::from_secs(30),
                "n".into(),
            )
            .unwrap();
        let claims = CapabilityClaims::verify(&token, &key.public(), now).unwrap();
        let bound =
            claims.check_binding("run-1", "1", OpKind::ArtifactRead, &envelope, engine.hash());
        assert_eq!(bound, Ok(()));
        assert!(matches!(
            engine.grant(
                (
                    &envelope,
                    OpKind::ArtifactRead,
                    WorkloadClass::Microvm,
                    None
                ),
                &key,
                now,
                Duration::from_secs(61),
                "n".into()
            ),
            Err(PolicyError::Lifetime)
        ));
    }

    fn facts(tag: &str, kind: &str, href: &str, method: &str, submits: bool) -> ElementFacts {
        ElementFacts {
            origin: "https://app.example".into(),
            tag: tag.into(),
            kind: kind.into(),
            href: href.into(),
            form_method: method.into(),
            submits,
            ..ElementFacts::default()
        }
    }

    static SUBMIT: std::sync::LazyLock<ElementFacts> =
        std::sync::LazyLock::new(|| facts("button", "submit", "", "post", true));
    static LINK: std::sync::LazyLock<ElementFacts> =
        std::sync::LazyLock::new(|| facts("a", "", "https://app.example/next", "", false));
    static POST_FIELD: std::sync::LazyLock<ElementFacts> =
        std::sync::LazyLock::new(|| facts("input", "text", "", "post", false));
    static SEARCH_FIELD: std::sync::LazyLock<ElementFacts> =
        std::sync::LazyLock::new(|| facts("input", "search", "", "get", false));

    #[test]
    fn the_default_policy_asks_a_person_for_the_risky_operations() {
        let engine = PolicyEngine::new(DEFAULT_POLICY).unwrap();
        let ask = |op: OpKind, resource: Resource, edit: &dyn Fn(&mut OpRequest<'static>)| {
            let mut r = request(op, resource);
            edit(&mut r);
            match engine.decide(&r).unwrap() {
                Decision::Allow { .. } => "allow".to_owned(),
                Decision::Deny { .. } => "deny".to_owned(),
                Decision::RequireApproval { rule, .. } => rule,
            }
        };
        let path = |p: &'static str| Resource::Path(p.into());
        let exe = Resource::Executable("/usr/bin/wc".into());
        let cases: Vec<(&str, String)> = vec![
            (
                "allow",
                ask(OpKind::ArtifactRead, path("input/a.csv"), &|r| {
                    r.path = "input/a.csv"
                }),
            ),
            (
                "allow",
                ask(OpKind::ArtifactWrite, path("output/r.txt"), &|r| {
                    r.path = "output/r.txt"
                }),
            ),
            (
                "large-write",
                ask(OpKind::ArtifactWrite, path("output/big"), &|r| {
                    r.path = "output/big";
                    r.size = 64 << 20;
                }),
            ),
            (
                "data-export",
                ask(OpKind::ArtifactWrite, path("export/x.csv"), &|r| {
                    r.path = "export/x.csv"
                }),
            ),
            (
                "sensitive-path",
                ask(OpKind::ArtifactRead, path("input/sensitive/p.csv"), &|r| {
                    r.path = "input/sensitive/p.csv"
                }),
            ),
            ("allow", ask(OpKind::ExecArgv, exe.clone(), &|_| {})),
            (
                "exec-with-network",
                ask(OpKind::ExecArgv, exe, &|r| {
                    r.network = NetworkMode::Allowlist
                }),
            ),
            (
                "allow",
                ask(
                    OpKind::HttpRequest,
                    Resource::Domain("api.example.com".into()),
                    &|r| r.method = "GET",
                ),
            ),
            (
                "integration-write",
                ask(
                    OpKind::HttpRequest,
                    Resource::Domain("api.example.com".into()),
                    &|r| r.method = "POST",
                ),
            ),
            (
                "integration-write",
                ask(OpKind::HttpRequest, Resource::Tool("crm".into()), &|_| {}),
            ),
            (
                "allow",
                ask(OpKind::BrowserStep, Resource::Run("r".into()), &|r| {
                    r.action = "navigate"
                }),
            ),
            (
                "allow",
                ask(OpKind::BrowserStep, Resource::Run("r".into()), &|r| {
                    r.action = "extract"
                }),
            ),
            // Acting steps: let through to be looked at, then decided on
            // the element found.
            (
                "allow",
                ask(OpKind::BrowserStep, Resource::Run("r".into()), &|r| {
                    r.action = "click"
                }),
            ),
            (
                "allow",
                ask(
                    OpKind::BrowserStep,
                    Resource::Secret("crm-password".into()),
                    &|r| r.action = "fill_secret",
                ),
            ),
            (
                "browser-send",
                ask(OpKind::BrowserStep, Resource::Run("r".into()), &|r| {
                    r.action = "click";
                    r.element = Some(&*SUBMIT);
                }),
            ),
            (
                "allow",
                ask(OpKind::BrowserStep, Resource::Run("r".into()), &|r| {
                    r.action = "click";
                    r.element = Some(&*LINK);
                }),
            ),
            (
                "browser-send",
                ask(OpKind::BrowserStep, Resource::Run("r".into()), &|r| {
                    r.action = "type";
                    r.element = Some(&*POST_FIELD);
                }),
            ),
            (
                "allow",
                ask(OpKind::BrowserStep, Resource::Run("r".into()), &|r| {
                    r.action = "select";
                    r.element = Some(&*SEARCH_FIELD);
                }),
            ),
            (
                "browser-send",
                ask(
                    OpKind::BrowserStep,
                    Resource::Secret("crm-password".into()),
                    &|r| {
                        r.action = "fill_secret";
                        r.element = Some(&*SEARCH_FIELD);
                    },
                ),
            ),
            (
                "deny",
                ask(OpKind::BrowserStep, Resource::Run("r".into()), &|r| {
                    r.action = "download"
                }),
            ),
        ];
        for (want, got) in cases {
            assert_eq!(want, got);
        }
    }

    #[test]
    fn the_default_policy_decides_exports_by_path_and_a_policy_without_a_permit_rejects_them() {
        let export = |path| ExportRequest {
            org: "acme",
            runner: "r1",
            path,
            exported_as: "csv",
            size: 4096,
            destination: ORG_STORE,
        };
        let default = PolicyEngine::new(DEFAULT_POLICY).unwrap();
        assert_eq!(
            default.decide_export(&export("output/clean.csv")).unwrap(),
            Decision::Allow {
                policies: vec!["export-results".into()]
            }
        );
        assert_eq!(
            default
                .decide_export(&export("output/client/report.csv"))
                .unwrap(),
            Decision::RequireApproval {
                rule: "client-deliverable".into(),
                risk: "high".into(),
            }
        );
        // Another destination than the org's store: nothing permits it.
        let elsewhere = ExportRequest {
            destination: "s3://somewhere",
            ..export("output/clean.csv")
        };
        assert_eq!(
            default.decide_export(&elsewhere).unwrap(),
            Decision::Deny { policies: vec![] }
        );
        // A set written before exports were decided permits none; a rule
        // written for every action (no scope on it) still evaluates.
        let older = PolicyEngine::new(POLICIES).unwrap();
        assert_eq!(
            older.decide_export(&export("output/clean.csv")).unwrap(),
            Decision::Deny { policies: vec![] }
        );
        let unscoped = PolicyEngine::new(
            r#"permit(principal, action, resource) when { context.network == "off" };"#,
        )
        .unwrap();
        assert_eq!(
            unscoped.decide_export(&export("output/clean.csv")).unwrap(),
            Decision::Deny { policies: vec![] },
            "a rule for programs without network permits no export"
        );
        let forbidden = ExportRequest {
            path: "input/secrets.env",
            ..export("output/clean.csv")
        };
        assert_eq!(
            older.decide_export(&forbidden).unwrap(),
            Decision::Deny {
                policies: vec!["no-secrets".into()]
            }
        );
    }
}
