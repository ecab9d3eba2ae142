//! Moat's bindings (`wit/worker.wit`): what a worker reaches beyond WASI,
//! each only where the run grants it, every call recorded.
//!
//! `inputs` and `outputs` are directories the process was given (in
//! `moat exec`, the sandbox's mounts of `--input` and `--output`): files
//! are opened beneath them from directory handles, a component at a time,
//! never following a link, so a name cannot leave them.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{Mode, OFlags};

use crate::host::Host;
pub use moat_worker_api::BindingUse;

wasmtime::component::bindgen!({
    path: "../moat-worker-api/wit",
    world: "moat:worker/bindings",
});

use moat::worker::types::BindingError;

/// What a run may reach through the bindings.
#[derive(Debug, Clone, Default)]
pub struct Grants {
    /// The inputs' root (read-only use).
    pub inputs: Option<std::path::PathBuf>,
    /// The outputs' root.
    pub outputs: Option<std::path::PathBuf>,
    /// Bytes all outputs together may hold.
    pub max_output_bytes: u64,
    /// Bytes one input read may return.
    pub max_read_bytes: u64,
    /// The egress proxy the `http` binding sends through (the sandbox's
    /// `HTTP_PROXY`); `None`: not granted.
    pub http_proxy: Option<String>,
    /// The `kv` binding: the granted namespaces as they were at the start.
    pub kv: Option<moat_worker_api::KvSnapshot>,
    /// The queues `queue.send` may send to.
    pub queues: Vec<String>,
    /// The message (JSON text) this invocation was started for.
    pub message: Option<String>,
}

/// Calls past this many are counted, not kept.
pub(crate) const MAX_USES: usize = 256;

/// Longest name a binding takes.
const MAX_NAME: usize = 1024;

/// Most files `inputs.names` returns.
const MAX_LISTED: usize = 10_000;

/// The open roots and what has been used of them in one invocation.
pub(crate) struct BindingState {
    inputs: Option<OwnedFd>,
    outputs: Option<OwnedFd>,
    http: Option<crate::http::Client>,
    pub(crate) grants: Grants,
    written: u64,
    /// The namespaces with this invocation's writes applied.
    pub(crate) kv: Option<moat_worker_api::KvSnapshot>,
    pub effects: moat_worker_api::Effects,
    pub uses: Vec<BindingUse>,
    pub dropped: u64,
}

impl BindingState {
    /// Opens the granted roots; a root that cannot be opened is refused
    /// before the guest starts.
    pub fn open(grants: &Grants) -> std::io::Result<BindingState> {
        let dir = |path: &Option<std::path::PathBuf>| -> std::io::Result<Option<OwnedFd>> {
            path.as_deref().map(open_dir).transpose()
        };
        let http = match &grants.http_proxy {
            None => None,
            Some(proxy) => {
                Some(crate::http::Client::through(proxy).map_err(std::io::Error::other)?)
            }
        };
        Ok(BindingState {
            inputs: dir(&grants.inputs)?,
            outputs: dir(&grants.outputs)?,
            http,
            kv: grants.kv.clone(),
            grants: grants.clone(),
            written: 0,
            effects: moat_worker_api::Effects::default(),
            uses: Vec::new(),
            dropped: 0,
        })
    }

    pub(crate) fn record(
        &mut self,
        binding: &str,
        call: &str,
        name: Option<&str>,
        bytes: u64,
        outcome: &str,
    ) {
        if self.uses.len() >= MAX_USES {
            self.dropped += 1;
            return;
        }
        self.uses.push(BindingUse {
            binding: binding.into(),
            call: call.into(),
            name: name.map(printable),
            bytes,
            outcome: outcome.into(),
        });
    }
}

