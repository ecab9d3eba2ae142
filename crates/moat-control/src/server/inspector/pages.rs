//! The Inspector's HTML. Every value from the database goes through
//! [`esc`]; ids and selectors follow what `tests/inspector/walkthrough.mjs`
//! drives.

use std::fmt::Write as _;

use moat_core::url::encode_component as seg;
use moat_ledger::StoredEvent;
use moat_store::{
    ApprovalRow, ArtifactRow, ManifestRow, OpRow, OpState, Page, RunRow, RunState, RunnerRow, stamp,
};
use serde_json::Value;

/// Events rendered with a run page (later ones arrive live).
pub const EVENTS_SHOWN: i64 = 1000;

/// HTML-escaped text.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn layout(title: &str, here: &str, body: &str) -> String {
    let nav = [
        ("runs", "/ui/runs", "Runs"),
        ("approvals", "/ui/approvals", "Approvals"),
        ("runners", "/ui/runners", "Runners"),
        ("ledger", "/ui/ledger", "Ledger"),
    ]
    .iter()
    .map(|(key, href, label)| {
        let class = if *key == here { " class=\"here\"" } else { "" };
        format!("<a href=\"{href}\"{class}>{label}</a>")
    })
    .collect::<String>();
    let nav = if here.is_empty() {
        String::new()
    } else {
        format!(
            "{nav}<form method=\"post\" action=\"/ui/logout\"><button type=\"submit\">Sign out</button></form>"
        )
    };
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · Moat Inspector</title><link rel=\"stylesheet\" href=\"/ui/assets/style.css\"></head>\
         <body><header><span class=\"brand\">MOAT</span>{nav}</header><main>{body}</main>\
         <script src=\"/ui/assets/live.js\"></script></body></html>",
        esc(title)
    )
}

fn state_badge(state: &str) -> String {
    format!("<span class=\"state {0}\">{0}</span>", esc(state))
}

pub fn error(message: &str) -> String {
    layout(
        "Error",
        "runs",
        &format!(
            "<h1>Not possible</h1><p class=\"error\">{}</p>",
            esc(message)
        ),
    )
}

pub fn login(problem: Option<&str>) -> String {
    let problem = problem
        .map(|p| format!("<p class=\"error\">{}</p>", esc(p)))
        .unwrap_or_default();
    layout(
        "Sign in",
        "",
        &format!(
            "<form id=\"login\" class=\"login\" method=\"post\" action=\"/ui/login\">\
             <h1>Moat Inspector</h1>{problem}\
             <label for=\"token\">Org admin token</label>\
             <input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"off\" required>\
             <button type=\"submit\">Sign in</button>\
             <p class=\"muted\">The token stays in an HttpOnly cookie for this site only.</p></form>"
        ),
    )
}

