//! One browser session: a headless Chromium in a sandbox of its own, kept
//! by a *keeper* process forked off the shell (the launcher waits for its
//! sandbox; the shell must go on serving operations), driven over the
//! DevTools pipe the sandbox passes it as fds 3 and 4. The browser reaches
//! the web only through an egress proxy of its own; its profile lives on
//! the sandbox's private `/tmp` and goes with it.

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use moat_core::element::ElementFacts;
use moat_core::{Event, Limits, NetworkMode, SandboxMode};
use moat_egress::{EgressConfig, EgressPolicy};
use moat_sandbox::hostid::IdRange;
use moat_sandbox::{OutputMode, SandboxSpec};
use serde_json::{Value, json};

use super::cdp::{Cdp, CdpError};

/// Debian's Chromium (the `chromium` package): the binary itself, not the
/// wrapper script, which reads `/etc/chromium.d`.
pub const CHROMIUM: &str = "/usr/lib/chromium/chromium";

/// The longest a session lives, whatever is asked of it.
pub const SESSION_LIFETIME: Duration = Duration::from_secs(15 * 60);

/// The page's size: screenshots are this many pixels.
pub const VIEWPORT: (u32, u32) = (1280, 800);

/// How long the browser gets to start and answer its first command.
const START_WAIT: Duration = Duration::from_secs(20);

/// The same in a `microvm` guest: its boot, then the browser's first start
/// on a cold 9p page cache (about two minutes under software emulation).
const VM_START_WAIT: Duration = Duration::from_secs(300);

/// How many times longer a step may take in a `microvm` guest: a browser
/// there is as fast as the machine's under KVM, several times slower under
/// software emulation (TCG); the factor bounds how long a step is waited
/// for, never what it may do.
pub const VM_PATIENCE: u32 = 4;

/// The least memory a browser's guest is given: the guest kernel and a
/// headless Chromium's browser, GPU and renderer processes.
pub const VM_MIN_MEMORY: u64 = 1 << 30;

/// How long a click is watched for the navigation it may start.
const CLICK_SETTLE: Duration = Duration::from_millis(150);

/// How long a closing browser gets to end, and its keeper to report.
const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// What a session's sandbox is made from.
pub struct Launch {
    pub sandbox_id: String,
    pub mode: SandboxMode,
    pub network: NetworkMode,
    pub limits: Limits,
    pub without_cgroup: bool,
    pub id_range: Option<IdRange>,
    pub launch_policy: moat_sandbox::LaunchPolicy,
    pub egress: EgressConfig,
    pub policy: EgressPolicy,
    /// A `microvm` guest to run the browser in; `None`: a namespace
    /// sandbox.
    pub vm: Option<moat_sandbox::microvm::VmOptions>,
}

/// What the keeper reports once the browser's sandbox has ended.
#[derive(serde::Serialize, serde::Deserialize, Default)]
pub struct Ended {
    pub events: Vec<Event>,
    pub exit_code: Option<i32>,
    /// The end of the browser's own error output.
    pub stderr_tail: String,
    pub error: Option<String>,
}

impl Ended {
    /// Why the browser's sandbox ended, for a message: `""` when it did
    /// not say.
    pub fn why(&self) -> String {
        if let Some(error) = &self.error {
            return format!(" ({error})");
        }
        let setup = self
            .events
            .iter()
            .filter(|e| e.event_type == moat_core::EventType::SandboxExecFinished)
            .find_map(|e| e.data["setupError"].as_str().map(str::to_owned));
        if let Some(setup) = setup {
            return format!(" (the browser's sandbox: {setup})");
        }
        match (self.exit_code, self.stderr_tail.lines().last()) {
            (Some(code), Some(line)) => format!(" (the browser exited {code}: {line})"),
            (Some(code), None) => format!(" (the browser exited {code})"),
            _ => String::new(),
        }
    }
}

