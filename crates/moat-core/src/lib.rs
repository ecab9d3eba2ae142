//! Moat's pure model: the vocabulary every layer shares.
//!
//! Nothing here performs I/O but drawing randomness ([`random`]). Types are serde-serialisable with camelCase
//! field names (the wire protocol) and derive JSON Schemas (see [`schema`]).
// Only moat-sandbox may hold unsafe code (each block with its SAFETY line).
#![forbid(unsafe_code)]

pub mod capability;
pub mod denial;
pub mod element;
pub mod event;
pub mod event_data;
pub mod exports;
pub mod hash;
pub mod host;
pub mod ids;
pub mod lifecycle;
pub mod limits;
pub mod manifest;
pub mod mode;
pub mod op;
pub mod quota;
pub mod random;
pub mod report;
pub mod request_sig;
pub mod schema;
pub mod scrub;
pub mod sign;
pub mod size;
pub mod strict;
pub mod text;
pub mod time;
pub mod url;

pub use denial::DenialReason;
pub use event::{Event, EventData, EventSink, EventType};
pub use limits::Limits;
pub use manifest::{Manifest, ManifestError, NetworkPolicy, NetworkProfile, SignedManifest};
pub use mode::{ExecutableOrigin, NetworkMode, RootView, SandboxMode, WorkloadClass};
pub use op::{Envelope, OpKind, OpResult, OpStatus};
pub use report::{
    Accelerator, Enforcement, ExitStatus, LayerReport, LayerStatus, LimitMechanism, LimitReport,
    OutputReport, SandboxReport, SyscallDenial, Violation, VmReport, WorkerReport,
};
