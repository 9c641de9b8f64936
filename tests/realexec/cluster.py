"""A two-node Ray 2.60 cluster from .venv-vllm, and `vllm serve` on its head with the Ray executor.

Each node is `ray start --block` as PID 1 of a PID and mount namespace of its own, with a private
/tmp/ray (Ray's session, where `ray.init()` finds the cluster) and /dev/shm, as the real-Ray tier
runs Ray (sparkd_sim/real_ray.py); every node shares the machine's network and listens on a
private loopback address of this run's own. `vllm serve` runs in the head's namespaces (`nsenter`),
so its engine is the Ray driver on the head node, as in a Spark's head container. Killing a
node's PID 1 ends every process of that node, Ray's workers and vLLM's actors included.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.addresses import run_octet

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("SPARKD_VLLM_VENV", ROOT / ".venv-vllm"))
PLUGIN = Path(__file__).with_name("plugin")
# This run's own block, apart from the real-vLLM tier's 127.N.97.x.
BLOCK = f"127.{run_octet()}.98"
# The Ray resource each node offers once and each worker asks for (the plugin's device key).
# `GPU`, as on a Spark (`ray start --num-gpus=1`): Ray hands the actor its GPU id, which
# `RayWorkerProc.get_node_and_physical_gpu_ids` reads from Ray's accelerator ids, and the CPU
# worker ignores the CUDA_VISIBLE_DEVICES Ray sets. A custom resource (`vllm_cpu`, since Ray
# refuses `CPU` in an actor's `.options(resources=...)`) is placed too, but is no accelerator:
# `KeyError: 'vllm_cpu'` there (tests/fixtures/vllm-ray-executor/keyerror-custom-resource.log).
DEVICE_KEY = os.environ.get("SPARKD_REALEXEC_DEVICE_KEY", "GPU")
KEY_ENV = "SPARKD_VLLM_RAY_DEVICE_KEY"
_NAMESPACE_INIT = (
    "mkdir -p /tmp/ray && mount -t tmpfs -o size=512m tmpfs /tmp/ray && "
    "mount -t tmpfs -o size=256m tmpfs /dev/shm && "
    'cd / && exec "$@"'
)


def why_not() -> str | None:
    """What the machine lacks for this tier, or None."""
    if not (VENV / "bin" / "vllm").exists():
        return f"no vLLM virtualenv at {VENV} (make .venv-vllm/.installed-realexec)"
    if not (VENV / "bin" / "ray").exists():
        return f"no ray in {VENV} (make .venv-vllm/.installed-realexec)"
    if os.geteuid() != 0:
        return "the Ray nodes' namespaces need root (unshare --pid --mount, nsenter)"
    probe = subprocess.run(
        [str(VENV / "bin" / "python"), "-c", "import sparkd_vllm_ray_cpu"],
        capture_output=True,
        check=False,
    )
    if probe.returncode != 0:
        return f"the test platform plugin is not installed in {VENV}"
    return None


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        port: int = sock.getsockname()[1]
        return port


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def namespace_of(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def args_of(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def members(space: str) -> list[int]:
    return sorted(
        int(e) for e in os.listdir("/proc") if e.isdigit() and namespace_of(int(e)) == space
    )


def env(tmp: Path, **extra: str) -> dict[str, str]:
    return {
        "PATH": f"{VENV / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(tmp),
        "LANG": "C.UTF-8",
        KEY_ENV: DEVICE_KEY,
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        # Nothing may leave loopback.
        "RAY_USAGE_STATS_ENABLED": "0",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        **extra,
    }


@dataclass
class Node:
    """One Ray node: `unshare` (ours) and its namespace's PID 1, `ray start --block`."""

    name: str
    address: str
    log: Path
    process: subprocess.Popen[bytes]
    init: int = 0
    space: str = ""

    def processes(self) -> list[tuple[int, str]]:
        """(pid, args) of every process of the node, as `ps -eo pid,args` shows them."""
        return [(p, args_of(p)) for p in members(self.space)] if self.space else []

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.init, signal.SIGKILL)


