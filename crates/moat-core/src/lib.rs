//! Moat's pure model: the vocabulary every layer shares.
//!
//! Nothing here performs I/O. Types are serde-serialisable with camelCase
//! field names (the wire protocol) and derive JSON Schemas (see [`schema`]).

pub mod event;
pub mod limits;
pub mod mode;
pub mod report;
pub mod schema;
pub mod size;

pub use event::{Event, EventSink, EventType};
pub use limits::Limits;
pub use mode::{NetworkMode, RootView, SandboxMode};
pub use report::{
    Enforcement, ExitStatus, LayerReport, LayerStatus, OutputReport, SandboxReport, SyscallDenial,
};
