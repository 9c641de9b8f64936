"""A host printing up to the SSH output cap in one section costs the parsers no more than a host
that printed what the fact script asked for: counted in decodes and characters read, never in
wall-clock time (bench/bench_parsers.py times the same shapes)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from sparkd.core.reading import parsers
from sparkd.core.reading.assemble import head_extras, host_facts, unreadable
from sparkd.shell.ssh import MAX_OUTPUT
from tests.toy import ROOT, reference_cluster

SAMPLE = (ROOT / "tests/fixtures/samples/docker-ps.jsonl").read_text()


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """How many times json.loads runs (every docker ps line decoded is one)."""
    count = [0]
    real = json.loads

    def counting(text: Any, *args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return real(text, *args, **kwargs)

    monkeypatch.setattr(json, "loads", counting)
    yield count


def flooded_listing() -> str:
    """The output cap filled with distinct, valid `docker ps` lines (about 49,000)."""
    full = json.loads(SAMPLE.splitlines()[0])
    row = {k: full[k] for k in ("Image", "Labels", "Names", "State", "Status")}
    lines: list[str] = []
    size = 0
    while size < MAX_OUTPUT - 400:
        row["Names"] = f"junk-{len(lines)}"
        line = f"exited junk-{len(lines)} {json.dumps(row)}"
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


def test_a_flooded_docker_ps_costs_a_bounded_number_of_decodes(decodes: list[int]) -> None:
    cluster = reference_cluster()
    listing = flooded_listing()
    assert len(listing.splitlines()) > 40_000
    sections = {
        "boot_id": parsers.Section("b", 0),
        "running": parsers.Section("", 0),
        "containers": parsers.Section(listing, 0),
    }
    # As a look reads it: the listing's check, then the host's facts.
    error = unreadable(sections)
    host_facts(cluster, cluster.head, sections, 1000.0)
    # Each of the two readings decodes at most MAX_CONTAINERS lines (the other sections a few).
    assert decodes[0] <= 2 * parsers.MAX_CONTAINERS + 16
    # Too many to be a sane host's: unknown, not a list with sparkd's own containers missing.
    assert error is not None and "more than" in error.detail


def test_a_sane_listing_reads_whole_and_once(decodes: list[int]) -> None:
    lines = SAMPLE.splitlines()
    listed = parsers.read_docker_ps(SAMPLE)
    assert listed.unreadable is None
    assert [c.name for c in listed.containers] == [
        json.loads(line)["Names"].split(",")[0] for line in lines
    ]
    assert decodes[0] == 2 * len(lines)  # the listing's, then the test's own
    at_cap = "\n".join([lines[0]] * parsers.MAX_CONTAINERS)
    assert len(parsers.parse_docker_ps(at_cap)) == parsers.MAX_CONTAINERS


def test_a_flooded_serve_log_is_read_to_the_tail_the_script_asked_for() -> None:
    cluster = reference_cluster()
    ready = "INFO:     Application startup complete."
    # Words to the output cap after the line that matters; the script asked for 64 KiB.
    flood = "garbage words, " * (MAX_OUTPUT // 15)
    lines = parsers.section_log_lines(f"{ready}\n{flood}")
    assert sum(len(line) for line in lines) <= parsers.LOG_TAIL_CHARS
    tail = parsers.section_log_lines(f"{flood}\n{ready}\n")
    assert tail[-1] == ready
    sections = {"serve_log": parsers.Section(f"{flood}\n{ready}", 0)}
    extras = head_extras(cluster, sections, 0.0)
    assert extras.serve is not None
    assert sum(len(line) for line in extras.serve.log_tail) <= parsers.LOG_TAIL_CHARS


def test_a_sane_serve_log_reads_as_before() -> None:
    bar = "Loading safetensors checkpoint shards:  {}% Completed | {}/4 [00:0{}<00:00]"
    text = "\r".join(bar.format(25 * i, i, i) for i in range(5)) + "\nINFO: ready\n"
    text = text * (parsers.LOG_TAIL_CHARS // len(text))
    assert len(text) <= parsers.LOG_TAIL_CHARS
    assert parsers.section_log_lines(text) == parsers.log_lines(text)
