//! What a runner's host can give, as it says at registration: the
//! workload classes it offers rest on these.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::report::Accelerator;

/// The host features behind a runner's workload classes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostFeatures {
    /// `uname -r`.
    pub kernel: String,
    /// The Landlock ABI the kernel offers (0: none).
    pub landlock_abi: u32,
    /// `v2`, `v1` or `none`: the cgroup hierarchy per-run limits use.
    pub cgroup: String,
    /// A guest booted under KVM here (probed by booting one, not by
    /// finding `/dev/kvm`). `false` also when the microvm class was not
    /// asked for, and so not probed.
    pub hardware_virtualization: bool,
    /// The accelerator `microvm` guests run under, when the runner offers
    /// the class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator: Option<Accelerator>,
    /// Why hardware virtualization is not used, when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emulation_reason: Option<String>,
}

/// The least a host must have for its runners to be registered (`moat
/// serve --min-kernel`, `--min-landlock-abi`): hosts that need patching are
/// turned away with the reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostMinimum {
    /// `(major, minor, patch)` of the kernel release.
    pub kernel: Option<(u32, u32, u32)>,
    pub landlock_abi: Option<u32>,
}

/// The `(major, minor, patch)` a kernel release starts with (`6.1.0-27-amd64`
/// → `(6, 1, 0)`; missing parts are 0), or `None` when it does not start
/// with a number.
pub fn kernel_version(release: &str) -> Option<(u32, u32, u32)> {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .take_while(|p| !p.is_empty())
        .map(|p| p.parse::<u32>().ok());
    let major = parts.next()??;
    let minor = parts.next().flatten().unwrap_or(0);
    let patch = parts.next().flatten().unwrap_or(0);
    Some((major, minor, patch))
}

impl HostMinimum {
    /// Why `host` falls short (`None`: it does not). A runner that says
    /// nothing of its host falls short of any minimum.
    pub fn shortfall(&self, host: Option<&HostFeatures>) -> Option<String> {
        if self.kernel.is_none() && self.landlock_abi.is_none() {
            return None;
        }
        let Some(host) = host else {
            return Some("the runner does not say what its host has (an older runner)".into());
        };
        if let Some(min) = self.kernel {
            match kernel_version(&host.kernel) {
                Some(have) if have >= min => {}
                _ => {
                    return Some(format!(
                        "kernel {:?} is older than the {}.{}.{} this control plane requires",
                        host.kernel, min.0, min.1, min.2
                    ));
                }
            }
        }
        if let Some(min) = self.landlock_abi
            && host.landlock_abi < min
        {
            return Some(format!(
                "Landlock ABI {} is below the {min} this control plane requires",
                host.landlock_abi
            ));
        }
        None
    }
}

/// Why a runner label is not one (`KEY=VALUE`, the key 1 to 63 of
/// `[a-z0-9._/-]` starting with a letter or digit, the value up to 63 of
/// `[A-Za-z0-9._-]`).
pub fn check_label(key: &str, value: &str) -> Result<(), String> {
    let key_ok = (1..=63).contains(&key.len())
        && key.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && key
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._/-".contains(&b));
    if !key_ok {
        return Err(format!(
            "label key {key:?}: 1 to 63 of a-z 0-9 . _ / -, starting with a letter or digit"
        ));
    }
    if value.len() > 63
        || !value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        return Err(format!(
            "label {key}: the value {value:?} is up to 63 of A-Z a-z 0-9 . _ -"
        ));
    }
    Ok(())
}

/// Why a host id is not one (1 to 128 of `[A-Za-z0-9._:-]`).
pub fn check_host_id(id: &str) -> Result<(), String> {
    if (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
    {
        Ok(())
    } else {
        Err(format!("host id {id:?}: 1 to 128 of A-Z a-z 0-9 . _ : -"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minimum_turns_away_old_or_silent_hosts_only() {
        let host = |kernel: &str, abi| HostFeatures {
            kernel: kernel.into(),
            landlock_abi: abi,
            ..HostFeatures::default()
        };
        assert_eq!(kernel_version("6.1.0-27-amd64"), Some((6, 1, 0)));
        assert_eq!(kernel_version("5.15"), Some((5, 15, 0)));
        assert_eq!(kernel_version("6"), Some((6, 0, 0)));
        assert_eq!(kernel_version("linux"), None);
        let none = HostMinimum::default();
        assert_eq!(none.shortfall(None), None);
        let min = HostMinimum {
            kernel: Some((6, 1, 0)),
            landlock_abi: Some(3),
        };
        assert_eq!(min.shortfall(Some(&host("6.1.0-27-amd64", 7))), None);
        assert_eq!(min.shortfall(Some(&host("6.12.3", 3))), None);
        assert!(min.shortfall(Some(&host("5.15.0-1-amd64", 7))).is_some());
        assert!(min.shortfall(Some(&host("garbage", 7))).is_some());
        assert!(
            min.shortfall(Some(&host("6.1.0", 2)))
                .is_some_and(|m| m.contains("ABI 2"))
        );
        assert!(min.shortfall(None).is_some());
    }

    #[test]
    fn labels_and_host_ids_are_checked_once() {
        assert!(check_label("zone", "eu-west-1a").is_ok());
        assert!(check_label("dedicated/org", "acme").is_ok());
        assert!(check_label("Zone", "a").is_err());
        assert!(check_label("", "a").is_err());
        assert!(check_label("zone", "a b").is_err());
        assert!(check_label("zone", &"x".repeat(64)).is_err());
        assert!(check_host_id("0123abcd").is_ok());
        assert!(check_host_id("host a").is_err());
        assert!(check_host_id("").is_err());
    }
}
