//! What a `network.ingress` event says of a connection that speaks HTTP/1:
//! the first request line's method and path, the first status line's code.
//! Only the first line of each direction is looked at, never headers or
//! bodies; anything that does not read as HTTP is simply not described.

/// The most bytes gathered while looking for a first line.
const MAX_LINE: usize = 8 << 10;

/// The longest path kept (the rest is clipped).
const MAX_PATH: usize = 256;

/// Collects the first line of one direction of a connection.
#[derive(Debug, Default)]
pub(super) struct FirstLine {
    buf: Vec<u8>,
    done: bool,
}

impl FirstLine {
    /// Feeds the next bytes of the stream; returns the first line (without
    /// its end) the one time it is complete. Past [`MAX_LINE`] bytes without
    /// a line end it gives up.
    pub(super) fn feed(&mut self, bytes: &[u8]) -> Option<Vec<u8>> {
        if self.done {
            return None;
        }
        let room = MAX_LINE - self.buf.len();
        self.buf.extend_from_slice(&bytes[..bytes.len().min(room)]);
        if let Some(end) = self.buf.iter().position(|b| *b == b'\n') {
            self.done = true;
            let mut line = std::mem::take(&mut self.buf);
            line.truncate(end);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            return Some(line);
        }
        if self.buf.len() >= MAX_LINE {
            self.done = true;
            self.buf = Vec::new();
        }
        None
    }
}

/// `GET /a/b?x=1 HTTP/1.1` → (`GET`, `/a/b`). The query and fragment are
/// never kept; an absolute-form target keeps its path only.
pub(super) fn request_line(line: &[u8]) -> Option<(String, String)> {
    let text = std::str::from_utf8(line).ok()?;
    let mut parts = text.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !version.starts_with("HTTP/") {
        return None;
    }
    let method_ok = (1..=16).contains(&method.len())
        && method.bytes().all(|b| b.is_ascii_uppercase() || b == b'-');
    if !method_ok {
        return None;
    }
    // Absolute form (`http://host/path`) only when it does not start with
    // `/`: a `://` in an origin-form target's query is not a scheme.
    let absolute = if target.starts_with('/') {
        None
    } else {
        target.find("://")
    };
    let target = match absolute {
        // `http://host/path`: the path (or `/`).
        Some(scheme_end) => {
            let rest = &target[scheme_end + 3..];
            rest.find('/').map_or("/", |slash| &rest[slash..])
        }
        None => target,
    };
    let path = target.split(['?', '#']).next().unwrap_or_default();
    if path.is_empty() || !path.bytes().all(|b| b.is_ascii_graphic()) {
        return None;
    }
    let mut end = path.len().min(MAX_PATH);
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    Some((method.to_owned(), path[..end].to_owned()))
}

/// `HTTP/1.1 404 Not Found` → 404.
pub(super) fn status_line(line: &[u8]) -> Option<u16> {
    let text = std::str::from_utf8(line).ok()?;
    let mut parts = text.splitn(3, ' ');
    let version = parts.next()?;
    let code = parts.next()?;
    if !version.starts_with("HTTP/") || code.len() != 3 {
        return None;
    }
    code.parse::<u16>().ok().filter(|c| (100..=599).contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request line and the method and path it gives.
    type Case = (&'static [u8], Option<(&'static str, &'static str)>);

    #[test]
    fn request_lines_give_method_and_path_without_query() {
        let cases: &[Case] = &[
            (b"GET / HTTP/1.1", Some(("GET", "/"))),
            (b"POST /a/b?token=secret HTTP/1.1", Some(("POST", "/a/b"))),
            (b"GET /x#frag HTTP/1.0", Some(("GET", "/x"))),
            (b"GET http://h:1/p/q?s HTTP/1.1", Some(("GET", "/p/q"))),
            (b"GET http://h HTTP/1.1", Some(("GET", "/"))),
            (
                b"GET /login?next=https://h/reset/TOKEN HTTP/1.1",
                Some(("GET", "/login")),
            ),
            (b"OPTIONS * HTTP/1.1", Some(("OPTIONS", "*"))),
            (b"get / HTTP/1.1", None),
            (b"GET / SSH-2.0", None),
            (b"GET  / HTTP/1.1", None),
            (b"GET /\x01 HTTP/1.1", None),
            (b"\x16\x03\x01\x02\x00", None),
            (b"", None),
        ];
        for (line, want) in cases {
            let got = request_line(line);
            let want = want.map(|(m, p)| (m.to_owned(), p.to_owned()));
            assert_eq!(got, want, "{}", String::from_utf8_lossy(line));
        }
        let long = format!("GET /{} HTTP/1.1", "a".repeat(1000));
        assert_eq!(
            request_line(long.as_bytes()).map(|(_, p)| p.len()),
            Some(256)
        );
    }

    #[test]
    fn status_lines_give_the_code() {
        assert_eq!(status_line(b"HTTP/1.0 200 OK"), Some(200));
        assert_eq!(status_line(b"HTTP/1.1 404 Not Found"), Some(404));
        assert_eq!(status_line(b"HTTP/1.1 204"), Some(204));
        assert_eq!(status_line(b"HTTP/1.1 20 OK"), None);
        assert_eq!(status_line(b"HTTP/1.1 999 X"), None);
        assert_eq!(status_line(b"SSH-2.0-OpenSSH"), None);
    }

    #[test]
    fn the_first_line_is_found_across_reads_and_only_once() {
        let mut first = FirstLine::default();
        assert_eq!(first.feed(b"GET / HT"), None);
        assert_eq!(
            first.feed(b"TP/1.1\r\nHost: x\r\n"),
            Some(b"GET / HTTP/1.1".to_vec())
        );
        assert_eq!(first.feed(b"GET /again HTTP/1.1\r\n"), None);
        let mut endless = FirstLine::default();
        for _ in 0..20 {
            assert_eq!(endless.feed(&[b'a'; 1024]), None);
        }
        assert_eq!(endless.feed(b"\n"), None);
    }
}
