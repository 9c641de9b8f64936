"""docs/quickstart.md, run: every command of its `sh` blocks, in order, from the wheel `make dist`
builds installed in a fresh venv by the page's own commands, against the simulated world's
hand-made deployment over real SSH. Each must exit 0.

The page's system paths (`/etc`, `/opt`, `/var`, `/usr/local`) move under a temporary root
holding what a Debian 12 box with the packages installed has; the Spark addresses become the
simulated hosts' `ADDRESS:PORT` (each host listens on a port of its own on 127.x loopback).
The commands of `sh {untested}` blocks need root on a Spark, the real systemd or a package
install: they are listed below, exactly, so that a new one cannot go untested unnoticed.
Minutes: pip installs the wheel's dependencies into the new venv (from its cache, under the
test pins)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import asyncssh
import pytest

from sparkd_sim.world import World
from tests.ops.dist import PINS, ROOT, build_dist
from tests.support.live import live_world

pytestmark = pytest.mark.slow

PAGE = ROOT / "docs" / "quickstart.md"
# The page's Sparks, in the order the world lists its hosts (head, worker).
SPARKS = ("10.1.230.180", "10.1.230.181")
# The directories the page writes into that a Debian 12 box has (the base system, and the
# prometheus, prometheus-alertmanager and grafana packages), under the test's root.
SKELETON = (
    "usr/local/bin",
    "etc/systemd/system",
    "etc/prometheus",
    "etc/grafana/provisioning/dashboards",
    "etc/grafana/provisioning/datasources",
    "var/lib",
    "opt",
)
SYSTEM_PATH = re.compile(r"(?<![\w./-])/(?=(?:etc|opt|var|usr/local)/)")

PLAN = "sparkd plan --config /etc/sparkd/sparkd.toml"
COPY_ID = "ssh-copy-id -o UserKnownHostsFile=/etc/sparkd/known_hosts -i /etc/sparkd/id_ed25519.pub"
# Every command of the page's `sh {untested}` blocks, and why the test cannot run it.
UNTESTED = {
    "make dist": "the test builds the same sdist and wheel (python -m build) in a copy",
    "useradd --system --home-dir /var/lib/sparkd --shell /usr/sbin/nologin sparkd": "root",
    f"{COPY_ID} aurora@10.1.230.180":
        "logs in as the Spark's admin; the test gives the simulated hosts the key instead",
    f"{COPY_ID} aurora@10.1.230.181": "as above",
    "install -m 0755 spark-a.forced /usr/local/sbin/sparkd-forced-command": "root on a Spark",
    "install -m 0440 sparkd.sudoers /etc/sudoers.d/sparkd": "root on a Spark",
    "chown -R sparkd:sparkd /etc/sparkd": "root, and the sparkd user",
    "systemctl daemon-reload": "the real systemd",
    "systemctl enable --now sparkd": "the real systemd",
    "sparkd status": "a running daemon (systemd)",
    "systemctl reload prometheus prometheus-alertmanager": "the real systemd",
    "systemctl restart grafana-server": "the real systemd",
}  # fmt: skip

# Tools the page runs that come from Debian packages rather than sparkd; without one the test
# skips that command, saying so (CI installs them: .ci/run).
PACKAGED = {
    "systemd-analyze": "systemd",
    "promtool": "prometheus",
    "amtool": "prometheus-alertmanager",
    "visudo": "sudo",
}

# ssh-keyscan takes one -p for all its hosts; the simulated hosts listen on a port each. This
# stand-in scans each ADDRESS:PORT argument with its own -p and passes the options through.
KEYSCAN_SHIM = """#!/bin/sh
opts=""
hosts=""
while [ $# -gt 0 ]; do
  case "$1" in
    -t|-T|-f|-p) opts="$opts $1 $2"; shift 2 ;;
    -*) opts="$opts $1"; shift ;;
    *) hosts="$hosts $1"; shift ;;
  esac
done
for host in $hosts; do
  {real} $opts -p "${{host##*:}}" "${{host%:*}}" || exit 1
