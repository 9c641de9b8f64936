"""Every real Ray 2.60 output (tests/fixtures/ray-real, captured state by state) reads as the
right value: start-up texts, tracebacks on stderr, one-line JSON, the restart overlap."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sparkd.core.reading import parsers
from sparkd.core.reading.assemble import head_extras
from tests.toy import reference_cluster

REAL = Path(__file__).resolve().parent.parent / "fixtures" / "ray-real"


def samples() -> list[dict[str, Any]]:
    rows = []
    for path in sorted(REAL.glob("*.jsonl")):
        for number, line in enumerate(path.read_text().splitlines()):
            row = json.loads(line)
            row["id"] = f"{path.stem}:{number}:{row['cmd']}"
            rows.append(row)
    return rows


SAMPLES = samples()


def read(row: dict[str, Any]) -> Any:
    """As the fact script sees it: stdout and stderr merged, and the exit status."""
    merged = row["stdout"] + row["stderr"]
    name = "ray_nodes" if row["cmd"] == "nodes" else "ray_status"
    sections = {name: parsers.Section(merged, row["rc"])}
    return head_extras(reference_cluster(), sections, 1000.0).ray


@pytest.mark.parametrize("row", SAMPLES, ids=[r["id"] for r in SAMPLES])
def test_every_real_output_reads_as_up_or_as_a_reason(row: dict[str, Any]) -> None:
    ray = read(row)
    if row["rc"] != 0:
        assert ray.error is not None
        assert not ray.error.startswith("Traceback"), ray.error
        assert "ConnectionError" in ray.error or "Error" in ray.error
        return
    assert ray.up, ray.error
    if row["cmd"] == "nodes" and row["stdout"].startswith("["):
        rows = json.loads(row["stdout"])
        assert {n.node_id for n in ray.nodes} == {r["node_id"] for r in rows}
        assert ray.alive_ips == {r["node_ip"] for r in rows if r["state"] == "ALIVE"}
        assert ray.gpus_total == sum(
            r["resources_total"].get("GPU", 0.0) for r in rows if r["state"] == "ALIVE"
        )


def test_start_up_texts_are_up_with_nothing_registered() -> None:
    starting = [
        r for r in SAMPLES if r["rc"] == 0 and not r["stdout"].lstrip().startswith(("[", "="))
    ]
    assert {r["cmd"] for r in starting} == {"nodes", "status"}
    for row in starting:
        ray = read(row)
        assert ray.up and ray.nodes == () and ray.gpus_total == 0.0


def test_restart_overlap_shows_two_alive_nodes_on_one_ip() -> None:
    overlap = [r for r in SAMPLES if r["id"].startswith("F_") and r["cmd"] == "nodes"]
    counts = [sum(1 for n in read(r).nodes if n.alive and n.ip == "127.0.0.2") for r in overlap]
    assert max(counts) == 2, counts


def test_a_warning_on_stderr_does_not_hide_the_json() -> None:
    row = next(r for r in SAMPLES if r["cmd"] == "nodes" and r["stdout"].startswith("["))
    warned = dict(row, stderr="2026-11-30 22:33:16,072 WARNING api.py:42 -- slow response\n")
    warned["stdout"] = warned["stderr"] + row["stdout"]
    ray = read(warned)
    assert ray.up and ray.ips_known and ray.nodes


def test_dashboard_off_usage_text_keeps_the_error_line() -> None:
    text = (
        "Usage: ray list nodes [OPTIONS]\nTry 'ray list nodes --help' for help.\n\n"
        "Error: Failed to make request to http://127.0.0.1:8265/api/v0/nodes?limit=100\n"
    )
    assert parsers.parse_ray_nodes(text) is None
    reason = parsers.failure_reason(
        "Traceback (most recent call last):\n  File x\nValueError: bad\n"
    )
    assert reason == "ValueError: bad"


@pytest.mark.parametrize(
    "text",
    [
        '[{"node_id": 5}]',
        '{"data": 5}',
        "[1, 2]",
        '[{"node_id": "a", "resources_total": {"GPU": "NaN"}}]',
    ],
)
def test_wrong_types_are_not_a_cluster(text: str) -> None:
    parsed = parsers.parse_ray_nodes(text)
    assert parsed is None or all(n.gpus == 0.0 for n in parsed.nodes)
