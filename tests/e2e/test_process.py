"""`sparkd run`, `once`, `status`, `plan`, `probe` as processes: signals, the lock, logs."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import time
from pathlib import Path

from sparkd.runtime.state import StateDir
from sparkd_sim.state import GpuProcess
from sparkd_sim.world import World
from tests.support.daemon import eventually, fast_config_in, free_port, mutations, write_fast_config
from tests.support.process import (
    SPARKD,
    killed_once,
    phase,
    run_until_healthy,
    sparkd,
    start_daemon,
    status,
    wait_phase,
)
from tests.support.worlds import both_servers


async def test_kill_9_mid_recovery_then_restart(seed_world: World, tmp_path: Path) -> None:
    config, port = fast_config_in(seed_world, tmp_path)
    # A slow load, so the restarted daemon finds the model loading and must leave it alone.
    await seed_world.fault("slow-load", "spark-a")
    log = tmp_path / "daemon.log"

    def launched() -> bool:
        return any(r.command.startswith("vllm serve") for r in mutations(seed_world))

    await killed_once(config, log, launched, within=30)
    await run_until_healthy(config, log, port, within=60)
    changed = [r.command.split()[:2] for r in mutations(seed_world)]
    assert changed.count(["vllm", "serve"]) == 1, "the load in progress was interrupted"
    assert changed.count(["docker", "run"]) == 2, "a Ray container was started twice"
    lines = log.read_text().splitlines()
    assert any(line.startswith("<6>{") for line in lines), lines[:5]
    for line in lines:
        if line.startswith("<"):
            json.loads(line[line.index(">") + 1 :])


async def test_once_refuses_while_run_holds_the_lock(seed_world: World, tmp_path: Path) -> None:
    config, _ = fast_config_in(seed_world, tmp_path)
    state = tmp_path / "state"
    with StateDir(state).lock():
        before = len(seed_world.commands())
        code, _, err = await sparkd("once", "--config", str(config))
    assert code == 75, err
    assert "locked" in err
    assert len(seed_world.commands()) == before


async def test_once_converges_in_steps_and_exit_codes(seed_world: World, tmp_path: Path) -> None:
    config, _ = fast_config_in(seed_world, tmp_path)
    code, out, err = await sparkd("once", "--config", str(config), "--json")
    assert code == 1, err
    [first] = json.loads(out)
    assert first["phase"] == "cleaning"
    assert [o["result"] for o in first["outcomes"]] == ["ok"] * 8
    deadline = time.monotonic() + 40
    while True:
        code, out, err = await sparkd("once", "--config", str(config))
        if code == 0:
            break
        assert code == 1, err
        assert time.monotonic() < deadline, out
        await asyncio.sleep(0.2)
    assert "healthy (converged)" in out
    code, out, _ = await sparkd("once", "--config", str(config), "--dry-run")
    assert code == 0, out


async def test_sigterm_stops_cleanly_and_sighup_keeps_a_good_config(
    seed_world: World, tmp_path: Path
) -> None:
    config, port = fast_config_in(seed_world, tmp_path)
    log = tmp_path / "daemon.log"
    proc = await start_daemon(config, log)
    try:
        await wait_phase(port, None, within=20)
        good = config.read_text()
        config.write_text(good.replace('role = "worker"', 'role = "head"'))
        proc.send_signal(signal.SIGHUP)
        await eventually(lambda: "reload_rejected" in log.read_text(), within=10)
        assert phase(await status(port)) is not None
        config.write_text(good)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    text = log.read_text()
    assert '"event": "stopping"' in text


@both_servers
async def test_live_plan_probe_status(healthy_world: World, tmp_path: Path) -> None:
    config, port = fast_config_in(healthy_world, tmp_path)
    await eventually(lambda: bool(mutations(healthy_world)), within=10)
    probes: list[tuple[int, str, str]] = []

    async def answered() -> bool:  # the world's own load takes a moment
        probes.append(await sparkd("probe", "--config", str(config), "--json"))
        return probes[-1][0] == 0

    await eventually(answered, within=30, poll=0.3)
    result = json.loads(probes[-1][1])
    assert set(result) >= {
        "outcome", "healthy", "latency_seconds", "ttft_seconds", "completion_tokens",
        "finish_reason",
    }  # fmt: skip
    assert (result["outcome"], result["healthy"], result["completion_tokens"]) == (
        "reasoning_only", True, 50,
    )  # fmt: skip
    saved = tmp_path / "snap.json"
    code, out, err = await sparkd(
        "plan", "--config", str(config), "--json", "--probe", "--save-snapshot", str(saved)
    )
    assert code == 0, err
    [plan] = json.loads(out)
    assert plan["converged"] is True
    code, replay, _ = await sparkd(
        "plan", "--config", str(config), "--json", "--from-snapshot", str(saved)
    )
    assert json.loads(replay) == [plan]
    proc = await start_daemon(config, tmp_path / "daemon.log")
    try:

        async def converged() -> bool:
            return phase(await status(port)) == "healthy"

        await eventually(converged, within=20)
        code, out, err = await sparkd("status", "--config", str(config))
        assert code == 0, err
        assert out.splitlines()[0].split()[:3] == ["CLUSTER", "PHASE", "GPUS"]
        assert "sparks" in out and "healthy" in out and "reasoning_only" in out
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 20)


async def test_sparkd_sim_healthy_is_drift_free_for_the_config_it_prints(tmp_path: Path) -> None:
    """`sparkd sim --scenario healthy`, then `sparkd plan` on the config it printed: nothing to
    change (no Ray or model restart for a spec the simulator spelled differently)."""
    from tests.support.live import FIRST_ADDRESS

    directory = tmp_path / "world"
    # Its own address block: another world of this run may hold FIRST_ADDRESS's.
    first = FIRST_ADDRESS.rsplit(".", 2)[0] + ".64.2"
    world = await asyncio.create_subprocess_exec(
        *SPARKD, "sim", "--scenario", "healthy", "--dir", str(directory),
        "--first-address", first, "--no-noisy-logs",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert world.stdout is not None
        while True:
            line = await asyncio.wait_for(world.stdout.readline(), 60)
            assert line, "the world exited"
            if line.startswith(b"Ctrl-C"):
                break
        plans: list[dict] = []  # type: ignore[type-arg]

        async def converged() -> bool:  # the world's model may still be finishing its load
            code, out, err = await sparkd(
                "plan", "--config", str(directory / "sparkd.toml"), "--json", "--probe"
            )
            assert code == 0, err
            plans.extend(json.loads(out))
            return bool(plans[-1]["converged"])

        await eventually(converged, within=30, poll=0.3)
        assert all(p["actions"] == [] and p["withheld"] == [] for p in plans), plans
        assert plans[-1]["phase"] == "healthy"
    finally:
        world.send_signal(signal.SIGTERM)
        await asyncio.wait_for(world.wait(), 30)


PAINT = "\x1b[2J\x1b[H\x1b[32mhealthy (converged)\x1b[0m\u202e\x9b31m"


def unsafe(text: str) -> list[str]:
    return [c for c in text if c in "\x1b\x9b\u202e" or (ord(c) < 32 and c not in "\n\t")]


async def test_a_host_and_a_client_cannot_paint_the_terminal(
    healthy_world: World, tmp_path: Path
) -> None:
    port = free_port()
    token = tmp_path / "token"
    token.write_text("ctl-paint-0123456789\n")
    token.chmod(0o600)
    config = write_fast_config(
        healthy_world, tmp_path / "sparkd.toml", tmp_path / "state", port, token_file=token
    )
    head = healthy_world.host("spark-a")
    # nvidia-smi prints a process's name as the process set it.
    head.state.gpu_processes.append(GpuProcess(pid=4242, name=f"/tmp/x{PAINT}", used_mib=512))
    code, out, err = await sparkd("plan", "--config", str(config))
    assert "x" in out and not unsafe(out + err), repr(out)
    proc = await start_daemon(config, tmp_path / "daemon.log")
    try:
        await eventually(lambda: _has_phase(port), within=20)
        code, out, err = await sparkd(
            "pause", "--config", str(config), "sparks", "--reason", f"mine {PAINT}"
        )
        assert code == 0, err

        async def paused() -> bool:
            body = await status(port)
            return "mine" in body["clusters"][0]["reason"]

        # The pause is in the plan from the daemon's next cycle on.
        await eventually(paused, within=20)
        code, out, err = await sparkd("status", "--config", str(config))
        assert code == 0, err
        assert "mine" in out and not unsafe(out + err), repr(out)
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 20)


async def _has_phase(port: int) -> bool:
    return phase(await status(port)) is not None


async def test_a_saved_snapshot_is_private_whatever_the_umask(
    seed_world: World, tmp_path: Path
) -> None:
    config, _ = fast_config_in(seed_world, tmp_path)
    snapshot = tmp_path / "snap"
    snapshot.write_text("older\n")
    snapshot.chmod(0o644)
    proc = await asyncio.create_subprocess_exec(
        *SPARKD, "plan", "--config", str(config), "--save-snapshot", str(snapshot),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, umask=0,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, err
    assert stat.S_IMODE(snapshot.stat().st_mode) == 0o600
    assert '"observed_at"' in snapshot.read_text()


async def test_probe_with_an_unusable_key_file_is_one_line_and_78(
    seed_world: World, tmp_path: Path
) -> None:
    config, _ = fast_config_in(seed_world, tmp_path)
    fifo = tmp_path / "api_key"
    os.mkfifo(fifo)
    for key_file in (tmp_path / "missing", fifo):
        text = config.read_text().replace(
            "  [clusters.model]\n", f'  [clusters.model]\n  api_key_file = "{key_file}"\n', 1
        )
        edited = tmp_path / "keyed.toml"
        edited.write_text(text)
        code, _, err = await sparkd("probe", "--config", str(edited))
        assert code == 78, err
        assert "Traceback" not in err and len(err.splitlines()) == 1, err
        assert err.startswith(f"sparkd probe: model.api_key_file: {key_file}: ")
