//! `moat manifest`: keys, canonical hashes and signatures of runner manifests.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use moat_core::limits::Limits;
use moat_core::manifest::{AllowedExecutable, FilesystemPolicy, NetworkPolicy};
use moat_core::sign::{PrivateKey, PublicKey};
use moat_core::{Manifest, NetworkMode, OpKind, SandboxMode, SignedManifest};

use crate::files;

/// Create keys, and hash, sign and verify runner manifests.
#[derive(Args)]
pub struct ManifestArgs {
    #[command(subcommand)]
    command: ManifestCommand,
}

#[derive(Subcommand)]
enum ManifestCommand {
    /// Generate an Ed25519 key pair: DIR/moat.key (private, mode 0600) and DIR/moat.pub.
    Keygen {
        /// Directory to write the keys into (created if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Print a starter manifest (read-only tools, 7-day validity) for the given public key.
    Template {
        /// The control plane's public key file (as written by `keygen`).
        #[arg(long, value_name = "FILE")]
        public_key: PathBuf,
        /// The Cedar policy file the control plane serves (`moat serve
        /// --policy`): its SHA-256 becomes the manifest's policyHash, which
        /// a runner's registration must match.
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
        /// The environment the manifest is for (`moat serve --environment`).
        #[arg(long, value_name = "NAME", default_value = "local")]
        environment: String,
    },
    /// Print the canonical hash (SHA-256 of RFC 8785 JSON) of a manifest or signed manifest.
    Hash { file: PathBuf },
    /// Sign a manifest; writes the signed manifest to OUT (or standard output).
    Sign {
        #[arg(long, value_name = "FILE")]
        key: PathBuf,
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        file: PathBuf,
    },
    /// Verify a signed manifest against a trusted public key and the current time.
    Verify {
        #[arg(long, value_name = "FILE")]
        trusted_key: PathBuf,
        file: PathBuf,
    },
}

pub fn main(args: ManifestArgs) -> ExitCode {
    match run(args.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("moat manifest: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(command: ManifestCommand) -> anyhow::Result<()> {
    match command {
        ManifestCommand::Keygen { out } => keygen(&out),
        ManifestCommand::Template {
            public_key,
            policy,
            environment,
        } => {
            let key = read_public_key(&public_key)?;
            let mut manifest = template(&key);
            manifest.environment = environment;
            if let Some(policy) = policy {
                let text = std::fs::read(&policy)
                    .with_context(|| format!("--policy {}", policy.display()))?;
                manifest.policy_hash = moat_core::hash::sha256_hex(&text);
            }
            outln!("{}", serde_json::to_string_pretty(&manifest)?);
            Ok(())
        }
        ManifestCommand::Hash { file } => {
            let manifest = read_any_manifest(&file)?;
            outln!("{}", manifest.hash()?);
            Ok(())
        }
        ManifestCommand::Sign { key, out, file } => {
            let key = read_private_key(&key)?;
            let manifest: Manifest = read_json(&file)?;
            let signed = manifest.sign(&key)?;
            let text = serde_json::to_string_pretty(&signed)? + "\n";
            match out {
                Some(out) => files::write_atomic(&out, text.as_bytes(), 0o644)?,
                None => print!("{text}"),
            }
            Ok(())
        }
        ManifestCommand::Verify { trusted_key, file } => {
            let trusted = read_public_key(&trusted_key)?;
            let signed: SignedManifest = read_json(&file)?;
            let manifest = signed.verify(&trusted)?;
            manifest.check_time(SystemTime::now(), None)?;
            outln!(
                "ok {} (expires {})",
                signed.manifest_hash,
                manifest.expires_at
            );
            Ok(())
        }
    }
}

fn keygen(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let private = dir.join("moat.key");
    let public = dir.join("moat.pub");
    for path in [&private, &public] {
        if path.exists() {
            bail!(
                "{} already exists; refusing to overwrite a key",
                path.display()
            );
        }
    }
    let seed = moat_core::random::bytes::<32>();
    let key = PrivateKey::from_seed(seed);
    files::write_atomic(&private, (key.to_base64() + "\n").as_bytes(), 0o600)?;
    files::write_atomic(&public, (key.public().to_base64() + "\n").as_bytes(), 0o644)?;
    outln!("{}\n{}", private.display(), public.display());
    Ok(())
}

pub fn template(key: &PublicKey) -> Manifest {
    let now = SystemTime::now();
    let stamp = |t: SystemTime| humantime::format_rfc3339_seconds(t).to_string();
    Manifest {
        runner_version: env!("CARGO_PKG_VERSION").into(),
        environment: "local".into(),
        policy_hash: moat_core::hash::sha256_hex(b"local-default-policy"),
        allowed_ops: vec![
            OpKind::ArtifactRead,
            OpKind::ArtifactWrite,
            OpKind::ArtifactList,
            OpKind::ExecArgv,
        ],
        allowed_tools: vec![],
        allowed_executables: [
            "/usr/bin/cat",
            "/usr/bin/ls",
            "/usr/bin/wc",
            "/usr/bin/true",
            "/usr/bin/python3",
        ]
        .iter()
        .map(|p| AllowedExecutable {
            path: (*p).into(),
            sha256: None,
            origin: None,
        })
        .collect(),
        sandbox_modes: vec![SandboxMode::WorkspaceWrite, SandboxMode::ReadOnly],
        network_policy: NetworkPolicy {
            mode: NetworkMode::Off,
            allow_domains: vec![],
            ..NetworkPolicy::default()
        },
        filesystem: FilesystemPolicy {
            read_roots: vec![".".into()],
            write_roots: vec!["output".into()],
            artifact_only: Vec::new(),
            persistent_roots: Vec::new(),
        },
        env_passthrough: vec![],
        limits: Limits::default(),
        exports: None,
        cgroup_limits: Default::default(),
        workload_classes: Vec::new(),
        allow_emulation: false,
        created_at: stamp(now),
        expires_at: stamp(now + Duration::from_secs(7 * 24 * 3600)),
        control_plane_public_key: key.to_base64(),
    }
}

pub fn read_public_key(path: &Path) -> anyhow::Result<PublicKey> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    PublicKey::from_base64(&text).with_context(|| format!("{}", path.display()))
}

pub fn read_private_key(path: &Path) -> anyhow::Result<PrivateKey> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    PrivateKey::from_base64(&text).with_context(|| format!("{}", path.display()))
}

pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<T> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}", path.display()))
}

/// A bare manifest, or the manifest inside a signed one.
pub fn read_any_manifest(path: &Path) -> anyhow::Result<Manifest> {
    let value: serde_json::Value = read_json(path)?;
    let inner = value.get("manifest").cloned().unwrap_or(value);
    serde_json::from_value(inner).with_context(|| format!("{}", path.display()))
}
