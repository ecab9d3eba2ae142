//! The Inspector's HTML, as `maud` templates: every value put into a page
//! is escaped by construction (only [`PreEscaped`] could opt out, and
//! nothing here uses it). Ids and selectors follow what
//! `tests/inspector/walkthrough.mjs` drives.

use maud::{DOCTYPE, Markup, html};
use moat_core::size::format_size;
use moat_core::text::clip as truncate;
use moat_core::url::encode_component as seg;
use moat_ledger::StoredEvent;
use moat_store::{
    ApprovalRow, ArtifactRow, ManifestRow, OpRow, OpState, Page, QuarantineRow, RunRow, RunState,
    RunnerRow, UsageDay, stamp,
};
use serde_json::Value;

/// Events rendered with a run page (later ones arrive live).
pub const EVENTS_SHOWN: i64 = 1000;

const NAV: [(&str, &str, &str); 6] = [
    ("runs", "/ui/runs", "Runs"),
    ("approvals", "/ui/approvals", "Approvals"),
    ("runners", "/ui/runners", "Runners"),
    ("capacity", "/ui/capacity", "Capacity"),
    ("usage", "/ui/usage", "Usage"),
    ("ledger", "/ui/ledger", "Ledger"),
];

fn layout(title: &str, here: &str, body: Markup) -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Moat Inspector" }
                link rel="stylesheet" href="/ui/assets/style.css";
            }
            body {
                header {
                    span.brand { "MOAT" }
                    @if !here.is_empty() {
                        @for (key, href, label) in NAV {
                            a href=(href) class=[(key == here).then_some("here")] { (label) }
                        }
                        form method="post" action="/ui/logout" {
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                main { (body) }
                script src="/ui/assets/live.js" {}
            }
        }
    }
    .into_string()
}

fn state_badge(state: &str) -> Markup {
    html! { span class={ "state " (state) } { (state) } }
}

pub fn error(message: &str) -> String {
    layout(
        "Error",
        "runs",
        html! {
            h1 { "Not possible" }
            p.error { (message) }
        },
    )
}

pub fn login(problem: Option<&str>) -> String {
    layout(
        "Sign in",
        "",
        html! {
            form #login .login method="post" action="/ui/login" {
                h1 { "Moat Inspector" }
                @if let Some(problem) = problem {
                    p.error { (problem) }
                }
                label for="token" { "Org admin token" }
                input #token name="token" type="password" autocomplete="off" required;
                button type="submit" { "Sign in" }
                p.muted { "The token stays in an HttpOnly cookie for this site only." }
            }
        },
    )
}

pub fn runs(rows: &[RunRow], filter: Option<RunState>) -> String {
    layout(
        "Runs",
        "runs",
        html! {
            h1 { "Runs" }
            form #run-filter .inline method="get" action="/ui/runs" {
                select name="state" {
                    option value="all" { "all states" }
                    @for state in RunState::ALL {
                        option value=(state.as_str()) selected[filter == Some(state)] {
                            (state.as_str())
                        }
                    }
                }
                button type="submit" { "Filter" }
            }
            p.muted { (rows.len()) " shown, newest first." }
            table #runs {
                thead { tr {
                    th { "Run" } th { "State" } th { "Runner" } th { "Manifest" }
                    th { "Attempts" } th { "Created" } th { "Updated" }
                } }
                tbody {
                    @for r in rows {
                        tr data-run-id=(r.id) {
                            td { a.run-link href={ "/ui/runs/" (seg(&r.id)) } { (r.id) } }
                            td { (state_badge(r.state.as_str())) }
                            td { code { (r.runner_id.as_deref().unwrap_or("-")) } }
                            td { code { (short(r.manifest_hash.as_deref().unwrap_or("-"))) } }
                            td { (r.attempts) "/" (r.max_attempts) }
                            td { (stamp(r.created_ms)) }
                            td { (stamp(r.updated_ms)) }
                        }
                    }
                }
            }
        },
    )
}

