//! RFC 3339 times (`2026-01-02T03:04:05.678+14:00`), as manifests carry
//! them. `humantime` reads only UTC (`Z`); a manifest signed where the
//! clock reads `+14:00` is just as valid, and two times compare by the
//! instant they name, whatever their offsets.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an RFC 3339 time (like 2026-01-02T03:04:05Z or 2026-01-02T17:04:05+14:00)")]
pub struct TimeError(pub String);

/// Milliseconds since the epoch of `t` (0 before it, saturating after).
pub fn ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `t` as RFC 3339 in UTC with milliseconds: the form of every time Moat
/// writes (events, API answers, capabilities).
pub fn stamp(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// [`stamp`] of milliseconds since the epoch (before it: the epoch).
pub fn stamp_ms(ms: i64) -> String {
    stamp(UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0)))
}

/// `stamp(SystemTime::now())`.
pub fn now_stamp() -> String {
    stamp(SystemTime::now())
}

/// The instant `text` names: `date-time` of RFC 3339 section 5.6 (`T` or
/// `t`, `Z` or `z` or `±hh:mm`, any number of fractional digits, read to
/// the nanosecond; a leap second `:60` is the next minute's first).
pub fn parse_rfc3339(text: &str) -> Result<SystemTime, TimeError> {
    parse(text.as_bytes()).ok_or_else(|| TimeError(text.chars().take(64).collect()))
}

fn digits(b: &[u8], at: usize, n: usize) -> Option<i64> {
    let part = b.get(at..at + n)?;
    part.iter().try_fold(0i64, |acc, d| {
        d.is_ascii_digit().then(|| acc * 10 + i64::from(d - b'0'))
    })
}

fn expect(b: &[u8], at: usize, what: &[u8]) -> Option<()> {
    what.contains(b.get(at)?).then_some(())
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn parse(b: &[u8]) -> Option<SystemTime> {
    let year = digits(b, 0, 4)?;
    expect(b, 4, b"-")?;
    let month = digits(b, 5, 2)?;
    expect(b, 7, b"-")?;
    let day = digits(b, 8, 2)?;
    expect(b, 10, b"Tt")?;
    let hour = digits(b, 11, 2)?;
    expect(b, 13, b":")?;
    let minute = digits(b, 14, 2)?;
    expect(b, 16, b":")?;
    let second = digits(b, 17, 2)?;
    if !(1..=12).contains(&month)
        || !(1..=days_in_month(year, month)).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut at = 19;
    let mut nanos = 0u32;
    if b.get(at) == Some(&b'.') {
        at += 1;
        let start = at;
        while b.get(at).is_some_and(u8::is_ascii_digit) {
            if at - start < 9 {
                nanos = nanos * 10 + u32::from(b[at] - b'0');
            }
            at += 1;
        }
        let read = at - start;
        if read == 0 {
            return None;
        }
        nanos *= 10u32.pow(9u32.saturating_sub(read.min(9) as u32));
    }
    let offset = match *b.get(at)? {
        b'Z' | b'z' if b.len() == at + 1 => 0,
        sign @ (b'+' | b'-') if b.len() == at + 6 => {
            let (h, m) = (digits(b, at + 1, 2)?, digits(b, at + 4, 2)?);
            expect(b, at + 3, b":")?;
            if h > 23 || m > 59 {
                return None;
            }
            let minutes = h * 60 + m;
            if sign == b'-' { -minutes } else { minutes }
        }
        _ => return None,
    };
    let seconds = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second
        - offset * 60;
    let whole = Duration::from_secs(seconds.unsigned_abs());
    if seconds >= 0 {
        UNIX_EPOCH
            .checked_add(whole)?
            .checked_add(Duration::from_nanos(u64::from(nanos)))
    } else {
        UNIX_EPOCH
            .checked_sub(whole)?
            .checked_add(Duration::from_nanos(u64::from(nanos)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> SystemTime {
        parse_rfc3339(text).unwrap_or_else(|e| panic!("{e}"))
    }

    fn secs(t: SystemTime) -> f64 {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => d.as_secs_f64(),
            Err(e) => -e.duration().as_secs_f64(),
        }
    }

    #[test]
    fn every_form_names_its_instant() {
        let utc = at("2026-01-02T03:04:05Z");
        assert_eq!(secs(utc), 1_767_323_045.0);
        assert_eq!(
            utc,
            humantime::parse_rfc3339("2026-01-02T03:04:05Z").unwrap()
        );
        assert_eq!(at("2026-01-02t03:04:05z"), utc);
        assert_eq!(at("2026-01-02T17:04:05+14:00"), utc);
        assert_eq!(at("2026-01-01T15:04:05-12:00"), utc);
        assert_eq!(at("2026-01-02T08:34:05+05:30"), utc);
        assert_eq!(at("2026-01-02T03:04:05+00:00"), utc);
        assert_eq!(at("2026-01-02T03:04:05-00:00"), utc);
        assert_eq!(
            at("2026-01-02T03:04:05.5Z"),
            utc + Duration::from_millis(500)
        );
        assert_eq!(
            at("2026-01-02T17:04:05.123456789123+14:00"),
            utc + Duration::from_nanos(123_456_789)
        );
        assert_eq!(
            at("2026-01-02T03:04:05.678Z"),
            humantime::parse_rfc3339("2026-01-02T03:04:05.678Z").unwrap()
        );
        assert_eq!(at("2016-12-31T23:59:60Z"), at("2017-01-01T00:00:00Z"));
        assert_eq!(at("2024-02-29T00:00:00Z"), at("2024-02-28T10:00:00-14:00"));
        assert_eq!(secs(at("1970-01-01T00:00:00+00:01")), -60.0);
        assert_eq!(secs(at("1969-12-31T23:59:59.25Z")), -0.75);
        assert_eq!(at("0000-01-01T00:00:00Z"), at("0000-01-01T00:00:00Z"));
        // Instants compare whatever the offsets say.
        assert!(at("2026-01-02T10:00:00+14:00") < at("2026-01-01T21:00:00Z"));
    }

    #[test]
    fn malformed_times_are_refused() {
        for bad in [
            "",
            "2026-01-02",
            "2026-01-02T03:04:05",
            "2026-01-02 03:04:05Z",
            "2026-01-02T03:04Z",
            "2026-01-02T03:04:05.Z",
            "2026-01-02T03:04:05+14",
            "2026-01-02T03:04:05+1400",
            "2026-01-02T03:04:05+24:00",
            "2026-01-02T03:04:05+14:60",
            "2026-01-02T03:04:05ZZ",
            "2026-01-02T03:04:05Z ",
            "2026-13-02T03:04:05Z",
            "2026-02-29T03:04:05Z",
            "2100-02-29T03:04:05Z",
            "2026-04-31T03:04:05Z",
            "2026-01-00T03:04:05Z",
            "2026-01-02T24:00:00Z",
            "2026-01-02T03:60:05Z",
            "2026-01-02T03:04:61Z",
            "+2026-01-02T03:04:05Z",
            "2026-1-02T03:04:05Z",
            "２０２６-01-02T03:04:05Z",
        ] {
            assert!(parse_rfc3339(bad).is_err(), "{bad:?}");
        }
    }
}
