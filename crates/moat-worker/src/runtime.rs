//! The engine, its compile cache and the invocation of one component.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{Cache, CacheConfig, Config, Engine, Store, Trap};
use wasmtime_wasi::p2::bindings::sync::CommandPre;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{DirPerms, FilePerms, I32Exit, WasiCtxBuilder};

use crate::bindings::{BindingState, Grants};
use crate::deny;
use crate::error::WorkerError;
use crate::host::{DenialLog, Host, MemoryLimiter, record};
use crate::limits::WorkerLimits;
use moat_worker_api::{Denial, Outcome, WorkerExit};

/// How often the deadline clock ticks: the granularity of a timeout.
const TICK: Duration = Duration::from_millis(10);

/// A trap's message as reported: the first lines are the cause, the
/// rest a backtrace the guest's author may want, bounded.
const MAX_TRAP_MESSAGE: usize = 2048;

/// A component compiled and type-checked against the linker, ready to be
/// instantiated as often as wanted.
#[derive(Clone)]
pub struct Loaded {
    /// SHA-256 of the component's bytes, hex.
    pub hash: String,
    /// Whether loading it compiled it (no precompiled copy was at hand).
    pub compiled: bool,
    pre: CommandPre<Host>,
}

/// One engine for many invocations. Components are compiled once per
/// content hash: kept in memory for this process's life, and on disk in
/// the compile cache when one is given, so an invocation never compiles
/// on its critical path after a module's first use on the host.
pub struct Runtime {
    engine: Engine,
    linker: Linker<Host>,
    cache: Option<Cache>,
    loaded: Mutex<HashMap<String, Loaded>>,
    root: EmptyRoot,
    ticker: Ticker,
}

impl Runtime {
    /// An engine whose compiled code is cached under `cache_dir` (made if
    /// missing; keep it the host's alone: what is in it runs as code), or
    /// in memory only without one.
    pub fn new(cache_dir: Option<&Path>) -> Result<Runtime, WorkerError> {
        let mut config = Config::new();
        config.epoch_interruption(true);
        config.wasm_component_model(true);
        let cache = match cache_dir {
            None => None,
            Some(dir) => {
                let mut cache_config = CacheConfig::new();
                cache_config.with_directory(dir);
                let cache = Cache::new(cache_config).map_err(|source| WorkerError::Cache {
                    path: dir.to_path_buf(),
                    source,
                })?;
                config.cache(Some(cache.clone()));
                Some(cache)
            }
        };
        let engine = Engine::new(&config).map_err(WorkerError::Engine)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(WorkerError::Engine)?;
        deny::shadow(&mut linker).map_err(WorkerError::Engine)?;
        crate::bindings::Bindings::add_to_linker::<Host, HasSelf<Host>>(&mut linker, |host| host)
            .map_err(WorkerError::Engine)?;
        let root = EmptyRoot::make().map_err(|e| WorkerError::Engine(e.into()))?;
        // Without the ticker no deadline would ever pass: no runtime.
        let ticker = Ticker::start(engine.clone()).map_err(|e| WorkerError::Engine(e.into()))?;
        Ok(Runtime {
            engine,
            linker,
            cache,
            loaded: Mutex::new(HashMap::new()),
            root,
            ticker,
        })
    }

    /// The component in `bytes`, compiled (or taken from the cache) and
    /// linked.
    pub fn load(&self, bytes: &[u8]) -> Result<Loaded, WorkerError> {
        let hash = hex::encode(Sha256::digest(bytes));
        if let Some(loaded) = self.memo().get(&hash) {
            return Ok(Loaded {
                compiled: false,
                ..loaded.clone()
            });
        }
        let misses = self.cache.as_ref().map(Cache::cache_misses);
        let component = Component::new(&self.engine, bytes).map_err(WorkerError::NotAComponent)?;
        let compiled = match (&self.cache, misses) {
            (Some(cache), Some(before)) => cache.cache_misses() > before,
            _ => true,
        };
        let instance = self
            .linker
            .instantiate_pre(&component)
            .map_err(WorkerError::Link)?;
        let pre = CommandPre::new(instance).map_err(WorkerError::NoEntryPoint)?;
        let loaded = Loaded {
            hash: hash.clone(),
            compiled,
            pre,
        };
        self.memo().insert(hash, loaded.clone());
        Ok(loaded)
    }

