"""The simulator's `docker` against the real one: the same commands (sparkd's, from the
catalogue, and the failures sparkd reads) on a host of each, their shapes compared: exit codes,
error texts, JSON field names and types, table headers. The fast tiers run on the fake, so it
must not drift from what the real CLI prints."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from sparkd.core.reading import discover, parsers
from sparkd.core.spec import container_name, ray_spec_hash
from sparkd.shell import catalogue
from sparkd.shell.ssh import SshPool
from sparkd_sim.real_docker import IMAGE
from sparkd_sim.world import World
from tests.realdocker.conftest import FIRST_ADDRESS, Tier
from tests.support.live import cluster_of
from tests.support.shapes import json_shape

pytestmark = [pytest.mark.realdocker, pytest.mark.asyncio(loop_scope="module")]

Result = tuple[int, str, str]
# The CLI of this machine kind, and of tests/fixtures/docker-real.
CLIENT = "28"
# Container IDs differ between the two; everything else in an error text must not.
CONTAINER_ID = re.compile(r"\b[0-9a-f]{64}\b")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fake(tier: Tier, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Tier]:
    """A simulated host like the tier's, with the fake `docker` and the tier's image."""
    rc, version, _ = await tier.daemon.docker("version", "--format", "{{.Client.Version}}")
    if rc != 0 or not version.startswith(f"{CLIENT}."):
        # Older clients word their errors otherwise (Debian's 20.10: `Error: No such image`).
        why = f"the fake follows the {CLIENT}.x CLI it was captured with; this one is {version!r}"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    first = FIRST_ADDRESS.rsplit(".", 2)[0] + ".96.2"
    world = World(tmp_path_factory.mktemp("fake") / "world", hosts=1, scenario="empty",
                  first_address=first)  # fmt: skip
    pool = SshPool(reconnect_initial=0.05, reconnect_max=0.5)
    async with world:
        world.hosts["spark-a"].state.images.add(IMAGE)
        loaded = cluster_of(world)
        cluster = loaded.model_copy(update={"ray": tier.cluster.ray})
        yield Tier(world, cluster, pool)
        await pool.close()


def json_shapes(text: str) -> list[Any]:
    """Each line's JSON shape; a `docker ps` line's after its state and names."""
    return [
        json_shape(json.loads(parsers.container_json(line) or line))
        for line in text.splitlines()
        if line.strip()
    ]


def plain(result: Result) -> Result:
    rc, out, err = result
    return rc, CONTAINER_ID.sub("<id>", out), CONTAINER_ID.sub("<id>", err)


async def both(real: Tier, fake: Tier, command: str) -> tuple[Result, Result]:
    return await real.run(command), await fake.run(command)


async def test_the_fact_script_reads_alike(clean: Tier, fake: Tier) -> None:
    for tier in (clean, fake):
        rc, out, err = await tier.run(
            catalogue.actions.start_ray(tier.cluster, tier.host, 20).command
        )
        assert rc == 0 and re.fullmatch(r"[0-9a-f]{64}\n", out), err
    real, sim = [
        parsers.parse_sections(
            (
                await t.run(
                    catalogue.reads.fact_script(t.cluster, t.host, 5, read_ray=False).command
                )
            )[1]
        )
        for t in (clean, fake)
    ]
    for name in ("containers", "image", "running", "ours_image"):
        assert (real[name].rc, sim[name].rc) == (0, 0), name
    assert json_shapes(sim["containers"].body) == json_shapes(real["containers"].body)
    # The template's own fields before the JSON: state and names, as words.
    words = [[line.split()[:2] for line in s["containers"].body.splitlines()] for s in (real, sim)]
    assert words[0] == words[1]
    head = container_name(clean.cluster, clean.host)
    assert real["running"].body.split() == sim["running"].body.split() == [head]
    header = {name: section.body.splitlines()[0].split() for name, section in
              ((n, s[f"top {head}"]) for n, s in (("real", real), ("sim", sim)))}  # fmt: skip
    assert header["sim"] == header["real"] == ["PID", "ELAPSED", "TIME", "COMMAND"]
    for sections in (real, sim):
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", sections["image"].body.strip())
        assert re.fullmatch(rf"/{head} sha256:[0-9a-f]{{64}}", sections["ours_image"].body.strip())


async def test_the_spec_label_is_read_alike(clean: Tier, fake: Tier) -> None:
    """What the executor reads before and after `docker run`: running, and the spec label."""
    for tier in (clean, fake):
        rc, _, err = await tier.run(
            catalogue.actions.start_ray(tier.cluster, tier.host, 20).command
        )
        assert rc == 0, err
    head = container_name(clean.cluster, clean.host)
    for tier in (clean, fake):
        rc, out, err = await tier.run(catalogue.reads.inspect_container(head, 20).command)
        assert (rc, out, err) == (0, f"true {ray_spec_hash(tier.cluster, tier.host)}\n", "")


FAILURES = {
    "image_missing": "docker image inspect --format '{{.Id}}' local/not-here:3",
    "image_missing_untagged": "docker image inspect --format '{{.Id}}' local/not-here",
    "inspect_missing": "docker inspect --format '{{.Name}} {{.Image}}' -- nope",
    "exec_missing": "docker exec nope true",
    "top_missing": "docker top nope -eo pid,etimes,times,args",
    "rm_missing": catalogue.actions.remove_container("nope", 20).command,
    "rm_unforced_missing": "docker rm nope",
}


@pytest.mark.parametrize("name", sorted(FAILURES))
async def test_failures_print_alike(clean: Tier, fake: Tier, name: str) -> None:
    real, sim = await both(clean, fake, FAILURES[name])
    assert plain(sim) == plain(real)


async def test_a_run_of_a_missing_image_fails_alike(clean: Tier, fake: Tier) -> None:
    ray = clean.cluster.ray.model_copy(update={"image": "local/not-here:3"})
    missing = clean.cluster.model_copy(update={"ray": ray})
    real = await clean.run(catalogue.actions.start_ray(missing, clean.host, 20).command)
    sim = await fake.run(catalogue.actions.start_ray(missing, fake.host, 20).command)
    assert plain(sim) == plain(real)


async def test_a_killed_container_answers_alike(clean: Tier, fake: Tier) -> None:
    head = container_name(clean.cluster, clean.host)
    for tier in (clean, fake):
        rc, _, err = await tier.run(
            catalogue.actions.start_ray(tier.cluster, tier.host, 20).command
        )
        assert rc == 0, err
    events = [
        asyncio.create_task(
            stream(t, catalogue.reads.docker_events(catalogue.reads.EVENTS_SPAN).command)
        )
        for t in (clean, fake)
    ]
    await asyncio.sleep(1.0)
    real, sim = await both(clean, fake, f"docker rm {head}")
    assert plain(sim) == plain(real)
    real, sim = await both(clean, fake, f"docker kill {head}")
    assert plain(sim) == plain(real)
    for command in (
        f"docker top {head}",
        f"docker exec {head} true",
        f"docker kill {head}",
    ):
        real, sim = await both(clean, fake, command)
        assert plain(sim) == plain(real), command
    real_events, sim_events = await asyncio.gather(*events)
    actions = {"real": real_events, "sim": sim_events}
    assert [e["Action"] for e in actions["sim"]] == [e["Action"] for e in actions["real"]]
    assert [json_shape(e) for e in actions["sim"]] == [json_shape(e) for e in actions["real"]]


async def stream(tier: Tier, command: str) -> list[dict[str, Any]]:
    """A `docker events` stream as sparkd's event watch reads it, for three seconds."""
    lines: list[str] = []
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(3.0):
            async for line in tier.conn.lines(command):
                lines.append(line)
    return [json.loads(line) for line in lines if line.startswith("{")]


