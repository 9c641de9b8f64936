"""Fact parsers against the real tools' output (tests/fixtures/samples) and edge cases."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkd.core import text
from sparkd.core.reading import parsers

SAMPLES = Path(__file__).resolve().parent.parent / "fixtures" / "samples"


def sample(name: str) -> str:
    return (SAMPLES / name).read_text()


def command_output(name: str, command_prefix: str) -> str:
    """The lines after a `$ command` line in a multi-command sample, up to the next `$`."""
    out: list[str] = []
    taking = False
    for line in sample(name).splitlines():
        if line.startswith("$ "):
            taking = line[2:].startswith(command_prefix) and not out
            continue
        if taking:
            out.append(line)
    return "\n".join(out)


def test_systemctl_show_sample() -> None:
    units = parsers.parse_systemctl_show(command_output("systemctl-show.txt", "systemctl show"))
    assert [(u.name, u.active, u.enabled, u.exists) for u in units] == [
        ("vllm-cluster.service", True, True, True),
        ("vllm-proxy.service", False, False, True),
        ("vllm-reranker.service", False, False, False),
    ]


def test_docker_ps_sample() -> None:
    containers = parsers.parse_docker_ps(sample("docker-ps.jsonl"), {"glm-flash": 100.0})
    assert [(c.name, c.state, c.running) for c in containers] == [
        ("glm-flash", "running", True),
        ("sparkd-ray-head", "running", True),
        ("sparkd-ray-worker", "exited", False),
    ]
    head = containers[1]
    assert head.labels == {
        "sparkd.cluster": "sparks",
        "sparkd.role": "head",
        "sparkd.spec": "5e2c9a1f",
    }
    assert containers[0].started_at == 100.0
    assert containers[2].status == "Exited (137) 20 minutes ago"


def test_compute_apps_sample_with_owners() -> None:
    text = command_output("nvidia-smi-gb10.txt", "nvidia-smi --query-compute-apps")
    procs = parsers.parse_compute_apps(text, {48410: "sparkd-sparks-ray-head"})
    assert [(p.pid, p.name, p.used_memory_mib, p.container) for p in procs] == [
        (48213, "/usr/bin/python3", 96073, None),
        (48410, "ray::RayWorkerWrapper", 1052, "sparkd-sparks-ray-head"),
    ]


def test_compute_apps_na_memory_is_unknown() -> None:
    [proc] = parsers.parse_compute_apps("123, python3, [N/A]")
    assert proc.used_memory_mib is None


def test_compute_apps_free_gpu_prints_nothing() -> None:
    assert parsers.parse_compute_apps("") == ()


def test_ray_list_nodes_samples() -> None:
    healthy = parsers.parse_ray_nodes(sample("ray-list-nodes.json"))
    assert healthy is not None
    assert healthy.gpus_total == 2.0
    assert healthy.alive_ips == {"192.168.200.12", "192.168.200.13"}
    dead = parsers.parse_ray_nodes(sample("ray-list-nodes-worker-dead.json"))
    assert dead is not None
    assert dead.gpus_total == 1.0
    assert dead.alive_ips == {"192.168.200.12"}
    [gone] = [n for n in dead.nodes if not n.alive]
    assert gone.state_message is not None and "missing too many heartbeats" in gone.state_message


@pytest.mark.parametrize(
    ("name", "nodes", "gpus"),
    [
        ("ray-status-active.txt", 2, 2.0),
        ("ray-status-worker-lost.txt", 1, 1.0),
        ("ray-status-healthy.txt", 1, 1.0),
        # Idle nodes are live nodes: under autoscaler v2 a cluster with nothing scheduled
        # lists them all there.
        ("ray-status-v2-idle.txt", 2, 2.0),
    ],
)
def test_ray_status_layouts(name: str, nodes: int, gpus: float) -> None:
    state = parsers.parse_ray_status(sample(name))
    assert state is not None
    assert len(state.nodes) == nodes
    assert state.gpus_total == gpus
    assert state.ips_known is False


def test_ray_status_garbage() -> None:
    assert parsers.parse_ray_status("Could not find any running Ray instance.") is None
    assert parsers.parse_ray_nodes("Failed to connect to API server") is None


def test_sections_with_exit_codes_and_truncation() -> None:
    text = (
        "@@sparkd boot_id\nabc\n@@sparkd-end boot_id 0\n"
        "@@sparkd ray_nodes\nboom\n@@sparkd-end ray_nodes 1\n"
        "@@sparkd serve_log\nline 1\nline 2"
    )
    sections = parsers.parse_sections(text)
    assert sections["boot_id"].body == "abc" and sections["boot_id"].ok
    assert sections["ray_nodes"].rc == 1
    assert sections["serve_log"].rc is None and sections["serve_log"].body == "line 1\nline 2"


def test_docker_top_and_serve() -> None:
    text = (
        "PID        ELAPSED    COMMAND\n"
        "4100       930        /usr/bin/python3 /usr/local/bin/ray start --block\n"
        "5150       812        /usr/bin/python3 /usr/local/bin/vllm serve /models/Q\n"
    )
    rows = parsers.parse_docker_top(text)
    assert [r.pid for r in rows] == [4100, 5150]
    serve = parsers.find_serve(rows)
    assert serve is not None and serve.pid == 5150 and serve.elapsed == 812.0
    assert parsers.find_serve(rows[:1]) is None


def test_ip_addr_json() -> None:
    text = json.dumps(
        [
            {
                "ifname": "enp1s0f0np0",
                "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"],
                "operstate": "UP",
                "addr_info": [{"family": "inet", "local": "192.168.200.12", "prefixlen": 24}],
            }
        ]
    )
    iface = parsers.parse_ip_addr(text)
    assert iface is not None and iface.up and iface.addresses == ("192.168.200.12",)
    assert parsers.parse_ip_addr('Device "eth9" does not exist.') is None


def test_df() -> None:
    assert parsers.parse_df_avail("   Avail\n123456789\n") == 123456789
    assert parsers.parse_df_avail("df: /nope: No such file or directory") is None


LOG = (
    "INFO 11-29 15:01:02 [api_server.py:1] vLLM API server version 0.26.0\n"
    "Loading safetensors checkpoint shards:   0% Completed | 0/39 [00:00<?, ?it/s]\r"
    "Loading safetensors checkpoint shards:  41% Completed | 16/39 [02:21<03:25,  8.81s/it]\n"
)


def test_load_progress_weights() -> None:
    progress = parsers.parse_load_progress(parsers.log_lines(LOG), 1000.0)
    assert (progress.stage, progress.percent, progress.progress_at) == ("weights", 41.0, 1000.0)


def test_load_progress_capture_ready_failed() -> None:
    capture = LOG + "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  45%|####5 | 30/67\n"
    assert parsers.parse_load_progress(parsers.log_lines(capture), None).stage == "graph_capture"
    ready = capture + "INFO:     Application startup complete.\n"
    assert parsers.parse_load_progress(parsers.log_lines(ready), None).stage == "ready"
    # An OOM traceback alone is no verdict while the process runs: its exit is the evidence.
    oom = (
        capture
        + "Traceback (most recent call last):\n  x\ntorch.OutOfMemoryError: CUDA out of memory.\n"
    )
    assert parsers.parse_load_progress(parsers.log_lines(oom), None).stage == "graph_capture"
    failed = oom + (
        "RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {}\n"
    )
    progress = parsers.parse_load_progress(parsers.log_lines(failed), None)
    assert progress.stage == "failed"
    assert progress.message.startswith("RuntimeError: Engine core initialization failed")


def test_redaction() -> None:
    line = "args: --api-key s3cr3t Authorization: Bearer tok123 VLLM_API_KEY=abc other=x"
    redacted = text.redact(line, ["hunter2"])
    assert "s3cr3t" not in redacted and "tok123" not in redacted and "abc" not in redacted
    assert text.redact("the key is hunter2", ["hunter2"]) == "the key is ***"


def test_one_list_of_secret_patterns_masks_what_a_pdu_client_echoes_in_its_output() -> None:
    line = "login token: abc123 community=private1 --api-key=sk-1 max_num_batched_tokens=8192"
    said = text.redact(line, credentials=True)
    assert said == "login token: *** community=*** --api-key=*** max_num_batched_tokens=8192"
    # sparkd's own lines keep the fencing token (`token=N`): it is no secret.
    assert text.redact("fenced token=7 --api-key=sk-1") == "fenced token=7 --api-key=***"


@settings(max_examples=300, deadline=None)
@given(
    st.datetimes(
        min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(None)
    ),
    st.integers(-14 * 60, 14 * 60),
    st.integers(0, 999_999_999),
)
def test_stat_time_matches_the_calendar(moment: datetime, offset_minutes: int, nanos: int) -> None:
    zone = timezone(timedelta(minutes=offset_minutes))
    local = moment.replace(microsecond=0, tzinfo=zone)
    sign = "+" if offset_minutes >= 0 else "-"
    hours, minutes = divmod(abs(offset_minutes), 60)
    text = f"{local:%Y-%m-%d %H:%M:%S}.{nanos:09d} {sign}{hours:02d}{minutes:02d}"
    parsed = parsers.parse_stat_time(text)
    assert parsed is not None
    assert abs(parsed - (local.timestamp() + nanos / 1e9)) < 1e-6
