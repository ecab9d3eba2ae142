//! Moat's egress proxy: the only way out of a sandbox in the `proxy-only`
//! and `allowlist` network modes, and the client behind `http_request`.
//!
//! - [`rules`]: domain allow/deny rules, refused at load when too broad.
//! - [`addr`]: which resolved addresses may be dialled (no loopback, private,
//!   link-local, CGNAT, metadata or unique-local unless listed).
//! - [`sni`]: the server name of a TLS ClientHello.
//! - [`outbound`]: resolve once, check every address, dial only those; shared
//!   by the proxy and the control plane's tool calls.
//! - [`Egress`]: the handle on the proxy process of one run and its control
//!   channel; [`serve_proxy`]: that process's body.
//!
//! Every request emits `network.request` (host, port, method, bytes,
//! decision — never bodies or headers); every refusal also `network.denied`
//! and, for proxied requests, a 403 with `X-Moat-Denied: <reason>`; an
//! allowed server out of reach is a 502 with `X-Moat-Denied:
//! upstream_unreachable`.
// Only moat-sandbox may hold unsafe code (each block with its SAFETY line).
#![forbid(unsafe_code)]

pub mod addr;
pub mod channel;
mod fetch;
mod gate;
mod host;
pub mod idle;
pub mod outbound;
pub mod policy;
mod proxy;
pub mod rules;
pub mod sni;

pub use fetch::{FetchError, FetchRequest, FetchResponse, is_credential_header};
pub use host::{Egress, EgressError, PROXY_READABLE, ProxyProcess, Served, serve_proxy};
pub use policy::{EgressConfig, EgressLimits, EgressPolicy, PolicyError, parse_resolve};
