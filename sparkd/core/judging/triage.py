"""Triage: which failure class the layer below vLLM is in, and what sparkd does about it. Pure.

Restarting a container cannot help a GPU that fell off the bus or a host that stopped
answering; each class below names its evidence and the one remediation that fits. `TABLE` is
the list a reader (and `docs/runbook.md`) goes by; the judges below implement its rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkd.core.judging.judge import Context, Hold, Verdict
from sparkd.core.judging.load import Load
from sparkd.core.reading import kernel
from sparkd.model.observed import HostFacts, KernelLog
from sparkd.model.plan import MODEL_STARTS, START_MODEL, TriageClass


@dataclass(frozen=True)
class Row:
    triage: TriageClass
    evidence: str
    action: str


TABLE: tuple[Row, ...] = (
    Row(
        "gpu_lost",
        "a fatal XID in this boot's kernel log (48, 64, 74, 79, 94, 95) or nvidia-smi's lost GPU "
        "(rc 15, `GPU is lost`)",
        '`blocked` "needs a reboot of HOST (XID N)": nothing needing a GPU is started or '
        "restarted there (no restart loop, no budget spent)",
    ),
    Row(
        "host_wedged",
        "the host stopped answering SSH (silence, not a refused key) after its last kernel log "
        "seen held NV_ERR_NO_MEMORY, a fatal PCIe AER, an mlx5 PCI error or a soft lockup; or "
        "it has not answered for power.unreachable_for (default 10 min)",
        '`blocked` "HOST wedged: needs a power cycle"; nothing is done on the host; with '
        "`[clusters.power]`, power-cycled once its safety rule holds (core.deciding.power)",
    ),
    Row(
        "fabric",
        "the data interface's RDMA port not ACTIVE, no RoCE v2 GID for the data IP or one at "
        "another index than ray.env NCCL_IB_GID_INDEX, MTUs that differ between the hosts; "
        "softer: a rate below fabric.expected_rate_gbps, a carrier flap within "
        "fabric.flap_window (core.judging.fabric)",
        "no Ray or model start or restart (it would hang again): `blocked` (or `degraded` for "
        'the softer ones) "fabric: ..." naming the host, interface, fact and the operator\'s '
        "fix",
    ),
    Row(
        "memory_pressure",
        "MemAvailable below policy.min_memory_available on a host while a load runs or after "
        "it failed",
        "reported; no model is started into it, and during a load none is restarted into it "
        "(a hung model that serves may be: that frees its own share)",
    ),
)
# Application XIDs (13, 31, 43) and teardowns (45) are counted and shown, never a class.


def fatal_xid(log: KernelLog | None) -> str | None:
    """The fatal XID of this boot's log, as evidence text, or None."""
    if log is None:
        return None
    fatal = [e for e in log.events if kernel.fatal_xid(e)]
    if not fatal:
        return None
    return ", ".join(kernel.describe(e) for e in fatal)


def omens(log: KernelLog | None) -> str | None:
    """What in this log may precede a silent wedge, as evidence text, or None."""
    if log is None:
        return None
    found = [kernel.describe(e) for e in log.events if e.kind in kernel.WEDGE_OMENS]
    return "; ".join(found) or None


def gib(value: int) -> str:
    return f"{value / (1 << 30):.1f} GiB"


def judge_memory(ctx: Context, load: Load) -> Verdict:
    """Low MemAvailable on GB10 (GPU allocations come out of it) before the OOM killer or a
    wedge: reported; during a load, no model start goes into it."""
    verdict = Verdict()
    floor = ctx.desired.policy.min_memory_available
    loading = (load.running and not load.was_ready) or load.failed is not None
    for host in ctx.reachable:
        available = ctx.facts[host.name].memory_available_bytes
        if available is None or available >= floor:
            continue
        why = f"memory pressure on {host.name}: MemAvailable {gib(available)} below {gib(floor)}"
        why += _largest(ctx.facts[host.name])
        if loading:
            verdict.notes.append(f"{why} during the load; not starting the model into it")
            verdict.holds.append(Hold(why, MODEL_STARTS))
        else:
            # No model holds this memory (it is not loading), so a new one would load into the
            # same pressure; a hung one serving may still be restarted (that frees its share).
            verdict.notes.append(why)
            verdict.holds.append(Hold(why, START_MODEL))
        verdict.phase = "degraded"
        verdict.triage = ["memory_pressure"]
    return verdict


def _largest(seen: HostFacts) -> str:
    """The GPU process holding the most memory (`--query-compute-apps`), as a clause."""
    procs = [p for p in seen.gpu_processes if p.used_memory_mib is not None]
    if not procs:
        return ""
    top = max(procs, key=lambda p: p.used_memory_mib or 0)
    return f" (largest GPU process: {top.pid} {top.name[:80]}, {top.used_memory_mib} MiB)"


def gpu_lost_evidence(seen: HostFacts, nvidia_smi_lost: bool) -> str | None:
    """Why `seen`'s GPU needs a reboot: a fatal XID, else nvidia-smi's lost-GPU error."""
    xid = fatal_xid(seen.kernel)
    if xid is not None:
        return xid
    if nvidia_smi_lost:
        return f"nvidia-smi: {seen.gpu_error}"
    return None
