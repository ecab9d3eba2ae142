//! The `http` binding: a worker's requests sent through the egress proxy
//! its sandbox was given (`HTTP_PROXY`), which applies the run's
//! allowlist and records each request and refusal. The runtime holds no
//! other way out: its sandbox's only reachable address is the proxy.

use std::time::Duration;

use crate::bindings::moat::worker::http::Response;
use crate::bindings::moat::worker::types::BindingError;

/// Most bytes of a response body (a read lands in the guest's memory too).
const MAX_BODY: u64 = 16 << 20;

/// How long one request may take, all of it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Headers a guest may not set: the proxy's and the connection's own.
const REFUSED_HEADERS: &[&str] = &[
    "host",
    "connection",
    "proxy-authorization",
    "proxy-connection",
    "transfer-encoding",
    "content-length",
];

/// An HTTP client whose every request goes through `proxy`: https
/// through a CONNECT tunnel (ureq), plain http as an absolute-form request
/// to the proxy itself (ureq would tunnel it too, and the proxy admits only
/// TLS in a tunnel, to check the server name).
pub(crate) struct Client {
    agent: ureq::Agent,
    /// `host:port` of the proxy.
    proxy: String,
}

impl Client {
    pub fn through(proxy: &str) -> Result<Client, String> {
        let address = proxy
            .strip_prefix("http://")
            .map(|rest| rest.trim_end_matches('/').to_owned())
            .ok_or_else(|| format!("the egress proxy {proxy}: not an http:// address"))?;
        let proxy =
            ureq::Proxy::new(proxy).map_err(|e| format!("the egress proxy {proxy}: {e}"))?;
        let agent = ureq::Agent::config_builder()
            .proxy(Some(proxy))
            .http_status_as_error(false)
            .timeout_global(Some(REQUEST_TIMEOUT))
            .max_redirects(0)
            .build()
            .new_agent();
        Ok(Client {
            agent,
            proxy: address,
        })
    }

    pub fn fetch(
        &self,
        method: &str,
        url: &str,
        headers: &[(String, String)],
        body: Vec<u8>,
        max_body: u64,
    ) -> Result<Response, BindingError> {
        let scheme_ok = url.starts_with("http://") || url.starts_with("https://");
        if !scheme_ok {
            return Err(BindingError::InvalidName);
        }
        for (name, _) in headers {
            if REFUSED_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
                return Err(BindingError::Failed(format!(
                    "the header {name} is the connection's own, not the worker's"
                )));
            }
        }
        if url.starts_with("http://") {
            return plain::fetch(
                &self.proxy,
                method,
                url,
                headers,
                &body,
                max_body.min(MAX_BODY),
            );
        }
        let mut request = ureq::http::Request::builder().method(method).uri(url);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let request = request
            .body(body)
            .map_err(|e| BindingError::Failed(format!("not a valid request: {e}")))?;
        let mut response = self
            .agent
            .run(request)
            .map_err(|e| BindingError::Failed(e.to_string()))?;
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .filter_map(|(name, value)| {
                Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned()))
            })
            .collect();
        let limit = max_body.min(MAX_BODY);
        let body = response
            .body_mut()
            .with_config()
            .limit(limit)
            .read_to_vec()
            .map_err(|e| match e {
                ureq::Error::BodyExceedsLimit(_) => BindingError::TooLarge,
                other => BindingError::Failed(other.to_string()),
            })?;
        Ok(Response {
            status,
            headers,
            body,
        })
    }
}

/// Plain HTTP/1.1 to the proxy: one request per connection.
mod plain {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpStream;

    use super::{REQUEST_TIMEOUT, Response};
    use crate::bindings::moat::worker::types::BindingError;

    /// Most bytes of a response's head.
    const MAX_HEAD: usize = 64 << 10;

    fn failed(e: impl std::fmt::Display) -> BindingError {
        BindingError::Failed(e.to_string())
    }

