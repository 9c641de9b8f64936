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


@pytest.mark.skipif(None in (SUDO, VISUDO, UNSHARE), reason="needs sudo, visudo and unshare")
@pytest.mark.skipif(os.geteuid() != 0, reason="a private mount namespace needs root")
def test_sudoers_allows_exactly_the_catalogues_shapes(tmp_path: Path) -> None:
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
    assert allowed(sudoers, [["/usr/bin/kill", "-KILL", "2"], ["/usr/bin/kill", "-TERM", "41000"]])
