use std::path::PathBuf;

/// Why a worker could not be loaded or started (a guest that fails once
/// started is an [`crate::Outcome`], not an error).
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("setting up the WebAssembly engine: {0:#}")]
    Engine(anyhow::Error),
    #[error("the compile cache at {path}: {source:#}")]
    Cache {
        path: PathBuf,
        source: anyhow::Error,
    },
    #[error(
        "not a WebAssembly component: {0:#} (a worker is a WASI 0.2 component; \
         `moat worker build` makes one from Python or JavaScript)"
    )]
    NotAComponent(anyhow::Error),
    #[error("the component cannot be linked: {0:#} (a worker may import WASI 0.2 only)")]
    Link(anyhow::Error),
    #[error("the component exports no `wasi:cli/run`: {0:#}")]
    NoEntryPoint(anyhow::Error),
}
