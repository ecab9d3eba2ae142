//! The closed set of reasons an operation can be denied. Every denial names
//! exactly one; `docs/protocol.md` has the table.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

macro_rules! reasons {
    ($($(#[doc = $doc:literal])* $variant:ident => $text:literal),+ $(,)?) => {
        /// Why an operation was denied.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
        pub enum DenialReason {
            $($(#[doc = $doc])* #[serde(rename = $text)] $variant),+
        }

        impl DenialReason {
            pub const ALL: &'static [DenialReason] = &[$(DenialReason::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self { $(DenialReason::$variant => $text),+ }
            }

            /// The one-line explanation of the table.
            pub fn describe(self) -> &'static str {
                match self { $(DenialReason::$variant => concat!($($doc),+).trim_ascii()),+ }
            }
        }
    };
}

reasons! {
    /// The line is not a JSON object of the envelope's shape (bad JSON, a missing, unknown or mistyped field, a line too long).
    InvalidEnvelope => "invalid_envelope",
    /// The operation's arguments do not match its schema.
    InvalidArgs => "invalid_args",
    /// A shell command string (`{"cmd": ...}`) was sent; only structured operations exist.
    RawShellUnsupported => "raw_shell_unsupported",
    /// The operation name is not one Moat knows.
    UnknownOp => "unknown_op",
    /// The manifest does not allow this operation.
    OpNotInManifest => "op_not_in_manifest",
    /// The manifest does not allow this sandbox mode.
    ModeNotAllowed => "mode_not_allowed",
    /// The manifest has expired (or is not valid yet).
    ManifestExpired => "manifest_expired",
    /// A path was absolute; paths are relative to a workspace root.
    AbsolutePath => "absolute_path",
    /// A path leaves its root (`..`, or resolves outside it).
    PathOutsideWorkspace => "path_outside_workspace",
    /// A path goes through a symbolic link or magic link that leaves its root.
    SymlinkEscape => "symlink_escape",
    /// Writes are allowed only under the output roots.
    WriteOutsideOutput => "write_outside_output",
    /// The file already exists and `overwrite` was not set.
    AlreadyExists => "already_exists",
    /// The path does not exist.
    NotFound => "not_found",
    /// The path is not a regular file (or, for listing, not a directory).
    WrongFileType => "wrong_file_type",
    /// The content or a requested size is above the operation's or manifest's cap.
    TooLarge => "too_large",
    /// The executable is not in the manifest's allowlist (or its hash differs).
    ExecutableNotAllowed => "executable_not_allowed",
    /// An environment variable outside the manifest's pass-through list was requested.
    EnvNotAllowed => "env_not_allowed",
    /// The operation asks for more network than the manifest grants.
    NetworkNotAllowed => "network_not_allowed",
    /// The domain is not in the network allowlist.
    DomainNotAllowed => "domain_not_allowed",
    /// The name resolves to (or is) an address the egress policy refuses: loopback, private, link-local, CGNAT, unique-local or a cloud metadata address.
    AddressNotAllowed => "address_not_allowed",
    /// The request names an IP address instead of a domain; allowlists are by name.
    IpLiteralNotAllowed => "ip_literal_not_allowed",
    /// The port is not allowed for this domain (a rule without a port allows 80 and 443).
    PortNotAllowed => "port_not_allowed",
    /// A CONNECT tunnel's TLS ClientHello names another server than the CONNECT target (or none, or is not TLS).
    SniMismatch => "sni_mismatch",
    /// A proxied request's `Host` header names another host than its URL.
    HostMismatch => "host_mismatch",
    /// The egress proxy speaks only HTTP proxy requests (`CONNECT host:port` or an absolute `http://` URL).
    NotAProxyRequest => "not_a_proxy_request",
    /// The program connected to an address itself instead of going through the egress proxy.
    DirectConnection => "direct_connection",
    /// The run used up its egress budget: requests, bytes or concurrent connections.
    EgressLimit => "egress_limit",
    /// An allowed server could not be reached: its name does not resolve, the connection is refused or times out, or the exchange with it broke off (the proxy answers `502`).
    UpstreamUnreachable => "upstream_unreachable",
    /// A limit asked for is above the manifest's.
    LimitExceeded => "limit_exceeded",
    /// The control plane's policy does not permit this operation.
    PolicyDenied => "policy_denied",
    /// A human must approve this operation first.
    ApprovalRequired => "approval_required",
    /// The approver refused this operation.
    ApprovalDenied => "approval_denied",
    /// Nobody approved this operation in time; it failed closed.
    ApprovalExpired => "approval_expired",
    /// The capability attached to the operation is missing, expired, replayed or does not match.
    CapabilityInvalid => "capability_invalid",
    /// The operation exists but this build cannot perform it (it never pretends to).
    Unsupported => "unsupported",
    /// The policy puts the program (or browser step) in a workload class the manifest does not list or the runner does not offer, or a browser step in a stronger class than its session's.
    ClassNotAvailable => "class_not_available",
    /// An acting browser step was not decided on the element it would act on (or that element changed since): the answer's `result.element` says what it found, for the control plane to decide on.
    ElementUnchecked => "element_unchecked",
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_is_snake_case_and_described() {
        for reason in DenialReason::ALL {
            let text = reason.as_str();
            assert!(
                text.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{text}"
            );
            assert!(reason.describe().len() > 10, "{text}");
        }
    }
}
