//! Export rules: which files a program wrote may leave, as what, how big.
//! A manifest's `exports`, and `moat export --rules`. The verifier that
//! applies them is `moat-export` (it also checks each glob's syntax).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Largest file a rule lets out when it names no `maxBytes` (100 MiB).
pub const DEFAULT_MAX_BYTES: u64 = 100 << 20;
/// Largest sum of a run's exported files by default (1 GiB).
pub const DEFAULT_MAX_TOTAL_BYTES: u64 = 1 << 30;
/// Most files a run exports by default.
pub const DEFAULT_MAX_FILES: u64 = 1000;
/// Longest glob accepted.
pub const MAX_GLOB: usize = 1024;
/// Most rules accepted.
pub const MAX_RULES: usize = 256;

/// The export rules of a run (or of `moat export`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExportRules {
    /// Rules in order: a file is judged by the first whose `path` matches
    /// it; a file no rule matches is not exported.
    pub rules: Vec<ExportRule>,
    /// Most files exported in all (default 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_files: Option<u64>,
    /// Most bytes exported in all (default 1 GiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_total_bytes: Option<u64>,
    /// Look for the org's secrets (and common token shapes) in every
    /// candidate; on by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_scan: Option<bool>,
}

/// One rule: files under a glob, the types they may be, their size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExportRule {
    /// A glob over the path relative to the exported directory: `*` stays
    /// within one directory, `**` crosses them (`clean/**/*.csv`).
    pub path: String,
    /// What the content may be, detected from the bytes, never from the
    /// name. Text types are also validated (JSON parses, CSV is
    /// rectangular, text is UTF-8); archives are refused unless listed.
    pub types: Vec<ExportType>,
    /// Largest file (default 100 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    /// CSV's shape, when `csv` is among the types.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csv: Option<CsvShape>,
    /// A text file may start with `#!` (a script); refused otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_shebang: bool,
}

/// CSV's expected shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CsvShape {
    /// The first row, exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<Vec<String>>,
    /// Fields per row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub columns: Option<usize>,
    /// One ASCII character (default `,`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delimiter: Option<String>,
}

/// The types a file may be, detected from its content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExportType {
    /// UTF-8 text without NUL bytes.
    Text,
    /// One JSON document.
    Json,
    /// JSON documents, one per line.
    Ndjson,
    /// Rectangular CSV (UTF-8).
    Csv,
    /// A PNG image that decodes.
    Png,
    /// A PDF document (header and end-of-file marker).
    Pdf,
    /// A Parquet file (magic at both ends, a footer that fits).
    Parquet,
    /// A gzip stream; decompressed within limits and scanned.
    Gzip,
    /// A tar archive of regular files; scanned.
    Tar,
    /// A zip archive of regular files, stored or deflated; decompressed
    /// within limits, checked entry by entry and scanned.
    Zip,
}

impl ExportType {
    pub fn as_str(self) -> &'static str {
        match self {
            ExportType::Text => "text",
            ExportType::Json => "json",
            ExportType::Ndjson => "ndjson",
            ExportType::Csv => "csv",
            ExportType::Png => "png",
            ExportType::Pdf => "pdf",
            ExportType::Parquet => "parquet",
            ExportType::Gzip => "gzip",
            ExportType::Tar => "tar",
            ExportType::Zip => "zip",
        }
    }

    /// Validated as text first (UTF-8, no NUL).
    pub fn is_text(self) -> bool {
        matches!(
            self,
            ExportType::Text | ExportType::Json | ExportType::Ndjson | ExportType::Csv
        )
    }
}

impl ExportRules {
    /// Checks the rules' shape (everything but each glob's syntax, which
    /// the verifier compiles): the first problem, naming its rule.
    pub fn check(&self) -> Result<(), String> {
        if self.rules.is_empty() {
            return Err("no rules: nothing could be exported".into());
        }
        if self.rules.len() > MAX_RULES {
            return Err(format!("{} rules; at most {MAX_RULES}", self.rules.len()));
        }
        for (i, rule) in self.rules.iter().enumerate() {
            rule.check().map_err(|why| format!("rules[{i}]: {why}"))?;
        }
        Ok(())
    }
}

