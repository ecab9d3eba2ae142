//! Domain rules: `api.example.com`, `*.example.com` (subdomains only, not
//! the apex), each with an optional `:port`. A rule without a port allows
//! 80 and 443. Rules that would match too much are refused when loaded:
//! `*`, public suffixes (`com`, `*.co.uk`, `*.github.io`) and IP addresses.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use moat_core::DenialReason;

/// Ports a rule without `:port` allows.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainRule {
    /// Lower-case, no trailing dot; for a wildcard, the part after `*.`.
    name: String,
    wildcard: bool,
    port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("empty domain rule")]
    Empty,
    #[error("{0:?}: `*` alone would allow every domain; list the domains instead")]
    MatchAll(String),
    #[error(
        "{rule:?}: {suffix:?} is a public suffix (anyone can register under it); name a domain"
    )]
    PublicSuffix { rule: String, suffix: String },
    #[error("{0:?}: an IP address; rules name domains (the proxy refuses IP literals)")]
    IpLiteral(String),
    #[error("{rule:?}: not a domain name ({why})")]
    Invalid { rule: String, why: &'static str },
    #[error("{0:?}: the port must be a number from 1 to 65535")]
    BadPort(String),
}

impl FromStr for DomainRule {
    type Err = RuleError;

    fn from_str(text: &str) -> Result<Self, RuleError> {
        let rule = text.trim();
        if rule.is_empty() {
            return Err(RuleError::Empty);
        }
        let lower = rule.to_ascii_lowercase();
        if lower.starts_with('[') || lower.matches(':').count() > 1 {
            return Err(RuleError::IpLiteral(rule.to_owned()));
        }
        let (host, port) = match lower.rsplit_once(':') {
            Some((host, port)) => {
                let port: u16 = port
                    .parse()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| RuleError::BadPort(rule.to_owned()))?;
                (host, Some(port))
            }
            None => (lower.as_str(), None),
        };
        if host == "*" || host == "*." {
            return Err(RuleError::MatchAll(rule.to_owned()));
        }
        let (wildcard, name) = match host.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, host),
        };
        let name = name.strip_suffix('.').unwrap_or(name);
        let invalid = |why| RuleError::Invalid {
            rule: rule.to_owned(),
            why,
        };
        if name.parse::<IpAddr>().is_ok() {
            return Err(RuleError::IpLiteral(rule.to_owned()));
        }
        check_hostname(name).map_err(invalid)?;
        if let Some(suffix) = psl::suffix_str(name)
            && suffix == name
        {
            return Err(RuleError::PublicSuffix {
                rule: rule.to_owned(),
                suffix: suffix.to_owned(),
            });
        }
        Ok(DomainRule {
            name: name.to_owned(),
            wildcard,
            port,
        })
    }
}

/// RFC 1123 host name syntax (ASCII; internationalized names in punycode).
/// Returns why not.
pub(crate) fn check_hostname(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > 253 {
        return Err("empty or longer than 253 characters");
    }
    if name.contains('*') {
        return Err("`*` is allowed only as the whole first label, `*.`");
    }
    let mut last = "";
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err("a label is empty or longer than 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        {
            return Err("only letters, digits, `-` and `_` (punycode for other scripts)");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a label starts or ends with `-`");
        }
        last = label;
    }
    if last.bytes().all(|b| b.is_ascii_digit()) {
        return Err("the last label is numeric");
    }
    Ok(())
}

/// A host as it appears in a request, normalized for matching: lower case,
/// no trailing dot. `None` if it is not a host name.
pub(crate) fn normalize_host(host: &str) -> Option<String> {
    let lower = host.to_ascii_lowercase();
    let name = lower.strip_suffix('.').unwrap_or(&lower);
    check_hostname(name).ok().map(|_| name.to_owned())
}

impl DomainRule {
    fn matches_name(&self, host: &str) -> bool {
        if self.wildcard {
            host.len() > self.name.len()
                && host.ends_with(self.name.as_str())
                && host.as_bytes()[host.len() - self.name.len() - 1] == b'.'
        } else {
            host == self.name
        }
    }

    fn allows_port(&self, port: u16) -> bool {
        match self.port {
            Some(p) => p == port,
            None => DEFAULT_PORTS.contains(&port),
        }
    }

    /// A deny rule without a port denies every port.
    fn denies_port(&self, port: u16) -> bool {
        self.port.is_none_or(|p| p == port)
    }
}

impl fmt::Display for DomainRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.wildcard {
            f.write_str("*.")?;
        }
        f.write_str(&self.name)?;
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        Ok(())
    }
}

