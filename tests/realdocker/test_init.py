"""`sparkd init` against a real Docker engine: a deployment made by hand as the seed's operator
makes it (their own container names, `ray start` on the data IP, `vllm serve` by `docker exec
-d`, an API key on its command line and in the env), read over SSH with init's own commands and
parsed from what the real CLI prints."""

from __future__ import annotations

import shlex
import tomllib

import pytest

from sparkd.core.reading import discover
from sparkd.core.reading.discover import Options
from sparkd.shell.discover import read_host
from sparkd_sim import real_docker
from tests.realdocker.conftest import Tier

pytestmark = [pytest.mark.realdocker, pytest.mark.asyncio(loop_scope="module")]

SECRET = "sk-planted-in-the-deployment"
OPTIONS = Options(user="aurora", key_file="/etc/sparkd/id_ed25519",
                  known_hosts_file="/etc/sparkd/known_hosts")  # fmt: skip


async def test_init_reads_a_hand_made_deployment_from_the_real_engine(clean: Tier) -> None:
    ip = clean.host.data_ip
    models = clean.world.models_dir
    run = [
        "docker", "run", "-d", "--name", "ray-head", "--network", "host", "--gpus", "all",
        "--shm-size", "8g", "--restart", "unless-stopped", "-v", f"{models}:/models",
        "-e", f"NCCL_SOCKET_IFNAME={clean.host.interface}",
        "-e", f"GLOO_SOCKET_IFNAME={clean.host.interface}",
        "-e", f"VLLM_HOST_IP={ip}", "-e", f"VLLM_API_KEY={SECRET}",
        real_docker.IMAGE, "ray", "start", "--block", "--head", f"--node-ip-address={ip}",
        "--port=6379",
    ]  # fmt: skip
    rc, _, err = await clean.run(shlex.join(run))
    assert rc == 0, err
    serve = [
        "docker", "exec", "-d", "ray-head", "vllm", "serve", "/models/Qwen3.5-122B-A10B-FP8",
        "--port", "30000", "--tensor-parallel-size", "1", "--reasoning-parser", "qwen3",
        "--api-key", SECRET,
    ]  # fmt: skip
    rc, _, err = await clean.run(shlex.join(serve))
    assert rc == 0, err
    stale = [
        "docker", "run", "-d", "--name", "glm-flash", "--network", "host", "--restart", "always",
        real_docker.IMAGE, "sh", "-c", "exec vllm serve /models/GLM-4.7-Flash --port 30001",
    ]  # fmt: skip
    rc, _, err = await clean.run(shlex.join(stale))
    assert rc == 0, err

    reads = await read_host(clean.host.address, clean.host.port, clean.cluster.ssh)
    assert reads.errors == (), reads.errors
    # What the real CLI printed, parsed.
    containers = {c.name: c for c in discover.parse_inspect(reads.inspect or "")}
    head = containers["ray-head"]
    assert head.gpus and head.restart == "unless-stopped" and head.shm_size == 8 << 30
    assert head.mounts == (f"{models}:/models",)
    assert containers["glm-flash"].restart == "always"

    text = discover.draft(OPTIONS, [reads])
    assert SECRET not in text
    document = tomllib.loads(text)
    cluster = document["clusters"][0]
    assert cluster["hosts"] == [
        {"name": "spark-a", "address": clean.host.address, "port": clean.host.port,
         "role": "head", "data_ip": ip, "interface": clean.host.interface},
    ]  # fmt: skip
    assert cluster["ray"]["image"] == real_docker.IMAGE
    assert cluster["ray"]["env"] == {
        "NCCL_SOCKET_IFNAME": clean.host.interface,
        "GLOO_SOCKET_IFNAME": clean.host.interface,
    }
    model = cluster["model"]
    assert model["id"] == "/models/Qwen3.5-122B-A10B-FP8"
    assert model["extra_args"] == ["--reasoning-parser", "qwen3"]
    assert model["api_key_file"] == discover.SUGGESTED_KEY_FILE
    assert cluster["cleanup"]["container_patterns"] == ["glm-flash"]
