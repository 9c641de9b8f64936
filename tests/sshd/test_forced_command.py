"""The authorized_keys forced-command wrapper, installed with the line `sparkd commands
--forced-command` prints, in front of a real OpenSSH sshd: sparkd's commands for the host go
through, anything else exits 126, the model channel opens to the permitted port only, and
Ray's dashboard is read by the fixed GETs the wrapper admits, never through a channel.

docker, systemctl and kill are stand-ins on the PATH sshd gives the session (they record their
arguments), so nothing on this machine is touched.
"""

from __future__ import annotations

import getpass
import shlex
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncssh
import pytest

from sparkd.core.reading import parsers
from sparkd.model import exits
from sparkd.model.cluster import ClusterSpec
from sparkd.model.observed import RayState
from sparkd.model.spec import HostSpec
from sparkd.shell import catalogue, model_http, ray_http
from sparkd.shell.observe import opener, runner
from sparkd.shell.ssh import HostConnection, SshFailure
from sparkd_sim.ray_dashboard import DashboardServer
from sparkd_sim.state import RayCluster, RayNode
from sparkd_sim.timing import Timing
from sparkd_sim.vllm_server import ModelBehaviour, SimVllmServer
from tests.support.sshd import RealSshd, cluster_behind, install_forced_command, running_sshd

pytestmark = pytest.mark.sshd

API_KEY = "sk-forced-test-3f9a"
STAND_INS = ("docker", "systemctl", "kill", "nvidia-smi")
PID_MAX = int(Path("/proc/sys/kernel/pid_max").read_text())


@dataclass(frozen=True)
class Forced:
    sshd: RealSshd
    cluster: ClusterSpec
    host: HostSpec
    calls: Path
    other_port: int


def stand_ins(directory: Path, calls: Path) -> None:
    directory.mkdir()
    for tool in STAND_INS:
        stub = directory / tool
        text = f'#!/bin/sh\nprintf "%s\\n" "{tool} $*" >> {calls}\n'
        if tool == "docker":  # the launch names its cache entry from the container's image
            text += f'[ "$1" = inspect ] && echo sha256:{"ab" * 32}\n'
        stub.write_text(text)
        stub.chmod(0o755)


@pytest.fixture
async def model() -> AsyncIterator[int]:
    sim = SimVllmServer("/models/Qwen3.5-122B-A10B-FP8", ModelBehaviour())
    port = await sim.start()
    try:
        yield port
    finally:
        await sim.stop()


@pytest.fixture
async def dashboard() -> AsyncIterator[int]:
    """A head's Ray dashboard on loopback, one head node registered."""
    node = RayNode(node_id="ab" * 28, ip="127.0.0.1", host="a", container_id="c", is_head=True)
    ray = RayCluster(
        head_container_id="c", head_host="a", ip="127.0.0.1", port=6379, dashboard=True
    )
    ray.nodes.append(node)
    server = DashboardServer("127.0.0.1", 0, lambda: ray, Timing.fast())
    port = await server.start()
    try:
        yield port
    finally:
        await server.stop()


