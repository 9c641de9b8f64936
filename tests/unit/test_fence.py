"""Host-side fencing, run by a real shell with the real `flock` on this machine: a command
runs only if its token is not older than the host's record, under the lock, which a detached
child never keeps."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import pytest

from sparkd.model import exits
from sparkd.shell import catalogue
from sparkd.shell.catalogue.fence import FenceToken
from sparkd.shell.catalogue.remote import Remote

CLUSTER = "sparks"
ETCD = 14841639068965178418


def token(value: int, instance: str = "ops-a", etcd: int = ETCD) -> FenceToken:
    return FenceToken(CLUSTER, value, etcd, instance)


def command(text: str, fence: FenceToken, seconds: float = 10) -> str:
    return catalogue.fence.fenced(Remote("test", text, mutating=True), fence, seconds).command


def start(home: Path, text: str, shell: str = "bash", stdin: str = "") -> subprocess.Popen[str]:
    env = {"HOME": str(home), "PATH": os.environ["PATH"]}
    return subprocess.Popen(
        [shell, "-c", text], env=env, text=True, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def run(home: Path, text: str, shell: str = "bash", stdin: str = "") -> tuple[int, str, str]:
    proc = start(home, text, shell)
    out, err = proc.communicate(stdin, timeout=30)
    return proc.returncode, out, err


def record(home: Path) -> str:
    return (home / catalogue.fence.FENCE_DIR / CLUSTER).read_text()


def lock_free(home: Path) -> bool:
    """Whether nobody holds the cluster's lock now (a non-blocking `flock` gets it)."""
    lock = home / catalogue.fence.FENCE_DIR / f"{CLUSTER}.lock"
    return subprocess.run(["flock", "-n", str(lock), "true"], check=False).returncode == 0


@pytest.mark.parametrize("shell", ["bash", "sh"])
def test_a_lower_token_is_refused_with_76_and_runs_nothing(tmp_path: Path, shell: str) -> None:
    marker = tmp_path / "ran"
    assert run(tmp_path, command("echo ten", token(10)), shell)[:2] == (0, "ten\n")
    rc, _, err = run(tmp_path, command(f"touch {marker}", token(9, "ops-b")), shell)
    assert rc == exits.FENCED_EXIT
    assert not marker.exists()
    assert f"{catalogue.fence.FENCE_MARKER} sparks: refused token 9: a newer one is recorded" in err
    assert "10" not in err and "ops-a" not in err and str(ETCD) not in err
    assert record(tmp_path) == f"10 {ETCD} ops-a\n"
    # The same token again, and a newer one, run; the record follows the newer.
    assert run(tmp_path, command("echo again", token(10)), shell)[:2] == (0, "again\n")
    assert run(tmp_path, command(f"touch {marker}", token(12, "ops-b")), shell)[0] == 0
    assert marker.exists()
    assert record(tmp_path) == f"12 {ETCD} ops-b\n"


def test_the_command_keeps_its_exit_status_and_its_stdin(tmp_path: Path) -> None:
    assert run(tmp_path, command("exit 3", token(4)))[0] == 3
    assert run(tmp_path, command("cat", token(4)), stdin="secret\n")[:2] == (0, "secret\n")


def test_concurrent_tokens_run_in_order_and_a_stale_one_never_runs(tmp_path: Path) -> None:
    log = tmp_path / "log"
    old = start(tmp_path, command(f"sleep 1.5; echo 5 >> {log}", token(5)))
    # Token 5 holds the lock while its command runs; its shell may take a while to get there
    # on a loaded machine, so the test waits for that rather than for a fixed time.
    deadline = time.monotonic() + 20
    while lock_free(tmp_path):
        assert time.monotonic() < deadline and old.poll() is None
        time.sleep(0.02)
    new = start(tmp_path, command(f"echo 7 >> {log}", token(7, "ops-b")))
    old.communicate(timeout=30)
    new.communicate(timeout=30)
    assert (old.returncode, new.returncode) == (0, 0)
    # The newer owner's command waited for the one in flight, so it sees its effect.
    assert log.read_text() == "5\n7\n"
    assert run(tmp_path, command(f"echo 5 >> {log}", token(5)))[0] == exits.FENCED_EXIT
    assert log.read_text() == "5\n7\n"


