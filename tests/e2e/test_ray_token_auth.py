"""Ray's token auth (`RAY_AUTH_MODE=token`, `RAY_AUTH_TOKEN_PATH` naming a file mounted in both
containers): the dashboard refuses a read without the token (real Ray 2.60's answers:
tests/fixtures/ray-token-auth). Without `ray.auth_token_file` sparkd reads Ray with the CLI and
says why in Ray's reading; with it, the dashboard's reads carry the token and are answered."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkd.shell.ssh import SshPool
from sparkd_sim.timing import Timing
from sparkd_sim.world import World
from tests.support.daemon import controller, converge
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
        ctl = controller(world, pool, tmp_path / "state", cluster={"ray": changes})
        plans = await converge(ctl, cycles=300)
        assert plans[-1].phase == "healthy", plans[-1].reason
        assert all(c.auth_token == TOKEN for c in world.ray.clusters if c.alive)
        seen = ctl.view.snapshot
        assert seen is not None and seen.ray is not None and seen.ray.up
        refused = seen.ray.dashboard_refused
        if with_token:
            assert refused is None and seen.ray.ips_known
        else:
            missing = AUTH["missing"]
            assert refused is not None
            assert f"HTTP {missing['status']} {missing['body']}" in refused
        dumped = json.dumps(seen.model_dump(mode="json"))
        assert TOKEN not in dumped
