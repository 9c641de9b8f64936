"""Planted secrets never leave the process: a daemon run against the simulated world with an API
key, a rotation of that key and a control token, then a grep of every output for all three."""

from __future__ import annotations

import asyncio
import os
import re
import signal
from pathlib import Path

import aiohttp

from sparkd.settings import load_settings
from sparkd_sim.world import World
from tests.e2e.conftest import eventually, free_port, mutations, write_fast_config
from tests.e2e.test_process import phase, sparkd, start_daemon, status

KEY_A = "sk-planted-alpha-3c9e1d2b4a7f"
KEY_B = "sk-planted-bravo-8c7d6e5f0a9b"
TOKEN = "ctl-planted-5e6f7a8b9c0d1e2f"


def secret_file(path: Path, value: str) -> Path:
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


def launches(world: World) -> int:
    return sum(1 for r in mutations(world) if r.command.startswith("vllm serve"))


async def fetch(port: int, path: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}{path}") as r:
        return await r.text()


async def control(port: int, path: str, body: object) -> int:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    url = f"http://127.0.0.1:{port}{path}"
    async with aiohttp.ClientSession() as s, s.post(url, json=body, headers=headers) as r:
        return r.status


def plant(log_dir: Path, *values: str) -> None:
    """What a chatty model server or a careless wrapper could print into the serve log."""
    with (log_dir / "serve.log").open("a") as log:
        for value in values:
            log.write(f"INFO debug: credentials {value} Authorization: Bearer {value}\n")


async def test_no_planted_secret_in_any_output(seed_world: World, tmp_path: Path) -> None:
    port = free_port()
    state = tmp_path / "state"
    token_file = secret_file(tmp_path / "token", TOKEN)
    key_file = secret_file(tmp_path / "api_key", KEY_A)
    config = write_fast_config(seed_world, tmp_path / "sparkd.toml", state, port, token_file)
    text = config.read_text().replace(
        "  [clusters.model]\n", f'  [clusters.model]\n  api_key_file = "{key_file}"\n', 1
    )
    config.write_text(text)
    settings = load_settings(config)
    cluster = settings.clusters[0]
    log_dir = Path(cluster.model.log_dir)
    log = tmp_path / "daemon.log"
    outputs: dict[str, str] = {}
    daemon = await start_daemon(config, log)
    try:

        async def healthy() -> bool:
            return phase(await status(port)) == "healthy"

        await eventually(healthy, within=90)
        assert launches(seed_world) == 1
        plant(log_dir, KEY_A, TOKEN)
        # The operator pastes the token into a pause reason; it is stored, evented, shown.
        assert await control(port, f"/clusters/{cluster.name}/pause", {"reason": TOKEN}) == 200
        assert await control(port, f"/clusters/{cluster.name}/resume", {}) == 200

        async def planted_seen() -> bool:
            outputs["status-1"] = await fetch(port, "/status")
            return "credentials ***" in outputs["status-1"]

        await eventually(planted_seen, within=30)
        code, out, err = await sparkd(
            "plan", "--config", str(config), "--json", "--save-snapshot", str(tmp_path / "snap")
        )
        assert code == 0, err
        outputs["plan stdout"], outputs["plan stderr"] = out, err
        outputs["snapshot"] = (tmp_path / "snap").read_text()
        assert "credentials ***" in outputs["snapshot"]

        # Rotation: the new key is noticed and rolled out as one model restart.
        secret_file(key_file, KEY_B)

        async def rolled_out() -> bool:
            body = await status(port)
            return launches(seed_world) == 2 and phase(body) == "healthy"

        await eventually(rolled_out, within=90)
        plant(log_dir, KEY_A, KEY_B, TOKEN)

        async def replanted_seen() -> bool:
            outputs["status-2"] = await fetch(port, "/status")
            return outputs["status-2"].count("credentials ***") >= 3

        await eventually(replanted_seen, within=30)
        outputs["events"] = await fetch(port, "/events?limit=1000")
        outputs["healthz"] = await fetch(port, "/healthz")
        outputs["metrics"] = await fetch(port, "/metrics")
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(daemon.wait(), 20) == 0
    assert "spec drift" in outputs["events"]
    # The restarted server answers the probe only with the new key (401 otherwise).
    serve_env = [r for r in mutations(seed_world) if r.command.startswith("vllm serve")]
    assert len(serve_env) == 2
    outputs["daemon log"] = log.read_text()
    for path in sorted(state.rglob("*")):
        if path.is_file():
            outputs[f"state {path.name}"] = path.read_bytes().decode("utf-8", "replace")
    assert any(name.startswith("state events") for name in outputs), sorted(outputs)
    leaks = {
        name: [s for s in (KEY_A, KEY_B, TOKEN) if s in text] for name, text in outputs.items()
    }
    assert not any(leaks.values()), {k: v for k, v in leaks.items() if v}
    # The planted lines did reach the outputs, masked.
    assert "credentials ***" in outputs["events"] + outputs["daemon log"] + outputs["status-2"]
    assert re.search(r'"reason": "\*\*\*"', outputs["status-1"] + outputs["events"])
    assert os.stat(key_file).st_mode & 0o077 == 0


async def test_a_rotated_out_key_never_reaches_a_restarted_process(
    seed_world: World, tmp_path: Path
) -> None:
    """The daemon launches the model with KEY_A and stops; the key file now holds KEY_B. A new
    process never read KEY_A, so cannot mask it in the running launch's log tail."""
    port = free_port()
    key_file = secret_file(tmp_path / "api_key", KEY_A)
    config = write_fast_config(seed_world, tmp_path / "sparkd.toml", tmp_path / "state", port)
    text = config.read_text().replace(
        "  [clusters.model]\n", f'  [clusters.model]\n  api_key_file = "{key_file}"\n', 1
    )
    config.write_text(text)
    log_dir = Path(load_settings(config).clusters[0].model.log_dir)
    daemon = await start_daemon(config, tmp_path / "daemon.log")
    try:

        async def healthy() -> bool:
            return phase(await status(port)) == "healthy"

        await eventually(healthy, within=90)
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(daemon.wait(), 20) == 0
    plant(log_dir, KEY_A)
    snapshot = tmp_path / "snap"
    code, out, err = await sparkd(
        "plan", "--config", str(config), "--json", "--save-snapshot", str(snapshot)
    )
    assert code == 0, err
    assert "credentials ***" in snapshot.read_text()
    secret_file(key_file, KEY_B)
    code, out, err = await sparkd(
        "plan", "--config", str(config), "--json", "--save-snapshot", str(snapshot)
    )
    assert code == 0, err
    assert "drift" in out, out
    assert KEY_A not in out + err
    assert KEY_A not in snapshot.read_text()
    assert "log tail withheld" in snapshot.read_text()
