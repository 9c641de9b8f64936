"""A real Docker engine for each simulated host (`World(docker="real")`), for the tier that checks
sparkd against what Docker itself prints and does rather than against `FakeDocker`.

Each host gets a `dockerd` of its own: its own data root, exec root and socket in a scratch
directory, and no networking of its own (`--iptables=false --ip-forward=false --ip-masq=false
--bridge=none`: it never touches the machine's firewall, routes or bridges; sparkd's containers
use the host network anyway). Its one image is imported from a rootfs built here (busybox, no
registry, no network), with stand-ins for the two programs sparkd starts in containers: `ray
start --block` and `vllm serve` each just block, as the real ones do once up. Ray and vLLM
themselves are the other tiers' subject; here only Docker is real.

This machine has no GPU: `--gpus all` needs NVIDIA's prestart hook, so each daemon finds a
stand-in `nvidia-container-runtime-hook` on its PATH that does nothing (Docker then runs the
container as on a Spark, without the devices).

Needs root, Debian's `docker.io` (dockerd, containerd, runc, docker-init), a docker CLI, and a
statically linked busybox (Debian's `busybox-static`).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import shutil
import signal
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

IMAGE = "local/sparkd-tier:1"
HOOK = "nvidia-container-runtime-hook"
# dockerd was up 0.29 s after launch when measured; a loaded 2-core machine may take seconds.
START_TIMEOUT = 30.0
STOP_TIMEOUT = 20.0
BUSYBOX_PATHS = ("/bin/busybox", "/usr/bin/busybox")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# `ray start --block` as the container's main command, once its node is up: it only blocks (and
# reaps nothing, like the real one: Python's `ray start` never waits on processes it did not
# start). `exec` keeps the container's PID 1 (without `--init`) a process with no handler.
RAY_STAND_IN = """#!/bin/sh
case "$1 $2" in
"start --block") exec sleep 2147483647 ;;
esac
echo "ray stand-in: only 'ray start --block' (this image tests Docker, not Ray)" >&2
exit 1
"""
# `vllm serve` once loaded: an API server process waiting on its engine process. As vLLM's does,
# it exits with status 0 when its engine dies or when it is sent SIGTERM.
VLLM_STAND_IN = """#!/bin/sh
if [ "$1" != serve ]; then
    echo "vllm stand-in: only 'vllm serve' (this image tests Docker, not vLLM)" >&2
    exit 2
fi
echo "vllm serve stand-in: $*"
sleep 2147483647 &
engine=$!
trap 'kill "$engine" 2>/dev/null; exit 0' TERM INT
wait "$engine"
echo "engine process $engine ended"
exit 0
"""
HOOK_STAND_IN = """#!/bin/sh
# NVIDIA's prestart hook, on a machine without a GPU: it reads the container state and adds no
# devices.
cat >/dev/null
exit 0
"""


def busybox() -> str | None:
    """A statically linked busybox: the image has no C library for a dynamic one."""
    for path in BUSYBOX_PATHS:
        with contextlib.suppress(OSError), open(path, "rb") as binary:
            # A dynamic executable names its loader in its first page (PT_INTERP).
            if b"/ld-linux" not in binary.read(4096):
                return path
    return None


def cli() -> str | None:
    """The docker CLI the hosts' shells run: the one on this process's PATH."""
    return shutil.which("docker")


def unavailable() -> str | None:
    """Why the real Docker tier cannot run here, or None."""
    if os.geteuid() != 0:
        return "dockerd needs root"
    for tool in ("dockerd", "containerd", "runc", "docker-init"):
        if shutil.which(tool, path=SYSTEM_PATH) is None:
            return f"{tool} is missing (apt-get install docker.io)"
    if cli() is None:
        return "no docker CLI on the PATH (apt-get install docker.io)"
    if busybox() is None:
        return "no static busybox for the image (apt-get install busybox-static)"
    return None


def rootfs_tar(busybox_path: str) -> bytes:
    """The image's root filesystem: busybox with every applet linked, and the stand-ins."""
    applets = subprocess.run(
        [busybox_path, "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:

        def add_dir(name: str) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)

        def add_file(name: str, data: bytes, mode: int = 0o755) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))

        for name in ("bin", "sbin", "etc", "tmp", "proc", "sys", "dev", "usr", "usr/local",
                     "usr/local/bin", "root"):  # fmt: skip
            add_dir(name)
        add_file("bin/busybox", Path(busybox_path).read_bytes())
        for applet in applets:
            if applet != "busybox":
                link = tarfile.TarInfo(f"bin/{applet}")
                link.type, link.linkname = tarfile.SYMTYPE, "busybox"
                tar.addfile(link)
        add_file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n", 0o644)
        add_file("etc/group", b"root:x:0:\n", 0o644)
        add_file("usr/local/bin/ray", RAY_STAND_IN.encode())
        add_file("usr/local/bin/vllm", VLLM_STAND_IN.encode())
    return buffer.getvalue()


