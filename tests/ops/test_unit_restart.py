"""A config error is not restarted: systemd's RestartPreventExitStatus= looks at the main
process's exit status only (systemd.service(5)), so the check runs inside ExecStart's process,
which then becomes `sparkd run` with the same PID (MAINPID, NotifyAccess=main)."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

from tests.ops.tools import UNIT, analyze_unit, setting

SPARKD = "/usr/local/bin/sparkd"


def exec_start(stub: Path) -> list[str]:
    [line] = re.findall(r"^ExecStart=(.*)$", UNIT.read_text(), flags=re.M)
    return [word.replace(SPARKD, str(stub)) for word in shlex.split(line)]


def stand_in(tmp_path: Path, check_status: int) -> tuple[Path, Path]:
    """A `sparkd` that exits `check_status` for check-config and records its PID for run."""
    calls = tmp_path / "calls"
    stub = tmp_path / "sparkd"
    stub.write_text(
        "#!/bin/sh\n"
        f'echo "$1 $$" >> {calls}\n'
        f'[ "$1" = check-config ] && exit {check_status}\n'
        "exit 0\n"
    )
    stub.chmod(0o755)
    return stub, calls


def test_a_config_error_is_the_main_process_exit_status(tmp_path: Path) -> None:
    assert not re.search(r"^ExecStartPre=", UNIT.read_text(), flags=re.M)
    assert "78" in setting("RestartPreventExitStatus").split()
    stub, calls = stand_in(tmp_path, 78)
    main = subprocess.run(exec_start(stub), timeout=30, check=False)
    assert main.returncode == 78
    assert [line.split()[0] for line in calls.read_text().splitlines()] == ["check-config"]


def test_a_good_config_becomes_sparkd_run_in_the_same_process(tmp_path: Path) -> None:
    stub, calls = stand_in(tmp_path, 0)
    main = subprocess.Popen(exec_start(stub))
    assert main.wait(timeout=30) == 0
    steps = [line.split() for line in calls.read_text().splitlines()]
    assert [step[0] for step in steps] == ["check-config", "run"]
    assert steps[1][1] == str(main.pid)  # exec: sparkd run is the main process


def test_the_unit_verifies(tmp_path: Path) -> None:
    result = analyze_unit(tmp_path, "verify")
    assert result.returncode == 0, result.stderr