fn short(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The first of `values` that is not empty.
fn first_text(values: [&Value; 2]) -> String {
    values
        .into_iter()
        .map(text)
        .find(|t| !t.is_empty())
        .unwrap_or_default()
}

fn op_item(o: &OpRow) -> Markup {
    let denied = matches!(o.state, OpState::Denied | OpState::Failed)
        || o.result.as_ref().is_some_and(|r| r["status"] == "denied");
    let decision = &o.decision;
    let policies: Vec<String> = decision["policies"]
        .as_array()
        .map(|p| p.iter().map(text).collect())
        .unwrap_or_default();
    let (reason, message) = o.result.as_ref().map_or_else(Default::default, |r| {
        (
            first_text([&r["reason"], &r["error"]["reason"]]),
            first_text([&r["message"], &r["error"]["message"]]),
        )
    });
    let exit = o
        .result
        .as_ref()
        .and_then(|r| r["result"]["exitCode"].as_i64());
    // What the sandbox refused the program (the blocked-access result).
    let blocked: Vec<String> = o
        .result
        .as_ref()
        .and_then(|r| r["result"]["blocked"].as_array())
        .map(|lines| lines.iter().map(text).collect())
        .unwrap_or_default();
    let class = if denied {
        format!("op {} denied", o.state.as_str())
    } else {
        format!("op {}", o.state.as_str())
    };
    // The workload class decided for its program, and the accelerator
    // its virtual machine ran under.
    let workload = decision["class"].as_str().map(|c| {
        let accelerator = o
            .result
            .as_ref()
            .and_then(|r| r["result"]["vm"]["accelerator"].as_str());
        match accelerator {
            Some(a) => format!("{c} ({a})"),
            None => c.to_owned(),
        }
    });
    // The network its program asked for, and the ports it serves (reached
    // through the run's ports route while it runs).
    let args = &o.envelope["args"];
    let network = first_text([&args["network"], &o.envelope["network"]]);
    let ports: Vec<String> = args["expose"]
        .as_array()
        .map(|p| p.iter().map(text).collect())
        .unwrap_or_default();
    html! {
        li class=(class) data-op-id=(o.id) data-state=(o.state.as_str()) {
            span.muted { "#" (o.n) " " (o.id) }
            " " (state_badge(o.state.as_str())) " "
            strong { (o.op) } " " code { (text(&decision["resource"])) }
            " · decision " (text(&decision["decision"]))
            @if !policies.is_empty() {
                " by " code { (policies.join(", ")) }
            }
            @if let Some(workload) = &workload {
                " · in " span.class data-class=(workload) { (workload) }
            }
            @if !network.is_empty() && network != "off" {
                " · network " span.network data-network=(network) { (network) }
            }
            @if !ports.is_empty() {
                " · ports " span.ports data-ports=(ports.join(",")) {
                    @for (i, port) in ports.iter().enumerate() {
                        @if i > 0 { ", " }
                        @if o.state == OpState::Dispatched {
                            code { "/v1/runs/" (o.run_id) "/ports/" (port) "/" }
                        } @else {
                            (port)
                        }
                    }
                }
            }
            @if !reason.is_empty() {
                div.reason { (reason) }
                div.muted { (message) }
            } @else if let Some(code) = exit {
                " · exit " (code)
            }
            @if !blocked.is_empty() {
                ul.blocked {
                    @for line in &blocked { li { "blocked: " (line) } }
                }
            }
            @if o.state == OpState::PendingApproval {
                " · " a href="/ui/approvals" { "waiting for an approval" }
            }
        }
    }
}

fn event_item(e: &StoredEvent) -> Markup {
    let reason = first_text([&e.event.data["reason"], &e.event.data["message"]]);
    let mut line = format!("{}  {}", e.event.at, e.event.event_type.as_str());
    if let Some(op) = &e.event.op_id {
        line.push_str(&format!("  op {op}"));
    }
    if !reason.is_empty() {
        line.push_str(&format!("  reason {reason}"));
    }
    line.push_str(&event_detail(&e.event));
    html! {
        li.event data-type=(e.event.event_type.as_str()) data-seq=(e.seq) { (line) }
    }
}

/// What a worker's events say beyond their type: the binding call and its
/// outcome, the queue message and its step.
fn event_detail(event: &moat_core::Event) -> String {
    let d = &event.data;
    let s = |v: &serde_json::Value| v.as_str().unwrap_or("").to_owned();
    match event.event_type {
        moat_core::EventType::WorkerBinding => format!(
            "  {}.{} {} {}",
            s(&d["binding"]),
            s(&d["call"]),
            s(&d["name"]),
            s(&d["outcome"])
        ),
        moat_core::EventType::QueueMessage => format!(
            "  queue {} message {} {} (attempt {})",
            s(&d["queue"]),
            s(&d["messageId"]),
            s(&d["state"]),
            d["attempt"]
        ),
        _ => String::new(),
    }
}

/// What a run used, from its `run.usage` event (recorded as it ended).
fn run_usage(events: &Page) -> Markup {
    let Some(usage) = events
        .events
        .iter()
        .find(|e| e.event.event_type == moat_core::EventType::RunUsage)
    else {
        return html! {};
    };
    let d = &usage.event.data;
    let n = |key: &str| d[key].as_u64().unwrap_or(0);
    let ops: Vec<String> = d["ops"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(state, count)| format!("{count} {state}"))
        .collect();
    html! {
        h2 { "Usage" }
        dl #run-usage {
            dt { "Operations" } dd { @if ops.is_empty() { "none" } @else { (ops.join(", ")) } }
            dt { "Programs" } dd { (n("programs")) }
            dt { "CPU" } dd { (n("cpuMs")) " ms" }
            dt { "Program time" } dd { (n("programWallMs")) " ms" }
            dt { "Peak memory" } dd { (format_size(n("peakMemoryBytes"))) }
            dt { "Peak processes" } dd { (n("peakPids")) }
            dt { "Egress" } dd {
                (n("egressRequests")) " requests, " (format_size(n("egressBytesOut"))) " out, "
                (format_size(n("egressBytesIn"))) " in"
            }
            dt { "Written (under a storage budget)" } dd { (format_size(n("bytesWritten"))) }
            dt { "Refused by the sandbox" } dd { (n("violations")) }
        }
    }
}

