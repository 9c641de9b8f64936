"""The power command as the executor runs it on the ops box: argv only, `{host}` inside its own
element, its output redacted, killed with everything it started at its timeout."""

from __future__ import annotations

import asyncio
import os
import resource
import sys
import time
from pathlib import Path

import pytest

from sparkd.model.cluster import PowerSpec
from sparkd.model.plan import Action
from sparkd.shell.catalogue.fence import FenceToken
from sparkd.shell.execute import Executor
from sparkd.shell.fencing import HostFence
from sparkd.shell.power import OUTPUT_KEPT, PowerFailed, power_argv, run_power
from sparkd.shell.ssh import SshPool
from tests.toy import reference_cluster


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "pdu.py"
    path.write_text(body)
    return str(path)


def test_the_host_is_substituted_inside_its_element_and_no_shell_reads_it(tmp_path: Path) -> None:
    marker = tmp_path / "touched"
    pdu = script(tmp_path, "import sys\nprint(repr(sys.argv[1:]))\n")
    spec = PowerSpec(command=(sys.executable, pdu, "--outlet={host}", f"$(touch {marker})"))
    argv = power_argv(spec, "spark-b")
    said = asyncio.run(run_power(argv, 10.0))
    assert said == f"['--outlet=spark-b', '$(touch {marker})']"
    assert not marker.exists()


def test_a_non_zero_exit_fails_with_the_output_redacted(tmp_path: Path) -> None:
    pdu = script(
        tmp_path,
        "import sys\nprint('login admin password=hunter2 token: abc123')\n"
        "print('outlet 7: no such outlet', file=sys.stderr)\nsys.exit(4)\n",
    )
    with pytest.raises(PowerFailed) as caught:
        asyncio.run(run_power([sys.executable, pdu], 10.0))
    text = str(caught.value)
    assert "exited 4" in text and "outlet 7: no such outlet" in text
    assert "hunter2" not in text and "abc123" not in text
    assert "password=***" in text


def test_at_its_timeout_the_command_and_what_it_started_are_killed(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    pdu = script(
        tmp_path,
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "time.sleep(60)\n",
    )
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        asyncio.run(run_power([sys.executable, pdu], 3.0))
    assert time.monotonic() - started < 30
    for pid in map(int, pids.read_text().split()):
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie not yet reaped by its parent (init, here) has ended too.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def test_a_missing_program_fails_without_a_traceback(tmp_path: Path) -> None:
    with pytest.raises(PowerFailed, match="No such file"):
        asyncio.run(run_power([str(tmp_path / "nope"), "cycle", "spark-b"], 5.0))


def test_an_instance_that_does_not_own_the_cluster_never_runs_the_power_command(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "cycled"
    pdu = script(tmp_path, f"open({str(marker)!r}, 'a').write('x')\n")
    base = reference_cluster()
    cluster = base.model_copy(
        update={"power": PowerSpec(command=(sys.executable, pdu, "{host}"), timeout=10.0)}
    )
    owner: list[FenceToken | None] = [None]
    fence = HostFence(cluster, SshPool(), lambda: owner[0])
    executor = Executor(cluster, SshPool(), fence=fence)
    host = cluster.hosts[-1].name
    action = Action(kind="power_cycle", host=host, target=host, reason="wedged")

    refused = asyncio.run(executor.run_one(action))
    assert refused.result == "skipped" and "not owner" in refused.detail
    assert not marker.exists()

    owner[0] = FenceToken("sparks", 30, 5, "ops-a")
    done = asyncio.run(executor.run_one(action))
    assert done.result == "ok", done.detail
    assert marker.read_text() == "x"


def test_a_flood_of_output_is_read_into_a_bounded_tail(tmp_path: Path) -> None:
    # 256 MiB then the last words: the whole would have been held at once.
    pdu = script(
        tmp_path,
        "import sys\nblock = b'x' * (1 << 20) + b'\\n'\n"
        "for _ in range(256):\n    sys.stdout.buffer.write(block)\n"
        "sys.stdout.buffer.write(b'outlet 7 cycled\\n')\n",
    )
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    said = asyncio.run(run_power([sys.executable, pdu], 60.0))
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert said.endswith("outlet 7 cycled") and len(said) <= OUTPUT_KEPT
    assert grown < 64 << 20, grown


def test_credentials_it_echoes_and_terminal_escapes_never_come_back(tmp_path: Path) -> None:
    echoed = [
        "ipmitool -I lanplus -H pdu-1 -U admin -P hunter2 chassis power cycle",
        "snmpset -v2c -c s3cr3t-community pdu-1 PowerNet-MIB::sPDUOutletCtl.7 i 3",
        "GET http://admin:pa55word@pdu-1/outlet?7=cycle",
        "Authorization: Basic YWRtaW46cGE1NXdvcmQ=",
        "\x1b]0;owned\x07\x1b[2J\x1b[31mred\x1b[0m outlet 7 cycled",
    ]
    pdu = script(tmp_path, f"for line in {echoed!r}:\n    print(line)\n")
    said = asyncio.run(run_power([sys.executable, pdu], 10.0))
    for secret in ("hunter2", "s3cr3t-community", "pa55word", "YWRtaW46cGE1NXdvcmQ="):
        assert secret not in said, said
    assert "\x1b" not in said and "\x07" not in said
    assert "-P ***" in said and "http://admin:***@pdu-1" in said and "outlet 7 cycled" in said


def test_at_its_timeout_a_child_that_left_the_group_is_killed_too(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    pdu = script(
        tmp_path,
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
        " start_new_session=True)\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "time.sleep(60)\n",
    )
    with pytest.raises(TimeoutError):
        asyncio.run(run_power([sys.executable, pdu], 3.0))
    survivors = []
    for pid in map(int, pids.read_text().split()):
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pid):
            survivors.append(pid)
            os.kill(pid, 9)
    assert survivors == []