fn open_dir(path: &Path) -> std::io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// `name` (plain components, checked by [`valid`], or `.`) beneath `dir`,
/// one component at a time, none of them a link: with no `..` and no link
/// followed, nothing leads out. (The walk, not `openat2`'s
/// `RESOLVE_BENEATH`: the sandbox's seccomp filter answers `openat2` with
/// `ENOSYS`, since it cannot look into its arguments.)
fn beneath(dir: &OwnedFd, name: &str, flags: OFlags, mode: Mode) -> rustix::io::Result<OwnedFd> {
    let (parents, last) = match name.rsplit_once('/') {
        Some((parents, last)) => (Some(parents), last),
        None => (None, name),
    };
    let mut current: Option<OwnedFd> = None;
    for part in parents.into_iter().flat_map(|p| p.split('/')) {
        let at = current.as_ref().unwrap_or(dir);
        current = Some(rustix::fs::openat(
            at,
            part,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?);
    }
    let at = current.as_ref().unwrap_or(dir);
    rustix::fs::openat(at, last, flags | OFlags::CLOEXEC | OFlags::NOFOLLOW, mode)
}

fn printable(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .take(MAX_NAME)
        .collect()
}

/// A relative name of plain components.
fn valid(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.chars().any(char::is_control)
        && name
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
}

pub(crate) fn code(error: &BindingError) -> &'static str {
    match error {
        BindingError::NotGranted => "not-granted",
        BindingError::NotFound => "not-found",
        BindingError::InvalidName => "invalid-name",
        BindingError::TooLarge => "too-large",
        BindingError::Failed(_) => "failed",
    }
}

pub(crate) fn failed(error: impl std::fmt::Display) -> BindingError {
    BindingError::Failed(error.to_string())
}

fn io_error(error: rustix::io::Errno) -> BindingError {
    match error {
        rustix::io::Errno::NOENT => BindingError::NotFound,
        // A link on the way (never followed).
        rustix::io::Errno::LOOP => BindingError::InvalidName,
        rustix::io::Errno::NOTDIR => BindingError::NotFound,
        other => failed(std::io::Error::from(other)),
    }
}

impl moat::worker::types::Host for Host {}

impl moat::worker::inputs::Host for Host {
    fn names(&mut self) -> Result<Vec<String>, BindingError> {
        let result = match &self.bindings.inputs {
            None => Err(BindingError::NotGranted),
            Some(root) => {
                let mut names = Vec::new();
                list_into(root, "", &mut names).map(|()| {
                    names.sort();
                    names
                })
            }
        };
        let (bytes, outcome) = match &result {
            Ok(names) => (names.len() as u64, "ok"),
            Err(e) => (0, code(e)),
        };
        self.bindings
            .record("inputs", "names", None, bytes, outcome);
        result
    }

    fn read(&mut self, name: String) -> Result<Vec<u8>, BindingError> {
        let max = self.bindings.grants.max_read_bytes;
        let result = match &self.bindings.inputs {
            None => Err(BindingError::NotGranted),
            Some(_) if !valid(&name) => Err(BindingError::InvalidName),
            Some(root) => read_beneath(root, &name, max),
        };
        let (bytes, outcome) = match &result {
            Ok(data) => (data.len() as u64, "ok"),
            Err(e) => (0, code(e)),
        };
        self.bindings
            .record("inputs", "read", Some(&name), bytes, outcome);
        result
    }
}

impl moat::worker::outputs::Host for Host {
    fn write(&mut self, name: String, data: Vec<u8>) -> Result<(), BindingError> {
        let room = self
            .bindings
            .grants
            .max_output_bytes
            .saturating_sub(self.bindings.written);
        let result = match &self.bindings.outputs {
            None => Err(BindingError::NotGranted),
            Some(_) if !valid(&name) => Err(BindingError::InvalidName),
            Some(_) if data.len() as u64 > room => Err(BindingError::TooLarge),
            Some(root) => write_beneath(root, &name, &data),
        };
        if result.is_ok() {
            self.bindings.written += data.len() as u64;
        }
        let outcome = match &result {
            Ok(()) => "ok",
            Err(e) => code(e),
        };
        self.bindings
            .record("outputs", "write", Some(&name), data.len() as u64, outcome);
        result
    }
}

