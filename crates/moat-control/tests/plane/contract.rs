//! The OpenAPI document holds the API to its word: every JSON answer the
//! tests get through [`super::call`] is validated against the schema the
//! document gives for its route and status (or its `default`, a refusal),
//! and every request the server accepted against its request schema.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};

use serde_json::{Value, json};

static DOCUMENT: LazyLock<Value> = LazyLock::new(moat_control::server::openapi_document);

/// Compiled validators, by JSON pointer into the document.
static VALIDATORS: LazyLock<Mutex<HashMap<String, jsonschema::Validator>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The documented `(method, template)` a concrete path is served by.
fn route_of(method: &str, path: &str) -> Option<(String, String)> {
    let method = method.to_ascii_lowercase();
    let segments: Vec<&str> = path.split('/').collect();
    DOCUMENT["paths"]
        .as_object()?
        .iter()
        .find_map(|(template, ops)| {
            let parts: Vec<&str> = template.split('/').collect();
            let fits = parts.len() == segments.len()
                && parts
                    .iter()
                    .zip(&segments)
                    .all(|(t, s)| t == s || (t.starts_with('{') && !s.is_empty()));
            (fits && ops.get(&method).is_some()).then(|| (method.clone(), template.clone()))
        })
}

/// Validates `instance` against the schema at `pointer` in the document.
fn check(pointer: &str, instance: &Value, what: &str) {
    let mut validators = VALIDATORS.lock().unwrap_or_else(|e| e.into_inner());
    let validator = validators.entry(pointer.to_owned()).or_insert_with(|| {
        let schema = DOCUMENT
            .pointer(pointer)
            .unwrap_or_else(|| panic!("no schema at {pointer}"));
        // References point into `components`: carry them along.
        let rooted = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "allOf": [schema],
            "components": DOCUMENT["components"],
        });
        jsonschema::validator_for(&rooted)
            .unwrap_or_else(|e| panic!("the schema at {pointer} does not compile: {e}"))
    });
    let errors: Vec<String> = validator
        .iter_errors(instance)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "{what} does not match the OpenAPI document ({pointer}): {errors:#?}\n{instance:#}"
    );
}

fn escape(template: &str) -> String {
    template.replace('~', "~0").replace('/', "~1")
}

/// Checks one exchange: the request (when the server took it) and the
/// answer, against the document.
pub fn exchange(method: &str, url: &str, request: &[u8], status: u16, answer: &Value) {
    let Some(rest) = url.split_once("://").map(|(_, rest)| rest) else {
        return;
    };
    let path = rest
        .find('/')
        .map_or("/", |i| &rest[i..])
        .split('?')
        .next()
        .unwrap_or("/");
    // The Inspector is HTML, not API.
    if path.starts_with("/inspector") {
        return;
    }
    let Some((method, template)) = route_of(method, path) else {
        // Not a route: the router's own 404/405.
        return;
    };
    let operation = format!("/paths/{}/{method}", escape(&template));
    let what = format!("{} {path} → {status}", method.to_ascii_uppercase());
    if (200..300).contains(&status)
        && let Ok(sent) = serde_json::from_slice::<Value>(request)
        && DOCUMENT
            .pointer(&format!("{operation}/requestBody"))
            .is_some()
    {
        check(
            &format!("{operation}/requestBody/content/application~1json/schema"),
            &sent,
            &format!("the request of {what}"),
        );
    }
    let responses = &DOCUMENT.pointer(&format!("{operation}/responses")).unwrap();
    let key = if responses.get(status.to_string()).is_some() {
        status.to_string()
    } else {
        assert!(
            !(200..300).contains(&status),
            "{what}: a success the document does not list"
        );
        "default".to_owned()
    };
    let pointer = format!("{operation}/responses/{key}/content/application~1json/schema");
    if DOCUMENT.pointer(&pointer).is_some() {
        check(&pointer, answer, &format!("the answer of {what}"));
    }
}
