"""Real `vllm serve` (vLLM 0.32.0's CPU build) serving a tiny random-weight Qwen3 model, reached
the way sparkd reaches a Spark's: over an SSH channel through a real OpenSSH sshd.

Needs the vLLM virtualenv (`make test` builds `.venv-vllm`; `SPARKD_VLLM_VENV` points
elsewhere). Skipped with a message where it is missing, except under CI=true, where it fails.
Each server binds a private loopback address of this run's own, has its own TMPDIR and
VLLM_CACHE_ROOT, HF_HUB_OFFLINE=1, and is torn down with every process of its session (the API
server, EngineCore, its worker and the resource tracker, orphans included).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio

from sparkd.model.cluster import ClusterSpec
from sparkd.shell import model_http
from sparkd.shell.observe import opener
from sparkd.shell.ssh import HostConnection
from tests.support.addresses import run_octet
from tests.support.sshd import RealSshd, cluster_behind, running_sshd

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("SPARKD_VLLM_VENV", ROOT / ".venv-vllm"))
VLLM = VENV / "bin" / "vllm"
MAKE_MODEL = Path(__file__).with_name("make_tiny_model.py")
# This run's own block (127.N.97.x), apart from the sshd tier's 127.N.128.x and the others'.
BLOCK = f"127.{run_octet()}.97"
# A start takes 40-50 s on a quiet 2-core machine (7 s of it imports), 96 s seen under load.
START_LIMIT = 600.0


def require_vllm() -> None:
    why = None
    if not VLLM.exists():
        why = f"no vLLM virtualenv at {VENV} (make test builds it: make .venv-vllm/.installed)"
    if why is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"the real-vLLM tier must run under CI: {why}")
    pytest.skip(f"real-vLLM tier skipped: {why}")


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        port: int = sock.getsockname()[1]
        return port


def session_members(sid: int) -> list[int]:
    """Every process of session `sid`: orphans reparented to init keep their session."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: the fields follow its last ")".
        fields = stat[stat.rindex(b")") + 2 :].split()
        if int(fields[3]) == sid and fields[0] not in (b"Z", b"X"):
            found.append(int(entry))
    return found


def args_of(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


@dataclass
class RealVllm:
    """One `vllm serve` process and what it wrote."""

    model: Path
    address: str
    port: int
    directory: Path
    extra: tuple[str, ...] = ()
    cache: Path | None = None
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    env: dict[str, str] = field(default_factory=dict)
    tmp: Path | None = None

    @property
    def log(self) -> Path:
        return self.directory / "serve.log"

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        # Short: vLLM puts ZeroMQ IPC sockets in TMPDIR, whose paths must fit sun_path's 107
        # bytes (a pytest tmp_path does not).
        tmp = self.tmp = Path(tempfile.mkdtemp(prefix="vllm-"))
        cache = self.cache or self.directory / "cache"
        cache.mkdir(parents=True, exist_ok=True)
        env = {
            "PATH": f"{VENV / 'bin'}:/usr/bin:/bin",
            "HOME": str(self.directory),
            "LANG": "C.UTF-8",
            "TMPDIR": str(tmp),
            "VLLM_CACHE_ROOT": str(cache),
            "HF_HUB_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            # Nothing may leave loopback.
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            **self.env,
        }
        argv = [
            str(VLLM), "serve", str(self.model),
            "--host", self.address, "--port", str(self.port),
            "--reasoning-parser", "qwen3", "--max-model-len", "512",
            *self.extra,
        ]  # fmt: skip
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.directory,
                start_new_session=True,
            )
        self.started_at = time.monotonic()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def members(self) -> list[int]:
        return session_members(self.pid) if self.process is not None else []

    def engine_pids(self) -> list[int]:
        """EngineCore and its worker: vLLM names them in their command line."""
        return [p for p in self.members() if args_of(p).startswith(("VLLM::", "VLLM_"))]

    def engine_core(self) -> int:
        found = [p for p in self.members() if args_of(p) == "VLLM::EngineCore"]
        assert len(found) == 1, [args_of(p) for p in self.members()]
        return found[0]

    def listening(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection((self.address, self.port), 1):
            return True
        return False

    async def until_listening(self, limit: float = START_LIMIT) -> float:
        deadline = time.monotonic() + limit
        while not self.listening():
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"vllm serve exited {self.process.returncode}: {self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"vllm serve not listening after {limit:g}s: {self.tail()}")
            await asyncio.sleep(0.2)
        return time.monotonic() - self.started_at

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """Every process of the server's session, then wait until none is left."""
        if self.process is None:
            return
        sid = self.pid
        for pid in session_members(sid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)
        deadline = time.monotonic() + 10
        while session_members(sid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert session_members(sid) == [], "vLLM processes outlived the test"
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 1.2 MB random-weight Qwen3 model, built locally (nothing from a hub)."""
    require_vllm()
    out = tmp_path_factory.mktemp("model") / "tiny-qwen3"
    built = subprocess.run(
        [str(VENV / "bin" / "python"), str(MAKE_MODEL), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "HOME": str(out.parent), "HF_HUB_OFFLINE": "1"},
    )
    assert built.returncode == 0, built.stderr[-2000:]
    return out


@contextlib.contextmanager
def serving(
    model: Path, directory: Path, host: int, *extra: str, **options: object
) -> Iterator[RealVllm]:
    address = f"{BLOCK}.{host}"
    server = RealVllm(model, address, free_port(address), directory, tuple(extra))
    for key, value in options.items():
        setattr(server, key, value)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def cluster_for(sshd: RealSshd, server: RealVllm, **probe: object) -> ClusterSpec:
    """The reference cluster with its head behind `sshd` and its model at `server`."""
    return cluster_behind(
        sshd,
        {"command_timeout": 30.0},
        model={
            "id": str(server.model),
            "port": server.port,
            "tunnel_host": server.address,
            "extra_args": server.extra,
        },
        probe={"timeout": 30.0, **probe},
    )


@dataclass
class Reached:
    """A server as sparkd reaches it: its cluster and an SSH connection to the head."""

    server: RealVllm
    cluster: ClusterSpec
    conn: HostConnection

    def opener(self, cluster: ClusterSpec | None = None) -> model_http.Opener:
        return opener(self.conn, cluster or self.cluster)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sshd_module(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RealSshd]:
    with running_sshd(tmp_path_factory.mktemp("sshd")) as sshd:
        yield sshd