fn seconds(ms: u64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}

/// The org's usage, day by day (runs counted on the day they ended).
pub fn usage(days: &[UsageDay]) -> String {
    layout(
        "Usage",
        "usage",
        html! {
            h1 { "Usage" }
            p.muted { "By the UTC day runs ended; a run counts once, with everything it used." }
            table #usage {
                thead { tr {
                    th { "Day" } th { "Runs" } th { "Operations" } th { "Not succeeded" }
                    th { "Programs" } th { "CPU" } th { "Program time" } th { "Peak memory" }
                    th { "Egress requests" } th { "Egress out / in" } th { "Written (budgeted)" }
                    th { "Refused" }
                } }
                tbody {
                    @if days.is_empty() {
                        tr { td colspan="12" .muted { "no run has ended yet" } }
                    }
                    @for d in days {
                        tr.day data-day=(d.day) {
                            td { (d.day) } td.runs { (d.runs) } td { (d.ops) } td { (d.ops_failed) }
                            td { (d.programs) } td { (seconds(d.cpu_ms)) }
                            td { (seconds(d.program_wall_ms)) }
                            td { (format_size(d.peak_memory_bytes)) }
                            td { (d.egress_requests) }
                            td { (format_size(d.egress_bytes_out)) " / " (format_size(d.egress_bytes_in)) }
                            td { (format_size(d.bytes_written)) }
                            td.violations { (d.violations) }
                        }
                    }
                }
            }
        },
    )
}

/// What the capacity page shows: the org's hosts and runners, its quota
/// and use, and its CPU time by day against the quota.
pub struct CapacityPage<'a> {
    pub capacity: &'a moat_api::org::Capacity,
    pub quota: &'a moat_api::org::QuotaView,
    /// Newest first, as the store gives them.
    pub days: &'a [UsageDay],
}

fn millicores(m: i64) -> String {
    if m == 0 {
        "not said".into()
    } else {
        format!("{}.{:03}", m / 1000, m % 1000)
    }
}

fn bytes_or_unsaid(n: i64) -> String {
    if n == 0 {
        "not said".into()
    } else {
        format_size(u64::try_from(n).unwrap_or(0))
    }
}

/// Days the chart shows.
const CHART_DAYS: usize = 14;

