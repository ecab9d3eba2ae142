//! The decision every request goes through, whatever its form: budget,
//! name, rules, resolution, address checks, then a connection to exactly the
//! address that was checked (nothing is resolved twice, so there is no
//! window for DNS rebinding).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use moat_core::event_data::{NetworkDecision, NetworkDenied, NetworkRequest};
use moat_core::{DenialReason, Event, EventData};
use tokio::net::TcpStream;

use crate::outbound::{Gate, OutboundError};
use crate::policy::{CompiledPolicy, EgressConfig};
use crate::rules::normalize_host;

/// State of one proxy process: the run's settings and budget.
pub(crate) struct Run {
    pub(crate) config: EgressConfig,
    requests: AtomicU64,
    pub(crate) bytes: AtomicU64,
    open: AtomicU64,
    tls: std::sync::OnceLock<Result<Arc<rustls::ClientConfig>, String>>,
}

impl Run {
    pub(crate) fn new(config: EgressConfig) -> Arc<Run> {
        Arc::new(Run {
            config,
            requests: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            open: AtomicU64::new(0),
            tls: std::sync::OnceLock::new(),
        })
    }

    /// The TLS client settings for `http_request`, built on first use.
    pub(crate) fn tls_config(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        self.tls
            .get_or_init(|| crate::outbound::tls_config(self.config.extra_roots_pem.as_deref()))
            .clone()
    }

    /// Counts `n` more bytes; `false` once the run's byte budget is spent.
    pub(crate) fn spend(&self, n: usize) -> bool {
        let before = self.bytes.fetch_add(n as u64, Ordering::Relaxed);
        before + n as u64 <= self.config.limits.max_bytes
    }
}

/// One open tunnel or forwarded request, counted against the run's limit.
pub(crate) struct Slot(Arc<Run>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Who the requests are for (one sandbox, or one `http_request`), with
/// their rules and the events they produced.
pub(crate) struct Scope {
    pub(crate) run: Arc<Run>,
    pub(crate) policy: CompiledPolicy,
    pub(crate) op_id: Option<String>,
    events: Mutex<EventLog>,
}

/// Most events one scope keeps; past it they are counted, and one event
/// says how many were dropped (a program looping on refusals must not fill
/// the proxy's or the caller's memory).
const MAX_EVENTS: usize = 10_000;
/// Longest host or detail text recorded (they may come from the program).
const MAX_TEXT: usize = 256;

#[derive(Default)]
struct EventLog {
    kept: Vec<Event>,
    dropped: u64,
}

/// `text` cut to [`MAX_TEXT`] bytes, on a character boundary.
pub(crate) fn clip(text: &str) -> String {
    moat_core::text::clip(text, MAX_TEXT)
}

/// A refusal (answered 403) or a failure to reach an allowed server
/// (`upstream_unreachable`, answered 502).
#[derive(Debug, Clone)]
pub(crate) struct Refused {
    pub(crate) reason: DenialReason,
    pub(crate) detail: String,
}

impl Refused {
    pub(crate) fn deny(reason: DenialReason, detail: impl Into<String>) -> Self {
        Refused {
            reason,
            detail: detail.into(),
        }
    }
    pub(crate) fn fail(detail: impl Into<String>) -> Self {
        Self::deny(DenialReason::UpstreamUnreachable, detail)
    }
    /// The policy said no (rather than the server being out of reach).
    pub(crate) fn is_denial(&self) -> bool {
        self.reason != DenialReason::UpstreamUnreachable
    }
    /// What the program is told: the detail, except where it would map the
    /// host's private network for it (which address a name resolves to).
    pub(crate) fn for_client(&self) -> String {
        match self.reason {
            DenialReason::AddressNotAllowed => {
                "the name resolves to an address the egress policy refuses".to_owned()
            }
            _ => self.detail.clone(),
        }
    }

    pub(crate) fn status(&self) -> u16 {
        match self.reason {
            DenialReason::NotAProxyRequest => 400,
            DenialReason::UpstreamUnreachable => 502,
            _ => 403,
        }
    }
}

impl From<OutboundError> for Refused {
    fn from(e: OutboundError) -> Self {
        Refused::deny(e.reason(), e.to_string())
    }
}

/// A connection to an allowed server.
pub(crate) struct Admitted {
    pub(crate) host: String,
    pub(crate) address: SocketAddr,
    pub(crate) stream: TcpStream,
    pub(crate) _slot: Slot,
}

/// What one request did, for its access event.
#[derive(Clone, Copy)]
pub(crate) struct Access<'a> {
    pub(crate) method: &'a str,
    pub(crate) host: &'a str,
    pub(crate) port: u16,
    pub(crate) started: Instant,
}

impl Access<'_> {
    /// Its `network.denied` event: refused or cut, and why.
    fn denied(&self, refused: &Refused) -> EventData {
        EventData::NetworkDenied(NetworkDenied {
            host: Some(self.host.to_owned()),
            port: Some(self.port),
            method: Some(self.method.to_owned()),
            reason: Some(refused.reason),
            detail: Some(refused.detail.clone()),
            ..NetworkDenied::default()
        })
    }

    /// Its `network.request` event with `decision`, the rest to fill in.
    fn request(&self, decision: NetworkDecision) -> NetworkRequest {
        NetworkRequest::new(
            self.host.to_owned(),
            self.port,
            self.method.to_owned(),
            decision,
        )
    }
}

