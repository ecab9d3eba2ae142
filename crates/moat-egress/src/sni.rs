//! The server name a TLS client asks for: the `server_name` extension of its
//! ClientHello, read from the first bytes of a CONNECT tunnel (which the
//! proxy holds back until the name is checked).

/// What the bytes so far say.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello {
    /// Not enough bytes yet.
    Incomplete,
    /// Not a TLS ClientHello (or malformed, or too large).
    NotTls,
    /// A ClientHello, with its host name if it sent one.
    ServerName(Option<String>),
}

/// A ClientHello larger than this is refused (real ones are a few KiB).
pub const MAX_HELLO: usize = 64 << 10;

const HANDSHAKE: u8 = 0x16;
const CLIENT_HELLO: u8 = 0x01;

pub fn parse(buf: &[u8]) -> Hello {
    // The handshake message may span several records: gather their payloads.
    let mut message = Vec::new();
    let mut rest = buf;
    loop {
        let Some(header) = rest.get(..5) else {
            return Hello::Incomplete;
        };
        if header[0] != HANDSHAKE || header[1] != 0x03 {
            return Hello::NotTls;
        }
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if len == 0 || len > (1 << 14) + 256 {
            return Hello::NotTls;
        }
        let Some(payload) = rest.get(5..5 + len) else {
            return Hello::Incomplete;
        };
        message.extend_from_slice(payload);
        rest = &rest[5 + len..];
        if message.len() >= 4 {
            if message[0] != CLIENT_HELLO {
                return Hello::NotTls;
            }
            let body = usize::from(message[1]) << 16
                | usize::from(message[2]) << 8
                | usize::from(message[3]);
            if body > MAX_HELLO {
                return Hello::NotTls;
            }
            if message.len() >= 4 + body {
                return match server_name(&message[4..4 + body]) {
                    Some(name) => Hello::ServerName(name),
                    None => Hello::NotTls,
                };
            }
        }
    }
}

/// A tiny big-endian reader over a slice; `None` past the end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, tail) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = tail;
        Some(head)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(n)
    }
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(n)
    }
}

/// `Some(None)`: a well-formed hello without a host name.
fn server_name(hello: &[u8]) -> Option<Option<String>> {
    let mut r = Reader(hello);
    r.take(2 + 32)?; // legacy_version, random
    r.vec8()?; // session id
    r.vec16()?; // cipher suites
    r.vec8()?; // compression methods
    if r.0.is_empty() {
        return Some(None); // no extensions at all
    }
    // Strict, like a careful server: one server_name extension, holding
    // one host name; anything else is malformed.
    let mut extensions = Reader(r.vec16()?);
    let mut found: Option<Option<String>> = None;
    while !extensions.0.is_empty() {
        let kind = extensions.u16()?;
        let data = extensions.vec16()?;
        if kind != 0 {
            continue;
        }
        if found.is_some() {
            return None;
        }
        let mut name_found = None;
        let mut list = Reader(Reader(data).vec16()?);
        while !list.0.is_empty() {
            let name_type = list.u8()?;
            let name = list.vec16()?;
            if name_type == 0 {
                if name_found.is_some() {
                    return None;
                }
                name_found = Some(std::str::from_utf8(name).ok()?.to_ascii_lowercase());
            }
        }
        found = Some(name_found);
    }
    Some(found.flatten())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ClientHello with the given server name, split into records
    /// of at most `record` bytes of payload.
    pub(crate) fn hello(name: Option<&str>, record: usize) -> Vec<u8> {
        let mut body = vec![0x03, 0x03];
        body.extend([7u8; 32]);
        body.push(0); // session id
        body.extend([0, 2, 0x13, 0x01]); // one cipher suite
        body.extend([1, 0]); // null compression
        let mut ext = Vec::new();
        if let Some(name) = name {
            let mut entry = vec![0u8];
            entry.extend((name.len() as u16).to_be_bytes());
            entry.extend(name.as_bytes());
            let mut list = (entry.len() as u16).to_be_bytes().to_vec();
            list.extend(entry);
            ext.extend([0u8, 0]);
            ext.extend((list.len() as u16).to_be_bytes());
            ext.extend(list);
        }
        ext.extend([0x00, 0x2b, 0, 3, 2, 3, 4]); // supported_versions
        body.extend((ext.len() as u16).to_be_bytes());
        body.extend(ext);
        let mut message = vec![CLIENT_HELLO, 0, (body.len() >> 8) as u8, body.len() as u8];
        message.extend(body);
        let mut out = Vec::new();
        for chunk in message.chunks(record) {
            out.extend([HANDSHAKE, 3, 1]);
            out.extend((chunk.len() as u16).to_be_bytes());
            out.extend(chunk);
        }
        out
    }

    #[test]
    fn finds_the_server_name_in_one_or_many_records() {
        for record in [16384, 20, 3] {
            let bytes = hello(Some("Api.Example.com"), record);
            assert_eq!(
                parse(&bytes),
                Hello::ServerName(Some("api.example.com".into()))
            );
            for cut in [0, 1, 4, 5, bytes.len() / 2, bytes.len() - 1] {
                assert_eq!(parse(&bytes[..cut]), Hello::Incomplete, "cut {cut}");
            }
        }
        assert_eq!(parse(&hello(None, 16384)), Hello::ServerName(None));
    }

    #[test]
    fn two_server_names_are_malformed() {
        let one = hello(Some("a.example.com"), 16384);
        // Append a second server_name extension to the extensions block.
        let mut two = one.clone();
        let extra = [
            0u8, 0, 0, 16, 0, 14, 0, 0, 11, b'e', b'v', b'i', b'l', b'.', b'e', b'x', b'a', b'm',
            b'p', b'l',
        ];
        let ext_len_at = 5 + 4 + 2 + 32 + 1 + 4 + 2;
        let old = usize::from(u16::from_be_bytes([two[ext_len_at], two[ext_len_at + 1]]));
        two[ext_len_at..ext_len_at + 2]
            .copy_from_slice(&((old + extra.len()) as u16).to_be_bytes());
        two.extend_from_slice(&extra);
        let body = two.len() - 9;
        two[6..9].copy_from_slice(&[(body >> 16) as u8, (body >> 8) as u8, body as u8]);
        let record = two.len() - 5;
        two[3..5].copy_from_slice(&(record as u16).to_be_bytes());
        assert_eq!(parse(&two), Hello::NotTls);
    }

    #[test]
    fn other_protocols_are_not_tls() {
        assert_eq!(parse(b"GET / HTTP/1.1\r\n\r\n"), Hello::NotTls);
        assert_eq!(parse(b"SSH-2.0-OpenSSH_9.2\r\n"), Hello::NotTls);
        let mut bytes = hello(Some("a.example.com"), 16384);
        bytes[5] = 0x02; // a ServerHello
        assert_eq!(parse(&bytes), Hello::NotTls);
        let mut bytes = hello(Some("a.example.com"), 16384);
        bytes[9 + 34] = 200; // session id longer than the message
        assert_eq!(parse(&bytes), Hello::NotTls);
    }
}
