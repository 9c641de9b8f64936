"""`sparkd init` against a hand-made deployment in the simulated world, over real SSH: the
operator's own containers (`ray-head`, `ray-worker`, not sparkd's names or labels) and `vllm
serve` started in the head with `docker exec -d`. The draft describes what runs, `check-config`
accepts it, and reading it changed nothing on the hosts."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import asyncssh

from sparkd.runtime.controller import Controller
from sparkd.runtime.state import StateDir
from sparkd.settings import load_settings
from sparkd.shell.ssh import SshPool
from sparkd_sim.reference import INTERFACE, MODEL_ID, QWEN_IMAGE, STALE_UNITS
from sparkd_sim.world import World
from tests.support.daemon import FAST_EXECUTOR, fast_cluster, mutations
from tests.support.live import live_world


async def _sparkd(*args: str) -> tuple[int, str, str]:
    """The CLI in a process of its own; the world's SSH servers run on this event loop."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sparkd.cli", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode(), err.decode()


async def _init(world: World, known_hosts: Path) -> tuple[int, str, str]:
    hosts = [f"{h.address}:{h.port}" for h in world.hosts.values()]
    return await _sparkd(
        "init", "--ssh-user", world.user, "--key", str(world.client_key_path),
        "--known-hosts", str(known_hosts), *hosts,
    )  # fmt: skip


async def _launched(world: World) -> float:
    """Once the operator's deployment runs (their `docker exec -d` is logged once the serve
    process runs): the time from which every command is init's."""
    await world.brought_up()
    for _ in range(200):
        if any(r.command.startswith("vllm serve") for r in world.commands()):
            return time.time()
        await asyncio.sleep(0.05)
    raise AssertionError("the operator's `vllm serve` never ran")


async def test_init_drafts_the_hand_made_deployment_and_check_config_accepts_it(
    tmp_path: Path,
) -> None:
    async with live_world(tmp_path / "world", "hand-made") as world:
        began = await _launched(world)
        head, worker = world.hosts.values()
        rc, text, err = await _init(world, world.known_hosts_path)
        assert rc == 0, err
        # Read only: not one command that changes a host.
        assert mutations(world, since=began) == []

        config = tmp_path / "sparkd.toml"
        config.write_text(text.replace('"/var/lib/sparkd"', f'"{tmp_path / "state"}"'))
        rc, _, err = await _sparkd("check-config", "--config", str(config))
        assert rc == 0, err + text

        cluster = load_settings(config).clusters[0]
        assert [(h.address, h.port, h.role, h.data_ip, h.interface) for h in cluster.hosts] == [
            (head.address, head.port, "head", head.state.data_ip, INTERFACE),
            (worker.address, worker.port, "worker", worker.state.data_ip, INTERFACE),
        ]
        assert cluster.ray.image == QWEN_IMAGE and cluster.ray.shm_size == "16g"
        assert cluster.ray.env == {
            "NCCL_SOCKET_IFNAME": INTERFACE,
            "GLOO_SOCKET_IFNAME": INTERFACE,
            "NCCL_IB_DISABLE": "0",
            "RAY_memory_monitor_refresh_ms": "0",
        }
        assert str(world.models_dir) + ":/models" in cluster.ray.mounts
        assert cluster.model.id == MODEL_ID
        assert (cluster.model.port, cluster.model.tensor_parallel_size) == (30000, 2)
        assert cluster.model.extra_args == (
            "--reasoning-parser", "qwen3", "--tool-call-parser", "qwen3_coder",
            "--enable-auto-tool-choice",
        )  # fmt: skip
        assert set(cluster.cleanup.units) == set(STALE_UNITS)
        assert "container ray-head: `ray start --head`" in text
        assert "docker top ray-head" in text
        assert "ray-head has --restart unless-stopped" in text
        # Every read answered: the image's env too (what ray.env leaves out).
        assert [line for line in text.splitlines() if line.startswith("# CHECK:")] == []


async def test_init_refuses_a_host_whose_key_is_not_known(tmp_path: Path) -> None:
    async with live_world(tmp_path / "world", "hand-made") as world:
        began = await _launched(world)
        empty = tmp_path / "known_hosts"
        empty.write_text("")
        rc, out, err = await _init(world, empty)
        assert rc != 0 and out == ""
        assert "SHA256:" in err and "not in known_hosts" in err
        # Refused before any login: nothing ran on a host.
        assert [r.command for r in world.commands() if r.at >= began] == []


async def test_init_writes_nothing_for_a_host_that_refuses_the_key(tmp_path: Path) -> None:
    async with live_world(tmp_path / "world", "hand-made") as world:
        await _launched(world)
        stranger = tmp_path / "stranger"
        stranger.write_bytes(asyncssh.generate_private_key("ssh-ed25519").export_private_key())
        stranger.chmod(0o600)
        hosts = [f"{h.address}:{h.port}" for h in world.hosts.values()]
        rc, out, err = await _sparkd(
            "init", "--ssh-user", world.user, "--key", str(stranger),
            "--known-hosts", str(world.known_hosts_path), *hosts,
        )  # fmt: skip
        assert rc != 0 and out == ""
        assert err.count("not read:") == 2, err


async def test_sparkd_on_the_drafted_config_adopts_and_changes_nothing(
    tmp_path: Path,
) -> None:
    # First contact end to end: the config `sparkd init` drafted, then sparkd itself on the
    # deployment it describes: no restart, no removal, `healthy`, one `adopted` event.
    async with live_world(tmp_path / "world", "hand-made") as world:
        began = await _launched(world)
        rc, text, err = await _init(world, world.known_hosts_path)
        assert rc == 0, err
        state = tmp_path / "state"
        config = tmp_path / "sparkd.toml"
        config.write_text(text.replace('"/var/lib/sparkd"', f'"{state}"'))
        pool = SshPool()
        try:
            cluster = fast_cluster(load_settings(config).clusters[0])
            ctl = Controller(cluster, pool, StateDir(state), executor_timing=FAST_EXECUTOR)
            plans = [await ctl.cycle()]
            for _ in range(300):
                if plans[-1].phase == "healthy":
                    break
                await asyncio.sleep(0.1)
                plans.append(await ctl.cycle())
        finally:
            await pool.close()
        assert plans[-1].phase == "healthy", [p.reason for p in plans]
        assert not [a for p in plans for a in p.actions], [p.reason for p in plans]
        assert mutations(world, since=began) == []
        adopted = [e for e in StateDir(state).read_events_counted(100)[0] if e["kind"] == "adopted"]
        assert len(adopted) == 1, adopted
