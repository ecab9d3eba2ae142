//! The verdict on each file of a directory a program wrote: promoted (it
//! may leave, as the type it was validated as) or rejected, with a reason
//! per rule it broke.

use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ExportError;
use crate::detect::{Kind, detect};
use crate::rules::{CompiledRules, ExportRule, ExportRules, ExportType, compile};
use crate::secrets::{Finding, Scanner};
use crate::validate::{unpack, validate};
use crate::walk::{Candidate, Entry, Visit, walk};
pub use moat_core::exports::{RejectRule, Rejection};

/// What the verifier decided about a directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExportReport {
    /// Every file, in path order.
    pub files: Vec<FileVerdict>,
    pub promoted: u64,
    pub rejected: u64,
    pub bytes_promoted: u64,
}

/// One file's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FileVerdict {
    /// Relative to the directory, `/`-separated (lossy if not UTF-8).
    pub path: String,
    pub size: u64,
    /// Of the content that was verified; absent when it was never read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// What the bytes are, as detected (`text`, `an executable (ELF)`...).
    pub detected: String,
    /// The type it was validated as, when promoted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exported_as: Option<ExportType>,
    pub verdict: Verdict,
    /// Why it was rejected: one entry per rule it broke.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<Rejection>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Promoted,
    Rejected,
}

/// One step of the verifier, as it streams them (a JSON line each).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Progress {
    /// About to read this file's content.
    Reading(String),
    /// This file's verdict, before the run's totals.
    Judged(FileVerdict),
}

/// The report over `files` (any order): sorted by path, the run's
/// `maxFiles` and `maxTotalBytes` applied in that order, counts made.
pub fn totals(rules: &CompiledRules, mut files: Vec<FileVerdict>) -> ExportReport {
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let limit = rules.max_files;
    let mut report = ExportReport {
        files,
        promoted: 0,
        rejected: 0,
        bytes_promoted: 0,
    };
    for file in &mut report.files {
        if file.verdict == Verdict::Promoted {
            if report.promoted >= limit {
                file.verdict = Verdict::Rejected;
                file.reasons.push(reject(
                    RejectRule::TooManyFiles,
                    format!("the run already exports {limit} files (maxFiles)"),
                ));
            } else if report.bytes_promoted.saturating_add(file.size) > rules.max_total_bytes {
                file.verdict = Verdict::Rejected;
                file.reasons.push(reject(
                    RejectRule::RunTooLarge,
                    format!(
                        "{} bytes more would take the run past {} bytes (maxTotalBytes)",
                        file.size, rules.max_total_bytes
                    ),
                ));
            } else {
                report.promoted += 1;
                report.bytes_promoted += file.size;
                continue;
            }
            file.exported_as = None;
        }
        report.rejected += 1;
    }
    report
}

/// Files at least this large are hashed on a thread of their own.
const PARALLEL_HASH: usize = 1 << 20;

fn reject(rule: RejectRule, detail: impl Into<String>) -> Rejection {
    Rejection {
        rule,
        detail: detail.into(),
    }
}

/// Rules and the secret scan, ready to judge files.
pub struct Verifier {
    rules: CompiledRules,
    scanner: Scanner,
}

impl Verifier {
    /// `secrets` are the org's, as `(name, value)`.
    pub fn new(
        rules: &ExportRules,
        secrets: &[(String, Vec<u8>)],
    ) -> Result<Verifier, ExportError> {
        Ok(Verifier {
            rules: compile(rules)?,
            scanner: Scanner::new(secrets)?,
        })
    }

    /// Judges every file under `root` (not following links).
    pub fn verify_dir(&self, root: &Path) -> Result<ExportReport, ExportError> {
        let mut files = Vec::new();
        self.judge_dir(root, &|_| false, &mut |step| {
            if let Progress::Judged(verdict) = step {
                files.push(verdict);
            }
        })?;
        Ok(totals(&self.rules, files))
    }

