"""Assembling a host's facts from fact-script sections: ownership and the races between tools."""

from __future__ import annotations

from sparkd.core import facts
from sparkd.core.assemble import head_extras, host_facts
from tests.toy import reference_cluster

TOP = "PID ELAPSED COMMAND\n{rows}"


def sections(**bodies: str) -> dict[str, facts.Section]:
    return {name.replace("__", " "): facts.Section(body, 0) for name, body in bodies.items()}


def test_gpu_process_seen_once_is_not_judged() -> None:
    cluster = reference_cluster()
    got = host_facts(
        cluster,
        cluster.head,
        sections(
            now="1000",
            boot_id="b",
            containers="",
            running="sparkd-sparks-ray-head",
            top__sparkd_sparks_ray_head="",
            gpu_apps="7, ray::RayWorkerWrapper, 1052\n9, /usr/bin/python3, 96073",
            gpu_apps_after="9, /usr/bin/python3, 96073\n11, ray::New, 5",
        ),
        1000.0,
    )
    assert [p.pid for p in got.gpu_processes] == [9]


def test_gpu_process_owner_from_top() -> None:
    cluster = reference_cluster()
    name = "sparkd-sparks-ray-head"
    parsed = {
        "now": facts.Section("1000", 0),
        "boot_id": facts.Section("b", 0),
        "containers": facts.Section("", 0),
        "running": facts.Section(name, 0),
        f"top {name}": facts.Section(TOP.format(rows="7 120 ray::RayWorkerWrapper"), 0),
        "gpu_apps": facts.Section("7, ray::RayWorkerWrapper, 1052", 0),
        "gpu_apps_after": facts.Section("7, ray::RayWorkerWrapper, 1052", 0),
    }
    got = host_facts(cluster, cluster.head, parsed, 1000.0)
    assert [(p.pid, p.container) for p in got.gpu_processes] == [(7, name)]


def test_serve_progress_only_since_the_last_launch_and_clock_skew() -> None:
    cluster = reference_cluster()
    name = "sparkd-sparks-ray-head"
    log = (
        "Loading safetensors checkpoint shards: 100% Completed | 39/39\n"
        "INFO:     Application startup complete.\n"
        "=== sparkd launch abc ===\n"
        "Loading safetensors checkpoint shards:  10% Completed | 4/39\n"
    )
    parsed = {
        "now": facts.Section("5000", 0),  # the host's clock runs 100 s behind ours
        "ray_status": facts.Section("nothing", 1),
        f"top {name}": facts.Section(TOP.format(rows="42 30 /usr/bin/python3 vllm serve /m"), 0),
        "serve_spec": facts.Section("abc\n", 0),
        "serve_log": facts.Section(log, 0),
        "serve_log_mtime": facts.Section("4990", 0),
    }
    extras = head_extras(cluster, parsed, 5100.0)
    serve = extras.serve
    assert serve.running and serve.pid == 42 and serve.elapsed_seconds == 30.0
    assert serve.spec_hash == "abc"
    assert serve.progress is not None
    assert (serve.progress.stage, serve.progress.percent) == ("weights", 10.0)
    assert serve.progress.progress_at == 5090.0
    assert extras.ray.error == "nothing"
