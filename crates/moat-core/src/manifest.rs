//! The runner manifest: what a runner may do, hashed canonically and signed
//! by the control plane's key.

use std::time::{Duration, SystemTime};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::hash::{CanonicalError, canonical_hash};
use crate::limits::Limits;
use crate::mode::{ExecutableOrigin, NetworkMode, SandboxMode, WorkloadClass};
use crate::op::OpKind;
use crate::sign::{PrivateKey, PublicKey, SignError};

/// An executable the manifest allows, by its path inside the sandbox,
/// optionally pinned by the SHA-256 of its content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AllowedExecutable {
    /// Absolute path inside the sandbox, e.g. `/usr/bin/python3`.
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Where the code it runs comes from (`trusted` when left out): the
    /// policy sees it as `context.origin` and may ask for a stronger
    /// workload class for `generated` or `third-party` code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<ExecutableOrigin>,
}

/// The most network an operation may ask for, and where it may go.
///
/// `allowlist` reaches `allowDomains` (less `denyDomains`); `proxy-only`
/// reaches only the hosts of `profiles` (the control plane's tool proxy,
/// once there is one). Both go through the egress proxy, which refuses
/// non-public addresses unless `allowAddresses` lists them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkPolicy {
    pub mode: NetworkMode,
    /// `api.example.com`, `*.example.com` (subdomains), optionally `:port`
    /// (without one: 80 and 443).
    #[serde(default)]
    pub allow_domains: Vec<String>,
    /// Same syntax; wins over `allowDomains`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny_domains: Vec<String>,
    /// Non-public ranges the proxy may still dial (`10.0.0.0/8`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_addresses: Vec<String>,
    /// Named services for `http_request {profile, requestRef}` and `proxy-only`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub profiles: Vec<NetworkProfile>,
    /// Per-run egress budget (defaults: 10 000 requests, 1 GiB, 256 open).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_requests: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u64>,
    /// Ports an operation may expose in the `ingress-only` mode (its
    /// `exec_argv` `expose`): a program may listen on them, reached only
    /// by the runtime. Empty: no operation exposes anything. Each
    /// 1024-65535, at most 16.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expose: Vec<u16>,
}

/// A service an operation may call by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkProfile {
    /// e.g. `control-plane-tool-proxy`.
    pub name: String,
    /// `https://host[:port][/prefix]`: requests go to this URL plus their path.
    pub base_url: String,
}

/// Which parts of the workspace may be read and written (relative paths).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FilesystemPolicy {
    /// Readable roots, e.g. `["input", "output"]`; `"."` is the whole workspace.
    pub read_roots: Vec<String>,
    /// Writable roots, e.g. `["output"]`.
    pub write_roots: Vec<String>,
    /// Writable roots that programs (`exec_argv`) see read-only: only
    /// `artifact_write` writes them, so what lands there went through the
    /// policy's decision on that write (an approval, say). Each must also be
    /// among `writeRoots`. Left out of the signed bytes when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifact_only: Vec<String>,
    /// Writable roots a managed run may back with a persistent volume
    /// (`volumes` when the run is created): restored from the volume's
    /// last snapshot before the run's first operation, snapshotted after
    /// each operation that changed them. Every other root is ephemeral:
    /// gone at the run's teardown. Each must be among `writeRoots`. Left
    /// out of the signed bytes when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub persistent_roots: Vec<String>,
}

impl FilesystemPolicy {
    /// Whether a volume may be attached at `rel` (a listed persistent root).
    pub fn is_persistent(&self, rel: &std::path::Path) -> bool {
        self.persistent_roots
            .iter()
            .any(|root| same_root(std::path::Path::new(root), rel))
    }

    /// Whether the root `rel` (as listed, or as a path) is artifact-only.
    pub fn is_artifact_only(&self, rel: &std::path::Path) -> bool {
        self.artifact_only
            .iter()
            .any(|root| same_root(std::path::Path::new(root), rel))
    }
}

