//! A runner's calls: registration with a bootstrap token, then every
//! request signed with the per-boot key (`moat_core::request_sig`).

use std::time::{Duration, SystemTime};

use moat_api::ManifestView;
use moat_api::runner::{
    ChunkNames, Claim, ElementBody, ElementDecision, EventsBody, EventsRecorded, FinishBody,
    Heartbeat, IngressDial, IngressDials, Janitor, ManifestRefreshed, Next, Recorded, Registered,
    Registration, Released, Reported, ResultBody, ShellEnded, TornDown,
};
use moat_core::Event;
use moat_core::event_data::RunResumed;
use moat_core::request_sig;
use moat_core::sign::{PrivateKey, PublicKey};
use moat_core::url::encode_component as segment;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::ClientError;
use crate::http::{Answer, Http};

/// Whether a call is retried while the control plane cannot be reached or
/// is unavailable (a restart): a runner rides through it and goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    Once,
    WhileUnavailable,
}

/// Told of each retry (what failed, and the wait before the next try).
pub type RetryLog = Box<dyn Fn(&ClientError, Duration) + Send + Sync>;

/// A registered runner's client.
pub struct RunnerClient {
    http: Http,
    key: PrivateKey,
    runner_id: String,
    on_retry: RetryLog,
    /// Once set, nothing is retried any more (the runner is stopping).
    stop_retrying: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// The CAs trusted for `https://` (`None`: Mozilla's), for tunnels.
    roots: Option<crate::CaRoots>,
}

impl RunnerClient {
    /// A client with `key` as its per-boot key; register before anything else.
    pub fn new(base: &str, key: PrivateKey, on_retry: RetryLog) -> RunnerClient {
        RunnerClient::with_roots(base, key, on_retry, None)
    }

    /// [`RunnerClient::new`], trusting only `roots` for `https://` when given.
    pub fn with_roots(
        base: &str,
        key: PrivateKey,
        on_retry: RetryLog,
        roots: Option<&crate::CaRoots>,
    ) -> RunnerClient {
        RunnerClient {
            // A long poll waits up to the control plane's maximum wait.
            http: Http::with_roots(base, Duration::from_secs(90), roots),
            key,
            runner_id: String::new(),
            on_retry,
            stop_retrying: None,
            roots: roots.cloned(),
        }
    }

    /// Retries stop once `flag` is set: a runner that is stopping gives up
    /// on a control plane it cannot reach rather than wait for it.
    pub fn stop_retrying_when(&mut self, flag: std::sync::Arc<std::sync::atomic::AtomicBool>) {
        self.stop_retrying = Some(flag);
    }

    pub fn runner_id(&self) -> &str {
        &self.runner_id
    }

    pub fn public_key(&self) -> PublicKey {
        self.key.public()
    }

    /// `POST /v1/runner/register` with the single-use bootstrap token.
    pub fn register(
        &mut self,
        token: &str,
        registration: &Registration,
    ) -> Result<Registered, ClientError> {
        let what = "registration";
        let body = encode(what, registration)?;
        let answer = self.http.send(
            "POST",
            "/v1/runner/register",
            &[("authorization", format!("Bearer {token}"))],
            Some(&body),
        )?;
        let registered: Registered = answer.json(what)?;
        self.runner_id = registered.runner_id.clone();
        Ok(registered)
    }

    /// `POST /v1/runner/events`: the runner's provenance.
    pub fn report_events(&self, events: Vec<Event>, retry: Retry) -> Result<u64, ClientError> {
        let body = EventsBody { events };
        let answer: EventsRecorded = self.call(
            "reporting events",
            "POST",
            "/v1/runner/events",
            Some(&body),
            retry,
        )?;
        Ok(answer.recorded)
    }

    /// `POST /v1/runner/claim`: the next queued run, waiting up to `wait`.
    pub fn claim(&self, wait: Duration) -> Result<Option<Claim>, ClientError> {
        let path = format!("/v1/runner/claim?wait_ms={}", wait.as_millis());
        self.call_or_none("claiming a run", "POST", &path, None::<&()>)
    }

    /// `POST /v1/runner/runs/{run}/next`: what to do next, waiting up to `wait`.
    pub fn next(&self, run: &str, wait: Duration) -> Result<Option<Next>, ClientError> {
        let path = format!(
            "/v1/runner/runs/{}/next?wait_ms={}",
            segment(run),
            wait.as_millis()
        );
        self.call_or_none(&format!("run {run}: next"), "POST", &path, None::<&()>)
    }

    /// `POST /v1/runner/runs/{run}/heartbeat`: renews the lease (once).
    pub fn heartbeat(&self, run: &str) -> Result<Heartbeat, ClientError> {
        let path = format!("/v1/runner/runs/{}/heartbeat", segment(run));
        self.call(
            &format!("run {run}: heartbeat"),
            "POST",
            &path,
            None::<&()>,
            Retry::Once,
        )
    }

