//! The runner's manifest refresh, driven by `moat_core::lifecycle`'s
//! rules: from the refresh window on, fetch the control plane's current
//! manifest (verified with the control-plane key); a fetch that fails or
//! brings nothing newer is reported (`runner.manifest.refresh_failed`) and
//! retried with backoff; a fresh one is swapped in at the next operation
//! boundary and reported to the control plane (`runner.manifest.refreshed`),
//! and the shells started from then on serve under it.

use std::path::PathBuf;
use std::time::SystemTime;

use moat_client::{Retry, RunnerClient};
use moat_core::event_data::RunnerManifestRefreshFailed;
use moat_core::lifecycle::{Lifetime, Next, Refresher, Report};
use moat_core::sign::PublicKey;
use moat_core::time::stamp;
use moat_core::{Event, EventData, SignedManifest, WorkloadClass};

use crate::error::{IoContext as _, RunnerError};

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
    /// The workload classes the runner offers: a manifest must list them all.
    classes: Vec<WorkloadClass>,
}

pub fn lifetime(signed: &SignedManifest) -> Result<Lifetime, RunnerError> {
    let parse = |t: &str| {
        moat_core::time::parse_rfc3339(t)
            .map_err(|e| RunnerError::Setup(format!("the manifest's time: {e}")))
    };
    Ok(Lifetime {
        created: parse(&signed.manifest.created_at)?,
        expires: parse(&signed.manifest.expires_at)?,
    })
}

impl Manifests {
    pub fn new(
        sealed: SignedManifest,
        trusted: PublicKey,
        dir: PathBuf,
        classes: Vec<WorkloadClass>,
    ) -> Result<Self, RunnerError> {
        let life = lifetime(&sealed)?;
        Ok(Manifests {
            refresher: Refresher::new(sealed, life),
            trusted,
            dir,
            classes,
            file: None,
            generation: 0,
        })
    }

    pub fn current(&self) -> &SignedManifest {
        self.refresher.current()
    }

    /// Fetches if due, and swaps a staged manifest in (this is an operation
    /// boundary). The current generation: it changes when the manifest does.
    pub fn tick(&mut self, client: &RunnerClient) -> u64 {
        if self.swap_due(client) {
            self.generation += 1;
        }
        self.generation
    }

    fn swap_due(&mut self, client: &RunnerClient) -> bool {
        if self.refresher.next(SystemTime::now()) == Next::Fetch {
            match self.fetch(client) {
                Ok(()) => {}
                Err(e) => self.failed(client, &e.to_string()),
            }
        }
        match self.refresher.at_op_boundary() {
            Some(Report::Refreshed) => match self.swap(client) {
                Ok(()) => true,
                Err(e) => {
                    eprintln!("moat runner: manifest swap: {e}");
                    false
                }
            },
            _ => false,
        }
    }

    fn fetch(&mut self, client: &RunnerClient) -> Result<(), RunnerError> {
        let signed = client.manifest()?.signed;
        signed.verify(&self.trusted).map_err(|e| {
            RunnerError::Protocol(format!("the fetched manifest does not verify: {e}"))
        })?;
        if signed.manifest_hash == self.current().manifest_hash {
            return Err(RunnerError::Protocol(
                "no newer manifest is published".into(),
            ));
        }
        // Its shells are started with the classes it registered with: a
        // manifest without one of them would refuse every shell.
        let listed = signed.manifest.classes();
        if let Some(class) = self.classes.iter().find(|c| !listed.contains(c)) {
            return Err(RunnerError::Protocol(format!(
                "the published manifest does not list workload class {class}, which this \
                 runner offers: restart it without --class {class}"
            )));
        }
        let life = lifetime(&signed)?;
        self.refresher.fetched(signed, life);
        Ok(())
    }

    fn failed(&mut self, client: &RunnerClient, reason: &str) {
        let Report::RefreshFailed { failures, retry_at } = self.refresher.failed(SystemTime::now())
        else {
            return;
        };
        eprintln!("moat runner: manifest refresh failed ({failures}): {reason}");
        let failed = RunnerManifestRefreshFailed {
            failures,
            retry_at: stamp(retry_at),
            reason: reason.to_owned(),
            expires_at: self.current().manifest.expires_at.clone(),
            runner_id: None,
            runner_hash: None,
            manifest_hash: None,
        };
        let event = Event::of(
            EventData::RunnerManifestRefreshFailed(failed),
            moat_core::time::now_stamp(),
            String::new(),
        );
        // Best effort: the control plane may be the reason the fetch failed.
        let _ = client.report_events(vec![event], Retry::Once);
    }

    fn swap(&mut self, client: &RunnerClient) -> Result<(), RunnerError> {
        let current = self.current().clone();
        let file = self
            .dir
            .join(format!("manifest-{}.json", current.manifest_hash));
        let bytes = serde_json::to_vec(&current)
            .map_err(|e| RunnerError::Protocol(format!("the refreshed manifest: {e}")))?;
        std::fs::write(&file, bytes).io(|| file.display().to_string())?;
        self.file = Some(file);
        client.manifest_refreshed(&current.manifest_hash)?;
        eprintln!(
            "moat runner: manifest refreshed to {}",
            current.manifest_hash
        );
        Ok(())
    }
}
