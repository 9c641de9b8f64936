"""Each weight loader's progress line (tests/fixtures/vllm-loaders) is the weights stage, not a
silent one."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkd.core.reading import parsers

LINES = (
    (Path(__file__).resolve().parent.parent / "fixtures" / "vllm-loaders" / "progress-lines.txt")
    .read_text()
    .splitlines()
)


@pytest.mark.parametrize("line", LINES, ids=[line.split(":")[0] for line in LINES])
def test_every_loaders_bar_is_weight_progress(line: str) -> None:
    progress = parsers.parse_load_progress([line], None)
    assert (progress.stage, progress.percent) == ("weights", 48.0)
    assert progress.message == line


@pytest.mark.parametrize("line", LINES, ids=[line.split(":")[0] for line in LINES])
def test_a_bar_forwarded_by_ray_is_read_too(line: str) -> None:
    # Ray's prefix, then tqdm's carriage return (the serve log as the engine writes it).
    text = f"(RayWorkerProc pid=48611) \r{line}\n"
    progress = parsers.parse_load_progress(parsers.log_lines(text), None)
    assert (progress.stage, progress.percent) == ("weights", 48.0)


def test_the_last_bar_wins_and_a_full_one_reads_100() -> None:
    lines = [
        "Loading fastsafetensors checkpoint shards:   0% Completed | 0/25 [00:00<?, ?it/s]",
        "Loading fastsafetensors checkpoint shards: 100% Completed | 25/25 [06:40<00:00, 16.0s/it]",
    ]
    assert parsers.parse_load_progress(lines, None).percent == 100.0


def test_other_percentages_are_no_weight_progress() -> None:
    lines = ["Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  50%|█████     | 33/67"]
    assert parsers.parse_load_progress(lines, None).stage == "graph_capture"
    assert parsers.parse_load_progress(["Loading: 50% done"], None).stage == "starting"
