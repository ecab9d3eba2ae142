//! Randomness for identifiers, tokens, nonces and keys: the kernel's CSPRNG
//! through `getrandom(2)`, one place for every crate.

/// Fills `buf` from the kernel's CSPRNG.
///
/// Without randomness no id, token or key is safe to hand out, and nothing
/// sensible can go on: the process aborts rather than return predictable
/// bytes. (`getrandom(2)` only fails before the kernel's pool is seeded at
/// boot, or under a seccomp filter that refuses it.)
pub fn fill(buf: &mut [u8]) {
    if getrandom::fill(buf).is_err() {
        std::process::abort();
    }
}

/// `N` random bytes.
pub fn bytes<const N: usize>() -> [u8; N] {
    let mut buf = [0u8; N];
    fill(&mut buf);
    buf
}

/// `n` random bytes as lowercase hex (`2n` characters).
pub fn hex(n: usize) -> String {
    let mut buf = vec![0u8; n];
    fill(&mut buf);
    hex::encode(buf)
}

/// A random identifier: `prefix` and 16 bytes of hex.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}{}", hex(16))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_prefixed_hex_and_differ() {
        let a = new_id("run_");
        let b = new_id("run_");
        assert_ne!(a, b);
        assert_eq!(a.len(), 4 + 32);
        assert!(a[4..].bytes().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(hex(3).len(), 6);
        assert_ne!(bytes::<16>(), [0u8; 16]);
    }
}
