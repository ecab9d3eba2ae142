//! Capabilities: the control plane's signed permission for exactly one
//! operation, checked by the runner offline.
//!
//! A capability binds a run, an operation id, the operation kind, the
//! SHA-256 of the operation's canonical arguments and the policy hash, and
//! lives at most [`MAX_LIFETIME`]. Its wire form (the envelope's
//! `capability` field) is `BASE64URL(JCS(claims)) "." BASE64URL(signature)`,
//! the signature being Ed25519 by the control-plane key over the first part.

use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64URL;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::hash::{canonical_hash, canonical_json};
use crate::mode::WorkloadClass;
use crate::op::{Envelope, OpKind};
use crate::sign::{PrivateKey, PublicKey};

/// The longest a capability may live (from issue to expiry).
pub const MAX_LIFETIME: Duration = Duration::from_secs(60);
/// Clock difference tolerated between control plane and runner.
pub const CLOCK_SKEW: Duration = Duration::from_secs(5);

/// What a capability grants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CapabilityClaims {
    pub run_id: String,
    pub op_id: String,
    pub op: OpKind,
    /// [`args_hash`] of the envelope: its arguments and the envelope-level
    /// fields that shape how it runs.
    pub args_hash: String,
    /// The policy that made the decision (the manifest's `policyHash`).
    pub policy_hash: String,
    /// RFC 3339.
    pub issued_at: String,
    /// RFC 3339; at most [`MAX_LIFETIME`] after `issuedAt`.
    pub expires_at: String,
    /// Random; a capability is used at most once.
    pub nonce: String,
    /// The workload class a program of this operation must run in (left
    /// out: `namespace`, as before classes existed).
    #[serde(default, skip_serializing_if = "WorkloadClass::is_namespace")]
    pub class: WorkloadClass,
    /// For an acting browser step: the [fingerprint] of the element it
    /// was decided on ([`ANY_ELEMENT`] by hand). Left out, the step acts on
    /// nothing: the runner's browser answers `element_unchecked` with what
    /// it found, for the control plane to decide on.
    ///
    /// [fingerprint]: crate::element::ElementFacts::fingerprint
    /// [`ANY_ELEMENT`]: crate::element::ANY_ELEMENT
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub element: Option<String>,
}

/// Why a capability was refused (each maps to `capability_invalid`, with
/// this as the message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapabilityError {
    #[error("the capability is not CLAIMS.SIGNATURE in base64url")]
    Malformed,
    #[error("the capability's signature does not verify with the control-plane key")]
    BadSignature,
    #[error("the capability's claims are not valid: {0}")]
    Claims(String),
    #[error("the capability expired at {0}")]
    Expired(String),
    #[error("the capability is not valid before {0}")]
    NotYetValid(String),
    #[error("the capability lives longer than the {} s allowed", MAX_LIFETIME.as_secs())]
    TooLong,
    #[error("the capability is for another {0}")]
    Mismatch(&'static str),
    #[error("the capability was already used")]
    Replayed,
    /// Its earlier uses could not be looked up: refused, never assumed new.
    #[error("whether the capability was used before cannot be checked: {0}")]
    Unavailable(String),
}

fn parse_time(text: &str) -> Result<SystemTime, CapabilityError> {
    humantime::parse_rfc3339(text).map_err(|e| CapabilityError::Claims(format!("{text:?}: {e}")))
}

/// What a capability's `argsHash` is compared with: `sha256(JCS({args,
/// network, cwd, timeoutMs, maxOutputBytes}))`, hex — the arguments and
/// every envelope-level field that changes what the operation does, so
/// nothing between the control plane and the shell can alter them (absent
/// fields are `null`).
pub fn args_hash(envelope: &Envelope) -> String {
    canonical_hash(&serde_json::json!({
        "args": envelope.args,
        "network": envelope.network,
        "cwd": envelope.cwd,
        "timeoutMs": envelope.timeout_ms,
        "maxOutputBytes": envelope.max_output_bytes,
    }))
    .unwrap_or_default()
}

impl CapabilityClaims {
    /// Signs the claims into the wire form.
    pub fn sign(&self, key: &PrivateKey) -> String {
        let claims = canonical_json(self).unwrap_or_default();
        let payload = B64URL.encode(claims);
        let signature = base64::engine::general_purpose::STANDARD
            .decode(key.sign(payload.as_bytes()))
            .unwrap_or_default();
        format!("{payload}.{}", B64URL.encode(signature))
    }

    /// Reads and verifies the wire form: signature, lifetime and clock.
    /// Binding to an operation is [`CapabilityClaims::check_binding`].
    pub fn verify(token: &str, key: &PublicKey, now: SystemTime) -> Result<Self, CapabilityError> {
        let (payload, signature) = token.split_once('.').ok_or(CapabilityError::Malformed)?;
        let signature = B64URL
            .decode(signature)
            .map_err(|_| CapabilityError::Malformed)?;
        let signature = base64::engine::general_purpose::STANDARD.encode(signature);
        key.verify(payload.as_bytes(), &signature)
            .map_err(|_| CapabilityError::BadSignature)?;
        let claims = B64URL
            .decode(payload)
            .map_err(|_| CapabilityError::Malformed)?;
        let claims: CapabilityClaims =
            serde_json::from_slice(&claims).map_err(|e| CapabilityError::Claims(e.to_string()))?;
        let issued = parse_time(&claims.issued_at)?;
        let expires = parse_time(&claims.expires_at)?;
        match expires.duration_since(issued) {
            Ok(life) if life <= MAX_LIFETIME => {}
            _ => return Err(CapabilityError::TooLong),
        }
        if now > expires + CLOCK_SKEW {
            return Err(CapabilityError::Expired(claims.expires_at));
        }
        if now + CLOCK_SKEW < issued {
            return Err(CapabilityError::NotYetValid(claims.issued_at));
        }
        Ok(claims)
    }

