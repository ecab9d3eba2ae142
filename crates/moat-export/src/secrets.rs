//! The secret scan: the org's stored secrets, in the forms they travel in,
//! and the shapes of common credentials. A finding names the secret or the
//! shape, never the value.

use base64::Engine as _;
use memchr::memmem::Finder;
use regex::bytes::Regex;

use crate::ExportError;

/// Shorter values would match everywhere (the control plane refuses to
/// store them).
pub const MIN_SECRET: usize = 8;

/// Credential shapes, each literal-prefixed so that a pass over a file runs
/// at memory speed.
const SHAPES: &[(&str, &str)] = &[
    ("AWS access key id", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    ("GitHub token", r"\bgh[pousr]_[A-Za-z0-9]{36,}"),
    ("GitHub token", r"\bgithub_pat_[A-Za-z0-9_]{22,}"),
    ("Slack token", r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
    ("private key", r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----"),
    ("Google API key", r"\bAIza[0-9A-Za-z_\-]{35}"),
    ("Stripe secret key", r"\b[rs]k_live_[0-9A-Za-z]{20,}"),
    ("Anthropic API key", r"\bsk-ant-[A-Za-z0-9_\-]{20,}"),
    ("OpenAI API key", r"\bsk-proj-[A-Za-z0-9_\-]{20,}"),
    (
        "JSON Web Token",
        r"\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}",
    ),
];

/// What the scan found in one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// One of the org's secrets, by name, and the form it was in.
    Secret { name: String, form: &'static str },
    /// Something shaped like a credential.
    Token { shape: &'static str },
}

/// The compiled scan.
pub struct Scanner {
    /// Each form of each secret, with the secret's name and the form.
    needles: Vec<(Finder<'static>, String, &'static str)>,
    each: Vec<(&'static str, Regex)>,
}

impl Scanner {
    /// From the org's secrets as `(name, value)`; values shorter than
    /// [`MIN_SECRET`] are skipped.
    pub fn new(secrets: &[(String, Vec<u8>)]) -> Result<Scanner, ExportError> {
        let mut needles: Vec<(Finder<'static>, String, &'static str)> = Vec::new();
        for (name, value) in secrets {
            if value.len() < MIN_SECRET {
                continue;
            }
            for (form, needle) in forms(value) {
                if needle.len() >= MIN_SECRET && !needles.iter().any(|(f, ..)| f.needle() == needle)
                {
                    needles.push((Finder::new(&needle).into_owned(), name.clone(), form));
                }
            }
        }
        // ASCII word boundaries: credentials are ASCII, and bytes may be anything.
        let compile = |re: &str| {
            Regex::new(&format!("(?-u){re}")).map_err(|e| ExportError::Scanner(e.to_string()))
        };
        let each = SHAPES
            .iter()
            .map(|(name, re)| Ok((*name, compile(re)?)))
            .collect::<Result<_, ExportError>>()?;
        Ok(Scanner { needles, each })
    }

    /// Everything found in `bytes` (a few at most, each once).
    pub fn scan(&self, bytes: &[u8]) -> Vec<Finding> {
        let mut found = Vec::new();
        // One SIMD pass per needle: a multi-pattern automaton over needles
        // that share a prefix (`sk-…`, `sk%2D…`) fell back to a scan ten
        // times slower here.
        // Base64 is often wrapped (76 columns): its forms are also looked
        // for with line breaks taken out.
        let unwrapped: Option<Vec<u8>> = (self.needles.iter().any(|(_, _, f)| *f == "base64")
            && wrapped_base64(bytes))
        .then(|| {
            bytes
                .iter()
                .copied()
                .filter(|b| *b != b'\n' && *b != b'\r')
                .collect()
        });
        for (finder, name, form) in &self.needles {
            let wrapped =
                *form == "base64" && unwrapped.as_ref().is_some_and(|u| finder.find(u).is_some());
            if wrapped || finder.find(bytes).is_some() {
                let finding = Finding::Secret {
                    name: name.clone(),
                    form,
                };
                if !found.contains(&finding) {
                    found.push(finding);
                }
            }
        }
        // One pass per shape: each runs at memory speed on its literal
        // prefix, where one alternation of all of them does not.
        for (shape, re) in &self.each {
            if re.is_match(bytes) {
                found.push(Finding::Token { shape });
            }
        }
        found
    }
}

/// The forms a secret travels in (those the control plane's scrubber knows):
/// as is, percent-encoded, and base64 (standard and URL-safe) at each of
/// the three alignments it can have inside a longer encoding.
fn forms(value: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_encode};
    // RFC 3986's unreserved characters left alone (Python's `quote`), and
    // JavaScript's `encodeURIComponent`'s.
    const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    const COMPONENT: &AsciiSet = &UNRESERVED
        .remove(b'!')
        .remove(b'*')
        .remove(b'\'')
        .remove(b'(')
        .remove(b')');
    let mut out = vec![("as is", value.to_vec())];
    for set in [NON_ALPHANUMERIC, UNRESERVED, COMPONENT] {
        let encoded: String = percent_encode(value, set).collect();
        if encoded.as_bytes() != value {
            // `%2d` as well as `%2D`.
            let lower = lower_hex_escapes(&encoded);
            out.push(("percent-encoded", encoded.into_bytes()));
            out.push(("percent-encoded", lower.into_bytes()));
        }
    }
    // Inside a JSON string: escaped quotes and backslashes, and `\/`.
    if let Ok(text) = std::str::from_utf8(value) {
        let json = serde_json::to_string(text).unwrap_or_default();
        let inner = json
            .get(1..json.len().saturating_sub(1))
            .unwrap_or_default();
        if inner.as_bytes() != value {
            out.push(("JSON-escaped", inner.as_bytes().to_vec()));
        }
        if inner.contains('/') {
            out.push(("JSON-escaped", inner.replace('/', "\\/").into_bytes()));
        }
    }
    for engine in [
        &base64::engine::general_purpose::STANDARD_NO_PAD,
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
    ] {
        for shift in 0..3usize {
            let mut shifted = vec![0u8; shift];
            shifted.extend_from_slice(value);
            let text = engine.encode(&shifted);
            // Characters that also carry the bytes before or after the
            // secret differ with them: only the stable middle is looked for.
            let skip = [0, 2, 3][shift];
            let end = if shifted.len() % 3 == 0 {
                text.len()
            } else {
                text.len().saturating_sub(1)
            };
            if let Some(middle) = text.get(skip..end) {
                out.push(("base64", middle.as_bytes().to_vec()));
            }
        }
    }
    out
}

/// Whether some line of `bytes` ends in a long run of base64 characters,
/// as wrapped base64 does (64 or 76 columns): only then is a copy without
/// line breaks worth making.
fn wrapped_base64(bytes: &[u8]) -> bool {
    const RUN: usize = 48;
    let b64 = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'-' | b'_');
    memchr::memchr_iter(b'\n', bytes).any(|end| {
        let line = bytes[..end].strip_suffix(b"\r").unwrap_or(&bytes[..end]);
        line.len() >= RUN && line[line.len() - RUN..].iter().rev().all(|&b| b64(b))
    })
}

/// `%2D` as `%2d`: the hex digits of each escape in lower case, the rest
/// as it was.
fn lower_hex_escapes(encoded: &str) -> String {
    let mut out = String::with_capacity(encoded.len());
    let mut escape = 0;
    for c in encoded.chars() {
        if c == '%' {
            escape = 2;
            out.push(c);
        } else if escape > 0 {
            escape -= 1;
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scanner() -> Scanner {
        match Scanner::new(&[("db-password".into(), b"hunter2-is-not-a-password".to_vec())]) {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        }
    }

    fn names(found: &[Finding]) -> Vec<String> {
        found
            .iter()
            .map(|f| match f {
                Finding::Secret { name, form } => format!("{name}/{form}"),
                Finding::Token { shape } => (*shape).to_owned(),
            })
            .collect()
    }

    #[test]
    fn a_secret_is_found_in_every_form() {
        let s = scanner();
        let secret = b"hunter2-is-not-a-password";
        assert_eq!(
            names(&s.scan(b"a,hunter2-is-not-a-password,b")),
            ["db-password/as is"]
        );
        for prefix in ["", "x", "xy", "xyz"] {
            let mut data = prefix.as_bytes().to_vec();
            data.extend_from_slice(secret);
            data.extend_from_slice(b"tail");
            for engine in [
                &base64::engine::general_purpose::STANDARD,
                &base64::engine::general_purpose::URL_SAFE,
            ] {
                let text = engine.encode(&data);
                assert!(
                    names(&s.scan(text.as_bytes())).contains(&"db-password/base64".to_owned()),
                    "prefix {prefix:?}: {text}"
                );
            }
        }
        assert!(s.scan(b"hunter2-is-not-a-passwor").is_empty());
        // Wrapped base64, a JSON string, URL components.
        let long = base64::engine::general_purpose::STANDARD.encode(
            [
                b"0123456789abcdef0123456789abcdef0123456789abcdef0123456789".as_slice(),
                secret,
            ]
            .concat(),
        );
        let wrapped: String = long
            .as_bytes()
            .chunks(76)
            .map(|c| String::from_utf8_lossy(c) + "\n")
            .collect();
        assert!(names(&s.scan(wrapped.as_bytes())).contains(&"db-password/base64".to_owned()));
        let odd = match Scanner::new(&[("k".into(), b"p4ss/w0rd!x\"y".to_vec())]) {
            Ok(s) => s,
            Err(e) => panic!("{e}"),
        };
        for text in [
            r#"{"v":"p4ss\/w0rd!x\"y"}"#,
            "v=p4ss%2fw0rd!x%22y",
            "v=p4ss%2Fw0rd%21x%22y",
        ] {
            assert!(!odd.scan(text.as_bytes()).is_empty(), "{text}");
        }
    }

    #[test]
    fn only_wrapped_base64_is_unwrapped() {
        let line = "QUJD".repeat(19);
        assert!(wrapped_base64(format!("{line}\n{line}\n").as_bytes()));
        assert!(wrapped_base64(format!("{line}\r\n").as_bytes()));
        assert!(!wrapped_base64(
            b"id,name,email\n1,Customer number 1,customer1@example.com\n"
        ));
        assert!(
            !wrapped_base64(line.as_bytes()),
            "one line, nothing wrapped"
        );
    }

    #[test]
    fn token_shapes_are_found() {
        let s = scanner();
        let found = s.scan(
            b"key=AKIAABCDEFGHIJKLMNOP\n-----BEGIN OPENSSH PRIVATE KEY-----\nghp_abcdefghijklmnopqrstuvwxyz0123456789\n",
        );
        assert_eq!(
            names(&found),
            ["AWS access key id", "GitHub token", "private key"]
        );
        assert!(s.scan(b"id,name\n1,AKIA\n").is_empty());
    }
}
