"""Ray in the simulated containers: registration delays, the 2.60 status layout, dead-node lag."""

from __future__ import annotations

import asyncio
import json
import re
import time

import asyncssh

from sparkd_sim.world import World
from tests.sim.conftest import eventually, run, sample
from tests.sim.steps import (
    HEAD,
    WORKER,
    clean_up,
    ray_head_command,
    ray_status,
    ray_worker_command,
    start_ray,
)


def _shape(text: str) -> list[str]:
    """A `ray status` text with its variable parts (ids, numbers, time) blanked."""
    text = re.sub(r"node_[0-9a-f]{56}", "node_ID", text)
    text = re.sub(r"\d+(\.\d+)?", "N", text)
    return text.splitlines()


async def test_head_registers_after_its_start_delay(
    world: World, head: asyncssh.SSHClientConnection
) -> None:
    started = time.monotonic()
    assert (await run(head, ray_head_command(world))).exit_status == 0
    early = await ray_status(head)
    assert early.exit_status == 1
    assert "Could not find any running Ray instance" in early.stderr

    async def registered() -> bool:
        return (await ray_status(head)).exit_status == 0

    await eventually(registered)
    assert time.monotonic() - started >= world.timing.head_answer


async def test_two_nodes_match_the_ray_260_layout(
    world: World, head: asyncssh.SSHClientConnection, worker: asyncssh.SSHClientConnection
) -> None:
    await clean_up(world, head, worker)
    await start_ray(world, head, worker)
    status = await ray_status(head)
    assert _shape(status.stdout) == _shape(sample("ray-status-active.txt"))
    assert " 0.0/2.0 GPU" in status.stdout
    listed = await run(head, f"docker exec {HEAD} ray list nodes --format=json")
    nodes = json.loads(listed.stdout)
    real = json.loads(sample("ray-list-nodes.json"))
    assert [sorted(n) for n in nodes] == [sorted(n) for n in real]
    assert {n["node_ip"]: n["is_head_node"] for n in nodes} == {
        world.hosts["spark-a"].state.data_ip: True,
        world.hosts["spark-b"].state.data_ip: False,
    }
    assert {n["state"] for n in nodes} == {"ALIVE"}
    assert all(n["resources_total"]["GPU"] == 1.0 for n in nodes)
    assert all(re.fullmatch(r"\d+\.\d{3} GiB", n["resources_total"]["memory"]) for n in nodes)


async def test_older_layout_is_a_world_setting(
    world: World, head: asyncssh.SSHClientConnection, worker: asyncssh.SSHClientConnection
) -> None:
    world.ray.layout = "healthy"
    await clean_up(world, head, worker)
    assert (await run(head, ray_head_command(world))).exit_status == 0

    async def one_node() -> bool:
        return " GPU" in (await ray_status(head)).stdout

    await eventually(one_node)
    status = await ray_status(head)
    assert _shape(status.stdout) == _shape(sample("ray-status-healthy.txt"))


async def test_list_nodes_needs_the_dashboard(
    world: World, head: asyncssh.SSHClientConnection
) -> None:
    command = ray_head_command(world, extra="--include-dashboard=false")
    assert (await run(head, command)).exit_status == 0

    async def up() -> bool:
        return (await ray_status(head)).exit_status == 0

    await eventually(up)
    listed = await run(head, f"docker exec {HEAD} ray list nodes --format=json")
    assert listed.exit_status == 2
    assert listed.stdout == ""
    assert listed.stderr.startswith("Usage: ray list [OPTIONS]")
    assert "Error: Failed to make request to http://127.0.0.1:8265/api/v0/nodes" in listed.stderr


async def test_worker_without_a_head_retries_for_ever(
    world: World, worker: asyncssh.SSHClientConnection
) -> None:
    assert (await run(worker, ray_worker_command(world))).exit_status == 0
    await asyncio.sleep(world.timing.gcs_reconnect_timeout * 1.5)
    ps = await run(worker, f"docker ps -a --filter name={WORKER} --format '{{{{.Status}}}}'")
    assert ps.stdout.startswith("Up ")
    logs = await run(worker, f"docker logs --tail 5 {WORKER}")
    assert "Failed to connect to GCS at address" in logs.stdout


async def test_dead_worker_lags_then_is_dead_and_a_restart_rejoins_as_a_new_node(
    world: World, head: asyncssh.SSHClientConnection, worker: asyncssh.SSHClientConnection
) -> None:
    await clean_up(world, head, worker)
    await start_ray(world, head, worker)
    listed = json.loads(
        (await run(head, f"docker exec {HEAD} ray list nodes --format=json")).stdout
    )
    old_worker_id = next(n["node_id"] for n in listed if not n["is_head_node"])
    assert (await run(worker, f"docker rm -f {WORKER}")).exit_status == 0
    died = time.monotonic()
    # Ray keeps counting the dead worker until its heartbeats time out.
    still = await ray_status(head)
    assert " 0.0/2.0 GPU" in still.stdout

    async def dropped() -> bool:
        return " 0.0/1.0 GPU" in (await ray_status(head)).stdout

    await eventually(dropped)
    assert time.monotonic() - died >= world.timing.dead_uncounted * 0.9
    status = await ray_status(head)
    assert _shape(status.stdout) == _shape(sample("ray-status-worker-lost.txt"))
    nodes = json.loads((await run(head, f"docker exec {HEAD} ray list nodes --format=json")).stdout)
    dead = next(n for n in nodes if n["node_id"] == old_worker_id)
    real_dead = next(
        n for n in json.loads(sample("ray-list-nodes-worker-dead.json")) if n["state"] == "DEAD"
    )
    assert (dead["state"], dead["state_message"]) == ("DEAD", real_dead["state_message"])

    assert (await run(worker, ray_worker_command(world))).exit_status == 0

    async def rejoined() -> bool:
        return " 0.0/2.0 GPU" in (await ray_status(head)).stdout

    await eventually(rejoined)
    nodes = json.loads((await run(head, f"docker exec {HEAD} ray list nodes --format=json")).stdout)
    alive_workers = [n for n in nodes if not n["is_head_node"] and n["state"] == "ALIVE"]
    assert len(alive_workers) == 1 and alive_workers[0]["node_id"] != old_worker_id


async def test_workers_of_a_restarted_head_do_not_rejoin(
    world: World, head: asyncssh.SSHClientConnection, worker: asyncssh.SSHClientConnection
) -> None:
    await clean_up(world, head, worker)
    await start_ray(world, head, worker)
    assert (await run(head, f"docker rm -f {HEAD}")).exit_status == 0
    assert (await run(head, ray_head_command(world))).exit_status == 0

    async def head_back() -> bool:
        return " 0.0/1.0 GPU" in (await ray_status(head)).stdout

    await eventually(head_back)

    async def worker_gave_up() -> bool:
        ps = await run(worker, f"docker ps -a --filter name={WORKER} --format '{{{{.State}}}}'")
        return ps.stdout == "exited\n"

    await eventually(worker_gave_up)
    assert " 0.0/1.0 GPU" in (await ray_status(head)).stdout


async def test_ray_outside_a_container_is_not_installed(head: asyncssh.SSHClientConnection) -> None:
    result = await run(head, "ray status")
    assert result.exit_status == 127