/// Why a session did not open, and what its sandbox recorded if it
/// started one.
pub struct OpenFailed {
    pub message: String,
    pub ended: Option<Ended>,
}

impl From<String> for OpenFailed {
    fn from(message: String) -> Self {
        OpenFailed {
            message,
            ended: None,
        }
    }
}

/// A live session.
pub struct Session {
    cdp: Cdp,
    /// The page's DevTools session.
    page: String,
    /// The page's target id: its main frame's id too.
    frame: String,
    keeper: Option<moat_sandbox::helper::Helper>,
    ended: File,
    pub sandbox_id: String,
    opened: Instant,
    /// The secrets filled into this session's pages: scrubbed from all it
    /// answers from then on.
    pub filled: moat_core::scrub::Scrubber,
    /// The run, operation and correlation of the step that opened it: what
    /// its record is filed under if it is never closed.
    pub opened_by: (String, String, String),
    /// The class the browser runs in.
    pub class: moat_core::WorkloadClass,
    /// How many times longer than on the host a step is waited for.
    patience: u32,
}

/// A page script's `describe(e)`: what an acting step would act on, as
/// [`ElementFacts`] (the page's origin and address; the element's tag,
/// type, role, visible text, a link's target; the method and action its
/// form, or the button's own `formmethod`/`formaction`, would send with;
/// whether it submits), each cut short; never a field's value. The type is
/// the element's own idea of it (a `<button type=x>` is a submit button)
/// and the form's action is read from its attribute (a field named
/// `action` shadows the form's property).
const DESCRIBE: &str = "const describe = (e) => { const f = e.form || e.closest('form'); \
    const cut = (s, n) => String(s || '').slice(0, n); \
    const at = (n) => e.getAttribute(n) || ''; \
    const url = (u) => { try { return new URL(u, document.baseURI).href; } catch (_) { return ''; } }; \
    const t = String((e.tagName === 'BUTTON' || e.tagName === 'INPUT' ? e.type : at('type')) || '').toLowerCase(); \
    const submits = !!f && ((e.tagName === 'BUTTON' && t === 'submit') || \
    (e.tagName === 'INPUT' && (t === 'submit' || t === 'image'))); \
    const method = submits && at('formmethod') ? at('formmethod') : (f ? f.getAttribute('method') || 'get' : ''); \
    const action = submits && at('formaction') ? url(at('formaction')) : (f ? url(f.getAttribute('action') || '') : ''); \
    const page = new URL(location.href); \
    return {origin: cut(page.origin, 512), url: cut(page.href, 2048), tag: e.tagName.toLowerCase(), \
    type: cut(t, 32), role: cut(at('role'), 32), text: cut(e.innerText, 200), \
    href: cut(e.localName === 'a' && at('href') ? url(at('href')) : '', 2048), \
    formMethod: cut(method, 16).toLowerCase(), formAction: cut(action, 2048), submits}; };";

/// What a click may land on inside the element it was decided on without
/// that being another element that acts (a `<span>` in a `<button>` is the
/// button; a `<button>` in a `<div>` is not the div).
const ACTS: &str = "a[href], area[href], button, input, select, textarea, label, summary, \
    iframe, frame, object, embed, [onclick], [role=button], [role=link], [contenteditable]";

/// A page script drawing every input and textarea of the page (and of its
/// open shadow roots' documents) as dots, above the page's own styles.
const MASK_FIELDS: &str = "(() => { for (const e of document.querySelectorAll('input, textarea')) \
    e.style.setProperty('-webkit-text-security', 'disc', 'important'); \
    if (!document.getElementById('moat-mask')) { const s = document.createElement('style'); \
    s.id = 'moat-mask'; s.textContent = 'input, textarea { -webkit-text-security: disc !important; }'; \
    (document.head || document.documentElement).appendChild(s); } return true; })()";

/// What a click did.
#[derive(Debug, PartialEq, Eq)]
pub enum Clicked {
    NoMatch,
    /// Another element covers its middle: not clicked.
    Covered,
    Clicked,
}