/// CPU seconds by day as bars, with the quota (when per day) as a line.
fn cpu_chart(days: &[UsageDay], quota: Option<u64>) -> Markup {
    let shown: Vec<&UsageDay> = days.iter().take(CHART_DAYS).collect::<Vec<_>>();
    let shown: Vec<&UsageDay> = shown.into_iter().rev().collect();
    let secs = |d: &UsageDay| d.cpu_ms / 1000;
    let top = shown
        .iter()
        .map(|d| secs(d))
        .chain(quota)
        .max()
        .unwrap_or(0)
        .max(1);
    let (width, height, bar) = (560u64, 160u64, 36u64);
    // u128: a quota may be any u64.
    let y = |v: u64| {
        let drawn = u128::from(v.min(top)) * u128::from(height - 20) / u128::from(top);
        height - u64::try_from(drawn).unwrap_or(height - 20)
    };
    html! {
        svg #cpu-chart width=(width) height=(height + 20) role="img"
            aria-label="CPU seconds by day against the quota" {
            @for (i, d) in shown.iter().enumerate() {
                @let x = 10 + (i as u64) * (bar + 4);
                rect.bar data-day=(d.day) data-cpu-seconds=(secs(d))
                    x=(x) y=(y(secs(d))) width=(bar) height=(height - y(secs(d))) fill="#4a7" {
                    title { (d.day) ": " (secs(d)) " CPU s" }
                }
                text x=(x) y=(height + 14) font-size="9" { (d.day.get(5..).unwrap_or(&d.day)) }
            }
            @if let Some(q) = quota {
                line #quota-line data-quota=(q) x1="0" x2=(width) y1=(y(q)) y2=(y(q))
                    stroke="#c33" stroke-dasharray="4 3" {}
                text x=(width - 120) y=(y(q).saturating_sub(4)) font-size="10" fill="#c33" {
                    "quota " (q) " CPU s/day"
                }
            }
        }
    }
}

pub fn capacity(page: &CapacityPage<'_>) -> String {
    let quota = page.quota.quota.as_ref();
    let used = &page.quota.used;
    let per_day_cpu = quota
        .filter(|q| q.period == moat_core::quota::QuotaPeriod::Day)
        .and_then(|q| q.cpu_seconds);
    let limit = |n: Option<u64>| n.map_or_else(|| "no limit".to_owned(), |n| n.to_string());
    layout(
        "Capacity",
        "capacity",
        html! {
            h1 { "Capacity" }
            p.muted {
                "Hosts your runners are on: what they may hand out to runs and what your runs "
                "hold now. Other orgs' runners on a host are counted, not named."
            }
            table #hosts {
                thead { tr {
                    th { "Host" } th { "Runner" } th { "Slots" } th { "CPU reserved / has" }
                    th { "Memory reserved / has" } th { "Classes" } th { "Labels" }
                    th { "Kernel" } th { "Other tenants" } th { "State" }
                } }
                tbody {
                    @if page.capacity.hosts.is_empty() {
                        tr { td colspan="10" .muted { "no runner has registered" } }
                    }
                    @for h in &page.capacity.hosts {
                        @for r in &h.runners {
                            tr.runner data-host=(h.host_id) data-runner-id=(r.id) {
                                td { code { (h.host_id) } }
                                td { code { (r.id) } }
                                td.slots { (r.slots_used) " / " (r.slots) }
                                td.cpu { (millicores(r.cpu_reserved)) " / " (millicores(r.cpu_millis)) }
                                td.memory {
                                    (format_size(u64::try_from(r.memory_reserved).unwrap_or(0)))
                                    " / " (bytes_or_unsaid(r.memory_bytes))
                                }
                                td { (moat_core::WorkloadClass::names(&r.workload_classes)) }
                                td { @for (k, v) in &r.labels { code { (k) "=" (v) } " " } }
                                td { (r.kernel.as_deref().unwrap_or("-")) }
                                td.other-tenants { (h.other_tenants.unwrap_or(0)) }
                                td { @if r.draining { span.state.cancelled { "draining" } } @else { "serving" } }
                            }
                        }
                    }
                }
            }
            h2 { "Quota" }
            @if let Some(exceeded) = &page.quota.exceeded {
                p #quota-exceeded .error { (exceeded) ": new runs "
                    (if quota.is_some_and(|q| q.over == moat_core::quota::OverQuota::Refuse) { "are refused" } else { "wait" }) }
            }
            table #quota {
                thead { tr { th { "Quota" } th { "Used" } th { "Limit" } } }
                tbody {
                    tr data-quota="concurrent_runs" { td { "Runs held now" } td { (used.concurrent_runs) } td { (limit(quota.and_then(|q| q.concurrent_runs))) } }
                    tr data-quota="cpu_seconds" { td { "CPU seconds this " (quota.map_or("day", |q| q.period.as_str())) } td { (used.cpu_ms / 1000) } td { (limit(quota.and_then(|q| q.cpu_seconds))) } }
                    tr data-quota="storage_bytes" { td { "Storage written" } td { (format_size(used.storage_bytes)) } td { (quota.and_then(|q| q.storage_bytes).map_or_else(|| "no limit".to_owned(), format_size)) } }
                    tr data-quota="egress_bytes" { td { "Egress" } td { (format_size(used.egress_bytes)) } td { (quota.and_then(|q| q.egress_bytes).map_or_else(|| "no limit".to_owned(), format_size)) } }
                }
            }
            h2 { "CPU by day" }
            p.muted { "CPU time of the programs of runs that ended each UTC day"
                @if per_day_cpu.is_some() { ", against the daily quota" } "." }
            (cpu_chart(page.days, per_day_cpu))
        },
    )
}