@dataclass
class Cluster:
    tmp: Path
    gcs_port: int = 0
    nodes: list[Node] = field(default_factory=list)

    def start_node(self, name: str, host: int) -> Node:
        address = f"{BLOCK}.{host}"
        args = [
            str(VENV / "bin" / "ray"), "start", "--block",
            f"--node-ip-address={address}",
            "--num-cpus=2",
            *(
                ["--num-gpus=1"]
                if DEVICE_KEY == "GPU"
                else ["--num-gpus=0", f"--resources={json.dumps({DEVICE_KEY: 1})}"]
            ),
            "--object-store-memory=100000000",
            "--disable-usage-stats",
            f"--dashboard-agent-listen-port={free_port(address)}",
            "--min-worker-port=0", "--max-worker-port=0",
        ]  # fmt: skip
        if not self.nodes:
            self.gcs_port = free_port(address)
            args += ["--head", f"--port={self.gcs_port}", "--include-dashboard=false"]
            # Ray starts a minimal dashboard even so: never on its fixed 8265.
            args.append(f"--dashboard-host={address}")
            args.append(f"--dashboard-port={free_port(address)}")
            args.append(f"--ray-client-server-port={free_port(address)}")
        else:
            args.append(f"--address={self.nodes[0].address}:{self.gcs_port}")
        log = self.tmp / f"{name}.log"
        with log.open("ab") as out:
            process = subprocess.Popen(
                [
                    "unshare", "--pid", "--mount", "--fork", "--mount-proc", "--kill-child",
                    "/bin/sh", "-c", _NAMESPACE_INIT, "sh", *args,
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env(self.tmp),
                start_new_session=True,
            )  # fmt: skip
        node = Node(name, address, log, process)
        deadline = time.monotonic() + 10
        while not (kids := children(process.pid)):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.01)
        node.init = kids[0]
        node.space = namespace_of(node.init) or ""
        self.nodes.append(node)
        return node

    def ray(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """The real `ray` CLI in the head's namespaces."""
        return subprocess.run(
            self.enter(str(VENV / "bin" / "ray"), *args),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env(self.tmp),
            check=False,
        )

    def enter(self, *argv: str) -> list[str]:
        return ["nsenter", "-t", str(self.nodes[0].init), "-p", "-m", "--", *argv]

    def until_nodes(self, count: int, limit: float = 120.0) -> None:
        deadline = time.monotonic() + limit
        while True:
            status = self.ray("status")
            if f" 0.0/{count}.0 {DEVICE_KEY}" in status.stdout:
                return
            for node in self.nodes:
                assert node.process.poll() is None, node.log.read_text()[-3000:]
            assert time.monotonic() < deadline, status.stdout + status.stderr
            time.sleep(1.0)

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.kill()
        for node in self.nodes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.process.wait(15)
            if node.process.poll() is None:
                node.process.kill()
                node.process.wait(5)


@contextlib.contextmanager
def ray_cluster(tmp: Path, nodes: int = 2) -> Iterator[Cluster]:
    cluster = Cluster(tmp)
    try:
        for index in range(nodes):
            cluster.start_node("head" if index == 0 else f"worker{index}", index + 1)
        cluster.until_nodes(nodes)
        yield cluster
    finally:
        cluster.stop()


@dataclass
class Serve:
    """`vllm serve ... --distributed-executor-backend ray` in the head's namespaces."""

    log: Path
    process: subprocess.Popen[bytes]
    address: str
    port: int

    def text(self) -> str:
        # As its bytes are: read_text() would turn tqdm's and Ray's `\r` into line breaks.
        return self.log.read_bytes().decode(errors="replace")

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(15)


def serve(cluster: Cluster, model: Path, *extra: str) -> Serve:
    address = cluster.nodes[0].address
    port = free_port(address)
    log = cluster.tmp / "serve.log"
    argv = [
        str(VENV / "bin" / "vllm"), "serve", str(model),
        "--host", address, "--port", str(port),
        "--max-model-len", "512",
        "--tensor-parallel-size", "2", "--distributed-executor-backend", "ray",
        *extra,
    ]  # fmt: skip
    cache = cluster.tmp / "cache"
    cache.mkdir(exist_ok=True)
    with log.open("ab") as out:
        process = subprocess.Popen(
            cluster.enter(*argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env(cluster.tmp, VLLM_CACHE_ROOT=str(cache)),
            cwd=cluster.tmp,
            start_new_session=True,
        )
    return Serve(log, process, address, port)