/// What `fill_secret` found at its selector.
#[derive(Debug, PartialEq, Eq)]
pub enum Filled {
    NoMatch,
    /// Not a text field: the element's tag (and type).
    NotAField(String),
    Filled,
}

fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (read, write) = std::io::pipe()?;
    Ok((read.into(), write.into()))
}

impl Session {
    /// Starts the browser and opens its page. The caller must be
    /// single-threaded (the keeper is forked).
    pub fn open(launch: Launch) -> Result<Session, OpenFailed> {
        let io = |what: &str| {
            let what = what.to_owned();
            move |e: std::io::Error| OpenFailed::from(format!("{what}: {e}"))
        };
        // A guest gets one socket as both 3 and 4 (a host descriptor reaches
        // it only as a port QEMU relays from a socket); a namespace sandbox
        // two pipes.
        let (shell_reads, shell_writes, browser_reads, browser_writes) = if launch.vm.is_some() {
            let (here, there) = std::os::unix::net::UnixStream::pair()
                .map_err(io("a socket to the browser's guest"))?;
            let here = OwnedFd::from(here);
            let there = Arc::new(OwnedFd::from(there));
            let reads = here
                .try_clone()
                .map_err(io("a socket to the browser's guest"))?;
            (reads, here, there.clone(), there)
        } else {
            let (browser_reads, to_browser) = pipe().map_err(io("a pipe to the browser"))?;
            let (from_browser, browser_writes) = pipe().map_err(io("a pipe from the browser"))?;
            (
                from_browser,
                to_browser,
                Arc::new(browser_reads),
                Arc::new(browser_writes),
            )
        };
        let (ended_read, ended_write) = pipe().map_err(io("the keeper's pipe"))?;
        let sandbox_id = launch.sandbox_id.clone();
        let mut spec =
            SandboxSpec::new(launch.sandbox_id.clone(), chromium_argv(&launch.sandbox_id));
        spec.mode = launch.mode;
        spec.network = launch.network;
        spec.limits = launch.limits;
        spec.limits.timeout_ms = u64::try_from(SESSION_LIFETIME.as_millis()).unwrap_or(u64::MAX);
        spec.without_cgroup = launch.without_cgroup;
        spec.id_range = launch.id_range;
        spec.launch_policy = launch.launch_policy;
        spec.stdin_null = true;
        spec.env = vec![("HOME".into(), "/tmp".into())];
        spec.pass_fds = vec![browser_reads, browser_writes];
        let keep = [
            spec.pass_fds[0].as_raw_fd(),
            spec.pass_fds[1].as_raw_fd(),
            ended_write.as_raw_fd(),
        ];
        let (class, patience, start_wait) = match &launch.vm {
            Some(_) => (
                moat_core::WorkloadClass::Microvm,
                VM_PATIENCE,
                VM_START_WAIT,
            ),
            None => (moat_core::WorkloadClass::Namespace, 1, START_WAIT),
        };
        let (config, policy, vm) = (launch.egress, launch.policy, launch.vm);
        let keeper = moat_sandbox::helper::spawn_helper(&keep, move || {
            keep_browser(spec, vm, config, policy, ended_write)
        })
        .map_err(|e| OpenFailed::from(format!("starting the browser's keeper: {e}")))?;
        let mut session = Session {
            cdp: Cdp::new(File::from(shell_writes), File::from(shell_reads)),
            page: String::new(),
            frame: String::new(),
            keeper: Some(keeper),
            ended: File::from(ended_read),
            sandbox_id,
            opened: Instant::now(),
            filled: moat_core::scrub::Scrubber::default(),
            opened_by: Default::default(),
            class,
            patience,
        };
        let deadline = Instant::now() + start_wait;
        match session.open_page(deadline) {
            Ok((page, frame)) => {
                (session.page, session.frame) = (page, frame);
                Ok(session)
            }
            Err(e) => {
                // What the sandbox said of its end is why, more often than
                // the broken pipe.
                let ended = session.close();
                Err(OpenFailed {
                    message: format!("starting the browser: {e}{}", ended.why()),
                    ended: Some(ended),
                })
            }
        }
    }

