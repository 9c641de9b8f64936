"""Real vLLM whose port another socket takes during the load: vLLM still logs `Application startup
complete.` and stays up, and never listens, with no error (uvloop's `create_server` closes the
socket when `listen()` fails and never returns). sparkd must read a ready log against a refused
port as a model that does not serve, not as up."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import pytest

from sparkd.core.deciding.planner import plan
from sparkd.core.reading import parsers
from sparkd.model.memory import Memory
from sparkd.model.observed import LoadProgress
from sparkd.model.probe import ProbeResult
from sparkd.shell import model_http
from sparkd.shell.observe import opener
from sparkd.shell.ssh import HostConnection
from tests.realvllm.conftest import START_LIMIT, RealVllm, cluster_for, serving
from tests.support.sshd import RealSshd
from tests.toy import Toy

pytestmark = [pytest.mark.realvllm, pytest.mark.asyncio(loop_scope="module")]


async def until_logged(server: RealVllm, text: str, limit: float = START_LIMIT) -> None:
    deadline = time.monotonic() + limit
    while text not in (server.log.read_text(errors="replace") if server.log.exists() else ""):
        assert server.process is not None and server.process.poll() is None, server.tail()
        assert time.monotonic() < deadline, f"{text!r} not logged: {server.tail()}"
        await asyncio.sleep(0.1)


async def test_a_port_taken_during_the_load_reads_ready_log_refused_port(
    tiny_model: Path, sshd_module: RealSshd, tmp_path: Path
) -> None:
    with serving(tiny_model, tmp_path / "vllm", 4) as server:
        # The API server has bound its socket (not listening yet) by the time the worker loads.
        await until_logged(server, "Starting to load model")
        squatter = socket.socket()
        try:
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            squatter.bind((server.address, server.port))
            squatter.listen()
            await until_logged(server, "Application startup complete.")
            await asyncio.sleep(1.0)
        finally:
            squatter.close()
        await asyncio.sleep(2.0)
        assert server.process is not None and server.process.poll() is None, server.tail()
        assert not server.listening()
        cluster = cluster_for(sshd_module, server)
        conn = HostConnection(cluster.head, cluster.ssh)
        try:
            channel = opener(conn, cluster)
            endpoint, _ = await model_http.read_endpoint(channel, cluster, None, 5)
            probe = await model_http.probe(channel, cluster, None)
        finally:
            await conn.close()
        log = parsers.log_lines(server.log.read_text(errors="replace"))
        assert not any("Errno 98" in line or "address already in use" in line for line in log)
    progress = parsers.parse_load_progress(log, None)
    assert progress.stage == "ready"
    assert endpoint.status == "refused" and not endpoint.serves(cluster.model.served_name)
    assert probe.verdict.outcome == "refused" and not probe.verdict.healthy
    # What the planner makes of it: a ready log is not a serving model.
    toy = Toy.healthy()
    memory = Memory(launched_at=toy.now - 120, healthy_since=None)
    seen = toy.observe()
    assert seen.serve is not None
    serve = seen.serve.model_copy(
        update={"progress": LoadProgress(stage="ready", percent=100.0, message=log[-1])}
    )
    seen = seen.model_copy(
        update={
            "serve": serve,
            "endpoint": endpoint,
            "probe": ProbeResult(at=toy.now, verdict=probe.verdict),
        }
    )
    decided = plan(toy.cluster, seen, memory, toy.now)
    assert decided.phase != "healthy", decided.reason
    assert "refused" in decided.reason