/// A run, and why it waits when nothing could claim it.
pub struct RunPage<'a> {
    pub run: &'a RunRow,
    pub waiting: Option<&'a str>,
}

/// The classes of a set stored as bits, named.
fn class_names(mask: i64) -> String {
    match moat_core::WorkloadClass::names(&moat_core::WorkloadClass::from_mask(mask)) {
        names if names.is_empty() => "any".into(),
        names => names,
    }
}

pub fn run(
    page: &RunPage<'_>,
    ops: &[OpRow],
    events: &Page,
    artifacts: &[ArtifactRow],
    quarantined: &[QuarantineRow],
) -> String {
    let run = page.run;
    layout(
        &format!("Run {}", run.id),
        "runs",
        html! {
            h1 {
                "Run " code { (run.id) } " "
                span #run-state class={ "state " (run.state.as_str()) } { (run.state.as_str()) }
            }
            dl {
                dt { "Environment" } dd { (run.environment) }
                dt { "Runner" } dd { code { (run.runner_id.as_deref().unwrap_or("-")) } }
                dt { "Manifest" } dd { code { (run.manifest_hash.as_deref().unwrap_or("-")) } }
                dt { "Attempts" } dd { (run.attempts) "/" (run.max_attempts) }
                dt { "Workload classes" } dd #run-classes { (class_names(run.needs_classes)) }
                dt { "Volumes" } dd #run-volumes {
                    @if run.volumes.is_empty() { "-" }
                    @for v in &run.volumes {
                        div.volume data-volume=(v.volume) {
                            code { (v.volume) } " at " code { (v.path) }
                            (if v.read_only { " (ro)" } else { " (rw)" })
                            " · from " (v.start_snapshot.as_deref().map_or("empty", short))
                            " · now " (v.snapshot.as_deref().map_or("empty", short))
                        }
                    }
                }
                dt { "Created" } dd { (stamp(run.created_ms)) }
                dt { "Error" } dd { (run.error.as_deref().unwrap_or("-")) }
                @if let Some(why) = page.waiting {
                    dt { "Waiting" } dd #run-waiting .reason { (why) }
                }
            }
            @if !run.state.is_final() {
                form #cancel-run .inline method="post"
                    action={ "/ui/runs/" (seg(&run.id)) "/cancel" } {
                    button type="submit" { "Cancel run" }
                }
            }
            div.grid {
                section {
                    h2 { "Timeline" }
                    ol #timeline {
                        @if ops.is_empty() {
                            li.muted { "no operations yet" }
                        }
                        @for o in ops { (op_item(o)) }
                    }
                }
                section {
                    h2 { "Events " span.muted { "(live)" } }
                    ul #events data-stream={ "/ui/runs/" (seg(&run.id)) "/events" }
                        data-last=(events.last_seq) {
                        @for e in &events.events { (event_item(e)) }
                    }
                }
            }
            (run_usage(events))
            (browser_sessions(ops))
            h2 { "Artifacts" }
            table #artifacts {
                thead { tr {
                    th { "Kind" } th { "Label" } th { "Op" } th { "Size" } th { "SHA-256" } th {}
                } }
                tbody {
                    @for a in artifacts {
                        tr.artifact {
                            td { (a.kind) } td { (a.label) } td { (a.op_id) } td { (a.size) }
                            td { code.sha256 { (a.sha256) } }
                            td { a.download download href={ "/ui/artifacts/" (a.sha256) } { "download" } }
                        }
                    }
                }
            }
            @if !quarantined.is_empty() {
                h2 { "Held back at the export boundary" }
                p.muted {
                    "Files programs wrote that did not pass: what was judged and why. Their bytes are not kept; they cannot be downloaded."
                }
                table #quarantine {
                    thead { tr {
                        th { "Path" } th { "Op" } th { "Size" } th { "SHA-256" } th { "Why" }
                    } }
                    tbody {
                        @for q in quarantined {
                            tr.rejected {
                                td { code { (q.path) } } td { (q.op_id) } td { (q.size) }
                                td { code { (q.sha256.as_deref().map(|s| truncate(s, 16)).unwrap_or_default()) } }
                                td { ul.reasons {
                                    @for r in &q.reasons {
                                        li { code { (r.rule.as_str()) } " " (r.detail) }
                                    }
                                } }
                            }
                        }
                    }
                }
            }
        },
    )
}

