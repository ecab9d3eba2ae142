//! Tools of the credential proxy: an org defines a tool (method, URL
//! template, typed parameters, where its credential goes, how its response
//! is redacted); a runner's `http_request {profile:
//! "control-plane-tool-proxy", tool, params}` makes the control plane call
//! it with the credential, redact the answer and scrub every known secret
//! from it. The runner never holds the credential.

use std::collections::BTreeMap;

use base64::Engine as _;
use moat_core::url::encode_component as encode;
use moat_egress::outbound::Uri;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use moat_core::scrub::map_strings;
pub use moat_core::scrub::{MIN_SECRET, Scrubber, replace_text};

/// The profile name a tool call carries.
pub const PROFILE: &str = moat_api::runner::TOOL_PROFILE;

/// `http_request` arguments of a tool call.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCallArgs {
    pub profile: String,
    pub tool: String,
    #[serde(default)]
    pub params: serde_json::Map<String, Value>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ToolError {
    #[error("tool definition: {0}")]
    Definition(String),
    #[error("parameters: {0}")]
    Params(String),
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolDef {
    pub name: String,
    /// GET, POST, PUT, PATCH or DELETE.
    pub method: String,
    /// `https://api.example.com/v1/accounts/{id}`: `{param}` placeholders in
    /// the path and query only (never in the scheme or host).
    pub url: String,
    #[serde(default)]
    pub params: BTreeMap<String, ParamDef>,
    /// Where the org's secret goes; none for an open API.
    #[serde(default)]
    pub credential: Option<Credential>,
    #[serde(default)]
    pub redact: Redact,
    /// Every call waits for a person, whatever the policy says.
    #[serde(default)]
    pub approval: bool,
    /// The largest response body kept (default 1 MiB, at most 16 MiB).
    #[serde(default)]
    pub max_response_bytes: Option<u64>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ParamType {
    String,
    Integer,
    Boolean,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ParamDef {
    #[serde(rename = "type")]
    pub kind: ParamType,
    #[serde(default)]
    pub required: bool,
    /// Where a parameter not in the URL template goes: `query` (default for
    /// GET/DELETE) or `body` (a JSON body, default otherwise).
    #[serde(default)]
    pub placement: Option<Placement>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    Query,
    Body,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Credential {
    /// The org's secret (its name).
    pub secret: String,
    /// `header`, `query` or `basic`.
    #[serde(rename = "in")]
    pub place: CredentialPlace,
    /// The header or query parameter name (`Authorization`, `api_key`); for
    /// `basic`, the user name.
    #[serde(default)]
    pub name: Option<String>,
    /// Put before the secret in a header (`Bearer `).
    #[serde(default)]
    pub prefix: Option<String>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CredentialPlace {
    Header,
    Query,
    Basic,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Redact {
    /// JSON pointers (`/account/ssn`) removed from a JSON response.
    #[serde(default)]
    pub drop: Vec<String>,
    /// Regular expressions whose matches become `[MASKED]`.
    #[serde(default)]
    pub mask: Vec<String>,
}

/// A plain name: 1 to 64 of `[A-Za-z0-9_.-]`.
pub fn plain_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// `url` parsed, if it is an absolute http(s) URL with a host and no user
/// information.
fn parse_url(url: &str) -> Option<Uri> {
    let uri: Uri = url.parse().ok()?;
    let authority = uri.authority()?;
    let fine = matches!(uri.scheme_str(), Some("http" | "https"))
        && !authority.host().is_empty()
        && !authority.as_str().contains('@');
    fine.then_some(uri)
}

/// `scheme://authority` of a URL.
pub fn origin(uri: &Uri) -> String {
    let authority = uri.authority().map_or("", |a| a.as_str());
    format!("{}://{authority}", uri.scheme_str().unwrap_or(""))
}

/// The URL template with every `{param}` stood in for, parsed.
fn template_uri(template: &str) -> Option<Uri> {
    let mut filled = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let close = rest[open..].find('}')? + open;
        filled.push_str(&rest[..open]);
        filled.push('x');
        rest = &rest[close + 1..];
    }
    filled.push_str(rest);
    parse_url(&filled)
}

/// `GET /v1/tools`: the org's tools.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct ToolList {
    pub tools: Vec<ToolDef>,
}

impl ToolDef {
    pub fn parse(value: &Value) -> Result<ToolDef, ToolError> {
        let def: ToolDef = serde_json::from_value(value.clone())
            .map_err(|e| ToolError::Definition(e.to_string()))?;
        def.check()?;
        Ok(def)
    }

    fn check(&self) -> Result<(), ToolError> {
        let bad = |m: String| Err(ToolError::Definition(m));
        if !plain_name(&self.name) {
            return bad(format!("name {:?}: 1 to 64 of [A-Za-z0-9_.-]", self.name));
        }
        if !["GET", "POST", "PUT", "PATCH", "DELETE"].contains(&self.method.as_str()) {
            return bad(format!(
                "method {:?}: GET, POST, PUT, PATCH or DELETE",
                self.method
            ));
        }
        let fixed = "url: the scheme and host are fixed (no {param} or user info there)";
        let Some(template) = template_uri(&self.url) else {
            return bad(format!(
                "url {:?}: http:// or https:// with a host (and no user info)",
                self.url
            ));
        };
        // A placeholder in the host would have been stood in for: the
        // template then no longer starts with the origin that was parsed.
        let origin = origin(&template);
        let after = self.url.get(origin.len()..).unwrap_or("");
        if !self.url.starts_with(&origin) || !(after.is_empty() || after.starts_with(['/', '?'])) {
            return bad(fixed.into());
        }
        for name in self.params.keys() {
            if !plain_name(name) {
                return bad(format!("parameter name {name:?}"));
            }
        }
        if let Some(c) = &self.credential {
            if !plain_name(&c.secret) {
                return bad(format!("credential.secret {:?}", c.secret));
            }
            if c.place != CredentialPlace::Basic && c.name.as_deref().is_none_or(str::is_empty) {
                return bad("credential.name: the header or query parameter to put it in".into());
            }
        }
        for pattern in &self.redact.mask {
            regex::Regex::new(pattern)
                .map_err(|e| ToolError::Definition(format!("redact.mask {pattern:?}: {e}")))?;
        }
        for pointer in &self.redact.drop {
            if !pointer.starts_with('/') {
                return bad(format!(
                    "redact.drop {pointer:?}: a JSON pointer, /like/this"
                ));
            }
        }
        if self.max_response_bytes.is_some_and(|m| m > 16 << 20) {
            return bad("maxResponseBytes: at most 16 MiB".into());
        }
        Ok(())
    }

    pub fn max_response(&self) -> u64 {
        self.max_response_bytes.unwrap_or(1 << 20)
    }

    /// SHA-256 of the canonical definition: the decision records it, and a
    /// call is refused if the tool changed since (an approval is for what
    /// the approver saw).
    pub fn hash(&self) -> String {
        moat_core::hash::canonical_hash(self).unwrap_or_default()
    }
}

/// A call ready to send: its URL parsed once, here, and used as it is by
/// the gate, the request and the record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub method: String,
    pub uri: Uri,
    pub headers: Vec<(String, String)>,
    pub body: Option<String>,
}

fn param_text(name: &str, def: &ParamDef, value: &Value) -> Result<String, ToolError> {
    let wrong = || ToolError::Params(format!("{name}: expected {:?}", def.kind));
    match (def.kind, value) {
        (ParamType::String, Value::String(s)) => Ok(s.clone()),
        (ParamType::Integer, Value::Number(n)) if n.is_i64() || n.is_u64() => Ok(n.to_string()),
        (ParamType::Boolean, Value::Bool(b)) => Ok(b.to_string()),
        _ => Err(wrong()),
    }
}

impl ToolDef {
    /// The request for `params`, with the credential `secret` in place.
    pub fn call(
        &self,
        params: &serde_json::Map<String, Value>,
        secret: Option<&str>,
    ) -> Result<Call, ToolError> {
        for name in params.keys() {
            if !self.params.contains_key(name) {
                return Err(ToolError::Params(format!(
                    "{name}: not a parameter of {}",
                    self.name
                )));
            }
        }
        let mut url = self.url.clone();
        let mut query = Vec::new();
        let mut body = serde_json::Map::new();
        for (name, def) in &self.params {
            let Some(value) = params.get(name) else {
                if def.required {
                    return Err(ToolError::Params(format!("{name}: required")));
                }
                continue;
            };
            let text = param_text(name, def, value)?;
            let placeholder = format!("{{{name}}}");
            if url.contains(&placeholder) {
                url = url.replace(&placeholder, &encode(&text));
                continue;
            }
            let default = if matches!(self.method.as_str(), "GET" | "DELETE") {
                Placement::Query
            } else {
                Placement::Body
            };
            match def.placement.unwrap_or(default) {
                Placement::Query => query.push(format!("{}={}", encode(name), encode(&text))),
                Placement::Body => {
                    body.insert(name.clone(), value.clone());
                }
            }
        }
        if url.contains('{') {
            return Err(ToolError::Params(format!(
                "the URL still has a placeholder: {}",
                self.url
            )));
        }
        let mut headers = Vec::new();
        if let Some(c) = &self.credential {
            let secret = secret.ok_or_else(|| {
                ToolError::Params(format!("secret {:?} is not set for this org", c.secret))
            })?;
            let name = c.name.clone().unwrap_or_default();
            match c.place {
                CredentialPlace::Header => headers.push((
                    name,
                    format!("{}{secret}", c.prefix.as_deref().unwrap_or("")),
                )),
                CredentialPlace::Query => {
                    query.push(format!("{}={}", encode(&name), encode(secret)));
                }
                CredentialPlace::Basic => {
                    let pair = format!("{name}:{secret}");
                    headers.push((
                        "Authorization".into(),
                        format!(
                            "Basic {}",
                            base64::engine::general_purpose::STANDARD.encode(pair)
                        ),
                    ));
                }
            }
        }
        if !query.is_empty() {
            url.push(if url.contains('?') { '&' } else { '?' });
            url.push_str(&query.join("&"));
        }
        let body = (!body.is_empty()).then(|| Value::Object(body).to_string());
        if body.is_some() {
            headers.push(("Content-Type".into(), "application/json".into()));
        }
        let uri = parse_url(&url)
            .filter(|uri| template_uri(&self.url).is_some_and(|t| origin(&t) == origin(uri)))
            .ok_or_else(|| {
                ToolError::Params(format!(
                    "the parameters make {url:?} no URL of the tool's host"
                ))
            })?;
        Ok(Call {
            method: self.method.clone(),
            uri,
            headers,
            body,
        })
    }

    /// The response as the runner gets it: JSON fields dropped, patterns
    /// masked (before secrets are scrubbed, which the caller does last).
    pub fn redact(&self, body: &str) -> Value {
        let mut value = match serde_json::from_str::<Value>(body) {
            Ok(mut json) => {
                for pointer in &self.redact.drop {
                    remove_pointer(&mut json, pointer);
                }
                json
            }
            Err(_) => Value::String(body.to_owned()),
        };
        if !self.redact.mask.is_empty() {
            let masks: Vec<regex::Regex> = self
                .redact
                .mask
                .iter()
                .filter_map(|p| regex::Regex::new(p).ok())
                .collect();
            map_strings(&mut value, &|s| {
                masks.iter().fold(s.to_owned(), |acc, re| {
                    re.replace_all(&acc, "[MASKED]").into_owned()
                })
            });
        }
        value
    }
}

fn remove_pointer(value: &mut Value, pointer: &str) {
    let Some((parent, last)) = pointer.rsplit_once('/') else {
        return;
    };
    let last = last.replace("~1", "/").replace("~0", "~");
    let target = if parent.is_empty() {
        Some(value)
    } else {
        value.pointer_mut(parent)
    };
    match target {
        Some(Value::Object(map)) => {
            map.remove(&last);
        }
        Some(Value::Array(items)) => {
            if let Ok(i) = last.parse::<usize>()
                && i < items.len()
            {
                items.remove(i);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn crm() -> ToolDef {
        ToolDef::parse(&json!({
            "name": "crm", "method": "GET", "url": "http://127.0.0.1:9/accounts/{id}",
            "params": {"id": {"type": "string", "required": true}, "full": {"type": "boolean"}},
            "credential": {"secret": "crm_key", "in": "header", "name": "Authorization", "prefix": "Bearer "},
            "redact": {"drop": ["/internal"], "mask": ["\\d{3}-\\d{2}-\\d{4}"]},
        }))
        .unwrap()
    }

    #[test]
    fn a_call_puts_params_and_credential_where_the_tool_says() {
        let params = json!({"id": "a/b c", "full": true});
        let call = crm()
            .call(params.as_object().unwrap(), Some("sek-ret-123"))
            .unwrap();
        assert_eq!(
            call.uri.to_string(),
            "http://127.0.0.1:9/accounts/a%2Fb%20c?full=true"
        );
        assert_eq!(
            call.headers,
            vec![("Authorization".into(), "Bearer sek-ret-123".into())]
        );
        assert!(
            crm()
                .call(json!({}).as_object().unwrap(), Some("x"))
                .is_err(),
            "id is required"
        );
        assert!(
            crm()
                .call(json!({"id": 5}).as_object().unwrap(), Some("x"))
                .is_err(),
            "typed"
        );
        assert!(
            crm()
                .call(
                    json!({"id": "1", "host": "x"}).as_object().unwrap(),
                    Some("x")
                )
                .is_err()
        );
        assert!(
            crm()
                .call(json!({"id": "1"}).as_object().unwrap(), None)
                .is_err(),
            "no secret"
        );
    }

    #[test]
    fn the_host_cannot_be_templated() {
        for url in [
            "http://{host}/x",
            "https://a@evil/x",
            "ftp://x/y",
            "http:///x",
            "http://x{port}/y",
            "https://api.example.com:{port}/y",
            "http://u:p@host/x",
        ] {
            let def = json!({"name": "t", "method": "GET", "url": url});
            assert!(ToolDef::parse(&def).is_err(), "{url}");
        }
        for url in [
            "https://api.example.com",
            "https://api.example.com/v1/{id}?q={q}",
            "http://[::1]:8080/{id}",
        ] {
            let def = json!({"name": "t", "method": "GET", "url": url});
            assert!(ToolDef::parse(&def).is_ok(), "{url}");
        }
    }

    #[test]
    fn responses_are_redacted_then_scrubbed() {
        let body = r#"{"id": "1", "ssn": "123-45-6789", "internal": {"k": 1}, "echo": "Bearer sek-ret-123"}"#;
        let mut value = crm().redact(body);
        Scrubber::new(vec![("crm_key".into(), String::from("sek-ret-123").into())])
            .json(&mut value);
        assert_eq!(
            value,
            json!({"id": "1", "ssn": "[MASKED]", "echo": "Bearer [REDACTED:crm_key]"})
        );
        let scrubber = Scrubber::new(vec![("k".into(), String::from("sek-ret-123").into())]);
        assert_eq!(
            scrubber.bytes(b"a sek-ret-123 b").unwrap(),
            b"a [REDACTED:k] b".to_vec()
        );
        assert!(scrubber.bytes(b"clean").is_none());
    }
}
