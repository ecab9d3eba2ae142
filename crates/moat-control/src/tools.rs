//! Tools of the credential proxy: an org defines a tool (method, URL
//! template, typed parameters, where its credential goes, how its response
//! is redacted); a runner's `http_request {profile:
//! "control-plane-tool-proxy", tool, params}` makes the control plane call
//! it with the credential, redact the answer and scrub every known secret
//! from it. The runner never holds the credential.

use std::collections::BTreeMap;

use base64::Engine as _;
use moat_core::url::encode_component as encode;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The profile name a tool call carries.
pub const PROFILE: &str = "control-plane-tool-proxy";

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

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
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

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ParamType {
    String,
    Integer,
    Boolean,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
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

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    Query,
    Body,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
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

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum CredentialPlace {
    Header,
    Query,
    Basic,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
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

fn split_url(url: &str) -> Option<(&str, &str)> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let origin_len = url.len() - rest.len() + end;
    Some((&url[..origin_len], &url[origin_len..]))
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
        let Some((origin, _)) = split_url(&self.url) else {
            return bad(format!(
                "url {:?}: http:// or https:// with a host",
                self.url
            ));
        };
        if origin.contains(['{', '}', '@']) || origin.ends_with("://") {
            return bad(
                "url: the scheme and host are fixed (no {param} or user info there)".into(),
            );
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

/// The host and port a URL names (`None` if it is not http(s) with a host).
pub fn host_port(url: &str) -> Option<(String, u16)> {
    let (origin, _) = split_url(url)?;
    let (scheme, authority) = origin.split_once("://")?;
    let default = if scheme == "https" { 443 } else { 80 };
    if let Some(v6) = authority.strip_prefix('[') {
        let (host, rest) = v6.split_once(']')?;
        let port = rest
            .strip_prefix(':')
            .map_or(Some(default), |p| p.parse().ok())?;
        return Some((host.to_owned(), port));
    }
    match authority.rsplit_once(':') {
        Some((host, port)) => Some((host.to_owned(), port.parse().ok()?)),
        None => Some((authority.to_owned(), default)),
    }
}

/// A call ready to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub method: String,
    pub url: String,
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
        Ok(Call {
            method: self.method.clone(),
            url,
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
            if let Ok(i) = last.parse::<usize>() {
                if i < items.len() {
                    items.remove(i);
                }
            }
        }
        _ => {}
    }
}

/// Replaces `from` with `to` in every string of `value` (an artifact's hash
/// after its content was scrubbed).
pub fn replace_text(value: &mut Value, from: &str, to: &str) {
    map_strings(value, &|s| s.replace(from, to));
}

/// Applies `f` to every string (and object key) in `value`.
fn map_strings(value: &mut Value, f: &dyn Fn(&str) -> String) {
    match value {
        Value::String(s) => *s = f(s),
        Value::Array(items) => items.iter_mut().for_each(|v| map_strings(v, f)),
        Value::Object(map) => {
            let entries: Vec<(String, Value)> = std::mem::take(map).into_iter().collect();
            for (k, mut v) in entries {
                map_strings(&mut v, f);
                map.insert(f(&k), v);
            }
        }
        _ => {}
    }
}

/// Replaces every known secret value, by exact match, with
/// `[REDACTED:<name>]`: in answers, events, results, artifacts and error
/// messages, before any of them is stored or returned.
#[derive(Default)]
pub struct Scrubber {
    secrets: Vec<(String, String)>,
}

impl Scrubber {
    /// From `(name, value)` pairs. Each value is also looked for as it
    /// travels: percent-encoded (in a URL) and base64 (in a header). Values
    /// shorter than [`MIN_SECRET`] would match everywhere and are refused
    /// when stored.
    pub fn new(secrets: Vec<(String, String)>) -> Scrubber {
        let mut all = Vec::new();
        for (name, value) in secrets {
            let encoded = moat_core::url::encode_component(&value);
            let b64 = base64::engine::general_purpose::STANDARD.encode(value.as_bytes());
            all.push((name.clone(), b64.trim_end_matches('=').to_owned()));
            if encoded != value {
                all.push((name.clone(), encoded));
            }
            all.push((name, value));
        }
        Self::exact(all)
    }

    /// Adds a form of a secret the tool itself made (a basic-auth pair).
    pub fn also(&mut self, name: &str, value: String) {
        let mut all = std::mem::take(&mut self.secrets);
        all.push((name.to_owned(), value));
        *self = Self::exact(all);
    }

    fn exact(mut secrets: Vec<(String, String)>) -> Scrubber {
        secrets.retain(|(_, v)| v.len() >= MIN_SECRET);
        // Longest first, so a secret containing another is replaced whole.
        secrets.sort_by_key(|(_, v)| std::cmp::Reverse(v.len()));
        Scrubber { secrets }
    }

    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    pub fn text(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for (name, value) in &self.secrets {
            if out.contains(value.as_str()) {
                out = out.replace(value.as_str(), &format!("[REDACTED:{name}]"));
            }
        }
        out
    }

    pub fn json(&self, value: &mut Value) {
        if !self.is_empty() {
            map_strings(value, &|s| self.text(s));
        }
    }

    pub fn bytes(&self, data: &[u8]) -> Option<Vec<u8>> {
        let found = self
            .secrets
            .iter()
            .any(|(_, v)| data.windows(v.len()).any(|w| w == v.as_bytes()));
        if !found {
            return None;
        }
        let mut out = data.to_vec();
        for (name, value) in &self.secrets {
            let needle = value.as_bytes();
            let mark = format!("[REDACTED:{name}]").into_bytes();
            let mut scrubbed = Vec::with_capacity(out.len());
            let mut i = 0;
            while i < out.len() {
                if out[i..].starts_with(needle) {
                    scrubbed.extend_from_slice(&mark);
                    i += needle.len();
                } else {
                    scrubbed.push(out[i]);
                    i += 1;
                }
            }
            out = scrubbed;
        }
        Some(out)
    }
}

/// The shortest secret value accepted.
pub const MIN_SECRET: usize = 8;

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
        assert_eq!(call.url, "http://127.0.0.1:9/accounts/a%2Fb%20c?full=true");
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
        ] {
            let def = json!({"name": "t", "method": "GET", "url": url});
            assert!(ToolDef::parse(&def).is_err(), "{url}");
        }
    }

    #[test]
    fn responses_are_redacted_then_scrubbed() {
        let body = r#"{"id": "1", "ssn": "123-45-6789", "internal": {"k": 1}, "echo": "Bearer sek-ret-123"}"#;
        let mut value = crm().redact(body);
        Scrubber::new(vec![("crm_key".into(), "sek-ret-123".into())]).json(&mut value);
        assert_eq!(
            value,
            json!({"id": "1", "ssn": "[MASKED]", "echo": "Bearer [REDACTED:crm_key]"})
        );
        let scrubber = Scrubber::new(vec![("k".into(), "sek-ret-123".into())]);
        assert_eq!(
            scrubber.bytes(b"a sek-ret-123 b").unwrap(),
            b"a [REDACTED:k] b".to_vec()
        );
        assert!(scrubber.bytes(b"clean").is_none());
    }
}
