//! Human byte sizes (`512M`, `64KiB`, `1G`): binary multiples, as `ulimit`
//! and cgroups mean them.

/// A size that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid size `{0}` (examples: 4096, 64K, 512M, 2G)")]
pub struct InvalidSize(pub String);

/// Parses `N`, `NK`, `NM`, `NG`, `NT` (also `KB`/`KiB` spellings), case-insensitive.
pub fn parse_size(text: &str) -> Result<u64, InvalidSize> {
    let err = || InvalidSize(text.to_owned());
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    if digits.is_empty() {
        return Err(err());
    }
    let value: u64 = digits.parse().map_err(|_| err())?;
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(err()),
    };
    value.checked_mul(1u64 << shift).ok_or_else(err)
}

/// Formats a size the way [`parse_size`] reads it, choosing the largest exact unit.
pub fn format_size(bytes: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if bytes != 0 && bytes.is_multiple_of(1u64 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_binary_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
    }

    #[test]
    fn refuses_nonsense_and_overflow() {
        for bad in ["", "M", "-1", "1.5G", "12Q", "99999999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn formats_what_it_reads() {
        assert_eq!(format_size(512 << 20), "512M");
        assert_eq!(format_size(1000), "1000");
    }
}
