//! Scrubbing secrets from everything that leaves the control plane or a
//! shell, or is kept: answers, events, results, artifacts, error messages.

use base64::Engine as _;
use serde_json::Value;

/// A secret's value, wiped from memory when dropped.
pub type Secret = zeroize::Zeroizing<String>;

/// Replaces `from` with `to` in every string of `value` (an artifact's hash
/// after its content was scrubbed).
pub fn replace_text(value: &mut Value, from: &str, to: &str) {
    map_strings(value, &|s| s.replace(from, to));
}

/// Applies `f` to every string (and object key) in `value`.
pub fn map_strings(value: &mut Value, f: &dyn Fn(&str) -> String) {
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
#[derive(Default, Clone)]
pub struct Scrubber {
    secrets: Vec<(String, Secret)>,
}

impl Scrubber {
    /// From `(name, value)` pairs. Each value is also looked for as it
    /// travels: percent-encoded (in a URL) and base64 (in a header). Values
    /// shorter than [`MIN_SECRET`] would match everywhere and are refused
    /// when stored.
    pub fn new(secrets: Vec<(String, Secret)>) -> Scrubber {
        let mut all = Vec::new();
        for (name, value) in secrets {
            // Every form is a secret too, wiped when dropped.
            let encoded = Secret::new(crate::url::encode_component(&value));
            let b64 =
                Secret::new(base64::engine::general_purpose::STANDARD.encode(value.as_bytes()));
            all.push((
                name.clone(),
                Secret::new(b64.trim_end_matches('=').to_owned()),
            ));
            // A form posts a space as `+`.
            let form = Secret::new(encoded.replace("%20", "+"));
            if *form != *encoded {
                all.push((name.clone(), form));
            }
            if *encoded != *value {
                all.push((name.clone(), encoded));
            }
            all.push((name, value));
        }
        Self::exact(all)
    }

    /// Adds a secret by its value, in every form [`Scrubber::new`] looks
    /// for (a value already known is not added twice).
    pub fn also_secret(&mut self, name: &str, value: &str) {
        if self.secrets.iter().any(|(_, v)| v.as_str() == value) {
            return;
        }
        let mut all = std::mem::take(&mut self.secrets);
        all.extend(Scrubber::new(vec![(name.to_owned(), Secret::new(value.to_owned()))]).secrets);
        *self = Self::exact(all);
    }

    /// Adds a form of a secret the tool itself made (a basic-auth pair).
    pub fn also(&mut self, name: &str, value: Secret) {
        let mut all = std::mem::take(&mut self.secrets);
        all.push((name.to_owned(), value));
        *self = Self::exact(all);
    }

    fn exact(mut secrets: Vec<(String, Secret)>) -> Scrubber {
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