/// The SHA-256 of the screenshot a browser step answered with, if any.
fn step_screenshot(o: &OpRow) -> Option<String> {
    let sha = o.result.as_ref()?["result"]["screenshot"]["sha256"].as_str()?;
    (sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit())).then(|| sha.to_owned())
}

/// The last screenshot session `session` of these operations took: what
/// its page showed when a step of it was asked for.
pub fn last_screenshot(ops: &[OpRow], session: &Value) -> Option<String> {
    ops.iter()
        .rev()
        .filter(|o| o.op == "browser_step" && &o.envelope["args"]["sessionId"] == session)
        .find_map(step_screenshot)
}

fn screenshot_img(sha: &str, alt: &str) -> Markup {
    html! {
        a href={ "/ui/artifacts/" (sha) } {
            img.screenshot src={ "/ui/screenshots/" (sha) } alt=(alt) width="320" height="200";
        }
    }
}

/// The run's browser sessions (its `browser_step` operations by session,
/// in order), each step with what it was asked, what it answered and the
/// screenshot it took.
fn browser_sessions(ops: &[OpRow]) -> Markup {
    let mut sessions: Vec<(String, Vec<&OpRow>)> = Vec::new();
    for o in ops.iter().filter(|o| o.op == "browser_step") {
        let id = text(&o.envelope["args"]["sessionId"]);
        match sessions.iter_mut().find(|(s, _)| *s == id) {
            Some((_, steps)) => steps.push(o),
            None => sessions.push((id, vec![o])),
        }
    }
    if sessions.is_empty() {
        return html! {};
    }
    html! {
        h2 { "Browser sessions" }
        div #browser-sessions {
            @for (id, steps) in &sessions {
                section.session data-session=(id) {
                    h3 { "Session " code { (id) } }
                    ol.steps {
                        @for o in steps { (browser_step_item(o)) }
                    }
                }
            }
        }
    }
}

fn browser_step_item(o: &OpRow) -> Markup {
    let args = &o.envelope["args"];
    let action = text(&args["action"]);
    // What it acted on: a URL, a selector, a text waited for.
    let target = first_text([&args["url"], &args["selector"]]);
    let target = if target.is_empty() {
        text(&args["text"])
    } else {
        target
    };
    let answer = o.result.as_ref().map(|r| &r["result"]);
    let page = answer.map(|a| text(&a["title"]));
    let (reason, message) = o.result.as_ref().map_or_else(Default::default, |r| {
        (
            first_text([&r["reason"], &r["error"]["reason"]]),
            first_text([&r["message"], &r["error"]["message"]]),
        )
    });
    html! {
        li.step data-op-id=(o.id) data-action=(action) {
            strong { (action) } " "
            @if !target.is_empty() { code { (truncate(&target, 200)) } " " }
            @if let Some(secret) = args["secret"].as_str() { "secret " code { (secret) } " " }
            (state_badge(o.state.as_str()))
            @if let Some(page) = page.filter(|p| !p.is_empty()) {
                div.page { (truncate(&page, 200)) }
            }
            @if let Some(url) = answer.and_then(|a| a["url"].as_str()) {
                div.muted { code { (truncate(url, 300)) } }
            }
            @if let Some(matched) = answer.and_then(|a| a["matched"].as_bool()) {
                div.muted { (if matched { "matched" } else { "nothing matched" }) }
            }
            @if let Some(e) = answer.map(|a| &a["element"]).filter(|e| e.is_object()) {
                div.element.muted { "on " (element_line(e)) }
            }
            @if !reason.is_empty() || !message.is_empty() {
                div.reason { (reason) " " (truncate(&message, 300)) }
            }
            @if let Some(sha) = step_screenshot(o) {
                (screenshot_img(&sha, &format!("the page after {action}")))
            }
        }
    }
}

/// What an acting browser step acts on: `<button type=submit> "Send"`,
/// the form it sends and how, or a link's target.
fn element_line(e: &Value) -> Markup {
    html! {
        code { "<" (text(&e["tag"]))
            @if !text(&e["type"]).is_empty() { " type=" (text(&e["type"])) } ">" }
        @if !text(&e["text"]).is_empty() { " \u{201c}" (truncate(&text(&e["text"]), 80)) "\u{201d}" }
        @if !text(&e["formMethod"]).is_empty() {
            @if e["submits"] == true { ", sending" } @else { ", in" }
            " a " (text(&e["formMethod"]).to_uppercase()) " form to "
            code { (truncate(&text(&e["formAction"]), 200)) }
        }
        @if !text(&e["href"]).is_empty() { " to " code { (truncate(&text(&e["href"]), 200)) } }
    }
}

