"""Assembling a host's facts from fact-script sections: ownership and the races between tools."""

from __future__ import annotations

from sparkd.core.reading import parsers
from sparkd.core.reading.assemble import head_extras, host_facts
from tests.toy import reference_cluster

TOP = "PID ELAPSED COMMAND\n{rows}"


def sections(**bodies: str) -> dict[str, parsers.Section]:
    return {name.replace("__", " "): parsers.Section(body, 0) for name, body in bodies.items()}


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
        "now": parsers.Section("1000", 0),
        "boot_id": parsers.Section("b", 0),
        "containers": parsers.Section("", 0),
        "running": parsers.Section(name, 0),
        f"top {name}": parsers.Section(TOP.format(rows="7 120 ray::RayWorkerWrapper"), 0),
        "gpu_apps": parsers.Section("7, ray::RayWorkerWrapper, 1052", 0),
        "gpu_apps_after": parsers.Section("7, ray::RayWorkerWrapper, 1052", 0),
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
        "now": parsers.Section("5000", 0),  # the host's clock runs 100 s behind ours
        "ray_status": parsers.Section("nothing", 1),
        f"top {name}": parsers.Section(TOP.format(rows="42 30 /usr/bin/python3 vllm serve /m"), 0),
        "serve_spec": parsers.Section("abc\n", 0),
        "serve_log": parsers.Section(log, 0),
        "serve_log_mtime": parsers.Section("4990", 0),
    }
    extras = head_extras(cluster, parsed, 5100.0)
    serve = extras.serve
    assert serve.running and serve.pid == 42 and serve.elapsed_seconds == 30.0
    assert serve.spec_hash == "abc"
    assert serve.progress is not None
    assert (serve.progress.stage, serve.progress.percent) == ("weights", 10.0)
    assert serve.progress.progress_at == 5090.0
    assert extras.ray.error == "nothing"


def _with_running(*names: str, **extra: parsers.Section) -> dict[str, parsers.Section]:
    parsed = {
        "now": parsers.Section("1000", 0),
        "boot_id": parsers.Section("b", 0),
        "containers": parsers.Section("", 0),
        "running": parsers.Section("\n".join(names), 0),
        "gpu_apps": parsers.Section("4100, python3, [N/A]", 0),
        "gpu_apps_after": parsers.Section("4100, python3, [N/A]", 0),
    }
    parsed.update(extra)
    return parsed


def test_restarting_container_owns_no_processes_and_the_host_stays_readable() -> None:
    from sparkd.core.reading.assemble import unreadable

    cluster = reference_cluster()
    restarting = parsers.Section(
        "Error response from daemon: Container "
        + "f" * 64
        + " is restarting, wait until the container is running",
        1,
    )
    parsed = _with_running("glm-flash", **{"top glm-flash": restarting})
    assert unreadable(parsed) is None
    got = host_facts(cluster, cluster.head, parsed, 1000.0)
    assert [(p.pid, p.owner_unknown) for p in got.gpu_processes] == [(4100, False)]


def test_one_failed_top_makes_unattributed_gpu_processes_owner_unknown() -> None:
    from sparkd.core.reading.assemble import unreadable

    cluster = reference_cluster()
    broken = parsers.Section("Error response from daemon: i/o timeout", 1)
    parsed = _with_running("glm-flash", **{"top glm-flash": broken})
    assert unreadable(parsed) is None
    got = host_facts(cluster, cluster.head, parsed, 1000.0)
    assert got.reachable
    assert [(p.pid, p.owner_unknown) for p in got.gpu_processes] == [(4100, True)]