    /// The page's DevTools session and target id.
    fn open_page(&mut self, deadline: Instant) -> Result<(String, String), CdpError> {
        // A download would land in the session's private /tmp, out of
        // everyone's reach, and bring whatever it is into the sandbox: the
        // browser refuses them all.
        self.cdp.call(
            "Browser.setDownloadBehavior",
            json!({"behavior": "deny"}),
            None,
            deadline,
        )?;
        let target = self.cdp.call(
            "Target.createTarget",
            json!({"url": "about:blank"}),
            None,
            deadline,
        )?;
        let attached = self.cdp.call(
            "Target.attachToTarget",
            json!({"targetId": target["targetId"], "flatten": true}),
            None,
            deadline,
        )?;
        let page = attached["sessionId"]
            .as_str()
            .ok_or_else(|| CdpError::Malformed("no session for the page".into()))?
            .to_owned();
        for method in ["Page.enable", "Network.enable"] {
            self.cdp.call(method, json!({}), Some(&page), deadline)?;
        }
        self.cdp.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": VIEWPORT.0, "height": VIEWPORT.1, "deviceScaleFactor": 1, "mobile": false}),
            Some(&page),
            deadline,
        )?;
        let frame = target["targetId"]
            .as_str()
            .ok_or_else(|| CdpError::Malformed("no id for the page".into()))?
            .to_owned();
        Ok((page, frame))
    }

    /// Starts keeping a trace of the page (navigations, requests, console).
    pub fn start_trace(&mut self, deadline: Instant) -> Result<(), CdpError> {
        self.cdp.trace = Some(super::trace::Trace::default());
        for method in super::trace::DOMAINS {
            self.page_call(method, json!({}), deadline)?;
        }
        Ok(())
    }

    /// The trace kept so far (with what the browser said up to now), with
    /// the secrets filled into the session scrubbed; `None` if none is kept.
    pub fn take_trace(&mut self, deadline: Instant) -> Option<Value> {
        self.cdp.trace.as_ref()?;
        // Any answer comes after the events sent before it.
        let _ = self
            .cdp
            .call("Browser.getVersion", json!({}), None, deadline);
        let mut trace = self.cdp.trace.take()?.to_json();
        self.filled.json_and_tails(&mut trace);
        Some(trace)
    }

    /// When a step that may take `wait` on the host must be over.
    pub fn deadline(&self, wait: Duration) -> Instant {
        Instant::now() + wait * self.patience
    }

    /// Whether the session outlived [`SESSION_LIFETIME`] (its sandbox is
    /// gone by then).
    pub fn expired(&self) -> bool {
        self.opened.elapsed() >= SESSION_LIFETIME
    }

    /// A command to the page.
    pub fn page_call(
        &mut self,
        method: &str,
        params: Value,
        deadline: Instant,
    ) -> Result<Value, CdpError> {
        let page = self.page.clone();
        self.cdp.call(method, params, Some(&page), deadline)
    }

    /// Loads `url` and waits for its load event: the main document's
    /// status and headers, if one came.
    pub fn navigate(&mut self, url: &str, deadline: Instant) -> Result<Loaded, CdpError> {
        self.cdp.take_events();
        let navigated = self.page_call("Page.navigate", json!({"url": url}), deadline)?;
        if let Some(error) = navigated["errorText"].as_str() {
            return Ok(Loaded {
                error: Some(error.to_owned()),
                ..Loaded::default()
            });
        }
        let loader = navigated["loaderId"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let page = self.page.clone();
        let mut loaded = Loaded::default();
        let mut document = |event: &Value| {
            if event["method"] == "Network.responseReceived"
                && event["params"]["type"] == "Document"
                && event["params"]["loaderId"].as_str() == Some(loader.as_str())
            {
                let response = &event["params"]["response"];
                loaded.status = response["status"].as_u64();
                loaded.denied = header(&response["headers"], "x-moat-denied");
            }
        };
        self.cdp.wait_event(deadline, &mut document, |event| {
            event["method"] == "Page.loadEventFired" && event["sessionId"] == page.as_str()
        })?;
        // A response may be recorded after the load event: look again.
        for event in self.cdp.take_events() {
            document(&event);
        }
        Ok(loaded)
    }

    /// What the first element `selector` matches is ([`DESCRIBE`]), or
    /// `None` if nothing does.
    pub fn describe(
        &mut self,
        selector: &str,
        deadline: Instant,
    ) -> Result<Option<ElementFacts>, CdpError> {
        let found = self.evaluate_isolated(
            &format!(
                "(() => {{ {DESCRIBE} const e = document.querySelector({}); \
                 return e ? describe(e) : null; }})()",
                js_string(selector)
            ),
            deadline,
        )?;
        if found.is_null() {
            return Ok(None);
        }
        serde_json::from_value(found)
            .map(Some)
            .map_err(|e| CdpError::Malformed(format!("an element's description: {e}")))
    }

    /// Clicks the middle of the first element `selector` matches, then
    /// waits for a page the click starts loading. A click that would land
    /// on another element is not made: one covering its middle, one that
    /// acts inside it (a button in a card), or a frame's document.
    pub fn click(&mut self, selector: &str, deadline: Instant) -> Result<Clicked, CdpError> {
        let found = self.evaluate_isolated(
            &format!(
                "(() => {{ const e = document.querySelector({}); if (!e) return null; \
                 e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect(); \
                 const x = r.left + r.width / 2, y = r.top + r.height / 2; \
                 const hit = document.elementFromPoint(x, y); \
                 const inner = hit && hit.closest({}); \
                 const lands = !!hit && (hit === e || (e.contains(hit) && (!inner || inner === e))) \
                 && !e.matches('iframe, frame, object, embed'); \
                 return {{x, y, covered: !lands}}; }})()",
                js_string(selector),
                js_string(ACTS)
            ),
            deadline,
        )?;
        let (Some(x), Some(y)) = (found["x"].as_f64(), found["y"].as_f64()) else {
            return Ok(Clicked::NoMatch);
        };
        if found["covered"] != false {
            return Ok(Clicked::Covered);
        }
        self.cdp.take_events();
        for kind in ["mousePressed", "mouseReleased"] {
            self.page_call(
                "Input.dispatchMouseEvent",
                json!({"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}),
                deadline,
            )?;
        }
        // A click that navigates asks for it at once (a link, a form's
        // submit): wait for that page; a click that does not costs this.
        let page = self.page.clone();
        let soon = (Instant::now() + CLICK_SETTLE * self.patience).min(deadline);
        let started = self.cdp.wait_event(
            soon,
            |_| {},
            |event| {
                matches!(
                    event["method"].as_str(),
                    Some("Page.frameRequestedNavigation" | "Page.frameStartedLoading")
                ) && event["sessionId"] == page.as_str()
            },
        );
        match started {
            Ok(_) => {
                self.cdp.wait_event(
                    deadline,
                    |_| {},
                    |event| {
                        event["method"] == "Page.loadEventFired"
                            && event["sessionId"] == page.as_str()
                    },
                )?;
            }
            Err(CdpError::Timeout) => {}
            Err(e) => return Err(e),
        }
        Ok(Clicked::Clicked)
    }

    /// Types `text` into the first element `selector` matches: `None` if
    /// none does, `Some(false)` if it does not take the focus (the text
    /// would go to whatever has it), `Some(true)` once typed.
    pub fn type_text(
        &mut self,
        selector: &str,
        text: &str,
        deadline: Instant,
    ) -> Result<Option<bool>, CdpError> {
        let focused = self.evaluate_isolated(
            &format!(
                "(() => {{ const e = document.querySelector({}); if (!e) return null; \
                 e.focus(); return document.activeElement === e; }})()",
                js_string(selector)
            ),
            deadline,
        )?;
        if focused != true {
            return Ok(focused.as_bool().map(|_| false));
        }
        self.page_call("Input.insertText", json!({"text": text}), deadline)?;
        Ok(Some(true))
    }

    /// Puts `value` into the text field `selector` matches, in place of
    /// what it held, as typing would (input events); the page's fields are
    /// drawn as dots for every screenshot from then on. The page's origin
    /// is part of the answer.
    pub fn fill_secret(
        &mut self,
        selector: &str,
        value: &str,
        deadline: Instant,
    ) -> Result<Filled, CdpError> {
        let found = self.evaluate_isolated(
            &format!(
                "(() => {{ const e = document.querySelector({}); if (!e) return null; \
                 const kind = e.tagName.toLowerCase() + (e.type ? ' type=' + e.type : ''); \
                 const text = e.tagName === 'TEXTAREA' || (e.tagName === 'INPUT' && \
                 !['button', 'checkbox', 'color', 'file', 'hidden', 'image', 'radio', 'range', \
                 'reset', 'submit'].includes(e.type)); \
                 if (!text || e.disabled || e.readOnly) return kind.slice(0, 64); \
                 e.focus(); e.value = ''; return document.activeElement === e; }})()",
                js_string(selector)
            ),
            deadline,
        )?;
        match found {
            Value::Null => Ok(Filled::NoMatch),
            Value::Bool(true) => {
                self.page_call("Input.insertText", json!({"text": value}), deadline)?;
                Ok(Filled::Filled)
            }
            Value::String(kind) => Ok(Filled::NotAField(kind)),
            _ => Ok(Filled::NotAField("an element that takes no focus".into())),
        }
    }

    /// Chooses `value` (an option's value, or its text) in the `<select>`
    /// `selector` matches, as a person would (input and change events):
    /// the option chosen, if one was.
    pub fn select(
        &mut self,
        selector: &str,
        value: &str,
        deadline: Instant,
    ) -> Result<Option<String>, CdpError> {
        let chosen = self.evaluate_isolated(
            &format!(
                "(() => {{ const e = document.querySelector({}); const v = {}; \
                 if (!e || e.tagName !== 'SELECT') return null; \
                 const o = [...e.options].find(o => o.value === v) || \
                 [...e.options].find(o => o.text.trim() === v); if (!o) return null; \
                 e.value = o.value; \
                 e.dispatchEvent(new Event('input', {{bubbles: true}})); \
                 e.dispatchEvent(new Event('change', {{bubbles: true}})); return o.value.slice(0, 512); }})()",
                js_string(selector),
                js_string(value)
            ),
            deadline,
        )?;
        Ok(chosen.as_str().map(str::to_owned))
    }

    /// Waits until `selector` matches or the page's text holds `text`.
    pub fn wait_for(
        &mut self,
        selector: Option<&str>,
        text: Option<&str>,
        deadline: Instant,
    ) -> Result<bool, CdpError> {
        // Once a secret is in the page, a text is looked for in the page's
        // text as a result would show it (scrubbed), here rather than in
        // the page: a probe for part of a secret the page shows finds
        // nothing.
        let scrubbed = text.filter(|_| !self.filled.is_empty());
        let check = format!(
            "(() => {{ const s = {}; const t = {}; \
             if (s !== null && document.querySelector(s)) return true; \
             if (t !== null && document.body && document.body.innerText.includes(t)) return true; \
             return {}; }})()",
            js_string_or_null(selector),
            js_string_or_null(text.filter(|_| scrubbed.is_none())),
            if scrubbed.is_some() {
                "document.body ? document.body.innerText : ''"
            } else {
                "false"
            }
        );
        loop {
            match self.evaluate(&check, deadline)? {
                Value::Bool(true) => return Ok(true),
                Value::String(page) => {
                    if let Some(t) = scrubbed
                        && self.filled.text(&page).contains(t)
                    {
                        return Ok(true);
                    }
                }
                _ => {}
            }
            if Instant::now() + Duration::from_millis(100) >= deadline {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A JavaScript expression's value (by value).
    pub fn evaluate(&mut self, expression: &str, deadline: Instant) -> Result<Value, CdpError> {
        self.evaluate_in(expression, None, deadline)
    }

    /// [`Session::evaluate`] in a world of Moat's own on the page's main
    /// frame: the page's DOM, but not its scripts' globals or their changes
    /// to the DOM's prototypes, so a page cannot make an element describe
    /// itself as another, nor move where a step acts (its own
    /// `getBoundingClientRect`, `focus` or `elementFromPoint`).
    pub fn evaluate_isolated(
        &mut self,
        expression: &str,
        deadline: Instant,
    ) -> Result<Value, CdpError> {
        let world = self.page_call(
            "Page.createIsolatedWorld",
            json!({"frameId": self.frame, "worldName": "moat", "grantUniveralAccess": false}),
            deadline,
        )?;
        let context = world["executionContextId"]
            .as_i64()
            .ok_or_else(|| CdpError::Malformed("no context for Moat's world".into()))?;
        self.evaluate_in(expression, Some(context), deadline)
    }

    fn evaluate_in(
        &mut self,
        expression: &str,
        context: Option<i64>,
        deadline: Instant,
    ) -> Result<Value, CdpError> {
        let mut params = json!({"expression": expression, "returnByValue": true});
        if let Some(context) = context {
            params["contextId"] = context.into();
        }
        let answer = self.page_call("Runtime.evaluate", params, deadline)?;
        if let Some(exception) = answer.get("exceptionDetails") {
            return Err(CdpError::Refused {
                method: "Runtime.evaluate".into(),
                message: exception["text"].as_str().unwrap_or("exception").to_owned(),
            });
        }
        Ok(answer["result"]["value"].clone())
    }

    /// A PNG of the page. Once a secret is in the page, every text field is
    /// drawn as dots first (whatever its type: a page's "show password"
    /// makes a password field a text field).
    pub fn screenshot(&mut self, deadline: Instant) -> Result<Vec<u8>, CdpError> {
        use base64::Engine as _;
        if !self.filled.is_empty() {
            self.evaluate(MASK_FIELDS, deadline)?;
        }
        let shot = self.page_call("Page.captureScreenshot", json!({"format": "png"}), deadline)?;
        base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap_or_default())
            .map_err(|e| CdpError::Malformed(format!("a screenshot: {e}")))
    }

    /// Ends the browser and reports what its keeper recorded. The browser
    /// is asked to close; a keeper that does not report in time is killed,
    /// and its sandbox with it.
    pub fn close(mut self) -> Ended {
        let deadline = self.deadline(CLOSE_WAIT);
        let _ = self.cdp.call("Browser.close", json!({}), None, deadline);
        let report = read_until(&mut self.ended, deadline);
        let keeper = self.keeper.take();
        match report {
            Ok(bytes) if !bytes.is_empty() => {
                if let Some(keeper) = keeper {
                    keeper.wait();
                }
                serde_json::from_slice(&bytes).unwrap_or_else(|e| Ended {
                    error: Some(format!("the keeper's report: {e}")),
                    ..Ended::default()
                })
            }
            Ok(_) => {
                // The end of its pipe: the keeper is gone, or going.
                let status = keeper.map_or(String::new(), |k| format!(" (status {})", k.wait()));
                Ended {
                    error: Some(format!(
                        "the browser's keeper ended without a report{status}"
                    )),
                    ..Ended::default()
                }
            }
            Err(e) => {
                // Dropping the keeper kills it; its sandbox dies with it.
                drop(keeper);
                Ended {
                    error: Some(format!("the browser's keeper: {e}")),
                    ..Ended::default()
                }
            }
        }
    }
}

/// The document's response as a navigation saw it.
#[derive(Debug, Default)]
pub struct Loaded {
    pub status: Option<u64>,
    /// The egress proxy's refusal (`x-moat-denied`), when it refused.
    pub denied: Option<String>,
    /// Chromium's own error (`net::ERR_...`), when nothing loaded.
    pub error: Option<String>,
}

/// `text` as a JavaScript string literal (JSON's is one).
pub fn js_string(text: &str) -> String {
    Value::from(text).to_string()
}

fn js_string_or_null(text: Option<&str>) -> String {
    text.map_or_else(|| "null".to_owned(), js_string)
}

fn header(headers: &Value, name: &str) -> Option<String> {
    headers.as_object().and_then(|map| {
        map.iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .and_then(|(_, value)| value.as_str().map(str::to_owned))
    })
}

/// Chromium, headless, its own sandbox off (it cannot nest in Moat's: the
/// namespaces, seccomp and Landlock of Moat's sandbox stand in its place),
/// DevTools over fds 3 and 4 only, every request through the egress proxy
/// (loopback too: no implicit bypass), nothing phoned home.
/// The profile is named after the sandbox, so a leftover is found by it.
pub fn chromium_argv(sandbox_id: &str) -> Vec<String> {
    let profile = format!("--user-data-dir=/tmp/moat-browser-{sandbox_id}");
    [
        CHROMIUM,
        "--headless=new",
        "--no-sandbox",
        "--remote-debugging-pipe",
        profile.as_str(),
        "--proxy-server=http://127.0.0.1:3128",
        "--proxy-bypass-list=<-loopback>",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-breakpad",
        "--disable-features=Translate,OptimizationHints,MediaRouter",
        "--metrics-recording-only",
        "--mute-audio",
        "about:blank",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

/// The keeper: runs the browser's sandbox to its end, then writes what it
/// recorded to `ended`.
fn keep_browser(
    spec: SandboxSpec,
    vm: Option<moat_sandbox::microvm::VmOptions>,
    config: EgressConfig,
    policy: EgressPolicy,
    ended: OwnedFd,
) -> i32 {
    let mut events: Vec<Event> = Vec::new();
    let mut egress = crate::egress::OneRunEgress::new(config, policy);
    let ran = match &vm {
        Some(vm) => moat_sandbox::microvm::run(
            spec,
            vm,
            OutputMode::Capture,
            &mut events,
            Some(&mut egress),
        ),
        None => {
            moat_sandbox::run_with_egress(spec, OutputMode::Capture, &mut events, Some(&mut egress))
        }
    };
    let report = match ran {
        Ok(outcome) => {
            let stderr = String::from_utf8_lossy(&outcome.stderr);
            let tail: String = stderr
                .lines()
                .rev()
                .take(20)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n");
            Ended {
                events,
                exit_code: Some(outcome.report.exit_code),
                stderr_tail: tail,
                error: None,
            }
        }
        Err(e) => Ended {
            events,
            error: Some(e.to_string()),
            ..Ended::default()
        },
    };
    let mut ended = File::from(ended);
    match serde_json::to_vec(&report) {
        Ok(bytes) if ended.write_all(&bytes).is_ok() => 0,
        _ => 1,
    }
}

/// Everything `file` holds until its writer closes it, by `deadline`.
fn read_until(file: &mut File, deadline: Instant) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    loop {
        if !super::cdp::readable(file, deadline)? {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no report in time",
            ));
        }
        let mut chunk = [0u8; 64 << 10];
        let n = file.read(&mut chunk)?;
        if n == 0 {
            return Ok(bytes);
        }
        bytes.extend_from_slice(&chunk[..n]);
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // A session dropped without `close` (the shell ending): the keeper
        // is killed, and the browser's sandbox with it.
        drop(self.keeper.take());
    }
}
