//! `browser_step`: sessions of a headless browser in the sandbox (see
//! `crate::browser`), one per `sessionId`, kept across the run's operations
//! and ended at `close` or when the shell ends.

use std::time::Duration;

use moat_core::element::{ANY_ELEMENT, ElementFacts};
use moat_core::op::BrowserStepArgs;
use moat_core::{DenialReason, Envelope, NetworkMode, OpStatus, WorkloadClass};
use serde_json::{Value, json};

use super::{Op, Outcome, Shell, ok};
use crate::browser::{Clicked, Filled, Launch, Session, VM_MIN_MEMORY};
use crate::workspace::Refusal;

/// Sessions open at once in one shell.
const MAX_SESSIONS: usize = 4;

/// How long a step may take unless it says otherwise.
const STEP_WAIT: Duration = Duration::from_secs(15);

/// The longest a step may ask to wait.
const MAX_STEP_WAIT: Duration = Duration::from_secs(60);

/// A page's URL and title, cut short: they are the page's to make long.
const PAGE_SUMMARY: &str =
    "({url: location.href.slice(0, 2048), title: document.title.slice(0, 512)})";

/// The most text `extract` returns.
const MAX_EXTRACT: usize = 64 << 10;

/// The longest selector, option value or text a step takes.
const MAX_ARG: usize = 16 << 10;

fn refuse(reason: DenialReason, message: impl Into<String>) -> Outcome {
    Outcome::Denied(Refusal::new(reason, message))
}

