"""The real executor: vLLM 0.32.0's CPU build serving the tiny model with
`--tensor-parallel-size 2 --distributed-executor-backend ray` across a real two-node Ray 2.60
cluster (tests/realexec/cluster.py), with the test-only platform plugin that gives the CPU
platform a Ray device key (tests/realexec/plugin).

Skipped with the reason where the machine lacks it (the vLLM venv, Ray in it, the plugin,
root), except under CI=true, where it fails (`make test` builds .venv-vllm/.installed-realexec).
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.realexec import cluster
from tests.realvllm.conftest import tiny_model as tiny_model
from tests.support.tiers import require_tier

# The executor's start on a loaded 2-core machine: two Ray nodes, an API server, an engine and
# two workers importing torch each.
START_LIMIT = 600.0
SAMPLE = 0.25
# A long prompt for the model's 512 tokens (its tokenizer takes about a token a character).
PROMPT = "hello " * 50
# vLLM 0.32.0 `v1/executor/ray_utils.py` `_wait_until_pg_ready`, while the group is not ready.
WAITING = "Waiting for creating a placement group of specs"
# How long the engine gets to notice its worker node died.
DEATH_LIMIT = 120.0


def require_exec() -> None:
    require_tier("real-executor", cluster.why_not())


@dataclass
class Observed:
    """What one run of the real executor showed."""

    log: str
    # The log up to vLLM's first line saying it waits for its placement group (the worker node
    # joined after it).
    waiting_log: str = ""
    # (node name, process args) of every Ray or vLLM process seen on a node while it ran.
    titles: set[tuple[str, str]] = field(default_factory=set)
    # The first `ps -eo pid,args` of a node in which a `ray::RayWorkerProc` title appeared.
    ps: dict[str, str] = field(default_factory=dict)
    listening: bool = False
    exit_code: int | None = None
    # Once serving: `/metrics`, a completion's answer, and the log from a worker node's death on.
    metrics: str = ""
    completion: dict[str, object] = field(default_factory=dict)
    after_death: str = ""
    exit_after_death: int | None = None


def _listening(address: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((address, port), 1):
        return True
    return False


def _sample(ray: cluster.Cluster, seen: Observed) -> None:
    for node in ray.nodes:
        rows = node.processes()
        for _, args in rows:
            if args.startswith(("ray::", "VLLM::", "VLLM_")):
                seen.titles.add((node.name, args))
        if node.name not in seen.ps and any("RayWorkerProc" in a for _, a in rows):
            seen.ps[node.name] = "\n".join(
                ["    PID COMMAND", *(f"{pid:7d} {args}" for pid, args in rows)]
            )


def _get(url: str, body: dict[str, object] | None = None) -> str:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            text: str = response.read().decode()
            return text
    except urllib.error.HTTPError as error:
        # The server's own answer: what it refused, and why.
        return json.dumps({"status": error.code, "body": error.read().decode()})


def _serve_and_lose_a_node(ray: cluster.Cluster, server: cluster.Serve, seen: Observed) -> None:
    """A completion across both workers, the metrics, then SIGKILL of the worker node's
    namespace (its raylet and its `RayWorkerProc` together, as a Spark's container dies) and
    what the engine does about it."""
    base = f"http://{server.address}:{server.port}"
    model = json.loads(_get(f"{base}/v1/models"))["data"][0]["id"]
    seen.completion = json.loads(
        _get(f"{base}/v1/completions", {"model": model, "prompt": PROMPT, "max_tokens": 4})
    )
    seen.metrics = _get(f"{base}/metrics")
    _sample(ray, seen)
    before = len(server.text())
    ray.nodes[1].kill()
    deadline = time.monotonic() + DEATH_LIMIT
    while server.process.poll() is None and time.monotonic() < deadline:
        time.sleep(SAMPLE)
    seen.exit_after_death = server.process.poll()
    seen.after_death = server.text()[before:]


def _until_waiting(server: cluster.Serve) -> str:
    """The serve log once vLLM says it waits for its placement group (`_wait_until_pg_ready`
    logs it after 10 s, then at 30, 70 ... s); what it printed instead if it exited."""
    deadline = time.monotonic() + START_LIMIT
    while time.monotonic() < deadline:
        text = server.text()
        if WAITING in text or server.process.poll() is not None:
            return text
        time.sleep(SAMPLE)
    return server.text()


@pytest.fixture(scope="session")
def executor_ready() -> None:
    """Before the model is built: the tier's own reason to skip, not the one-process tier's."""
    require_exec()


@pytest.fixture(scope="module")
def observed(
    executor_ready: None, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Observed]:
    del executor_ready
    tmp = tmp_path_factory.mktemp("realexec")
    # Launched with the worker node not yet in Ray (as when a look raced a lost node): vLLM
    # waits for its placement group, and the worker that joins is where the group goes.
    with cluster.ray_cluster(tmp, nodes=1) as ray:
        server = cluster.serve(ray, tiny_model)
        seen = Observed(log="")
        try:
            seen.waiting_log = _until_waiting(server)
            ray.start_node("worker1", 2)
            deadline = time.monotonic() + START_LIMIT
            while time.monotonic() < deadline:
                _sample(ray, seen)
                if _listening(server.address, server.port):
                    seen.listening = True
                    break
                if server.process.poll() is not None:
                    seen.exit_code = server.process.returncode
                    break
                time.sleep(SAMPLE)
            if seen.listening:
                _serve_and_lose_a_node(ray, server, seen)
            seen.log = server.text()
            yield seen
        finally:
            server.stop()