def test_racing_tokens_leave_the_highest_and_run_none_after_a_higher(tmp_path: Path) -> None:
    log = tmp_path / "log"
    tokens = [3, 9, 1, 7, 8, 2, 9, 4, 6, 5]
    procs = [start(tmp_path, command(f"echo {t} >> {log}", token(t))) for t in tokens]
    codes = {}
    for t, proc in zip(tokens, procs, strict=True):
        proc.communicate(timeout=30)
        codes.setdefault(t, set()).add(proc.returncode)
    ran = [int(line) for line in log.read_text().split()]
    assert ran == sorted(ran), ran  # tokens never go backwards on the host
    assert 9 in ran and record(tmp_path).startswith("9 ")
    for t, found in codes.items():
        assert found <= ({0} if t in ran else {exits.FENCED_EXIT}), (t, found)


def held_files(pid: int) -> list[str]:
    """What `pid`'s descriptors name now. A descriptor may close while it is read (the dynamic
    loader opens and closes the libraries right after an exec): it holds nothing then."""
    held = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(FileNotFoundError):
            held.append(os.readlink(fd))
    return held


@pytest.mark.parametrize(
    "detach", ["setsid sleep 30 >/dev/null 2>&1 &", "nohup sleep 30 >/dev/null 2>&1 &"]
)
def test_a_detached_child_never_holds_the_lock(tmp_path: Path, detach: str) -> None:
    pidfile = tmp_path / "child"
    rc, _, err = run(tmp_path, command(f"{detach} echo $! > {pidfile}", token(3)))
    assert rc == 0, err
    child = int(pidfile.read_text())
    try:
        # Once it runs `sleep` (before its exec, the forked shell still has bash's own
        # close-on-exec copies of its descriptors).
        deadline = time.monotonic() + 10
        while Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[0] != b"sleep":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        lock = str(tmp_path / catalogue.fence.FENCE_DIR / f"{CLUSTER}.lock")
        assert lock not in held_files(child)
        assert lock_free(tmp_path)
        started = time.monotonic()
        assert run(tmp_path, command("true", token(4)))[0] == 0
        assert time.monotonic() - started < 5  # not behind the child's 30 s
    finally:
        os.kill(child, 9)


def test_another_etcd_or_an_unreadable_record_fails_closed_until_refenced(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    assert run(tmp_path, command("true", token(50)))[0] == 0
    rebuilt = token(3, "ops-b", etcd=77)
    rc, _, err = run(tmp_path, command(f"touch {marker}", rebuilt))
    assert rc == exits.FENCE_MISMATCH_EXIT and not marker.exists()
    assert "run sparkd ha refence sparks" in err
    # Refencing with the old etcd's token refuses an older one as ever; with the new etcd's
    # it takes the record over, and the new owner's commands run.
    assert run(tmp_path, catalogue.fence.fence_sweep(token(49), 10, refence=True).command)[0] == 76
    assert run(tmp_path, catalogue.fence.fence_sweep(rebuilt, 10, refence=True).command)[0] == 0
    assert record(tmp_path) == "3 77 ops-b\n"
    assert run(tmp_path, command(f"touch {marker}", rebuilt))[0] == 0 and marker.exists()
    (tmp_path / catalogue.fence.FENCE_DIR / CLUSTER).write_text("garbage\n")
    assert run(tmp_path, command("true", rebuilt))[0] == exits.FENCE_MISMATCH_EXIT
    (tmp_path / catalogue.fence.FENCE_DIR / CLUSTER).write_text("")
    assert run(tmp_path, command("true", rebuilt))[0] == exits.FENCE_MISMATCH_EXIT


def test_a_record_survives_a_reboot_the_lock_does_not(tmp_path: Path) -> None:
    assert run(tmp_path, command("true", token(8)))[0] == 0
    (tmp_path / catalogue.fence.FENCE_DIR / f"{CLUSTER}.lock").unlink()  # /run-like state gone
    assert run(tmp_path, command("true", token(7)))[0] == exits.FENCED_EXIT
    assert run(tmp_path, command("true", token(8)))[0] == 0


def test_reads_are_never_fenced_and_values_are_quoted() -> None:
    with pytest.raises(ValueError):
        catalogue.fence.fenced(Remote("facts", "true", mutating=False), token(1), 5)
    with pytest.raises(ValueError):
        FenceToken(CLUSTER, 0, ETCD, "ops-a")
    text = catalogue.fence.fence_sweep(FenceToken("a.b-c", 12, 34, "ops_1"), 2.5).command
    assert "sparkd_fence a.b-c 12 34 ops_1 3 && { true\n} 9>&-" in text
