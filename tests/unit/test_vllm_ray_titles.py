"""vLLM's workers under Ray, by the titles the real processes carry (tests/fixtures/
vllm-ray-titles): their CPU is the evidence of a silent stage, and an orphaned one holds the
GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkd.core.reading import parsers
from sparkd.core.reading.assemble import ENGINE_MARKERS, head_extras
from sparkd.model.observed import ServeState
from tests.toy import reference_cluster

TITLES = Path(__file__).resolve().parent.parent / "fixtures" / "vllm-ray-titles"
HEAD = "sparkd-sparks-ray-head"


def _extras(top: str) -> ServeState:
    parsed = {
        "now": parsers.Section("1000", 0),
        f"top {HEAD}": parsers.Section(top, 0),
        "serve_log": parsers.Section("", 0),
    }
    serve = head_extras(reference_cluster(), parsed, 1000.0).serve
    assert serve is not None
    return serve


@pytest.mark.parametrize(
    ("sample", "cpu"),
    [
        # torch.compile: the worker's 2,950 s, not only the waiting API server and engine.
        ("docker-top-compile.txt", 35 + 41 + 2950),
        # Loading weights under vLLM's own title.
        ("docker-top-loading.txt", 14 + 9 + 310),
        # The executor before RayExecutorV2 is still read.
        ("docker-top-old-executor.txt", 35 + 41 + 2950),
    ],
)
def test_a_silent_stage_counts_the_ray_workers_cpu(sample: str, cpu: int) -> None:
    serve = _extras((TITLES / sample).read_text())
    assert serve.running and serve.pid == 48102
    assert serve.cpu_seconds == cpu


@pytest.mark.parametrize(
    ("sample", "title"),
    [
        ("docker-top-compile.txt", "ray::RayWorkerProc.run"),
        ("docker-top-loading.txt", "VLLM::Worker_TP0"),
        ("docker-top-old-executor.txt", "ray::RayWorkerWrapper.execute_method"),
    ],
)
def test_orphaned_workers_are_seen_by_their_real_titles(sample: str, title: str) -> None:
    # A SIGKILLed API server: its engine and its worker stay.
    rows = (TITLES / sample).read_text().splitlines()
    top = "\n".join(row for row in rows if "vllm serve" not in row) + "\n"
    serve = _extras(top)
    assert not serve.running
    assert serve.orphans == ("pid 48377 (VLLM::EngineCore)", f"pid 48611 ({title})")


def test_ray_itself_is_no_engine_process() -> None:
    rows = parsers.parse_docker_top((TITLES / "docker-top-compile.txt").read_text())
    engine = [r.pid for r in rows if any(m in r.args for m in ENGINE_MARKERS)]
    assert engine == [48377, 48611]