    /// `POST /v1/runner/runs/{run}/release`: gives a held run back to the
    /// queue, unfinished (this runner is stopping). Tried once: if it does
    /// not get through, the run's lease lapses and the run is retried.
    pub fn release(&self, run: &str) -> Result<Released, ClientError> {
        let path = format!("/v1/runner/runs/{}/release", segment(run));
        self.call(
            &format!("run {run}: release"),
            "POST",
            &path,
            None::<&()>,
            Retry::Once,
        )
    }

    /// `POST /v1/runner/runs/{run}/ops/{op}/tool`: asks the control plane to
    /// make a tool call (it holds the credential).
    pub fn tool_call(&self, run: &str, op: &str) -> Result<(), ClientError> {
        let path = format!("/v1/runner/runs/{}/ops/{}/tool", segment(run), segment(op));
        let what = format!("tool call {op}");
        let answer = self.send(&what, "POST", &path, None::<&()>, Retry::WhileUnavailable)?;
        if answer.status != 200 {
            return Err(answer.refusal(&what));
        }
        Ok(())
    }

    /// `POST /v1/runner/runs/{run}/ops/{op}/result`.
    pub fn report_result(
        &self,
        run: &str,
        op: &str,
        body: &ResultBody,
    ) -> Result<bool, ClientError> {
        let path = format!(
            "/v1/runner/runs/{}/ops/{}/result",
            segment(run),
            segment(op)
        );
        self.post_recorded(&format!("reporting operation {op}"), &path, body)
    }

    /// `POST /v1/runner/runs/{run}/ops/{op}/element`: the decision on the
    /// element an acting browser step would act on.
    pub fn element(
        &self,
        run: &str,
        op: &str,
        body: &ElementBody,
    ) -> Result<ElementDecision, ClientError> {
        let path = format!(
            "/v1/runner/runs/{}/ops/{}/element",
            segment(run),
            segment(op)
        );
        self.call(
            &format!("deciding on operation {op}'s element"),
            "POST",
            &path,
            Some(body),
            Retry::WhileUnavailable,
        )
    }

    /// `POST /v1/runner/runs/{run}/shell-ended`.
    pub fn shell_ended(&self, run: &str, body: &ShellEnded) -> Result<bool, ClientError> {
        let path = format!("/v1/runner/runs/{}/shell-ended", segment(run));
        self.post_recorded(
            &format!("run {run}: reporting its shell's end"),
            &path,
            body,
        )
    }

    /// `POST /v1/runner/runs/{run}/finish`: whether the end was recorded,
    /// and the next run when the body asked for one (`then_claim_ms`).
    pub fn finish(&self, run: &str, body: &FinishBody) -> Result<Reported, ClientError> {
        let path = format!("/v1/runner/runs/{}/finish", segment(run));
        let plain = body.then_claim_ms.map(|_| FinishBody {
            then_claim_ms: None,
            ..body.clone()
        });
        self.report(&format!("finishing run {run}"), &path, body, plain)
    }

    /// `POST /v1/runner/runs/{run}/destroyed`: the run's teardown here,
    /// and the next run when the body asked for one (`then_claim_ms`).
    pub fn destroyed(&self, run: &str, torn_down: &TornDown) -> Result<Reported, ClientError> {
        let path = format!("/v1/runner/runs/{}/destroyed", segment(run));
        let plain = torn_down.then_claim_ms.map(|_| TornDown {
            then_claim_ms: None,
            ..torn_down.clone()
        });
        let what = format!("run {run}: reporting its teardown");
        self.report(&what, &path, torn_down, plain)
    }

    /// A run's last report, retried while the control plane is
    /// unavailable. One that asks for a claim is sent once: were its answer
    /// lost, a retry would claim another run while the first stayed leased
    /// here until its lease lapsed. On a failure worth retrying it goes
    /// again as `plain`, without the ask (the claiming loop claims).
    fn report<B: Serialize>(
        &self,
        what: &str,
        path: &str,
        body: &B,
        plain: Option<B>,
    ) -> Result<Reported, ClientError> {
        let Some(plain) = plain else {
            return self.call(what, "POST", path, Some(body), Retry::WhileUnavailable);
        };
        match self.call(what, "POST", path, Some(body), Retry::Once) {
            Err(e) if e.is_transient() => {
                self.call(what, "POST", path, Some(&plain), Retry::WhileUnavailable)
            }
            answered => answered,
        }
    }

    /// `POST /v1/runner/janitor`: leftovers of earlier runs, torn down.
    pub fn janitor(&self, janitor: &Janitor) -> Result<(), ClientError> {
        let _: Recorded = self.call(
            "reporting the leftovers torn down at start",
            "POST",
            "/v1/runner/janitor",
            Some(janitor),
            Retry::WhileUnavailable,
        )?;
        Ok(())
    }

