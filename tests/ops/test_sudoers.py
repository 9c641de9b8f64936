"""The sudoers snippet against real sudo: every `sudo -n` command in the catalogue is allowed,
and nothing else (another signal, PID 0, 1 or -1, two PIDs, an unlisted unit, a shell).

sudo reads only /etc/sudoers, so the snippet is bind-mounted over it in a private mount
namespace (`unshare -m`): the machine's own sudoers is never touched.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sparkd.shell import catalogue
from tests.toy import EXAMPLE_CONFIG, reference_cluster

SUDO, VISUDO, UNSHARE = (shutil.which(t) for t in ("sudo", "visudo", "unshare"))


def snippet(user: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "sparkd.cli", "commands", "--config", str(EXAMPLE_CONFIG),
         "--sudoers", user],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    text = proc.stdout[proc.stdout.index("# sudoers snippet") :]
    return "\n".join(line for line in text.splitlines() if not line.startswith("#")) + "\n"


def sudo_commands() -> list[list[str]]:
    """Each `sudo -n ...` the catalogue sends, as the argv sudo is asked to run."""
    cluster = reference_cluster()
    cluster = cluster.model_copy(update={"ssh": cluster.ssh.model_copy(update={"sudo": True})})
    found = []
    for _, remote in catalogue.catalogue(cluster, 30):
        if remote.name not in ("stop_unit", "kill_process"):
            assert "sudo" not in remote.command, remote
            continue
        for step in remote.command.split(" && "):
            words = shlex.split(step)
            if "sudo" in words:
                found.append(words[words.index("sudo") + 2 :])
    return found


def allowed(sudoers: Path, argvs: list[list[str]]) -> list[bool]:
    checks = "; ".join(
        f"{SUDO} -n -l -U root -- {shlex.join(argv)} >/dev/null 2>&1; echo $?" for argv in argvs
    )
    script = f"mount --bind {shlex.quote(str(sudoers))} /etc/sudoers && {checks}"
    proc = subprocess.run([UNSHARE, "-m", "sh", "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return [line == "0" for line in proc.stdout.split()]


def require() -> None:
    """sudo, visudo and unshare, as root; a missing one skips here and fails in CI (.ci/run
    installs sudo and util-linux)."""
    why = None
    if None in (SUDO, VISUDO, UNSHARE):
        why = "needs sudo, visudo and unshare"
    elif os.geteuid() != 0:
        why = "a private mount or PID namespace needs root"
    if why is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why}: .ci/run must provide them")
    pytest.skip(why)


def test_sudoers_allows_exactly_the_catalogues_shapes(tmp_path: Path) -> None:
    require()
    sudoers = tmp_path / "sudoers"
    sudoers.write_text(snippet("root"))
    sudoers.chmod(0o440)
    check = subprocess.run([str(VISUDO), "-c", "-f", str(sudoers)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    wanted = sudo_commands()
    kinds = {argv[0] for argv in wanted}
    assert kinds == {"systemctl", "kill"}, wanted
    paths = [[shutil.which(a[0]) or a[0], *a[1:]] for a in wanted]
    assert all(allowed(sudoers, paths)), list(zip(paths, allowed(sudoers, paths), strict=True))
    units = reference_cluster().cleanup.units
    refused = [
        ["/usr/bin/kill", "-TERM", "1"],
        ["/usr/bin/kill", "-KILL", "0"],
        ["/usr/bin/kill", "-TERM", "-1"],
        ["/usr/bin/kill", "-TERM", "--", "-1"],
        ["/usr/bin/kill", "-TERM", "4100", "4101"],
        # procps `kill` reads these modulo 2^32: -1 (every process), 0 (its group), 1 (init).
        ["/usr/bin/kill", "-KILL", "4294967295"],
        ["/usr/bin/kill", "-KILL", "4294967296"],
        ["/usr/bin/kill", "-KILL", "4294967297"],
        ["/usr/bin/kill", "-KILL", "10000000"],
        ["/usr/bin/kill", "-KILL", "02"],
        ["/usr/bin/kill", "-HUP", "4100"],
        ["/usr/bin/kill", "-9", "4100"],
        ["/usr/bin/systemctl", "stop", "--", "ssh.service"],
        ["/usr/bin/systemctl", "start", "--", units[0]],
        ["/usr/bin/systemctl", "stop", "--", units[0], "ssh.service"],
        ["/usr/bin/systemctl", "stop", units[0]],
        ["/bin/sh", "-c", "id"],
        ["/usr/bin/id"],
    ]
    assert not any(allowed(sudoers, refused)), list(
        zip(refused, allowed(sudoers, refused), strict=True)
    )
    assert all(
        allowed(
            sudoers,
            [
                ["/usr/bin/kill", "-KILL", "2"],
                ["/usr/bin/kill", "-TERM", "41000"],
                ["/usr/bin/kill", "-TERM", "9999999"],
            ],
        )
    )


def survivors(kill_argv: list[str]) -> str:
    """Run `kill_argv` in a PID namespace of the test's own beside two sleeping processes;
    which of them are still alive afterwards."""
    script = (
        "sleep 60 & a=$!; sleep 60 & b=$!; "
        f"{shlex.join(kill_argv)} >/dev/null 2>&1; sleep 0.2; "
        'for p in $a $b; do kill -0 "$p" 2>/dev/null && printf "%s " alive; done; '
        'kill -KILL "$a" "$b" 2>/dev/null; true'
    )
    proc = subprocess.run(
        [str(UNSHARE), "--pid", "--fork", "--mount-proc", "sh", "-c", script],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_the_largest_pid_the_rule_allows_harms_nothing_and_the_wrapping_ones_would() -> None:
    require()
    kill = shutil.which("kill", path="/usr/bin:/bin") or "/usr/bin/kill"
    # What the rule allows at its edge names no process: everything else lives on.
    assert survivors([kill, "-KILL", "9999999"]) == "alive alive"
    # What it refuses, and why: procps kill reads 4294967295 as -1 and kills every process.
    assert survivors([kill, "-KILL", "4294967295"]) == ""


def test_the_whole_output_of_commands_sudoers_is_the_snippet_visudo_accepts(
    tmp_path: Path,
) -> None:
    """What the header says to do with it: the output as it is, into visudo."""
    require()
    assert VISUDO is not None
    proc = subprocess.run(
        [sys.executable, "-m", "sparkd.cli", "commands", "--config", str(EXAMPLE_CONFIG),
         "--sudoers", "root"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert proc.stdout.startswith("# sudoers snippet")
    sudoers = tmp_path / "sparkd"
    sudoers.write_text(proc.stdout)
    sudoers.chmod(0o440)
    check = subprocess.run([VISUDO, "-c", "-f", str(sudoers)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
