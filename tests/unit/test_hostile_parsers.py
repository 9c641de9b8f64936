"""Hostile host output: whatever a host prints, parsing yields values or classified unknowns,
never an exception out of the cycle."""

from __future__ import annotations

import json
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from sparkd.core.reading import parsers
from sparkd.core.reading.assemble import head_extras, host_facts, unreadable
from sparkd.shell.ssh import MAX_OUTPUT
from tests.toy import ROOT, reference_cluster

SECTIONS = (
    "now",
    "boot_id",
    "units",
    "containers",
    "image",
    "ours_image",
    "gpu_apps",
    "gpu_apps_after",
    "running",
    "top sparkd-sparks-ray-head",
    "iface",
    "disk",
    "ray_nodes",
    "ray_status",
    "serve_spec",
    "serve_log",
    "serve_log_mtime",
    "kernel",
    "meminfo",
    "fabric",
)
NASTY = st.sampled_from(
    [
        "²",
        "1" * 5000,
        "NaN",
        "-inf",
        "1e999",
        "\x00\xff",
        '{"data": 5}',
        "[1, 2]",
        '[{"node_id": 5}]',
        '[{"node_id": "a", "resources_total": {"GPU": "NaN"}, "node_ip": []}]',
        '{"Names": 5, "Labels": null, "State": []}',
        "PID ELAPSED TIME COMMAND\n² ² ² vllm serve x",
        "PID ELAPSED TIME COMMAND\n1 99999999999999999999999 1 vllm serve",
        "12, python3, ²",
        '[{"ifname": 5, "addr_info": 5, "flags": 5}]',
        "Id=x\nLoadState",
        "======== Autoscaler status ========\nNode status\nActive:\n 1 node_zz\n"
        "Total Usage:\n 1.2.3/9 GPU",
        "Loading safetensors checkpoint shards: 999999999999999999999% Completed",
        "9999-99-99 99:99:99.999 +9999",
        "[99999999999.9999999999] h kernel: NVRM: Xid (PCI:0000:01:00): 99999, pid=1, x",
        "[ 1.5] h kernel: NVRM: Xid (PCI:\x1b[2J): 79, x\n[ nan] x",
        "MemAvailable: 999999999999999999999 kB\nMemTotal: -1 kB",
        "/sys/class/net/x/device/infiniband/d/ports/999/gids/9999:zz\n/sys/class/net/x/mtu:99999999999999",
    ]
)
BODY = st.one_of(
    st.text(max_size=300), NASTY, st.binary(max_size=200).map(lambda b: b.decode("latin-1"))
)


@settings(max_examples=400, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(SECTIONS),
        st.tuples(BODY, st.sampled_from([0, 1, 124, None])),
        max_size=len(SECTIONS),
    )
)
def test_any_sections_parse_to_values(chosen: dict[str, tuple[str, int | None]]) -> None:
    cluster = reference_cluster()
    sections = {name: parsers.Section(body, rc) for name, (body, rc) in chosen.items()}
    if unreadable(sections) is None:
        host_facts(cluster, cluster.head, sections, 1000.0)
    extras = head_extras(cluster, sections, 1000.0)
    assert extras.ray.up or extras.ray.error


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=2000))
def test_any_fact_script_output_splits(text: str) -> None:
    parsers.parse_sections(text)


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=20,
    )
)
def test_any_json_in_ray_and_docker_readers(value: object) -> None:
    text = json.dumps(value)
    parsers.parse_ray_nodes(text)
    parsers.parse_docker_ps(text)
    parsers.parse_ip_addr(text)


def test_numbers_past_pythons_digit_limit_are_unknowns() -> None:
    huge = "9" * 5000
    sections = parsers.parse_sections(f"@@sparkd disk\nAvail\n{huge}\n@@sparkd-end disk {huge}\n")
    assert sections["disk"].rc is None
    assert parsers.parse_df_avail(sections["disk"].body) is None
    assert (
        parsers.parse_ray_nodes(
            '[{"node_id": "a", "resources_total": {"GPU": 1' + "0" * 400 + "}}]"
        )
        is None
    )
    assert parsers.parse_stat_time("inf") is None


