//! What a worker's store holds: its WASI context, its resources, the
//! limiter and the record of what it was refused.

use std::sync::{Arc, Mutex};

use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use crate::bindings::BindingState;
use moat_worker_api::Denial;

/// Denials shared with the socket check, which WASI calls from outside
/// the store.
pub(crate) type DenialLog = Arc<Mutex<Vec<Denial>>>;

/// A guest's denials past this many are counted, not kept: a loop of
/// refused opens must not grow the host's memory.
const MAX_DENIALS: usize = 64;

pub(crate) fn record(log: &DenialLog, denial: Denial) {
    if let Ok(mut list) = log.lock()
        && list.len() < MAX_DENIALS
    {
        list.push(denial);
    }
}

pub(crate) struct Host {
    pub wasi: WasiCtx,
    pub table: ResourceTable,
    pub limiter: MemoryLimiter,
    pub denials: DenialLog,
    pub bindings: BindingState,
}

impl WasiView for Host {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Caps the guest's linear memories (all together) and tables, and
/// remembers whether a growth was refused, so a guest that then fails is
/// reported as out of memory rather than as an opaque trap.
pub(crate) struct MemoryLimiter {
    pub limit: usize,
    /// Bytes held by each memory, in creation order.
    held: Vec<usize>,
    pub peak: usize,
    pub refused: bool,
}

/// Table elements a guest may hold (each a pointer on the host).
const MAX_TABLE_ELEMENTS: usize = 1 << 20;

impl MemoryLimiter {
    pub fn new(limit: u64) -> Self {
        MemoryLimiter {
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
            held: Vec::new(),
            peak: 0,
            refused: false,
        }
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> anyhow::Result<bool> {
        // A memory is created with current 0; later growths name its size.
        // Memories are told apart by their current size only, which is
        // enough to total them: the one that grows is the one whose held
        // size is `current`.
        let slot = if current == 0 {
            self.held.push(0);
            self.held.len() - 1
        } else {
            match self.held.iter().rposition(|&held| held == current) {
                Some(slot) => slot,
                None => {
                    self.held.push(current);
                    self.held.len() - 1
                }
            }
        };
        let others: usize = self
            .held
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != slot)
            .map(|(_, &held)| held)
            .sum();
        if others.saturating_add(desired) > self.limit {
            self.refused = true;
            if current == 0 {
                self.held.pop();
            }
            return Ok(false);
        }
        self.held[slot] = desired;
        self.peak = self.peak.max(others + desired);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> anyhow::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }

    fn instances(&self) -> usize {
        // A component instantiates a handful of core modules (a Python
        // one about ten); this bounds a guest that would make thousands.
        64
    }

    fn memories(&self) -> usize {
        64
    }

    fn tables(&self) -> usize {
        64
    }
}
