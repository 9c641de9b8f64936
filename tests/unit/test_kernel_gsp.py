"""GB10's GSP crash (XID 119, 120, then 154 and a forced reboot): read from the driver's own lines
(tests/fixtures/kernel/xid-gsp.txt, xid-154*.txt) as a GPU that needs a reboot; XID 154 by the
action it changed to."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkd.core.deciding.planner import plan
from sparkd.core.judging import triage
from sparkd.core.reading import kernel
from sparkd.model.observed import KernelLog
from sparkd_sim import fake_kernel
from tests.examples import EXAMPLE_SET
from tests.support.planning import STARTS, host, kinds

KERNEL = Path(__file__).resolve().parent.parent / "fixtures" / "kernel"


def log(name: str) -> KernelLog:
    return kernel.parse_kernel_log((KERNEL / name).read_text())


def test_gsp_timeout_error_rate_limit_and_reset_verdict_are_each_fatal() -> None:
    events = log("xid-gsp.txt").events
    found = sorted((e.kind, e.xid or 0) for e in events)
    assert found == [
        ("gpu_reset_required", 0),
        ("gpu_reset_required", 154),
        ("xid", 119),
        ("xid", 120),
    ]
    assert all(kernel.fatal_xid(e) for e in events)
    assert all(e.device == "PCI:000f:01:00" for e in events)
    said = " / ".join(kernel.describe(e) for e in events)
    assert "GSP RPC timeout" in said and "GSP error" in said
    assert "0x1 (GPU Reset Required)" in said and "likely needs a reset" in said


def test_xid_154_is_fatal_only_when_it_asks_for_a_reset() -> None:
    events = log("xid-154.txt").events
    fatal = [e for e in events if kernel.fatal_xid(e)]
    assert [(e.kind, e.xid, e.count) for e in fatal] == [("gpu_reset_required", 154, 1)]
    assert "0x2 (Node Reboot Required)" in kernel.describe(fatal[0])
    # A drain, and the verdict cleared to None, are shown but block nothing.
    assert not any(kernel.fatal_xid(e) for e in log("xid-154-cleared.txt").events)


def test_an_older_drivers_action_names_are_read_by_number() -> None:
    line = (
        "[ 12.5] h kernel: NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from "
        "0x0 (None) to 0x2 (OS Reboot)"
    )
    [event] = kernel.parse_kernel_log(line).events
    assert kernel.fatal_xid(event)


@pytest.mark.parametrize("sample", ["xid-gsp.txt", "xid-154.txt"])
@pytest.mark.parametrize("situation", ["load-stalled", "three-failed-probes"])
def test_a_gsp_crash_blocks_every_start_and_restart_with_a_reboot(
    sample: str, situation: str
) -> None:
    # Both situations would restart the model (a stalled load, a hung model) on a sound GPU.
    toy, memory = next(e for e in EXAMPLE_SET if e.name == situation).build()
    name = "spark-b" if sample == "xid-154.txt" else "spark-a"
    result = plan(toy.cluster, host(toy.observe(), name, kernel=log(sample)), memory, toy.now)
    assert result.phase == "blocked"
    assert f"needs a reboot of {name}" in result.reason
    assert result.triage == ("gpu_lost",)
    assert not kinds(result) & STARTS


def test_a_cleared_recovery_action_blocks_nothing() -> None:
    toy, memory = next(e for e in EXAMPLE_SET if e.name == "three-failed-probes").build()
    observed = host(toy.observe(), "spark-a", kernel=log("xid-154-cleared.txt"))
    result = plan(toy.cluster, observed, memory, toy.now)
    assert result.phase != "blocked" and "gpu_lost" not in result.triage
    assert triage.fatal_xid(log("xid-154-cleared.txt")) is None


def test_the_simulated_gsp_crash_prints_the_drivers_lines() -> None:
    real = [
        line.split(" kernel: ", 1)[1] for line in (KERNEL / "xid-gsp.txt").read_text().splitlines()
    ]
    assert list(fake_kernel.GSP_CRASH) == real
