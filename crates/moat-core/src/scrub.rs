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
            // As a browser's form sends it (in a URL or a body).
            let form = Secret::new(form_encoded(&value));
            if *form != *encoded && *form != *value {
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

    /// [`Scrubber::text`], and also the start of a secret that ends
    /// `text` (before a `…`): what is left of one when a page-made string
    /// was cut short before it could be scrubbed (at least 4 bytes of it).
    pub fn text_and_tail(&self, text: &str) -> String {
        let mut out = self.text(text);
        let cut = out.ends_with('…');
        let body_len = out.len() - if cut { '…'.len_utf8() } else { 0 };
        for (name, value) in &self.secrets {
            let tail = (4..value.len())
                .rev()
                .filter(|n| value.is_char_boundary(*n))
                .find(|n| out[..body_len].ends_with(&value[..*n]));
            if let Some(n) = tail {
                let start = body_len - n;
                let rest = out[body_len..].to_owned();
                out.truncate(start);
                out.push_str(&format!("[REDACTED:{name}]"));
                out.push_str(&rest);
                break;
            }
        }
        out
    }

    /// [`Scrubber::text_and_tail`] over every string of `value`.
    pub fn json_and_tails(&self, value: &mut Value) {
        if !self.is_empty() {
            map_strings(value, &|s| self.text_and_tail(s));
        }
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

/// `text` as a browser's form sends it (`application/x-www-form-urlencoded`):
/// ASCII letters, digits and `*-._` as they are, a space as `+`, every
/// other byte as `%XX`.
pub fn form_encoded(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'*' | b'-' | b'.' | b'_' => {
                out.push(char::from(b));
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The shortest secret value accepted.
pub const MIN_SECRET: usize = 8;

#[cfg(test)]
mod tests {
    use super::*;

    fn one(value: &str) -> Scrubber {
        Scrubber::new(vec![("pw".into(), Secret::new(value.to_owned()))])
    }

    #[test]
    fn a_secret_is_found_as_a_browser_form_sends_it() {
        let s = one("p@ss~w0rd *x");
        assert_eq!(form_encoded("p@ss~w0rd *x"), "p%40ss%7Ew0rd+*x");
        assert_eq!(s.text("?pw=p%40ss%7Ew0rd+*x&a=1"), "?pw=[REDACTED:pw]&a=1");
    }

    #[test]
    fn the_start_of_a_secret_left_by_a_cut_is_scrubbed_too() {
        let s = one("correct horse battery");
        assert_eq!(
            s.text_and_tail("url?q=correct hor…"),
            "url?q=[REDACTED:pw]…"
        );
        assert_eq!(s.text_and_tail("url?q=correct hor"), "url?q=[REDACTED:pw]");
        // Fewer than 4 bytes of it: left (it would match anything).
        assert_eq!(s.text_and_tail("the cor"), "the cor");
        assert_eq!(s.text_and_tail("plain"), "plain");
    }
}
