"""Docker behaviours the fakes share with the real daemon: the `restarting` state of a container
whose process keeps dying under a restart policy, with its backoff and events."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
from collections.abc import AsyncIterator
from pathlib import Path

import asyncssh
import pytest

from sparkd_sim import docker_views
from sparkd_sim.state import Container, HostState, new_container_id
from sparkd_sim.timing import Timing
from sparkd_sim.world import World
from tests.support.sim import connect, eventually, run


@pytest.fixture
async def crashloop(tmp_path: Path) -> AsyncIterator[World]:
    async with World(tmp_path / "world", scenario="seed-crashloop", timing=Timing.fast()) as w:
        yield w


async def _state(conn: asyncssh.SSHClientConnection, name: str) -> str:
    out = await run(conn, f"docker inspect --format '{{{{.State.Status}}}}' {name}")
    return out.stdout.strip()


async def test_crash_looping_glm_container_is_restarting_between_runs(
    crashloop: World,
) -> None:
    [glm] = crashloop.hosts["spark-a"].state.containers.values()
    async with await connect(crashloop, "spark-a") as head:

        async def restarting() -> bool:
            # Late in the loop, when docker's backoff is longer than these checks take.
            long = glm.restart_delay >= 0.5
            return long and await _state(head, "glm-flash") == "restarting"

        await eventually(restarting, within=20)
        ps = await run(head, "docker ps --format '{{.Names}}|{{.State}}|{{.Status}}'")
        name, state, status = ps.stdout.strip().split("|")
        assert (name, state) == ("glm-flash", "restarting")
        assert re.fullmatch(r"Restarting \(1\) (Less than a second|\d+ seconds?) ago", status)
        inspect = json.loads((await run(head, "docker inspect glm-flash")).stdout)[0]
        assert inspect["State"]["Restarting"] is True and inspect["State"]["Running"] is True
        assert inspect["State"]["Pid"] == 0 and inspect["State"]["ExitCode"] == 1
        assert inspect["RestartCount"] >= 1
        container_id = inspect["Id"]
        top = await run(head, "docker top glm-flash -eo pid,etimes,args")
        assert (top.exit_status, top.stdout) == (1, "")
        assert top.stderr == (
            f"Error response from daemon: Container {container_id} is restarting, wait until the "
            "container is running\n"
        )
        execd = await run(head, "docker exec glm-flash true")
        assert execd.exit_status == 1 and "is restarting" in execd.stderr
        busy = await run(head, "docker rm glm-flash")
        assert busy.exit_status == 1 and "You cannot remove a restarting container" in busy.stderr
        logs = await run(head, "docker logs --tail 1 glm-flash")
        assert "Engine core initialization failed" in logs.stdout
        removed = await run(head, "docker rm -f glm-flash")
        assert (removed.exit_status, removed.stdout) == (0, "glm-flash\n")
        assert (await run(head, "docker ps -a -q")).stdout == ""


async def test_restart_backoff_doubles_and_events_follow_docker(crashloop: World) -> None:
    t = crashloop.timing
    host = crashloop.hosts["spark-b"]
    [glm] = host.state.containers.values()
    async with await connect(crashloop, "spark-b") as worker:
        events = await worker.create_process(
            "timeout 20 docker events --format '{{json .}}' --filter container=glm-flash"
        )
        seen = []
        while len(seen) < 6:
            line = await asyncio.wait_for(events.stdout.readline(), 10)
            event = json.loads(line)
            # The stream may open between a die and its restart: it starts with that start.
            if seen or event["Action"] != "start":
                seen.append(event)
        events.terminate()
    assert [e["Action"] for e in seen] == ["die", "start"] * 3
    for e in seen:
        assert set(e) >= {"status", "id", "from", "Type", "Action", "Actor", "scope", "time"}
        assert e["id"] == glm.id and e["Actor"]["Attributes"]["name"] == "glm-flash"
    assert seen[0]["Actor"]["Attributes"]["exitCode"] == "1"
    # 100 ms, 200 ms, 400 ms... in real time; the same steps times the fast factor here.
    assert glm.restart_delay >= t.restart_backoff * 2
    assert glm.restart_delay <= t.restart_backoff_max


async def test_crash_loop_fault_and_stop(world: World, head: asyncssh.SSHClientConnection) -> None:
    message = await world.fault("crash-loop", "spark-a", "glm-flash")
    assert "glm-flash" in message

    async def restarting() -> bool:
        return await _state(head, "glm-flash") == "restarting"

    await eventually(restarting, within=10)
    stopped = await run(head, "docker stop glm-flash")
    assert stopped.exit_status == 0
    assert await _state(head, "glm-flash") == "exited"
    await asyncio.sleep(world.timing.restart_backoff * 4 + world.timing.crash_loop_run)
    assert await _state(head, "glm-flash") == "exited"
    await world.fault("heal", "spark-a")
    assert (await run(head, "docker start glm-flash")).exit_status == 0
    await asyncio.sleep(world.timing.crash_loop_run * 2)
    assert await _state(head, "glm-flash") == "running"


async def test_inspect_name_and_image_id_and_a_repulled_tag(
    world: World, head: asyncssh.SSHClientConnection, worker: asyncssh.SSHClientConnection
) -> None:
    glm_image = "hellohal2064/vllm-glm47-gb10:latest"
    fmt = "docker inspect --format '{{.Name}} {{.Image}}'"
    both = await run(head, f"{fmt} glm-flash glm-flash")
    assert both.exit_status == 0
    lines = both.stdout.splitlines()
    assert len(lines) == 2 and lines[0] == lines[1]
    name, image = lines[0].split()
    assert name == "/glm-flash" and re.fullmatch(r"sha256:[0-9a-f]{64}", image)
    by_tag = await run(head, f"docker image inspect --format '{{{{.Id}}}}' {glm_image}")
    assert by_tag.stdout == image + "\n"
    untagged = await run(
        head, "docker image inspect --format '{{.Id}}' hellohal2064/vllm-glm47-gb10"
    )
    assert untagged.stdout == image + "\n"
    by_id = await run(head, f"docker image inspect --format '{{{{.RepoTags}}}}' {image[7:19]}")
    assert by_id.stdout == f'["{glm_image}"]\n'
    missing = await run(head, "docker image inspect --format '{{.Id}}' nope:1")
    assert (missing.exit_status, missing.stdout) == (1, "\n")
    assert missing.stderr == (
        "Error response from daemon: no such image: nope:1: No such image: nope:1\n"
    )
    # Every host has the same image until a tag is re-pulled on one of them.
    other = await run(worker, f"docker image inspect --format '{{{{.Id}}}}' {glm_image}")
    assert other.stdout == by_tag.stdout
    await world.fault("repull-image", "spark-b", glm_image)
    moved = await run(worker, f"docker image inspect --format '{{{{.Id}}}}' {glm_image}")
    assert moved.stdout != by_tag.stdout and moved.stdout.startswith("sha256:")
    # The running container keeps the image it was created from.
    kept = await run(worker, f"{fmt} glm-flash")
    assert kept.stdout.split()[1] + "\n" == by_tag.stdout
    assert (await run(head, f"docker image inspect --format '{{{{.Id}}}}' {glm_image}")).stdout == (
        by_tag.stdout
    )


def test_the_fake_asks_for_sizes_when_the_real_cli_does() -> None:
    """The real CLI asks the daemon for sizes (`"Size":"0B (virtual 1.98MB)"`, seconds) for a
    template using `.Size`, `{{json .}}` included, unless `--size` is given either way; the fake
    walks its layers (`Timing.size_walk`) in the same cases, and prints the same `Size`."""
    real = Path(__file__).resolve().parent.parent / "fixtures" / "docker-real" / "size.jsonl"
    calls = [json.loads(line) for line in real.read_text().splitlines()]
    listings = [c for c in calls if c["cmd"].startswith("docker ps") and "json ." in c["cmd"]]
    assert len(listings) >= 4
    host = HostState("spark-a", "127.0.0.1", "head", "127.0.0.1", "eth0", "/tmp", "/root")
    box = Container(
        id=new_container_id(), name="fat", image="local/noray:1", command=["sleep"], labels={},
        env={}, mounts=[], restart="no", status="running", layer_bytes=10**9,
    )  # fmt: skip
    host.containers[box.id] = box
    for call in listings:
        asked = "(virtual " in call["stdout"]
        assert asked == ("--size=false" not in call["cmd"])
        args = shlex.split(call["cmd"])[2:]
        assert (docker_views.walked_bytes(host, args) > 0) == asked, call["cmd"]
        [line] = docker_views.ps(host, args).stdout.splitlines()
        real_size = json.loads(call["stdout"][call["stdout"].index("{") :])["Size"]
        fake_size = json.loads(line[line.index("{") :])["Size"]
        assert fake_size.endswith(")") == real_size.endswith(")")
        if not asked:
            assert fake_size == real_size == "0B"