/// `a` and `b` name the same workspace root (`./export` is `export`).
fn same_root(a: &std::path::Path, b: &std::path::Path) -> bool {
    fn parts(p: &std::path::Path) -> Vec<std::path::Component<'_>> {
        p.components()
            .filter(|c| !matches!(c, std::path::Component::CurDir))
            .collect()
    }
    parts(a) == parts(b)
}

/// Where a run's memory, process and CPU limits come from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum CgroupLimits {
    /// A cgroup of its own per sandbox, with the manifest's limits: a run
    /// that cannot have one is refused.
    #[default]
    PerRun,
    /// The runners this manifest is for are deployed where no per-run
    /// cgroup can be made (a Kubernetes pod): the deployment's own limits
    /// (the pod's `resources.limits`) bound all their runs together. Runs
    /// start without a cgroup of their own, and each report says the
    /// `cgroup` layer was `not_enforced` and why; every other layer still
    /// fails closed.
    Deployment,
}

impl CgroupLimits {
    pub fn is_per_run(&self) -> bool {
        *self == CgroupLimits::PerRun
    }
}

/// The manifest proper (what is hashed and signed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Manifest {
    pub runner_version: String,
    pub environment: String,
    pub policy_hash: String,
    pub allowed_ops: Vec<OpKind>,
    #[serde(default)]
    pub allowed_tools: Vec<String>,
    pub allowed_executables: Vec<AllowedExecutable>,
    pub sandbox_modes: Vec<SandboxMode>,
    pub network_policy: NetworkPolicy,
    pub filesystem: FilesystemPolicy,
    /// Environment variable names an operation may set.
    #[serde(default)]
    pub env_passthrough: Vec<String>,
    /// Ceilings for any single operation.
    pub limits: Limits,
    /// What may leave a run's writable roots, and as what (see
    /// [`crate::exports`]). Left out of the signed bytes when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exports: Option<crate::exports::ExportRules>,
    /// `per-run` (left out) or `deployment`: see [`CgroupLimits`]. Left out
    /// of the signed bytes when `per-run`, so older manifests keep their hash.
    #[serde(default, skip_serializing_if = "CgroupLimits::is_per_run")]
    pub cgroup_limits: CgroupLimits,
    /// The workload classes runners under this manifest may run programs
    /// in; left out (the signed bytes unchanged): `namespace` only. An
    /// operation the policy puts in a class runs in the weakest listed
    /// class at least as strong, or is denied.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workload_classes: Vec<WorkloadClass>,
    /// The `microvm` class may run under QEMU's software emulation (TCG)
    /// where hardware virtualization does not work: far slower, and the
    /// guest's isolation then rests on the emulator alone. Left out: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_emulation: bool,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub expires_at: String,
    /// Base64 Ed25519 public key of the control plane that signs capabilities.
    pub control_plane_public_key: String,
}

/// A manifest with its canonical hash and the signature over that hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SignedManifest {
    pub manifest: Manifest,
    /// `sha256(JCS(manifest))`, hex.
    pub manifest_hash: String,
    /// Base64 Ed25519 signature over the hex hash's bytes.
    pub signature: String,
    /// Base64 public key of the signer.
    pub signed_by: String,
}

