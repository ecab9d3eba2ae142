//! The egress proxy as the sandbox runs it: forked off the (single-threaded)
//! launcher as a helper process, confined read-only to what name resolution
//! needs, and hooked into a sandbox's launch ([`EgressHook`]) so it serves
//! the listener the sandbox's init makes.

use std::os::fd::{AsRawFd as _, OwnedFd};
use std::os::unix::net::UnixStream;

use moat_core::Event;
use moat_egress::{
    Egress, EgressConfig, EgressError, EgressPolicy, PROXY_READABLE, ProxyProcess, Served,
};
use moat_sandbox::EgressHook;
use moat_sandbox::helper::Helper;

struct HelperProcess(Helper);

impl ProxyProcess for HelperProcess {
    fn pid(&self) -> u32 {
        self.0.pid()
    }
}

/// Forks the proxy for one run, confined before it serves anything. The
/// caller must be single-threaded.
pub fn start(config: EgressConfig) -> Result<Egress, EgressError> {
    let (ours, theirs) = UnixStream::pair()?;
    let theirs_fd = theirs.as_raw_fd();
    let helper = moat_sandbox::helper::spawn_helper(&[theirs_fd], move || {
        let readable: Vec<&std::path::Path> =
            PROXY_READABLE.iter().map(std::path::Path::new).collect();
        if let Err(e) = moat_sandbox::helper::confine_read_only(&readable, config.allow_degraded) {
            eprintln!("moat egress: cannot confine the proxy: {e}");
            return 1;
        }
        moat_egress::serve_proxy(theirs, config)
    })
    .map_err(|e| EgressError::Start(e.to_string()))?;
    Egress::over(ours, Box::new(HelperProcess(helper)))
}

/// The proxy serving one sandbox, as the launcher's
/// [`EgressHook`]: its events are recorded before the run's
/// `sandbox.exec.finished`.
pub struct SandboxEgress<'a> {
    egress: &'a mut Egress,
    policy: &'a EgressPolicy,
    op_id: Option<&'a str>,
    served: Option<Served>,
}

impl<'a> SandboxEgress<'a> {
    pub fn new(egress: &'a mut Egress, policy: &'a EgressPolicy, op_id: Option<&'a str>) -> Self {
        SandboxEgress {
            egress,
            policy,
            op_id,
            served: None,
        }
    }
}

impl EgressHook for SandboxEgress<'_> {
    fn serve(&mut self, listener: OwnedFd) -> Result<(), String> {
        let served = self
            .egress
            .serve(listener, self.policy, self.op_id)
            .map_err(|e| e.to_string())?;
        self.served = Some(served);
        Ok(())
    }

    fn finish(&mut self) -> Result<Vec<Event>, String> {
        match self.served.take() {
            Some(served) => self.egress.close(served).map_err(|e| e.to_string()),
            None => Ok(Vec::new()),
        }
    }
}

/// The egress of a launcher that runs one sandbox (`moat exec`): the proxy
/// is forked when the sandbox's listener arrives, once init's setup is over,
/// rather than before the clone, so neither the fork (and the copy-on-write
/// faults it leaves the launcher) nor the proxy's own start-up sits on the
/// launch's critical path. A connection the program makes meanwhile waits in
/// the listener's backlog.
pub struct OneRunEgress {
    config: Option<EgressConfig>,
    policy: EgressPolicy,
    running: Option<(Egress, Served)>,
}

impl OneRunEgress {
    pub fn new(config: EgressConfig, policy: EgressPolicy) -> Self {
        OneRunEgress {
            config: Some(config),
            policy,
            running: None,
        }
    }
}

impl EgressHook for OneRunEgress {
    fn serve(&mut self, listener: OwnedFd) -> Result<(), String> {
        let config = self
            .config
            .take()
            .ok_or_else(|| "the egress proxy serves one sandbox only".to_owned())?;
        let mut egress = start(config).map_err(|e| format!("starting the egress proxy: {e}"))?;
        let served = egress
            .serve(listener, &self.policy, None)
            .map_err(|e| e.to_string())?;
        self.running = Some((egress, served));
        Ok(())
    }

    fn finish(&mut self) -> Result<Vec<Event>, String> {
        match self.running.as_mut() {
            Some((egress, served)) => egress.close(*served).map_err(|e| e.to_string()),
            None => Ok(Vec::new()),
        }
    }
}