impl Shell {
    pub(super) fn browser(
        &mut self,
        envelope: &Envelope,
        a: BrowserStepArgs,
        op: &mut Op,
        grant: Option<&str>,
        class: WorkloadClass,
    ) -> Outcome {
        let id = a.session_id().to_owned();
        if !moat_core::op::is_plain_id(&id) || id.len() > 64 {
            return refuse(
                DenialReason::InvalidArgs,
                "sessionId: 1-64 letters, digits, '.', '_' or '-'",
            );
        }
        // A session's class is chosen when it opens: a step the policy puts
        // in a stronger class is never run in a weaker session.
        if let Some(session) = self.browsers.get(&id)
            && !session.class.satisfies(class)
        {
            return refuse(
                DenialReason::ClassNotAvailable,
                format!(
                    "session {id} runs in workload class {}; the policy puts this step in {class}: \
                     open a session for it (a session's class is its open step's)",
                    session.class
                ),
            );
        }
        let too_long = match &a {
            BrowserStepArgs::Click { selector, .. } => selector.len(),
            BrowserStepArgs::Type { selector, text, .. } => selector.len().max(text.len()),
            BrowserStepArgs::FillSecret {
                selector, secret, ..
            } => selector.len().max(secret.len()),
            BrowserStepArgs::Select {
                selector, value, ..
            } => selector.len().max(value.len()),
            BrowserStepArgs::WaitFor { selector, text, .. } => selector
                .as_deref()
                .map_or(0, str::len)
                .max(text.as_deref().map_or(0, str::len)),
            BrowserStepArgs::Extract { selector, .. } => selector.as_deref().map_or(0, str::len),
            BrowserStepArgs::Navigate { url, .. } => url.len() / 4,
            _ => 0,
        };
        if too_long > MAX_ARG {
            return refuse(
                DenialReason::InvalidArgs,
                format!("a selector, text, value or URL of at most {MAX_ARG} bytes"),
            );
        }
        // Once a secret is in the page, a selector may not match on
        // attributes (a page mirroring the field's value in one, as
        // frameworks do, would answer a probe for it a character at a
        // time), nor hold CSS escapes that could spell one.
        if self.browsers.get(&id).is_some_and(|s| !s.filled.is_empty())
            && step_selector(&a).is_some_and(|s| s.contains(['[', '\\']))
        {
            return refuse(
                DenialReason::InvalidArgs,
                "a secret was filled into this session: a selector may not match on attributes \
                 ([...]) or hold escapes (\\) from now on",
            );
        }
        if self.browsers.get(&id).is_some_and(Session::expired) {
            if let Some(session) = self.browsers.remove(&id) {
                self.record_end(session, envelope, op);
            }
            return refuse(
                DenialReason::LimitExceeded,
                format!("session {id} outlived its lifetime and was closed"),
            );
        }
        // An acting step acts only on the element it was decided on.
        let element = match acting_selector(&a) {
            Some(selector) => match self.element_gate(&id, selector, grant) {
                Ok(facts) => Some(facts),
                Err(outcome) => return outcome,
            },
            None => None,
        };
        let action = a.action();
        let outcome = match a {
            BrowserStepArgs::FillSecret {
                selector, secret, ..
            } => self.fill_secret(envelope, &id, &selector, &secret),
            BrowserStepArgs::Open { trace, .. } => {
                self.open_browser(envelope, &id, trace, op, class)
            }
            BrowserStepArgs::Close { .. } => match self.browsers.remove(&id) {
                Some(mut session) => {
                    let trace = session.take_trace(session.deadline(Duration::from_secs(5)));
                    let ended = self.record_end(session, envelope, op);
                    let result = json!({"sessionId": id, "closed": true, "exitCode": ended});
                    match trace {
                        Some(trace) => self.with_trace(op, &id, &trace, result),
                        None => ok(result),
                    }
                }
                None => no_session(&id),
            },
            BrowserStepArgs::Navigate {
                url, timeout_ms, ..
            } => match step_wait(timeout_ms) {
                Ok(wait) => self.navigate(&id, &url, wait, op),
                Err(refused) => refused,
            },
            BrowserStepArgs::Click {
                selector,
                timeout_ms,
                ..
            } => match step_wait(timeout_ms) {
                Ok(wait) => self.click(&id, &selector, element.as_ref(), wait, op),
                Err(refused) => refused,
            },
            BrowserStepArgs::Type { selector, text, .. } => {
                let Some(session) = self.browsers.get_mut(&id) else {
                    return no_session(&id);
                };
                match session.type_text(&selector, &text, session.deadline(STEP_WAIT)) {
                    // What was typed is the agent's: not echoed back.
                    Ok(Some(true)) => ok(json!({"sessionId": id, "matched": true,
                        "typed": text.chars().count(), "element": element})),
                    Ok(Some(false)) => refuse(
                        DenialReason::InvalidArgs,
                        format!(
                            "{selector:?} does not take the focus: what was typed would go \
                             elsewhere"
                        ),
                    ),
                    Ok(None) => ok(json!({"sessionId": id, "matched": false})),
                    Err(e) => Outcome::Failed(format!("session {id}: type: {e}")),
                }
            }
            BrowserStepArgs::Select {
                selector, value, ..
            } => {
                let Some(session) = self.browsers.get_mut(&id) else {
                    return no_session(&id);
                };
                match session.select(&selector, &value, session.deadline(STEP_WAIT)) {
                    Ok(chosen) => {
                        ok(json!({"sessionId": id, "matched": chosen.is_some(), "value": chosen}))
                    }
                    Err(e) => Outcome::Failed(format!("session {id}: select: {e}")),
                }
            }
            BrowserStepArgs::WaitFor {
                selector,
                text,
                timeout_ms,
                ..
            } => {
                if selector.is_none() == text.is_none() {
                    return refuse(
                        DenialReason::InvalidArgs,
                        "wait_for: a selector or a text, one of them",
                    );
                }
                let wait = match step_wait(timeout_ms) {
                    Ok(wait) => wait,
                    Err(refused) => return refused,
                };
                let Some(session) = self.browsers.get_mut(&id) else {
                    return no_session(&id);
                };
                match session.wait_for(selector.as_deref(), text.as_deref(), session.deadline(wait))
                {
                    Ok(true) => ok(json!({"sessionId": id, "matched": true})),
                    Ok(false) => Outcome::Done {
                        status: OpStatus::Timeout,
                        result: json!({"sessionId": id, "matched": false}),
                        message: Some(format!("nothing matched within {} ms", wait.as_millis())),
                        artifacts: Vec::new(),
                    },
                    Err(e) => Outcome::Failed(format!("session {id}: wait_for: {e}")),
                }
            }
            BrowserStepArgs::Extract { selector, .. } => self.extract(&id, selector.as_deref()),
            BrowserStepArgs::Screenshot { .. } => {
                let Some(session) = self.browsers.get_mut(&id) else {
                    return no_session(&id);
                };
                match session.screenshot(session.deadline(STEP_WAIT)) {
                    Ok(png) => self.with_screenshot(op, &id, png, json!({"sessionId": id})),
                    Err(e) => Outcome::Failed(format!("session {id}: screenshot: {e}")),
                }
            }
        };
        // Every step on a page answers with the page as it left it
        // (`navigate`, `click` and `screenshot` take theirs themselves).
        let outcome = match action {
            "type" | "fill_secret" | "select" | "wait_for" | "extract" => {
                self.with_page(op, &id, outcome)
            }
            _ => outcome,
        };
        // Whatever the page made of a secret filled into it is scrubbed
        // from the step's answer (the control plane scrubs again).
        match self.browsers.get(&id) {
            Some(session) if !session.filled.is_empty() => scrub(&session.filled, outcome),
            _ => outcome,
        }
    }

