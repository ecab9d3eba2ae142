//! Export rules: which files a program wrote may leave, as what, how big.
//!
//! The same JSON is a manifest's `exports` and `moat export --rules`; its
//! JSON Schema is published at `docs/schema/export-rules.schema.json`.

use globset::{Glob, GlobBuilder, GlobMatcher};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ExportError;

/// Largest file a rule lets out when it names no `maxBytes` (100 MiB).
pub const DEFAULT_MAX_BYTES: u64 = 100 << 20;
/// Largest sum of a run's exported files by default (1 GiB).
pub const DEFAULT_MAX_TOTAL_BYTES: u64 = 1 << 30;
/// Most files a run exports by default.
pub const DEFAULT_MAX_FILES: u64 = 1000;
/// Longest glob accepted.
const MAX_GLOB: usize = 1024;
/// Most rules accepted.
const MAX_RULES: usize = 256;

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

/// Rules checked and their globs compiled.
#[derive(Debug, Clone)]
pub struct CompiledRules {
    pub rules: Vec<(ExportRule, GlobMatcher)>,
    pub max_files: u64,
    pub max_total_bytes: u64,
    pub secret_scan: bool,
}

impl ExportRules {
    /// Parses rules from JSON, with a message naming what is wrong.
    pub fn from_json(bytes: &[u8]) -> Result<ExportRules, ExportError> {
        serde_json::from_slice(bytes).map_err(|e| ExportError::Rules(e.to_string()))
    }

    /// Checks every rule and compiles its glob.
    pub fn compile(&self) -> Result<CompiledRules, ExportError> {
        let bad = |i: usize, why: String| ExportError::Rules(format!("rules[{i}]: {why}"));
        if self.rules.is_empty() {
            return Err(ExportError::Rules(
                "no rules: nothing could be exported".into(),
            ));
        }
        if self.rules.len() > MAX_RULES {
            return Err(ExportError::Rules(format!(
                "{} rules; at most {MAX_RULES}",
                self.rules.len()
            )));
        }
        let mut rules = Vec::with_capacity(self.rules.len());
        for (i, rule) in self.rules.iter().enumerate() {
            let path = rule.path.as_str();
            if path.is_empty() || path.len() > MAX_GLOB {
                return Err(bad(i, format!("path must be 1 to {MAX_GLOB} bytes")));
            }
            if path.starts_with('/') || path.split('/').any(|c| c == "..") || path.contains('\0') {
                return Err(bad(
                    i,
                    format!("path {path:?} must be relative, without `..` or NUL"),
                ));
            }
            if rule.types.is_empty() {
                return Err(bad(
                    i,
                    "types is empty: the rule would let nothing out".into(),
                ));
            }
            if rule.max_bytes == Some(0) {
                return Err(bad(i, "maxBytes is 0".into()));
            }
            if rule.csv.is_some() && !rule.types.contains(&ExportType::Csv) {
                return Err(bad(
                    i,
                    "csv shape given but csv is not among the types".into(),
                ));
            }
            if let Some(shape) = &rule.csv {
                csv_delimiter(shape).map_err(|why| bad(i, why))?;
                if let (Some(header), Some(columns)) = (&shape.header, shape.columns)
                    && header.len() != columns
                {
                    return Err(bad(
                        i,
                        format!(
                            "csv header has {} names, columns says {columns}",
                            header.len()
                        ),
                    ));
                }
            }
            let glob: Glob = GlobBuilder::new(path)
                .literal_separator(true)
                .backslash_escape(true)
                .build()
                .map_err(|e| bad(i, format!("path {path:?}: {e}")))?;
            rules.push((rule.clone(), glob.compile_matcher()));
        }
        Ok(CompiledRules {
            rules,
            max_files: self.max_files.unwrap_or(DEFAULT_MAX_FILES),
            max_total_bytes: self.max_total_bytes.unwrap_or(DEFAULT_MAX_TOTAL_BYTES),
            secret_scan: self.secret_scan.unwrap_or(true),
        })
    }
}

/// The delimiter byte of `shape` (default `,`).
pub(crate) fn csv_delimiter(shape: &CsvShape) -> Result<u8, String> {
    match shape.delimiter.as_deref() {
        None => Ok(b','),
        Some(d) if d.len() == 1 && d.is_ascii() && d != "\"" && d != "\n" && d != "\r" => {
            Ok(d.as_bytes()[0])
        }
        Some(d) => Err(format!(
            "csv delimiter {d:?} must be one ASCII character other than a quote or a line break"
        )),
    }
}

impl CompiledRules {
    /// The first rule matching `path` (relative, `/`-separated).
    pub fn rule_for(&self, path: &str) -> Option<&ExportRule> {
        self.rules
            .iter()
            .find(|(_, glob)| glob.is_match(path))
            .map(|(rule, _)| rule)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(json: &str) -> Result<CompiledRules, ExportError> {
        ExportRules::from_json(json.as_bytes())?.compile()
    }

    #[test]
    fn star_stays_in_a_directory_and_double_star_crosses() -> Result<(), ExportError> {
        let r = rules(
            r#"{"rules":[{"path":"clean/*.csv","types":["csv"]},{"path":"deep/**/*.json","types":["json"]}]}"#,
        )?;
        assert!(r.rule_for("clean/a.csv").is_some());
        assert!(r.rule_for("clean/sub/a.csv").is_none());
        assert!(r.rule_for("deep/a/b/c.json").is_some());
        assert!(r.rule_for("deep/c.json").is_some());
        assert!(r.rule_for("other.csv").is_none());
        Ok(())
    }

    #[test]
    fn bad_rules_are_refused_with_their_index() {
        for (json, needle) in [
            (r#"{"rules":[]}"#, "no rules"),
            (
                r#"{"rules":[{"path":"/abs","types":["text"]}]}"#,
                "rules[0]",
            ),
            (
                r#"{"rules":[{"path":"a/../b","types":["text"]}]}"#,
                "must be relative",
            ),
            (r#"{"rules":[{"path":"a","types":[]}]}"#, "types is empty"),
            (
                r#"{"rules":[{"path":"a","types":["exe"]}]}"#,
                "unknown variant",
            ),
            (
                r#"{"rules":[{"path":"a","types":["text"],"csv":{}}]}"#,
                "csv shape",
            ),
            (
                r#"{"rules":[{"path":"a[","types":["text"]}]}"#,
                "rules[0]: path",
            ),
            (
                r#"{"rules":[{"path":"a","types":["csv"],"csv":{"delimiter":"ab"}}]}"#,
                "delimiter",
            ),
            (
                r#"{"rules":[{"path":"a","types":["text"],"maxBytes":0}]}"#,
                "maxBytes is 0",
            ),
            (
                r#"{"rules":[{"path":"a","types":["text"],"extra":1}]}"#,
                "unknown field",
            ),
        ] {
            let err = rules(json).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains(needle), "{json}: {err}");
        }
    }
}