    pub fn fetch(
        proxy: &str,
        method: &str,
        url: &str,
        headers: &[(String, String)],
        body: &[u8],
        max_body: u64,
    ) -> Result<Response, BindingError> {
        let valid_token = !method.is_empty() && method.bytes().all(|b| b.is_ascii_alphabetic());
        let host = url["http://".len()..]
            .split(['/', '?', '#'])
            .next()
            .unwrap_or("");
        let clean = |text: &str| !text.bytes().any(|b| b.is_ascii_control() || b == b' ');
        if !valid_token || host.is_empty() || !clean(url) {
            return Err(BindingError::InvalidName);
        }
        let mut head = format!(
            "{method} {url} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (name, value) in headers {
            if !clean(name) || value.bytes().any(|b| b == b'\r' || b == b'\n') {
                return Err(BindingError::Failed(format!(
                    "the header {name:?} is not valid"
                )));
            }
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        let mut stream = TcpStream::connect(proxy).map_err(failed)?;
        stream
            .set_read_timeout(Some(REQUEST_TIMEOUT))
            .map_err(failed)?;
        stream
            .set_write_timeout(Some(REQUEST_TIMEOUT))
            .map_err(failed)?;
        stream.write_all(head.as_bytes()).map_err(failed)?;
        stream.write_all(body).map_err(failed)?;
        let mut reader = BufReader::new(stream);
        let mut raw = Vec::new();
        while !raw.ends_with(b"\r\n\r\n") {
            let n = reader
                .by_ref()
                .take((MAX_HEAD - raw.len()) as u64)
                .read_until(b'\n', &mut raw)
                .map_err(failed)?;
            if n == 0 {
                return Err(BindingError::Failed(
                    "the proxy closed before answering".into(),
                ));
            }
        }
        let mut parsed = [httparse::EMPTY_HEADER; 64];
        let mut response = httparse::Response::new(&mut parsed);
        response.parse(&raw).map_err(failed)?;
        let status = response.code.unwrap_or(0);
        let headers: Vec<(String, String)> = response
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_ascii_lowercase(),
                    String::from_utf8_lossy(h.value).into_owned(),
                )
            })
            .collect();
        let header = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.trim())
        };
        let limit = max_body.saturating_add(1);
        let body = if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
        {
            chunked(&mut reader, limit)?
        } else {
            let length = match header("content-length") {
                Some(text) => Some(text.parse::<u64>().map_err(failed)?),
                None => None,
            };
            let mut body = Vec::new();
            reader
                .take(length.unwrap_or(limit).min(limit))
                .read_to_end(&mut body)
                .map_err(failed)?;
            body
        };
        if body.len() as u64 > max_body {
            return Err(BindingError::TooLarge);
        }
        Ok(Response {
            status,
            headers,
            body,
        })
    }

    fn chunked(reader: &mut impl BufRead, limit: u64) -> Result<Vec<u8>, BindingError> {
        let mut body = Vec::new();
        loop {
            let mut line = String::new();
            reader
                .by_ref()
                .take(1024)
                .read_line(&mut line)
                .map_err(failed)?;
            let size = line.trim().split(';').next().unwrap_or("");
            let size = u64::from_str_radix(size, 16).map_err(failed)?;
            if size == 0 {
                return Ok(body);
            }
            if body.len() as u64 + size > limit {
                return Err(BindingError::TooLarge);
            }
            reader
                .by_ref()
                .take(size)
                .read_to_end(&mut body)
                .map_err(failed)?;
            let mut crlf = [0u8; 2];
            reader.read_exact(&mut crlf).map_err(failed)?;
        }
    }
}

/// What a request is recorded as: the method and the URL without its query
/// or fragment (either may carry what the guest holds secret).
pub(crate) fn recorded(method: &str, url: &str) -> String {
    let end = url.find(['?', '#']).unwrap_or(url.len());
    let mut shown: String = url[..end].chars().take(512).collect();
    shown.retain(|c| !c.is_control());
    format!("{} {shown}", method.chars().take(16).collect::<String>())
}

#[cfg(test)]
mod tests {
    use super::recorded;

    #[test]
    fn a_request_is_recorded_without_its_query() {
        assert_eq!(
            recorded("GET", "https://api.test/a?token=s3cret#x"),
            "GET https://api.test/a"
        );
        assert_eq!(recorded("POST", "http://a.test/"), "POST http://a.test/");
    }
}