def test_a_garbage_gpu_count_makes_ray_unknown_not_zero_gpus() -> None:
    cluster = reference_cluster()
    listed = (ROOT / "tests/fixtures/samples/ray-list-nodes.json").read_text()
    for garbage in ("NaN", "Infinity", "-Infinity", "-1.0", '"1"', "1e999"):
        text = listed.replace('"GPU": 1.0', f'"GPU": {garbage}', 1)
        assert text != listed
        assert parsers.parse_ray_nodes(text) is None
        extras = head_extras(cluster, {"ray_nodes": parsers.Section(text, 0)}, 1000.0)
        assert not extras.ray.up
        assert extras.ray.error
    assert parsers.parse_ray_nodes(listed) is not None


def test_an_unreadable_docker_ps_line_makes_the_host_unknown_not_its_container_missing() -> None:
    cluster = reference_cluster()
    lines = (ROOT / "tests/fixtures/samples/docker-ps.jsonl").read_text().splitlines()
    head = next(i for i, line in enumerate(lines) if "--head" in line)
    readable = {
        "boot_id": parsers.Section("b", 0),
        "running": parsers.Section("", 0),
        "containers": parsers.Section("\n".join(lines), 0),
    }
    assert unreadable(readable) is None
    for garbled in (
        lines[head][: len(lines[head]) // 2],
        lines[head].replace('"Names":"', '"Names":["', 1),
        "\x1b[2K" + lines[head],
        '{"Names": null}',
    ):
        sections = dict(readable)
        sections["containers"] = parsers.Section("\n".join([*lines[:head], garbled]), 0)
        error = unreadable(sections)
        assert error is not None, garbled
        assert "docker ps" in error.detail
    warned = dict(readable)
    warned["containers"] = parsers.Section("WARNING: No swap limit support\n" + lines[head], 0)
    assert unreadable(warned) is None
    assert host_facts(cluster, cluster.head, warned, 1000.0).containers


def _sections_line_by_line(text: str) -> dict[str, tuple[str, int | None]]:
    """The splitting as it was done a line at a time (splitlines), to compare with."""
    sections: dict[str, tuple[str, int | None]] = {}
    name: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith(parsers.SECTION_START):
            name, lines = line[len(parsers.SECTION_START) :].strip(), []
        elif line.startswith(parsers.SECTION_END) and name is not None:
            _, _, rc_text = line[len(parsers.SECTION_END) :].strip().rpartition(" ")
            rc = int(rc_text) if re.match(r"^-?[0-9]{1,5}$", rc_text) else None
            sections[name] = ("\n".join(lines), rc)
            name = None
        elif name is not None:
            lines.append(line)
    if name is not None:
        sections[name] = ("\n".join(lines), None)
    return sections


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            ["@@sparkd a", "@@sparkd b", "@@sparkd-end a 0", "@@sparkd-end b 1", "@@sparkd-end",
             "x", "", " ", "@@sparkd", "y@@sparkd a", "-1"]
        ),
        max_size=12,
    ),
    st.lists(st.sampled_from(["\n", "\r", "\r\n", "\x0b", "\x1c", "\x85", "\u2028"]), min_size=12),
)  # fmt: skip
def test_sections_split_as_line_by_line(words: list[str], breaks: list[str]) -> None:
    text = "".join(w + b for w, b in zip(words, breaks, strict=False))
    got = {k: (v.body, v.rc) for k, v in parsers.parse_sections(text).items()}
    assert got == _sections_line_by_line(text)


def test_a_section_flooded_to_the_output_cap_is_cut_off_unsplit() -> None:
    # 8 MiB of line breaks in one section: 8 million lines for its parser to step through.
    flood = "\n" * MAX_OUTPUT
    text = (
        f"@@sparkd containers\n{flood}@@sparkd-end containers 0\n"
        "@@sparkd disk\n1\n@@sparkd-end disk 0\n"
    )
    sections = parsers.parse_sections(text)
    assert sections["containers"] == parsers.Section("", None)
    assert sections["disk"] == parsers.Section("1", 0)
    lines = "x\n" * parsers.SECTION_LINES
    kept = parsers.parse_sections(f"@@sparkd top\n{lines}@@sparkd-end top 0\n")["top"]
    assert kept.rc == 0 and len(kept.body.splitlines()) == parsers.SECTION_LINES


def test_markers_past_the_bound_end_the_reading() -> None:
    many = "".join(f"@@sparkd s{i}\nx\n@@sparkd-end s{i} 0\n" for i in range(parsers.MAX_MARKERS))
    sections = parsers.parse_sections(many)
    assert len(sections) == parsers.MAX_MARKERS // 2
    assert f"s{parsers.MAX_MARKERS}" not in sections