impl ExportRule {
    fn check(&self) -> Result<(), String> {
        let path = self.path.as_str();
        if path.is_empty() || path.len() > MAX_GLOB {
            return Err(format!("path must be 1 to {MAX_GLOB} bytes"));
        }
        if path.starts_with('/') || path.split('/').any(|c| c == "..") || path.contains('\0') {
            return Err(format!(
                "path {path:?} must be relative, without `..` or NUL"
            ));
        }
        if self.types.is_empty() {
            return Err("types is empty: the rule would let nothing out".into());
        }
        if self.max_bytes == Some(0) {
            return Err("maxBytes is 0".into());
        }
        if self.csv.is_some() && !self.types.contains(&ExportType::Csv) {
            return Err("csv shape given but csv is not among the types".into());
        }
        if let Some(shape) = &self.csv {
            shape.delimiter_byte()?;
            if let (Some(header), Some(columns)) = (&shape.header, shape.columns)
                && header.len() != columns
            {
                return Err(format!(
                    "csv header has {} names, columns says {columns}",
                    header.len()
                ));
            }
        }
        Ok(())
    }
}

impl CsvShape {
    /// The delimiter byte (default `,`).
    pub fn delimiter_byte(&self) -> Result<u8, String> {
        match self.delimiter.as_deref() {
            None => Ok(b','),
            Some(d) if d.len() == 1 && d.is_ascii() && d != "\"" && d != "\n" && d != "\r" => {
                Ok(d.as_bytes()[0])
            }
            Some(d) => Err(format!(
                "csv delimiter {d:?} must be one ASCII character other than a quote or a line break"
            )),
        }
    }
}

/// One broken rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rejection {
    pub rule: RejectRule,
    pub detail: String,
}

/// The rules a file can break: a closed set, the label of the export
/// metrics' rejection counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RejectRule {
    /// A name that is not UTF-8 or holds control characters.
    BadName,
    /// No rule's path matches it.
    NoRule,
    Symlink,
    /// A regular file with more than one link.
    Hardlink,
    /// A device, FIFO or socket.
    SpecialFile,
    /// Setuid or setgid bits.
    Setid,
    /// Over its rule's `maxBytes`.
    TooLarge,
    /// Would take the run past `maxTotalBytes`.
    RunTooLarge,
    /// Would take the run past `maxFiles`.
    TooManyFiles,
    /// Machine code or bytecode.
    Executable,
    /// A `#!` script where the rule does not allow one.
    Shebang,
    /// An archive or compressed format its rule does not list (or cannot be checked).
    Archive,
    /// A decompression bomb.
    ArchiveBomb,
    /// Detected as a type its rule does not list.
    TypeNotAllowed,
    /// Listed, but does not validate as any of its rule's types.
    InvalidContent,
    /// Holds one of the org's secrets.
    Secret,
    /// Holds something shaped like a credential.
    Token,
    /// Could not be read (or changed while being read).
    Unreadable,
    /// The verifier crashed, ran out of memory or out of time on it.
    VerifierFailed,
    /// No policy permits it to leave (or one forbids it).
    Policy,
    /// The approval the policy asked for was denied, or nobody gave it in time.
    NotApproved,
}

impl RejectRule {
    /// Every rule, for the metrics' closed label set.
    pub const ALL: &'static [RejectRule] = &[
        RejectRule::BadName,
        RejectRule::NoRule,
        RejectRule::Symlink,
        RejectRule::Hardlink,
        RejectRule::SpecialFile,
        RejectRule::Setid,
        RejectRule::TooLarge,
        RejectRule::RunTooLarge,
        RejectRule::TooManyFiles,
        RejectRule::Executable,
        RejectRule::Shebang,
        RejectRule::Archive,
        RejectRule::ArchiveBomb,
        RejectRule::TypeNotAllowed,
        RejectRule::InvalidContent,
        RejectRule::Secret,
        RejectRule::Token,
        RejectRule::Unreadable,
        RejectRule::VerifierFailed,
        RejectRule::Policy,
        RejectRule::NotApproved,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RejectRule::BadName => "bad_name",
            RejectRule::NoRule => "no_rule",
            RejectRule::Symlink => "symlink",
            RejectRule::Hardlink => "hardlink",
            RejectRule::SpecialFile => "special_file",
            RejectRule::Setid => "setid",
            RejectRule::TooLarge => "too_large",
            RejectRule::RunTooLarge => "run_too_large",
            RejectRule::TooManyFiles => "too_many_files",
            RejectRule::Executable => "executable",
            RejectRule::Shebang => "shebang",
            RejectRule::Archive => "archive",
            RejectRule::ArchiveBomb => "archive_bomb",
            RejectRule::TypeNotAllowed => "type_not_allowed",
            RejectRule::InvalidContent => "invalid_content",
            RejectRule::Secret => "secret",
            RejectRule::Token => "token",
            RejectRule::Unreadable => "unreadable",
            RejectRule::VerifierFailed => "verifier_failed",
            RejectRule::Policy => "policy",
            RejectRule::NotApproved => "not_approved",
        }
    }
}
