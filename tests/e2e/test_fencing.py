"""Host fencing against the simulated world over SSH: without `[ha]` the commands are exactly
the catalogue's; with it, every mutating command carries the owner's token, the hosts are swept
before the first action, and a host holding a newer token refuses (exit 76) with no effect."""

from __future__ import annotations

import re
from pathlib import Path

from sparkd.model.cluster import ClusterSpec
from sparkd.runtime.controller import Controller
from sparkd.shell import catalogue, forced
from sparkd.shell.catalogue.fence import FenceToken
from sparkd.shell.fencing import HostFence
from sparkd.shell.ssh import SshPool
from sparkd_sim.world import World
from tests.support.daemon import controller, converge, eventually, mutations

ETCD = 987654321
PREFIX = re.compile(
    re.escape(catalogue.fence.FENCE_FUNCTION)
    + r"; sparkd_fence (\S+) (\d+) (\d+) (\S+) \d+ && \{ (.*)\n\} 9>&-",
    re.S,
)


def allowed(cluster: ClusterSpec, host: str, command: str) -> bool:
    spec = cluster.host(host)
    rules = forced.allowed_commands(cluster, spec)
    return command in rules.exact or any(re.fullmatch(p, command) for p in rules.patterns)


def sent(world: World, host: str) -> list[str]:
    return [r.command for r in world.commands(host) if r.source == "ssh"]


async def test_without_ha_every_command_is_the_catalogues_own(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    ctl = controller(seed_world, pool, tmp_path / "state")
    plans = await converge(ctl)
    assert plans[-1].phase == "healthy"
    assert mutations(seed_world)
    for host in ("spark-a", "spark-b"):
        for command in sent(seed_world, host):
            if command.startswith("docker events"):
                continue  # the long-lived watch is not started by converge()
            assert "sparkd_fence" not in command and "sparkd-unfenced" not in command
            assert allowed(ctl.cluster, host, command), command[:200]


class Owner:
    """The token a controller's commands carry, given up once a host refuses it."""

    def __init__(self, token: int) -> None:
        self.fence: FenceToken | None = FenceToken("unset", token, ETCD, "ops-a")
        self.refused: list[tuple[str, str]] = []

    def token(self) -> FenceToken | None:
        return self.fence

    def lost(self, host: str, detail: str) -> None:
        self.refused.append((host, detail))
        self.fence = None


def fenced_controller(world: World, pool: SshPool, state: Path, owner: Owner) -> Controller:
    ctl = controller(world, pool, state)
    assert owner.fence is not None
    owner.fence = FenceToken(ctl.cluster.name, owner.fence.token, ETCD, "ops-a")
    fence = HostFence(ctl.cluster, pool, token=owner.token)

    def lost(host: str, detail: str) -> None:
        owner.lost(host, detail)
        ctl.requests.fenced(host, detail)

    fence.on_fenced = lost
    ctl.fence = fence
    ctl.executor.fence = fence
    return ctl


def record_path(world: World, host: str, cluster: str) -> Path:
    return Path(world.host(host).state.home) / catalogue.fence.FENCE_DIR / cluster


async def test_with_ha_the_hosts_are_swept_first_and_every_mutation_carries_the_token(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    owner = Owner(41)
    ctl = fenced_controller(seed_world, pool, tmp_path / "state", owner)
    plans = await converge(ctl)
    assert plans[-1].phase == "healthy" and owner.refused == []
    name = ctl.cluster.name
    for host in ("spark-a", "spark-b"):
        commands = sent(seed_world, host)
        assert "sparkd_fence" in commands[0] and commands[0].endswith("true\n} 9>&-")
        carried = 0
        for command in commands[1:]:
            match = PREFIX.fullmatch(command)
            if match is None:
                assert "sparkd_fence" not in command
                assert allowed(ctl.cluster, host, command), command[:200]
                continue
            carried += 1
            assert match.group(1, 2, 3, 4) == (name, "41", str(ETCD), "ops-a")
            inner = match.group(5)
            assert inner == "true" or allowed(ctl.cluster, host, inner), inner[:200]
            assert inner == "true" or not allowed(ctl.cluster, host, command)
        assert carried > 0
        assert record_path(seed_world, host, name).read_text() == f"41 {ETCD} ops-a\n"
    # Reads are never fenced; every command that changed a host came in a fenced one.
    first_mutation = min(r.at for r in mutations(seed_world))
    sweeps = [r.at for r in seed_world.commands() if r.source == "ssh" and "true\n}" in r.command]
    assert len(sweeps) == 2 and max(sweeps) < first_mutation


async def test_a_host_holding_a_newer_token_refuses_and_nothing_is_spent(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    owner = Owner(41)
    ctl = fenced_controller(seed_world, pool, tmp_path / "state", owner)
    assert (await converge(ctl))[-1].phase == "healthy"
    name = ctl.cluster.name
    # A newer owner's sweep reached the worker while this one still believes it owns.
    record_path(seed_world, "spark-b", name).write_text(f"43 {ETCD} ops-b\n")
    attempts = ctl.memory.attempts
    await seed_world.fault("kill-container", "spark-b", "sparkd-sparks-ray-worker")
    since = max(r.at for r in seed_world.commands())

    async def refused() -> bool:
        await ctl.cycle()
        return bool(owner.refused)

    await eventually(refused, within=30)
    assert owner.refused[0][0] == "spark-b"
    assert "refused token 41: a newer one is recorded" in owner.refused[0][1]
    assert mutations(seed_world, "spark-b", since=since) == []
    outcome = ctl.view.recent[0]
    assert outcome.result == "skipped" and outcome.detail.startswith("fenced: spark-b")
    assert ctl.memory.attempts == attempts  # no budget spent
    events = ctl.state.read_events_counted(50, name)[0]
    assert any(e["kind"] == "fenced" and e["host"] == "spark-b" for e in events)
    # No longer the owner: nothing more is sent to change anything.
    for _ in range(3):
        await ctl.cycle()
    assert mutations(seed_world, since=since) == []
    assert record_path(seed_world, "spark-b", name).read_text() == f"43 {ETCD} ops-b\n"


async def test_an_owner_from_mid_look_sweeps_and_looks_again_before_acting(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    owner = Owner(41)
    ctl = fenced_controller(seed_world, pool, tmp_path / "state", owner)
    token, owner.fence = owner.fence, None

    def acquired(_: Controller) -> None:
        owner.fence = token  # the lease came through while the hosts were being read

    ctl.on_plan = acquired
    plan = await ctl.cycle()
    assert plan.actions  # the cold start has work to do
    assert mutations(seed_world) == [] and list(ctl.view.recent) == []
    assert not [
        r for r in seed_world.commands() if r.source == "ssh" and "sparkd_fence" in r.command
    ]
    ctl.on_plan = lambda _: None
    await ctl.cycle()
    sweeps = [r.at for r in seed_world.commands() if r.source == "ssh" and "true\n}" in r.command]
    assert len(sweeps) == 2 and mutations(seed_world)
    assert max(sweeps) < min(r.at for r in mutations(seed_world))
