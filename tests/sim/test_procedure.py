"""The seed's manual procedure, by hand over real SSH, against the seed-morning world."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Awaitable, Callable

import asyncssh
import pytest

from sparkd_sim.reference import MODEL_ID
from sparkd_sim.timing import Timing
from sparkd_sim.world import World
from tests.sim.steps import HEAD, clean_up, ray_status, serve_command, start_ray
from tests.support.sim import PROBE, eventually, http, refused, run


async def test_relaunch_after_reboot_by_hand(
    world: World, head: asyncssh.SSHClientConnection, worker: asyncssh.SSHClientConnection
) -> None:
    address = world.hosts["spark-a"].address
    log = world.hosts["spark-a"].state.log_dir + "/serve.log"

    # Stale units and the old GLM containers that came back with the reboot.
    await clean_up(world, head, worker)
    assert (await run(head, "docker ps -a -q")).stdout == ""
    apps = "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader"
    assert (await run(head, apps)).stdout == ""

    # Ray head and worker, then 2 GPUs.
    await start_ray(world, head, worker)
    assert " 0.0/2.0 GPU" in (await ray_status(head)).stdout

    # vLLM: nothing listens while it loads.
    assert await refused(head, address, 30000)
    launched = await run(head, serve_command(world))
    assert (launched.exit_status, launched.stdout) == (0, "")

    async def loading() -> bool:
        text = (await run(head, f"cat {log}")).stdout
        return "Loading safetensors checkpoint shards:" in text

    await eventually(loading)
    assert await refused(head, "127.0.0.1", 30000)
    top = await run(head, f"docker top {HEAD} -eo pid,etimes,args")
    serve_rows = [line for line in top.stdout.splitlines() if "vllm serve" in line]
    assert len(serve_rows) == 1 and MODEL_ID in serve_rows[0]

    async def ready() -> bool:
        if await refused(head, "localhost", 30000):
            return False
        status, body = await http(head, "localhost", 30000, "GET", "/v1/models")
        return status == 200 and MODEL_ID in body

    await eventually(ready)
    text = (await run(head, f"cat {log}")).stdout
    assert re.search(r"Loading safetensors checkpoint shards:  41% Completed \| 16/39 \[", text)
    assert "Capturing CUDA graphs" in text
    assert text.rstrip().endswith("Application startup complete.")
    assert " 2.0/2.0 GPU" in (await ray_status(head)).stdout

    # The sanity probe reads content None, 50 tokens of reasoning: a healthy reasoning model.
    status, body = await http(head, address, 30000, "POST", "/v1/chat/completions", PROBE)
    assert status == 200
    answer = json.loads(body)
    message = answer["choices"][0]["message"]
    assert message["content"] is None
    assert message["reasoning"]
    assert answer["usage"]["completion_tokens"] == 50
    assert answer["choices"][0]["finish_reason"] == "length"


# vLLM's placement-group wait (1800 s, its first "Waiting" line at 10 s) scaled down to 5 s so the
# timeout itself is seen, the ratio of the two kept.
PG_WAIT = 5.0
SHORT_PG_WAIT = {"pg_wait_first": PG_WAIT * 10.0 / 1800.0, "pg_wait_timeout": PG_WAIT}


@pytest.mark.parametrize("timing", [dataclasses.replace(Timing.fast(), **SHORT_PG_WAIT)])
async def test_serve_waits_for_the_gpus_it_asks_for_then_fails_as_vllm_does(
    world: World, head: asyncssh.SSHClientConnection, worker: asyncssh.SSHClientConnection
) -> None:
    """vLLM 0.32.0 `v1/executor/ray_utils.py`: more GPUs asked for than the cluster has is a
    warning (line 613); the placement group then waits (`_wait_until_pg_ready`, "Waiting for
    creating a placement group" at 10, 30, 70 ... s) and fails only at PG_WAIT_TIMEOUT."""
    log = world.hosts["spark-a"].state.log_dir + "/serve.log"
    await clean_up(world, head, worker)
    await start_ray(world, head, worker)
    assert (await run(head, serve_command(world, tp=4))).exit_status == 0

    async def said(text: str) -> bool:
        return text in (await run(head, f"cat {log}")).stdout

    async def serving() -> bool:
        top = await run(head, f"docker top {HEAD} -eo pid,args")
        return "vllm serve" in top.stdout

    await eventually(lambda: said("No current placement group found."))
    assert await said("exceeds the total number of available GPUs in the placement group."), (
        await run(head, f"cat {log}")
    ).stdout
    await eventually(lambda: said("Waiting for creating a placement group of specs"))
    assert await serving(), "vLLM waits for its placement group; it has not exited"
    await eventually(lambda: said("ValueError: Cannot provide a placement group requiring 4.0"))
    await eventually(lambda: serving_not(serving))
    assert await refused(head, "localhost", 30000)


async def serving_not(serving: Callable[[], Awaitable[bool]]) -> bool:
    return not await serving()


async def test_unknown_serve_flag_fails_like_argparse(
    world: World, head: asyncssh.SSHClientConnection, worker: asyncssh.SSHClientConnection
) -> None:
    await clean_up(world, head, worker)
    await start_ray(world, head, worker)
    inner = f"docker exec {HEAD} vllm serve {MODEL_ID} --enable-reasoning-parser"
    result = await run(head, inner)
    assert result.exit_status == 2
    assert "vllm: error: unrecognized arguments: --enable-reasoning-parser" in result.stderr