    /// What an acting step's `selector` matches, if the step's capability
    /// was decided on it (or on any element, by hand). Otherwise the step
    /// does nothing and answers what it found (`element_unchecked`), or
    /// that nothing matched.
    fn element_gate(
        &mut self,
        id: &str,
        selector: &str,
        grant: Option<&str>,
    ) -> Result<ElementFacts, Outcome> {
        let Some(session) = self.browsers.get_mut(id) else {
            return Err(no_session(id));
        };
        let mut facts = match session.describe(selector, session.deadline(STEP_WAIT)) {
            Ok(Some(facts)) => facts,
            Ok(None) => return Err(ok(json!({"sessionId": id, "matched": false}))),
            Err(e) => return Err(Outcome::Failed(format!("session {id}: {e}"))),
        };
        // The page may show a secret filled into it, anywhere it likes:
        // never in a decision.
        if !session.filled.is_empty()
            && let Ok(mut value) = serde_json::to_value(&facts)
        {
            session.filled.json_and_tails(&mut value);
            match serde_json::from_value(value) {
                Ok(scrubbed) => facts = scrubbed,
                Err(e) => return Err(Outcome::Failed(format!("session {id}: {e}"))),
            }
        }
        match grant {
            Some(ANY_ELEMENT) => Ok(facts),
            Some(decided) if decided == facts.fingerprint() => Ok(facts),
            _ => Err(Outcome::Unchecked(Box::new(facts))),
        }
    }

    fn fill_secret(
        &mut self,
        envelope: &Envelope,
        id: &str,
        selector: &str,
        name: &str,
    ) -> Outcome {
        let Some(value) = envelope.secret_value.as_deref() else {
            return refuse(
                DenialReason::NotFound,
                format!(
                    "no value came with secret {name:?}: a managed run's control plane \
                     supplies it from the org's secrets (it has none of that name), and a \
                     local shell has none to give"
                ),
            );
        };
        if value.len() < moat_core::scrub::MIN_SECRET {
            return refuse(
                DenialReason::InvalidArgs,
                format!(
                    "secret {name:?} is shorter than {} bytes: too short to keep out of results",
                    moat_core::scrub::MIN_SECRET
                ),
            );
        }
        let Some(session) = self.browsers.get_mut(id) else {
            return no_session(id);
        };
        // Scrubbed from here on, even if filling fails half-way.
        session.filled.also_secret(name, value);
        match session.fill_secret(selector, value, session.deadline(STEP_WAIT)) {
            Ok(Filled::Filled) => {
                // Where it went, on the record.
                let origin = session
                    .evaluate("location.origin.slice(0, 512)", session.deadline(STEP_WAIT))
                    .unwrap_or(Value::Null);
                ok(json!({"sessionId": id, "matched": true, "secret": name, "origin": origin}))
            }
            Ok(Filled::NoMatch) => ok(json!({"sessionId": id, "matched": false})),
            Ok(Filled::NotAField(kind)) => refuse(
                DenialReason::InvalidArgs,
                format!(
                    "fill_secret fills an enabled text field (an input or a textarea); \
                     {selector:?} is {kind}"
                ),
            ),
            Err(e) => Outcome::Failed(format!("session {id}: fill_secret: {e}")),
        }
    }

