"""vLLM 0.32.0's Ray executor (`RayExecutorV2`) with `--tensor-parallel-size 2` on a real
two-node Ray 2.60 cluster, held to its capture (tests/fixtures/vllm-ray-executor): the actors'
titles on each node, the engine core's placement lines, the metric families, a long prompt's
completion across both workers, and what the death of the worker node does to the engine."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sparkd.core.reading.placement import parse_placement
from tests.realexec.conftest import Observed

pytestmark = pytest.mark.realexec

CAPTURE = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-ray-executor"


def shape(line: str) -> str:
    """A line with its numbers (PIDs, times, addresses, line numbers) and Ray's ids (node,
    actor, object addresses) made wildcards."""
    line = re.sub(r"\b(0x)?[0-9a-f]{12,}\b", "ID", line)
    return re.sub(r"\d+(\.\d+)?", "N", line)


# What vLLM prints while its placement group waits (`v1/executor/ray_utils.py`, lines 613 and
# 466): the tier's launch waits for the worker node; the capture's did not.
SHORT = "The number of required GPUs exceeds the total number of available GPUs"
WAITING = "Waiting for creating a placement group of specs"


def placement_lines(log: str, waits: bool = False) -> list[str]:
    """The engine core's lines about its placement group (vLLM `v1/executor/ray_utils.py`),
    those of the wait only when asked for."""
    return [
        shape(ln)
        for ln in log.splitlines()
        if ln.startswith("(EngineCore")
        and "[ray_utils.py" in ln
        and (waits or not (SHORT in ln or WAITING in ln))
    ]


def families(text: str) -> set[str]:
    return {f.name for f in text_string_to_metric_families(text) if f.name.startswith("vllm:")}


def captured_titles() -> set[tuple[str, str]]:
    rows = (CAPTURE / "titles.txt").read_text().splitlines()
    return {(node, title) for node, _, title in (r.partition("\t") for r in rows if r)}


@pytest.fixture
def serving(observed: Observed) -> Observed:
    if not observed.listening:
        pytest.fail(f"vllm serve exited {observed.exit_code}:\n{observed.log[-4000:]}")
    return observed


def test_both_workers_serve_a_long_prompt(serving: Observed) -> None:
    choices = serving.completion["choices"]
    assert isinstance(choices, list) and len(choices) == 1
    usage = serving.completion["usage"]
    assert isinstance(usage, dict) and usage["prompt_tokens"] >= 100, serving.completion
    # One `RayWorkerProc` per node, each in its busy loop (Ray's title while `run` runs).
    for node in ("head", "worker1"):
        assert (node, "ray::RayWorkerProc.run") in serving.titles
    assert ("head", "VLLM::EngineCore") in serving.titles
    assert not any(t == "VLLM::EngineCore" for n, t in serving.titles if n != "head")


def test_the_run_prints_what_the_capture_shows(serving: Observed) -> None:
    captured = (CAPTURE / "serve.log").read_bytes().decode()
    assert placement_lines(serving.log) == placement_lines(captured)
    assert placement_lines(captured)
    # The actors' titles of this run, with their instance id made a wildcard, are the
    # capture's (sampled every 0.25 s: a title held shorter may be missed, never invented).
    ours = {(n, shape(t)) for n, t in serving.titles if "RayWorkerProc" in t or "VLLM::" in t}
    real = {(n, shape(t)) for n, t in captured_titles() if "RayWorkerProc" in t or "VLLM::" in t}
    assert ours <= real, ours - real
    assert families(serving.metrics) == families((CAPTURE / "metrics.txt").read_text())


def test_a_launch_one_node_short_waits_and_is_placed_on_the_node_that_joins(
    serving: Observed,
) -> None:
    """Launched while Ray had one node of two: vLLM warns, waits for its placement group and
    says so, and goes on when the worker node joins: sparkd reads the wait, then where the
    group went (core.reading.placement), from the real log."""
    waiting = placement_lines(serving.waiting_log, waits=True)
    assert any(SHORT in ln for ln in waiting) and any(WAITING in ln for ln in waiting), waiting
    early = parse_placement(serving.waiting_log.splitlines())
    assert early is not None and early.stage == "waiting" and not early.nodes
    placed = parse_placement(serving.log.splitlines())
    assert placed is not None and placed.stage == "placed", placement_lines(serving.log, True)
    assert len(set(placed.nodes)) == 2, placed.nodes


def test_the_worker_nodes_death_ends_the_engine_and_the_server(serving: Observed) -> None:
    """SIGKILL of the worker node (its raylet and its `RayWorkerProc`, as when a Spark's
    container dies): the executor notices the actor's death, the engine core dies of it, and
    the API server exits (status 0, as when its EngineCore is killed alone)."""
    assert serving.exit_after_death == 0, serving.after_death[-3000:]
    died = "RayWorkerProc rank=[1] died unexpectedly, shutting down executor."
    ours = [shape(ln) for ln in serving.after_death.splitlines() if died in ln]
    captured = (CAPTURE / "after-death.log").read_text().splitlines()
    assert ours and ours == [shape(ln) for ln in captured if died in ln]
    assert "EngineDeadError: EngineCore encountered an issue." in serving.after_death
