//! Serving claimed runs: one thread per run, operation by operation,
//! through a `moat shell` child, with the lease kept by heartbeats.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex, PoisonError, TryLockError};
use std::time::Duration;

use moat_api::runner::{
    Claim, ElementBody, ElementDecision, FinishBody, Next, Reported, ResultBody, RunEnd,
    ShellEnded, TOOL_PROFILE, TornDown,
};
use moat_client::RunnerClient;
use moat_core::{Envelope, OpResult};
use moat_ledger::Ledger;
use moat_shell::child::ShellChild;

use crate::Config;
use crate::claims::Claims;
use crate::error::{IoContext as _, RunnerError};
use crate::manifests::Manifests;
use crate::slots::{SlotGuard, Slots};
use crate::volumes::Area;
use crate::workspace::{collect_artifacts, private_dir, write_inputs};

/// How long one long poll (a claim, a run's next step) waits.
const LONG_POLL: Duration = Duration::from_secs(5);

/// The pause after a claim the control plane failed to answer, at first
/// and at most (doubling in between while it keeps failing).
const FIRST_CLAIM_PAUSE: Duration = Duration::from_secs(1);
const LAST_CLAIM_PAUSE: Duration = Duration::from_secs(30);

/// The longest gap between heartbeats while an operation runs: how soon a
/// cancelled or revoked run's sandbox is stopped.
const OP_HEARTBEAT: Duration = Duration::from_secs(1);

/// Says so when dropped: the claiming loop has ended.
struct LoopOver<'a>(&'a Claims);

impl Drop for LoopOver<'_> {
    fn drop(&mut self) {
        self.0.end_loop();
    }
}

/// What a running runner holds; its slots share it.
pub(crate) struct Runner {
    pub config: Config,
    /// What `/metrics` reports: operations, refusals, teardowns, runs served.
    pub metrics: Arc<moat_metrics::Metrics>,
    pub client: RunnerClient,
    pub manifests: Mutex<Manifests>,
    /// The manifest generation and its file (`None`: the sealed one), as of
    /// the last refresh check: what a slot uses while another slot's
    /// thread is busy refreshing (a network call) with `manifests` locked.
    pub manifest_now: Mutex<(u64, Option<PathBuf>)>,
    pub slots: Slots,
    /// The shells' state directory (ledger, artifacts, trusted key).
    pub shell_state: PathBuf,
    /// Heartbeat period while an operation runs: a third of the lease, at
    /// most [`OP_HEARTBEAT`].
    pub heartbeat: Duration,
    /// Set by SIGTERM: claim nothing more, give held runs back at their
    /// next operation boundary, then exit.
    pub draining: Arc<AtomicBool>,
    /// Who may ask for a run now, within `max_runs`: the claiming loop,
    /// and a slot whose run's finish asks for the next one. Runs are given
    /// back only once no ask can come any more, or one could claim them
    /// again.
    pub claims: Claims,
    /// The runs being served or torn down here: an attempt of a run this
    /// runner lost and claimed again waits for the old attempt's teardown
    /// (both use `runs/<id>`).
    pub serving: Mutex<std::collections::HashSet<String>>,
    pub served: std::sync::Condvar,
    /// The control plane takes a run's teardown with its finish
    /// (`Registered::finish_takes_teardown`).
    pub finish_takes_teardown: bool,
    /// A run's last report may claim the slot's next run
    /// (`Registered::last_report_takes_claim`).
    pub last_report_takes_claim: bool,
}

/// What a run served here has left on this host so far.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Left {
    /// No shell was started: only its directories, if any.
    Nothing,
    /// A shell was started: its sandboxes and processes are looked for.
    Shell,
    /// Torn down (these checks), not reported yet.
    TornDown(Vec<moat_core::event_data::TeardownCheck>),
    /// Torn down, and the teardown reported with the run's finish.
    Reported,
}

/// Marks a run as served here until dropped (its teardown done).
struct Serving<'a>(&'a Runner, String);

