"""`sparkd demo`: the seed-morning recovery narrated, and one fault's detection and recovery."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def demo(tmp_path: Path, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "sparkd.cli", "demo", "--exit-when-healthy",
         "--load-seconds", "3", "--dir", str(tmp_path / "demo"), *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_demo_recovers_seed_morning(tmp_path: Path) -> None:
    out = demo(tmp_path)
    lines = out.splitlines()
    order = [
        "stop_unit vllm-cluster.service on spark-a: ok",
        "remove_container glm-flash on spark-b: ok",
        "start_ray_head sparkd-sparks-ray-head on spark-a: ok",
        "start_ray_worker sparkd-sparks-ray-worker on spark-b: ok",
        "start_model /models/Qwen3.5-122B-A10B-FP8 on spark-a: ok",
        "sparks: healthy: probe reasoning_only",
    ]
    positions = [next(i for i, line in enumerate(lines) if step in line) for step in order]
    assert positions == sorted(positions), out
    assert any("loading [" in line for line in lines)
    assert "API: http://127.0.0.1:" in out


def test_demo_fault_is_detected_and_recovered(tmp_path: Path) -> None:
    out = demo(tmp_path, "--fault", "crash-model")
    assert "injecting crash-model" in out
    after = out[out.index("injecting crash-model") :]
    assert "vllm serve exited" in after
    assert "recovered from crash-model" in after


def test_demo_xid_79_holds_until_the_operator_reboots(tmp_path: Path) -> None:
    out = demo(tmp_path, "--fault", "xid-79")
    after = out[out.index("injecting xid-79") :]
    blocked = after.index("needs a reboot of spark-b (XID 79")
    rebooted = after.index("the operator reboots it")
    assert blocked < rebooted < after.index("recovered from xid-79"), after
    # Nothing restarted between the XID and the reboot.
    assert "restart_" not in after[:rebooted] and "start_model" not in after[:rebooted], after


def test_demo_bad_args_rolls_back_to_the_last_good_spec(tmp_path: Path) -> None:
    out = demo(tmp_path, "--fault", "bad-args")
    after = out[out.index("reloading with a typo in model.extra_args: --enable-resoning") :]
    steps = [
        "spec drift: serving",
        "restart_model /models/Qwen3.5-122B-A10B-FP8 on spark-a: failed",
        "rolling back from",
        "start_model /models/Qwen3.5-122B-A10B-FP8 on spark-a: ok",
        "sparks: degraded: rolled back from",
        "recovered from bad-args",
    ]
    positions = [after.index(step) for step in steps]
    assert positions == sorted(positions), after
    assert "unrecognized arguments: --enable-resoning" in after
