//! A session's trace, when its `open` asks for one: the page's navigations,
//! its requests and their answers, and its console, in the order the
//! browser told them, each cut short and the whole bounded; saved as an
//! artifact when the session closes.

use std::time::Instant;

use serde_json::{Value, json};

/// The most entries a trace keeps, and their bytes (as JSON); later ones
/// are counted, not kept.
const MAX_ENTRIES: usize = 5_000;
const MAX_BYTES: usize = 4 << 20;

/// The longest URL or console text an entry keeps.
const MAX_TEXT: usize = 2_048;

/// What a trace is made of: the events it is built from, to ask the browser
/// for (`Runtime.enable` for the console).
pub const DOMAINS: &[&str] = &["Runtime.enable"];

pub struct Trace {
    started: Instant,
    entries: Vec<Value>,
    bytes: usize,
    dropped: u64,
}

impl Default for Trace {
    fn default() -> Self {
        Trace {
            started: Instant::now(),
            entries: Vec::new(),
            bytes: 0,
            dropped: 0,
        }
    }
}

fn cut(text: &str) -> String {
    moat_core::text::clip(text, MAX_TEXT)
}

fn text(value: &Value) -> String {
    cut(value.as_str().unwrap_or_default())
}

/// The entry a DevTools event makes, if it makes one.
fn entry(event: &Value) -> Option<Value> {
    let p = &event["params"];
    let (kind, what) = match event["method"].as_str()? {
        // The main frame's only: a frame has a parent.
        "Page.frameNavigated" if p["frame"]["parentId"].is_null() => {
            ("navigated", json!({"url": text(&p["frame"]["url"])}))
        }
        "Network.requestWillBeSent" => (
            "request",
            json!({
                "method": text(&p["request"]["method"]),
                "url": text(&p["request"]["url"]),
                "type": text(&p["type"]),
            }),
        ),
        "Network.responseReceived" => (
            "response",
            json!({
                "url": text(&p["response"]["url"]),
                "status": p["response"]["status"],
                "mimeType": text(&p["response"]["mimeType"]),
            }),
        ),
        "Network.loadingFailed" => (
            "failed",
            json!({
                "error": text(&p["errorText"]),
                "blocked": text(&p["blockedReason"]),
            }),
        ),
        "Runtime.consoleAPICalled" => {
            let words: Vec<String> = p["args"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|a| match &a["value"] {
                    Value::String(s) => s.clone(),
                    Value::Null => a["description"].as_str().unwrap_or_default().to_owned(),
                    other => other.to_string(),
                })
                .collect();
            (
                "console",
                json!({"level": text(&p["type"]), "text": cut(&words.join(" "))}),
            )
        }
        "Runtime.exceptionThrown" => {
            let details = &p["exceptionDetails"];
            let message = details["exception"]["description"]
                .as_str()
                .or(details["text"].as_str())
                .unwrap_or_default();
            ("exception", json!({"text": cut(message)}))
        }
        _ => return None,
    };
    Some(json!({"kind": kind, "event": what}))
}

impl Trace {
    /// Adds what `event` tells, if it tells something a trace keeps.
    pub fn record(&mut self, event: &Value) {
        let Some(mut entry) = entry(event) else {
            return;
        };
        let size = entry.to_string().len();
        if self.entries.len() >= MAX_ENTRIES || self.bytes + size > MAX_BYTES {
            self.dropped += 1;
            return;
        }
        entry["ms"] = json!(self.started.elapsed().as_millis() as u64);
        self.bytes += size;
        self.entries.push(entry);
    }

    /// The trace as saved: its entries, and how many did not fit.
    pub fn to_json(&self) -> Value {
        json!({
            "format": "moat-browser-trace/1",
            "entries": self.entries,
            "dropped": self.dropped,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_keeps_navigations_requests_and_console_and_stays_bounded() {
        let mut trace = Trace::default();
        trace.record(&json!({"method": "Page.frameNavigated",
            "params": {"frame": {"url": "http://a.test/", "parentId": null}}}));
        trace.record(&json!({"method": "Page.frameNavigated",
            "params": {"frame": {"url": "http://ad.test/", "parentId": "f1"}}}));
        trace.record(&json!({"method": "Runtime.consoleAPICalled",
            "params": {"type": "log", "args": [{"value": "hi"}, {"value": 2}]}}));
        trace.record(&json!({"method": "Page.loadEventFired", "params": {}}));
        let saved = trace.to_json();
        let kinds: Vec<&str> = saved["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["navigated", "console"]);
        assert_eq!(saved["entries"][1]["event"]["text"], "hi 2");
        let long = "x".repeat(MAX_TEXT * 2);
        for _ in 0..MAX_ENTRIES + 10 {
            trace.record(&json!({"method": "Network.requestWillBeSent",
                "params": {"request": {"method": "GET", "url": long}, "type": "Fetch"}}));
        }
        let saved = trace.to_json();
        assert!(saved.to_string().len() < MAX_BYTES + (64 << 10));
        assert!(saved["dropped"].as_u64().unwrap() > 10);
        assert!(saved["entries"][2]["event"]["url"].as_str().unwrap().len() <= MAX_TEXT + 4);
    }
}