done
"""


@dataclass(frozen=True)
class Command:
    text: str
    tested: bool


FENCE = re.compile(r"^```(\S*)(.*)$")


def commands(page: str) -> list[Command]:
    """The page's shell commands in order: one per logical line (a trailing backslash joins the
    next), from ```sh blocks (tested) and ```sh {untested} blocks."""
    found: list[Command] = []
    block: str | None = None
    pending = ""
    for line in page.splitlines():
        fence = FENCE.match(line)
        if fence is not None and block is None:
            language, tags = fence.group(1), fence.group(2).strip()
            if language == "sh":
                assert tags in ("", "{untested}"), f"unknown sh block tag: {line}"
                block = tags
            else:
                block = "other"
            continue
        if fence is not None:
            assert not pending, f"a continued line ends its block: {pending}"
            block = None
            continue
        if block in (None, "other") or not line.strip():
            continue
        pending += line.rstrip("\\").strip() + " " if line.endswith("\\") else line.strip()
        if not line.endswith("\\"):
            found.append(Command(pending, tested=block == ""))
            pending = ""
    assert block is None, "an unclosed fence"
    return found


def test_the_untested_commands_are_exactly_the_listed_ones() -> None:
    page = PAGE.read_text()
    untested = [c.text for c in commands(page) if not c.tested]
    assert untested == list(UNTESTED)
    # The steps the page is for stay among the commands the test runs.
    tested = [c.text for c in commands(page) if c.tested]
    for step in (
        "/opt/sparkd/bin/pip install dist/sparkd-",
        "ssh-keyscan",
        "sparkd init",
        "sparkd check-config",
        "sparkd plan",
        "sparkd commands",
        "promtool check rules",
        "amtool check-config",
        "systemd-analyze verify",
        "cp etc/grafana/sparkd.json",
    ):
        assert any(text.startswith(step) for text in tested), step
    # A console or bash block would hold commands nobody runs.
    assert not re.search(r"^```(console|bash|shell|shell-session)\b", page, flags=re.M)


def localised(command: str, root: Path, addresses: dict[str, str]) -> str:
    text = SYSTEM_PATH.sub(f"{root}/", command)
    for page_address, address in addresses.items():
        text = text.replace(page_address, address)
    return text


async def shell(command: str, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        "bash", "-euo", "pipefail", "-c", command, cwd=cwd, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 900)
    return proc.returncode or 0, out.decode(errors="replace")


async def brought_up(world: World) -> None:
    """Once the hand-made deployment serves: its `vllm serve` ran (the operator's `docker exec -d`
    is logged once the serve process runs)."""
    await world.brought_up()
    for _ in range(200):
        if any(r.command.startswith("vllm serve") for r in world.commands()):
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the operator's `vllm serve` never ran")


def give_hosts_the_key(world: World, key: Path) -> None:
    """What `ssh-copy-id` does on real Sparks: the hosts accept the page's new key."""
    accepted = asyncssh.read_private_key(key)
    for host in world.hosts.values():
        host.ssh.client_key = accepted


async def test_every_command_of_the_quickstart_runs(tmp_path: Path) -> None:
    page = commands(PAGE.read_text())
    checkout = tmp_path / "checkout"
    build_dist(checkout, "systemd", "etc")
    root = tmp_path / "root"
    for directory in SKELETON:
        (root / directory).mkdir(parents=True)
    shims = tmp_path / "shims"
    shims.mkdir()
    real_keyscan = shutil.which("ssh-keyscan")
    if real_keyscan is None:
        pytest.skip("no ssh-keyscan (openssh-client) on this machine")
    keyscan = shims / "ssh-keyscan"
    keyscan.write_text(KEYSCAN_SHIM.format(real=real_keyscan))
    keyscan.chmod(0o755)
    env = {
        **os.environ,
        # The page's `sparkd` is the fresh venv's, through its /usr/local/bin link; the test
        # venv's own is not on the PATH.
        "PATH": f"{root}/usr/local/bin:{shims}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        # The page's pip install, under the test pins (pip reads the variable as `-c`).
        "PIP_CONSTRAINT": str(PINS),
    }
    for name in ("VIRTUAL_ENV", "SPARKD_CONFIG", "PYTHONPATH"):
        env.pop(name, None)
    config = root / "etc" / "sparkd" / "sparkd.toml"

    skipped: list[str] = []
    outputs: dict[str, str] = {}
    async with live_world(tmp_path / "world", "hand-made") as world:
        assert world.user == "aurora"
        await brought_up(world)
        addresses = {
            page_address: f"{host.address}:{host.port}"
            for page_address, host in zip(SPARKS, world.hosts.values(), strict=True)
        }
        for command in page:
            if not command.tested:
                if command.text.startswith("ssh-copy-id") and command.text.endswith(SPARKS[0]):
                    give_hosts_the_key(world, root / "etc" / "sparkd" / "id_ed25519")
                continue
            program = command.text.split()[0]
            if program in PACKAGED and shutil.which(program, path=env["PATH"]) is None:
                if os.environ.get("CI") == "true":
                    pytest.fail(f"{program} is missing: .ci/run must install it")
                skipped.append(f"{command.text} (no {program}: Debian's {PACKAGED[program]})")
                continue
            text = localised(command.text, root, addresses)
            rc, out = await shell(text, checkout, env)
            assert rc == 0, f"{command.text}\n-> {text}\nexit {rc}:\n{out[-4000:]}"
            outputs[command.text] = out
            if command.text.startswith("sparkd init"):
                # init writes the state dir's system path itself: moved like the page's paths.
                config.write_text(localised(config.read_text(), root, {}))
    for line in skipped:
        warnings.warn(f"not run: {line}", stacklevel=1)

    # What the page says of the plan: init's config describes the deployment, so sparkd's first
    # look adopts it and acts on nothing.
    assert "adopting the deployment made by hand" in outputs[PLAN], outputs[PLAN]
    assert "nothing to do" in outputs[PLAN]
    # The page installed sparkd from the wheel into its own venv, and checked what it wrote.
    assert (root / "opt" / "sparkd" / "bin" / "sparkd").exists()
    assert not (root / "opt" / "sparkd" / "bin" / "sparkd-sim").exists()
    assert "# ===" not in (checkout / "spark-a.forced").read_text()
    assert (root / "var/lib/grafana/dashboards/sparkd/sparkd.json").exists()
