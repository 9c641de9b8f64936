"""The forced-command wrapper with `[ha]`: mutating commands pass only behind the fence prefix,
and the wrapper does the compare-and-set itself (Python's flock on the same files as the shell
prefix), holding the lock while the command runs and never passing it on."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkd.model import exits
from sparkd.model.cluster import ClusterSpec
from sparkd.shell import catalogue, forced
from sparkd.shell.catalogue.fence import FenceToken
from tests.toy import reference_cluster

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample sparkd"
ETCD = 4242


def program(tmp_path: Path, cluster: ClusterSpec, fenced: bool = True) -> Path:
    path = tmp_path / "wrapper"
    path.write_text(forced.wrapper(cluster, cluster.head, KEY, fenced=fenced))
    return path


def tools(tmp_path: Path) -> Path:
    """`kill` and `docker` stand-ins that log their arguments."""
    directory = tmp_path / "bin"
    directory.mkdir(exist_ok=True)
    for tool in ("kill", "docker", "systemctl"):
        if (directory / tool).exists():
            continue
        (directory / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {tmp_path}/calls\n')
        (directory / tool).chmod(0o755)
    return directory


def start(tmp_path: Path, wrapper: Path, command: str, *args: str) -> subprocess.Popen[str]:
    env = {
        "HOME": str(tmp_path),
        "PATH": f"{tools(tmp_path)}:{os.environ['PATH']}",
        "SSH_ORIGINAL_COMMAND": command,
    }
    return subprocess.Popen(
        [sys.executable, str(wrapper), *args], env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def run(tmp_path: Path, wrapper: Path, command: str, *args: str) -> tuple[int, str]:
    proc = start(tmp_path, wrapper, command, *args)
    _, err = proc.communicate(timeout=30)
    return proc.returncode, err


def calls(tmp_path: Path) -> list[str]:
    path = tmp_path / "calls"
    return path.read_text().splitlines() if path.exists() else []


def fence(value: int, cluster: ClusterSpec, instance: str = "ops-a") -> FenceToken:
    return FenceToken(cluster.name, value, ETCD, instance)


def test_a_fenced_wrapper_takes_mutations_only_behind_the_prefix(tmp_path: Path) -> None:
    cluster = reference_cluster()
    wrapper = program(tmp_path, cluster)
    seconds = cluster.ssh.command_timeout
    kill = catalogue.actions.kill_process(cluster, 4100, "TERM", seconds)
    assert run(tmp_path, wrapper, kill.command)[0] == exits.REFUSED_EXIT
    facts = catalogue.reads.fact_script(
        cluster, cluster.head, catalogue.remote.tool_timeout(cluster), read_ray=False
    )
    assert run(tmp_path, wrapper, facts.command, "--check")[0] == 0  # reads pass bare
    wrapped = catalogue.fence.fenced(kill, fence(7, cluster), seconds).command
    assert run(tmp_path, wrapper, wrapped, "--check")[0] == 0
    # Another cluster's prefix, or a command outside the catalogue behind the prefix: refused.
    other = catalogue.fence.fenced(kill, FenceToken("elsewhere", 7, ETCD, "ops-a"), seconds)
    assert run(tmp_path, wrapper, other.command, "--check")[0] == exits.REFUSED_EXIT
    stray = catalogue.fence.fenced(
        catalogue.remote.Remote("x", "id", True), fence(7, cluster), seconds
    )
    assert run(tmp_path, wrapper, stray.command, "--check")[0] == exits.REFUSED_EXIT
    sweep = catalogue.fence.fence_sweep(fence(7, cluster), seconds).command
    assert run(tmp_path, wrapper, sweep, "--check")[0] == 0
    # Unfenced (no [ha]): the bare form passes, the prefix does not.
    (tmp_path / "plain").mkdir()
    plain = program(tmp_path / "plain", cluster, fenced=False)
    assert run(tmp_path, plain, kill.command, "--check")[0] == 0
    assert run(tmp_path, plain, wrapped, "--check")[0] == exits.REFUSED_EXIT


def test_the_wrapper_refuses_an_older_token_and_shares_the_shells_record(tmp_path: Path) -> None:
    cluster = reference_cluster()
    wrapper = program(tmp_path, cluster)
    seconds = cluster.ssh.command_timeout
    kill = catalogue.actions.kill_process(cluster, 4100, "TERM", seconds)
    assert (
        run(tmp_path, wrapper, catalogue.fence.fenced(kill, fence(9, cluster), seconds).command)[0]
        == 0
    )
    assert calls(tmp_path) == ["kill -TERM 4100"]
    record = tmp_path / catalogue.fence.FENCE_DIR / cluster.name
    assert record.read_text() == f"9 {ETCD} ops-a\n"
    status, err = run(
        tmp_path, wrapper, catalogue.fence.fenced(kill, fence(8, cluster, "ops-b"), seconds).command
    )
    assert status == exits.FENCED_EXIT
    said = (
        f"{catalogue.fence.FENCE_MARKER} {cluster.name}: refused token 8: a newer one is recorded\n"
    )
    assert err == said  # the record's token, etcd cluster ID and instance stay on the host
    assert calls(tmp_path) == ["kill -TERM 4100"]
    # The shell prefix (a host without the wrapper) reads the same record.
    shell = subprocess.run(
        ["bash", "-c", catalogue.fence.fence_sweep(fence(8, cluster), seconds).command],
        env={"HOME": str(tmp_path), "PATH": os.environ["PATH"]}, capture_output=True, text=True,
    )  # fmt: skip
    assert shell.returncode == exits.FENCED_EXIT
    record.write_text(f"3 {ETCD + 1} ops-z\n")  # another etcd's record
    status, err = run(
        tmp_path, wrapper, catalogue.fence.fenced(kill, fence(9, cluster), seconds).command
    )
    assert status == exits.FENCE_MISMATCH_EXIT and "refence" in err
    refence = catalogue.fence.fence_sweep(fence(9, cluster), seconds, refence=True).command
    assert run(tmp_path, wrapper, refence)[0] == 0
    assert record.read_text() == f"9 {ETCD} ops-a\n"


def test_the_wrapper_holds_the_lock_while_the_command_runs_and_never_passes_it_on(
    tmp_path: Path,
) -> None:
    cluster = reference_cluster()
    wrapper = program(tmp_path, cluster)
    seconds = cluster.ssh.command_timeout
    bin_dir = tools(tmp_path)
    # A `kill` that leaves a detached child behind and takes a while itself.
    (bin_dir / "kill").write_text(
        f"#!/bin/sh\nsetsid sleep 30 >/dev/null 2>&1 < /dev/null &\necho $! > {tmp_path}/child\n"
        f'sleep 1.5; echo "kill $*" >> {tmp_path}/calls\n'
    )
    kill = catalogue.actions.kill_process(cluster, 4100, "TERM", seconds)
    old = start(tmp_path, wrapper, catalogue.fence.fenced(kill, fence(5, cluster), seconds).command)
    deadline = time.monotonic() + 20
    while not (tmp_path / "child").exists():  # the command runs, behind the fence
        assert time.monotonic() < deadline
        time.sleep(0.02)
    lock = tmp_path / catalogue.fence.FENCE_DIR / f"{cluster.name}.lock"
    assert subprocess.run(["flock", "-n", str(lock), "true"], check=False).returncode == 1
    sweep = catalogue.fence.fence_sweep(fence(6, cluster, "ops-b"), seconds).command
    new = start(tmp_path, wrapper, sweep)
    old.communicate(timeout=30)
    new.communicate(timeout=30)
    assert (old.returncode, new.returncode) == (0, 0)
    child = int((tmp_path / "child").read_text())
    try:
        assert Path(f"/proc/{child}").exists()
        assert subprocess.run(["flock", "-n", str(lock), "true"], check=False).returncode == 0
        held = [os.readlink(f) for f in Path(f"/proc/{child}/fd").iterdir()]
        assert str(lock) not in held
    finally:
        os.kill(child, 9)
    assert calls(tmp_path) == ["kill -TERM 4100"]
    # The sweep ran after the old command finished, so the old token is refused from now on.
    status, _ = run(
        tmp_path, wrapper, catalogue.fence.fenced(kill, fence(5, cluster), seconds).command
    )
    assert status == exits.FENCED_EXIT


def test_with_host_fencing_off_the_wrapper_takes_the_owner_tagged_form(tmp_path: Path) -> None:
    """`[ha] host_fencing = false`: the executor sends `: sparkd-unfenced CLUSTER TOKEN
    INSTANCE; COMMAND` (catalogue.fence.audited); the wrapper generated from that config runs it,
    and still refuses it for another cluster or around a command outside the catalogue."""
    from tests.toy import EXAMPLE_CONFIG

    cluster = reference_cluster()
    config = tmp_path / "sparkd.toml"
    text = EXAMPLE_CONFIG.read_text().replace(
        'state_dir = "/var/lib/sparkd"', f'state_dir = "{tmp_path / "state"}"'
    )
    ha = '\n[ha]\netcd_endpoints = ["http://127.0.0.1:23790"]\nhost_fencing = false\n'
    config.write_text(text + ha)
    done = subprocess.run(
        [sys.executable, "-m", "sparkd.cli", "commands", "--config", str(config),
         "--forced-command", "--host", cluster.head.name],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    wrapper = tmp_path / "wrapper"
    wrapper.write_text(done.stdout)
    seconds = cluster.ssh.command_timeout
    kill = catalogue.actions.kill_process(cluster, 4100, "TERM", seconds)
    tagged = catalogue.fence.audited(kill, fence(7, cluster)).command
    assert run(tmp_path, wrapper, kill.command)[0] == exits.REFUSED_EXIT  # never bare
    assert run(tmp_path, wrapper, tagged) == (0, "")
    assert calls(tmp_path) == ["kill -TERM 4100"]
    other = catalogue.fence.audited(kill, FenceToken("elsewhere", 7, ETCD, "ops-a")).command
    assert run(tmp_path, wrapper, other, "--check")[0] == exits.REFUSED_EXIT
    stray = catalogue.fence.audited(
        catalogue.remote.Remote("x", "id", True), fence(7, cluster)
    ).command
    assert run(tmp_path, wrapper, stray, "--check")[0] == exits.REFUSED_EXIT
    # With fencing on, the tagged form is not taken.
    assert run(tmp_path, program(tmp_path, cluster), tagged, "--check")[0] == exits.REFUSED_EXIT


def _shell(tmp_path: Path, command: str) -> tuple[int, str]:
    done = subprocess.run(
        ["sh", "-c", command], env={"HOME": str(tmp_path), "PATH": os.environ["PATH"]},
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    return done.returncode, done.stderr


def test_a_token_above_any_etcd_revision_locks_no_owner_out(tmp_path: Path) -> None:
    """The key holder writes a 19-digit token (above int64's range as the shell compares it) or
    sends one through the wrapper: the wrapper and the shell prefix agree to compare neither,
    and `refence` takes such a record over."""
    cluster = reference_cluster()
    wrapper = program(tmp_path, cluster)
    seconds = cluster.ssh.command_timeout
    kill = catalogue.actions.kill_process(cluster, 4100, "TERM", seconds)
    huge = "9" * 19
    sent = catalogue.fence.fenced(kill, fence(7, cluster), seconds).command.replace(
        f"sparkd_fence {cluster.name} 7 ", f"sparkd_fence {cluster.name} {huge} "
    )
    assert huge in sent
    assert run(tmp_path, wrapper, sent, "--check")[0] == exits.REFUSED_EXIT
    assert _shell(tmp_path, sent)[0] == exits.FENCE_MISMATCH_EXIT
    assert calls(tmp_path) == []
    record = tmp_path / catalogue.fence.FENCE_DIR / cluster.name
    record.parent.mkdir(parents=True)
    for planted in (huge, "1" + "0" * 18):
        record.write_text(f"{planted} {ETCD} ops-z\n")
        owner = catalogue.fence.fenced(kill, fence(9, cluster), seconds).command
        status, err = run(tmp_path, wrapper, owner)
        assert status == exits.FENCE_MISMATCH_EXIT and "refence" in err, err
        assert _shell(tmp_path, owner)[0] == exits.FENCE_MISMATCH_EXIT
        assert record.read_text() == f"{planted} {ETCD} ops-z\n"
        assert planted not in err and str(ETCD) not in err and "ops-z" not in err
        sweep = catalogue.fence.fence_sweep(fence(9, cluster), seconds, refence=True).command
        assert run(tmp_path, wrapper, sweep)[0] == 0
        assert record.read_text() == f"9 {ETCD} ops-a\n"
    assert calls(tmp_path) == []
    with pytest.raises(ValueError):
        fence(10**18, cluster)


def test_refence_force_replaces_a_newer_token_of_the_same_etcd(tmp_path: Path) -> None:
    """A token within range but above every revision etcd will reach: only `--force` gets the
    owner back, through the wrapper and the shell prefix alike; a plain refence never does."""
    cluster = reference_cluster()
    wrapper = program(tmp_path, cluster)
    seconds = cluster.ssh.command_timeout
    record = tmp_path / catalogue.fence.FENCE_DIR / cluster.name
    record.parent.mkdir(parents=True)
    planted = f"{10**17} {ETCD} ops-z\n"
    for runner in ("wrapper", "shell"):
        record.write_text(planted)
        refence = catalogue.fence.fence_sweep(fence(9, cluster), seconds, refence=True).command
        force = catalogue.fence.fence_sweep(fence(9, cluster), seconds, force=True).command
        if runner == "wrapper":
            status, err = run(tmp_path, wrapper, refence)
            assert status == exits.FENCED_EXIT and str(10**17) not in err
            assert run(tmp_path, wrapper, force)[0] == 0
        else:
            assert _shell(tmp_path, refence)[0] == exits.FENCED_EXIT
            assert _shell(tmp_path, force)[0] == 0
        assert record.read_text() == f"9 {ETCD} ops-a\n", runner
    # A forced sweep is a sweep: nothing but `true` runs behind it.
    stray = catalogue.fence.fence_sweep(fence(9, cluster), seconds, force=True).command
    assert run(tmp_path, wrapper, stray.replace("true\n}", "id\n}"), "--check")[0] == 126
