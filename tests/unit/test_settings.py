"""Config: the shipped example, every cross-field rule, env overrides and the exit-78 format."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sparkd.settings import EX_CONFIG, ConfigError, load_settings
from tests.toy import EXAMPLE_CONFIG

BASE = EXAMPLE_CONFIG.read_text()


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sparkd.toml"
    path.write_text(text)
    return path


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, text))
    return info.value.problems


def test_example_config_loads() -> None:
    settings = load_settings(EXAMPLE_CONFIG)
    cluster = settings.clusters[0]
    assert cluster.head.ip == "192.168.200.12"
    assert [w.ip for w in cluster.workers] == ["192.168.200.13"]
    assert cluster.ray.image == "hellohal2064/vllm-qwen3.5-gb10"
    assert cluster.model.id == "/models/Qwen3.5-122B-A10B-FP8"
    assert cluster.model.port == 30000
    assert "--reasoning-parser" in cluster.model.extra_args
    assert len(cluster.cleanup.units) == 4
    assert cluster.ray.env["RAY_memory_monitor_refresh_ms"] == "0"
    assert cluster.policy.allow_kill_foreign_gpu is False
    assert (cluster.interval, cluster.probe_interval, cluster.recheck_interval) == (30, 60, 5)
    assert settings.daemon.listen == "127.0.0.1:9810"


RULES = [
    (
        "two_heads",
        ('role = "worker"', 'role = "head"'),
        "clusters.0: needs exactly one host with role head, found 2",
    ),
    (
        "no_head",
        ('role = "head"', 'role = "worker"'),
        "needs exactly one host with role head, found 0",
    ),
    (
        "duplicate_host_name",
        ('name = "spark-b"', 'name = "spark-a"'),
        "duplicate host name 'spark-a'",
    ),
    (
        "duplicate_data_ip",
        ('data_ip = "192.168.200.13"', 'data_ip = "192.168.200.12"'),
        "duplicate host data_ip '192.168.200.12'",
    ),
    (
        "gpus_below_hosts",
        ("expected_gpus = 2", "expected_gpus = 1"),
        "ray.expected_gpus (1) is less than the number of hosts (2)",
    ),
    (
        "probe_timeout_not_below_interval",
        ("timeout = 30.0", "timeout = 60.0"),
        "probe.timeout (60s) must be less than probe_interval (60s)",
    ),
    (
        "parallelism_mismatch",
        ("tensor_parallel_size = 2", "tensor_parallel_size = 4"),
        "tensor_parallel_size x pipeline_parallel_size = 4, but ray.expected_gpus = 2",
    ),
    (
        "bad_data_ip",
        ('data_ip = "192.168.200.13"', 'data_ip = "192.168.200.300"'),
        "clusters.0.hosts.1.data_ip",
    ),
    ("bad_role", ('role = "worker"', 'role = "boss"'), "clusters.0.hosts.1.role"),
    (
        "unknown_key",
        ("load_stall = 600.0", "load_stall = 600.0\n  load_stal = 1"),
        "clusters.0.model.load_stal: Extra inputs are not permitted",
    ),
    ("negative_interval", ("interval = 30.0", "interval = -1"), "clusters.0.interval"),
    (
        "bad_listen",
        ('listen = "127.0.0.1:9810"', 'listen = "nowhere"'),
        "daemon.listen: must be HOST:PORT",
    ),
    (
        "stall_above_timeout",
        ("load_stall = 600.0", "load_stall = 7200.0"),
        "load_stall must not exceed load_timeout",
    ),
    (
        "hostile_interface",
        (
            'interface = "enp1s0f0np0"\n\n  [clusters.ssh]',
            'interface = "eth0; rm -rf /"\n\n  [clusters.ssh]',
        ),
        "clusters.0.hosts.1.interface",
    ),
]


@pytest.mark.parametrize(("name", "edit", "message"), RULES, ids=[r[0] for r in RULES])
def test_rules(tmp_path: Path, name: str, edit: tuple[str, str], message: str) -> None:
    old, new = edit
    assert old in BASE, old
    # Edit the last occurrence: the worker's fields come after the head's.
    head, _, tail = BASE.rpartition(old)
    found = problems(tmp_path, head + new + tail)
    assert any(message in p for p in found), found


def test_duplicate_cluster_names(tmp_path: Path) -> None:
    start = BASE.index("[[clusters]]")
    text = BASE + "\n" + BASE[start:]
    assert any("duplicate cluster name 'sparks'" in p for p in problems(tmp_path, text))


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(tmp_path / "absent.toml")
    assert info.value.problems == [f"{tmp_path / 'absent.toml'}: config file not found"]


def test_toml_syntax_error(tmp_path: Path) -> None:
    assert problems(tmp_path, "[daemon\n")[0].startswith(str(tmp_path))


def test_env_overrides_scalars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKD_DAEMON__LISTEN", "127.0.0.1:9999")
    monkeypatch.setenv("SPARKD_DAEMON__LOG_FORMAT", "json")
    settings = load_settings(write(tmp_path, BASE))
    assert settings.daemon.listen_port == 9999
    assert settings.daemon.log_format == "json"
    assert settings.clusters[0].name == "sparks"


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sparkd.cli", *args], capture_output=True, text=True, env=env
    )


def test_check_config_ok() -> None:
    result = run_cli("check-config", "--config", str(EXAMPLE_CONFIG))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(
        "sparks: head spark-a=192.168.200.12, workers spark-b=192.168.200.13"
    )
    assert len(result.stdout.splitlines()) == 1


def test_check_config_problems_exit_78(tmp_path: Path) -> None:
    bad = BASE.replace('data_ip = "192.168.200.13"', 'data_ip = "not-an-ip"').replace(
        "expected_gpus = 2", "expected_gpus = 3"
    )
    result = run_cli("check-config", "--config", str(write(tmp_path, bad)))
    assert result.returncode == EX_CONFIG
    lines = result.stderr.splitlines()
    assert lines == ["clusters.0.hosts.1.data_ip: 'not-an-ip' is not an IP address"], lines
    assert result.stdout == ""


def test_check_config_missing_file_exit_78(tmp_path: Path) -> None:
    result = run_cli("check-config", "--config", str(tmp_path / "nope.toml"))
    assert result.returncode == EX_CONFIG
    assert "config file not found" in result.stderr


def test_sparkd_config_env_picks_the_file(tmp_path: Path) -> None:
    import os

    env = dict(os.environ, SPARKD_CONFIG=str(EXAMPLE_CONFIG))
    assert run_cli("check-config", env=env).returncode == 0
