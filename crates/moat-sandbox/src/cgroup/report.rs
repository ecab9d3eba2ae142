//! What the report says about the run's cgroup and the limits it carries,
//! with a cgroup or with the rlimit floors that stand in for it.

use moat_core::size::format_size;
use moat_core::{LayerReport, LayerStatus, LimitMechanism, LimitReport, Limits};

/// The cgroup layer and the memory and pids entries of a report.
pub(crate) struct CgroupReport {
    pub(crate) layer: LayerReport,
    pub(crate) memory: LimitReport,
    pub(crate) pids: LimitReport,
}

pub(crate) fn not_reached() -> LimitReport {
    LimitReport {
        status: LayerStatus::NotEnforced,
        mechanism: LimitMechanism::None,
        limit: 0,
        detail: "not reached".into(),
    }
}

/// The run's cgroup (`describe`d) holds the whole tree's limits.
pub(crate) fn with_cgroup(describe: &str, limits: &Limits) -> CgroupReport {
    let cpu = limits.cpu_millis.map_or("unlimited".to_owned(), |m| {
        format!("{}.{:03} CPUs", m / 1000, m % 1000)
    });
    let memory = format_size(limits.memory_bytes);
    let tree = |limit, detail: String| LimitReport {
        status: LayerStatus::Enforced,
        mechanism: LimitMechanism::Cgroup,
        limit,
        detail,
    };
    CgroupReport {
        layer: LayerReport::enforced(format!(
            "{describe}: memory {memory}, pids {}, cpu {cpu}",
            limits.pids,
        )),
        memory: tree(
            limits.memory_bytes,
            format!("{memory} for the whole tree, swap included"),
        ),
        pids: tree(limits.pids, format!("{} for the whole tree", limits.pids)),
    }
}

/// No cgroup (`why`): the payload sets `RLIMIT_DATA` and `RLIMIT_NPROC`
/// instead (see `child`), and the entries say what those leave open. They
/// count as applied once the payload reports its rlimits (see
/// [`floors_not_reached`]).
pub(crate) fn with_floors(why: &str, limits: &Limits) -> CgroupReport {
    let memory = format_size(limits.memory_bytes);
    CgroupReport {
        layer: LayerReport::not_enforced(format!(
            "{why}; memory bounded per process by RLIMIT_DATA {memory}, pids by RLIMIT_NPROC \
             {}, no CPU bandwidth limit",
            limits.pids
        )),
        memory: LimitReport {
            status: LayerStatus::Degraded,
            mechanism: LimitMechanism::RlimitData,
            limit: limits.memory_bytes,
            detail: format!(
                "RLIMIT_DATA {memory} for each process: heap and private writable mappings; \
                 not file-backed or shared mappings, the stack, or the tree as a whole"
            ),
        },
        pids: LimitReport {
            status: LayerStatus::Degraded,
            mechanism: LimitMechanism::RlimitNproc,
            limit: limits.pids,
            detail: format!(
                "RLIMIT_NPROC {}: processes of the sandbox's user in its user namespace",
                limits.pids
            ),
        },
    }
}

/// The payload never set its rlimits: a floor the report promised did not
/// apply. A cgroup's limits stand, whatever the payload did.
pub(crate) fn floors_not_reached(entry: &mut LimitReport) {
    if !matches!(entry.mechanism, LimitMechanism::Cgroup) {
        *entry = not_reached();
    }
}