    fn memo(&self) -> std::sync::MutexGuard<'_, HashMap<String, Loaded>> {
        // A panic while holding the map cannot leave it inconsistent: an
        // entry is inserted whole or not at all.
        self.loaded.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs the component's `wasi:cli/run` once, in a store of its own,
    /// with `args` as its arguments (the first is its name) and `grants`
    /// for Moat's bindings.
    pub fn invoke(
        &self,
        loaded: &Loaded,
        args: &[String],
        limits: &WorkerLimits,
        grants: &Grants,
    ) -> Outcome {
        let started = Instant::now();
        let cap = usize::try_from(limits.max_output_bytes).unwrap_or(usize::MAX);
        let stdout = MemoryOutputPipe::new(cap);
        let stderr = MemoryOutputPipe::new(cap);
        let denials: DenialLog = Arc::default();
        let mut outcome = Outcome {
            exit: WorkerExit::Exited { code: 0 },
            module_hash: loaded.hash.clone(),
            compiled: loaded.compiled,
            stdout: Vec::new(),
            stderr: Vec::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            denials: Vec::new(),
            bindings: Vec::new(),
            bindings_dropped: 0,
            peak_memory_bytes: 0,
            duration_us: 0,
            effects: moat_worker_api::Effects::default(),
        };
        let mut wasi = WasiCtxBuilder::new();
        wasi.args(args)
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_ip_name_lookup(false);
        {
            let log = denials.clone();
            wasi.socket_addr_check(move |address, purpose| {
                let denial = Denial::Socket {
                    address: address.to_string(),
                    purpose: format!("{purpose:?}").to_lowercase(),
                };
                record(&log, denial);
                Box::pin(async { false })
            });
        }
        if let Err(e) =
            wasi.preopened_dir(&self.root.0, deny::ROOT, DirPerms::READ, FilePerms::READ)
        {
            outcome.exit = WorkerExit::Trapped {
                message: format!("setting up the worker's root: {e}"),
            };
            return outcome;
        }
        let bindings = match BindingState::open(grants) {
            Ok(bindings) => bindings,
            Err(e) => {
                outcome.exit = WorkerExit::Trapped {
                    message: format!("opening the granted directories: {e}"),
                };
                return outcome;
            }
        };
        let host = Host {
            bindings,
            wasi: wasi.build(),
            table: ResourceTable::new(),
            limiter: MemoryLimiter::new(limits.memory_bytes),
            denials: denials.clone(),
        };
        let mut store = Store::new(&self.engine, host);
        store.limiter(|host| &mut host.limiter);
        store.set_epoch_deadline(self.ticker.ticks(limits.timeout));
        let result = loaded
            .pre
            .instantiate(&mut store)
            .and_then(|command| command.wasi_cli_run().call_run(&mut store));
        outcome.exit = match result {
            Ok(Ok(())) => WorkerExit::Exited { code: 0 },
            Ok(Err(())) => WorkerExit::Exited { code: 1 },
            Err(error) => self.ended_by(&error, store.data()),
        };
        let limiter = &store.data().limiter;
        outcome.peak_memory_bytes = limiter.peak as u64;
        let used = &mut store.data_mut().bindings;
        outcome.bindings = std::mem::take(&mut used.uses);
        outcome.bindings_dropped = used.dropped;
        outcome.effects = std::mem::take(&mut used.effects);
        drop(store);
        outcome.stdout_truncated = stdout.contents().len() >= cap && cap > 0;
        outcome.stderr_truncated = stderr.contents().len() >= cap && cap > 0;
        outcome.stdout = stdout.contents().to_vec();
        outcome.stderr = stderr.contents().to_vec();
        outcome.denials = denials.lock().map(|d| d.clone()).unwrap_or_default();
        outcome.duration_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        outcome
    }

    fn ended_by(&self, error: &anyhow::Error, host: &Host) -> WorkerExit {
        if let Some(exit) = error.downcast_ref::<I32Exit>() {
            // WASI's exit takes any i32; a process status is a byte.
            return WorkerExit::Exited {
                code: u8::try_from(exit.0).unwrap_or(1),
            };
        }
        if error.downcast_ref::<Trap>() == Some(&Trap::Interrupt) {
            return WorkerExit::TimedOut;
        }
        if host.limiter.refused {
            return WorkerExit::MemoryExceeded;
        }
        // The root cause says what happened (`wasm trap: ...`, a host
        // error); the context above it is a backtrace.
        let mut message = error.root_cause().to_string();
        if message.len() > MAX_TRAP_MESSAGE {
            let mut end = MAX_TRAP_MESSAGE;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
        }
        WorkerExit::Trapped { message }
    }
}

/// An empty directory the guest sees as `/`: opening anything in it is
/// refused before the host looks, and listing it shows nothing.
struct EmptyRoot(PathBuf);

impl EmptyRoot {
    fn make() -> std::io::Result<EmptyRoot> {
        use std::os::unix::fs::DirBuilderExt;
        let path =
            std::env::temp_dir().join(format!("moat-worker-root-{}", moat_core::random::hex(8)));
        std::fs::DirBuilder::new().mode(0o500).create(&path)?;
        Ok(EmptyRoot(path))
    }
}

impl Drop for EmptyRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Advances the engine's epoch every [`TICK`] while the runtime lives.
struct Ticker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Ticker {
    fn start(engine: Engine) -> std::io::Result<Ticker> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("moat-worker-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(TICK);
                    engine.increment_epoch();
                }
            })?;
        Ok(Ticker {
            stop,
            thread: Some(thread),
        })
    }

    /// The deadline, in ticks from now, that ends an invocation no sooner
    /// than `timeout` (one tick more: the current one may be nearly over).
    fn ticks(&self, timeout: Duration) -> u64 {
        let ticks = timeout.as_nanos().div_ceil(TICK.as_nanos());
        u64::try_from(ticks).unwrap_or(u64::MAX - 1) + 1
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
