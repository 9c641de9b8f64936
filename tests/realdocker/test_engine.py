"""sparkd's Docker commands against a real Docker engine, as on a Spark: each built by the
catalogue, sent over the host's SSH server, its output read by sparkd's own parsers. What the
fake `docker` cannot prove: that those commands mean to dockerd what sparkd takes them to mean,
and that sparkd reads what the real CLI prints."""

from __future__ import annotations

import re
import shlex
import time

import pytest

from sparkd.core.reading import parsers
from sparkd.core.spec import container_name, ray_spec_hash
from sparkd.shell import catalogue
from sparkd_sim import real_docker
from tests.realdocker.conftest import Tier, start_ray

pytestmark = [pytest.mark.realdocker, pytest.mark.asyncio(loop_scope="module")]

IMAGE_ID = re.compile(r"^sha256:[0-9a-f]{64}$")


async def test_start_ray_runs_the_node_container_and_the_fact_script_reads_it(clean: Tier) -> None:
    rc, out, err = await clean.run(start_ray(clean))
    assert rc == 0, err
    assert re.fullmatch(r"[0-9a-f]{64}\n", out), out
    reading = await clean.read()
    name = container_name(clean.cluster, clean.host)
    ours = [c for c in reading.facts.containers if c.name == name]
    assert len(ours) == 1, reading.facts.containers
    node = ours[0]
    assert node.state == "running"
    assert node.status.startswith("Up ")
    assert node.image == real_docker.IMAGE
    assert node.labels == {
        "sparkd.cluster": clean.cluster.name,
        "sparkd.role": "head",
        "sparkd.spec": ray_spec_hash(clean.cluster, clean.host),
    }
    # Its image by ID, from `docker inspect` of the container and of the tag alike.
    rc, tag_id, _ = await clean.daemon.docker(
        "image", "inspect", "--format", "{{.Id}}", real_docker.IMAGE
    )
    assert rc == 0 and IMAGE_ID.match(tag_id.strip()), tag_id
    assert reading.facts.image_id == tag_id.strip()
    assert node.image_id == tag_id.strip()
    assert reading.facts.images == (real_docker.IMAGE,)
    # `docker top` listed its processes with their ages: the container's start.
    assert node.started_at is not None and node.started_at <= time.time()
    rc, inspected, _ = await clean.daemon.docker(
        "inspect",
        "--format",
        "{{.HostConfig.NetworkMode}} {{.HostConfig.RestartPolicy.Name}}",
        name,
    )
    assert inspected.split() == ["host", "no"]
    assert reading.extras is not None and not reading.extras.serve.running


async def test_a_missing_image_fails_the_run_and_reads_as_absent(clean: Tier) -> None:
    missing = clean.cluster.model_copy(
        update={"ray": clean.cluster.ray.model_copy(update={"image": "local/not-here:3"})}
    )
    rc, _, err = await clean.run(catalogue.actions.start_ray(missing, clean.host, 20).command)
    # `--pull=never`: no registry is asked; the engine refuses at once and creates nothing.
    assert rc == 125
    assert "No such image: local/not-here:3" in err
    assert "Unable to find image" not in err
    reading = await clean.read(missing)
    assert reading.facts.error is None
    assert reading.facts.images == ()
    assert reading.facts.image_id is None
    assert reading.facts.containers == ()


async def test_remove_container_kills_at_once_and_a_missing_one_is_no_error(clean: Tier) -> None:
    rc, _, err = await clean.run(start_ray(clean))
    assert rc == 0, err
    name = container_name(clean.cluster, clean.host)
    since = time.time()
    rc, out, err = await clean.run(catalogue.actions.remove_container(name, 20).command)
    assert (rc, out) == (0, f"{name}\n"), err
    events = await clean.events(since, "--filter", f"container={name}")
    actions = [(e["action"], e.get("signal") or e.get("exitCode")) for e in events]
    # SIGKILL at once: no SIGTERM and 10 s wait for a PID 1 without a handler; exit 137.
    assert actions == [("kill", "9"), ("die", "137"), ("destroy", None)], events
    # Forced, a container already gone is no failure (the message only goes to stderr).
    rc, out, err = await clean.run(catalogue.actions.remove_container(name, 20).command)
    assert (rc, out, err) == (0, "", f"Error response from daemon: No such container: {name}\n")