/// Why a manifest was refused.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("the manifest is not signed (sign it with `moat manifest sign`)")]
    Unsigned,
    #[error("the manifest hash does not match its content (edited after signing?)")]
    HashMismatch,
    #[error("signed by {signer}, which is not the trusted key")]
    UntrustedSigner { signer: String },
    #[error("bad signature: {0}")]
    Signature(#[from] SignError),
    #[error("{field} is not an RFC 3339 time: {value}")]
    BadTime { field: &'static str, value: String },
    #[error("the manifest expired at {0}")]
    Expired(String),
    #[error("the manifest is not valid before {0}")]
    NotYetValid(String),
    #[error("the manifest is stale: created at {created}, more than {max_age_hours} h ago")]
    Stale { created: String, max_age_hours: u64 },
    #[error("the manifest is invalid: {0}")]
    Invalid(String),
    #[error(transparent)]
    Canonical(#[from] CanonicalError),
}

/// How far in the future `createdAt` may be (clock skew).
const SKEW: Duration = Duration::from_secs(300);

impl Manifest {
    /// The classes runners may use (`namespace` when none is listed).
    pub fn classes(&self) -> Vec<WorkloadClass> {
        if self.workload_classes.is_empty() {
            vec![WorkloadClass::Namespace]
        } else {
            self.workload_classes.clone()
        }
    }

    /// The weakest listed class at least as strong as `needed` (`None`:
    /// none is).
    pub fn fit(&self, needed: WorkloadClass) -> Option<WorkloadClass> {
        let mut classes = self.classes();
        classes.sort_by_key(|c| c.bit());
        classes.into_iter().find(|c| c.satisfies(needed))
    }

    /// The origin of the allowed executable at `path` (inside the sandbox).
    pub fn origin_of(&self, path: &str) -> ExecutableOrigin {
        self.allowed_executables
            .iter()
            .find(|e| e.path == path)
            .and_then(|e| e.origin)
            .unwrap_or_default()
    }

    pub fn hash(&self) -> Result<String, CanonicalError> {
        canonical_hash(self)
    }

    pub fn sign(self, key: &PrivateKey) -> Result<SignedManifest, ManifestError> {
        self.check_shape()?;
        let manifest_hash = self.hash()?;
        Ok(SignedManifest {
            signature: key.sign(manifest_hash.as_bytes()),
            signed_by: key.public().to_base64(),
            manifest_hash,
            manifest: self,
        })
    }

    fn time(field: &'static str, value: &str) -> Result<SystemTime, ManifestError> {
        crate::time::parse_rfc3339(value).map_err(|_| ManifestError::BadTime {
            field,
            value: value.to_owned(),
        })
    }

    /// Checks that the manifest is well formed (independent of time).
    pub fn check_shape(&self) -> Result<(), ManifestError> {
        let invalid = |m: &str| Err(ManifestError::Invalid(m.to_owned()));
        let created = Self::time("createdAt", &self.created_at)?;
        let expires = Self::time("expiresAt", &self.expires_at)?;
        if expires <= created {
            return invalid("expiresAt is not after createdAt");
        }
        if self.allowed_ops.is_empty() {
            return invalid("allowedOps is empty");
        }
        if self.sandbox_modes.is_empty() {
            return invalid("sandboxModes is empty");
        }
        for exe in &self.allowed_executables {
            if !exe.path.starts_with('/') || exe.path.contains("/../") || exe.path.ends_with("/..")
            {
                return invalid("allowedExecutables paths must be absolute, without `..`");
            }
            if let Some(hash) = &exe.sha256
                && (hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()))
            {
                return invalid("allowedExecutables sha256 must be 64 hex digits");
            }
        }
        for root in self
            .filesystem
            .read_roots
            .iter()
            .chain(&self.filesystem.write_roots)
        {
            if root.starts_with('/') || root.split('/').any(|c| c == "..") {
                return invalid("filesystem roots must be relative, without `..`");
            }
        }
        for root in &self.filesystem.artifact_only {
            let listed = self
                .filesystem
                .write_roots
                .iter()
                .any(|w| same_root(std::path::Path::new(w), std::path::Path::new(root)));
            if !listed {
                return Err(ManifestError::Invalid(format!(
                    "filesystem.artifactOnly root {root:?} is not among writeRoots"
                )));
            }
            // A program cannot move a mount point, but it can move any
            // directory above one: an artifact-only root deeper inside a
            // writable root could be renamed away and replaced.
            let path = std::path::Path::new(root);
            for writable in &self.filesystem.write_roots {
                let w = std::path::Path::new(writable);
                let inside =
                    !same_root(w, path) && path.starts_with(w.strip_prefix(".").unwrap_or(w));
                if inside && !path.parent().is_some_and(|parent| same_root(parent, w)) {
                    return Err(ManifestError::Invalid(format!(
                        "filesystem.artifactOnly root {root:?} is more than one level inside \
                         the writable root {writable:?}: a program could move the directory \
                         above it; make it a direct child, or that root read-only"
                    )));
                }
            }
        }
        for root in &self.filesystem.persistent_roots {
            let path = std::path::Path::new(root);
            let listed = self
                .filesystem
                .write_roots
                .iter()
                .any(|w| same_root(std::path::Path::new(w), path));
            if !listed {
                return Err(ManifestError::Invalid(format!(
                    "filesystem.persistentRoots root {root:?} is not among writeRoots"
                )));
            }
            if same_root(path, std::path::Path::new(".")) || self.filesystem.is_artifact_only(path)
            {
                return Err(ManifestError::Invalid(format!(
                    "filesystem.persistentRoots root {root:?}: not the whole workspace, nor an \
                     artifact-only root"
                )));
            }
        }
        if self.allow_emulation && self.fit(WorkloadClass::Microvm).is_none() {
            return invalid(
                "allowEmulation is about the microvm class: list it in workloadClasses",
            );
        }
        if let Some(exports) = &self.exports {
            exports
                .check()
                .map_err(|why| ManifestError::Invalid(format!("exports: {why}")))?;
        }
        PublicKey::from_base64(&self.control_plane_public_key)?;
        Ok(())
    }

    /// Checks the validity window against `now`. `max_age` refuses manifests
    /// created too long ago (stale) even if not expired.
    pub fn check_time(
        &self,
        now: SystemTime,
        max_age: Option<Duration>,
    ) -> Result<(), ManifestError> {
        let created = Self::time("createdAt", &self.created_at)?;
        let expires = Self::time("expiresAt", &self.expires_at)?;
        if now >= expires {
            return Err(ManifestError::Expired(self.expires_at.clone()));
        }
        if created > now + SKEW {
            return Err(ManifestError::NotYetValid(self.created_at.clone()));
        }
        if let Some(max_age) = max_age
            && now.duration_since(created).unwrap_or_default() > max_age
        {
            return Err(ManifestError::Stale {
                created: self.created_at.clone(),
                max_age_hours: max_age.as_secs() / 3600,
            });
        }
        Ok(())
    }
}

impl SignedManifest {
    /// Verifies hash and signature against `trusted` (the key the operator
    /// trusts — never the key the manifest names for itself), then shape.
    pub fn verify(&self, trusted: &PublicKey) -> Result<&Manifest, ManifestError> {
        if self.signature.is_empty() {
            return Err(ManifestError::Unsigned);
        }
        if self.manifest.hash()? != self.manifest_hash {
            return Err(ManifestError::HashMismatch);
        }
        if PublicKey::from_base64(&self.signed_by).ok().as_ref() != Some(trusted) {
            return Err(ManifestError::UntrustedSigner {
                signer: self.signed_by.clone(),
            });
        }
        trusted.verify(self.manifest_hash.as_bytes(), &self.signature)?;
        self.manifest.check_shape()?;
        Ok(&self.manifest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_run_cgroups_leave_the_signed_bytes_as_they_were_and_deployment_is_signed() {
        let key = PrivateKey::from_seed([3; 32]);
        let per_run = sample(&key);
        let json = serde_json::to_value(&per_run).unwrap();
        assert!(
            json.get("cgroupLimits").is_none(),
            "older manifests keep their hash"
        );
        let mut deployment = per_run.clone();
        deployment.cgroup_limits = CgroupLimits::Deployment;
        let json = serde_json::to_value(&deployment).unwrap();
        assert_eq!(json["cgroupLimits"], "deployment");
        let back: Manifest = serde_json::from_value(json).unwrap();
        assert_eq!(back.cgroup_limits, CgroupLimits::Deployment);
        let signed = deployment.sign(&key).unwrap();
        assert_ne!(
            signed.manifest_hash,
            per_run.sign(&key).unwrap().manifest_hash
        );
    }

    pub(crate) fn sample(key: &PrivateKey) -> Manifest {
        Manifest {
            runner_version: "0.1.0".into(),
            environment: "dev".into(),
            policy_hash: "0".repeat(64),
            allowed_ops: vec![OpKind::ArtifactRead],
            allowed_tools: vec![],
            allowed_executables: vec![AllowedExecutable {
                path: "/bin/echo".into(),
                sha256: None,
                origin: None,
            }],
            sandbox_modes: vec![SandboxMode::WorkspaceWrite],
            network_policy: NetworkPolicy {
                mode: NetworkMode::Off,
                allow_domains: vec![],
                ..NetworkPolicy::default()
            },
            filesystem: FilesystemPolicy {
                read_roots: vec![".".into()],
                write_roots: vec!["output".into()],
                artifact_only: Vec::new(),
                persistent_roots: Vec::new(),
            },
            env_passthrough: vec![],
            limits: Limits::default(),
            exports: None,
            cgroup_limits: CgroupLimits::PerRun,
            workload_classes: Vec::new(),
            allow_emulation: false,
            created_at: "2026-01-01T00:00:00Z".into(),
            expires_at: "2026-01-08T00:00:00Z".into(),
            control_plane_public_key: key.public().to_base64(),
        }
    }

    #[test]
    fn classes_fit_the_weakest_listed_class_that_is_strong_enough() {
        let key = PrivateKey::from_seed([1; 32]);
        let mut m = sample(&key);
        assert_eq!(m.classes(), vec![WorkloadClass::Namespace]);
        assert_eq!(m.fit(WorkloadClass::Microvm), None);
        // An emulated microvm without the class listed means nothing.
        m.allow_emulation = true;
        assert!(m.check_shape().is_err());
        m.workload_classes = vec![WorkloadClass::Microvm, WorkloadClass::Namespace];
        assert!(m.check_shape().is_ok());
        assert_eq!(
            m.fit(WorkloadClass::Namespace),
            Some(WorkloadClass::Namespace)
        );
        assert_eq!(m.fit(WorkloadClass::Microvm), Some(WorkloadClass::Microvm));
        m.workload_classes = vec![WorkloadClass::Microvm];
        assert_eq!(
            m.fit(WorkloadClass::Namespace),
            Some(WorkloadClass::Microvm)
        );
        // Left out of the signed bytes when absent: older hashes hold.
        let plain = sample(&key);
        let json = serde_json::to_value(&plain).unwrap_or_default();
        assert!(json.get("workloadClasses").is_none() && json.get("allowEmulation").is_none());
    }

    #[test]
    fn signed_manifests_verify_and_edits_are_caught() {
        let key = PrivateKey::from_seed([1; 32]);
        let signed = sample(&key).sign(&key).unwrap();
        assert!(signed.verify(&key.public()).is_ok());
        let mut edited = signed.clone();
        edited.manifest.allowed_ops.push(OpKind::ExecArgv);
        assert!(matches!(
            edited.verify(&key.public()),
            Err(ManifestError::HashMismatch)
        ));
        let other = PrivateKey::from_seed([2; 32]);
        let resigned = edited.manifest.clone().sign(&other).unwrap();
        assert!(matches!(
            resigned.verify(&key.public()),
            Err(ManifestError::UntrustedSigner { .. })
        ));
        let mut unsigned = signed;
        unsigned.signature.clear();
        assert!(matches!(
            unsigned.verify(&key.public()),
            Err(ManifestError::Unsigned)
        ));
    }

    #[test]
    fn exports_and_artifact_only_roots_are_checked_and_kept_out_of_old_hashes() {
        let key = PrivateKey::from_seed([1; 32]);
        let plain = sample(&key);
        let hash = plain.clone().sign(&key).unwrap().manifest_hash;
        // Absent, they leave the signed bytes (and so older hashes) as they were.
        let text = serde_json::to_string(&plain).unwrap();
        assert!(
            !text.contains("exports") && !text.contains("artifactOnly"),
            "{text}"
        );
        let mut m = plain.clone();
        m.filesystem.artifact_only = vec!["export".into()];
        assert!(
            matches!(m.check_shape(), Err(ManifestError::Invalid(w)) if w.contains("not among writeRoots"))
        );
        m.filesystem.write_roots.push("./export".into());
        assert!(m.check_shape().is_ok());
        let mut deep = m.clone();
        deep.filesystem.write_roots = vec!["work".into(), "work/r/export".into()];
        deep.filesystem.artifact_only = vec!["work/r/export".into()];
        assert!(
            matches!(deep.check_shape(), Err(ManifestError::Invalid(w)) if w.contains("more than one level"))
        );
        deep.filesystem.artifact_only = vec!["work/r/export".into()];
        deep.filesystem.write_roots = vec![".".into(), "work/r/export".into()];
        assert!(deep.check_shape().is_err(), "under the whole workspace too");
        deep.filesystem.write_roots = vec![".".into(), "export".into()];
        deep.filesystem.artifact_only = vec!["export".into()];
        assert!(
            deep.check_shape().is_ok(),
            "a direct child of a writable root"
        );
        m.exports =
            Some(serde_json::from_str(r#"{"rules":[{"path":"../x","types":["csv"]}]}"#).unwrap());
        assert!(
            matches!(m.check_shape(), Err(ManifestError::Invalid(w)) if w.contains("exports: rules[0]"))
        );
        m.exports = Some(
            serde_json::from_str(r#"{"rules":[{"path":"export/*.csv","types":["csv"]}]}"#).unwrap(),
        );
        assert!(m.check_shape().is_ok());
        assert_ne!(m.sign(&key).unwrap().manifest_hash, hash);
    }

    #[test]
    fn time_window_is_enforced() {
        let key = PrivateKey::from_seed([1; 32]);
        let m = sample(&key);
        let at = |t: &str| humantime::parse_rfc3339(t).unwrap();
        assert!(m.check_time(at("2026-01-02T00:00:00Z"), None).is_ok());
        assert!(matches!(
            m.check_time(at("2026-01-09T00:00:00Z"), None),
            Err(ManifestError::Expired(_))
        ));
        assert!(matches!(
            m.check_time(at("2025-12-01T00:00:00Z"), None),
            Err(ManifestError::NotYetValid(_))
        ));
        assert!(matches!(
            m.check_time(
                at("2026-01-05T00:00:00Z"),
                Some(Duration::from_secs(24 * 3600))
            ),
            Err(ManifestError::Stale { .. })
        ));
    }

    #[test]
    fn times_with_offsets_are_read_as_the_instants_they_name() {
        let key = PrivateKey::from_seed([1; 32]);
        let mut m = sample(&key);
        // 2026-01-01T00:00:00Z and 2026-01-08T00:00:00Z, written elsewhere.
        m.created_at = "2026-01-01T14:00:00+14:00".into();
        m.expires_at = "2026-01-07t14:00:00.000-10:00".into();
        let signed = m.sign(&key).unwrap();
        let m = signed.verify(&key.public()).unwrap();
        let at = |t: &str| crate::time::parse_rfc3339(t).unwrap();
        assert!(m.check_time(at("2026-01-01T00:00:00Z"), None).is_ok());
        assert!(m.check_time(at("2026-01-07T23:59:59.999Z"), None).is_ok());
        assert!(matches!(
            m.check_time(at("2026-01-08T00:00:00Z"), None),
            Err(ManifestError::Expired(_))
        ));
        assert!(matches!(
            m.check_time(at("2025-12-31T23:54:59Z"), None),
            Err(ManifestError::NotYetValid(_))
        ));
        let mut backwards = sample(&key);
        backwards.created_at = "2026-01-02T00:00:00-14:00".into();
        backwards.expires_at = "2026-01-02T10:00:00Z".into();
        assert!(matches!(
            backwards.sign(&key),
            Err(ManifestError::Invalid(_))
        ));
    }
}