pub fn runs(rows: &[RunRow], filter: Option<RunState>) -> String {
    let mut options = String::from("<option value=\"all\">all states</option>");
    for state in RunState::ALL {
        let selected = if filter == Some(state) {
            " selected"
        } else {
            ""
        };
        let _ = write!(
            options,
            "<option value=\"{0}\"{selected}>{0}</option>",
            state.as_str()
        );
    }
    let mut body = format!(
        "<h1>Runs</h1><form id=\"run-filter\" method=\"get\" action=\"/ui/runs\" class=\"inline\">\
         <select name=\"state\">{options}</select><button type=\"submit\">Filter</button></form>\
         <p class=\"muted\">{} shown, newest first.</p>\
         <table id=\"runs\"><thead><tr><th>Run</th><th>State</th><th>Runner</th><th>Manifest</th>\
         <th>Attempts</th><th>Created</th><th>Updated</th></tr></thead><tbody>",
        rows.len()
    );
    for r in rows {
        let _ = write!(
            body,
            "<tr data-run-id=\"{id}\"><td><a class=\"run-link\" href=\"/ui/runs/{link}\">{id}</a></td>\
             <td>{state}</td><td><code>{runner}</code></td><td><code>{manifest}</code></td>\
             <td>{attempts}/{max}</td><td>{created}</td><td>{updated}</td></tr>",
            id = esc(&r.id),
            link = seg(&r.id),
            state = state_badge(r.state.as_str()),
            runner = esc(r.runner_id.as_deref().unwrap_or("-")),
            manifest = esc(short(r.manifest_hash.as_deref().unwrap_or("-"))),
            attempts = r.attempts,
            max = r.max_attempts,
            created = stamp(r.created_ms),
            updated = stamp(r.updated_ms),
        );
    }
    body.push_str("</tbody></table>");
    layout("Runs", "runs", &body)
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

fn op_item(o: &OpRow) -> String {
    let denied = matches!(o.state, OpState::Denied | OpState::Failed)
        || o.result.as_ref().is_some_and(|r| r["status"] == "denied");
    let mut class = format!("op {}", o.state.as_str());
    if denied {
        class.push_str(" denied");
    }
    let decision = &o.decision;
    let mut detail = format!(
        "<strong>{}</strong> <code>{}</code> · decision {}",
        esc(&o.op),
        esc(&text(&decision["resource"])),
        esc(&text(&decision["decision"])),
    );
    if let Some(policies) = decision["policies"].as_array().filter(|p| !p.is_empty()) {
        let names: Vec<String> = policies.iter().map(text).collect();
        let _ = write!(detail, " by <code>{}</code>", esc(&names.join(", ")));
    }
    if let Some(result) = &o.result {
        let reason = text(&result["reason"]);
        let reason = if reason.is_empty() {
            text(&result["error"]["reason"])
        } else {
            reason
        };
        let message = text(&result["message"]);
        let message = if message.is_empty() {
            text(&result["error"]["message"])
        } else {
            message
        };
        if !reason.is_empty() {
            let _ = write!(
                detail,
                "<div class=\"reason\">{}</div><div class=\"muted\">{}</div>",
                esc(&reason),
                esc(&message)
            );
        } else if let Some(code) = result["result"]["exitCode"].as_i64() {
            let _ = write!(detail, " · exit {code}");
        }
    }
    if o.state == OpState::PendingApproval {
        detail.push_str(" · <a href=\"/ui/approvals\">waiting for an approval</a>");
    }
    format!(
        "<li class=\"{class}\" data-op-id=\"{id}\" data-state=\"{state}\">\
         <span class=\"muted\">#{n} {id}</span> {badge} {detail}</li>",
        id = esc(&o.id),
        state = o.state.as_str(),
        n = o.n,
        badge = state_badge(o.state.as_str()),
    )
}

fn event_item(e: &StoredEvent) -> String {
    let reason = text(&e.event.data["reason"]);
    let mut line = format!("{}  {}", e.event.at, e.event.event_type.as_str());
    if let Some(op) = &e.event.op_id {
        let _ = write!(line, "  op {op}");
    }
    if !reason.is_empty() {
        let _ = write!(line, "  reason {reason}");
    }
    format!(
        "<li class=\"event\" data-type=\"{}\" data-seq=\"{}\">{}</li>",
        e.event.event_type.as_str(),
        e.seq,
        esc(&line)
    )
}

pub fn run(run: &RunRow, ops: &[OpRow], events: &Page, artifacts: &[ArtifactRow]) -> String {
    let mut body = format!(
        "<h1>Run <code>{id}</code> <span id=\"run-state\" class=\"state {state}\">{state}</span></h1>\
         <dl><dt>Environment</dt><dd>{env}</dd><dt>Runner</dt><dd><code>{runner}</code></dd>\
         <dt>Manifest</dt><dd><code>{manifest}</code></dd><dt>Attempts</dt><dd>{a}/{m}</dd>\
         <dt>Created</dt><dd>{created}</dd><dt>Error</dt><dd>{error}</dd></dl>\
         <div class=\"grid\"><section><h2>Timeline</h2><ol id=\"timeline\">",
        id = esc(&run.id),
        state = run.state.as_str(),
        env = esc(&run.environment),
        runner = esc(run.runner_id.as_deref().unwrap_or("-")),
        manifest = esc(run.manifest_hash.as_deref().unwrap_or("-")),
        a = run.attempts,
        m = run.max_attempts,
        created = stamp(run.created_ms),
        error = esc(run.error.as_deref().unwrap_or("-")),
    );
    if ops.is_empty() {
        body.push_str("<li class=\"muted\">no operations yet</li>");
    }
    for o in ops {
        body.push_str(&op_item(o));
    }
    let _ = write!(
        body,
        "</ol></section><section><h2>Events <span class=\"muted\">(live)</span></h2>\
         <ul id=\"events\" data-stream=\"/ui/runs/{}/events\" data-last=\"{}\">",
        seg(&run.id),
        events.last_seq
    );
    for e in &events.events {
        body.push_str(&event_item(e));
    }
    body.push_str(
        "</ul></section></div><h2>Artifacts</h2><table id=\"artifacts\"><thead><tr><th>Kind</th>\
         <th>Label</th><th>Op</th><th>Size</th><th>SHA-256</th><th></th></tr></thead><tbody>",
    );
    for a in artifacts {
        let _ = write!(
            body,
            "<tr class=\"artifact\"><td>{kind}</td><td>{label}</td><td>{op}</td><td>{size}</td>\
             <td><code class=\"sha256\">{sha}</code></td>\
             <td><a class=\"download\" download href=\"/ui/artifacts/{sha}\">download</a></td></tr>",
            kind = esc(&a.kind),
            label = esc(&a.label),
            op = esc(&a.op_id),
            size = a.size,
            sha = esc(&a.sha256),
        );
    }
    body.push_str("</tbody></table>");
    layout(&format!("Run {}", run.id), "runs", &body)
}

pub fn approvals(pending: &[ApprovalRow], recent: &[ApprovalRow], problem: Option<&str>) -> String {
    let mut body = String::from("<h1>Approvals</h1>");
    if let Some(p) = problem {
        let _ = write!(body, "<p class=\"error\">{}</p>", esc(p));
    }
    let _ = write!(
        body,
        "<p class=\"muted\">{} waiting. Approving runs the operation at once; denying refuses it \
         with your reason. Unanswered requests expire and fail closed.</p>\
         <table id=\"approvals\"><thead><tr><th>Request</th><th>Run / op</th><th>Operation</th>\
         <th>Rule</th><th>Risk</th><th>Expires</th><th>Decide</th></tr></thead><tbody>",
        pending.len()
    );
    for a in pending {
        let id = seg(&a.id);
        let _ = write!(
            body,
            "<tr data-approval-id=\"{eid}\" data-op-id=\"{op}\" data-state=\"pending\">\
             <td><code>{eid}</code><div class=\"muted\">{requested}</div></td>\
             <td><a href=\"/ui/runs/{run_link}\">{run}</a> / {op}</td>\
             <td><strong>{kind}</strong> <code>{resource}</code><div class=\"muted\"><code>{args}</code></div></td>\
             <td><code>{rule}</code></td><td>{risk}</td><td>{expires}</td><td>\
             <form class=\"approve inline\" method=\"post\" action=\"/ui/approvals/{id}/approve\">\
             <input name=\"reason\" placeholder=\"reason (optional)\"><button type=\"submit\">Approve</button></form>\
             <form class=\"deny inline\" method=\"post\" action=\"/ui/approvals/{id}/deny\">\
             <input name=\"reason\" placeholder=\"reason (required)\" required><button type=\"submit\">Deny</button></form>\
             </td></tr>",
            eid = esc(&a.id),
            op = esc(&a.op_id),
            run = esc(&a.run_id),
            run_link = seg(&a.run_id),
            requested = stamp(a.requested_ms),
            kind = esc(&text(&a.summary["op"])),
            resource = esc(&text(&a.summary["resource"])),
            args = esc(&truncate(&a.summary["args"].to_string(), 300)),
            rule = esc(&a.rule),
            risk = state_badge(&a.risk),
            expires = stamp(a.expires_ms),
        );
    }
    body.push_str(
        "</tbody></table><h2>Recently</h2><table id=\"approval-history\"><thead><tr><th>Request</th>\
         <th>Run / op</th><th>State</th><th>By</th><th>Reason</th><th>When</th></tr></thead><tbody>",
    );
    for a in recent.iter().filter(|a| a.resolved_ms.is_some()) {
        let _ = write!(
            body,
            "<tr data-approval-id=\"{}\" data-state=\"{}\"><td><code>{}</code></td><td>{} / {}</td>\
             <td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
            esc(&a.id),
            a.state.as_str(),
            esc(&a.id),
            esc(&a.run_id),
            esc(&a.op_id),
            state_badge(a.state.as_str()),
            esc(a.resolved_by.as_deref().unwrap_or("expiry")),
            esc(a.reason.as_deref().unwrap_or("")),
            a.resolved_ms.map(stamp).unwrap_or_default(),
        );
    }
    body.push_str("</tbody></table>");
    layout("Approvals", "approvals", &body)
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

pub fn runners(rows: &[(RunnerRow, Option<ManifestRow>)], now: i64) -> String {
    let mut body = String::from(
        "<h1>Runners</h1><table id=\"runners\"><thead><tr><th>Runner</th><th>Build (SHA-256)</th>\
         <th>Manifest</th><th>Policy</th><th>Environment</th><th>Manifest expires in</th><th>Status</th>\
         <th>Slots used / free</th><th>Last seen</th></tr></thead><tbody>",
    );
    for (r, manifest) in rows {
        let status = match manifest {
            Some(m) if m.revoked => "revoked",
            Some(m) if m.expires_ms <= now => "expired",
            None => "unknown manifest",
            _ if now - r.seen_ms < 60_000 => "active",
            _ => "silent",
        };
        let expiry = manifest.as_ref().map_or_else(
            || "-".to_owned(),
            |m| {
                format!(
                    "<span class=\"state\" data-expires-ms=\"{}\">{}</span>",
                    m.expires_ms,
                    stamp(m.expires_ms)
                )
            },
        );
        let _ = write!(
            body,
            "<tr data-runner-id=\"{id}\"><td><code>{id}</code><div class=\"muted\">{version}, {sandbox}</div></td>\
             <td><code>{hash}</code></td><td><code>{manifest}</code></td><td><code>{policy}</code></td>\
             <td>{env}</td><td>{expiry}</td><td>{status}</td>\
             <td class=\"slots\">{used} / {free}</td><td>{seen}</td></tr>",
            id = esc(&r.id),
            version = esc(&r.version),
            sandbox = esc(&r.sandbox_mode),
            hash = esc(short(&r.runner_hash)),
            manifest = esc(short(&r.manifest_hash)),
            policy = esc(short(&r.policy_hash)),
            env = esc(&r.environment),
            status = state_badge(status),
            used = r.slots_used,
            free = (r.slots - r.slots_used).max(0),
            seen = stamp(r.seen_ms),
        );
    }
    body.push_str("</tbody></table>");
    layout("Runners", "runners", &body)
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
        None => "<span id=\"ledger-status\" class=\"state\">not checked yet</span>".to_owned(),
        Some(
            c @ super::LedgerCheck {
                verdict: Ok(events),
                ..
            },
        ) => format!(
            "<span id=\"ledger-status\" class=\"state intact\">intact: {events} events re-hashed, chain unbroken{}</span>",
            when(c)
        ),
        Some(
            c @ super::LedgerCheck {
                verdict: Err(broken),
                ..
            },
        ) => format!(
            "<span id=\"ledger-status\" class=\"state broken\">broken: {}{}</span>",
            esc(broken),
            when(c)
        ),
    };
    layout(
        "Ledger",
        "ledger",
        &format!(
            "<h1>Ledger integrity</h1><p>Every event is hash-chained to the one before it; \
             verifying re-hashes the whole chain up to its head and compares.</p>\
             <dl><dt>Head</dt><dd>#{} <code>{}</code></dd><dt>Status</dt><dd>{status}</dd></dl>\
             <form id=\"verify\" method=\"get\" action=\"/ui/ledger\"><input type=\"hidden\" name=\"verify\" value=\"1\"><button type=\"submit\">Verify now</button></form>",
            head.0,
            esc(&head.1)
        ),
    )
}