    fn open_browser(
        &mut self,
        envelope: &Envelope,
        id: &str,
        trace: bool,
        op: &mut Op,
        class: WorkloadClass,
    ) -> Outcome {
        if self.browsers.contains_key(id) {
            return refuse(
                DenialReason::InvalidArgs,
                format!("session {id} is already open"),
            );
        }
        // Sessions past their lifetime give their places back.
        let expired: Vec<String> = self
            .browsers
            .iter()
            .filter(|(_, session)| session.expired())
            .map(|(id, _)| id.clone())
            .collect();
        for old in expired {
            if let Some(session) = self.browsers.remove(&old) {
                self.record_end(session, envelope, op);
            }
        }
        if self.browsers.len() >= MAX_SESSIONS {
            return refuse(
                DenialReason::LimitExceeded,
                format!("at most {MAX_SESSIONS} browser sessions at once: close one first"),
            );
        }
        // The browser's only way out is the egress proxy.
        let manifest = &self.config.manifest;
        let network = match manifest.network_policy.mode {
            mode @ (NetworkMode::Allowlist | NetworkMode::ProxyOnly) => mode,
            other => {
                return refuse(
                    DenialReason::NetworkNotAllowed,
                    format!(
                        "a browser reaches the web through the egress proxy only: the \
                         manifest's networkPolicy.mode must be allowlist or proxy-only, not {other}"
                    ),
                );
            }
        };
        let policy = match crate::network::exec_policy(manifest, network) {
            Ok(policy) => policy,
            Err(refusal) => return Outcome::Denied(refusal),
        };
        let vm = match super::vm_for(class, &self.config.vm) {
            Ok(vm) => vm.cloned(),
            Err(refusal) => return Outcome::Denied(refusal),
        };
        if vm.is_some() && manifest.limits.memory_bytes < VM_MIN_MEMORY {
            return refuse(
                DenialReason::LimitExceeded,
                format!(
                    "a browser's microvm guest needs at least {} MiB of memory; the manifest's \
                     limits give {} MiB",
                    VM_MIN_MEMORY >> 20,
                    manifest.limits.memory_bytes >> 20
                ),
            );
        }
        let sandbox_id = format!(
            "browser-{}",
            &moat_core::hash::sha256_hex(
                format!("{}\n{}\n{}", envelope.run_id, id, super::now()).as_bytes()
            )[..16]
        );
        let launch = Launch {
            sandbox_id,
            mode: moat_core::SandboxMode::ReadOnly,
            network,
            limits: manifest.limits.clone(),
            without_cgroup: manifest.cgroup_limits == moat_core::manifest::CgroupLimits::Deployment,
            id_range: self.config.id_range,
            launch_policy: self.config.launch_policy.clone(),
            egress: self.egress_config(),
            policy,
            vm,
        };
        match Session::open(launch) {
            Ok(mut session) => {
                if trace && let Err(e) = session.start_trace(session.deadline(STEP_WAIT)) {
                    return Outcome::Failed(format!("session {id}: starting its trace: {e}"));
                }
                session.opened_by = (
                    envelope.run_id.clone(),
                    envelope.id.clone(),
                    envelope.correlation_id.clone(),
                );
                let sandbox = session.sandbox_id.clone();
                self.browsers.insert(id.to_owned(), session);
                ok(
                    json!({"sessionId": id, "opened": true, "sandboxRunId": sandbox,
                    "class": class}),
                )
            }
            Err(failed) => {
                // What a sandbox that started recorded is on the record.
                if let Some(ended) = failed.ended {
                    let (events, _) = relabel(
                        ended,
                        &moat_core::scrub::Scrubber::default(),
                        &envelope.run_id,
                        &envelope.id,
                        &envelope.correlation_id,
                    );
                    op.events.extend(events);
                }
                Outcome::Failed(format!("session {id}: {}", failed.message))
            }
        }
    }

