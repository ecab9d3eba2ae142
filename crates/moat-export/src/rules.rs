//! The export rules (their model is `moat_core::exports`) compiled for
//! the verifier: each glob checked and built once.

use globset::{Glob, GlobBuilder, GlobMatcher};
pub use moat_core::exports::{
    CsvShape, DEFAULT_MAX_BYTES, DEFAULT_MAX_FILES, DEFAULT_MAX_TOTAL_BYTES, ExportRule,
    ExportRules, ExportType,
};

use crate::ExportError;

/// Rules checked and their globs compiled.
#[derive(Debug, Clone)]
pub struct CompiledRules {
    pub rules: Vec<(ExportRule, GlobMatcher)>,
    pub max_files: u64,
    pub max_total_bytes: u64,
    pub secret_scan: bool,
}

/// Parses rules from JSON, with a message naming what is wrong.
pub fn parse(bytes: &[u8]) -> Result<ExportRules, ExportError> {
    serde_json::from_slice(bytes).map_err(|e| ExportError::Rules(e.to_string()))
}

/// Checks every rule and compiles its glob.
pub fn compile(rules: &ExportRules) -> Result<CompiledRules, ExportError> {
    rules.check().map_err(ExportError::Rules)?;
    let mut compiled = Vec::with_capacity(rules.rules.len());
    for (i, rule) in rules.rules.iter().enumerate() {
        let path = rule.path.as_str();
        let glob: Glob = GlobBuilder::new(path)
            .literal_separator(true)
            .backslash_escape(true)
            .build()
            .map_err(|e| ExportError::Rules(format!("rules[{i}]: path {path:?}: {e}")))?;
        compiled.push((rule.clone(), glob.compile_matcher()));
    }
    Ok(CompiledRules {
        rules: compiled,
        max_files: rules.max_files.unwrap_or(DEFAULT_MAX_FILES),
        max_total_bytes: rules.max_total_bytes.unwrap_or(DEFAULT_MAX_TOTAL_BYTES),
        secret_scan: rules.secret_scan.unwrap_or(true),
    })
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
        compile(&parse(json.as_bytes())?)
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
