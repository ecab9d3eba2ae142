//! `moat export`: the export boundary for local use. The verifier judges a
//! directory (e.g. `moat exec --output`'s) against export rules in a
//! sandbox of its own; what passed is copied out, re-hashed on the way.

use std::collections::BTreeSet;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use moat_core::size::parse_size;
use moat_export::{ExportReport, FileVerdict, RejectRule, Rejection, Verdict, Verifier};
use moat_shell::verifier::VerifierRun;

const EXAMPLES: &str = "\
Examples:
  moat exec --output ./out -- python3 clean.py
  moat export --rules exports.json --from ./out --to ./trusted
  moat export --rules exports.json --from ./out --json > verdicts.json
  moat export --rules exports.json --from ./out --secrets secrets.json --to ./trusted

Rules (the same JSON as a manifest's `exports`; schema in
docs/schema/export-rules.schema.json):
  {\"rules\": [
     {\"path\": \"clean/*.csv\", \"types\": [\"csv\"], \"maxBytes\": 104857600,
      \"csv\": {\"header\": [\"id\", \"amount\"]}},
     {\"path\": \"summary.json\", \"types\": [\"json\"]}],
   \"maxFiles\": 100, \"maxTotalBytes\": 1073741824}

Each file under --from is judged by the first rule whose path glob matches it
(`*` within a directory, `**` across): its type is detected from its bytes and
must be among the rule's types and validate as one (JSON parses, CSV is
rectangular, text is UTF-8, PNG decodes...). Executables, symlinks, hard links,
devices, setuid files, scripts (unless allowShebang), archives (unless listed,
and never a decompression bomb), files over their size, and files holding a
secret (--secrets: a JSON object of name to value, looked for as is,
percent-encoded and base64) or a credential-shaped string are rejected. The
verifier runs sandboxed: no network, the files read-only, --memory and
--timeout bounds; if it dies on a file (a crash, out of memory or time),
that file is rejected (verifier_failed) and a new verifier goes on after it.

Exit status: 0 when every file was promoted; 1 when any was rejected (the
others are still copied); 2 for bad flags, rules or paths, or a verifier that
cannot run at all (nothing copied).";

/// Verify the files a program wrote; copy out only those the rules let through.
#[derive(Args)]
#[command(after_long_help = EXAMPLES, after_help = "Run `moat export --help` for the rules' format.")]
pub struct ExportArgs {
    /// Export rules, JSON (a manifest's `exports`).
    #[arg(long, value_name = "FILE")]
    rules: PathBuf,
    /// The directory of candidates (what a program wrote).
    #[arg(long, value_name = "DIR")]
    from: PathBuf,
    /// Where promoted files are copied, at their relative paths (made if missing).
    #[arg(long, value_name = "DIR")]
    to: Option<PathBuf>,
    /// The secrets to look for: a JSON object of name to value.
    #[arg(long, value_name = "FILE")]
    secrets: Option<PathBuf>,
    /// The verdicts as JSON on standard output instead of a table.
    #[arg(long)]
    json: bool,
    /// Memory for the verifier.
    #[arg(long, value_name = "SIZE", default_value = "1G")]
    memory: String,
    /// Wall-clock limit of the verifier.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Verify even where a sandbox layer cannot be applied (the verdicts
    /// then say which were not).
    #[arg(long)]
    allow_degraded: bool,
    /// Launched by root, the verifier runs as a host uid/gid of its own
    /// taken from this block of ids (BASE:COUNT), as `moat exec`'s program
    /// does. Default: the `moat-sandboxes` entries of /etc/subuid and
    /// /etc/subgid, which moat adds on first use. Ignored when not root.
    #[arg(long, value_name = "BASE:COUNT", env = "MOAT_UID_RANGE")]
    uid_range: Option<moat_sandbox::hostid::IdRange>,
    /// Inside the verifier's sandbox: judge, one JSON line per step.
    #[arg(long, hide = true)]
    worker: bool,
    /// With --worker: a JSON list of paths judged already.
    #[arg(long, hide = true, value_name = "FILE")]
    skip: Option<PathBuf>,
    /// With --worker: a JSON list of the only paths to judge, or null.
    #[arg(long, hide = true, value_name = "FILE")]
    only: Option<PathBuf>,
}

pub fn main(args: ExportArgs) -> ExitCode {
    let result = if args.worker {
        worker(&args)
    } else {
        export(&args)
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("moat export: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Secrets as `(name, value)` from a JSON object of strings.
fn parse_secrets(bytes: &[u8]) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let map: std::collections::BTreeMap<String, String> =
        serde_json::from_slice(bytes).context("expected a JSON object of name to value")?;
    Ok(map.into_iter().map(|(k, v)| (k, v.into_bytes())).collect())
}

/// In the sandbox: rules and candidates read-only, secrets on stdin.
fn worker(args: &ExportArgs) -> anyhow::Result<u8> {
    let rules = moat_export::parse(&std::fs::read(&args.rules)?)?;
    let mut secrets = Vec::new();
    std::io::stdin().read_to_end(&mut secrets)?;
    let secrets = if secrets.is_empty() {
        Vec::new()
    } else {
        parse_secrets(&secrets)?
    };
    let skip: BTreeSet<String> = match &args.skip {
        Some(path) => serde_json::from_slice(&std::fs::read(path)?)?,
        None => BTreeSet::new(),
    };
    let only: Option<BTreeSet<String>> = match &args.only {
        Some(path) => serde_json::from_slice(&std::fs::read(path)?)?,
        None => None,
    };
    let skipped = |p: &str| not_wanted(p, &skip, only.as_ref());
    let mut out = std::io::stdout().lock();
    let mut failed = None;
    Verifier::new(&rules, &secrets)?.judge_dir(&args.from, &skipped, &mut |step| {
        // A line at a time, flushed: what was said before a crash stays said.
        let line = serde_json::to_string(&step).map(|l| l + "\n");
        if let Err(e) = line.map_err(std::io::Error::other).and_then(|l| {
            out.write_all(l.as_bytes())?;
            out.flush()
        }) {
            failed.get_or_insert(e);
        }
    })?;
    match failed {
        Some(e) => Err(e.into()),
        None => Ok(0),
    }
}

/// Whether the worker leaves `path` alone: judged already (`skip`), or not
/// among the candidates (`only`). A directory (`dir/`) is walked unless a
/// list of candidates names nothing under it, so a large input tree beside
/// the outputs costs nothing.
fn not_wanted(path: &str, skip: &BTreeSet<String>, only: Option<&BTreeSet<String>>) -> bool {
    if path.ends_with('/') {
        return only.is_some_and(|o| {
            !o.range(path.to_owned()..)
                .next()
                .is_some_and(|c| c.starts_with(path))
        });
    }
    skip.contains(path) || only.is_some_and(|o| !o.contains(path))
}

fn export(args: &ExportArgs) -> anyhow::Result<u8> {
    let rules_bytes =
        std::fs::read(&args.rules).with_context(|| format!("--rules {}", args.rules.display()))?;
    moat_export::parse(&rules_bytes)
        .and_then(|r| moat_export::compile(&r).map(drop))
        .with_context(|| format!("--rules {}", args.rules.display()))?;
    let from = std::fs::canonicalize(&args.from)
        .with_context(|| format!("--from {}", args.from.display()))?;
    if !from.is_dir() {
        bail!("--from {}: not a directory", args.from.display());
    }
    let secrets = match &args.secrets {
        Some(path) => {
            let bytes =
                std::fs::read(path).with_context(|| format!("--secrets {}", path.display()))?;
            parse_secrets(&bytes).with_context(|| format!("--secrets {}", path.display()))?;
            bytes
        }
        None => Vec::new(),
    };
    if secrets.len() > moat_sandbox::spec::MAX_STDIN_DATA {
        bail!(
            "--secrets: more than {} bytes",
            moat_sandbox::spec::MAX_STDIN_DATA
        );
    }
    let memory = parse_size(&args.memory)
        .map_err(anyhow::Error::msg)
        .context("--memory")?;
    let rules = moat_export::parse(&rules_bytes)?;
    let host = Verifier::new(
        &rules,
        &if secrets.is_empty() {
            Vec::new()
        } else {
            parse_secrets(&secrets)?
        },
    )?;
    let mut report = verify_sandboxed(args, &rules_bytes, &from, secrets, memory)?;
    settle(&mut report, &host, &from, args.to.as_deref());
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report, args.to.as_deref());
    }
    Ok(if report.rejected == 0 { 0 } else { 1 })
}

/// Runs the verifier sandboxed over `from` (see `moat_shell::verifier`).
fn verify_sandboxed(
    args: &ExportArgs,
    rules: &[u8],
    from: &Path,
    secrets: Vec<u8>,
    memory: u64,
) -> anyhow::Result<ExportReport> {
    let rules = moat_export::parse(rules)?;
    let exe = std::env::current_exe().context("finding this binary")?;
    moat_shell::verifier::verify(VerifierRun {
        exe: &exe,
        rules: &rules,
        from,
        only: None,
        secrets,
        memory_bytes: memory,
        timeout: args.timeout,
        allow_degraded: args.allow_degraded,
        without_cgroup: false,
        id_range: args.uid_range,
        launch_policy: moat_sandbox::LaunchPolicy::default(),
        read_as_owner: false,
    })
    .map_err(|e| anyhow::anyhow!("{e}; nothing was promoted"))
}

/// Re-reads every promoted file (the size and hash it was judged by), has
/// the host check it again (`Verifier::recheck`: nothing is parsed), and
/// copies it to `to`; a file that fails any of it is rejected instead.
fn settle(report: &mut ExportReport, host: &Verifier, from: &Path, to: Option<&Path>) {
    let mut failed = Vec::new();
    for (i, file) in report.files.iter().enumerate() {
        if file.verdict != Verdict::Promoted {
            continue;
        }
        let settled = match (&file.sha256, file.exported_as) {
            (Some(sha), Some(ty)) => moat_export::read_verified(from, &file.path, sha, file.size)
                .map_err(|e| e.to_string())
                .and_then(|content| {
                    host.recheck(&file.path, &content, ty)?;
                    match to {
                        Some(to) => moat_export::promote(&content, &file.path, to)
                            .map(drop)
                            .map_err(|e| e.to_string()),
                        None => Ok(()),
                    }
                }),
            _ => Err("promoted without a hash or a type".into()),
        };
        if let Err(why) = settled {
            failed.push((i, why));
        }
    }
    for (i, why) in failed {
        if let Some(file) = report.files.get_mut(i) {
            report.promoted = report.promoted.saturating_sub(1);
            report.bytes_promoted = report.bytes_promoted.saturating_sub(file.size);
            report.rejected += 1;
            demote(file, why);
        }
    }
}

fn demote(file: &mut FileVerdict, detail: String) {
    file.verdict = Verdict::Rejected;
    file.exported_as = None;
    file.reasons.push(Rejection {
        rule: RejectRule::Unreadable,
        detail,
    });
}

/// A path as printed: the program named it, so control characters (a
/// newline that would forge a row, a terminal escape) are shown escaped.
fn shown(path: &str) -> String {
    if path.chars().any(char::is_control) {
        path.escape_debug().to_string()
    } else {
        path.to_owned()
    }
}

fn print_table(report: &ExportReport, to: Option<&Path>) {
    println!("{:<9} {:<8} {:>12}  PATH", "VERDICT", "TYPE", "BYTES");
    for file in &report.files {
        let verdict = match file.verdict {
            Verdict::Promoted => "promoted",
            Verdict::Rejected => "rejected",
        };
        let ty = file.exported_as.map_or("-", |t| t.as_str());
        println!(
            "{verdict:<9} {ty:<8} {:>12}  {}",
            file.size,
            shown(&file.path)
        );
        for reason in &file.reasons {
            println!("{:33}{}: {}", "", reason.rule.as_str(), reason.detail);
        }
    }
    println!(
        "{} promoted ({} bytes{}), {} rejected",
        report.promoted,
        report.bytes_promoted,
        to.map(|t| format!(", copied to {}", t.display()))
            .unwrap_or_default(),
        report.rejected
    );
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::not_wanted;

    #[test]
    fn only_directories_that_lead_to_a_candidate_are_walked() {
        let set = |items: &[&str]| {
            items
                .iter()
                .map(|s| (*s).to_owned())
                .collect::<BTreeSet<_>>()
        };
        let only = set(&["output/a.csv", "output/deep/b.csv", "out-2/c.csv"]);
        let skip = set(&["output/a.csv"]);
        for (path, left_alone) in [
            ("output/", false),
            ("output/deep/", false),
            ("out-2/", false),
            ("input/", true),
            ("out/", true),
            ("output/deeper/", true),
            ("output/a.csv", true),
            ("output/deep/b.csv", false),
            ("input/data.csv", true),
        ] {
            assert_eq!(not_wanted(path, &skip, Some(&only)), left_alone, "{path}");
        }
        // Without a list, every directory is walked and only `skip` is left.
        assert!(!not_wanted("input/", &skip, None));
        assert!(not_wanted("output/a.csv", &skip, None));
        assert!(!not_wanted("output/x.csv", &skip, None));
    }
}