    /// Whether the claims are for this very operation under this policy.
    pub fn check_binding(
        &self,
        run_id: &str,
        op_id: &str,
        op: OpKind,
        envelope: &Envelope,
        policy_hash: &str,
    ) -> Result<(), CapabilityError> {
        let checks = [
            (self.run_id == run_id, "run"),
            (self.op_id == op_id, "operation id"),
            (self.op == op, "operation"),
            (self.args_hash == args_hash(envelope), "set of arguments"),
            (self.policy_hash == policy_hash, "policy"),
        ];
        match checks.iter().find(|(ok, _)| !ok) {
            Some((_, what)) => Err(CapabilityError::Mismatch(what)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn envelope(args: serde_json::Value) -> Envelope {
        serde_json::from_value(json!({
            "id": "1", "runId": "r1", "correlationId": "c", "op": "artifact_read",
            "args": args, "createdAt": "2026-11-29T12:00:00Z",
        }))
        .unwrap()
    }

    fn claims(issued: SystemTime, life: Duration) -> CapabilityClaims {
        let at = crate::time::stamp;
        CapabilityClaims {
            run_id: "r1".into(),
            op_id: "1".into(),
            op: OpKind::ArtifactRead,
            args_hash: args_hash(&envelope(json!({"path": "a", "maxBytes": 10}))),
            policy_hash: "p".repeat(64),
            issued_at: at(issued),
            expires_at: at(issued + life),
            nonce: "n1".into(),
            class: WorkloadClass::Namespace,
            element: None,
        }
    }

    #[test]
    fn a_capability_verifies_only_unaltered_in_time_and_for_its_operation() {
        let key = PrivateKey::from_seed([3; 32]);
        let now = SystemTime::now();
        let c = claims(now, Duration::from_secs(30));
        let token = c.sign(&key);
        let got = CapabilityClaims::verify(&token, &key.public(), now).unwrap();
        assert_eq!(got, c);
        let args = envelope(json!({"maxBytes": 10, "path": "a"})); // same canonical form
        let p = "p".repeat(64);
        assert_eq!(
            got.check_binding("r1", "1", OpKind::ArtifactRead, &args, &p),
            Ok(())
        );
        assert_eq!(
            got.check_binding(
                "r1",
                "1",
                OpKind::ArtifactRead,
                &envelope(json!({"path": "b", "maxBytes": 10})),
                &p
            ),
            Err(CapabilityError::Mismatch("set of arguments"))
        );
        // Envelope-level fields that change what runs are bound too.
        for edit in [
            json!({"network": "full"}),
            json!({"cwd": "output"}),
            json!({"timeoutMs": 999_999}),
            json!({"maxOutputBytes": 1}),
        ] {
            let mut changed = serde_json::to_value(&args).unwrap();
            changed
                .as_object_mut()
                .unwrap()
                .extend(edit.as_object().unwrap().clone());
            let changed: Envelope = serde_json::from_value(changed).unwrap();
            assert_eq!(
                got.check_binding("r1", "1", OpKind::ArtifactRead, &changed, &p),
                Err(CapabilityError::Mismatch("set of arguments")),
                "{edit}"
            );
        }
        assert_eq!(
            got.check_binding("r2", "1", OpKind::ArtifactRead, &args, &p),
            Err(CapabilityError::Mismatch("run"))
        );
        assert_eq!(
            got.check_binding("r1", "1", OpKind::ArtifactWrite, &args, &p),
            Err(CapabilityError::Mismatch("operation"))
        );
        // Expired, not yet valid, too long, another key, edited.
        let later = now + Duration::from_secs(40);
        assert!(matches!(
            CapabilityClaims::verify(&token, &key.public(), later),
            Err(CapabilityError::Expired(_))
        ));
        let earlier = now - Duration::from_secs(10);
        assert!(matches!(
            CapabilityClaims::verify(&token, &key.public(), earlier),
            Err(CapabilityError::NotYetValid(_))
        ));
        let long = claims(now, Duration::from_secs(61)).sign(&key);
        assert_eq!(
            CapabilityClaims::verify(&long, &key.public(), now),
            Err(CapabilityError::TooLong)
        );
        let other = PrivateKey::from_seed([4; 32]);
        assert_eq!(
            CapabilityClaims::verify(&token, &other.public(), now),
            Err(CapabilityError::BadSignature)
        );
        let (payload, signature) = token.split_once('.').unwrap();
        let mut edited = c.clone();
        edited.op = OpKind::ExecArgv;
        let forged = format!(
            "{}.{signature}",
            B64URL.encode(canonical_json(&edited).unwrap())
        );
        assert_ne!(payload, forged.split_once('.').unwrap().0);
        assert_eq!(
            CapabilityClaims::verify(&forged, &key.public(), now),
            Err(CapabilityError::BadSignature)
        );
        assert_eq!(
            CapabilityClaims::verify("nonsense", &key.public(), now),
            Err(CapabilityError::Malformed)
        );
    }
}
