//! `moat audit RUN_ID`: what a run was allowed and what it did, from the
//! ledger alone (the control plane's database, read directly).

use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;
use moat_control::audit::{Audit, audit};
use moat_store::Store;
use serde_json::Value;

const ABOUT: &str = "\
Reads the run's events from the control plane's ledger, checks the whole
hash chain first, and answers: which sandbox class and mode the run used
and what each layer enforced, which permission level was active (manifest,
policy, the rules that granted), which filesystem roots were mounted, which
network policy applied, and whether it ever went beyond its default boundary
(approvals granted, danger mode or full network, launch policy overridden,
manifest refreshed mid-run), what the sandbox refused (Landlock and seccomp
denials, with paths and syscalls), which files programs wrote were promoted
at the export boundary and which were rejected and why, what it used
(run.usage) and how its runners' teardowns went (run.destroyed).
Exits 0 if it did not, 3 if it did, 1 on an error or a broken chain.

  moat audit demo-1a2b3c4d                       # moat up's database
  moat audit --db postgres://moat@db/moat run-42 --json";

/// Answer, from the ledger alone, what a run was allowed and did.
#[derive(Args)]
#[command(after_long_help = ABOUT)]
pub struct AuditArgs {
    /// The run.
    run: String,
    /// The control plane's database (`sqlite:PATH`, or PostgreSQL).
    #[arg(long, value_name = "URL", default_value = "sqlite:moat-up/moat.db")]
    db: String,
    /// One JSON document instead of text.
    #[arg(long)]
    json: bool,
}