impl moat::worker::http::Host for Host {
    fn fetch(
        &mut self,
        method: String,
        url: String,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    ) -> Result<moat::worker::http::Response, BindingError> {
        let max = self.bindings.grants.max_read_bytes;
        let sent = body.len() as u64;
        let result = match &self.bindings.http {
            None => Err(BindingError::NotGranted),
            Some(client) => client.fetch(&method, &url, &headers, body, max),
        };
        let (bytes, outcome) = match &result {
            Ok(response) => (sent + response.body.len() as u64, "ok"),
            Err(e) => (sent, code(e)),
        };
        let shown = crate::http::recorded(&method, &url);
        self.bindings
            .record("http", "fetch", Some(&shown), bytes, outcome);
        result
    }
}

fn list_into(dir: &OwnedFd, prefix: &str, names: &mut Vec<String>) -> Result<(), BindingError> {
    let handle =
        beneath(dir, ".", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).map_err(io_error)?;
    let entries = rustix::fs::Dir::read_from(&handle).map_err(io_error)?;
    for entry in entries {
        let entry = entry.map_err(io_error)?;
        let Ok(name) = entry.file_name().to_str() else {
            continue;
        };
        if name == "." || name == ".." {
            continue;
        }
        let full = if prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{prefix}/{name}")
        };
        match entry.file_type() {
            rustix::fs::FileType::RegularFile => {
                if names.len() >= MAX_LISTED {
                    return Err(BindingError::TooLarge);
                }
                names.push(full);
            }
            rustix::fs::FileType::Directory => {
                let sub = beneath(
                    &handle,
                    name,
                    OFlags::RDONLY | OFlags::DIRECTORY,
                    Mode::empty(),
                )
                .map_err(io_error)?;
                list_into(&sub, &full, names)?;
            }
            // Links, sockets, devices: not inputs.
            _ => {}
        }
    }
    Ok(())
}

fn read_beneath(root: &OwnedFd, name: &str, max: u64) -> Result<Vec<u8>, BindingError> {
    let fd = beneath(root, name, OFlags::RDONLY, Mode::empty()).map_err(io_error)?;
    let stat = rustix::fs::fstat(&fd).map_err(io_error)?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(BindingError::NotFound);
    }
    let mut data = Vec::new();
    std::fs::File::from(fd)
        .take(max.saturating_add(1))
        .read_to_end(&mut data)
        .map_err(failed)?;
    if data.len() as u64 > max {
        return Err(BindingError::TooLarge);
    }
    Ok(data)
}

fn write_beneath(root: &OwnedFd, name: &str, data: &[u8]) -> Result<(), BindingError> {
    let (parents, file) = match name.rsplit_once('/') {
        Some((parents, file)) => (Some(parents), file),
        None => (None, name),
    };
    let mut dir =
        beneath(root, ".", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).map_err(io_error)?;
    for part in parents.into_iter().flat_map(|p| p.split('/')) {
        match rustix::fs::mkdirat(&dir, part, Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(io_error(e)),
        }
        dir = beneath(
            &dir,
            part,
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )
        .map_err(io_error)?;
    }
    let fd = beneath(
        &dir,
        file,
        OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC,
        Mode::from_raw_mode(0o644),
    )
    .map_err(io_error)?;
    std::fs::File::from(fd).write_all(data).map_err(failed)
}

#[cfg(test)]
mod tests {
    use super::valid;

    #[test]
    fn a_name_is_relative_plain_components() {
        for good in ["a.csv", "data/a.csv", "x y/ü.txt"] {
            assert!(valid(good), "{good}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../b",
            "./a",
            "a//b",
            "a/",
            "a\nb",
        ] {
            assert!(!valid(bad), "{bad}");
        }
        assert!(!valid(&"a".repeat(1025)));
    }
}
