//! A block of host ids reserved for sandboxes.

use std::fmt;
use std::str::FromStr;

/// The unprivileged fallback id that many daemons run as: never handed out.
const NOBODY: u32 = 65534;
/// `(uid_t) -1` means "no change" to the kernel: never an id.
const INVALID: u32 = u32::MAX;

/// `count` host ids from `base`, used as both uid and gid: sandbox *n* of the
/// block runs as uid `base + n` and gid `base + n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    pub base: u32,
    pub count: u32,
}

/// Why a range cannot hold sandboxes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    #[error("`{0}` is not BASE:COUNT (two decimal numbers, e.g. 1879048192:65536)")]
    Syntax(String),
    #[error("an id range must hold at least one id")]
    Empty,
    #[error("ids {base}..{base}+{count} run past the largest id, 4294967294")]
    TooHigh { base: u32, count: u32 },
    #[error("the range {range} holds {id} ({what}), which a sandbox must never run as")]
    Reserved {
        range: IdRange,
        id: u32,
        what: &'static str,
    },
    #[error(
        "the range {range} holds {kind} {id} ({name} in {file}): the ids must belong to nothing but Moat"
    )]
    Taken {
        range: IdRange,
        kind: &'static str,
        id: u32,
        name: String,
        file: &'static str,
    },
}

impl IdRange {
    /// Checks the bounds: never 0 (root), never 65534 (`nobody`), never -1.
    pub fn new(base: u32, count: u32) -> Result<Self, RangeError> {
        if count == 0 {
            return Err(RangeError::Empty);
        }
        let range = IdRange { base, count };
        if base
            .checked_add(count - 1)
            .is_none_or(|last| last == INVALID)
        {
            return Err(RangeError::TooHigh { base, count });
        }
        for (id, what) in [(0, "root"), (NOBODY, "nobody")] {
            if range.contains(id) {
                return Err(RangeError::Reserved { range, id, what });
            }
        }
        Ok(range)
    }

    pub fn contains(&self, id: u32) -> bool {
        id >= self.base && id - self.base < self.count
    }

    /// The last id of the block.
    pub fn last(&self) -> u32 {
        self.base + (self.count - 1)
    }

    pub(crate) fn overlaps(&self, base: u64, count: u64) -> bool {
        let (a0, a1) = (u64::from(self.base), u64::from(self.last()));
        count > 0 && base <= a1 && base.saturating_add(count) > a0
    }
}

impl fmt::Display for IdRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.base, self.count)
    }
}

impl FromStr for IdRange {
    type Err = RangeError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let syntax = || RangeError::Syntax(text.to_owned());
        let (base, count) = text.trim().split_once(':').ok_or_else(syntax)?;
        let number = |s: &str| {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(syntax());
            }
            s.parse::<u32>().map_err(|_| syntax())
        };
        IdRange::new(number(base)?, number(count)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_base_and_count() {
        let range: IdRange = "1879048192:65536".parse().unwrap();
        assert_eq!((range.base, range.count), (1879048192, 65536));
        assert_eq!(range.last(), 1879048192 + 65535);
        assert!(range.contains(1879048192) && range.contains(range.last()));
        assert!(!range.contains(1879048191) && !range.contains(range.last() + 1));
    }

    #[test]
    fn refuses_what_is_not_a_range() {
        for bad in [
            "",
            "5",
            "5:",
            ":5",
            "-5:3",
            "5:+3",
            "a:b",
            "5:3:1",
            "99999999999:1",
        ] {
            assert!(
                matches!(bad.parse::<IdRange>(), Err(RangeError::Syntax(_))),
                "{bad:?}"
            );
        }
        assert_eq!("7:0".parse::<IdRange>(), Err(RangeError::Empty));
    }

    #[test]
    fn never_holds_root_nobody_or_minus_one() {
        assert!(matches!(
            "0:10".parse::<IdRange>(),
            Err(RangeError::Reserved { id: 0, .. })
        ));
        assert!(matches!(
            "65000:1000".parse::<IdRange>(),
            Err(RangeError::Reserved { id: 65534, .. })
        ));
        assert!(matches!(
            "4294967290:6".parse::<IdRange>(),
            Err(RangeError::TooHigh { .. })
        ));
        assert!(matches!(
            "4294967295:1".parse::<IdRange>(),
            Err(RangeError::TooHigh { .. })
        ));
        // 4294967294 is the largest id.
        assert!("4294967290:5".parse::<IdRange>().is_ok());
    }

    #[test]
    fn overlap_is_inclusive_at_both_ends() {
        let range = IdRange::new(100, 10).unwrap();
        assert!(range.overlaps(109, 1) && range.overlaps(90, 11) && range.overlaps(0, 1000));
        assert!(!range.overlaps(110, 5) && !range.overlaps(90, 10) && !range.overlaps(105, 0));
        assert!(range.overlaps(5, u64::MAX), "no wrap-around");
    }
}
