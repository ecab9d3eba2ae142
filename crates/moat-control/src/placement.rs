//! Placement with Cedar: may this org's run go to this host now?
//!
//! The deployment's operator writes the placement policy (`moat serve
//! --placement-policy`), not an org: it spans orgs (dedicated hosts, orgs
//! that must never share a host). A request is
//!
//! - principal `Moat::Org::"<org name>"`,
//! - action `Moat::Action::"place"`,
//! - resource `Moat::Host::"<host id>"` with `labels` (the claiming
//!   runner's, a record of strings) and `runner` (its id),
//! - context `run`, `runner`, `environment`, `classes` (the workload classes
//!   the run needs) and `tenants` (the names of the other orgs with runs on
//!   the host now).
//!
//! A run is placed only if some policy permits it and none forbids it; a
//! forbid's `@reason("...")` is what the run's waiting reason says. A policy
//! that cannot be evaluated (a label read without `has`) refuses: a rule
//! meant to keep tenants apart must not be skipped on an error.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::str::FromStr;

use cedar_policy::{
    Authorizer, Context, Decision, Entities, Entity, EntityId, EntityTypeName, EntityUid,
    PolicySet, Request, RestrictedExpression,
};
use moat_core::WorkloadClass;

/// The placement policy `moat serve` runs with unless given one: every
/// org's runs on every host (`policies/placement.cedar`, with examples).
pub const DEFAULT_PLACEMENT: &str = include_str!("../../../policies/placement.cedar");

/// The action every placement request names.
pub const PLACE_ACTION: &str = "place";

#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    #[error("the placement policy does not parse: {0}")]
    Parse(String),
    #[error("placement policy {id}: {why}")]
    Policy { id: String, why: String },
}

/// One run and one host to decide on.
#[derive(Debug, Clone)]
pub struct PlacementRequest<'a> {
    /// The run's org, by name.
    pub org: &'a str,
    pub run: &'a str,
    pub environment: &'a str,
    pub runner: &'a str,
    /// The host's id (`""`: the runner named none).
    pub host: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    /// The workload classes the run needs.
    pub classes: &'a [WorkloadClass],
    /// The other orgs (names) with runs on the host now.
    pub tenants: &'a [String],
}

/// The answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    Placed,
    Refused {
        /// `placement_waiting: ...`, as the run's waiting reason.
        reason: String,
        /// The policies that refused (`@id`, else Cedar's id); empty when
        /// nothing permitted.
        policies: Vec<String>,
    },
}

/// A parsed placement policy.
pub struct PlacementEngine {
    policies: PolicySet,
    hash: String,
    authorizer: Authorizer,
    anywhere: bool,
    /// Parsed once: `Moat::Org`, `Moat::Host` and the place action.
    org_type: EntityTypeName,
    host_type: EntityTypeName,
    action: EntityUid,
}

fn type_name(kind: &str) -> Result<EntityTypeName, String> {
    EntityTypeName::from_str(&format!("Moat::{kind}")).map_err(|e| e.to_string())
}

fn uid(kind: &str, id: &str) -> Result<EntityUid, String> {
    Ok(EntityUid::from_type_name_and_id(
        type_name(kind)?,
        EntityId::new(id),
    ))
}

impl PlacementEngine {
    pub fn new(source: &str) -> Result<PlacementEngine, PlacementError> {
        let policies =
            PolicySet::from_str(source).map_err(|e| PlacementError::Parse(format!("{e:?}")))?;
        for policy in policies.policies() {
            for annotation in ["approval", "workload_class", "risk"] {
                if policy.annotation(annotation).is_some() {
                    return Err(PlacementError::Policy {
                        id: policy.id().to_string(),
                        why: format!(
                            "@{annotation} belongs in the org's operation policy, not in \
                             placement"
                        ),
                    });
                }
            }
        }
        let names = |why: String| PlacementError::Parse(format!("the request's names: {why}"));
        let action = uid("Action", PLACE_ACTION).map_err(names)?;
        Ok(PlacementEngine {
            anywhere: places_anywhere(&policies, &action),
            policies,
            hash: moat_core::hash::sha256_hex(source.as_bytes()),
            authorizer: Authorizer::new(),
            org_type: type_name("Org").map_err(names)?,
            host_type: type_name("Host").map_err(names)?,
            action,
        })
    }

    /// Whether it places every run on every host, whatever the request:
    /// no policy forbids, none has a condition (a `when` or `unless` that
    /// fails to evaluate refuses, whatever the other policies say), and
    /// one permits the place action for any principal and host (the
    /// default policy). A claim then need not look past the oldest queued
    /// run.
    pub fn places_anywhere(&self) -> bool {
        self.anywhere
    }

