"""A real OpenSSH sshd on loopback, for the tier that checks sparkd against OpenSSH itself.

Skipped with a message where sshd is missing, except under CI=true, where it must be there
(.ci/run installs openssh-server).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from sparkd.model.cluster import ClusterSpec
from sparkd.model.spec import HostSpec, SshSpec
from sparkd.shell import forced
from sparkd_sim.openssh import LOGIN_USER, ensure_login_user
from sparkd_sim.timing import Timing
from sparkd_sim.world import Scenario, World
from tests.support.addresses import run_octet
from tests.toy import reference_cluster

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)


@dataclass(frozen=True)
class RealSshd:
    address: str
    port: int
    user: str
    key_file: Path
    known_hosts: Path
    other_key_file: Path


def _free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        port: int = sock.getsockname()[1]
        return port


def require_sshd() -> None:
    if SSHD is None:
        if os.environ.get("CI") == "true":
            pytest.fail("sshd is missing: .ci/run must install openssh-server")
        pytest.skip("no sshd on this machine (apt-get install openssh-server)")
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("the OpenSSH tier needs root in CI (sshd's privilege separation)")
        pytest.skip("a real sshd needs root here (privilege separation)")


@contextmanager
def running_sshd(tmp_path: Path, extra_config: str = "") -> Iterator[RealSshd]:
    """sshd on a free loopback port, its authorized_keys at tmp_path/authorized_keys (read at
    each login, so a test may rewrite it); `extra_config` is appended to sshd_config."""
    require_sshd()
    # Debian's sshd refuses to start without its privilege-separation directory.
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    user = pwd.getpwuid(os.geteuid()).pw_name
    address = "127.0.0.1"
    port = _free_port(address)
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    client_key = asyncssh.generate_private_key("ssh-ed25519")
    other_key = asyncssh.generate_private_key("ssh-ed25519")
    host_key_file = tmp_path / "ssh_host_ed25519_key"
    host_key.write_private_key(str(host_key_file))
    host_key_file.chmod(0o600)
    key_file = tmp_path / "id_ed25519"
    client_key.write_private_key(str(key_file))
    key_file.chmod(0o600)
    other_key_file = tmp_path / "other_ed25519"
    other_key.write_private_key(str(other_key_file))
    other_key_file.chmod(0o600)
    authorized = tmp_path / "authorized_keys"
    authorized.write_bytes(client_key.export_public_key())
    known_hosts = tmp_path / "known_hosts"
    public = host_key.export_public_key().decode().strip()
    known_hosts.write_text(f"[{address}]:{port} {public}\n")
    config = tmp_path / "sshd_config"
    config.write_text(
        f"ListenAddress {address}:{port}\n"
        f"HostKey {host_key_file}\n"
        f"AuthorizedKeysFile {authorized}\n"
        "PidFile none\nUsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PermitRootLogin prohibit-password\nStrictModes no\nUseDNS no\n"
        "MaxSessions 30\nMaxStartups 30\nAllowTcpForwarding yes\nLogLevel ERROR\n" + extra_config
    )
    proc = subprocess.Popen([SSHD, "-f", str(config), "-D", "-e"], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection((address, port), timeout=0.5):
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read().decode() if proc.stderr else ""
                proc.kill()
                pytest.fail(f"sshd did not start: {err}")
            time.sleep(0.05)
    try:
        yield RealSshd(address, port, user, key_file, known_hosts, other_key_file)
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cluster_behind(
    sshd: RealSshd, ssh: dict[str, Any] | None = None, **sections: dict[str, Any]
) -> ClusterSpec:
    """The reference cluster with its head behind `sshd` (its workers as they are), some fields of
    its ssh section (`ssh=`) and of other sections replaced (e.g. `model={"port": 1}`)."""
    reference = reference_cluster()
    head = reference.head.model_copy(update={"address": sshd.address, "port": sshd.port})
    ssh_spec = SshSpec(
        user=sshd.user,
        key_file=sshd.key_file,
        known_hosts_file=sshd.known_hosts,
        connect_timeout=5.0,
        command_timeout=10.0,
    ).model_copy(update=ssh or {})
    updates = {
        name: getattr(reference, name).model_copy(update=fields)
        for name, fields in sections.items()
    }
    return reference.model_copy(
        update={"hosts": (head, *reference.workers), "ssh": ssh_spec, **updates}
    )


def install_forced_command(
    directory: Path, cluster: ClusterSpec, host: HostSpec, *, fenced: bool = False
) -> None:
    """sparkd's forced-command wrapper for `host` at directory/sparkd-forced-command, and
    sshd's authorized_keys (running_sshd's, in the same directory) holding only its line."""
    program = directory / "sparkd-forced-command"
    key = forced.public_key(cluster.ssh)
    text = forced.wrapper(cluster, host, key, str(program), fenced=fenced)
    program.write_text(text)
    program.chmod(0o755)
    line = next(line[2:] for line in text.splitlines() if line.startswith('# command="'))
    (directory / "authorized_keys").write_text(line + "\n")


# -- the simulated world with a real sshd per host ---------------------------------------------

# Address blocks of this run's own (127.N.128.2 up): in this tier the model really listens on port
# 30000 of its head's address, so two runs on one machine must not share a head address. Apart
# from tests/live's 127.N.0.x blocks.
FIRST_ADDRESS = f"127.{run_octet()}.128.2"


def openssh_world(directory: Path, scenario: Scenario, **options: Any) -> World:
    """A world whose hosts each run a real OpenSSH sshd (skipped where there is none)."""
    require_sshd()
    ensure_login_user()
    options.setdefault("timing", Timing.fast())
    return World(
        directory,
        scenario=scenario,
        first_address=FIRST_ADDRESS,
        user=LOGIN_USER,
        ssh_server="openssh",
        **options,
    )
