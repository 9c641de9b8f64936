"""The simulator switches these tests rely on: the `hang-tool` fault and per-run addresses."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from sparkd_sim.world import WRONG_IP_OFFSET, World
from tests.support.live import FIRST_ADDRESS, TIMEOUT_RC, released
from tests.support.sim import connect, eventually, run


async def test_hang_tool_holds_calls_until_their_caller_goes(seed_world: World) -> None:
    with pytest.raises(ValueError, match="hang-tool needs one of"):
        await seed_world.fault("hang-tool", "spark-a", "perl")
    await seed_world.fault("hang-tool", "spark-a", "nvidia-smi")
    async with await connect(seed_world, "spark-a") as head:
        hung = await run(head, "timeout -k 1 0.2 nvidia-smi -L; echo rc=$?")
        assert hung.stdout.strip() == f"rc={TIMEOUT_RC}"
        assert [c.argv for c in seed_world.hung_calls] == [["nvidia-smi", "-L"]]
        await eventually(lambda: released(seed_world), within=2)
        other = await run(head, "docker ps --format '{{.Names}}'")
        assert other.stdout.strip() == "glm-flash"
        await seed_world.fault("heal", "spark-a")
        healed = await run(head, "nvidia-smi -L")
        assert healed.exit_status == 0 and healed.stdout.startswith("GPU 0:")


async def test_hang_tool_with_arguments_hangs_only_those_calls(seed_world: World) -> None:
    await seed_world.fault("hang-tool", "spark-b", "docker ps")
    async with await connect(seed_world, "spark-b") as worker:
        hung = await run(worker, "timeout -k 1 0.2 docker ps -a; echo rc=$?")
        assert hung.stdout.strip() == f"rc={TIMEOUT_RC}"
        images = await run(worker, "docker images --format '{{.Repository}}'")
        assert images.exit_status == 0 and "hellohal2064/vllm-glm47-gb10" in images.stdout
    async with await connect(seed_world, "spark-a") as head:  # other hosts are unaffected
        assert (await run(head, "docker ps -q")).exit_status == 0
    await eventually(lambda: released(seed_world), within=2)


async def test_a_world_takes_its_addresses_from_first_address(seed_world: World) -> None:
    first = ipaddress.IPv4Address(FIRST_ADDRESS)
    assert [h.address for h in seed_world.hosts.values()] == [str(first), str(first + 1)]
    assert f'data_ip = "{first + 1}"' in seed_world.config_path.read_text()
    await seed_world.fault("wrong-ip", "spark-b")
    assert seed_world.hosts["spark-b"].state.ray_ip_override == str(first + 1 + WRONG_IP_OFFSET)


@pytest.mark.parametrize("address", ["127.0.0.1", "10.0.0.2", "127.255.200.2", "::1"])
def test_addresses_outside_the_loopback_block_are_refused(address: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        World(tmp_path / "world", first_address=address)