    fn navigate(&mut self, id: &str, url: &str, wait: Duration, op: &mut Op) -> Outcome {
        let lower = url.to_ascii_lowercase();
        if !(lower.starts_with("http://") || lower.starts_with("https://")) {
            return refuse(DenialReason::InvalidArgs, "url: an http:// or https:// URL");
        }
        let Some(session) = self.browsers.get_mut(id) else {
            return no_session(id);
        };
        let deadline = session.deadline(wait);
        let loaded = match session.navigate(url, deadline) {
            Ok(loaded) => loaded,
            Err(e) => return Outcome::Failed(format!("session {id}: navigate: {e}")),
        };
        if let Some(denied) = &loaded.denied {
            let reason = serde_json::from_value::<DenialReason>(Value::from(denied.as_str()))
                .unwrap_or(DenialReason::DomainNotAllowed);
            return refuse(reason, format!("the egress proxy refused {url} ({denied})"));
        }
        if let Some(error) = &loaded.error {
            return Outcome::Done {
                status: OpStatus::Error,
                result: json!({"sessionId": id, "url": url, "error": error}),
                message: Some(format!("the browser could not load {url}: {error}")),
                artifacts: Vec::new(),
            };
        }
        let page = session
            .evaluate(
                PAGE_SUMMARY,
                deadline.max(session.deadline(Duration::from_secs(5))),
            )
            .unwrap_or(Value::Null);
        let result = json!({
            "sessionId": id,
            "url": page["url"],
            "title": page["title"],
            "status": loaded.status,
        });
        match session.screenshot(session.deadline(STEP_WAIT)) {
            Ok(png) => self.with_screenshot(op, id, png, result),
            Err(_) => ok(result),
        }
    }

    fn click(
        &mut self,
        id: &str,
        selector: &str,
        element: Option<&ElementFacts>,
        wait: Duration,
        op: &mut Op,
    ) -> Outcome {
        let Some(session) = self.browsers.get_mut(id) else {
            return no_session(id);
        };
        let deadline = session.deadline(wait);
        match session.click(selector, deadline) {
            Ok(Clicked::NoMatch) => ok(json!({"sessionId": id, "matched": false})),
            Ok(Clicked::Covered) => refuse(
                DenialReason::InvalidArgs,
                format!(
                    "a click at the middle of {selector:?} would land on another element (one \
                     that covers it, one that acts inside it, or a frame's page): click that \
                     one, if it is the one meant"
                ),
            ),
            Ok(Clicked::Clicked) => {
                let page = session
                    .evaluate(
                        PAGE_SUMMARY,
                        deadline.max(session.deadline(Duration::from_secs(5))),
                    )
                    .unwrap_or(Value::Null);
                let result = json!({"sessionId": id, "matched": true, "element": element,
                    "url": page["url"], "title": page["title"]});
                match session.screenshot(session.deadline(STEP_WAIT)) {
                    Ok(png) => self.with_screenshot(op, id, png, result),
                    Err(_) => ok(result),
                }
            }
            Err(e) => Outcome::Failed(format!("session {id}: click: {e}")),
        }
    }