impl Drop for Serving<'_> {
    fn drop(&mut self) {
        let mut serving = self
            .0
            .serving
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        serving.remove(&self.1);
        self.0.metrics.run_active(-1);
        self.0.served.notify_all();
    }
}

impl Runner {
    /// Claims a run whenever a slot is free and serves each claimed run on
    /// a thread of its own (which serves the next run its run's finish
    /// claimed, if any), until `max_runs` runs were claimed (then it
    /// waits for them to end), the control plane refuses a claim, or
    /// SIGTERM drains it (then its runs are given back as they reach an
    /// operation boundary, and it returns once all are). A claim the
    /// control plane failed to answer (a 5xx it does not say is passing)
    /// is made again after a pause, longer each time it fails again.
    pub fn serve(&self) -> Result<(), RunnerError> {
        let mut drained = false;
        let mut pause = FIRST_CLAIM_PAUSE;
        let served = std::thread::scope(|scope| {
            // However the claiming loop ends (an error too), the run
            // threads must not wait for it forever.
            let _over = LoopOver(&self.claims);
            while let Some(in_use) = self.slots.take_unless(|| self.draining()) {
                let slot = SlotGuard(&self.slots);
                // Asked with its slot in hand: a slot's finish asking for
                // its next run meanwhile is not crowded out of `max_runs`.
                let Some(ask) = self.claims.ask_or_wait() else {
                    break;
                };
                if self.draining() {
                    break;
                }
                self.refresh_manifest();
                let answer = match self.client.claim(LONG_POLL) {
                    // `moat runner drain`: nothing new; what it holds is
                    // finished, not given back.
                    Err(e) if e.reason() == Some("draining") => {
                        eprintln!(
                            "moat runner: draining (moat runner drain): claiming nothing new, \
                             finishing the runs it holds"
                        );
                        drained = true;
                        break;
                    }
                    // A fault of the control plane's own, not a refusal:
                    // one run it cannot hand over (its claim lapses) must
                    // not stop every runner that is offered it.
                    Err(e) if e.status().is_some_and(|status| status >= 500) => {
                        // Draining, the client hands back what it would
                        // have retried: nothing more is claimed.
                        if self.draining() {
                            break;
                        }
                        eprintln!("moat runner: {e}; claiming again in {pause:?}");
                        drop((ask, slot));
                        self.pause_unless_draining(pause);
                        pause = (pause * 2).min(LAST_CLAIM_PAUSE);
                        continue;
                    }
                    other => other?,
                };
                pause = FIRST_CLAIM_PAUSE;
                let Some(claim) = answer else {
                    continue;
                };
                ask.took();
                // Claimed as a drain began, it is given back from its first
                // operation boundary, once no ask is in flight any more.
                let draining = self.draining();
                eprintln!(
                    "moat runner: claimed run {} ({in_use} of {} slots in use)",
                    claim.run.id, self.slots.total
                );
                scope.spawn(move || {
                    let _slot = slot;
                    // The slot's next run may come with its run's last
                    // report.
                    let mut claim = claim;
                    while let Some(next) = self.serve_run(&claim) {
                        eprintln!(
                            "moat runner: claimed run {} with run {}'s last report",
                            next.run.id, claim.run.id
                        );
                        claim = next;
                    }
                });
                if draining {
                    break;
                }
            }
            Ok(())
        });
        if self.draining() {
            eprintln!("moat runner: stopped (SIGTERM): every held run was finished or given back");
        } else if drained {
            eprintln!("moat runner: drained: every run it held has ended; stopping");
        }
        served
    }

    fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Waits `pause`, or less if SIGTERM starts a drain meanwhile.
    fn pause_unless_draining(&self, pause: Duration) {
        let until = std::time::Instant::now() + pause;
        while !self.draining() {
            let left = until.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return;
            }
            std::thread::sleep(left.min(Duration::from_millis(100)));
        }
    }

    /// An ask for the slot's next run to go with a run's last report (its
    /// finish with its teardown, or its teardown report): only to a
    /// control plane that takes one, while the runner is not draining and
    /// may still claim a run; the manifest is refreshed first, as the
    /// claiming loop does before it claims.
    fn ask_with_report(&self) -> Option<crate::claims::Ask<'_>> {
        if !self.last_report_takes_claim || self.draining() {
            return None;
        }
        let ask = self.claims.ask()?;
        self.refresh_manifest();
        Some(ask)
    }

    /// Gives a run back to the queue (the runner is stopping). A failure
    /// is only reported: the run's lease then lapses and it is retried.
    fn release(&self, run_id: &str) {
        match self.client.release(run_id) {
            Ok(released) => eprintln!(
                "moat runner: run {run_id} given back to the queue ({} attempts counted)",
                released.attempts
            ),
            Err(e) => eprintln!(
                "moat runner: run {run_id}: giving it back failed ({e}); it is retried once its lease lapses"
            ),
        }
    }

    /// The manifest refresh's turn (an operation boundary): one slot at a
    /// time fetches, swaps and reports, over the network; the others go on
    /// at once with the generation last seen rather than wait for it (a
    /// control plane slow to answer must not stall every run's lease).
    fn refresh_manifest(&self) -> (u64, Option<PathBuf>) {
        let turn = match self.manifests.try_lock() {
            Ok(manifests) => Some(manifests),
            Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        };
        let checked = turn.map(|mut m| (m.tick(&self.client), m.file.clone()));
        let mut now = self
            .manifest_now
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Never back: another slot may have seen a newer one meanwhile.
        if let Some(checked) = checked.filter(|(generation, _)| *generation >= now.0) {
            *now = checked;
        }
        now.clone()
    }

    /// One claimed run to its end, then its teardown; a run that fails here
    /// is reported failed. The slot's next run, if its finish claimed one.
    fn serve_run(&self, claim: &Claim) -> Option<Claim> {
        let run_id = &claim.run.id;
        let _serving = {
            let mut serving = self.serving.lock().unwrap_or_else(PoisonError::into_inner);
            while serving.contains(run_id) {
                serving = self
                    .served
                    .wait(serving)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            serving.insert(run_id.clone());
            self.metrics.run_active(1);
            Serving(self, run_id.clone())
        };
        // What it left here so far: what its teardown looks for.
        let mut left = Left::Nothing;
        let mut next = None;
        let result = self.execute_run(claim, &mut left, &mut next);
        // It names a directory and a URL path segment: only a plain id.
        if !moat_core::op::is_plain_id(run_id) {
            if let Err(e) = result {
                eprintln!("moat runner: run {run_id:?}: {e}");
            }
            return None;
        }
        if let Err(e) = result {
            eprintln!("moat runner: run {run_id}: {e}");
            let body = FinishBody {
                state: RunEnd::Failed,
                error: Some(e.to_string()),
                events: Vec::new(),
                teardown: None,
                then_claim_ms: None,
            };
            let _ = self.client.finish(run_id, &body);
        }
        let checks = match left {
            Left::Reported => None,
            Left::Nothing => Some(self.tear_down(run_id, false)),
            Left::Shell => Some(self.tear_down(run_id, true)),
            Left::TornDown(checks) => Some(checks),
        };
        if let Some(checks) = checks {
            next = self.report_teardown(run_id, checks);
        }
        // Claimed as a drain began, it is given back from its first
        // operation boundary, once no ask is in flight any more (one could
        // claim it again).
        next
    }

    /// `POST .../destroyed`, the run's last report: it asks for the
    /// slot's next run too, which it returns. A failure is only said.
    fn report_teardown(
        &self,
        run_id: &str,
        checks: Vec<moat_core::event_data::TeardownCheck>,
    ) -> Option<Claim> {
        let ask = self.ask_with_report();
        let mut body = TornDown {
            checks,
            then_claim_ms: ask.as_ref().map(|_| LONG_POLL.as_millis() as u64),
        };
        let mut answer = self.client.destroyed(run_id, &body);
        // A replica of an older build refuses the field: the report goes
        // alone.
        if let Err(e) = &answer
            && body.then_claim_ms.is_some()
            && matches!(e.status(), Some(400 | 422))
        {
            body.then_claim_ms = None;
            answer = self.client.destroyed(run_id, &body);
        }
        match answer {
            Ok(reported) => claimed_with(ask, reported),
            Err(e) => {
                eprintln!("moat runner: run {run_id}: reporting its teardown failed: {e}");
                None
            }
        }
    }

    /// The run's teardown on this host, counted and its failures said:
    /// what its report says.
    fn tear_down(
        &self,
        run_id: &str,
        shell_started: bool,
    ) -> Vec<moat_core::event_data::TeardownCheck> {
        let workspace = self.config.state_dir.join("runs").join(run_id);
        let expose_dir = self.expose_dir(run_id);
        if let Err(e) = std::fs::remove_dir_all(&expose_dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            eprintln!(
                "moat runner: run {run_id}: removing {}: {e}",
                expose_dir.display()
            );
        }
        let started = if shell_started {
            crate::teardown::Started::Shell {
                sandboxes: Ledger::open(&self.shell_state.join("ledger.db"))
                    .map(|ledger| crate::teardown::sandboxes_of(&ledger, run_id))
                    .unwrap_or_default(),
            }
        } else {
            crate::teardown::Started::Nothing
        };
        let checks = crate::teardown::destroy(&workspace, &started);
        let failed: Vec<String> = checks
            .iter()
            .filter(|c| !c.ok)
            .map(|c| c.check.clone())
            .collect();
        self.metrics.teardown(&failed);
        for failed in checks.iter().filter(|c| !c.ok) {
            eprintln!(
                "moat runner: run {run_id}: teardown: {}: {}",
                failed.check, failed.detail
            );
        }
        checks
    }

    /// `left` says what the run has left here as it goes: a shell once
    /// one is started, or that its teardown was reported with its finish;
    /// `slot_next`, the run its finish claimed for this slot.
    fn execute_run(
        &self,
        claim: &Claim,
        left: &mut Left,
        slot_next: &mut Option<Claim>,
    ) -> Result<(), RunnerError> {
        let run_id = claim.run.id.as_str();
        // It names a directory here and a URL path segment: never trust its shape.
        if !moat_core::op::is_plain_id(run_id) {
            return Err(RunnerError::Protocol(format!(
                "the claimed run id {run_id:?} is not a plain id"
            )));
        }
        let runs = self.config.state_dir.join("runs");
        let workspace = runs.join(run_id);
        // An earlier attempt's files never meet this one.
        if workspace.exists() {
            std::fs::remove_dir_all(&workspace).io(|| workspace.display().to_string())?;
        }
        // The sockets of the ports an operation exposes: the runner's own,
        // out of every sandbox's sight (not under `runs/`).
        let expose_dir = self.expose_dir(run_id);
        // Made at the first operation, with the shell: a run without any
        // costs no process and no files.
        let mut prepared: Option<(Ledger, i64, Vec<Area>)> = None;
        // The manifest generation it serves under: a refresh (by any slot)
        // takes over at this run's next operation boundary, in a new shell.
        let mut shell: Option<(ShellChild, u64)> = None;
        // The first step, when the claim already said it.
        let mut told = claim.next.clone();
        loop {
            // An operation boundary: a drain gives the run back here (its
            // workspace goes with it: the next runner starts from the
            // inputs and its volumes' last snapshots, as after a lost
            // lease)...
            if self.draining() {
                if let Some((old, _)) = shell.take() {
                    self.end_shell(run_id, old, prepared.as_mut());
                }
                // The claiming loop may sit in a long poll for a while yet:
                // the run's lease must outlive the wait, or it lapses and
                // the run is retried (counted) instead of given back.
                let mut renewed = std::time::Instant::now();
                while !self.claims.over() {
                    std::thread::sleep(Duration::from_millis(50));
                    if renewed.elapsed() >= self.heartbeat {
                        if let Err(e) = self.client.heartbeat(run_id) {
                            eprintln!("moat runner: run {run_id}: heartbeat while draining: {e}");
                        }
                        renewed = std::time::Instant::now();
                    }
                }
                self.release(run_id);
                if workspace.exists() {
                    std::fs::remove_dir_all(&workspace).io(|| workspace.display().to_string())?;
                }
                return Ok(());
            }
            // ...and a refreshed manifest takes over, in a new shell.
            let (generation, manifest_file) = self.refresh_manifest();
            if shell.as_ref().is_some_and(|(_, g)| *g != generation)
                && let Some((old, _)) = shell.take()
            {
                self.end_shell(run_id, old, prepared.as_mut());
            }
            // Each `next` renews the lease as it starts: its wait must end
            // well before the lease would (a control plane run with a
            // lease shorter than LONG_POLL lost every idle run's).
            let asked = match told.take() {
                Some(next) => Ok(Some(next)),
                None => self.client.next(run_id, LONG_POLL.min(self.heartbeat)),
            };
            let next = match asked {
                Ok(Some(next)) => next,
                Ok(None) => continue,
                // The lease was lost, the manifest expired, the runner was
                // revoked...: the control plane has taken the run back.
                Err(e) if e.status().is_some_and(|s| (400..500).contains(&s)) => {
                    eprintln!("moat runner: run {run_id} stopped: {e}");
                    return Ok(());
                }
                // A control plane restarting (a request cut short) or out of
                // reach: the run is still this runner's until its lease
                // lapses, and then the next answer says so.
                Err(e) => {
                    eprintln!("moat runner: run {run_id}: next: {e}; asking again");
                    std::thread::sleep(Duration::from_secs(1));
                    continue;
                }
            };
            match next {
                Next::Op {
                    envelope,
                    tool_token,
                    secret_value,
                } => {
                    let op_id = envelope.id.clone();
                    if !moat_core::op::is_plain_id(&op_id) {
                        return Err(RunnerError::Protocol(format!(
                            "operation id {op_id:?} is not a plain id"
                        )));
                    }
                    // A tool call is made by the control plane, which holds
                    // the credential: this runner only asks for it.
                    if envelope.op == "http_request" && envelope.args["profile"] == TOOL_PROFILE {
                        self.client.tool_call(run_id, &op_id)?;
                        continue;
                    }
                    let (ledger, ledger_seq, areas) = match &mut prepared {
                        Some(prepared) => prepared,
                        None => prepared.insert(self.renewing(
                            run_id,
                            || {},
                            || self.prepare_workspace(&workspace, claim),
                        )?),
                    };
                    let shell = match &mut shell {
                        Some((shell, _)) => shell,
                        None => {
                            for dir in [expose_dir.parent(), Some(expose_dir.as_path())]
                                .into_iter()
                                .flatten()
                            {
                                private_dir(dir)?;
                            }
                            *left = Left::Shell;
                            let started = self.start_shell(
                                &workspace,
                                manifest_file.as_deref(),
                                &expose_dir,
                            )?;
                            &mut shell.insert((started, generation)).0
                        }
                    };
                    let beside = Beside {
                        tool_token: tool_token.as_deref(),
                        secret_value: secret_value.as_ref().map(|v| v.as_str()),
                    };
                    let mut result = self.run_op(shell, run_id, &envelope, &beside, &expose_dir)?;
                    // An acting browser step answers what it would act on:
                    // decided on that, it is taken (again if the page
                    // changed meanwhile, a few times), or it waits for a
                    // person or was refused, and the run goes on.
                    let mut checks = 0;
                    let held = loop {
                        let Some(element) = unchecked_element(&result) else {
                            break false;
                        };
                        if checks == MAX_ELEMENT_CHECKS {
                            break false;
                        }
                        checks += 1;
                        let body = ElementBody {
                            element,
                            events: recorded_since(ledger, ledger_seq, run_id)?,
                        };
                        match self.client.element(run_id, &op_id, &body) {
                            Ok(ElementDecision::Act {
                                envelope,
                                secret_value,
                            }) => {
                                let beside = Beside {
                                    tool_token: None,
                                    secret_value: secret_value.as_ref().map(|v| v.as_str()),
                                };
                                result =
                                    self.run_op(shell, run_id, &envelope, &beside, &expose_dir)?;
                            }
                            Ok(ElementDecision::Held { .. }) => break true,
                            // Taken back (cancelled, another answer won):
                            // the next step says what is left.
                            Err(e) if e.status() == Some(409) => break true,
                            Err(e) => return Err(e.into()),
                        }
                    };
                    if held {
                        continue;
                    }
                    let events = recorded_since(ledger, ledger_seq, run_id)?;
                    let artifacts = collect_artifacts(&self.shell_state, &result)?;
                    // The result is acknowledged only with the snapshots of
                    // what it changed, already stored.
                    let volumes = self.renewing(
                        run_id,
                        || {},
                        || crate::volumes::snapshot(&self.client, run_id, areas),
                    )?;
                    let body = ResultBody {
                        result,
                        events,
                        artifacts,
                        volumes,
                    };
                    self.client.report_result(run_id, &op_id, &body)?;
                }
                Next::Finish => {
                    // The run's end closes what it left open (browser
                    // sessions): their record goes with the finish.
                    let mut events = Vec::new();
                    if let (Some((shell, _)), Some((ledger, ledger_seq, _))) =
                        (shell.take(), prepared.as_mut())
                    {
                        // The run stays this runner's meanwhile.
                        self.renewing(run_id, || {}, || shell.end(SHELL_END_WAIT));
                        events = recorded_since(ledger, ledger_seq, run_id)?;
                    }
                    let mut body = FinishBody {
                        state: RunEnd::Succeeded,
                        error: None,
                        events,
                        teardown: None,
                        then_claim_ms: None,
                    };
                    if !(matches!(left, Left::Nothing) && self.finish_takes_teardown) {
                        self.client.finish(run_id, &body)?;
                        return Ok(());
                    }
                    // A run that started nothing here is torn down now
                    // and its teardown goes with its finish: one request
                    // where there were two. Being its last, the finish
                    // also asks for the slot's next run: one more fewer.
                    let checks = self.tear_down(run_id, false);
                    body.teardown = Some(moat_api::runner::Teardown {
                        checks: checks.clone(),
                    });
                    let ask = self.ask_with_report();
                    body.then_claim_ms = ask.as_ref().map(|_| LONG_POLL.as_millis() as u64);
                    match self.client.finish(run_id, &body) {
                        Ok(reported) => {
                            *left = Left::Reported;
                            *slot_next = claimed_with(ask, reported);
                        }
                        // A replica of an older build (a rolling upgrade,
                        // a rollback) refuses the fields, and a teardown
                        // refused must not fail the run: the finish goes
                        // alone, the teardown is reported after it.
                        Err(e) if matches!(e.status(), Some(400 | 422)) => {
                            eprintln!(
                                "moat runner: run {run_id}: its finish with its teardown was \
                                 refused ({e}); sending them apart"
                            );
                            *left = Left::TornDown(checks);
                            body.teardown = None;
                            body.then_claim_ms = None;
                            self.client.finish(run_id, &body)?;
                        }
                        Err(e) => {
                            *left = Left::TornDown(checks);
                            return Err(e.into());
                        }
                    }
                    return Ok(());
                }
                Next::Ended => return Ok(()),
            }
        }
    }

    /// Ends a run's shell between operations (a refreshed manifest takes
    /// over, a drain gives the run back): it closes the browser sessions
    /// it held, and what that recorded goes to the control plane, as a
    /// finish's would. A report that fails is said, not fatal: the run
    /// goes on.
    fn end_shell(
        &self,
        run_id: &str,
        shell: ShellChild,
        prepared: Option<&mut (Ledger, i64, Vec<Area>)>,
    ) {
        self.renewing(run_id, || {}, || shell.end(SHELL_END_WAIT));
        let Some((ledger, ledger_seq, _)) = prepared else {
            return;
        };
        let reported = recorded_since(ledger, ledger_seq, run_id).and_then(|events| {
            if events.is_empty() {
                return Ok(());
            }
            self.client
                .shell_ended(run_id, &ShellEnded { events })
                .map(|_| ())
                .map_err(RunnerError::from)
        });
        if let Err(e) = reported {
            eprintln!("moat runner: run {run_id}: reporting what its shell closed: {e}");
        }
    }

    /// The run's workspace with its volumes restored and its inputs, and
    /// the shells' ledger (read alongside the shell, which writes it; WAL:
    /// readers see each commit) with the sequence number it stood at
    /// before the run's first operation here. A run another runner lost
    /// is reported resumed, with what was restored.
    fn prepare_workspace(
        &self,
        workspace: &Path,
        claim: &Claim,
    ) -> Result<(Ledger, i64, Vec<Area>), RunnerError> {
        // The runner's alone: another run's sandbox runs as another host
        // uid, which must find nothing here even if it got out.
        if let Some(runs) = workspace.parent() {
            private_dir(runs)?;
        }
        private_dir(workspace)?;
        for dir in ["output", "input"] {
            std::fs::create_dir_all(workspace.join(dir))
                .io(|| format!("{}/{dir}", workspace.display()))?;
        }
        let filesystem = self
            .manifests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .current()
            .manifest
            .filesystem
            .clone();
        let (areas, restored) =
            crate::volumes::restore(&self.client, &claim.run, workspace, &filesystem)?;
        // Another runner served it before: lost (a new attempt), or given
        // back after it recorded a snapshot (a drain).
        let before = claim.run.attempts > 1
            || claim
                .run
                .volumes
                .iter()
                .any(|v| v.snapshot != v.start_snapshot);
        if before && !restored.is_empty() {
            let resumed = moat_core::event_data::RunResumed {
                attempt: claim.run.attempts,
                volumes: restored,
                runner_id: None,
                runner_hash: None,
                manifest_hash: None,
            };
            self.client.resumed(&claim.run.id, &resumed)?;
        }
        write_inputs(workspace, &claim.inputs)?;
        let ledger = Ledger::open(&self.shell_state.join("ledger.db"))?;
        let seq = ledger.summary()?.0;
        Ok((ledger, seq, areas))
    }

    /// One operation through the shell, with the run's lease kept alive by
    /// heartbeats while it runs (the shell child is what launches sandboxes,
    /// so this process may have a thread). What travels beside the envelope
    /// (a one-operation tool token the shell hands the program, a secret's
    /// value a browser step fills in) goes to the shell with it.
    fn run_op(
        &self,
        shell: &mut ShellChild,
        run_id: &str,
        envelope: &Envelope,
        beside: &Beside<'_>,
        expose_dir: &Path,
    ) -> Result<OpResult, RunnerError> {
        let mut json = serde_json::to_value(envelope)
            .map_err(|e| RunnerError::Protocol(format!("operation {}: {e}", envelope.id)))?;
        if let Some(map) = json.as_object_mut() {
            if let Some(token) = beside.tool_token {
                map.insert("toolToken".into(), token.into());
            }
            if let Some(value) = beside.secret_value {
                map.insert("secretValue".into(), value.into());
            }
        }
        let shell_pid = shell.pid();
        // A run that is not this runner's any more: its sandbox dies with
        // the shell (PDEATHSIG); the run's teardown follows.
        let stop_sandbox = move || {
            let _ = moat_sandbox::process::kill(shell_pid);
        };
        let ports = crate::ingress::exposed_ports(envelope);
        self.renewing(run_id, stop_sandbox, || {
            let started = std::time::Instant::now();
            let result =
                crate::ingress::relaying(&self.client, run_id, expose_dir, &ports, || {
                    shell.ask_json(&json, &envelope.id)
                })?;
            self.metrics.op_finished(
                envelope.op.as_str(),
                result.status.as_str(),
                started.elapsed().as_secs_f64(),
            );
            if let Some(report) = &result.result {
                self.metrics.report(report);
            }
            Ok(result)
        })
    }

    /// Does `work` with the run's lease renewed meanwhile (an operation, a
    /// volume's restore or snapshot: each may outlast the lease), at least
    /// every second; `lost` is called once if the run stops being this
    /// runner's (cancelled, revoked, its lease lost), so that a cancel stops
    /// an operation's sandbox within two seconds.
    fn renewing<T>(&self, run_id: &str, lost: impl FnOnce() + Send, work: impl FnOnce() -> T) -> T {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        std::thread::scope(|scope| {
            scope.spawn(move || {
                // Woken at once when the work ends (the sender drops).
                let period = self.heartbeat.min(OP_HEARTBEAT);
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(period) {
                    match self.client.heartbeat(run_id) {
                        Ok(_) => {}
                        Err(e) if matches!(e.status(), Some(403 | 409)) => {
                            eprintln!("moat runner: run {run_id}: no longer this runner's: {e}");
                            lost();
                            return;
                        }
                        Err(e) => eprintln!("moat runner: heartbeat: {e}"),
                    }
                }
            });
            let done = work();
            drop(stop);
            done
        })
    }

    /// Where the ports a run's operations expose get their sockets.
    fn expose_dir(&self, run_id: &str) -> PathBuf {
        self.config.state_dir.join("ingress").join(run_id)
    }

    /// `manifest`: a refreshed manifest's file (default: the sealed one).
    fn start_shell(
        &self,
        workspace: &Path,
        manifest: Option<&Path>,
        expose_dir: &Path,
    ) -> Result<ShellChild, RunnerError> {
        let mut extra: Vec<std::ffi::OsString> = vec![
            "--require-capabilities".into(),
            "--expose-dir".into(),
            expose_dir.into(),
        ];
        if let Some(manifest) = manifest {
            extra.push("--manifest".into());
            extra.push(manifest.into());
        }
        for entry in &self.config.resolve {
            extra.push("--resolve".into());
            extra.push(entry.into());
        }
        for path in &self.config.launch_allow {
            extra.push("--launch-allow".into());
            extra.push(path.into());
        }
        if self.config.override_launch_policy {
            extra.push("--override-launch-policy".into());
        }
        for class in &self.config.classes {
            extra.push("--class".into());
            extra.push(class.as_str().into());
        }
        for (flag, path) in [
            ("--vm-kernel", &self.config.vm_kernel),
            ("--vm-modules", &self.config.vm_modules),
        ] {
            if let Some(path) = path {
                extra.push(flag.into());
                extra.push(path.into());
            }
        }
        Ok(ShellChild::start(
            &self.config.program,
            &self.shell_state,
            workspace,
            &extra,
            self.config.uid_range,
        )?)
    }
}

