//! Percent-encoding of one URL component (a path segment or a query value).

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// Everything but RFC 3986's unreserved characters (`A-Z a-z 0-9 - . _ ~`).
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Every byte but the unreserved ones as `%XX`, so the text cannot end a
/// segment, start a query or name another host.
pub fn encode_component(text: &str) -> String {
    utf8_percent_encode(text, COMPONENT).to_string()
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