    /// Judges every file under `root` but those `skip` names, in path
    /// order, telling `progress` before a file's content is read and once
    /// it is judged: a verifier that dies leaves the file it died on known.
    pub fn judge_dir(
        &self,
        root: &Path,
        skip: &dyn Fn(&str) -> bool,
        progress: &mut dyn FnMut(Progress),
    ) -> Result<(), ExportError> {
        let progress = std::cell::RefCell::new(progress);
        walk(
            root,
            &mut Visit {
                max_bytes: &|rel| self.max_bytes(rel),
                skip,
                reading: &mut |path| (progress.borrow_mut())(Progress::Reading(path.to_owned())),
                entry: &mut |entry| {
                    let verdict = match entry {
                        Entry::Refused { path, size, reason } => FileVerdict {
                            path,
                            size,
                            sha256: None,
                            detected: "not read".into(),
                            exported_as: None,
                            verdict: Verdict::Rejected,
                            reasons: vec![reason],
                        },
                        Entry::File(candidate) => self.verify_candidate(candidate),
                    };
                    (progress.borrow_mut())(Progress::Judged(verdict));
                },
            },
        )
    }

    /// The host's own checks of a file the sandboxed (so possibly
    /// compromised) verifier promoted, on the bytes about to leave. Cheap
    /// ones that parse no structure: a rule takes the path and lists the
    /// type, the size fits, the magic bytes are no executable or unlisted
    /// archive and agree with the type, and the scan finds nothing.
    pub fn recheck(&self, path: &str, bytes: &[u8], exported_as: ExportType) -> Result<(), String> {
        let rule = self
            .rules
            .rule_for(path)
            .ok_or("no export rule's path matches it")?;
        if !rule.types.contains(&exported_as) {
            return Err(format!("its rule does not list {}", exported_as.as_str()));
        }
        if bytes.len() as u64 > max_bytes(rule) {
            return Err("over its rule's maxBytes".into());
        }
        let kind = detect(bytes);
        let agrees = match kind {
            Kind::Text => exported_as.is_text(),
            Kind::Script => exported_as.is_text() && rule.allow_shebang,
            Kind::Png => exported_as == ExportType::Png,
            Kind::Pdf => exported_as == ExportType::Pdf,
            Kind::Parquet => exported_as == ExportType::Parquet,
            Kind::Gzip => exported_as == ExportType::Gzip,
            Kind::Tar => exported_as == ExportType::Tar,
            Kind::Zip => exported_as == ExportType::Zip,
            Kind::Executable(_) | Kind::OtherArchive(_) | Kind::Binary(_) => false,
        };
        if !agrees {
            return Err(format!(
                "{} is not what the verifier said ({})",
                kind.describe(),
                exported_as.as_str()
            ));
        }
        if self.rules.secret_scan && !self.scanner.scan(bytes).is_empty() {
            return Err("holds a secret or something shaped like a credential".into());
        }
        Ok(())
    }

    /// The size cap of the rule for `rel`, `None` when no rule takes it.
    fn max_bytes(&self, rel: &str) -> Option<u64> {
        self.rules
            .rule_for(rel)
            .map(|r| r.max_bytes.unwrap_or(crate::rules::DEFAULT_MAX_BYTES))
    }

    fn verify_candidate(&self, candidate: Candidate) -> FileVerdict {
        let Candidate { path, bytes } = candidate;
        let size = bytes.len() as u64;
        let hash = || moat_core::hash::sha256_hex(&bytes);
        // A large file is hashed beside its judgement, on the other core.
        let (sha256, verdict) = if bytes.len() < PARALLEL_HASH {
            (Some(hash()), self.judge(&path, &bytes))
        } else {
            std::thread::scope(|s| {
                let hashing = s.spawn(hash);
                let verdict = self.judge(&path, &bytes);
                (hashing.join().ok(), verdict)
            })
        };
        let (detected, exported_as, reasons) = verdict;
        FileVerdict {
            path,
            size,
            sha256,
            detected,
            verdict: if reasons.is_empty() && exported_as.is_some() {
                Verdict::Promoted
            } else {
                Verdict::Rejected
            },
            exported_as,
            reasons,
        }
    }

