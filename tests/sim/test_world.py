"""The world as a whole: its generated files, timing presets, scale, the CLI, per-call cost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import asyncssh
import pytest

from sparkd_sim.cli import main
from sparkd_sim.timing import FAST_FACTOR, Timing
from sparkd_sim.world import World, host_names
from tests.sim.conftest import connect, run

REPO = Path(__file__).resolve().parents[2]


def test_timing_presets_and_scale() -> None:
    fast, real = Timing.fast(), Timing.realistic()
    assert fast.model_load < 1
    # Measured with real Ray 2.60 (tests/fixtures/ray-real/README.md).
    assert real.head_answer == pytest.approx(4.4)
    assert 8 <= real.worker_listed <= 11 and 10 <= real.worker_counted <= 14
    assert (real.dead_listed, real.dead_uncounted) == (15.0, 24.0)
    assert 63 <= real.hung_listed <= 64 and 69 <= real.hung_uncounted <= 70
    assert real.model_load >= 60
    # The test preset keeps Ray's and Docker's real ratio to the recheck interval.
    for name in ("head_answer", "worker_listed", "dead_listed", "hung_listed", "head_mismatch"):
        assert getattr(fast, name) == pytest.approx(getattr(real, name) * FAST_FACTOR), name
    assert round(FAST_FACTOR, 6) == 0.04
    doubled = fast.scaled(2)
    assert doubled.worker_listed == pytest.approx(fast.worker_listed * 2)
    assert doubled.slow_load_factor == fast.slow_load_factor
    with pytest.raises(ValueError):
        fast.scaled(0)


def test_host_names() -> None:
    assert host_names(3) == ["spark-a", "spark-b", "spark-c"]
    assert host_names(28)[26:] == ["spark-aa", "spark-ab"]


async def test_generated_config_and_client_files(world: World) -> None:
    config = tomllib.loads(world.config_path.read_text())
    [cluster] = config["clusters"]
    assert cluster["name"] == "sparks"
    hosts = cluster["hosts"]
    assert [(h["name"], h["role"]) for h in hosts] == [("spark-a", "head"), ("spark-b", "worker")]
    for h in hosts:
        sim = world.hosts[h["name"]]
        assert (h["address"], h["port"], h["data_ip"]) == (sim.address, sim.port, sim.address)
        assert h["address"].startswith("127.0.0.")
    assert cluster["ssh"]["key_file"] == str(world.client_key_path)
    assert cluster["model"]["log_dir"] == world.hosts["spark-a"].state.log_dir
    # The documented example config has every key the simulator writes (no invented keys).
    example = tomllib.loads((REPO / "etc" / "sparkd" / "sparkd.toml").read_text())
    for section, values in cluster.items():
        if isinstance(values, dict):
            assert set(values) <= set(example["clusters"][0][section]), section
    assert set(config["daemon"]) <= set(example["daemon"]) | {"state_dir"}
    known = world.known_hosts_path.read_text().splitlines()
    assert known[0].startswith(f"[{world.hosts['spark-a'].address}]:{world.hosts['spark-a'].port} ")
    assert known[0].split()[1] == "ssh-ed25519"
    assert oct(world.client_key_path.stat().st_mode & 0o777) == "0o600"


async def test_wrong_key_and_wrong_user_are_refused(world: World, tmp_path: Path) -> None:
    h = world.hosts["spark-a"]
    stranger = asyncssh.generate_private_key("ssh-ed25519")
    with pytest.raises(asyncssh.PermissionDenied):
        await asyncssh.connect(
            h.address,
            h.port,
            username=world.user,
            client_keys=[stranger],
            known_hosts=str(world.known_hosts_path),
            config=None,
        )
    with pytest.raises(asyncssh.PermissionDenied):
        await asyncssh.connect(
            h.address,
            h.port,
            username="root",
            client_keys=[str(world.client_key_path)],
            known_hosts=str(world.known_hosts_path),
            config=None,
        )


async def test_sixty_four_hosts_start_quickly(tmp_path: Path) -> None:
    started = time.monotonic()
    async with World(tmp_path / "big", hosts=64, scenario="seed-morning") as world:
        elapsed = time.monotonic() - started
        assert elapsed < 10, elapsed
        async with await connect(world, "spark-bl") as last:
            result = await run(last, "docker ps --format '{{.Names}}'")
            assert result.stdout == "glm-flash\n"
        assert world.hosts["spark-bl"].address == "127.0.0.65"


async def test_fake_tool_calls_are_cheap(head: asyncssh.SSHClientConnection) -> None:
    """A fake costs a bash start and a loopback round trip, never an interpreter start."""
    result = await run(
        head,
        "s=$(date +%s%N); for i in $(seq 50); do docker ps -q >/dev/null; done; "
        "echo $(( ($(date +%s%N) - s) / 50000 ))",
    )
    per_call_us = int(result.stdout)
    assert per_call_us < 50_000, f"{per_call_us} µs per fake docker call"


async def test_sudo_runs_the_fake_not_the_real_tool(head: asyncssh.SSHClientConnection) -> None:
    result = await run(head, "sudo -n systemctl is-active vllm-cluster.service")
    assert (result.exit_status, result.stdout) == (0, "active\n")


def test_cli_runs_a_world_and_injects_faults(tmp_path: Path) -> None:
    directory = tmp_path / "cli-world"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sparkd_sim.cli", "--scenario", "empty", "--dir", str(directory)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        while not lines or not lines[-1].startswith("Ctrl-C"):
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else "world exited"
            lines.append(line)
        text = "".join(lines)
        assert f"config:      {directory / 'sparkd.toml'}" in text
        assert "ssh aurora@127.0.0.2 -p " in text
        assert main(["sim", "fault", "unreachable", "spark-b", "--dir", str(directory)]) == 0
        assert main(["fault", "heal", "spark-x", "--dir", str(directory)]) == 1
        assert main(["fault", "no-such-fault", "spark-b", "--dir", str(directory)]) == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert "world stopped" in out
    assert not (directory / "control.sock").exists()
    assert main(["fault", "heal", "spark-a", "--dir", str(tmp_path / "nothing")]) == 1