    /// SHA-256 of the policy text, hex.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    fn name(&self, id: &cedar_policy::PolicyId) -> String {
        self.policies
            .policy(id)
            .and_then(|p| p.annotation("id"))
            .map_or_else(|| id.to_string(), str::to_owned)
    }

    /// Whether the run may go to the host. Never an error: a request that
    /// cannot be built or evaluated is refused, with why.
    pub fn place(&self, request: &PlacementRequest<'_>) -> Placement {
        let host = if request.host.is_empty() {
            "unnamed"
        } else {
            request.host
        };
        let refused = |why: String| Placement::Refused {
            reason: format!("placement_waiting: {why}"),
            policies: Vec::new(),
        };
        let (cedar_request, entities) = match self.request(request, host) {
            Ok(built) => built,
            Err(why) => return refused(format!("the placement request: {why}")),
        };
        let response = self
            .authorizer
            .is_authorized(&cedar_request, &self.policies, &entities);
        if let Some(error) = response.diagnostics().errors().next() {
            return refused(format!("the placement policy failed to evaluate: {error}"));
        }
        if response.decision() == Decision::Allow {
            return Placement::Placed;
        }
        // Refused: the policies that said so, by name, and their reasons.
        let policies: Vec<String> = response
            .diagnostics()
            .reason()
            .map(|id| self.name(id))
            .collect();
        if policies.is_empty() {
            return Placement::Refused {
                reason: format!(
                    "placement_waiting: no placement policy lets org {} run on host {host}",
                    request.org
                ),
                policies,
            };
        }
        let reasons: Vec<&str> = response
            .diagnostics()
            .reason()
            .filter_map(|id| self.policies.policy(id))
            .filter_map(|p| p.annotation("reason"))
            .collect();
        let why = if reasons.is_empty() {
            format!(
                "the placement policy ({}) keeps org {} off host {host}",
                policies.join(", "),
                request.org
            )
        } else {
            reasons.join("; ")
        };
        Placement::Refused {
            reason: format!("placement_waiting: {why}"),
            policies,
        }
    }

    /// The request's entities and context, built as values: no JSON to
    /// write and parse again for each claim (a label is a string, whatever
    /// its name, never one of the JSON form's escapes).
    fn request(
        &self,
        request: &PlacementRequest<'_>,
        host: &str,
    ) -> Result<(Request, Entities), String> {
        let org =
            EntityUid::from_type_name_and_id(self.org_type.clone(), EntityId::new(request.org));
        let host = EntityUid::from_type_name_and_id(self.host_type.clone(), EntityId::new(host));
        let text = |value: &str| RestrictedExpression::new_string(value.to_owned());
        let labels = RestrictedExpression::new_record(
            request
                .labels
                .iter()
                .map(|(name, value)| (name.clone(), text(value))),
        )
        .map_err(|e| e.to_string())?;
        let entities = Entities::from_entities(
            [
                Entity::new(
                    org.clone(),
                    HashMap::from([("name".to_owned(), text(request.org))]),
                    HashSet::new(),
                )
                .map_err(|e| e.to_string())?,
                Entity::new(
                    host.clone(),
                    HashMap::from([
                        ("labels".to_owned(), labels),
                        ("runner".to_owned(), text(request.runner)),
                    ]),
                    HashSet::new(),
                )
                .map_err(|e| e.to_string())?,
            ],
            None,
        )
        .map_err(|e| e.to_string())?;
        let context = Context::from_pairs([
            ("run".to_owned(), text(request.run)),
            ("runner".to_owned(), text(request.runner)),
            ("environment".to_owned(), text(request.environment)),
            (
                "classes".to_owned(),
                RestrictedExpression::new_set(request.classes.iter().map(|c| text(c.as_str()))),
            ),
            (
                "tenants".to_owned(),
                RestrictedExpression::new_set(request.tenants.iter().map(|t| text(t))),
            ),
        ])
        .map_err(|e| e.to_string())?;
        let request = Request::new(org, self.action.clone(), host, context, None)
            .map_err(|e| e.to_string())?;
        Ok((request, entities))
    }
}

