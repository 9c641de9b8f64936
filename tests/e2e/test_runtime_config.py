"""Config that only fails when used: `sparkd run` with a busy port or an unusable state dir exits
with one line (78 or 73), and SIGHUP reports what it cannot apply, always ending in READY=1."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from sparkd.runtime.daemon import Daemon
from sparkd.runtime.notify import Notifier
from sparkd.settings import load_settings
from sparkd.web.serve import serve_api
from sparkd_sim.world import World
from tests.support.daemon import eventually, fast_config_in, free_port
from tests.support.process import NotifySocket

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "etc" / "sparkd" / "sparkd.toml"
SPARKD = [sys.executable, "-m", "sparkd.cli"]


def example_config(directory: Path, listen: str, state_dir: Path) -> Path:
    """The shipped example config with its listen address and state dir replaced: a start that
    fails on either never reaches the hosts."""
    text = EXAMPLE.read_text()
    text = re.sub(r"^listen = .*$", f'listen = "{listen}"', text, count=1, flags=re.M)
    text = re.sub(r"^state_dir = .*$", f'state_dir = "{state_dir}"', text, count=1, flags=re.M)
    path = directory / "sparkd.toml"
    path.write_text(text)
    load_settings(path)
    return path


def run_sparkd(
    config: Path,
    env: dict[str, str] | None = None,
    prefix: tuple[str, ...] = (),
    command: str = "run",
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, *SPARKD, command, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        check=False,
    )


def bound_by_permissions() -> tuple[str, ...]:
    """A prefix that makes file permissions bind even when the tests run as root (root keeps
    its own files' owner rights, but loses the override that lets it write anywhere)."""
    if os.getuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: permissions cannot be made to bind")
    return (setpriv, "--bounding-set=-dac_override,-dac_read_search")


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_busy_port_exits_78_naming_daemon_listen(tmp_path: Path) -> None:
    notify = NotifySocket(tmp_path / "notify.sock")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = example_config(tmp_path, f"127.0.0.1:{port}", tmp_path / "state")
        result = run_sparkd(config, {"NOTIFY_SOCKET": str(notify.path)})
    messages = notify.drain()
    notify.sock.close()
    assert result.returncode == 78, result.stderr
    line = f"daemon.listen: 127.0.0.1:{port} is in use"
    assert one_line(result) == f"sparkd run: {line}"
    assert f"STATUS={line}" in messages
    assert not any(m.startswith("READY=1") for m in messages)


def test_address_not_on_this_machine_exits_78(tmp_path: Path) -> None:
    config = example_config(tmp_path, "192.0.2.1:9810", tmp_path / "state")
    result = run_sparkd(config)
    assert result.returncode == 78, result.stderr
    assert one_line(result) == (
        "sparkd run: daemon.listen: 192.0.2.1:9810 cannot be bound: Cannot assign requested address"
    )


@pytest.mark.parametrize(
    ("layout", "reason"),
    [
        ("file", "{state} is not a directory"),
        ("under-file", "{state} cannot be created: Not a directory"),
    ],
)
def test_unusable_state_dir_exits_73(tmp_path: Path, layout: str, reason: str) -> None:
    if layout == "file":
        state = tmp_path / "state"
        state.write_text("not a directory\n")
    else:
        (tmp_path / "file").write_text("")
        state = tmp_path / "file" / "state"
    config = example_config(tmp_path, f"127.0.0.1:{free_port()}", state)
    notify = NotifySocket(tmp_path / "notify.sock")
    result = run_sparkd(config, {"NOTIFY_SOCKET": str(notify.path)})
    messages = notify.drain()
    notify.sock.close()
    assert result.returncode == 73, result.stderr
    line = "daemon.state_dir: " + reason.format(state=state)
    assert one_line(result) == f"sparkd run: {line}"
    assert f"STATUS={line}" in messages


def test_state_dir_that_cannot_be_created_exits_73(tmp_path: Path) -> None:
    parent = tmp_path / "readonly"
    parent.mkdir(mode=0o555)
    parent.chmod(0o555)
    state = parent / "state"
    config = example_config(tmp_path, f"127.0.0.1:{free_port()}", state)
    result = run_sparkd(config, prefix=bound_by_permissions())
    assert result.returncode == 73, result.stderr
    assert one_line(result) == (
        f"sparkd run: daemon.state_dir: {state} cannot be created: Permission denied"
    )
    assert not state.exists()


def test_state_dir_that_is_not_writable_exits_73(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o555)
    state.chmod(0o555)
    config = example_config(tmp_path, f"127.0.0.1:{free_port()}", state)
    result = run_sparkd(config, prefix=bound_by_permissions())
    assert result.returncode == 73, result.stderr
    assert one_line(result) == f"sparkd run: daemon.state_dir: {state} is not writable by this user"
    assert list(state.iterdir()) == []


async def post(port: int, path: str, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = f"http://127.0.0.1:{port}{path}"
    async with aiohttp.ClientSession() as s, s.post(url, headers=headers) as r:
        return r.status


async def listening(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    await writer.wait_closed()
    return True


async def test_sighup_always_ends_in_ready_and_reports_what_needs_a_restart(
    healthy_world: World, tmp_path: Path
) -> None:
    config, port = fast_config_in(healthy_world, tmp_path)
    good = config.read_text()
    notify = NotifySocket(tmp_path / "notify.sock")
    notify.watch()
    log_path = tmp_path / "daemon.log"
    log = log_path.open("wb")
    proc = await asyncio.create_subprocess_exec(
        *SPARKD, "run", "--config", str(config), stdout=log, stderr=log,
        env={**os.environ, "NOTIFY_SOCKET": str(notify.path), "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip

    async def reload() -> tuple[str, str]:
        """SIGHUP; the RELOADING=1 message and the READY=1 message that follows it."""
        start = len(notify.received)
        before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGHUP)
        await eventually(lambda: notify.after(start, "RELOADING=1") is not None, within=10)
        reloading = notify.after(start, "RELOADING=1")
        assert reloading is not None
        await eventually(lambda: notify.after(reloading, "READY=1") is not None, within=30)
        ready = notify.after(reloading, "READY=1")
        assert ready is not None
        message = notify.received[reloading]
        usec = int(message.split("MONOTONIC_USEC=")[1].split("\n")[0])
        assert before <= usec <= time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return message, notify.received[ready]

    try:
        await eventually(lambda: notify.after(0, "READY=1") is not None, within=20)

        _, ready = await reload()
        assert ready == "READY=1\nSTATUS=reloaded"

        config.write_text(good.replace('role = "worker"', 'role = "head"'))
        _, ready = await reload()
        assert ready.startswith("READY=1\nSTATUS=reload rejected: kept the old config: "), ready
        assert "clusters.0" in ready, ready
        assert await post(port, "/clusters/sparks/reconcile") == 403  # still running, unchanged

        # A new port and a control token: the token is applied, the port waits for a restart.
        new_port = free_port()
        token_file = tmp_path / "token"
        token_file.write_text("s3cret-token-for-reload\n")
        token_file.chmod(0o600)
        changed = good.replace(f'listen = "127.0.0.1:{port}"', f'listen = "127.0.0.1:{new_port}"')
        changed = changed.replace("[daemon]\n", f'[daemon]\ncontrol_token_file = "{token_file}"\n')
        config.write_text(changed)
        _, ready = await reload()
        pending = f"daemon.listen: 127.0.0.1:{port} -> 127.0.0.1:{new_port}"
        assert ready == (
            f"READY=1\nSTATUS=reloaded except (needs a restart, old value kept): {pending}"
        )
        assert await post(port, "/clusters/sparks/reconcile") == 401
        assert await post(port, "/clusters/sparks/reconcile", "s3cret-token-for-reload") == 200
        assert not await listening(new_port)
        text = log_path.read_text()
        assert '"event": "reloaded_except"' in text
        assert pending in text

        # Turning HA on needs a restart: until then this instance goes on acting alone.
        config.write_text(changed + '\n[ha]\netcd_endpoints = ["http://127.0.0.1:9"]\n')
        _, ready = await reload()
        assert ready.endswith(f"{pending}; ha: changed"), ready
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/status") as r:
            assert "ha" not in await r.json()
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 30)
        await asyncio.sleep(0.1)
        notify.drain()
        notify.close()
    assert code == 0
    stopping = notify.received.index("STOPPING=1")
    assert notify.after(stopping, "READY=1") is None


async def test_a_reload_that_fails_unexpectedly_still_sends_ready(
    healthy_world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, _ = fast_config_in(healthy_world, tmp_path)
    notify = NotifySocket(tmp_path / "notify.sock")
    monkeypatch.setenv("NOTIFY_SOCKET", str(notify.path))
    daemon = Daemon(load_settings(config), config, notifier=Notifier(), api=serve_api)

    def broken(path: Path) -> None:
        raise RuntimeError("disk gone")

    monkeypatch.setattr("sparkd.runtime.daemon.load_settings", broken)
    daemon.reload()
    await asyncio.sleep(0.2)
    messages = notify.drain()
    notify.sock.close()
    assert [m.split("\n")[0] for m in messages] == ["RELOADING=1", "READY=1"]
    assert messages[1] == "READY=1\nSTATUS=reload failed: kept the running config"


def test_a_config_nested_past_the_recursion_limit_is_one_line_78(tmp_path: Path) -> None:
    config = example_config(tmp_path, f"127.0.0.1:{free_port()}", tmp_path / "state")
    config.write_text(config.read_text() + "\nx = " + "[" * 100_000 + "]" * 100_000 + "\n")
    for command in ("check-config", "run"):
        result = run_sparkd(config, command=command)
        assert result.returncode == 78, result.stderr
        assert one_line(result) == f"{config}: nested too deep to be a sparkd config"


@pytest.mark.parametrize("command", ["run", "once"])
@pytest.mark.parametrize("layout", ["lock-dir", "events-dir", "state-file"])
def test_a_state_dir_sparkd_cannot_use_is_one_line_73(
    tmp_path: Path, command: str, layout: str
) -> None:
    """Each fails before any host is contacted."""
    state = tmp_path / "state"
    if layout == "state-file":
        state.write_text("not a directory\n")
        reason = f"{state} is not a directory"
    else:
        state.mkdir(mode=0o700)
        name = "sparkd.lock" if layout == "lock-dir" else "events.jsonl"
        (state / name).mkdir()
        reason = f"{state}: {name} is not a regular file"
    config = example_config(tmp_path, f"127.0.0.1:{free_port()}", state)
    # Should a regression let `once` go on, it meets closed loopback ports, never the network.
    text = config.read_text().replace('"10.1.230.180"', '"127.0.99.1"')
    config.write_text(text.replace('"10.1.230.181"', '"127.0.99.2"'))
    result = run_sparkd(config, command=command)
    assert result.returncode == 73, result.stderr
    assert one_line(result) == f"sparkd {command}: daemon.state_dir: {reason}"
