//! The workspace's declared `rust-version` is the real minimum: no package
//! in Cargo.lock needs a newer Rust, and every member declares the same one.
//! Only one toolchain is at hand here and in CI, so this reads what the
//! dependencies declare (`cargo metadata`) rather than building with the
//! old compiler.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::process::Command;

use serde_json::Value;

/// `1.88`, `1.88.0` → (1, 88, 0); `None` for anything else.
fn parse(version: &str) -> Option<(u64, u64, u64)> {
    let mut parts = version.split('.').map(|p| p.parse::<u64>().ok());
    let major = parts.next()??;
    let minor = parts.next().unwrap_or(Some(0))?;
    let patch = parts.next().unwrap_or(Some(0))?;
    parts.next().is_none().then_some((major, minor, patch))
}

/// `rust-version` under `[workspace.package]` in the root Cargo.toml.
fn declared(manifest: &str) -> String {
    let mut section = "";
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
        } else if section == "[workspace.package]"
            && let Some((key, value)) = line.split_once('=')
            && key.trim() == "rust-version"
        {
            return value.trim().trim_matches('"').to_owned();
        }
    }
    panic!("Cargo.toml declares no rust-version under [workspace.package]");
}

#[test]
fn the_declared_rust_version_is_the_minimum_over_every_locked_package() {
    let root = env!("CARGO_MANIFEST_DIR");
    let manifest = std::fs::read_to_string(format!("{root}/Cargo.toml")).unwrap();
    let declared = declared(&manifest);
    let minimum = parse(&declared).unwrap_or_else(|| panic!("rust-version {declared:?}"));
    let output = Command::new(env!("CARGO"))
        .args(["metadata", "--locked", "--format-version", "1"])
        .arg("--manifest-path")
        .arg(format!("{root}/Cargo.toml"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: Value = serde_json::from_slice(&output.stdout).unwrap();
    let members: Vec<&Value> = metadata["workspace_members"]
        .as_array()
        .unwrap()
        .iter()
        .collect();
    let packages = metadata["packages"].as_array().unwrap();
    assert!(packages.len() > members.len(), "{metadata}");
    let mut offenders = Vec::new();
    for package in packages {
        let name = format!(
            "{} {}",
            package["name"].as_str().unwrap(),
            package["version"].as_str().unwrap()
        );
        let wanted = package["rust_version"].as_str();
        if members.contains(&&package["id"]) {
            if wanted.and_then(parse) != Some(minimum) {
                offenders.push(format!(
                    "workspace member {name} declares rust-version {}, the workspace {declared}",
                    wanted.unwrap_or("none")
                ));
            }
            continue;
        }
        let Some(wanted) = wanted else { continue };
        match parse(wanted) {
            Some(version) if version <= minimum => {}
            Some(_) => offenders.push(format!("{name} needs Rust {wanted}")),
            None => offenders.push(format!("{name} declares rust-version {wanted:?}")),
        }
    }
    assert!(
        offenders.is_empty(),
        "Cargo.toml declares rust-version = {declared:?}, but:\n  {}",
        offenders.join("\n  ")
    );
}

/// Every `name version` pair a Cargo.lock pins.
fn locked(path: &str) -> std::collections::BTreeSet<(String, String)> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut pins = std::collections::BTreeSet::new();
    let mut name = None;
    for line in text.lines() {
        if let Some(value) = line.strip_prefix("name = ") {
            name = Some(value.trim_matches('"').to_owned());
        } else if let Some(value) = line.strip_prefix("version = ")
            && let Some(name) = name.take()
        {
            pins.insert((name, value.trim_matches('"').to_owned()));
        }
    }
    pins
}

#[test]
fn the_fuzz_target_is_locked_to_the_workspaces_versions() {
    let root = env!("CARGO_MANIFEST_DIR");
    // Resolvable as committed: `cargo fuzz run --locked` (in .ci/run) never
    // rewrites fuzz/Cargo.lock and leaves the tree dirty. Not --offline: on
    // a fresh machine the fuzz target's own dependencies (libfuzzer-sys)
    // are not downloaded until .ci/run fuzzes.
    let output = Command::new(env!("CARGO"))
        .args(["metadata", "--locked", "--format-version", "1"])
        .arg("--manifest-path")
        .arg(format!("{root}/fuzz/Cargo.toml"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "fuzz/Cargo.lock is stale (copy Cargo.lock over it and run `cargo metadata` in fuzz/): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    // And it builds what the workspace ships, not other versions of it.
    let workspace = locked(&format!("{root}/Cargo.lock"));
    let names: std::collections::BTreeSet<&String> = workspace.iter().map(|(n, _)| n).collect();
    let foreign: Vec<_> = locked(&format!("{root}/fuzz/Cargo.lock"))
        .into_iter()
        .filter(|(name, _)| names.contains(name))
        .filter(|pin| !workspace.contains(pin))
        .collect();
    assert!(
        foreign.is_empty(),
        "fuzz/Cargo.lock pins other versions than Cargo.lock: {foreign:?}"
    );
}