/// See [`PlacementEngine::places_anywhere`]. Read from the policies'
/// scopes and conditions, never guessed: any forbid, or any condition,
/// makes the answer false (a permit's condition too: `place` refuses when
/// any policy fails to evaluate, and whether one fails can depend on the
/// run); a scope alone never fails.
fn places_anywhere(policies: &PolicySet, place: &EntityUid) -> bool {
    use cedar_policy::{ActionConstraint, Effect, PrincipalConstraint, ResourceConstraint};
    let mut unconditional_permit = false;
    for policy in policies.policies() {
        if policy.effect() == Effect::Forbid || policy.has_non_scope_constraint() {
            return false;
        }
        let action_any = match policy.action_constraint() {
            ActionConstraint::Any => true,
            ActionConstraint::Eq(action) => &action == place,
            ActionConstraint::In(_) => false,
        };
        if action_any
            && matches!(policy.principal_constraint(), PrincipalConstraint::Any)
            && matches!(policy.resource_constraint(), ResourceConstraint::Any)
        {
            unconditional_permit = true;
        }
    }
    unconditional_permit
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The policy the scale-out and end-to-end tests run with too: acme
    /// only on hosts dedicated to it (and nothing else there); globex and
    /// initech never on one host together; microvm runs only in zone a.
    const POLICY: &str = r#"
        permit(principal, action == Moat::Action::"place", resource);

        @id("dedicated-to-others")
        @reason("the host is dedicated to another org")
        forbid(principal, action == Moat::Action::"place", resource)
        when { resource.labels has dedicated && resource.labels.dedicated != principal.name };

        @id("acme-dedicated")
        @reason("acme runs only on hosts dedicated to it")
        forbid(principal == Moat::Org::"acme", action == Moat::Action::"place", resource)
        unless { resource.labels has dedicated && resource.labels.dedicated == "acme" };

        @id("globex-initech-apart")
        @reason("globex and initech never share a host")
        forbid(principal, action == Moat::Action::"place", resource)
        when { ["globex", "initech"].contains(principal.name)
               && (context.tenants.contains("globex") || context.tenants.contains("initech")) };

        @id("microvm-zone-a")
        @reason("microvm runs go to zone a")
        forbid(principal, action == Moat::Action::"place", resource)
        when { context.classes.contains("microvm")
               && !(resource.labels has zone && resource.labels.zone == "a") };
    "#;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_table_of_placements() {
        let engine = PlacementEngine::new(POLICY).unwrap();
        let dedicated_acme = labels(&[("dedicated", "acme"), ("zone", "a")]);
        let zone_a = labels(&[("zone", "a")]);
        let zone_b = labels(&[("zone", "b")]);
        let ns = [WorkloadClass::Namespace];
        let vm = [WorkloadClass::Microvm];
        let none: [String; 0] = [];
        let globex = ["globex".to_owned()];
        let acme = ["acme".to_owned()];
        let initech = ["initech".to_owned()];
        type Case<'a> = (
            &'a str,
            &'a BTreeMap<String, String>,
            &'a [WorkloadClass],
            &'a [String],
            Option<&'a str>,
        );
        let cases: [Case<'_>; 9] = [
            ("acme", &dedicated_acme, &ns, &none, None),
            (
                "acme",
                &zone_a,
                &ns,
                &none,
                Some("acme runs only on hosts dedicated"),
            ),
            ("globex", &zone_a, &ns, &none, None),
            ("globex", &zone_a, &ns, &acme, None),
            ("initech", &zone_a, &ns, &globex, Some("never share a host")),
            ("globex", &zone_b, &ns, &initech, Some("never share a host")),
            (
                "globex",
                &zone_b,
                &vm,
                &none,
                Some("microvm runs go to zone a"),
            ),
            ("globex", &zone_a, &vm, &none, None),
            (
                "globex",
                &dedicated_acme,
                &ns,
                &none,
                Some("dedicated to another org"),
            ),
        ];
        for (i, (org, labels, classes, tenants, refused)) in cases.into_iter().enumerate() {
            let got = engine.place(&PlacementRequest {
                org,
                run: "run-1",
                environment: "test",
                runner: "runner-1",
                host: "host-1",
                labels,
                classes,
                tenants,
            });
            match (refused, &got) {
                (None, Placement::Placed) => {}
                (Some(want), Placement::Refused { reason, .. }) => assert!(
                    reason.starts_with("placement_waiting: ") && reason.contains(want),
                    "case {i}: {reason}"
                ),
                _ => panic!("case {i}: {org} on {labels:?} with {tenants:?}: {got:?}"),
            }
        }
    }

    #[test]
    fn a_rule_that_cannot_be_evaluated_refuses() {
        // `resource.labels.dedicated` without `has`: an error on hosts
        // without the label, which must refuse, not skip the forbid.
        let policy = r#"
            permit(principal, action == Moat::Action::"place", resource);
            @id("dedicated")
            @reason("the host is dedicated to another org")
            forbid(principal, action == Moat::Action::"place", resource)
            when { resource.labels.dedicated != principal.name };
        "#;
        let engine = PlacementEngine::new(policy).unwrap();
        let dedicated = labels(&[("dedicated", "acme")]);
        let place = |org: &str, labels: &BTreeMap<String, String>| {
            engine.place(&PlacementRequest {
                org,
                run: "r",
                environment: "test",
                runner: "w",
                host: "h",
                labels,
                classes: &[WorkloadClass::Namespace],
                tenants: &[],
            })
        };
        assert_eq!(place("acme", &dedicated), Placement::Placed);
        assert_eq!(
            place("globex", &dedicated),
            Placement::Refused {
                reason: "placement_waiting: the host is dedicated to another org".into(),
                policies: vec!["dedicated".into()],
            }
        );
        match place("globex", &BTreeMap::new()) {
            Placement::Refused { reason, .. } => {
                assert!(reason.contains("failed to evaluate"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn nothing_permitted_refuses_and_the_default_places_everything() {
        let engine = PlacementEngine::new(
            r#"permit(principal == Moat::Org::"acme", action == Moat::Action::"place", resource);"#,
        )
        .unwrap();
        let request = PlacementRequest {
            org: "globex",
            run: "r",
            environment: "test",
            runner: "w",
            host: "",
            labels: &BTreeMap::new(),
            classes: &[],
            tenants: &[],
        };
        match engine.place(&request) {
            Placement::Refused { reason, policies } => {
                assert!(reason.contains("no placement policy lets org globex run on host unnamed"));
                assert!(policies.is_empty());
            }
            other => panic!("{other:?}"),
        }
        let default = PlacementEngine::new(DEFAULT_PLACEMENT).unwrap();
        assert_eq!(default.place(&request), Placement::Placed);
    }

    /// A label is a string under its name, whatever the name. Alone, one
    /// named `__expr` made the labels' record one of Cedar's JSON escapes
    /// when the request was written as JSON (an expression to parse: the
    /// run was refused); as values it is a label like any other.
    #[test]
    fn a_label_is_a_string_whatever_its_name() {
        let engine = PlacementEngine::new(
            r#"permit(principal, action == Moat::Action::"place", resource)
               when { resource.labels["__expr"] == "x" };"#,
        )
        .unwrap();
        let placed = labels(&[("__expr", "x")]);
        let mut request = PlacementRequest {
            org: "acme",
            run: "r",
            environment: "test",
            runner: "w",
            host: "h",
            labels: &placed,
            classes: &[],
            tenants: &[],
        };
        assert_eq!(engine.place(&request), Placement::Placed);
        let other = labels(&[("__expr", "y")]);
        request.labels = &other;
        match engine.place(&request) {
            Placement::Refused { reason, policies } => {
                assert!(
                    reason.contains("no placement policy lets org acme"),
                    "{reason}"
                );
                assert!(policies.is_empty());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn only_an_unconditional_permit_without_forbids_places_anywhere() {
        let anywhere = |text: &str| PlacementEngine::new(text).unwrap().places_anywhere();
        assert!(anywhere(DEFAULT_PLACEMENT));
        assert!(anywhere("permit(principal, action, resource);"));
        assert!(anywhere(
            r#"permit(principal, action == Moat::Action::"place", resource);
               permit(principal == Moat::Org::"acme", action, resource);"#
        ));
        // A permit's condition can fail to evaluate for some runs (a
        // label read without `has`), and then `place` refuses them.
        let failing = r#"permit(principal, action == Moat::Action::"place", resource);
            permit(principal, action, resource)
            when { context.classes.contains("microvm") && resource.labels.gpu == "a100" };"#;
        assert!(!anywhere(failing));
        let engine = PlacementEngine::new(failing).unwrap();
        let refused = engine.place(&PlacementRequest {
            org: "acme",
            run: "r1",
            environment: "prod",
            runner: "w1",
            host: "h1",
            labels: &labels(&[]),
            classes: &[WorkloadClass::Microvm],
            tenants: &[],
        });
        assert!(matches!(refused, Placement::Refused { .. }), "{refused:?}");
        for narrower in [
            POLICY,
            "",
            r#"permit(principal, action == Moat::Action::"other", resource);"#,
            r#"permit(principal, action in [Moat::Action::"place"], resource);"#,
            r#"permit(principal == Moat::Org::"acme", action, resource);"#,
            r#"permit(principal, action, resource == Moat::Host::"h1");"#,
            r#"permit(principal, action, resource is Moat::Host);"#,
            r#"permit(principal, action, resource) when { context.runner != "w" };"#,
            r#"permit(principal, action, resource) unless { principal.name == "x" };"#,
            r#"permit(principal, action, resource);
               forbid(principal, action, resource) when { false };"#,
        ] {
            assert!(!anywhere(narrower), "{narrower}");
        }
    }

    #[test]
    fn operation_annotations_are_refused_in_placement() {
        for policy in [
            r#"@approval("required") permit(principal, action, resource);"#,
            r#"@workload_class("microvm") permit(principal, action, resource);"#,
        ] {
            assert!(matches!(
                PlacementEngine::new(policy),
                Err(PlacementError::Policy { .. })
            ));
        }
        assert!(matches!(
            PlacementEngine::new("permit(principal"),
            Err(PlacementError::Parse(_))
        ));
    }
}