@dataclass
class Daemon:
    """One host's dockerd."""

    name: str
    root: Path
    group: int
    process: asyncio.subprocess.Process | None = None
    started_in: float | None = None
    # Without it, as on a host without NVIDIA's container toolkit, `--gpus` fails the run.
    gpu_hook: bool = True

    @property
    def socket(self) -> Path:
        return self.root / "docker.sock"

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def start(self) -> None:
        if self.running:
            return
        hooks = self.root / "hooks"
        hooks.mkdir(parents=True, exist_ok=True)
        hook = hooks / HOOK
        hook.unlink(missing_ok=True)
        if self.gpu_hook:
            hook.write_text(HOOK_STAND_IN)
            hook.chmod(0o755)
        self.socket.unlink(missing_ok=True)
        log = (self.root / "dockerd.log").open("ab")
        began = time.monotonic()
        try:
            self.process = await asyncio.create_subprocess_exec(
                "dockerd",
                "--data-root", str(self.root / "data"),
                "--exec-root", str(self.root / "exec"),
                "--pidfile", str(self.root / "dockerd.pid"),
                "-H", self.url,
                # The hosts' sessions run as an unprivileged user of this group.
                "--group", str(self.group),
                "--iptables=false", "--ip-forward=false", "--ip-masq=false", "--bridge=none",
                "--log-level", "warn",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env={"PATH": f"{hooks}:{SYSTEM_PATH}", "HOME": str(self.root)},
                start_new_session=True,
            )  # fmt: skip
        finally:
            log.close()
        while not await self._pings():
            if not self.running:
                raise RuntimeError(f"dockerd for {self.name} exited: {self._log_tail()}")
            if time.monotonic() - began > START_TIMEOUT:
                raise RuntimeError(f"dockerd for {self.name} did not answer in {START_TIMEOUT}s")
            await asyncio.sleep(0.02)
        self.started_in = time.monotonic() - began

    async def _pings(self) -> bool:
        try:
            reader, writer = await asyncio.open_unix_connection(str(self.socket))
        except OSError:
            return False
        try:
            writer.write(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            await writer.drain()
            answer = await reader.read()
        except OSError:
            return False
        finally:
            writer.close()
        return answer.startswith(b"HTTP/1.") and answer.endswith(b"OK")

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return (self.root / "dockerd.log").read_text(errors="replace")[-2000:]
        return ""

    async def docker(self, *args: str, stdin: bytes | None = None) -> tuple[int, str, str]:
        """The docker CLI against this daemon, from the world (as root, not over SSH)."""
        program = cli()
        if program is None:
            raise RuntimeError("no docker CLI")
        proc = await asyncio.create_subprocess_exec(
            program,
            *args,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={"PATH": SYSTEM_PATH, "DOCKER_HOST": self.url, "HOME": str(self.root)},
        )
        out, err = await proc.communicate(stdin)
        return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")

    async def stop(self, keep_containers: bool = False) -> None:
        """Containers first (so their shims end; kept, dockerd stops them itself), then dockerd,
        which stops its containerd; then whatever it left mounted in its directories."""
        if self.running:
            rc, ids, _ = await self.docker("ps", "-aq")
            if rc == 0 and ids.split() and not keep_containers:
                await self.docker("rm", "-f", *ids.split())
            assert self.process is not None
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), STOP_TIMEOUT)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                await self.process.wait()
        for pid in processes_under(self.root):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for mount in reversed(mounts_under(self.root)):
            umount = await asyncio.create_subprocess_exec(
                "umount", "-l", mount, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
            await umount.wait()


class RealDocker:
    """The daemons of one world, by host name."""

    def __init__(self, directory: Path, group: int) -> None:
        self.directory = directory
        self.group = group
        self.daemons: dict[str, Daemon] = {}
        self._rootfs: bytes | None = None

    def url(self, host: str) -> str:
        return self.daemons[host].url

    async def start(self, hosts: list[str]) -> None:
        why = unavailable()
        if why is not None:
            raise RuntimeError(f"real Docker cannot run here: {why}")
        found = busybox()
        assert found is not None
        self._rootfs = rootfs_tar(found)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.directory.chmod(0o755)
        for host in hosts:
            root = self.directory / host
            root.mkdir(exist_ok=True)
            root.chmod(0o755)
            self.daemons[host] = Daemon(host, root, self.group)
        try:
            await asyncio.gather(*(self.start_daemon(h) for h in hosts))
        except BaseException:
            # Whatever did start must not outlive a world that never started.
            await self.close()
            raise

    async def start_daemon(self, host: str, gpu_hook: bool = True) -> None:
        """Start (again) `host`'s dockerd; its image is imported once, kept in its data root."""
        daemon = self.daemons[host]
        daemon.gpu_hook = gpu_hook
        await daemon.start()
        rc, _, _ = await daemon.docker("image", "inspect", "--format", "{{.Id}}", IMAGE)
        if rc != 0:
            assert self._rootfs is not None
            rc, _, err = await daemon.docker("import", "-", IMAGE, stdin=self._rootfs)
            if rc != 0:
                raise RuntimeError(f"docker import on {host} failed: {err.strip()}")

    async def stop_daemon(self, host: str, keep_containers: bool = False) -> None:
        await self.daemons[host].stop(keep_containers)

    async def close(self) -> None:
        await asyncio.gather(*(d.stop() for d in self.daemons.values()))

    def leftovers(self) -> list[str]:
        """What of the daemons is still there (processes, mounts); empty once closed."""
        found = [f"process {pid}" for pid in processes_under(self.directory)]
        found += [f"mount {m}" for m in mounts_under(self.directory)]
        found += [
            f"dockerd {d.name} ({d.process.pid})"
            for d in self.daemons.values()
            if d.running and d.process is not None
        ]
        return found


def processes_under(root: Path) -> list[int]:
    """Processes whose command line names a path below `root` (dockerd, containerd, shims)."""
    needle = str(root).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline:
            found.append(int(entry.name))
    return found


def mounts_under(root: Path) -> list[str]:
    """Mount points at or below `root`, shortest first (unmount in reverse)."""
    prefix = str(root)
    points = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            if len(fields) > 4:
                point = fields[4].replace("\\040", " ")
                if point == prefix or point.startswith(prefix + "/"):
                    points.append(point)
    return sorted(points, key=len)
