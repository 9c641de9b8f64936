"""A remote tool that never returns: `timeout -k` ends it on the host, the fact script reports
the rest, and a hung `docker ps` never passes for "no containers"."""

from __future__ import annotations

import time

import pytest

from sparkd.core.deciding.planner import plan
from sparkd.core.reading import parsers
from sparkd.core.reading.assemble import unreadable
from sparkd.model.memory import Memory
from sparkd.shell import catalogue
from sparkd.shell.observe import observe, tool_timeout
from sparkd.shell.ssh import SshFailure, SshPool
from tests.support.live import TIMEOUT_RC, Live, cluster_of, released
from tests.support.sim import eventually

# Each tool gets a third of this: one second, the shortest a `timeout` here allows.
COMMAND_TIMEOUT = 3.0


async def test_a_hung_tool_is_killed_and_the_other_sections_arrive(
    healthy: Live, pool: SshPool
) -> None:
    world = healthy.world
    cluster = cluster_of(world, ssh={"command_timeout": COMMAND_TIMEOUT})
    assert tool_timeout(cluster) == 1.0
    await world.fault("hang-tool", "spark-a", "nvidia-smi")

    head = cluster.head
    script = catalogue.reads.fact_script(cluster, head, tool_timeout(cluster))
    started = time.monotonic()
    result = await pool.connection(head, cluster.ssh).run(script.command, timeout=COMMAND_TIMEOUT)
    took = time.monotonic() - started
    sections = parsers.parse_sections(result.stdout)
    assert sections["gpu_apps"].rc == TIMEOUT_RC
    # grep over sysfs exits 2 for the unused GID rows (EINVAL), as on every real host: the
    # fabric section's lines are its facts, whatever its status.
    others = {name: s.rc for name, s in sections.items() if name not in ("gpu_apps", "fabric")}
    assert set(others) >= {"boot_id", "units", "containers", "ray_nodes", "serve_log"}
    assert "ray_status" not in others  # the node list answered: no second `ray` call
    assert set(others.values()) == {0}, others
    assert sections["fabric"].body.strip()
    # The hung tool cost its own timeout, not the kill grace too. The other tools' share is
    # whatever the machine's load makes it (more than a second at a load of 10).
    assert 1.0 <= took < tool_timeout(cluster) + catalogue.remote.KILL_GRACE, took
    await eventually(lambda: released(world), within=2)

    # Through observe: the head is readable and the plan does not change for want of GPU apps.
    observed = await observe(cluster, pool)
    facts_a = observed.host("spark-a")
    assert facts_a is not None and facts_a.reachable
    assert facts_a.boot_id == world.hosts["spark-a"].state.boot_id
    assert {c.name for c in facts_a.containers} == {"sparkd-sparks-ray-head"}
    assert observed.serve is not None and observed.serve.running
    assert plan(cluster, observed, Memory(), observed.observed_at).actions == ()


async def test_a_failed_container_listing_is_not_read_as_no_containers(
    healthy: Live, pool: SshPool
) -> None:
    """Read as "no containers", it would have sparkd start (so first remove) a running head."""
    world = healthy.world
    cluster = cluster_of(world, ssh={"command_timeout": COMMAND_TIMEOUT})
    await world.fault("hang-tool", "spark-a", "docker ps")
    observed = await observe(cluster, pool)

    # The host answered, Docker did not: its own finding (not an unreachable host), and the
    # containers are unknown rather than none.
    head = observed.host("spark-a")
    assert head is not None and head.reachable
    assert head.docker_error is not None
    assert head.docker_error.startswith("docker failed (timed out)")
    assert observed.serve is None
    worker = observed.host("spark-b")
    assert worker is not None and worker.reachable
    result = plan(cluster, observed, Memory(), observed.observed_at)
    assert result.actions == (), result.reason
    assert "spark-a (head) is up but Docker is not answering" in result.reason
    await eventually(lambda: released(world), within=2)