/// What the control plane hands over beside an operation's envelope, never
/// inside it (not signed into its capability, not recorded).
struct Beside<'a> {
    tool_token: Option<&'a str>,
    secret_value: Option<&'a str>,
}

/// How long a shell gets, once its run ended, to close what the run left
/// open and record it: its browser sessions, each given 10 s to close.
const SHELL_END_WAIT: Duration = Duration::from_secs(45);

/// What the shells recorded about `run` in `ledger` past `seq`, which moves
/// past it.
/// How many times one dispatch of an acting browser step is decided on its
/// element: a page that changes the element under every decision has the
/// step fail with `element_unchecked` after this.
const MAX_ELEMENT_CHECKS: usize = 3;

/// The run a last report's ask claimed, counted towards `max_runs`.
fn claimed_with(ask: Option<crate::claims::Ask<'_>>, reported: Reported) -> Option<Claim> {
    let (ask, claim) = (ask?, reported.claim?);
    ask.took();
    Some(*claim)
}

/// The element an acting browser step's answer says it would act on
/// (`element_unchecked`), if that is its answer.
fn unchecked_element(result: &OpResult) -> Option<moat_core::element::ElementFacts> {
    if result.reason != Some(moat_core::DenialReason::ElementUnchecked) {
        return None;
    }
    serde_json::from_value(result.result.as_ref()?.get("element")?.clone()).ok()
}

fn recorded_since(
    ledger: &Ledger,
    seq: &mut i64,
    run: &str,
) -> Result<Vec<moat_core::Event>, RunnerError> {
    let mut events = Vec::new();
    loop {
        let page = ledger.events(Some(run), *seq, 1000)?;
        let Some(last) = page.last() else { break };
        *seq = last.seq;
        events.extend(page.into_iter().map(|e| e.event));
    }
    Ok(events)
}