/// An export's request: the file, its type and size, the checks it
/// passed, and the start of it when it is text.
fn export_request(a: &ApprovalRow, preview: Option<&(String, bool)>) -> Markup {
    let args = &a.summary["args"];
    html! {
        div.export {
            strong { "export" } " "
            code.path { (text(&args["path"])) }
            " → " (text(&args["destination"]))
            div.muted {
                (text(&args["type"])) ", " (args["size"].as_u64().unwrap_or(0)) " bytes, sha256 "
                code { (truncate(&text(&args["sha256"]), 16)) }
            }
            ul.checks {
                @for check in args["checks"].as_array().into_iter().flatten() {
                    li { (text(check)) }
                }
            }
            @if let Some((preview, cut)) = preview {
                pre.preview { (preview) }
                @if *cut { div.muted { "(the first 4 KiB)" } }
            } @else {
                div.muted { "no preview (not text)" }
            }
        }
    }
}

pub fn approvals(
    pending: &[ApprovalRow],
    recent: &[ApprovalRow],
    previews: &std::collections::HashMap<String, (String, bool)>,
    screens: &std::collections::HashMap<String, String>,
    problem: Option<&str>,
) -> String {
    layout(
        "Approvals",
        "approvals",
        html! {
            h1 { "Approvals" }
            @if let Some(problem) = problem {
                p.error { (problem) }
            }
            p.muted {
                (pending.len()) " waiting. Approving runs the operation at once (or lets an export \
                 leave); denying refuses it with your reason. Unanswered requests expire and fail \
                 closed."
            }
            table #approvals {
                thead { tr {
                    th { "Request" } th { "Run / op" } th { "Operation" } th { "Rule" }
                    th { "Risk" } th { "Expires" } th { "Decide" }
                } }
                tbody {
                    @for a in pending {
                        tr data-approval-id=(a.id) data-op-id=(a.op_id) data-state="pending" {
                            td { code { (a.id) } div.muted { (stamp(a.requested_ms)) } }
                            td { a href={ "/ui/runs/" (seg(&a.run_id)) } { (a.run_id) } " / " (a.op_id) }
                            td {
                                @if a.summary["op"] == "export" {
                                    (export_request(a, previews.get(&a.id)))
                                } @else {
                                    strong { (text(&a.summary["op"])) } " "
                                    code { (text(&a.summary["resource"])) }
                                    div.muted { code { (truncate(&a.summary["args"].to_string(), 300)) } }
                                    @if a.summary["element"].is_object() {
                                        div.element {
                                            "would act on " (element_line(&a.summary["element"]))
                                            " on " code { (truncate(&text(&a.summary["element"]["url"]), 300)) }
                                        }
                                    }
                                    @if let Some(sha) = screens.get(&a.id) {
                                        figure.page {
                                            (screenshot_img(sha, "the session's page now"))
                                            figcaption.muted { "the page as the session last showed it" }
                                        }
                                    }
                                }
                            }
                            td { code { (a.rule) } }
                            td { (state_badge(&a.risk)) }
                            td { (stamp(a.expires_ms)) }
                            td {
                                form.approve.inline method="post"
                                    action={ "/ui/approvals/" (seg(&a.id)) "/approve" } {
                                    input name="reason" placeholder="reason (optional)";
                                    button type="submit" { "Approve" }
                                }
                                form.deny.inline method="post"
                                    action={ "/ui/approvals/" (seg(&a.id)) "/deny" } {
                                    input name="reason" placeholder="reason (required)" required;
                                    button type="submit" { "Deny" }
                                }
                            }
                        }
                    }
                }
            }
            h2 { "Recently" }
            table #approval-history {
                thead { tr {
                    th { "Request" } th { "Run / op" } th { "State" } th { "By" }
                    th { "Reason" } th { "When" }
                } }
                tbody {
                    @for a in recent.iter().filter(|a| a.resolved_ms.is_some()) {
                        tr data-approval-id=(a.id) data-state=(a.state.as_str()) {
                            td { code { (a.id) } }
                            td { (a.run_id) " / " (a.op_id) }
                            td { (state_badge(a.state.as_str())) }
                            td { code { (a.resolved_by.as_deref().unwrap_or("expiry")) } }
                            td { (a.reason.as_deref().unwrap_or("")) }
                            td { (a.resolved_ms.map(stamp).unwrap_or_default()) }
                        }
                    }
                }
            }
        },
    )
}