async def test_a_hung_docker_top_makes_gpu_owners_unknown_never_foreign(
    healthy: Live, pool: SshPool
) -> None:
    """Without `docker top`, sparkd's own Ray workers must not pass for foreign GPU processes:
    their owner is unknown, they are never killed, and the host stays readable."""
    world = healthy.world
    cluster = cluster_of(
        world, ssh={"command_timeout": COMMAND_TIMEOUT}, policy={"allow_kill_foreign_gpu": True}
    )
    await world.fault("hang-tool", "spark-a", "docker top")
    observed = await observe(cluster, pool)

    head = observed.host("spark-a")
    assert head is not None and head.reachable
    assert head.gpu_processes and all(p.owner_unknown for p in head.gpu_processes)
    result = plan(cluster, observed, Memory(), observed.observed_at)
    assert "kill_gpu_process" not in [a.kind for a in result.actions], result.reason
    assert "unknown owner" in result.reason
    await eventually(lambda: released(world), within=2)


def sections(text: str) -> dict[str, parsers.Section]:
    return parsers.parse_sections(text.replace("|", "\n"))


def test_a_container_that_stopped_after_listing_is_no_reason_to_distrust_the_host() -> None:
    listed = "@@sparkd boot_id|b|@@sparkd-end boot_id 0|@@sparkd containers|"
    listed += "@@sparkd-end containers 0"
    running = "|@@sparkd running|gone|@@sparkd-end running 0|@@sparkd top gone|"
    stopped = "Error response from daemon: Container 0123 is not running|@@sparkd-end top gone 1"
    assert unreadable(sections(listed + running + stopped)) is None
    # One container's failed or missing `top` leaves the host readable; its processes' owner is
    # unknown (tested in tests/unit/test_assemble.py).
    broken = "Cannot connect to the Docker daemon|@@sparkd-end top gone 1"
    assert unreadable(sections(listed + running + broken)) is None
    assert unreadable(sections(listed + "|@@sparkd running|gone|@@sparkd-end running 0")) is None
    no_list = unreadable(sections("@@sparkd boot_id|b|@@sparkd-end boot_id 0"))
    assert no_list is not None and no_list.detail == "fact script printed no containers section"


async def test_a_big_writable_layer_does_not_slow_the_container_listing(
    healthy: Live, pool: SshPool
) -> None:
    """`{{json .}}` touches `.Size`, so the CLI asks the daemon for every container's size
    unless `--size` is given either way (docker/cli v29.7.2 cli/command/container/list.go); the
    daemon then walks every writable layer, a stopped container's too (`-a`): 6.5-8.6 s for one
    layer of 150,000 files (tests/fixtures/docker-real/size.jsonl), past the tool timeout."""
    world = healthy.world
    cluster = cluster_of(world, ssh={"command_timeout": COMMAND_TIMEOUT})
    await world.fault("big-layer", "spark-a", "100")
    head = cluster.head
    connection = pool.connection(head, cluster.ssh)

    # The listing as sparkd asked for it before: the walk outlasts the tool's timeout.
    old = catalogue.remote.cmd(["docker", "ps", "-a", "--no-trunc", "--format", "{{json .}}"], 1.0)
    with pytest.raises(SshFailure) as failed:
        await connection.run(old, timeout=COMMAND_TIMEOUT)
    assert failed.value.result is not None and failed.value.result.exit_status == TIMEOUT_RC

    script = catalogue.reads.fact_script(cluster, head, tool_timeout(cluster))
    result = await connection.run(script.command, timeout=COMMAND_TIMEOUT)
    sections = parsers.parse_sections(result.stdout)
    assert sections["containers"].rc == 0
    listed = {c.name: c for c in parsers.parse_docker_ps(sections["containers"].body)}
    assert listed["old-build"].state == "exited"
    assert listed["sparkd-sparks-ray-head"].state == "running"
    assert sections["running"].body.split() == ["sparkd-sparks-ray-head"]
