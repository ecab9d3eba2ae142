//! A run's files on the runner: its private workspace, its inputs written
//! in, and the artifacts a result names read back from the shell's store.

use std::io::Read as _;
use std::path::Path;

use base64::Engine as _;
use moat_api::RunInput;
use moat_api::runner::ReportedArtifact;
use moat_core::OpResult;

use crate::error::{IoContext as _, RunnerError};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Makes `dir` (if missing) and leaves it to the runner's user alone: the
/// ledger, artifacts and workspaces of every run live under it.
/// One that exists must be a real directory of the runner's user (else its
/// owner could still open it), and is closed to everyone else.
pub fn private_dir(dir: &Path) -> Result<(), RunnerError> {
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
    let name = || dir.display().to_string();
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).io(name),
    }
    let meta = std::fs::symlink_metadata(dir).io(name)?;
    // /proc/self belongs to this process's effective uid.
    let me = std::fs::metadata("/proc/self")
        .io(|| "/proc/self".into())?
        .uid();
    if !meta.is_dir() || meta.uid() != me {
        return Err(RunnerError::Setup(format!(
            "{} must be a directory owned by this runner's user (uid {me}), not a link or \
             another user's (uid {})",
            dir.display(),
            meta.uid()
        )));
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).io(name)
}

/// Writes a run's inputs into its workspace: exactly the bytes the agent
/// gave, checked against their recorded hashes, at plain relative paths.
pub fn write_inputs(workspace: &Path, inputs: &[RunInput]) -> Result<(), RunnerError> {
    for input in inputs {
        let path = input.path.as_str();
        if path.starts_with('/')
            || path
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..")
        {
            return Err(RunnerError::Protocol(format!(
                "input path {path:?} is not a plain relative path"
            )));
        }
        let content = input
            .content_base64
            .as_deref()
            .ok_or_else(|| RunnerError::Protocol(format!("input {path}: no content")))?;
        let bytes = B64
            .decode(content)
            .map_err(|e| RunnerError::Protocol(format!("input {path}: {e}")))?;
        if input.sha256 != moat_core::hash::sha256_hex(&bytes) {
            return Err(RunnerError::Protocol(format!(
                "input {path}: content does not match its sha256"
            )));
        }
        let target = workspace.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).io(|| format!("input {path}"))?;
        }
        std::fs::write(&target, bytes).io(|| format!("writing input {path}"))?;
    }
    Ok(())
}

/// The artifacts `result` names, with their bytes from the shell's store
/// under `state`.
pub fn collect_artifacts(
    state: &Path,
    result: &OpResult,
) -> Result<Vec<ReportedArtifact>, RunnerError> {
    let mut out = Vec::new();
    for a in &result.artifacts {
        let sha = a.sha256.as_str();
        if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        let path = state.join("artifacts").join(&sha[..2]).join(sha);
        let mut bytes = Vec::new();
        std::fs::File::open(&path)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .io(|| format!("artifact {sha}"))?;
        out.push(ReportedArtifact {
            sha256: sha.to_owned(),
            kind: a.kind.clone(),
            label: a.label.clone(),
            content_base64: B64.encode(&bytes),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(path: &str, bytes: &[u8], sha: Option<&str>) -> RunInput {
        RunInput {
            path: path.into(),
            sha256: sha.map_or_else(|| moat_core::hash::sha256_hex(bytes), str::to_owned),
            size: bytes.len() as u64,
            content_base64: Some(B64.encode(bytes)),
        }
    }

    #[test]
    fn inputs_land_as_given_and_odd_ones_are_refused() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        write_inputs(dir.path(), &[input("input/a.txt", b"hi\n", None)])?;
        assert_eq!(std::fs::read(dir.path().join("input/a.txt"))?, b"hi\n");
        for bad in ["/etc/passwd", "input/../x", "input//x", "./x", ""] {
            assert!(
                write_inputs(dir.path(), &[input(bad, b"x", None)]).is_err(),
                "{bad:?}"
            );
        }
        let lying = input("input/b.txt", b"x", Some(&"0".repeat(64)));
        assert!(write_inputs(dir.path(), &[lying]).is_err());
        assert!(!dir.path().join("input/b.txt").exists());
        Ok(())
    }
}
