//! What the policy sees of an operation: the envelope's kind, the resource
//! it acts on, the bytes it may move and its network mode.

use moat_core::op::{
    ArtifactListArgs, ArtifactReadArgs, ArtifactWriteArgs, DirectRequestArgs, ExecArgvArgs,
    ProfileRequestArgs,
};
use moat_core::{Envelope, NetworkMode, OpKind};
use serde::de::DeserializeOwned;

use crate::policy::Resource;

/// An envelope as the policy engine asks about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Described {
    pub op: OpKind,
    pub resource: Resource,
    pub size: u64,
    pub network: NetworkMode,
    /// The workspace path an artifact operation names ("" for others).
    pub path: String,
    /// The HTTP method of a direct request ("" for others, and for tool
    /// calls, whose method is known only to the tool).
    pub method: String,
    /// A browser step's action (`navigate`, `click`, `submit`...; "" for others).
    pub action: String,
    /// The host a `navigate` goes to ("" for others: an acting step's is
    /// the page's, known once the runner's browser has found the element).
    pub domain: String,
}

/// Why an envelope cannot be described (and so is refused before policy).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DescribeError {
    #[error("unknown operation {0:?}")]
    UnknownOp(String),
    #[error("arguments of {op}: {message}")]
    InvalidArgs { op: &'static str, message: String },
}

fn args<T: DeserializeOwned>(op: OpKind, value: &serde_json::Value) -> Result<T, DescribeError> {
    moat_core::strict::from_value(value).map_err(|e| DescribeError::InvalidArgs {
        op: op.as_str(),
        message: e.to_string(),
    })
}

/// The host of an `http://` or `https://` URL, lower-cased, without port or user info.
pub fn host_of(url: &str) -> Option<String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let host_port = authority.rsplit('@').next()?;
    let host = if let Some(v6) = host_port.strip_prefix('[') {
        v6.split(']').next()?
    } else {
        host_port.split(':').next()?
    };
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

/// A workspace path as the shell resolves it: `.` components and repeated
/// slashes dropped; `None` for an absolute path or one with `..` (which the
/// shell refuses anyway). `"."` for the workspace itself.
pub fn canonical_path(path: &str) -> Option<String> {
    if path.starts_with('/') || path.contains('\0') {
        return None;
    }
    let mut parts = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => return None,
            other => parts.push(other),
        }
    }
    Some(if parts.is_empty() {
        ".".to_owned()
    } else {
        parts.join("/")
    })
}

/// Rewrites an artifact operation's `path` argument to its canonical form,
/// so the policy decides on, and the capability binds, the path the shell
/// will use (`./export/x` must not slip past a rule on `export/*`). A path
/// with no canonical form is left as given: the shell refuses it, with its
/// own reason and event.
pub fn canonicalize_args(op: &str, args: &mut serde_json::Value) {
    if !matches!(
        OpKind::parse(op),
        Some(OpKind::ArtifactRead | OpKind::ArtifactWrite | OpKind::ArtifactList)
    ) {
        return;
    }
    if let Some(canonical) = args
        .get("path")
        .and_then(|p| p.as_str())
        .and_then(canonical_path)
    {
        args["path"] = canonical.into();
    }
}

/// The path a policy decides on: the canonical form the shell will use,
/// whatever form the arguments gave (a path without one is refused by the
/// shell, with its own reason, and is decided as given).
fn policy_path(given: String) -> String {
    canonical_path(&given).unwrap_or(given)
}