pub fn main(args: AuditArgs) -> ExitCode {
    match run(&args) {
        Ok(report) => {
            if report.beyond_default_boundary {
                ExitCode::from(3)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("moat audit: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(args: &AuditArgs) -> anyhow::Result<Audit> {
    if let Some(path) = args.db.strip_prefix("sqlite:") {
        // Opening would create an empty database: say what is wrong instead.
        if !std::path::Path::new(path).exists() {
            bail!("--db {}: no such database", args.db);
        }
    }
    let store = Store::open(&args.db)
        .with_context(|| format!("--db {}", moat_store::redact_url(&args.db)))?;
    let chain = store.verify_ledger()?;
    let events = store.events_of_run(&args.run)?;
    if events.is_empty() {
        bail!("run {}: no events in this ledger", args.run);
    }
    let report = audit(&args.run, &events);
    let intact = match &chain {
        Ok(v) => format!("intact ({} events re-hashed)", v.events),
        Err(broken) => format!("BROKEN: {broken}"),
    };
    if args.json {
        let mut doc = serde_json::to_value(&report)?;
        doc["ledger"] = Value::String(intact.clone());
        outln!("{doc:#}");
    } else {
        print_text(&report, &intact);
    }
    if chain.is_err() {
        bail!("the ledger's hash chain is broken: these answers cannot be trusted");
    }
    Ok(report)
}

fn list(set: &std::collections::BTreeSet<String>) -> String {
    if set.is_empty() {
        "-".into()
    } else {
        set.iter().cloned().collect::<Vec<_>>().join(", ")
    }
}

fn print_text(a: &Audit, intact: &str) {
    outln!(
        "run {}: {} ({} events; ledger {intact})",
        a.run_id,
        a.outcome,
        a.events
    );
    outln!("\nSandbox");
    outln!("  class:        {}", a.sandbox_class);
    outln!("  modes:        {}", list(&a.sandbox_modes));
    if let Some(layers) = a.enforcement.as_object() {
        for (layer, v) in layers {
            if let Some(status) = v["status"].as_str() {
                outln!(
                    "  {layer:<13} {status}: {}",
                    v["detail"].as_str().unwrap_or("")
                );
            }
        }
    }
    outln!("\nPermission level");
    outln!("  manifest:     {}", list(&a.manifest_hashes));
    outln!("  policy:       {}", list(&a.policy_hashes));
    outln!("  granted by:   {}", list(&a.granted_by));
    outln!(
        "  runner:       {} (build {})",
        list(&a.runners),
        list(&a.runner_hashes)
    );
    outln!(
        "  operations:   {} asked, {} denied",
        a.operations.len(),
        a.denied.len()
    );
    for d in &a.denied {
        outln!(
            "    denied {}: {}",
            d["opId"].as_str().unwrap_or("?"),
            d["reason"].as_str().unwrap_or("?")
        );
    }
    outln!(
        "\nFilesystem roots: {} (root: {})",
        list(&a.roots),
        list(&a.root_views)
    );
    outln!(
        "Network: {} ({} requests, {} refused, {} connections in)",
        list(&a.network_modes),
        a.network_requests,
        a.network_denied,
        a.network_ingress
    );
    if a.usage.is_object() {
        let u = &a.usage;
        let n = |k: &str| u[k].as_u64().unwrap_or(0);
        let ops: Vec<String> = u["ops"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(state, count)| format!("{count} {state}"))
            .collect();
        outln!(
            "\nUsage: ops {}; {} program(s), CPU {} ms, program time {} ms, peak memory {}; \
             egress {} request(s), {} B out, {} B in; {} written under a storage budget; \
             {} access(es) refused",
            if ops.is_empty() {
                "none".to_owned()
            } else {
                ops.join(", ")
            },
            n("programs"),
            n("cpuMs"),
            n("programWallMs"),
            moat_core::size::format_size(n("peakMemoryBytes")),
            n("egressRequests"),
            n("egressBytesOut"),
            n("egressBytesIn"),
            moat_core::size::format_size(n("bytesWritten")),
            n("violations"),
        );
    }
    if !a.violations.is_empty() {
        outln!("\nBlocked by the sandbox:");
        for v in &a.violations {
            outln!(
                "    {}: {}",
                v["opId"].as_str().unwrap_or("?"),
                v["message"].as_str().unwrap_or("?")
            );
        }
    }
    for gap in &a.evidence_gaps {
        outln!(
            "Not every refusal could be observed in {} operation(s): {}",
            gap["opIds"].as_array().map_or(0, Vec::len),
            gap["detail"].as_str().unwrap_or("?")
        );
    }
    print_exports(a);
    print_persisted(a);
    for t in &a.teardowns {
        let failed: Vec<&str> = t["checks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["ok"] != true)
            .filter_map(|c| c["check"].as_str())
            .collect();
        outln!(
            "Teardown on {}: {}",
            t["runnerId"].as_str().unwrap_or("?"),
            if failed.is_empty() {
                "nothing left (processes, files, mounts, cgroups)".to_owned()
            } else {
                format!("NOT CLEAN: {}", failed.join(", "))
            }
        );
    }
    outln!(
        "\nBeyond its default boundary: {}",
        if a.beyond_default_boundary {
            "YES"
        } else {
            "no"
        }
    );
    for ap in &a.approvals {
        outln!(
            "  approval: op {} by {} via {} (rule {}, risk {}) at {}: {}",
            ap["opId"].as_str().unwrap_or("?"),
            ap["by"].as_str().unwrap_or("?"),
            ap["via"].as_str().unwrap_or("?"),
            ap["rule"].as_str().unwrap_or("?"),
            ap["risk"].as_str().unwrap_or("?"),
            ap["at"].as_str().unwrap_or("?"),
            ap["reason"].as_str().unwrap_or("no reason given"),
        );
    }
    for d in &a.danger {
        outln!(
            "  danger: op {}: {}",
            d["opId"].as_str().unwrap_or("?"),
            d["what"].as_str().unwrap_or("?")
        );
    }
    if a.manifest_refreshed {
        outln!("  manifest refreshed mid-run: {}", list(&a.manifest_hashes));
    }
}

/// What persisted after the run: each volume, from the snapshot it started
/// from to the last one it recorded, by hash.
fn print_persisted(a: &Audit) {
    if a.persisted.is_empty() {
        return;
    }
    outln!("\nPersisted (volumes)");
    for p in &a.persisted {
        let short = |v: &Value| {
            v.as_str()
                .map_or("empty".to_owned(), |h| h.get(..16).unwrap_or(h).to_owned())
        };
        let mode = if p["readOnly"] == true { "ro" } else { "rw" };
        let end = if p["snapshots"].as_u64().unwrap_or(0) == 0 {
            "unchanged".to_owned()
        } else {
            format!(
                "{} ({} snapshots; {} files, {} bytes)",
                short(&p["endSnapshot"]),
                p["snapshots"],
                p["files"],
                p["bytes"]
            )
        };
        outln!(
            "  {} at {} ({mode}): {} -> {end}",
            p["volume"].as_str().unwrap_or("?"),
            p["path"].as_str().unwrap_or("?"),
            short(&p["startSnapshot"]),
        );
    }
    for r in &a.resumed {
        outln!(
            "  resumed: attempt {} on runner {}",
            r["attempt"],
            r["runnerId"].as_str().unwrap_or("?")
        );
    }
}

/// What the export boundary promoted and rejected, file by file.
fn print_exports(a: &Audit) {
    if a.promoted.is_empty() && a.rejected.is_empty() && a.awaiting_approval.is_empty() {
        return;
    }
    outln!(
        "\nExport boundary: {} file(s) promoted, {} rejected, {} awaiting approval",
        a.promoted.len(),
        a.rejected.len(),
        a.awaiting_approval.len()
    );
    for w in &a.awaiting_approval {
        outln!(
            "    awaiting  {:?} ({}) approval {}",
            w["path"].as_str().unwrap_or("?"),
            w["exportedAs"].as_str().unwrap_or("?"),
            w["approvalId"].as_str().unwrap_or("?"),
        );
    }
    for p in &a.promoted {
        outln!(
            "    promoted  {:?} ({}, {}) sha256 {}{}",
            p["path"].as_str().unwrap_or("?"),
            p["exportedAs"].as_str().unwrap_or("?"),
            moat_core::size::format_size(p["size"].as_u64().unwrap_or(0)),
            p["sha256"].as_str().unwrap_or("?"),
            p["approvalId"]
                .as_str()
                .map(|id| format!(", approved ({id})"))
                .unwrap_or_default(),
        );
    }
    for r in &a.rejected {
        let reasons: Vec<String> = r["reasons"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|x| {
                format!(
                    "{} ({})",
                    printable(x["rule"].as_str().unwrap_or("?")),
                    printable(x["detail"].as_str().unwrap_or(""))
                )
            })
            .collect();
        outln!(
            "    rejected  {:?}: {}",
            r["path"].as_str().unwrap_or("?"),
            reasons.join("; ")
        );
    }
}

/// `text` without control characters (a terminal's escapes among them).
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}
