//! The network an operation gets: the egress policy of an `exec_argv`
//! sandbox, and the plan of an `http_request`, both from the manifest.

use base64::Engine;
use moat_core::op::{DirectRequestArgs, ProfileRequestArgs, StoredRequest};
use moat_core::{DenialReason, Manifest, NetworkMode, NetworkPolicy, NetworkProfile};
use moat_egress::{EgressLimits, EgressPolicy, FetchRequest};

use crate::store::ArtifactStore;
use crate::workspace::Refusal;

/// The largest stored request a `requestRef` may name.
const MAX_STORED_REQUEST: u64 = 16 << 20;

/// `host:port` of a profile's base URL, as an egress rule.
fn profile_rule(profile: &NetworkProfile) -> Result<String, Refusal> {
    let bad = || {
        Refusal::new(
            DenialReason::InvalidArgs,
            format!(
                "profile {}: baseUrl {:?} is not an http(s) URL",
                profile.name, profile.base_url
            ),
        )
    };
    let (scheme, rest) = profile.base_url.split_once("://").ok_or_else(bad)?;
    let default_port = match scheme {
        "https" => 443,
        "http" => 80,
        _ => return Err(bad()),
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.is_empty() || authority.contains('@') {
        return Err(bad());
    }
    Ok(match authority.rsplit_once(':') {
        Some((_, port)) if port.parse::<u16>().is_ok() => authority.to_owned(),
        _ => format!("{authority}:{default_port}"),
    })
}

/// What a sandbox in `network` mode may reach: `allowlist` the allowed
/// domains, `proxy-only` only the profiles' hosts.
pub fn exec_policy(manifest: &Manifest, network: NetworkMode) -> Result<EgressPolicy, Refusal> {
    let np = &manifest.network_policy;
    let allow = match network {
        NetworkMode::ProxyOnly => np
            .profiles
            .iter()
            .map(profile_rule)
            .collect::<Result<_, _>>()?,
        _ => np.allow_domains.clone(),
    };
    Ok(EgressPolicy {
        allow,
        deny: np.deny_domains.clone(),
        allow_addresses: np.allow_addresses.clone(),
    })
}

pub fn egress_limits(np: &NetworkPolicy) -> EgressLimits {
    let default = EgressLimits::default();
    EgressLimits {
        max_requests: np.max_requests.unwrap_or(default.max_requests),
        max_bytes: np.max_bytes.unwrap_or(default.max_bytes),
        max_connections: np.max_connections.unwrap_or(default.max_connections),
    }
}

/// A checked `http_request`.
pub struct HttpPlan {
    pub policy: EgressPolicy,
    pub request: FetchRequest,
}

fn body_base64(
    body: &Option<String>,
    body_base64: &Option<String>,
) -> Result<Option<String>, Refusal> {
    match (body, body_base64) {
        (Some(_), Some(_)) => Err(Refusal::new(
            DenialReason::InvalidArgs,
            "give body or bodyBase64, not both",
        )),
        (Some(text), None) => Ok(Some(
            base64::engine::general_purpose::STANDARD.encode(text.as_bytes()),
        )),
        (None, b64) => Ok(b64.clone()),
    }
}

fn response_cap(manifest: &Manifest, asked: Option<u64>) -> Result<u64, Refusal> {
    let ceiling = manifest.limits.max_output_bytes;
    match asked {
        Some(n) if n > ceiling => Err(Refusal::new(
            DenialReason::LimitExceeded,
            format!("maxResponseBytes {n} is above the manifest's {ceiling}"),
        )),
        Some(n) => Ok(n),
        None => Ok(ceiling),
    }
}

fn needs_network(manifest: &Manifest) -> Result<(), Refusal> {
    if manifest.network_policy.mode == NetworkMode::Off {
        return Err(Refusal::new(
            DenialReason::NetworkNotAllowed,
            "the manifest's networkPolicy.mode is off",
        ));
    }
    Ok(())
}

/// A direct request: allowed only to the manifest's allowed domains, and
/// only when the manifest grants `allowlist` (or `full`).
pub fn plan_direct(manifest: &Manifest, args: &DirectRequestArgs) -> Result<HttpPlan, Refusal> {
    needs_network(manifest)?;
    if manifest.network_policy.mode == NetworkMode::ProxyOnly {
        return Err(Refusal::new(
            DenialReason::NetworkNotAllowed,
            "the manifest grants proxy-only: call a profile ({profile, requestRef})",
        ));
    }
    Ok(HttpPlan {
        policy: exec_policy(manifest, NetworkMode::Allowlist)?,
        request: FetchRequest {
            method: args.method.clone(),
            url: args.url.clone(),
            headers: args.headers.clone(),
            body_base64: body_base64(&args.body, &args.body_base64)?,
            max_response_bytes: response_cap(manifest, args.max_response_bytes)?,
        },
    })
}

/// A request to a named profile, read from the artifact `requestRef`.
pub fn plan_profile(
    manifest: &Manifest,
    args: &ProfileRequestArgs,
    store: &ArtifactStore,
) -> Result<HttpPlan, Refusal> {
    needs_network(manifest)?;
    let profile = manifest
        .network_policy
        .profiles
        .iter()
        .find(|p| p.name == args.profile)
        .ok_or_else(|| {
            Refusal::new(
                DenialReason::DomainNotAllowed,
                format!("profile {:?} is not in the manifest", args.profile),
            )
        })?;
    let hex = args.request_ref.trim_start_matches("sha256:");
    if hex.len() != 64
        || !hex
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    {
        return Err(Refusal::new(
            DenialReason::InvalidArgs,
            "requestRef must be a lower-case hex SHA-256",
        ));
    }
    let path = store.path_of(hex);
    let size = std::fs::metadata(&path)
        .map(|m| m.len())
        .map_err(|_| Refusal::new(DenialReason::NotFound, format!("no artifact {hex}")))?;
    if size > MAX_STORED_REQUEST {
        return Err(Refusal::new(
            DenialReason::TooLarge,
            "the stored request is above 16 MiB",
        ));
    }
    let bytes = std::fs::read(&path)
        .map_err(|_| Refusal::new(DenialReason::NotFound, format!("no artifact {hex}")))?;
    let stored: StoredRequest = serde_json::from_slice(&bytes).map_err(|e| {
        Refusal::new(
            DenialReason::InvalidArgs,
            format!("artifact {hex} is not a stored request: {e}"),
        )
    })?;
    if !stored.path.starts_with('/') {
        return Err(Refusal::new(
            DenialReason::InvalidArgs,
            "a stored request's path starts with /",
        ));
    }
    let base = profile.base_url.trim_end_matches('/');
    Ok(HttpPlan {
        policy: EgressPolicy {
            allow: vec![profile_rule(profile)?],
            deny: manifest.network_policy.deny_domains.clone(),
            allow_addresses: manifest.network_policy.allow_addresses.clone(),
        },
        request: FetchRequest {
            method: stored.method.clone(),
            url: format!("{base}{}", stored.path),
            headers: stored.headers.clone(),
            body_base64: body_base64(&stored.body, &stored.body_base64)?,
            max_response_bytes: response_cap(manifest, stored.max_response_bytes)?,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_hosts_become_exact_rules_with_their_port() {
        let p = |url: &str| {
            profile_rule(&NetworkProfile {
                name: "p".into(),
                base_url: url.into(),
            })
        };
        assert_eq!(
            p("https://tools.example.com/v1").ok().as_deref(),
            Some("tools.example.com:443")
        );
        assert_eq!(
            p("http://tools.example.com:8080").ok().as_deref(),
            Some("tools.example.com:8080")
        );
        assert!(p("ftp://tools.example.com").is_err());
        assert!(p("https://user@tools.example.com").is_err());
        assert!(p("tools.example.com").is_err());
    }
}