fn millis(took: std::time::Duration) -> u64 {
    u64::try_from(took.as_millis()).unwrap_or(u64::MAX)
}

impl Scope {
    pub(crate) fn new(run: Arc<Run>, policy: CompiledPolicy, op_id: Option<String>) -> Self {
        Scope {
            run,
            policy,
            op_id,
            events: Mutex::new(EventLog::default()),
        }
    }

    pub(crate) fn take_events(&self) -> Vec<Event> {
        let Ok(mut log) = self.events.lock() else {
            return Vec::new();
        };
        let log = std::mem::take(&mut *log);
        let mut events = log.kept;
        if log.dropped > 0 {
            events.push(self.event(EventData::NetworkDenied(NetworkDenied {
                reason: Some(DenialReason::EgressLimit),
                detail: Some(format!(
                    "{} more events were dropped past the cap of {MAX_EVENTS}",
                    log.dropped
                )),
                dropped: Some(log.dropped),
                ..NetworkDenied::default()
            })));
        }
        events
    }

    fn event(&self, data: EventData) -> Event {
        Event {
            op_id: self.op_id.clone(),
            ..Event::of(
                data,
                moat_core::time::now_stamp(),
                self.run.config.run_id.clone(),
            )
        }
    }

    fn emit(&self, data: EventData) {
        if let Ok(mut log) = self.events.lock() {
            if log.kept.len() < MAX_EVENTS {
                let event = self.event(data);
                log.kept.push(event);
            } else {
                log.dropped += 1;
            }
        }
    }

    /// Counts a request against the run's budget; `false` once it is spent.
    pub(crate) fn count_request(&self) -> bool {
        self.run.requests.fetch_add(1, Ordering::Relaxed) < self.run.config.limits.max_requests
    }

    /// Records a refusal: `network.denied` (for denials) and the access event.
    pub(crate) fn refused(&self, access: &Access<'_>, refused: &Refused) {
        let (host, detail) = (clip(access.host), clip(&refused.detail));
        let access = &Access {
            host: &host,
            ..*access
        };
        let refused = &Refused {
            reason: refused.reason,
            detail,
        };
        if refused.is_denial() {
            self.emit(access.denied(refused));
        }
        let decision = if refused.is_denial() {
            NetworkDecision::Denied
        } else {
            NetworkDecision::Failed
        };
        self.emit(EventData::NetworkRequest(NetworkRequest {
            reason: Some(refused.reason),
            detail: Some(refused.detail.clone()),
            bytes_out: Some(0),
            bytes_in: Some(0),
            duration_ms: Some(millis(access.started.elapsed())),
            ..access.request(decision)
        }));
    }

    /// Records a request that went through.
    pub(crate) fn completed(
        &self,
        access: &Access<'_>,
        address: SocketAddr,
        status: Option<u16>,
        (bytes_out, bytes_in): (u64, u64),
        cut: Option<&Refused>,
    ) {
        if let Some(refused) = cut {
            self.emit(access.denied(refused));
        }
        self.emit(EventData::NetworkRequest(NetworkRequest {
            address: Some(address.ip().to_string()),
            status,
            bytes_out: Some(bytes_out),
            bytes_in: Some(bytes_in),
            cut: cut.map(|c| c.reason),
            duration_ms: Some(millis(access.started.elapsed())),
            ..access.request(NetworkDecision::Allowed)
        }));
    }

    /// Decides on `host:port` and, if allowed, connects.
    pub(crate) async fn admit(&self, raw_host: &str, port: u16) -> Result<Admitted, Refused> {
        let run = &self.run;
        let limits = run.config.limits;
        if !self.count_request() {
            return Err(Refused::deny(
                DenialReason::EgressLimit,
                format!(
                    "the run's limit of {} requests is spent",
                    limits.max_requests
                ),
            ));
        }
        let bare = raw_host.trim_start_matches('[').trim_end_matches(']');
        if bare.parse::<IpAddr>().is_ok() {
            return Err(Refused::deny(
                DenialReason::IpLiteralNotAllowed,
                format!("{raw_host} is an address; ask for a domain"),
            ));
        }
        let host = normalize_host(bare).ok_or_else(|| {
            Refused::deny(
                DenialReason::DomainNotAllowed,
                format!("{:?} is not a host name", clip(raw_host)),
            )
        })?;
        self.policy.rules.decide(&host, port).map_err(|reason| {
            let detail = match reason {
                DenialReason::PortNotAllowed => format!("{host}: port {port} is not allowed"),
                _ => format!("{host} is not in the allowlist"),
            };
            Refused::deny(reason, detail)
        })?;
        let slot = if run.open.fetch_add(1, Ordering::Relaxed) >= limits.max_connections {
            run.open.fetch_sub(1, Ordering::Relaxed);
            return Err(Refused::deny(
                DenialReason::EgressLimit,
                format!("{} connections are already open", limits.max_connections),
            ));
        } else {
            Slot(run.clone())
        };
        let gate = Gate::new(&run.config.hosts, &self.policy.addresses);
        let (stream, address) = gate.connect(&host, port).await?;
        Ok(Admitted {
            host,
            address,
            stream,
            _slot: slot,
        })
    }
}