@pytest.fixture
def other_listener() -> Iterator[int]:
    """A port that is open on loopback, so only the key's options can refuse a channel to it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.fixture
def world(tmp_path: Path, model: int, dashboard: int, other_listener: int) -> Iterator[Forced]:
    tools = tmp_path / "bin"
    calls = tmp_path / "calls"
    stand_ins(tools, calls)
    path = f"PATH={tools}:/usr/local/bin:/usr/bin:/bin"
    # What the header asks of the head's sshd_config: no remote forwarding for the account.
    match = f"Match User {getpass.getuser()}\n    AllowTcpForwarding local\n"
    with running_sshd(tmp_path, f"SetEnv {path}\n{match}") as sshd:
        key_file = tmp_path / "api_key_source"
        key_file.write_text(API_KEY + "\n")
        cluster = cluster_behind(
            sshd,
            ray={"dashboard_port": dashboard},
            model={
                "port": model,
                "tunnel_host": "127.0.0.1",
                "log_dir": tmp_path / "serve",
                "api_key_file": key_file,
            },
        )
        host = cluster.head
        install_forced_command(tmp_path, cluster, host)
        yield Forced(sshd, cluster, host, calls, other_listener)


async def run(conn: HostConnection, command: str, stdin: str | None = None) -> tuple[int, str]:
    try:
        result = await conn.run(command, timeout=30, input=stdin)
    except SshFailure as failure:
        assert failure.kind == "exit_nonzero", failure
        assert failure.result is not None
        result = failure.result
    return result.exit_status or 0, result.stdout + result.stderr


def lets_through(exit_status: int, output: str) -> bool:
    return exit_status != exits.REFUSED_EXIT and "sparkd forced command" not in output


async def test_the_catalogues_commands_pass_and_the_tools_run(world: Forced) -> None:
    cluster, host = world.cluster, world.host
    conn = HostConnection(host, cluster.ssh)
    seconds = cluster.ssh.command_timeout
    try:
        # With the dashboard on, the script observing sends (Ray is read over HTTP).
        t = catalogue.remote.tool_timeout(cluster)
        status, output = await run(
            conn, catalogue.reads.fact_script(cluster, host, t, read_ray=False).command
        )
        assert lets_through(status, output), output
        sections = parsers.parse_sections(output)
        assert sections["boot_id"].ok and sections["now"].ok
        assert {"containers", "gpu_apps", "running", "serve_spec"} <= set(sections)

        # The catalogue lists removal by pattern ('glm-*'); sparkd sends a matching name.
        sent = [
            r
            for h, r in catalogue.catalogue(cluster, seconds)
            if h.name == host.name and r.name not in ("remove_container", "start_model")
        ]
        sent += [
            catalogue.actions.kill_process(cluster, 4242, "TERM", seconds),
            catalogue.actions.kill_process(cluster, 2, "KILL", seconds),
            catalogue.actions.signal_serve(cluster, "KILL", seconds),
            catalogue.actions.remove_container("glm-old", seconds),
            catalogue.actions.start_model(cluster, seconds, API_KEY),
        ]
        for remote in sent:
            status, output = await run(conn, remote.command, remote.stdin)
            assert lets_through(status, output), (remote.name, status, output)
    finally:
        await conn.close()
    calls = world.calls.read_text().splitlines()
    assert "kill -TERM 4242" in calls and "kill -KILL 2" in calls
    assert "systemctl stop -- vllm-cluster.service" in calls
    assert "docker rm -f -- glm-old" in calls
    assert any(c.startswith("docker events --format") for c in calls)
    launch = f"docker exec -d -e VLLM_CACHE_ROOT={cluster.model.cache_root}/{'ab' * 6}-models--"
    assert any(c.startswith(launch) for c in calls), calls
    # The key went through stdin to its 0600 file, never on a command line.
    assert (cluster.model.log_dir / catalogue.actions.API_KEY_FILE).read_text() == API_KEY
    assert not any(API_KEY in c for c in calls)


async def test_anything_else_is_refused_naming_only_its_first_word(world: Forced) -> None:
    cluster, host = world.cluster, world.host
    seconds = cluster.ssh.command_timeout
    script = catalogue.reads.fact_script(
        cluster, host, catalogue.remote.tool_timeout(cluster)
    ).command
    kill = catalogue.actions.kill_process(cluster, 4242, "KILL", seconds).command
    refused = {
        "id": "id",
        "sh -c id": "sh",
        script + "x": "s??",  # the word, its punctuation masked
        script.replace("boot_id", "boot_idx", 1): "s??",
        # Shapes sparkd itself never builds: PID 1, and 2^32 - 1, which procps reads as -1.
        kill.replace("4242", "1"): "timeout",
        kill.replace("4242", "4294967295"): "timeout",
        kill.replace("4242", str(PID_MAX)): "timeout",
        catalogue.actions.kill_process(cluster, 4242, "HUP", seconds).command: "timeout",
        catalogue.actions.kill_process(cluster, 4242, "TERM", seconds).command + "; id": "timeout",
        catalogue.actions.remove_container("postgres", seconds).command: "timeout",
        f"echo {API_KEY} | id": "echo",
    }
    conn = HostConnection(host, cluster.ssh)
    try:
        for command, first in refused.items():
            status, output = await run(conn, command)
            assert status == exits.REFUSED_EXIT, (command, output)
            assert output == f"sparkd forced command: refused {first}\n", (command, output)
    finally:
        await conn.close()
    assert not world.calls.exists()  # no stand-in ever ran


async def test_ray_is_read_by_the_fixed_gets_and_the_job_api_is_out_of_reach(
    world: Forced,
) -> None:
    """The dashboard's reads run on the head (real python3 behind the wrapper) and read Ray;
    a job submission to the same port, by any command, exits 126 before it runs."""
    cluster, host = world.cluster, world.host
    port = cluster.ray.dashboard_port
    conn = HostConnection(host, cluster.ssh)
    try:
        t = catalogue.remote.tool_timeout(cluster)
        ray = await ray_http.read_ray(runner(conn), port, True, t)
        assert isinstance(ray, RayState) and ray.gpus_total == 1.0 and ray.gpus_usable == 1.0
        nodes = catalogue.reads.dashboard_get(port, catalogue.reads.DASHBOARD_PATHS[0], t)
        jobs = f"http://127.0.0.1:{port}/api/jobs/"
        for command in (
            f'curl -X POST {jobs} -d \'{{"entrypoint": "id"}}\'',
            nodes.command.replace(shlex.quote(catalogue.reads.DASHBOARD_PATHS[0]), "/api/jobs/"),
            nodes.command.replace("GET", "POST"),
            nodes.command + f"; curl -X POST {jobs}",
        ):
            status, output = await run(conn, command, nodes.stdin)
            assert status == exits.REFUSED_EXIT, (command, output)
    finally:
        await conn.close()


async def test_the_model_channel_reaches_only_the_permitted_port(world: Forced) -> None:
    cluster, host = world.cluster, world.host
    conn = HostConnection(host, cluster.ssh)
    try:
        result = await model_http.probe(opener(conn, cluster), cluster, API_KEY)
        assert result.verdict.outcome == "reasoning_only"
        # Neither another open port nor Ray's dashboard (whose port also serves the job API)
        # is a permitted destination.
        for port in (world.other_port, cluster.ray.dashboard_port):
            with pytest.raises(SshFailure) as info:
                await conn.open_connection("127.0.0.1", port)
            # Administratively prohibited: not taken for the model refusing (ssh_errors).
            assert info.value.kind == "conn_lost"
            assert f"code {asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED}" in info.value.error.detail
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass  # the port itself is open: only the key's permitopen refused it
    finally:
        await conn.close()
    async with asyncssh.connect(
        world.sshd.address,
        world.sshd.port,
        username=world.sshd.user,
        client_keys=[str(world.sshd.key_file)],
        known_hosts=str(world.sshd.known_hosts),
    ) as raw:
        with pytest.raises(asyncssh.ChannelListenError):
            await raw.forward_remote_port("127.0.0.1", 0, "127.0.0.1", 9)
