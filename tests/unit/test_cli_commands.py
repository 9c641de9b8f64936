"""`sparkd commands`: every remote command for review, and the sudoers entries that match them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.toy import EXAMPLE_CONFIG


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sparkd.cli", "commands", "--config", str(EXAMPLE_CONFIG), *args],
        capture_output=True,
        text=True,
        check=True,
    )


def test_lists_every_kind_of_command() -> None:
    out = run().stdout
    for name in (
        "facts",
        "stop_unit",
        "remove_container",
        "start_ray",
        "start_model",
        "kill_process",
    ):
        assert f"## {name} on spark-a" in out, name
    assert "## start_ray on spark-b (changes)" in out
    assert "## facts on spark-b (reads)" in out
    assert "docker run -d --name sparkd-sparks-ray-worker" in out
    assert "--pull=never" in out and "--restart=no" in out


def test_the_power_command_is_listed_per_host_when_configured(tmp_path: Path) -> None:
    assert "power_cycle" not in run().stdout
    text = EXAMPLE_CONFIG.read_text().replace(
        "[clusters.power]\n",
        '[clusters.power]\n  command = ["/usr/local/bin/spark-power", "cycle", "{host}"]\n',
        1,
    )
    config = tmp_path / "sparkd.toml"
    config.write_text(text)
    out = subprocess.run(
        [sys.executable, "-m", "sparkd.cli", "commands", "--config", str(config)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "## power_cycle of spark-b on the ops box (changes)\n" in out
    assert "/usr/local/bin/spark-power cycle spark-b\n" in out


def test_sudoers_snippet_names_only_the_privileged_commands() -> None:
    out = run("--sudoers", "aurora").stdout
    snippet = out[out.index("# sudoers snippet") :]
    assert "aurora ALL=(root) NOPASSWD: " in snippet
    for unit in ("vllm-cluster.service", "vllm-reranker.service"):
        assert f"/usr/bin/systemctl stop -- {unit}" in snippet
        assert f"/usr/bin/systemctl disable -- {unit}" in snippet
    # No wildcard: tests/ops/test_sudoers.py checks the snippet against real sudo.
    assert "*" not in snippet.split("NOPASSWD:", 1)[1]
    assert "docker" not in snippet.split("NOPASSWD:", 1)[1]


def test_sim_options_reach_the_simulator() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sparkd.cli", "sim", "--scenario", "nope"],
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    assert "nope" in result.stderr and "unrecognized arguments" not in result.stderr


def test_sim_and_demo_without_the_simulator_say_how_to_get_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from sparkd.cli import commands

    monkeypatch.setattr(commands, "entry_points", lambda **_: ())
    for name in ("sim", "demo"):
        assert commands.dispatch([name, "--dir", str(tmp_path)]) == commands.EX_USAGE
        assert "pip install sparkd-sim" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_sparkd_sim_and_sparkd_demo_are_the_same_programs() -> None:
    for program in (["-m", "sparkd_demo"], ["-m", "sparkd.cli", "sim"]):
        result = subprocess.run(
            [sys.executable, *program, "--scenario", "nope"], capture_output=True, text=True
        )
        assert result.returncode == 2 and "invalid choice: 'nope'" in result.stderr
    for program in (["-m", "sparkd_demo", "demo"], ["-m", "sparkd.cli", "demo"]):
        result = subprocess.run(
            [sys.executable, *program, "--fault", "nope", "--load-seconds", "x"],
            capture_output=True, text=True,
        )  # fmt: skip
        assert result.returncode == 2 and "invalid float value: 'x'" in result.stderr


def test_version_loads_nothing_else() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from sparkd.cli import main; main(['--version']); "
        "print(sorted(m for m in sys.modules if m.startswith(('sparkd.', 'pydantic', 'asyncssh'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    version, loaded = out.stdout.splitlines()
    assert version.startswith("sparkd ")
    assert loaded == "['sparkd.cli']"


def test_plan_and_probe_start_without_the_daemon_or_the_web_stack() -> None:
    import subprocess
    import sys

    code = (
        "import sys; import sparkd.cli.live; "
        "print(sorted(m for m in ('aiohttp', 'sparkd.runtime.daemon', 'sparkd.web.app', "
        "'sparkd.runtime.controller') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_status_loads_none_of_the_costly_standard_library() -> None:
    # `sparkd status` must start in well under 0.1 s beyond Python's own start (bench probe):
    # `http.client` pulls in the `email` parser and `ssl` (about half of that budget), and
    # `dataclasses` brings `inspect`. Run without site so an editable install's finder (which
    # loads pathlib itself) is not counted; a built wheel has none.
    import os
    import subprocess
    import sys
    from pathlib import Path

    costly = ("email", "http", "ssl", "dataclasses", "inspect", "pathlib", "asyncio")
    code = (
        "import sys; from sparkd.cli import api; "
        "api.daemon_address(api.config_path('/nonexistent/sparkd.toml')); "
        f"print(sorted(m for m in {costly!r} if m in sys.modules))"
    )
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root}
    out = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == "[]"