    /// What `bytes` are, the type they pass as, and every broken rule.
    fn judge(&self, path: &str, bytes: &[u8]) -> (String, Option<ExportType>, Vec<Rejection>) {
        let kind = detect(bytes);
        let detected = kind.describe();
        let Some(rule) = self.rules.rule_for(path) else {
            return (
                detected,
                None,
                vec![reject(
                    RejectRule::NoRule,
                    "no export rule's path matches it",
                )],
            );
        };
        let (ty, mut reasons) = type_check(rule, kind, bytes);
        if self.rules.secret_scan {
            let mut findings = self.scanner.scan(bytes);
            if let Some(ty @ (ExportType::Gzip | ExportType::Zip)) = ty
                && let Ok(inside) = unpack(ty, bytes, max_bytes(rule))
            {
                findings.extend(self.scanner.scan(&inside));
            }
            let mut seen = Vec::new();
            for finding in findings {
                if seen.contains(&finding) {
                    continue;
                }
                reasons.push(match &finding {
                    Finding::Secret { name, form } => reject(
                        RejectRule::Secret,
                        format!("holds the org's secret {name:?} ({form})"),
                    ),
                    Finding::Token { shape } => reject(
                        RejectRule::Token,
                        format!("holds something shaped like a credential: {shape}"),
                    ),
                });
                seen.push(finding);
            }
        }
        if reasons.is_empty() {
            (detected, ty, reasons)
        } else {
            (detected, None, reasons)
        }
    }
}

fn max_bytes(rule: &ExportRule) -> u64 {
    rule.max_bytes.unwrap_or(crate::rules::DEFAULT_MAX_BYTES)
}

/// The type among `rule`'s that `bytes` validate as, or why none.
fn type_check(rule: &ExportRule, kind: Kind, bytes: &[u8]) -> (Option<ExportType>, Vec<Rejection>) {
    let listed = |ty: ExportType| rule.types.contains(&ty);
    let names = rule
        .types
        .iter()
        .map(|t| t.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let not_allowed = || {
        vec![reject(
            RejectRule::TypeNotAllowed,
            format!(
                "{} is not among its rule's types ({names})",
                kind.describe()
            ),
        )]
    };
    let single = |ty: ExportType| {
        if !listed(ty) {
            return (None, not_allowed());
        }
        match validate(ty, bytes, None).and_then(|()| unpack(ty, bytes, max_bytes(rule)).map(drop))
        {
            Ok(()) => (Some(ty), Vec::new()),
            Err(e) => {
                let rule = if e.bomb {
                    RejectRule::ArchiveBomb
                } else {
                    RejectRule::InvalidContent
                };
                (
                    None,
                    vec![reject(
                        rule,
                        format!("not valid {}: {}", ty.as_str(), e.detail),
                    )],
                )
            }
        }
    };
    match kind {
        Kind::Executable(what) => (
            None,
            vec![reject(
                RejectRule::Executable,
                format!("an executable ({what}) never leaves"),
            )],
        ),
        Kind::Script if !rule.allow_shebang => (
            None,
            vec![reject(
                RejectRule::Shebang,
                "a script (starts with #!); its rule does not set allowShebang",
            )],
        ),
        Kind::OtherArchive(mime) => (
            None,
            vec![reject(
                RejectRule::Archive,
                format!("an archive ({mime}): only gzip, tar and zip can be checked, when listed"),
            )],
        ),
        Kind::Gzip | Kind::Tar | Kind::Zip
            if !listed(match kind {
                Kind::Gzip => ExportType::Gzip,
                Kind::Tar => ExportType::Tar,
                _ => ExportType::Zip,
            }) =>
        {
            (
                None,
                vec![reject(
                    RejectRule::Archive,
                    format!(
                        "{} archive; its rule does not list it ({names})",
                        kind.describe()
                    ),
                )],
            )
        }
        Kind::Gzip => single(ExportType::Gzip),
        Kind::Tar => single(ExportType::Tar),
        Kind::Zip => single(ExportType::Zip),
        Kind::Png => single(ExportType::Png),
        Kind::Pdf => single(ExportType::Pdf),
        Kind::Parquet => single(ExportType::Parquet),
        Kind::Binary(_) => (None, not_allowed()),
        Kind::Text | Kind::Script => {
            let text_types: Vec<ExportType> =
                rule.types.iter().copied().filter(|t| t.is_text()).collect();
            if text_types.is_empty() {
                return (None, not_allowed());
            }
            let mut failures = Vec::new();
            // The most specific type first: a JSON file is text too.
            for ty in [
                ExportType::Json,
                ExportType::Ndjson,
                ExportType::Csv,
                ExportType::Text,
            ] {
                if !text_types.contains(&ty) {
                    continue;
                }
                match validate(ty, bytes, rule.csv.as_ref()) {
                    Ok(()) => return (Some(ty), Vec::new()),
                    Err(e) => failures.push(format!("not valid {}: {}", ty.as_str(), e.detail)),
                }
            }
            (
                None,
                vec![reject(RejectRule::InvalidContent, failures.join("; "))],
            )
        }
    }
}
