"""Triage below vLLM (core.judging.triage.TABLE): a named planner case per class, and properties
over the example situations."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from sparkd.core.deciding.planner import plan
from sparkd.core.judging.triage import TABLE
from sparkd.core.reading import kernel
from sparkd.core.remembering.remember import remember
from sparkd.model.memory import Memory
from sparkd.model.observed import HostError
from sparkd.model.plan import TRIAGE_CLASSES, Plan
from tests.examples import EXAMPLE_SET
from tests.support.planning import (
    COMMON,
    STARTS,
    Placed,
    host,
    kinds,
    needs_a_human,
    situations_at_a_host,
)
from tests.toy import Toy

KERNEL = Path(__file__).resolve().parent.parent / "fixtures" / "kernel"
GIB = 1 << 30


def log(*names: str) -> kernel.KernelLog:
    return kernel.parse_kernel_log("".join((KERNEL / n).read_text() for n in names))


def example(name: str) -> tuple[Toy, Memory]:
    return next(e for e in EXAMPLE_SET if e.name == name).build()


def test_the_table_names_every_class_once() -> None:
    assert sorted(row.triage for row in TABLE) == sorted(TRIAGE_CLASSES)


# -- GPU lost / fatal XID ----------------------------------------------------------------------


def test_xid_79_blocks_every_start_and_names_the_reboot() -> None:
    toy, memory = example("load-stalled")
    observed = host(toy.observe(), "spark-b", kernel=log("xid-79.txt"))
    result = plan(toy.cluster, observed, memory, toy.now)
    assert result.phase == "blocked"
    assert not kinds(result) & STARTS
    assert "needs a reboot of spark-b (XID 79 (GPU has fallen off the bus)" in result.reason
    assert result.triage == ("gpu_lost",)
    # A hold, not a latch: nothing was spent, and the plan is judged again next cycle.
    assert result.latch is None


def test_a_healthy_cluster_with_a_fatal_xid_restarts_nothing_either() -> None:
    toy, memory = example("three-failed-probes")
    observed = host(toy.observe(), "spark-a", kernel=log("xid-79.txt"))
    result = plan(toy.cluster, observed, memory, toy.now)
    assert "restart_model" not in kinds(result)
    assert result.phase == "blocked" and "needs a reboot of spark-a" in result.reason


def test_the_nvidia_smi_lost_gpu_is_the_same_class() -> None:
    toy, memory = example("healthy-reasoning-only")
    error = "gpu_apps failed (rc 15): GPU 00000000:0F:01.0: GPU has fallen off the bus."
    result = plan(toy.cluster, host(toy.observe(), "spark-b", gpu_error=error), memory, toy.now)
    assert result.triage == ("gpu_lost",)
    assert "needs a reboot of spark-b (nvidia-smi: " in result.reason


def test_application_xids_and_teardowns_never_block() -> None:
    toy, memory = example("load-stalled")
    observed = host(toy.observe(), "spark-b", kernel=log("xid-13.txt", "xid-45.txt"))
    result = plan(toy.cluster, observed, memory, toy.now)
    assert result.phase == "starting_model" and "restart_model" in kinds(result)
    assert result.triage == ()


@COMMON
@given(situations_at_a_host(), st.sampled_from(["xid-13.txt", "xid-45.txt", "quiet.txt"]))
def test_harmless_kernel_lines_change_no_plan(s: Placed, sample: str) -> None:
    toy, memory, now, name = s
    before = plan(toy.cluster, toy.observe(), memory, now)
    after = plan(toy.cluster, host(toy.observe(), name, kernel=log(sample)), memory, now)
    assert (after.phase, after.actions, after.reason) == (
        before.phase,
        before.actions,
        before.reason,
    )


@COMMON
@given(situations_at_a_host())
def test_a_fatal_xid_anywhere_blocks_every_start(s: Placed) -> None:
    toy, memory, now, name = s
    result = plan(toy.cluster, host(toy.observe(), name, kernel=log("xid-79.txt")), memory, now)
    assert not kinds(result) & STARTS
    # Blocked, or cleaning first (a cleanup needs no GPU), as for nvidia-smi's lost GPU.
    assert needs_a_human(result) and f"needs a reboot of {name} (XID 79" in result.reason
    assert "gpu_lost" in result.triage


# -- host wedged -------------------------------------------------------------------------------


def wedge(toy: Toy, memory: Memory, sample: str, name: str = "spark-b") -> tuple[Memory, Plan]:
    seen = host(toy.observe(), name, kernel=log(sample))
    memory = remember(memory, seen, (), toy.now, plan(toy.cluster, seen, memory, toy.now))
    gone = host(toy.observe(), name, error=HostError(kind="timeout", detail="no answer"))
    # Down for the cluster too, not only to the ops box: no other host reaches its data IP.
    silent = toy.cluster.host(name)
    assert silent is not None
    for other in toy.cluster.hosts:
        if other.name != name:
            gone = host(gone, other.name, reaches={silent.data_ip: False})
    return memory, plan(toy.cluster, gone, memory, toy.now + 30)


def test_unreachable_after_nv_err_no_memory_is_wedged() -> None:
    toy, memory = example("healthy-reasoning-only")
    memory, result = wedge(toy, memory, "nv-no-memory.txt")
    assert result.phase == "blocked"
    assert (
        "spark-b wedged: needs a power cycle (last kernel log seen: NVRM NV_ERR_NO_MEMORY x3"
        in (result.reason)
    )
    assert result.triage == ("host_wedged",) and result.actions == ()


def test_unreachable_after_a_fatal_aer_or_soft_lockup_is_wedged() -> None:
    for sample, evidence in (
        ("aer-fatal.txt", "PCIe fatal AER"),
        ("soft-lockup.txt", "soft lockup"),
    ):
        toy, memory = example("healthy-reasoning-only")
        _, result = wedge(toy, memory, sample, "spark-a")
        assert result.phase == "blocked" and evidence in result.reason
        assert "spark-a wedged: needs a power cycle" in result.reason


def test_unreachable_with_a_quiet_last_log_is_only_unreachable() -> None:
    toy, memory = example("healthy-reasoning-only")
    _, result = wedge(toy, memory, "xid-45.txt")
    assert result.phase == "unreachable" and "wedged" not in result.reason
    assert result.triage == ()


def test_a_host_back_with_a_new_boot_forgets_its_omens() -> None:
    toy, memory = example("healthy-reasoning-only")
    memory, _ = wedge(toy, memory, "nv-no-memory.txt")
    assert "spark-b" in memory.kernel_omens
    back = host(toy.observe(), "spark-b", boot_id="another-boot", kernel=None)
    assert "spark-b" not in remember(memory, back, (), toy.now + 60).kernel_omens


# -- memory pressure ---------------------------------------------------------------------------


def test_memory_pressure_during_a_load_holds_the_restart() -> None:
    toy, memory = example("load-stalled")
    observed = host(toy.observe(), "spark-a", memory_available_bytes=GIB)
    result = plan(toy.cluster, observed, memory, toy.now)
    assert "restart_model" not in kinds(result)
    assert "memory pressure on spark-a: MemAvailable 1.0 GiB below 4.0 GiB during the load" in (
        result.reason
    )
    assert result.triage == ("memory_pressure",)
    plenty = host(toy.observe(), "spark-a", memory_available_bytes=100 * GIB)
    assert "restart_model" in kinds(plan(toy.cluster, plenty, memory, toy.now))


def test_memory_pressure_while_serving_is_reported_only() -> None:
    toy, memory = example("three-failed-probes")
    observed = host(toy.observe(), "spark-b", memory_available_bytes=GIB // 2)
    result = plan(toy.cluster, observed, memory, toy.now)
    assert "restart_model" in kinds(result)
    assert "memory pressure on spark-b: MemAvailable 0.5 GiB" in result.reason
    assert result.triage == ("memory_pressure",)


def test_memory_pressure_with_no_model_running_holds_the_start() -> None:
    toy, memory = example("healthy-reasoning-only")
    toy = dataclasses.replace(toy, serve_running=False, ready=False)
    assert "start_model" in kinds(plan(toy.cluster, toy.observe(), memory, toy.now))
    pressed = host(toy.observe(), "spark-b", memory_available_bytes=GIB)
    result = plan(toy.cluster, pressed, memory, toy.now)
    assert "start_model" not in kinds(result)
    assert "memory pressure on spark-b: MemAvailable 1.0 GiB below 4.0 GiB" in result.reason
    assert result.triage == ("memory_pressure",)


def test_unreachable_past_power_unreachable_for_is_wedged_without_omens() -> None:
    toy, memory = example("healthy-reasoning-only")
    gone = host(toy.observe(), "spark-b", error=HostError(kind="timeout", detail="no answer"))
    # Down for the cluster too: the head's ping of its data IP goes unanswered.
    worker = toy.cluster.host("spark-b")
    assert worker is not None
    gone = host(gone, "spark-a", reaches={worker.data_ip: False})
    memory = remember(memory, gone, (), toy.now)
    assert memory.unreachable_since == {"spark-b": gone.observed_at}
    # Later looks keep the first failure's time.
    memory = remember(
        memory, gone.model_copy(update={"observed_at": gone.observed_at + 60}), (), toy.now
    )
    assert memory.unreachable_since == {"spark-b": gone.observed_at}
    limit = toy.cluster.power.unreachable_for
    early = plan(toy.cluster, gone, memory, gone.observed_at + limit - 1)
    assert early.phase == "unreachable" and early.triage == ()
    late = plan(toy.cluster, gone, memory, gone.observed_at + limit)
    assert late.phase == "blocked" and late.triage == ("host_wedged",)
    assert (
        "spark-b wedged: needs a power cycle (unreachable for 10m00s, past power.unreachable_for)"
        in (late.reason)
    )
    back = remember(memory, toy.observe(), (), toy.now + limit)
    assert back.unreachable_since == {}


def test_memory_pressure_names_the_largest_gpu_process() -> None:
    toy, memory = example("stray-gpu")
    pressed = host(toy.observe(), "spark-a", memory_available_bytes=GIB)
    result = plan(toy.cluster, pressed, memory, toy.now)
    assert (
        "memory pressure on spark-a: MemAvailable 1.0 GiB below 4.0 GiB (largest GPU process: "
        in (result.reason)
    )
