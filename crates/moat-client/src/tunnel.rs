//! A runner's tunnel for one request to a run's port: the connection to
//! make and the signed request head that asks the control plane to switch
//! it to `moat-ingress`. The connection itself (TCP, TLS, async copying)
//! is the runner's: this crate speaks blocking HTTP only.

use crate::ClientError;

/// The protocol the tunnel switches to.
pub const TUNNEL_PROTOCOL: &str = "moat-ingress";

/// Where a tunnel goes and what opens it.
#[derive(Debug, Clone)]
pub struct Tunnel {
    /// `https://`: TLS to `host`, verified.
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// The request head to write first (ends with the empty line).
    pub head: Vec<u8>,
    /// The CAs trusted for TLS (DER; `None`: Mozilla's).
    pub roots: Option<Vec<Vec<u8>>>,
}

impl Tunnel {
    pub(crate) fn new(
        base: &str,
        path: &str,
        headers: &[(&'static str, String)],
        roots: Option<Vec<Vec<u8>>>,
    ) -> Result<Tunnel, ClientError> {
        let bad = |message: &str| ClientError::Unreachable {
            base: base.to_owned(),
            message: format!("a tunnel needs an http:// or https:// URL: {message}"),
        };
        let (tls, rest) = if let Some(rest) = base.strip_prefix("https://") {
            (true, rest)
        } else if let Some(rest) = base.strip_prefix("http://") {
            (false, rest)
        } else {
            return Err(bad("no scheme"));
        };
        let (authority, prefix) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        if authority.is_empty() || authority.contains('@') {
            return Err(bad("no host, or user information"));
        }
        let default_port = if tls { 443 } else { 80 };
        let (host, port) = match authority.rsplit_once(':') {
            // An IPv6 literal without a port: `[::1]`.
            Some((host, port)) if !port.ends_with(']') => {
                (host, port.parse().map_err(|_| bad("a bad port"))?)
            }
            _ => (authority, default_port),
        };
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let mut head = format!(
            "POST {prefix}{path} HTTP/1.1\r\nhost: {authority}\r\nconnection: upgrade\r\n\
             upgrade: {TUNNEL_PROTOCOL}\r\ncontent-length: 0\r\n"
        );
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        Ok(Tunnel {
            tls,
            host,
            port,
            head: head.into_bytes(),
            roots,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tunnel_goes_where_the_base_url_says() {
        let t = Tunnel::new("https://cp.example:8443/api", "/v1/x", &[], None).unwrap();
        assert!(t.tls);
        assert_eq!((t.host.as_str(), t.port), ("cp.example", 8443));
        let head = String::from_utf8(t.head).unwrap();
        assert!(head.starts_with("POST /api/v1/x HTTP/1.1\r\nhost: cp.example:8443\r\n"));
        assert!(head.ends_with("\r\n\r\n"));
        let t = Tunnel::new("http://[::1]", "/v1/x", &[], None).unwrap();
        assert_eq!((t.host.as_str(), t.port, t.tls), ("::1", 80, false));
        let t = Tunnel::new("http://[::1]:9000", "/v1/x", &[], None).unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", 9000));
        assert!(Tunnel::new("ftp://x", "/", &[], None).is_err());
        assert!(Tunnel::new("http://u@x", "/", &[], None).is_err());
        assert!(Tunnel::new("http://x:port", "/", &[], None).is_err());
    }
}