/// Allow and deny rules. Deny wins; an empty allow list allows nothing.
#[derive(Debug, Clone, Default)]
pub struct RuleSet {
    pub allow: Vec<DomainRule>,
    pub deny: Vec<DomainRule>,
}

impl RuleSet {
    pub fn parse<S: AsRef<str>>(allow: &[S], deny: &[S]) -> Result<RuleSet, RuleError> {
        let parse = |rules: &[S]| {
            rules
                .iter()
                .map(|r| r.as_ref().parse())
                .collect::<Result<Vec<DomainRule>, _>>()
        };
        Ok(RuleSet {
            allow: parse(allow)?,
            deny: parse(deny)?,
        })
    }

    /// Whether `host` (normalized) may be reached on `port`.
    pub fn decide(&self, host: &str, port: u16) -> Result<(), DenialReason> {
        if self
            .deny
            .iter()
            .any(|r| r.matches_name(host) && r.denies_port(port))
        {
            return Err(DenialReason::DomainNotAllowed);
        }
        let mut named = self
            .allow
            .iter()
            .filter(|r| r.matches_name(host))
            .peekable();
        if named.peek().is_none() {
            return Err(DenialReason::DomainNotAllowed);
        }
        if named.any(|r| r.allows_port(port)) {
            Ok(())
        } else {
            Err(DenialReason::PortNotAllowed)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(s: &str) -> Result<DomainRule, RuleError> {
        s.parse()
    }

    #[test]
    fn too_broad_rules_are_refused_at_load() {
        for bad in [
            "*",
            "*.",
            "*.com",
            "com",
            "*.co.uk",
            "co.uk",
            "*.github.io",
            "*.test",
        ] {
            assert!(
                matches!(
                    rule(bad),
                    Err(RuleError::MatchAll(_) | RuleError::PublicSuffix { .. })
                ),
                "{bad}: {:?}",
                rule(bad)
            );
        }
        for bad in ["1.2.3.4", "[::1]", "::1", "10.0.0.1:443"] {
            assert!(matches!(rule(bad), Err(RuleError::IpLiteral(_))), "{bad}");
        }
        for bad in [
            "a*.example.com",
            "exa mple.com",
            "-a.example.com",
            "example.com:0",
            "example.com:x",
            "",
        ] {
            assert!(rule(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn exact_wildcard_and_port_rules_match_as_documented() {
        let set = RuleSet::parse(
            &[
                "api.example.com",
                "*.cdn.example.com",
                "svc.example.org:8443",
            ],
            &["bad.cdn.example.com"],
        )
        .unwrap();
        assert_eq!(set.decide("api.example.com", 443), Ok(()));
        assert_eq!(set.decide("api.example.com", 80), Ok(()));
        assert_eq!(
            set.decide("api.example.com", 22),
            Err(DenialReason::PortNotAllowed)
        );
        assert_eq!(
            set.decide("x.api.example.com", 443),
            Err(DenialReason::DomainNotAllowed)
        );
        assert_eq!(set.decide("a.cdn.example.com", 443), Ok(()));
        assert_eq!(set.decide("a.b.cdn.example.com", 443), Ok(()));
        // Subdomains only: not the apex, not a look-alike suffix.
        assert_eq!(
            set.decide("cdn.example.com", 443),
            Err(DenialReason::DomainNotAllowed)
        );
        assert_eq!(
            set.decide("evilcdn.example.com", 443),
            Err(DenialReason::DomainNotAllowed)
        );
        // Deny wins over allow.
        assert_eq!(
            set.decide("bad.cdn.example.com", 443),
            Err(DenialReason::DomainNotAllowed)
        );
        assert_eq!(set.decide("svc.example.org", 8443), Ok(()));
        assert_eq!(
            set.decide("svc.example.org", 443),
            Err(DenialReason::PortNotAllowed)
        );
        let empty = RuleSet::parse::<&str>(&[], &[]).unwrap();
        assert_eq!(
            empty.decide("api.example.com", 443),
            Err(DenialReason::DomainNotAllowed)
        );
    }

    #[test]
    fn rules_are_case_and_trailing_dot_insensitive() {
        let set = RuleSet::parse(&["API.Example.COM."], &[] as &[&str]).unwrap();
        let host = normalize_host("api.EXAMPLE.com.").unwrap();
        assert_eq!(set.decide(&host, 443), Ok(()));
        assert_eq!(set.allow[0].to_string(), "api.example.com");
    }
}