def test_failed_reads_are_unknown_with_the_cause_and_a_privilege_hint() -> None:
    cluster = reference_cluster()
    units = parsers.Section(
        "Failed to get properties: Interactive authentication required.\n"
        "See system logs and 'systemctl status vllm-cluster.service' for details.",
        1,
    )
    smi = parsers.Section("", 124)
    got = host_facts(cluster, cluster.head, _with_running(units=units, gpu_apps=smi), 1000.0)
    assert got.units == ()
    assert got.units_error is not None
    assert "Interactive authentication required" in got.units_error
    assert "ssh.sudo" in got.units_error
    assert got.gpu_error is not None and "timed out" in got.gpu_error
    assert got.gpu_processes == ()


def test_engine_cpu_time_counts_the_serve_and_engine_processes_only() -> None:
    cluster = reference_cluster()
    name = "sparkd-sparks-ray-head"
    top = (
        "PID ELAPSED TIME COMMAND\n"
        "1 900 40 /usr/bin/python3 /usr/local/bin/ray start --block --head\n"
        "50 600 120 /usr/bin/python3 /usr/local/bin/vllm serve /models/q --port 8000\n"
        "51 590 300 VLLM::EngineCore\n"
        "60 580 200 ray::RayWorkerWrapper.execute_method\n"
    )
    parsed = {
        "now": parsers.Section("1000", 0),
        f"top {name}": parsers.Section(top, 0),
        "serve_log": parsers.Section("Loading safetensors checkpoint shards:  41% Completed\n", 0),
    }
    serve = head_extras(cluster, parsed, 1000.0).serve
    assert serve.running and serve.pid == 50
    assert serve.cpu_seconds == 620.0


def test_image_ids_of_the_tag_and_of_the_running_container() -> None:
    cluster = reference_cluster()
    tag = "sha256:" + "1" * 64
    running = "sha256:" + "2" * 64
    row = (
        '{"Names":"sparkd-sparks-ray-head","Image":"hellohal2064/vllm-qwen3.5-gb10",'
        '"State":"running","Labels":"sparkd.cluster=sparks","Status":"Up 2 hours"}'
    )
    parsed = _with_running(
        containers=parsers.Section(row, 0),
        image=parsers.Section(tag + "\n", 0),
        ours_image=parsers.Section(f"/sparkd-sparks-ray-head {running}\n", 0),
    )
    got = host_facts(cluster, cluster.head, parsed, 1000.0)
    assert got.image_id == tag
    box = got.container("sparkd-sparks-ray-head")
    assert box is not None and box.image_id == running


def test_kernel_log_and_memory_reach_the_host_facts() -> None:
    cluster = reference_cluster()
    xid = (
        "[  812.402121] spark-b kernel: NVRM: Xid (PCI:000f:01:00): 79, pid='<unknown>', "
        "name=<unknown>, GPU has fallen off the bus."
    )
    got = host_facts(
        cluster,
        cluster.head,
        sections(
            boot_id="b",
            containers="",
            running="",
            kernel=xid,
            meminfo="MemTotal:       125488340 kB\nMemAvailable:    2097152 kB\n",
        ),
        1000.0,
    )
    assert got.kernel is not None and [e.xid for e in got.kernel.events] == [79]
    assert got.kernel_error is None
    assert (got.memory_available_bytes, got.memory_total_bytes) == (2 << 30, 125488340 * 1024)


def test_a_kernel_log_that_failed_or_hides_the_system_journal_is_unknown() -> None:
    cluster = reference_cluster()
    base = {"boot_id": parsers.Section("b", 0), "containers": parsers.Section("", 0)}
    failed = host_facts(
        cluster,
        cluster.head,
        {**base, "kernel": parsers.Section("bash: journalctl: command not found", 127)},
        1000.0,
    )
    assert failed.kernel is None and "journalctl" in (failed.kernel_error or "")
    hidden = host_facts(
        cluster,
        cluster.head,
        {
            **base,
            "kernel": parsers.Section(
                "Hint: You are currently not seeing messages from other users and the system.\n"
                "-- No entries --",
                0,
            ),
        },
        1000.0,
    )
    assert hidden.kernel is None and "systemd-journal" in (hidden.kernel_error or "")
    assert hidden.memory_available_bytes is None
