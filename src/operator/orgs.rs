//! `moat orgs quota`: an org's quotas, read by its admin or the
//! deployment's, set by the deployment's admin only.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use moat_core::quota::{OverQuota, Quota, QuotaPeriod};
use serde_json::Value;

use super::{Api, Target, segment};

const ABOUT: &str = "\
Quotas bound what an org's runs take: runs held at once (concurrent runs),
and over a period (the UTC day, or month) the CPU time, the bytes written
into writable roots (storage) and the egress bytes of the runs that ended
in it. Over a quota, the org's new runs wait in the queue, their waiting
reason saying which quota (quota_exceeded: cpu_seconds 3600 of 3600); with
--over refuse, creating one is refused (429) instead. Setting takes the
deployment's admin token; an org's admin token may read its own.

  export MOAT_CONTROL_PLANE=http://127.0.0.1:7700 MOAT_TOKEN_FILE=admin-token
  moat orgs quota acme --concurrent-runs 8 --cpu-seconds 36000 --egress-bytes 10GiB
  moat orgs quota acme                 (show it, with the use so far)
  moat orgs quota acme --clear         (no limits)";

/// An org's quotas.
#[derive(Args)]
pub struct OrgsArgs {
    #[command(flatten)]
    target: Target,
    #[command(subcommand)]
    command: OrgsCommand,
}

#[derive(Subcommand)]
enum OrgsCommand {
    /// Show an org's quotas and use, or set them (any flag given).
    #[command(after_long_help = ABOUT)]
    Quota(QuotaArgs),
}

#[derive(Args)]
struct QuotaArgs {
    /// The org's name.
    org: String,
    /// Runs its runners may hold at once.
    #[arg(long, value_name = "N")]
    concurrent_runs: Option<u64>,
    /// CPU seconds its programs may use per period.
    #[arg(long, value_name = "SECONDS")]
    cpu_seconds: Option<u64>,
    /// Bytes its runs may write into writable roots per period (e.g. 50GiB).
    #[arg(long, value_name = "SIZE", value_parser = size)]
    storage_bytes: Option<u64>,
    /// Egress bytes (out and in) per period (e.g. 10GiB).
    #[arg(long, value_name = "SIZE", value_parser = size)]
    egress_bytes: Option<u64>,
    /// Over how long CPU, storage and egress add up.
    #[arg(long, value_name = "day|month", value_parser = period)]
    period: Option<QuotaPeriod>,
    /// What a new run of an org over quota does: wait in the queue, or be
    /// refused.
    #[arg(long, value_name = "wait|refuse", value_parser = over)]
    over: Option<OverQuota>,
    /// Remove every limit.
    #[arg(long, conflicts_with_all = ["concurrent_runs", "cpu_seconds", "storage_bytes", "egress_bytes", "period", "over"])]
    clear: bool,
}

fn size(text: &str) -> Result<u64, String> {
    moat_core::size::parse_size(text).map_err(|e| e.to_string())
}

fn period(text: &str) -> Result<QuotaPeriod, String> {
    QuotaPeriod::parse(text).ok_or_else(|| "day or month".to_owned())
}

fn over(text: &str) -> Result<OverQuota, String> {
    OverQuota::parse(text).ok_or_else(|| "wait or refuse".to_owned())
}

pub fn main(args: OrgsArgs) -> ExitCode {
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("moat orgs: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(args: OrgsArgs) -> anyhow::Result<()> {
    let api = Api::new(&args.target)?;
    let OrgsCommand::Quota(q) = args.command;
    let path = format!("/v1/orgs/{}/quota", segment(&q.org));
    let setting = q.clear
        || q.concurrent_runs.is_some()
        || q.cpu_seconds.is_some()
        || q.storage_bytes.is_some()
        || q.egress_bytes.is_some()
        || q.period.is_some()
        || q.over.is_some();
    let answer = if setting {
        // Flags not given keep what is set: read, change, write.
        let current: Value = api.get(&path)?;
        let mut quota: Quota = match (&current["quota"], q.clear) {
            (_, true) | (Value::Null, false) => Quota::default(),
            // Never write back less than is set.
            (set, false) => serde_json::from_value(set.clone()).map_err(|e| {
                anyhow::anyhow!(
                    "the quota set now is not one this moat reads ({e}): set it with the API"
                )
            })?,
        };
        quota.concurrent_runs = q.concurrent_runs.or(quota.concurrent_runs);
        quota.cpu_seconds = q.cpu_seconds.or(quota.cpu_seconds);
        quota.storage_bytes = q.storage_bytes.or(quota.storage_bytes);
        quota.egress_bytes = q.egress_bytes.or(quota.egress_bytes);
        quota.period = q.period.unwrap_or(quota.period);
        quota.over = q.over.unwrap_or(quota.over);
        api.put(&path, &serde_json::to_value(&quota)?)?
    } else {
        api.get(&path)?
    };
    print(&answer);
    Ok(())
}

fn print(answer: &Value) {
    let org = answer["org"].as_str().unwrap_or("?");
    let quota = &answer["quota"];
    let used = &answer["used"];
    if quota.is_null() {
        outln!("{org}: no quota");
    } else {
        outln!(
            "{org}: per {}, over quota new runs {}",
            quota["period"].as_str().unwrap_or("day"),
            quota["over"].as_str().unwrap_or("wait")
        );
    }
    let cpu = used["cpuMs"].as_u64().unwrap_or(0) / 1000;
    for (name, key, now) in [
        (
            "concurrent runs",
            "concurrentRuns",
            used["concurrentRuns"].as_u64().unwrap_or(0),
        ),
        ("cpu seconds", "cpuSeconds", cpu),
        (
            "storage bytes",
            "storageBytes",
            used["storageBytes"].as_u64().unwrap_or(0),
        ),
        (
            "egress bytes",
            "egressBytes",
            used["egressBytes"].as_u64().unwrap_or(0),
        ),
    ] {
        let limit = quota[key]
            .as_u64()
            .map_or_else(|| "no limit".to_owned(), |n| n.to_string());
        outln!("  {name:<16} {now} of {limit}");
    }
    if let Some(exceeded) = answer["exceeded"].as_str() {
        outln!("  {exceeded}");
    }
}