    /// `GET /v1/runner/manifest`: the current manifest of this runner's
    /// environment (once).
    pub fn manifest(&self) -> Result<ManifestView, ClientError> {
        self.call(
            "fetching the current manifest",
            "GET",
            "/v1/runner/manifest",
            None::<&()>,
            Retry::Once,
        )
    }

    /// `POST /v1/runner/manifest`: this runner now serves under `hash`.
    pub fn manifest_refreshed(&self, hash: &str) -> Result<(), ClientError> {
        let body = ManifestRefreshed {
            manifest_hash: hash.to_owned(),
        };
        let _: ManifestRefreshed = self.call(
            "reporting the manifest refresh",
            "POST",
            "/v1/runner/manifest",
            Some(&body),
            Retry::WhileUnavailable,
        )?;
        Ok(())
    }

    /// `POST /v1/runner/runs/{run}/volumes/{volume}/missing`.
    pub fn volume_missing(
        &self,
        run: &str,
        volume: &str,
        asked: &ChunkNames,
    ) -> Result<ChunkNames, ClientError> {
        let path = format!(
            "/v1/runner/runs/{}/volumes/{}/missing",
            segment(run),
            segment(volume)
        );
        self.call(
            &format!("volume {volume}: asking which chunks are stored"),
            "POST",
            &path,
            Some(asked),
            Retry::WhileUnavailable,
        )
    }

    /// `PUT /v1/runner/runs/{run}/volumes/{volume}/{space}/{sha256}`
    /// (`space`: `chunks` or `snapshots`): stored once this returns.
    pub fn put_volume_bytes(
        &self,
        run: &str,
        volume: &str,
        space: VolumeSpace,
        sha256: &str,
        bytes: &[u8],
    ) -> Result<(), ClientError> {
        let path = volume_path(run, volume, space, sha256);
        let what = format!("volume {volume}: storing {} {sha256}", space.noun());
        let _: Recorded = self
            .send_bytes(&what, "PUT", &path, bytes.to_vec(), Retry::WhileUnavailable)?
            .json(&what)?;
        Ok(())
    }

    /// `GET /v1/runner/runs/{run}/volumes/{volume}/{space}/{sha256}`: the
    /// bytes as sent (the caller checks them against the name).
    pub fn get_volume_bytes(
        &self,
        run: &str,
        volume: &str,
        space: VolumeSpace,
        sha256: &str,
    ) -> Result<Vec<u8>, ClientError> {
        let path = volume_path(run, volume, space, sha256);
        let what = format!("volume {volume}: reading {} {sha256}", space.noun());
        let answer = self.send_bytes(&what, "GET", &path, Vec::new(), Retry::WhileUnavailable)?;
        if answer.status != 200 {
            return Err(answer.refusal(&what));
        }
        Ok(answer.body)
    }

    /// `POST /v1/runner/runs/{run}/resumed`: what this runner restored of
    /// a run it took over.
    pub fn resumed(&self, run: &str, body: &RunResumed) -> Result<(), ClientError> {
        let path = format!("/v1/runner/runs/{}/resumed", segment(run));
        let _: Recorded = self.call(
            &format!("run {run}: reporting its resumption"),
            "POST",
            &path,
            Some(body),
            Retry::WhileUnavailable,
        )?;
        Ok(())
    }

    /// A report the control plane answers with whether it recorded it
    /// (`false`: it already had, or the run is no longer this runner's).
    fn post_recorded<B: Serialize>(
        &self,
        what: &str,
        path: &str,
        body: &B,
    ) -> Result<bool, ClientError> {
        let answer: Recorded =
            self.call(what, "POST", path, Some(body), Retry::WhileUnavailable)?;
        Ok(answer.recorded)
    }

    fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        what: &str,
        method: &str,
        path: &str,
        body: Option<&B>,
        retry: Retry,
    ) -> Result<T, ClientError> {
        self.send(what, method, path, body, retry)?.json(what)
    }

    /// A long poll: `None` when nothing came in time (204).
    fn call_or_none<B: Serialize, T: DeserializeOwned>(
        &self,
        what: &str,
        method: &str,
        path: &str,
        body: Option<&B>,
    ) -> Result<Option<T>, ClientError> {
        let answer = self.send(what, method, path, body, Retry::WhileUnavailable)?;
        if answer.status == 204 {
            return Ok(None);
        }
        answer.json(what).map(Some)
    }

    /// The signed request, retried per `retry`; a transient refusal that
    /// is not retried comes back as an error.
    fn send<B: Serialize>(
        &self,
        what: &str,
        method: &str,
        path: &str,
        body: Option<&B>,
        retry: Retry,
    ) -> Result<Answer, ClientError> {
        let bytes = match body {
            Some(body) => encode(what, body)?,
            None => Vec::new(),
        };
        self.send_bytes(what, method, path, bytes, retry)
    }

    /// [`RunnerClient::send`] of a body as it is.
    fn send_bytes(
        &self,
        what: &str,
        method: &str,
        path: &str,
        bytes: Vec<u8>,
        retry: Retry,
    ) -> Result<Answer, ClientError> {
        let mut delay = Duration::from_millis(100);
        loop {
            let error = match self.signed(method, path, &bytes) {
                Ok(answer) if !matches!(answer.status, 502..=504) => return Ok(answer),
                Ok(answer) => answer.refusal(what),
                Err(e) => e,
            };
            let stopping = self
                .stop_retrying
                .as_ref()
                .is_some_and(|f| f.load(std::sync::atomic::Ordering::Relaxed));
            if retry == Retry::Once || !error.is_transient() || stopping {
                return Err(error);
            }
            (self.on_retry)(&error, delay);
            std::thread::sleep(delay);
            delay = (delay * 2).min(Duration::from_secs(5));
        }
    }

    /// `GET /v1/runner/runs/{run}/ingress`: requests to the run's ports
    /// waiting for a tunnel, waiting up to `wait` for one (asked once).
    pub fn ingress_dials(
        &self,
        run: &str,
        wait: Duration,
    ) -> Result<Vec<IngressDial>, ClientError> {
        let path = format!(
            "/v1/runner/runs/{}/ingress?wait_ms={}",
            segment(run),
            wait.as_millis()
        );
        let answer: IngressDials = self.call(
            &format!("run {run}: ingress"),
            "GET",
            &path,
            None::<&()>,
            Retry::Once,
        )?;
        Ok(answer.dials)
    }

    /// Where and how to open the tunnel for `conn`
    /// (`POST /v1/runner/runs/{run}/ingress/{conn}`, upgraded), to the
    /// replica `via` names or this client's control plane: the connection
    /// is the caller's to make, as it speaks async I/O. An `https://`
    /// control plane's tunnels go over HTTPS only.
    pub fn tunnel(
        &self,
        run: &str,
        conn: &str,
        via: Option<&str>,
    ) -> Result<crate::Tunnel, ClientError> {
        let base = self.http.base();
        let target = via.map_or(base, |v| v.trim_end_matches('/'));
        let secure = |url: &str| url.to_ascii_lowercase().starts_with("https://");
        if secure(base) && !secure(target) {
            return Err(ClientError::Unreachable {
                base: target.to_owned(),
                message: "a tunnel of an https:// control plane must go over https://".into(),
            });
        }
        let path = format!("/v1/runner/runs/{}/ingress/{}", segment(run), segment(conn));
        let headers = self.signature_headers("POST", &path, b"");
        crate::Tunnel::new(
            target,
            &path,
            &headers,
            self.roots.as_ref().map(crate::CaRoots::ders),
        )
    }

    /// The headers that sign `method path` with `body`.
    fn signature_headers(
        &self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> [(&'static str, String); 4] {
        let timestamp = moat_core::time::ms(SystemTime::now());
        let nonce = moat_core::random::hex(16);
        let signature = request_sig::Signed {
            runner: &self.runner_id,
            method,
            path_and_query: path,
            timestamp_ms: timestamp,
            nonce: &nonce,
            body,
        }
        .sign(&self.key);
        [
            (request_sig::RUNNER, self.runner_id.clone()),
            (request_sig::TIMESTAMP, timestamp.to_string()),
            (request_sig::NONCE, nonce),
            (request_sig::SIGNATURE, signature),
        ]
    }

    fn signed(&self, method: &str, path: &str, body: &[u8]) -> Result<Answer, ClientError> {
        let headers = self.signature_headers(method, path, body);
        self.http
            .send(method, path, &headers, (method != "GET").then_some(body))
    }
}

/// Where a volume's bytes go: its chunks, or its snapshot documents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeSpace {
    Chunks,
    Snapshots,
}

impl VolumeSpace {
    fn noun(self) -> &'static str {
        match self {
            VolumeSpace::Chunks => "chunk",
            VolumeSpace::Snapshots => "snapshot",
        }
    }
}

fn volume_path(run: &str, volume: &str, space: VolumeSpace, sha256: &str) -> String {
    let space = match space {
        VolumeSpace::Chunks => "chunks",
        VolumeSpace::Snapshots => "snapshots",
    };
    format!(
        "/v1/runner/runs/{}/volumes/{}/{space}/{}",
        segment(run),
        segment(volume),
        segment(sha256)
    )
}

fn encode<B: Serialize + ?Sized>(what: &str, body: &B) -> Result<Vec<u8>, ClientError> {
    serde_json::to_vec(body).map_err(|e| ClientError::Encode {
        what: what.to_owned(),
        message: e.to_string(),
    })
}
