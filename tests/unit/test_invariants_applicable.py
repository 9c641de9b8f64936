"""Invariant 4, only actions that can apply, and 7, silent stages have their own limits: checked
on generated clusters (healthy, loading, stalled, serve gone) and as named cases."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from sparkd.core.deciding.planner import plan
from sparkd.core.judging.model_stage import ORPHAN_GRACE
from sparkd.core.judging.ray_stage import needs_ray_status
from sparkd.core.reading.assemble import head_extras, host_facts
from sparkd.core.reading.parsers import parse_sections
from sparkd.core.spec import container_name
from sparkd.model.memory import LoadMark, Memory
from sparkd.model.observed import LoadProgress, Observed
from sparkd.model.plan import MODEL_STARTS, RAY_STARTS
from sparkd.shell.catalogue.reads import fact_script
from tests.examples import EXAMPLE_SET
from tests.support.planning import (
    COMMON,
    STARTS,
    Placed,
    host,
    kinds,
    needs_a_human,
    situations,
    situations_at_a_host,
)
from tests.toy import Toy

# -- 4a: drift waits while the image is unsafe ---------------------------------------------------


@COMMON
@given(situations(), st.data())
def test_a_new_tag_not_pulled_everywhere_restarts_nothing(
    s: tuple[Toy, Memory, float], data: st.DataObject
) -> None:
    toy, memory, now = s
    new = toy.cluster.model_copy(
        update={"ray": toy.cluster.ray.model_copy(update={"image": "vllm/vllm-openai:v0.33.0"})}
    )
    names = [h.name for h in new.hosts]
    lacking = data.draw(st.sets(st.sampled_from(names), min_size=1))
    for name in names:
        if name not in lacking:
            toy.images[name].append("vllm/vllm-openai:v0.33.0")
    result = plan(new, toy.observe(), memory, now)
    drift = [a for a in result.actions if a.kind in STARTS and "drift" in a.reason]
    assert not drift, result.reason
    assert "image" in result.reason


def test_drift_rolls_once_ray_then_model_when_the_image_arrives() -> None:
    toy, memory = next(e for e in EXAMPLE_SET if e.name == "healthy-reasoning-only").build()
    new = toy.cluster.model_copy(
        update={"ray": toy.cluster.ray.model_copy(update={"image": "vllm/vllm-openai:v0.33.0"})}
    )
    toy.images["spark-a"].append("vllm/vllm-openai:v0.33.0")
    waiting = plan(new, toy.observe(), memory, toy.now)
    assert waiting.actions == ()
    assert "spec drift" in waiting.reason and "waits until the image" in waiting.reason
    toy.images["spark-b"].append("vllm/vllm-openai:v0.33.0")
    rolling = plan(new, toy.observe(), memory, toy.now + 5)
    assert [a.kind for a in rolling.actions] == ["restart_ray", "restart_ray"]


# -- 4b: no start on a full disk -----------------------------------------------------------------


@COMMON
@given(situations_at_a_host(), st.data())
def test_nothing_starts_on_a_full_disk(s: Placed, data: st.DataObject) -> None:
    toy, memory, now, name = s
    free = data.draw(st.integers(0, toy.cluster.model.min_disk_free - 1))
    # The log dir's file system, or Docker's data root.
    which = data.draw(st.sampled_from(["disk_free_bytes", "docker_disk_free_bytes"]))
    observed = host(toy.observe(), name, **{which: free})
    result = plan(toy.cluster, observed, memory, now)
    assert not kinds(result, name) & RAY_STARTS
    assert "start_model" not in kinds(result)
    if toy.cluster.host(name).role == "head":
        assert not kinds(result) & MODEL_STARTS, result.reason
    assert f"disk full on {name} ({free} bytes free)" in result.reason
    assert needs_a_human(result)


def test_a_frozen_log_on_a_full_head_disk_is_not_a_stalled_load() -> None:
    toy, memory = next(e for e in EXAMPLE_SET if e.name == "load-stalled").build()
    assert "restart_model" in kinds(plan(toy.cluster, toy.observe(), memory, toy.now))
    observed = host(toy.observe(), "spark-a", disk_free_bytes=4096)
    result = plan(toy.cluster, observed, memory, toy.now)
    assert result.actions == ()
    assert result.phase == "blocked"
    assert "disk full on spark-a (4096 bytes free)" in result.reason


# -- 4c: a lost GPU is for a reboot --------------------------------------------------------------

LOST = (
    "gpu_apps failed (rc 15): Unable to determine the device handle for GPU0000:0F:01.0: "
    "Unknown Error",
    "gpu_apps failed (rc 15): Unable to determine the device handle for gpu 0000:0F:01.0: "
    "GPU is lost.  Reboot the system to recover this GPU",
    "gpu_apps failed (rc 15): GPU 00000000:0F:01.0: GPU has fallen off the bus.",
)
NO_DRIVER = (
    "gpu_apps failed (rc 9): NVIDIA-SMI has failed because it couldn't communicate with the "
    "NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."
)


@COMMON
@given(situations_at_a_host(), st.data())
def test_a_lost_gpu_blocks_every_start_and_says_reboot(s: Placed, data: st.DataObject) -> None:
    toy, memory, now, name = s
    observed = host(toy.observe(), name, gpu_error=data.draw(st.sampled_from(LOST)))
    result = plan(toy.cluster, observed, memory, now)
    assert not kinds(result) & STARTS, result.reason
    assert needs_a_human(result)
    assert f"the GPU of {name} is lost: needs a reboot of {name}" in result.reason


def test_a_driver_still_loading_is_unknown_not_lost() -> None:
    toy, memory = next(e for e in EXAMPLE_SET if e.name == "load-stalled").build()
    observed = host(toy.observe(), "spark-b", gpu_error=NO_DRIVER)
    result = plan(toy.cluster, observed, memory, toy.now)
    assert "lost" not in result.reason
    assert "unknown" in result.reason and "waiting" in result.reason
    # A hung load is still restarted: an unknown GPU list holds only a new model's start.
    assert "restart_model" in kinds(result)
    assert result.phase != "blocked"


# -- 4d: an orphaned engine holds the start ------------------------------------------------------


def _orphaned(seconds_ago: float) -> tuple[Toy, Observed, Memory]:
    toy, memory = next(e for e in EXAMPLE_SET if e.name == "healthy-reasoning-only").build()
    toy.serve_running = False
    toy.ready = False
    observed = toy.observe()
    assert observed.serve is not None
    serve = observed.serve.model_copy(
        update={"orphans": ("pid 41234 (VLLM::EngineCore)", "pid 41301 (ray::RayWorkerWrapper)")}
    )
    since = toy.now - seconds_ago
    return (
        toy,
        observed.model_copy(update={"serve": serve}),
        memory.model_copy(update={"ray_unsettled_since": since}),
    )


GRACE = ORPHAN_GRACE * Toy.healthy().cluster.ray.join_timeout


@COMMON
@given(st.floats(0, GRACE))
def test_no_model_start_while_an_orphaned_engine_holds_the_gpus(waited: float) -> None:
    toy, observed, memory = _orphaned(waited)
    result = plan(toy.cluster, observed, memory, toy.now)
    assert result.actions == ()
    assert "engine processes still hold the GPUs" in result.reason
    assert "VLLM::EngineCore" in result.reason
    assert result.learned.ray_unsettled


def test_an_engine_that_stays_is_cleared_by_restarting_ray() -> None:
    toy, observed, memory = _orphaned(GRACE + 5)
    result = plan(toy.cluster, observed, memory, toy.now)
    assert [(a.kind, a.host) for a in result.actions] == [
        ("restart_ray", "spark-a"),
        ("restart_ray", "spark-b"),
    ]
    assert "start_model" not in kinds(result)


def test_docker_roots_free_space_is_read_beside_the_log_dirs() -> None:
    toy = Toy.healthy()
    head = toy.cluster.head
    text = "".join(
        f"@@sparkd {name}\n{body}\n@@sparkd-end {name} {rc}\n"
        for name, body, rc in (
            ("boot_id", "b1", 0),
            ("containers", "", 0),
            ("running", "", 0),
            ("disk", "Avail\n512000000000\n512000000000", 0),
            ("docker_disk", "Avail\n40960", 0),
        )
    )
    seen = host_facts(toy.cluster, head, parse_sections(text), toy.now)
    assert (seen.disk_free_bytes, seen.docker_disk_free_bytes) == (512000000000, 40960)
    missing = text.replace("Avail\n40960", "df: /var/lib/docker: No such file or directory")
    missing = missing.replace("docker_disk 0", "docker_disk 1")
    unknown = host_facts(toy.cluster, head, parse_sections(missing), toy.now)
    assert unknown.docker_disk_free_bytes is None


def test_an_orphan_is_read_from_the_head_containers_processes() -> None:
    toy = Toy.healthy()
    head = container_name(toy.cluster, toy.cluster.head)
    text = (
        f"@@sparkd top {head}\n"
        "PID ELAPSED TIME COMMAND\n"
        "3001 3600 40 /usr/bin/python3 /usr/local/bin/ray start --head --block\n"
        "41234 900 721 VLLM::EngineCore\n"
        "41301 890 1800 ray::RayWorkerWrapper.execute_method\n"
        f"@@sparkd-end top {head} 0\n"
    )
    serve = head_extras(toy.cluster, parse_sections(text), toy.now).serve
    assert not serve.running
    assert serve.orphans == (
        "pid 41234 (VLLM::EngineCore)",
        "pid 41301 (ray::RayWorkerWrapper.execute_method)",
    )


# -- 7: silent stages have their own caps --------------------------------------------------------


def _capturing(entered_ago: float, cpu_risen: bool) -> tuple[Toy, Observed, Memory]:
    toy, memory = next(e for e in EXAMPLE_SET if e.name == "loading-40pct").build()
    observed = toy.observe()
    assert observed.serve is not None and observed.serve.elapsed_seconds is not None
    launch = toy.now - observed.serve.elapsed_seconds
    key = "graph_capture|None|Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)"
    serve = observed.serve.model_copy(
        update={
            "progress": LoadProgress(
                stage="graph_capture", message=key.split("|")[2], progress_at=toy.now - 5
            ),
            "cpu_seconds": 5000.0 if cpu_risen else 4000.0,
        }
    )
    mark = LoadMark(
        pid=observed.serve.pid,
        launch=launch,
        key=key,
        cpu_seconds=4000.0,
        at=toy.now - 5,
        entered=toy.now - entered_ago,
    )
    return (
        toy,
        observed.model_copy(update={"serve": serve}),
        memory.model_copy(update={"load_mark": mark}),
    )


@COMMON
@given(st.floats(0, 1), st.booleans())
def test_a_capture_that_burns_cpu_is_restarted_after_its_own_cap(
    share: float, cpu_risen: bool
) -> None:
    toy = Toy.healthy()
    cap = toy.cluster.model.graph_capture_timeout
    stall = toy.cluster.model.load_stall
    # Inside the cap, burning CPU is work; past it, it may be a spin-waiting NCCL hang.
    entered = stall + share * (toy.cluster.model.load_timeout - stall)
    toy, observed, memory = _capturing(entered, cpu_risen)
    result = plan(toy.cluster, observed, memory, toy.now)
    restarted = "restart_model" in kinds(result)
    if entered > cap:
        assert restarted, result.reason
        assert "CUDA-graph capture" in result.reason and "cap" in result.reason
    elif cpu_risen:
        assert not restarted, result.reason


def test_cpu_of_an_earlier_launchs_engine_is_not_this_launchs_progress() -> None:
    toy = Toy.healthy()
    head = container_name(toy.cluster, toy.cluster.head)

    def look(old_cpu: str, new_cpu: str) -> float | None:
        text = (
            f"@@sparkd top {head}\n"
            "PID ELAPSED TIME COMMAND\n"
            "5150 300 60 /usr/bin/python3 /usr/local/bin/vllm serve /models/q\n"
            f"41234 7200 {old_cpu} VLLM::EngineCore\n"
            f"5200 290 {new_cpu} VLLM::EngineCore\n"
            f"@@sparkd-end top {head} 0\n"
        )
        return head_extras(toy.cluster, parse_sections(text), toy.now).serve.cpu_seconds

    # The orphan of the previous launch spins; this launch's engine does not move.
    assert look("3600", "120") == look("5400", "120")
    assert look("3600", "120") == 60 + 120


# -- 9: one Ray read per look during a load ------------------------------------------------------


def _ray_calls(script: str) -> tuple[int, int]:
    """(`ray` calls always run, ones run only when the node list failed)."""
    # Each `ray` call is a section of its own (`s ray_nodes ...`, `s ray_status ...`).
    calls = re.findall(r'(if \[ "\$rc" != 0 \]; then )?s ray_\w+ ', script)
    guarded = sum(1 for guard in calls if guard)
    return len(calls) - guarded, guarded


@COMMON
@given(situations())
def test_a_look_after_a_ready_ray_runs_one_ray_call(s: tuple[Toy, Memory, float]) -> None:
    toy, memory, now = s
    last = plan(toy.cluster, toy.observe(), memory, now)
    head = toy.cluster.head
    ray_status = needs_ray_status(last)
    script = fact_script(toy.cluster, head, 10, ray_status).command
    always, fallback = _ray_calls(script)
    if last.learned.ray_ready:
        # The node list, and `ray status` only if the list failed.
        assert (always, fallback) == (1, 1), script
    else:
        # Settling: a just-listed node's GPU is placeable only once `ray status` counts it.
        assert always == 2


def test_a_load_on_a_ready_ray_reads_only_the_node_list() -> None:
    toy, memory = next(e for e in EXAMPLE_SET if e.name == "loading-40pct").build()
    last = plan(toy.cluster, toy.observe(), memory, toy.now)
    assert last.phase == "loading" and last.learned.ray_ready
    assert not needs_ray_status(last)
