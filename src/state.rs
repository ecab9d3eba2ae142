//! Where Moat keeps its state: the ledger and the artifact store.

use std::path::PathBuf;

use anyhow::Context;

/// `--state DIR`, else `$MOAT_STATE`, else `$XDG_STATE_HOME/moat`, else
/// `~/.local/state/moat`. Created (mode 0700) if missing.
pub fn dir(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let dir = given
        .or_else(|| std::env::var_os("MOAT_STATE").map(PathBuf::from))
        .or_else(|| std::env::var_os("XDG_STATE_HOME").map(|d| PathBuf::from(d).join("moat")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state/moat")))
        .context("no state directory: pass --state DIR")?;
    if !dir.exists() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("creating the state directory {}", dir.display()))?;
    }
    Ok(dir)
}