async def test_a_hand_made_container_inspects_alike(clean: Tier, fake: Tier) -> None:
    """`sparkd init`'s read of a container: `docker inspect` without a format, the engine's
    whole object (moby api/types/container/container.go `InspectResponse`), and what
    core.reading.discover takes from it."""
    found = []
    for tier in (clean, fake):
        run = [
            "docker", "run", "-d", "--name", "ray-head", "--network", "host", "--gpus", "all",
            "--shm-size", "16g", "--restart", "unless-stopped", "-e", "NCCL_SOCKET_IFNAME=eth9",
            IMAGE, "ray", "start", "--block", "--head", "--node-ip-address=192.0.2.7",
        ]  # fmt: skip
        rc, _, err = await tier.run(shlex.join(run))
        assert rc == 0, err
        rc, out, err = await tier.run("docker inspect --type container -- ray-head")
        assert rc == 0, err
        found.append(out)
    real, sim = (json.loads(text) for text in found)
    assert list(sim[0]) == list(real[0])
    for part in ("State", "Mounts"):
        assert json_shape(sim[0][part]) == json_shape(real[0][part]), part
    for part in ("Config", "HostConfig"):
        missing = set(real[0][part]) - set(sim[0][part])
        read = {"Image", "Env", "Cmd", "Entrypoint", "RestartPolicy", "NetworkMode", "ShmSize",
                "DeviceRequests", "Runtime", "Privileged", "IpcMode", "Binds"}  # fmt: skip
        assert not missing & read, (part, missing)
        # The entrypoint is the image's: the tier's has none (null), the simulated one NVIDIA's.
        for key in read & set(real[0][part]) - {"Entrypoint"}:
            assert json_shape(sim[0][part][key]) == json_shape(real[0][part][key]), key
    ours = [discover.parse_inspect(text)[0] for text in found]
    # The image's entrypoint differs (the simulated one has NVIDIA's); the rest reads alike.
    assert ours[0].argv[-5:] == ours[1].argv[-5:]
    assert [(o.gpus, o.restart, o.shm_size, o.network, dict(o.env).get("NCCL_SOCKET_IFNAME"))
            for o in ours] == [(True, "unless-stopped", 16 << 30, "host", "eth9")] * 2  # fmt: skip