    fn extract(&mut self, id: &str, selector: Option<&str>) -> Outcome {
        let Some(session) = self.browsers.get_mut(id) else {
            return no_session(id);
        };
        let selector =
            selector.map_or_else(|| "null".to_owned(), crate::browser::session::js_string);
        let expression = format!(
            "(() => {{ const s = {selector}; const e = s === null ? document.body : \
             document.querySelector(s); return e ? e.innerText.slice(0, {}) : null; }})()",
            MAX_EXTRACT + 1
        );
        match session.evaluate(&expression, session.deadline(STEP_WAIT)) {
            Ok(Value::String(mut text)) => {
                let truncated = text.len() > MAX_EXTRACT;
                if truncated {
                    let mut end = MAX_EXTRACT;
                    while !text.is_char_boundary(end) {
                        end -= 1;
                    }
                    text.truncate(end);
                }
                ok(json!({"sessionId": id, "matched": true, "text": text, "truncated": truncated}))
            }
            Ok(_) => ok(json!({"sessionId": id, "matched": false})),
            Err(e) => Outcome::Failed(format!("session {id}: extract: {e}")),
        }
    }

    /// A step's answer with the page's screenshot added, if the step was
    /// answered and the page can be taken.
    fn with_page(&mut self, op: &mut Op, id: &str, outcome: Outcome) -> Outcome {
        let Outcome::Done {
            status,
            result,
            message,
            mut artifacts,
        } = outcome
        else {
            return outcome;
        };
        let shot = match self.browsers.get_mut(id) {
            Some(session) if matches!(status, OpStatus::Ok | OpStatus::Timeout) => {
                session.screenshot(session.deadline(STEP_WAIT)).ok()
            }
            _ => None,
        };
        let Some(png) = shot else {
            return Outcome::Done {
                status,
                result,
                message,
                artifacts,
            };
        };
        match self.with_screenshot(op, id, png, result) {
            Outcome::Done {
                result,
                artifacts: mut shot,
                ..
            } => {
                artifacts.append(&mut shot);
                Outcome::Done {
                    status,
                    result,
                    message,
                    artifacts,
                }
            }
            failed => failed,
        }
    }

    /// `result` with the session's trace saved as an artifact.
    fn with_trace(&mut self, op: &mut Op, id: &str, trace: &Value, result: Value) -> Outcome {
        let bytes = serde_json::to_vec_pretty(trace).unwrap_or_default();
        self.with_artifact(op, id, "trace", &bytes, result)
    }

    /// `result` with the page's screenshot saved as an artifact.
    fn with_screenshot(&mut self, op: &mut Op, id: &str, png: Vec<u8>, result: Value) -> Outcome {
        self.with_artifact(op, id, "screenshot", &png, result)
    }

    /// `result` with `bytes` saved as an artifact of `kind`, named in the
    /// result under the same key.
    fn with_artifact(
        &mut self,
        op: &mut Op,
        id: &str,
        kind: &str,
        bytes: &[u8],
        mut result: Value,
    ) -> Outcome {
        match self.artifact(op, kind, &format!("browser {id} {kind}"), bytes) {
            Ok(reference) => {
                result[kind] = json!({"sha256": reference.sha256, "size": bytes.len()});
                Outcome::Done {
                    status: OpStatus::Ok,
                    result,
                    message: None,
                    artifacts: vec![reference],
                }
            }
            Err(e) => Outcome::Failed(e),
        }
    }

    /// Closes `session` and records what its sandbox recorded (the
    /// browser's start and end, every request through its proxy) with
    /// `op`; returns the browser's exit code.
    fn record_end(&mut self, session: Session, envelope: &Envelope, op: &mut Op) -> Option<i32> {
        let (events, exit_code) = ended_record(
            session,
            &envelope.run_id,
            &envelope.id,
            &envelope.correlation_id,
        );
        op.events.extend(events);
        exit_code
    }

