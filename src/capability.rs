//! `moat capability issue`: sign a capability for one operation with the
//! control-plane key — what the control plane does for every allowed
//! operation; here for driving a managed runner (`moat shell
//! --require-capabilities`) by hand, and for tests.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use moat_core::capability::{CapabilityClaims, MAX_LIFETIME, args_hash};
use moat_core::{Envelope, OpKind, WorkloadClass};

use crate::manifest;

/// Issue capabilities (the control plane's signed grant for one operation).
#[derive(Args)]
pub struct CapabilityArgs {
    #[command(subcommand)]
    command: CapabilityCommand,
}

#[derive(Subcommand)]
enum CapabilityCommand {
    /// Read an envelope (JSON) and print it with a capability attached.
    Issue(IssueArgs),
}

#[derive(Args)]
struct IssueArgs {
    /// The control plane's private key (from `moat manifest keygen`).
    #[arg(long, value_name = "FILE")]
    key: PathBuf,
    /// The manifest whose policyHash the capability names (bare or signed).
    #[arg(long, value_name = "FILE")]
    manifest: PathBuf,
    /// How long the capability lives (at most 60s).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// When it was issued (RFC 3339; default: now).
    #[arg(long, value_name = "TIME")]
    issued_at: Option<String>,
    /// The workload class an exec_argv program, or a browser_step's
    /// session, must run in (namespace or microvm; the shell refuses a
    /// class it cannot give, and a step stronger than its session's).
    #[arg(long, value_name = "CLASS", default_value = "namespace")]
    class: WorkloadClass,
    /// For an acting browser step (click, type, select, fill_secret): the
    /// element it may act on, as the `result.fingerprint` of its
    /// `element_unchecked` answer, or `any` (no check). Without it the step
    /// only answers what its selector matches.
    #[arg(long, value_name = "FINGERPRINT|any")]
    element: Option<String>,
    /// The envelope, as JSON (`-` = standard input).
    #[arg(value_name = "ENVELOPE", default_value = "-")]
    envelope: String,
}

pub fn main(args: CapabilityArgs) -> ExitCode {
    let CapabilityCommand::Issue(issue) = args.command;
    match run(issue) {
        Ok(line) => {
            outln!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("moat capability: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(args: IssueArgs) -> anyhow::Result<String> {
    if args.ttl > MAX_LIFETIME {
        bail!(
            "--ttl: a capability lives at most {} s",
            MAX_LIFETIME.as_secs()
        );
    }
    let key = manifest::read_private_key(&args.key)?;
    let policy_hash = manifest::read_any_manifest(&args.manifest)?.policy_hash;
    let text = if args.envelope == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading the envelope")?;
        text
    } else {
        std::fs::read_to_string(&args.envelope).with_context(|| args.envelope.clone())?
    };
    let mut envelope: Envelope = serde_json::from_str(&text).context("the envelope")?;
    if let Some(element) = &args.element
        && element != moat_core::element::ANY_ELEMENT
        && !is_fingerprint(element)
    {
        bail!("--element: `any` or a fingerprint (sha256: and 64 hex digits), not {element:?}");
    }
    let op: OpKind = serde_json::from_value(serde_json::Value::String(envelope.op.clone()))
        .with_context(|| format!("unknown operation {:?}", envelope.op))?;
    let issued = match &args.issued_at {
        Some(at) => humantime::parse_rfc3339(at).context("--issued-at")?,
        None => SystemTime::now(),
    };
    let stamp = moat_core::time::stamp;
    let nonce = moat_core::random::bytes::<16>();
    let claims = CapabilityClaims {
        run_id: envelope.run_id.clone(),
        op_id: envelope.id.clone(),
        op,
        args_hash: args_hash(&envelope),
        policy_hash,
        issued_at: stamp(issued),
        expires_at: stamp(issued + args.ttl),
        nonce: nonce.iter().map(|b| format!("{b:02x}")).collect(),
        class: args.class,
        element: args.element.clone(),
    };
    envelope.capability = Some(claims.sign(&key));
    Ok(serde_json::to_string(&envelope)?)
}

/// `sha256:` and 64 lower-case hex digits, as [`moat_core::element::ElementFacts::fingerprint`].
fn is_fingerprint(text: &str) -> bool {
    text.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}