pub fn describe(envelope: &Envelope) -> Result<Described, DescribeError> {
    let op =
        OpKind::parse(&envelope.op).ok_or_else(|| DescribeError::UnknownOp(envelope.op.clone()))?;
    let run = || Resource::Run(envelope.run_id.clone());
    let (mut path, mut method, mut action) = (String::new(), String::new(), String::new());
    let mut domain = String::new();
    let (resource, size, network) = match op {
        OpKind::ArtifactRead => {
            let a: ArtifactReadArgs = args(op, &envelope.args)?;
            path = policy_path(a.path);
            (Resource::Path(path.clone()), a.max_bytes, NetworkMode::Off)
        }
        OpKind::ArtifactWrite => {
            let a: ArtifactWriteArgs = args(op, &envelope.args)?;
            path = policy_path(a.path);
            (Resource::Path(path.clone()), a.max_bytes, NetworkMode::Off)
        }
        OpKind::ArtifactList => {
            let a: ArtifactListArgs = args(op, &envelope.args)?;
            path = policy_path(a.path);
            (Resource::Path(path.clone()), 0, NetworkMode::Off)
        }
        OpKind::ExecArgv => {
            let a: ExecArgvArgs = args(op, &envelope.args)?;
            let program = a
                .argv
                .first()
                .cloned()
                .ok_or_else(|| DescribeError::InvalidArgs {
                    op: op.as_str(),
                    message: "argv is empty".into(),
                })?;
            let network = a.network.or(envelope.network).unwrap_or(NetworkMode::Off);
            let size = a
                .max_output_bytes
                .or(envelope.max_output_bytes)
                .unwrap_or(0);
            (Resource::Executable(program), size, network)
        }
        OpKind::HttpRequest => {
            if envelope.args["profile"] == crate::tools::PROFILE {
                // A tool call through the control plane's credential proxy:
                // its method is the tool's (the caller fills it in).
                let a: crate::tools::ToolCallArgs = args(op, &envelope.args)?;
                if !crate::tools::plain_name(&a.tool) {
                    return Err(DescribeError::InvalidArgs {
                        op: op.as_str(),
                        message: format!("tool {:?}: 1 to 64 of [A-Za-z0-9_.-]", a.tool),
                    });
                }
                (Resource::Tool(a.tool), 0, NetworkMode::Off)
            } else if envelope.args.get("profile").is_some() {
                let a: ProfileRequestArgs = args(op, &envelope.args)?;
                (Resource::Tool(a.profile), 0, NetworkMode::Allowlist)
            } else {
                let a: DirectRequestArgs = args(op, &envelope.args)?;
                method = a.method.to_ascii_uppercase();
                let host = host_of(&a.url).ok_or_else(|| DescribeError::InvalidArgs {
                    op: op.as_str(),
                    message: format!("{:?} is not an http(s) URL with a host", a.url),
                })?;
                (
                    Resource::Domain(host),
                    a.max_response_bytes.unwrap_or(0),
                    NetworkMode::Allowlist,
                )
            }
        }
        OpKind::BrowserStep => {
            action = envelope.args["action"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            // A secret filled into a page is what the step is about: a
            // policy can name it (`resource == Moat::Secret::"crm-password"`).
            if action == "navigate" {
                domain = envelope.args["url"]
                    .as_str()
                    .and_then(host_of)
                    .unwrap_or_default();
            }
            match envelope.args["secret"].as_str() {
                Some(name) if action == "fill_secret" => {
                    (Resource::Secret(name.to_owned()), 0, NetworkMode::Off)
                }
                _ => (run(), 0, NetworkMode::Off),
            }
        }
    };
    Ok(Described {
        op,
        resource,
        size,
        network,
        path,
        method,
        action,
        domain,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(op: &str, args: serde_json::Value) -> Envelope {
        serde_json::from_value(serde_json::json!({
            "id": "o", "runId": "r", "correlationId": "c", "op": op, "args": args,
            "createdAt": "2026-01-01T00:00:00Z"
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn resources_by_kind() {
        let d = describe(&envelope(
            "artifact_read",
            serde_json::json!({"path": "input/a", "maxBytes": 10}),
        ))
        .ok();
        assert_eq!(
            d.map(|d| (d.resource, d.size)),
            Some((Resource::Path("input/a".into()), 10))
        );
        let d = describe(&envelope(
            "exec_argv",
            serde_json::json!({"argv": ["/usr/bin/python3"], "network": "allowlist"}),
        ))
        .ok();
        assert_eq!(
            d.map(|d| (d.resource, d.network)),
            Some((
                Resource::Executable("/usr/bin/python3".into()),
                NetworkMode::Allowlist
            ))
        );
        let d = describe(&envelope(
            "http_request",
            serde_json::json!({"method": "GET", "url": "https://user@API.example.com:8443/x?y"}),
        ))
        .ok();
        assert_eq!(
            d.map(|d| d.resource),
            Some(Resource::Domain("api.example.com".into()))
        );
        assert!(describe(&envelope("exec_argv", serde_json::json!({"argv": []}))).is_err());
        for (given, canonical) in [
            ("./export//x.csv", Some("export/x.csv")),
            ("sensitive/", Some("sensitive")),
            ("", Some(".")),
            ("a/../b", None),
            ("/etc/passwd", None),
        ] {
            assert_eq!(canonical_path(given).as_deref(), canonical, "{given}");
        }
        assert!(describe(&envelope("rm_rf", serde_json::json!({}))).is_err());
    }
}