pub fn runners(rows: &[(RunnerRow, Option<ManifestRow>)], now: i64) -> String {
    layout(
        "Runners",
        "runners",
        html! {
            h1 { "Runners" }
            table #runners {
                thead { tr {
                    th { "Runner" } th { "Build (SHA-256)" } th { "Manifest" } th { "Policy" }
                    th { "Environment" } th { "Classes" } th { "Manifest expires in" } th { "Status" }
                    th { "Slots used / free" } th { "Last seen" }
                } }
                tbody {
                    @for (r, manifest) in rows {
                        tr data-runner-id=(r.id) {
                            td {
                                code { (r.id) } div.muted { (r.version) ", " (r.sandbox_mode) }
                                @if let Some(host) = &r.host_id {
                                    div.muted.host { "host " code { (short(host)) } }
                                }
                                @for (key, value) in runner_labels(r) {
                                    span.label { (key) "=" (value) } " "
                                }
                            }
                            td { code { (short(&r.runner_hash)) } }
                            td { code { (short(&r.manifest_hash)) } }
                            td { code { (short(&r.policy_hash)) } }
                            td { (r.environment) }
                            td.classes { (class_names(r.classes)) }
                            td {
                                @if let Some(m) = manifest {
                                    span.state data-expires-ms=(m.expires_ms) { (stamp(m.expires_ms)) }
                                } @else {
                                    "-"
                                }
                            }
                            td { (state_badge(runner_status(r, manifest.as_ref(), now))) }
                            td.slots { (r.slots_used) " / " ((r.slots - r.slots_used).max(0)) }
                            td { (stamp(r.seen_ms)) }
                        }
                    }
                }
            }
        },
    )
}

/// A runner's labels, as stored (unreadable: none).
fn runner_labels(r: &RunnerRow) -> Vec<(String, String)> {
    r.labels
        .as_deref()
        .and_then(|l| serde_json::from_str::<std::collections::BTreeMap<String, String>>(l).ok())
        .map(|m| m.into_iter().collect())
        .unwrap_or_default()
}

fn runner_status(r: &RunnerRow, manifest: Option<&ManifestRow>, now: i64) -> &'static str {
    match manifest {
        Some(m) if m.revoked => "revoked",
        Some(m) if m.expires_ms <= now => "expired",
        None => "unknown manifest",
        _ if now - r.seen_ms < 60_000 => "active",
        _ => "silent",
    }
}

pub fn ledger(head: (i64, String), check: Option<super::LedgerCheck>) -> String {
    let when = |check: &super::LedgerCheck| match check.next_ms {
        None => String::new(),
        Some(next) => format!(
            " (as found at {}; the chain is re-hashed at most once every 10 s: next verification from {})",
            stamp(check.at_ms),
            stamp(next)
        ),
    };
    let status = match &check {
        None => html! { span #ledger-status .state { "not checked yet" } },
        Some(
            c @ super::LedgerCheck {
                verdict: Ok(events),
                ..
            },
        ) => html! {
            span #ledger-status .state.intact {
                "intact: " (events) " events re-hashed, chain unbroken" (when(c))
            }
        },
        Some(
            c @ super::LedgerCheck {
                verdict: Err(broken),
                ..
            },
        ) => html! {
            span #ledger-status .state.broken { "broken: " (broken) (when(c)) }
        },
    };
    layout(
        "Ledger",
        "ledger",
        html! {
            h1 { "Ledger integrity" }
            p {
                "Every event is hash-chained to the one before it; verifying re-hashes the \
                 whole chain up to its head and compares."
            }
            dl {
                dt { "Head" } dd { "#" (head.0) " " code { (head.1) } }
                dt { "Status" } dd { (status) }
            }
            form #verify method="get" action="/ui/ledger" {
                input type="hidden" name="verify" value="1";
                button type="submit" { "Verify now" }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_page_shows_is_escaped() {
        let page = error("<script>alert(1)</script> & \"quotes\"");
        assert!(!page.contains("<script>alert"), "{page}");
        assert!(
            page.contains("&lt;script&gt;alert(1)&lt;/script&gt; &amp; &quot;quotes&quot;"),
            "{page}"
        );
        let page = login(Some("\"><img src=x onerror=alert(1)>"));
        assert!(!page.contains("<img"), "{page}");
    }
}