    /// Closes the sessions still open (the shell's input ended: its run is
    /// over) and records what their sandboxes recorded, each under the step
    /// that opened it, in the ledger.
    pub(super) fn close_browsers(&mut self) {
        // Each on record as soon as it is closed: a shell stopped half-way
        // keeps what it closed.
        for (_, session) in std::mem::take(&mut self.browsers) {
            let (run, op, correlation) = session.opened_by.clone();
            let events = ended_record(session, &run, &op, &correlation).0;
            if !events.is_empty()
                && let Err(e) = self.ledger.append_with_artifacts(&events, &[])
            {
                eprintln!("moat shell: recording a browser session left open: {e}");
            }
        }
    }
}

/// Closes `session` and returns what its sandbox recorded (the browser's
/// start and end, every request through its proxy), scrubbed of the
/// secrets filled into it and filed under `run`, `op` and `correlation`,
/// with the browser's exit code.
fn ended_record(
    session: Session,
    run: &str,
    op: &str,
    correlation: &str,
) -> (Vec<moat_core::Event>, Option<i32>) {
    let filled = session.filled.clone();
    relabel(session.close(), &filled, run, op, correlation)
}

/// What an ended sandbox recorded, scrubbed of `filled` and filed under
/// `run`, `op` and `correlation`, with the browser's exit code.
fn relabel(
    mut ended: crate::browser::Ended,
    filled: &moat_core::scrub::Scrubber,
    run: &str,
    op: &str,
    correlation: &str,
) -> (Vec<moat_core::Event>, Option<i32>) {
    // A form sent with a secret in it puts it in a request's URL.
    for event in &mut ended.events {
        filled.json_and_tails(&mut event.data);
    }
    let mut events = Vec::new();
    let mut sink = crate::exec::Relabel {
        events: &mut events,
        run_id: run,
        op_id: op,
        correlation_id: correlation,
    };
    for event in ended.events {
        moat_core::EventSink::emit(&mut sink, event);
    }
    if let Some(error) = ended.error {
        eprintln!("moat shell: a browser session's end: {error}");
    }
    (events, ended.exit_code)
}

/// A step's wait: its own (at most [`MAX_STEP_WAIT`]) or the default.
fn step_wait(timeout_ms: Option<u64>) -> Result<Duration, Outcome> {
    let wait = timeout_ms.map_or(STEP_WAIT, Duration::from_millis);
    if wait > MAX_STEP_WAIT {
        return Err(refuse(
            DenialReason::LimitExceeded,
            format!("timeoutMs: at most {}", MAX_STEP_WAIT.as_millis()),
        ));
    }
    Ok(wait)
}

/// The selector of an acting step: one that changes a page (and may send
/// what it holds), decided on the element it acts on.
fn acting_selector(step: &BrowserStepArgs) -> Option<&str> {
    match step {
        BrowserStepArgs::Click { selector, .. }
        | BrowserStepArgs::Type { selector, .. }
        | BrowserStepArgs::FillSecret { selector, .. }
        | BrowserStepArgs::Select { selector, .. } => Some(selector),
        _ => None,
    }
}

/// The selector a step matches with, if it takes one.
fn step_selector(step: &BrowserStepArgs) -> Option<&str> {
    match step {
        BrowserStepArgs::WaitFor { selector, .. } | BrowserStepArgs::Extract { selector, .. } => {
            selector.as_deref()
        }
        acting => acting_selector(acting),
    }
}

/// `outcome` with every secret `filled` knows replaced by its name.
fn scrub(filled: &moat_core::scrub::Scrubber, outcome: Outcome) -> Outcome {
    match outcome {
        Outcome::Done {
            status,
            mut result,
            message,
            artifacts,
        } => {
            filled.json_and_tails(&mut result);
            Outcome::Done {
                status,
                result,
                message: message.map(|m| filled.text_and_tail(&m)),
                artifacts,
            }
        }
        Outcome::Failed(message) => Outcome::Failed(filled.text_and_tail(&message)),
        // Scrubbed when found (element_gate).
        other @ (Outcome::Denied(_) | Outcome::Unchecked(_)) => other,
    }
}

fn no_session(id: &str) -> Outcome {
    refuse(
        DenialReason::InvalidArgs,
        format!("no open browser session {id} (open one first)"),
    )
}
