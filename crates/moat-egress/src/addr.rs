//! Which addresses the proxy may dial. Names are resolved by the proxy, and
//! every address they resolve to is checked here before one is dialled: an
//! allowed name that resolves to loopback, a private network or a cloud
//! metadata service is refused (DNS rebinding), unless the policy lists that
//! address range explicitly.

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// Why an address is not a public unicast address; `None` when it is.
pub fn non_public_class(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_class(v4),
        IpAddr::V6(v6) => v6_class(v6),
    }
}

fn v4_class(ip: Ipv4Addr) -> Option<&'static str> {
    let o = ip.octets();
    Some(match o {
        [169, 254, 169, 254] | [168, 63, 129, 16] => "cloud metadata",
        [0, ..] => "unspecified",
        [127, ..] => "loopback",
        [10, ..] => "private",
        [172, b, ..] if (16..32).contains(&b) => "private",
        [192, 168, ..] => "private",
        [100, b, ..] if (64..128).contains(&b) => "carrier-grade NAT",
        [169, 254, ..] => "link-local",
        [192, 0, 0, _] => "IETF protocol assignment",
        [192, 88, 99, _] => "6to4 relay anycast",
        [192, 0, 2, _] | [198, 51, 100, _] | [203, 0, 113, _] => "documentation",
        [198, 18 | 19, ..] => "benchmarking",
        [a, ..] if a >= 224 => "multicast or reserved",
        _ => return None,
    })
}

fn v6_class(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    if ip == Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254) {
        return Some("cloud metadata");
    }
    if let Some(v4) = ip.to_ipv4_mapped() {
        return v4_class(v4);
    }
    // NAT64 (64:ff9b::/96) and 6to4 (2002::/16) carry an IPv4 address that
    // a gateway would reach: judge that one.
    if s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1 {
        return Some("local-use NAT64");
    }
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
        return v4_class(Ipv4Addr::new(
            (s[6] >> 8) as u8,
            s[6] as u8,
            (s[7] >> 8) as u8,
            s[7] as u8,
        ));
    }
    if s[0] == 0x2002 {
        return v4_class(Ipv4Addr::new(
            (s[1] >> 8) as u8,
            s[1] as u8,
            (s[2] >> 8) as u8,
            s[2] as u8,
        ));
    }
    Some(match s[0] {
        _ if ip.is_unspecified() => "unspecified",
        _ if ip.is_loopback() => "loopback",
        0 => "IPv4-compatible or reserved",
        x if x & 0xfe00 == 0xfc00 => "unique local",
        x if x & 0xffc0 == 0xfe80 => "link-local",
        x if x & 0xffc0 == 0xfec0 => "site-local",
        x if x & 0xff00 == 0xff00 => "multicast",
        0x2001 if s[1] == 0x0db8 => "documentation",
        0x2001 if s[1] == 0 => "Teredo",
        _ => return None,
    })
}

/// An address range in CIDR notation (`10.0.0.0/8`, `fd00::/8`), or one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr(IpNet);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?}: not an address or CIDR range (e.g. 10.0.0.0/8, fd00::/8)")]
pub struct CidrError(String);

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, CidrError> {
        let text = s.trim();
        let net = if text.contains('/') {
            text.parse::<IpNet>().ok()
        } else {
            text.parse::<IpAddr>().ok().map(IpNet::from)
        };
        net.map(Cidr).ok_or_else(|| CidrError(s.to_owned()))
    }
}

impl Cidr {
    /// Whether `ip` is in the range (an IPv4-mapped IPv6 address counts as
    /// the IPv4 address it maps).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.0.contains(&ip)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Public addresses, plus the ranges a policy lists.
#[derive(Debug, Clone, Default)]
pub struct AddressPolicy {
    pub allowed: Vec<Cidr>,
}

impl AddressPolicy {
    /// Every address, whatever its class.
    pub fn any() -> Self {
        AddressPolicy {
            allowed: vec![
                Cidr(IpNet::V4(Ipv4Net::default())),
                Cidr(IpNet::V6(Ipv6Net::default())),
            ],
        }
    }

    /// `Err(class)` when `ip` may not be dialled.
    pub fn check(&self, ip: IpAddr) -> Result<(), &'static str> {
        match non_public_class(ip) {
            None => Ok(()),
            Some(_) if self.allowed.iter().any(|c| c.contains(ip)) => Ok(()),
            Some(class) => Err(class),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(s: &str) -> Option<&'static str> {
        non_public_class(s.parse().unwrap())
    }

    #[test]
    fn non_public_addresses_are_classified() {
        for (ip, want) in [
            ("127.0.0.1", "loopback"),
            ("10.0.0.1", "private"),
            ("172.16.5.4", "private"),
            ("192.168.1.1", "private"),
            ("100.64.0.1", "carrier-grade NAT"),
            ("169.254.169.254", "cloud metadata"),
            ("169.254.1.1", "link-local"),
            ("0.0.0.0", "unspecified"),
            ("255.255.255.255", "multicast or reserved"),
            ("::1", "loopback"),
            ("::", "unspecified"),
            ("fd00:ec2::254", "cloud metadata"),
            ("fd12::1", "unique local"),
            ("fe80::1", "link-local"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:169.254.169.254", "cloud metadata"),
            ("64:ff9b::a00:1", "private"),
            ("2002:a00:1::", "private"),
            ("64:ff9b:1::a00:1", "local-use NAT64"),
            ("168.63.129.16", "cloud metadata"),
        ] {
            assert_eq!(class(ip), Some(want), "{ip}");
        }
        for ip in ["93.184.216.34", "1.1.1.1", "172.32.0.1", "2606:4700::1111"] {
            assert_eq!(class(ip), None, "{ip}");
        }
    }

    #[test]
    fn listed_ranges_are_allowed_and_nothing_else() {
        let policy = AddressPolicy {
            allowed: vec!["127.0.0.1".parse().unwrap(), "10.1.0.0/16".parse().unwrap()],
        };
        assert!(policy.check("127.0.0.1".parse().unwrap()).is_ok());
        assert!(policy.check("::ffff:127.0.0.1".parse().unwrap()).is_ok());
        assert!(policy.check("127.0.0.2".parse().unwrap()).is_err());
        assert!(policy.check("10.1.200.3".parse().unwrap()).is_ok());
        assert!(policy.check("10.2.0.1".parse().unwrap()).is_err());
        assert!(policy.check("169.254.169.254".parse().unwrap()).is_err());
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("nope".parse::<Cidr>().is_err());
        assert!("10.0.0.0/".parse::<Cidr>().is_err());
        let loose: Cidr = " 10.1.2.3/8 ".parse().unwrap();
        assert!(
            loose.contains("10.200.0.1".parse().unwrap()),
            "host bits are masked"
        );
        assert_eq!(loose.to_string(), "10.1.2.3/8");
        assert!(!loose.contains("fd00::1".parse().unwrap()));
        assert!(
            AddressPolicy::any()
                .check("fd00::1".parse().unwrap())
                .is_ok()
        );
        for ip in [
            "127.0.0.1",
            "169.254.169.254",
            "::1",
            "fd00:ec2::254",
            "1.1.1.1",
        ] {
            assert!(
                AddressPolicy::any().check(ip.parse().unwrap()).is_ok(),
                "{ip}"
            );
        }
    }
}
