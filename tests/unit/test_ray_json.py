"""Ray's dashboard answers (tests/fixtures/ray-http, from real Ray 2.60) read as `ray list
nodes` and `ray status` are, and every other shape read as unknown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sparkd.core.reading import parsers, ray_json
from sparkd.shell import ray_http

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "ray-http"


def samples(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines()]


def answers(name: str, path: str) -> list[dict[str, Any]]:
    return [s for s in samples(name) if s["path"].split("?")[0] == path and s["status"] == 200]


def test_the_filtered_node_list_is_what_sparkd_asks() -> None:
    asked = {s["path"] for s in samples("A_head_start.jsonl") if "filter" in s["path"]}
    assert asked == {ray_http.NODES_PATH + "&timeout=5"}


def test_a_starting_head_lists_nothing_then_itself() -> None:
    listed = [
        ray_json.parse_nodes(s["body"])
        for s in answers("A_head_start.jsonl", "/api/v0/nodes")
        if "filter" in s["path"]
    ]
    assert listed[0] is not None and listed[0].nodes == () and listed[0].gpus_total == 0.0
    head = listed[-1]
    assert head is not None and len(head.nodes) == 1
    (node,) = head.nodes
    assert node.alive and node.is_head and node.gpus == 1.0 and node.ip == "192.0.2.2"
    assert node.node_id.startswith("889f9055") and head.ips_known


def test_the_cluster_status_counts_no_gpu_until_the_head_is_counted() -> None:
    usable = [
        ray_json.parse_cluster_status(s["body"])
        for s in answers("A_head_start.jsonl", "/api/cluster_status")
    ]
    # An empty usage first (Ray's services starting), then the head's GPU.
    assert usable == [0.0, 1.0]


def test_a_killed_worker_goes_dead_in_the_list_before_its_gpu_leaves_the_status() -> None:
    alive = [
        ray_json.parse_nodes(s["body"])
        for s in answers("E_kill_worker.jsonl", "/api/v0/nodes")
        if "filter" in s["path"]
    ]
    assert [len(r.nodes) if r is not None else None for r in alive] == [2, 1]
    everything = [
        ray_json.parse_nodes(s["body"])
        for s in answers("E_kill_worker.jsonl", "/api/v0/nodes")
        if "filter" not in s["path"]
    ]
    last = everything[-1]
    assert last is not None and [n.alive for n in last.nodes] == [False, True]
    dead = last.nodes[0]
    assert dead.state_message is not None and "missing too many heartbeats" in dead.state_message
    assert last.gpus_total == 1.0  # a DEAD node's GPU never counts
    usable = [
        ray_json.parse_cluster_status(s["body"])
        for s in answers("E_kill_worker.jsonl", "/api/cluster_status")
    ]
    assert usable[0] == 2.0 and usable[-1] == 1.0


def test_the_node_list_reads_as_the_cli_reads_its_rows() -> None:
    for sample in answers("E_kill_worker.jsonl", "/api/v0/nodes"):
        rows = json.loads(sample["body"])["data"]["result"]["result"]
        assert ray_json.parse_nodes(sample["body"]) == parsers.parse_ray_nodes(json.dumps(rows))


def _first(name: str, path: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(answers(name, path)[-1]["body"])
    return body


def test_unknown_shapes_are_unknown_not_errors() -> None:
    good = _first("E_kill_worker.jsonl", "/api/v0/nodes")
    cut = json.loads(json.dumps(good))
    cut["data"]["result"]["num_filtered"] = len(cut["data"]["result"]["result"]) + 1
    failed = {"result": False, "msg": "GCS unavailable", "data": {}}
    no_rows = {"result": True, "msg": "", "data": {"result": {"num_filtered": 0}}}
    bad_gpu = json.loads(json.dumps(good))
    bad_gpu["data"]["result"]["result"][0]["resources_total"]["GPU"] = "two"
    for body in (cut, failed, no_rows, bad_gpu, [], None, "text"):
        assert ray_json.parse_nodes(json.dumps(body)) is None, body
    assert ray_json.parse_nodes("<html>502 Bad Gateway</html>") is None
    status = _first("E_kill_worker.jsonl", "/api/cluster_status")
    for usage in ({"GPU": [0.0]}, {"GPU": ["0", "2"]}, {"GPU": [0.0, -1.0]}, {"GPU": 2.0}):
        odd = json.loads(json.dumps(status))
        odd["data"]["clusterStatus"]["loadMetricsReport"]["usage"] = usage
        assert ray_json.parse_cluster_status(json.dumps(odd)) is None, usage
    assert ray_json.parse_cluster_status(json.dumps(failed)) is None
    assert ray_json.parse_cluster_status('{"result": true, "data": {"clusterStatus": 3}}') is None


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=8),
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(
                st.sampled_from(
                    ["result", "data", "num_filtered", "clusterStatus", "GPU", "usage"]
                ),
                inner,
                max_size=4,
            )
        ),
        max_leaves=20,
    )
)
def test_any_json_parses_to_a_state_or_unknown(document: object) -> None:
    text = json.dumps(document)
    state = ray_json.parse_nodes(text)
    usable = ray_json.parse_cluster_status(text)
    assert state is None or state.gpus_total >= 0
    assert usable is None or usable >= 0


def test_under_autoscaler_v2_the_status_has_no_report_and_the_formatted_one_counts() -> None:
    """Real Ray 2.60 with `RAY_enable_autoscaler_v2=1` (V2_head_start): `clusterStatus` is null
    for ever, which is no reading (it read as 0 usable GPUs, "Ray settling" for ever); the
    formatted status, `ray status`'s text, counts the head's GPU once it is listed."""
    for sample in answers("V2_head_start.jsonl", "/api/cluster_status"):
        if sample["path"].endswith("format=1"):
            continue
        assert ray_json.report_absent(sample["body"])
        assert ray_json.parse_cluster_status(sample["body"]) is None
    formatted = [
        ray_json.parse_formatted_status(s["body"])
        for s in answers("V2_head_start.jsonl", "/api/cluster_status")
        if s["path"].endswith("format=1")
    ]
    assert formatted[-1] == 1.0
    listed = [
        ray_json.parse_nodes(s["body"]) for s in answers("V2_head_start.jsonl", "/api/v0/nodes")
    ]
    assert listed[-1] is not None and listed[-1].gpus_total == 1.0
    # Autoscaler v1 writes a report: not absent.
    for sample in answers("E_kill_worker.jsonl", "/api/cluster_status"):
        assert not ray_json.report_absent(sample["body"])
