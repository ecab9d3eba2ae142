//! Percent-encoding of one URL component (a path segment or a query value).

/// Every byte but the unreserved ones (`A-Z a-z 0-9 - . _ ~`) as `%XX`, so
/// the text cannot end a segment, start a query or name another host.
pub fn encode_component(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn reserved_bytes_are_encoded() {
        assert_eq!(
            super::encode_component("a/b c?d=é"),
            "a%2Fb%20c%3Fd%3D%C3%A9"
        );
        assert_eq!(super::encode_component("run-1_x.y~"), "run-1_x.y~");
    }
}
