"""Config: the shipped example, every cross-field rule, env overrides and the exit-78 format."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sparkd.model.exits import EX_CONFIG
from sparkd.settings import ConfigError, canonical_address, load_settings
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


def usable(tmp_path: Path, text: str = BASE) -> Path:
    """The config, pointed at a real key, known_hosts and state dir made for the test."""
    import asyncssh

    key = asyncssh.generate_private_key("ssh-ed25519")
    key_file = tmp_path / "id_ed25519"
    key_file.write_bytes(key.export_private_key())
    key_file.chmod(0o600)
    known = tmp_path / "known_hosts"
    public = key.export_public_key().decode().strip()
    known.write_text(f"10.1.230.180 {public}\n")
    state = tmp_path / "state"
    text = (
        text.replace('"/etc/sparkd/id_ed25519"', f'"{key_file}"')
        .replace('"/etc/sparkd/known_hosts"', f'"{known}"')
        .replace('state_dir = "/var/lib/sparkd"', f'state_dir = "{state}"')
    )
    return write(tmp_path, text)


def test_check_config_ok(tmp_path: Path) -> None:
    result = run_cli("check-config", "--config", str(usable(tmp_path)))
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

    env = dict(os.environ, SPARKD_CONFIG=str(usable(tmp_path)))
    assert run_cli("check-config", env=env).returncode == 0


EXTRA_ARGS = """extra_args = [
    "--reasoning-parser", "qwen3",
    "--tool-call-parser", "qwen3_coder",
    "--enable-auto-tool-choice",
  ]"""


def with_extra_args(*args: str) -> str:
    assert EXTRA_ARGS in BASE
    listed = ", ".join(f'"{a}"' for a in args)
    return BASE.replace(EXTRA_ARGS, f"extra_args = [{listed}]")


SERVED_NAMES = [
    ("no_flag", ("--reasoning-parser", "qwen3"), "/models/Qwen3.5-122B-A10B-FP8"),
    ("separate_value", ("--served-model-name", "qwen"), "qwen"),
    ("equals_value", ("--served-model-name=qwen", "--enable-auto-tool-choice"), "qwen"),
    ("first_of_several", ("--served-model-name", "qwen", "qwen-122b", "--port-x"), "qwen"),
    ("after_other_flags", ("--reasoning-parser", "qwen3", "--served-model-name", "q"), "q"),
    ("underscore_spelling", ("--served_model_name", "qwen"), "qwen"),
    ("slash_in_name", ("--served-model-name", "Qwen/Qwen3.5-122B"), "Qwen/Qwen3.5-122B"),
]


@pytest.mark.parametrize(("name", "args", "served"), SERVED_NAMES, ids=[s[0] for s in SERVED_NAMES])
def test_served_name(tmp_path: Path, name: str, args: tuple[str, ...], served: str) -> None:
    model = load_settings(write(tmp_path, with_extra_args(*args))).clusters[0].model
    assert model.served_name == served
    assert model.id == "/models/Qwen3.5-122B-A10B-FP8"


BAD_SERVED_NAMES = [
    ("flag_last", ("--enable-auto-tool-choice", "--served-model-name"), "needs a name"),
    ("flag_then_option", ("--served-model-name", "--reasoning-parser", "qwen3"), "needs a name"),
    ("empty_after_equals", ("--served-model-name=",), "needs a name"),
    ("twice", ("--served-model-name", "a", "--served-model-name=b"), "given 2 times"),
]


@pytest.mark.parametrize(
    ("name", "args", "message"), BAD_SERVED_NAMES, ids=[s[0] for s in BAD_SERVED_NAMES]
)
def test_bad_served_model_name(
    tmp_path: Path, name: str, args: tuple[str, ...], message: str
) -> None:
    found = problems(tmp_path, with_extra_args(*args))
    assert any(p.startswith("clusters.0.model.extra_args: ") and message in p for p in found), found


def test_check_config_names_the_served_name(tmp_path: Path) -> None:
    path = usable(tmp_path, with_extra_args("--served-model-name", "qwen"))
    result = run_cli("check-config", "--config", str(path))
    assert result.returncode == 0, result.stderr
    assert "model /models/Qwen3.5-122B-A10B-FP8 served as qwen on port 30000" in result.stdout


CLUSTER = BASE[BASE.index("[[clusters]]") :]
# A second cluster that shares nothing with the first: its own name, hosts and log dir.
APART = (
    ('name = "sparks"', 'name = "lab"'),
    ('address = "10.1.230.180"', 'address = "10.1.240.10"'),
    ('address = "10.1.230.181"', 'address = "10.1.240.11"'),
    ('log_dir = "/var/lib/sparkd-serve"', 'log_dir = "/var/lib/sparkd-serve-lab"'),
)


def two_clusters(*edits: tuple[str, str]) -> str:
    second = CLUSTER
    for old, new in (*APART, *edits):
        assert old in second, old
        second = second.replace(old, new)
    return BASE + "\n" + second


def test_two_clusters_apart_load(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, two_clusters()))
    assert [c.name for c in settings.clusters] == ["sparks", "lab"]


CONFLICTS = [
    (
        "shared_host_address",
        (('address = "10.1.240.11"', 'address = "10.1.230.181"'),),
        [
            "clusters.1.hosts.1.address: host spark-b (10.1.230.181:22) is also spark-b in cluster "
            "'sparks'; two clusters must not share a host"
        ],
    ),
    (
        "shared_host_under_another_name",
        (
            ('name = "spark-b"', 'name = "lab-b"'),
            ('address = "10.1.240.11"', 'address = "10.1.230.181"'),
        ),
        [
            "clusters.1.hosts.1.address: host lab-b (10.1.230.181:22) is also spark-b in cluster "
            "'sparks'; two clusters must not share a host"
        ],
    ),
    (
        "shared_head_on_other_ports",
        (
            ('address = "10.1.240.10"', 'address = "10.1.230.180"'),
            ("port = 6379", "port = 6380"),
            ("port = 30000", "port = 30001"),
        ),
        [
            "clusters.1.hosts.0.address: host spark-a (10.1.230.180:22) is also spark-a in "
            "cluster 'sparks'; two clusters must not share a host"
        ],
    ),
    (
        "shared_host_ray_port",
        (
            ('address = "10.1.240.10"', 'address = "10.1.230.180"'),
            ("port = 30000", "port = 30001"),
        ),
        [
            "clusters.1.hosts.0.address: host spark-a (10.1.230.180:22) is also spark-a in "
            "cluster 'sparks'; two clusters must not share a host",
            "clusters.1.ray.port: 6379 is also the Ray port of cluster 'sparks' on the shared "
            "head spark-a",
        ],
    ),
    (
        "shared_host_model_port",
        (
            ('address = "10.1.240.10"', 'address = "10.1.230.180"'),
            ("port = 6379", "port = 6380"),
        ),
        [
            "clusters.1.hosts.0.address: host spark-a (10.1.230.180:22) is also spark-a in "
            "cluster 'sparks'; two clusters must not share a host",
            "clusters.1.model.port: 30000 is also the model port of cluster 'sparks' on the "
            "shared head spark-a",
        ],
    ),
    (
        "same_log_dir",
        (('log_dir = "/var/lib/sparkd-serve-lab"', 'log_dir = "/var/lib/sparkd-serve/"'),),
        [
            "clusters.1.model.log_dir: /var/lib/sparkd-serve is also the log_dir of cluster "
            "'sparks'; each cluster needs its own"
        ],
    ),
    (
        "same_cache_dir",
        (
            (
                'log_dir = "/var/lib/sparkd-serve-lab"',
                'log_dir = "/var/lib/sparkd-serve-lab"\ncache_dir = "/var/lib/sparkd-serve/cache"',
            ),
        ),
        [
            "clusters.1.model.cache_dir: /var/lib/sparkd-serve/cache is also the cache of "
            "cluster 'sparks'; each cluster needs its own"
        ],
    ),
]


@pytest.mark.parametrize(("name", "edits", "expected"), CONFLICTS, ids=[c[0] for c in CONFLICTS])
def test_clusters_sharing(
    tmp_path: Path, name: str, edits: tuple[tuple[str, str], ...], expected: list[str]
) -> None:
    assert problems(tmp_path, two_clusters(*edits)) == expected


def test_same_host_on_another_ssh_port_is_another_host(tmp_path: Path) -> None:
    # One address, two SSH ports: a gateway forwarding to two machines.
    text = two_clusters(
        ('address = "10.1.240.10"\n  port = 22', 'address = "10.1.230.180"\n  port = 2222')
    )
    assert load_settings(write(tmp_path, text)).clusters[1].head.port == 2222


def test_one_host_listed_twice_in_a_cluster(tmp_path: Path) -> None:
    text = BASE.replace('address = "10.1.230.181"', 'address = "10.1.230.180"')
    assert problems(tmp_path, text) == [
        "clusters.0.hosts.1.address: host spark-b (10.1.230.180:22) is the same host as "
        "spark-a; list each host once"
    ]


def test_check_config_rejects_shared_host_exit_78(tmp_path: Path) -> None:
    text = two_clusters(('address = "10.1.240.10"', 'address = "10.1.230.180"'))
    result = run_cli("check-config", "--config", str(write(tmp_path, text)))
    assert result.returncode == EX_CONFIG
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "clusters.1.hosts.0.address: host spark-a (10.1.230.180:22) is also spark-a in "
        "cluster 'sparks'; two clusters must not share a host",
        "clusters.1.ray.port: 6379 is also the Ray port of cluster 'sparks' on the shared head "
        "spark-a",
        "clusters.1.model.port: 30000 is also the model port of cluster 'sparks' on the shared "
        "head spark-a",
    ]


@pytest.mark.parametrize(
    "spelling",
    ["10.1.230.0265", "10.1.230.0xb5", "10.1.59061", "167896757", "::ffff:10.1.230.181"],
)
def test_a_shared_host_is_one_host_however_its_address_is_spelt(
    tmp_path: Path, spelling: str
) -> None:
    # What ssh connects to: the C library reads each spelling as 10.1.230.181 (0265 is octal).
    if ":" not in spelling:
        assert socket.inet_ntoa(socket.inet_aton(spelling)) == "10.1.230.181"
    text = two_clusters(('address = "10.1.240.11"', f'address = "{spelling}"'))
    [found] = problems(tmp_path, text)
    assert found.startswith("clusters.1.hosts.1.address: host spark-b (10.1.230.181:22) is also")


def test_a_zero_padded_address_is_the_address() -> None:
    assert canonical_address("127.0.77.02") == canonical_address("127.0.77.2") == "127.0.77.2"
    assert canonical_address("127.0.77.010") == "127.0.77.8"
    assert canonical_address("Spark-A.lan") == "spark-a.lan"


def test_check_config_escapes_control_characters_in_what_it_prints(tmp_path: Path) -> None:
    window = (
        '\n  [[clusters.maintenance]]\n  cron = "0 3 * * SUN"\n  duration = "2h"\n'
        '  reason = "\\u001b[2J\\u001b[32mhealthy\\u202e"\n'
    )
    result = run_cli("check-config", "--config", str(usable(tmp_path, BASE + window)))
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout and "\u202e" not in result.stdout
    assert "\\x1b[2J\\x1b[32mhealthy\\u202e; next" in result.stdout
    missing = f"{tmp_path}/none\\u001b[2J"
    bad = BASE.replace('# api_key_file = "/etc/sparkd/vllm_api_key"', f'api_key_file = "{missing}"')
    assert bad != BASE
    result = run_cli("check-config", "--config", str(usable(tmp_path, bad)))
    assert result.returncode == EX_CONFIG
    assert "\x1b" not in result.stderr and "\\x1b[2J" in result.stderr, result.stderr
