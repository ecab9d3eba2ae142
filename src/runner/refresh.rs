//! The runner's manifest refresh, driven by `moat_core::lifecycle`'s
//! rules: from the refresh window on, fetch the control plane's current
//! manifest (verified with the control-plane key); a fetch that fails or
//! brings nothing newer is reported (`runner.manifest.refresh_failed`) and
//! retried with backoff; a fresh one is swapped in at the next operation
//! boundary and reported to the control plane (`runner.manifest.refreshed`),
//! and the shells started from then on serve under it.

use std::path::PathBuf;
use std::time::SystemTime;

use anyhow::Context;
use moat_core::lifecycle::{Lifetime, Next, Refresher, Report};
use moat_core::sign::PublicKey;
use moat_core::{EventType, SignedManifest};
use serde_json::json;

use super::client::{Client, stamp};

pub struct Manifests {
    refresher: Refresher<SignedManifest>,
    trusted: PublicKey,
    dir: PathBuf,
    /// The refreshed manifest's file for `moat shell --manifest`; `None`
    /// while the sealed one is current.
    pub file: Option<PathBuf>,
    /// Bumped at every swap: a run's shell started under an older
    /// generation is replaced at its next operation boundary.
    generation: u64,
}

pub fn lifetime(signed: &SignedManifest) -> anyhow::Result<Lifetime> {
    let parse =
        |t: &str| moat_core::time::parse_rfc3339(t).with_context(|| format!("manifest time {t:?}"));
    Ok(Lifetime {
        created: parse(&signed.manifest.created_at)?,
        expires: parse(&signed.manifest.expires_at)?,
    })
}

impl Manifests {
    pub fn new(sealed: SignedManifest, trusted: PublicKey, dir: PathBuf) -> anyhow::Result<Self> {
        let life = lifetime(&sealed)?;
        Ok(Manifests {
            refresher: Refresher::new(sealed, life),
            trusted,
            dir,
            file: None,
            generation: 0,
        })
    }

    pub fn current(&self) -> &SignedManifest {
        self.refresher.current()
    }

    /// Fetches if due, and swaps a staged manifest in (this is an operation
    /// boundary). The current generation: it changes when the manifest does.
    pub fn tick(&mut self, client: &Client) -> u64 {
        if self.swap_due(client) {
            self.generation += 1;
        }
        self.generation
    }

    fn swap_due(&mut self, client: &Client) -> bool {
        if self.refresher.next(SystemTime::now()) == Next::Fetch {
            match self.fetch(client) {
                Ok(()) => {}
                Err(e) => self.failed(client, &format!("{e:#}")),
            }
        }
        match self.refresher.at_op_boundary() {
            Some(Report::Refreshed) => match self.swap(client) {
                Ok(()) => true,
                Err(e) => {
                    eprintln!("moat runner: manifest swap: {e:#}");
                    false
                }
            },
            _ => false,
        }
    }

    fn fetch(&mut self, client: &Client) -> anyhow::Result<()> {
        let answer = client.signed("GET", "/v1/runner/manifest", None)?;
        if answer.status != 200 {
            anyhow::bail!(
                "the control plane answered {}",
                super::client::error_text(&answer)
            );
        }
        let signed: SignedManifest = serde_json::from_value(answer.body["signed"].clone())
            .context("the fetched manifest")?;
        signed
            .verify(&self.trusted)
            .context("the fetched manifest does not verify")?;
        if signed.manifest_hash == self.current().manifest_hash {
            anyhow::bail!("no newer manifest is published");
        }
        let life = lifetime(&signed)?;
        self.refresher.fetched(signed, life);
        Ok(())
    }

    fn failed(&mut self, client: &Client, reason: &str) {
        let Report::RefreshFailed { failures, retry_at } = self.refresher.failed(SystemTime::now())
        else {
            return;
        };
        eprintln!("moat runner: manifest refresh failed ({failures}): {reason}");
        let event = json!({"events": [{
            "type": EventType::RunnerManifestRefreshFailed, "at": stamp(SystemTime::now()), "runId": "",
            "data": {"failures": failures, "retryAt": stamp(retry_at), "reason": reason,
                     "expiresAt": self.current().manifest.expires_at},
        }]});
        // Best effort: the control plane may be the reason the fetch failed.
        let _ = client.signed("POST", "/v1/runner/events", Some(&event));
    }

    fn swap(&mut self, client: &Client) -> anyhow::Result<()> {
        let current = self.current().clone();
        let file = self
            .dir
            .join(format!("manifest-{}.json", current.manifest_hash));
        std::fs::write(&file, serde_json::to_vec(&current)?)?;
        self.file = Some(file);
        let body = json!({"manifestHash": current.manifest_hash});
        let answer = client.signed_retrying("POST", "/v1/runner/manifest", Some(&body))?;
        if answer.status != 200 {
            anyhow::bail!(
                "reporting the refresh: {}",
                super::client::error_text(&answer)
            );
        }
        eprintln!(
            "moat runner: manifest refreshed to {}",
            current.manifest_hash
        );
        Ok(())
    }
}
