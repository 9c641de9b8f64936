"""Ray's token auth (`RAY_AUTH_MODE=token`, `RAY_AUTH_TOKEN_PATH` naming a file mounted in both
containers): the dashboard refuses a read without the token (real Ray 2.60's answers:
tests/fixtures/ray-token-auth). Without `ray.auth_token_file` sparkd reads Ray with the CLI and
says why in Ray's reading; with it, the dashboard's reads carry the token and are answered."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest

from sparkd.runtime import logs
from sparkd.shell.ssh import SshPool
from sparkd_sim.timing import Timing
from sparkd_sim.world import World
from tests.support.daemon import controller, converge, cycles
from tests.support.live import cluster_of

AUTH = json.loads(
    (
        Path(__file__).resolve().parents[1] / "fixtures" / "ray-token-auth" / "answers.json"
    ).read_text()
)
TOKEN = "e2e-ray-token-0123456789"


@pytest.mark.parametrize("with_token", [False, True], ids=["no_token_file", "token_file"])
async def test_a_cluster_with_token_auth(tmp_path: Path, pool: SshPool, with_token: bool) -> None:
    shared = tmp_path / "ray-auth"
    shared.mkdir()
    (shared / "auth_token").write_text(TOKEN + "\n")
    (shared / "auth_token").chmod(0o600)
    async with World(tmp_path / "world", scenario="seed-morning", timing=Timing.fast()) as world:
        ray = cluster_of(world).ray
        env = {**ray.env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "/run/ray/auth_token"}
        changes: dict[str, object] = {
            "env": env,
            "mounts": (*ray.mounts, f"{shared}:/run/ray:ro"),
        }
        if with_token:
            changes["auth_token_file"] = str(shared / "auth_token")
        stream = io.StringIO()
        logs.configure("json", stream=stream)
        try:
            ctl = controller(world, pool, tmp_path / "state", cluster={"ray": changes})
            plans = await converge(ctl, cycles=300)
            await cycles(ctl, 3)
        finally:
            logging.getLogger().handlers.clear()
        said = [line for line in stream.getvalue().splitlines() if "ray_dashboard_refused" in line]
        assert TOKEN not in stream.getvalue()
        assert plans[-1].phase == "healthy", plans[-1].reason
        assert all(c.auth_token == TOKEN for c in world.ray.clusters if c.alive)
        seen = ctl.view.snapshot
        assert seen is not None and seen.ray is not None and seen.ray.up
        refused = seen.ray.dashboard_refused
        if with_token:
            assert refused is None and seen.ray.ips_known and said == []
        else:
            missing = AUTH["missing"]
            assert refused is not None
            assert f"HTTP {missing['status']} {missing['body']}" in refused
            # Said once in the log, not every cycle.
            assert len(said) == 1, said
        dumped = json.dumps(seen.model_dump(mode="json"))
        assert TOKEN not in dumped
        # Read by the head's own GETs (no channel to the dashboard), the token on their stdin.
        head = cluster_of(world).head.name
        commands = world.commands(head)
        gets = [c for c in commands if c.source == "tool" and c.command.startswith("python3 -I -S")]
        assert gets and all(f"127.0.0.1 {ray.dashboard_port} /api/" in c.command for c in gets)
        assert not any(TOKEN in c.command for c in world.commands())