async def test_a_stopped_daemon_is_docker_down_on_a_host_that_answers(clean: Tier) -> None:
    assert clean.world.real_docker is not None
    await clean.world.real_docker.stop_daemon(clean.host.name)
    rc, _, err = await clean.run(
        shlex.join(["docker", "ps", "-a", "--no-trunc", "--format", "{{json .}}"])
    )
    assert (rc, err) == (
        1,
        f"Cannot connect to the Docker daemon at {clean.daemon.url}. "
        "Is the docker daemon running?\n",
    )
    # Docker down is its own finding (the judgement's "unknown never acts"): the host answers,
    # what needs Docker is unknown, and the model is still probed.
    reading = await clean.read()
    assert reading.facts.error is None
    assert reading.facts.docker_error is not None
    assert "Cannot connect to the Docker daemon" in reading.facts.docker_error


async def test_a_restarting_container_has_no_processes_and_never_a_restart_event(
    clean: Tier,
) -> None:
    """A stale server under `--restart=always` that dies at start-up, as the seed-crashloop
    morning has it: between its runs `docker top` fails, and that is "no processes", not an
    unreadable host."""
    since = time.time()
    rc, _, err = await clean.daemon.docker(
        "run", "-d", "--name", "glm-flash", "--network", "host", "--restart=always",
        real_docker.IMAGE, "sh", "-c", "exit 3",
    )  # fmt: skip
    assert rc == 0, err
    deadline = time.monotonic() + 20
    while True:
        assert time.monotonic() < deadline, "never caught between two runs"
        script = catalogue.reads.fact_script(clean.cluster, clean.host, 5, read_ray=False)
        _, out, _ = await clean.run(script.command)
        sections = parsers.parse_sections(out)
        top = sections.get("top glm-flash")
        # (Asked as it exits, `top` may also fail with `ttrpc: closed: unknown`: unread.)
        if top is not None and "is restarting" in top.body:
            break
    rc, container_id, _ = await clean.daemon.docker("inspect", "--format", "{{.Id}}", "glm-flash")
    assert top.rc == 1
    assert top.body.strip() == (
        f"Error response from daemon: Container {container_id.strip()} is restarting, "
        "wait until the container is running"
    )
    # Listed as running by `docker ps` (so its `top` was asked), restarting by `docker ps -a`.
    assert "glm-flash" in sections["running"].body.split()
    reading = await clean.read()
    assert reading.facts.error is None
    [glm] = [c for c in reading.facts.containers if c.name == "glm-flash"]
    assert glm.state in ("restarting", "running")
    assert re.fullmatch(r"Restarting \(3\) .+ ago|Up .+", glm.status), glm.status
    events = await clean.events(since, "--filter", "container=glm-flash")
    actions = [e["action"] for e in events if e["action"] in ("start", "die", "restart")]
    assert actions[:4] == ["start", "die", "start", "die"], actions
    assert "restart" not in actions
    assert {e["exitCode"] for e in events if e["action"] == "die"} == {"3"}


async def test_the_leftover_check_sees_a_running_daemon(tier: Tier) -> None:
    """What the tier's teardown asserts empty: while the daemon runs it names it, its
    containerd and its mounts."""
    assert tier.world.real_docker is not None
    found = tier.world.real_docker.leftovers()
    assert any(item.startswith("dockerd spark-a") for item in found), found
    assert any(item.startswith("mount ") for item in found), found
    assert sum(item.startswith("process ") for item in found) >= 2, found


async def test_a_host_without_nvidias_runtime_fails_the_run_and_the_next_one_replaces_it(
    clean: Tier,
) -> None:
    """Docker creates the container before it finds no GPU driver: the run fails with 125 and
    leaves it `created`, with sparkd's labels. The next `start_ray` removes it first."""
    real = clean.world.real_docker
    assert real is not None
    await real.stop_daemon(clean.host.name)
    await real.start_daemon(clean.host.name, gpu_hook=False)
    try:
        rc, _, err = await clean.run(start_ray(clean))
        assert rc == 125
        assert 'could not select device driver "" with capabilities: [[gpu]]' in err
        reading = await clean.read()
        [node] = reading.facts.containers
        assert (node.name, node.state, node.running) == (
            container_name(clean.cluster, clean.host),
            "created",
            False,
        )
        assert node.labels["sparkd.spec"] == ray_spec_hash(clean.cluster, clean.host)
    finally:
        await real.stop_daemon(clean.host.name, keep_containers=True)
        await real.start_daemon(clean.host.name)
    [left] = (await clean.read()).facts.containers
    assert left.state == "created"
    rc, _, err = await clean.run(start_ray(clean))
    assert rc == 0, err
    [node] = (await clean.read()).facts.containers
    assert node.state == "running"
