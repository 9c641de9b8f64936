"""The `[ha]` section: defaults, Patroni's timing rule, and no etcd code without it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sparkd.model.exits import EX_CONFIG
from sparkd.settings import load_settings
from tests.support.config import BASE, problems, run_cli, usable, write

HA = '\n[ha]\netcd_endpoints = ["http://127.0.0.1:23790"]\n'


def test_without_ha_nothing_is_set(tmp_path: Path) -> None:
    assert load_settings(write(tmp_path, BASE)).ha is None


def test_defaults(tmp_path: Path) -> None:
    ha = load_settings(write(tmp_path, BASE + HA)).ha
    assert ha is not None
    assert ha.instance == socket.gethostname()
    assert (ha.lease_ttl, ha.renew_interval, ha.request_timeout, ha.margin) == (15, 5, 2, 2)
    assert ha.prefix == "sparkd/v1/"
    assert ha.user is None and ha.password_file is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        # 5 + 2 x 2 = 9 > 10 - 2 = 8
        ("lease_ttl = 10\n", "renew_interval + 2 x request_timeout (9s) must be at most "
         "lease_ttl - margin (8s)"),
        ("lease_ttl = 3\nrenew_interval = 1\nrequest_timeout = 0.6\nmargin = 1\n",
         "renew_interval + 2 x request_timeout (2.2s) must be at most lease_ttl - margin (2s)"),
        ("lease_ttl = 1\n", "greater than or equal to 2"),
        ('user = "sparkd"\n', "user and password_file go together"),
        ('prefix = "sparkd"\n', "String should match pattern"),
    ],
)  # fmt: skip
def test_rules(tmp_path: Path, extra: str, message: str) -> None:
    found = problems(tmp_path, BASE + HA + extra)
    assert len(found) == 1 and found[0].startswith("ha") and message in found[0], found


@pytest.mark.parametrize(
    "endpoint", ["127.0.0.1:2379", "http://127.0.0.1", "ftp://127.0.0.1:2379", "http://h:1/v3"]
)
def test_bad_endpoints(tmp_path: Path, endpoint: str) -> None:
    text = BASE + HA.replace("http://127.0.0.1:23790", endpoint)
    found = problems(tmp_path, text)
    assert len(found) == 1 and found[0].startswith("ha.etcd_endpoints"), found


def test_the_test_timings_pass(tmp_path: Path) -> None:
    # ttl 3, renew 1, request 0.5, margin 1: 2 <= 2.
    extra = "lease_ttl = 3\nrenew_interval = 1\nrequest_timeout = 0.5\nmargin = 1\n"
    assert load_settings(write(tmp_path, BASE + HA + extra)).ha is not None


def test_check_config_refuses_the_timings(tmp_path: Path) -> None:
    path = usable(tmp_path, BASE + HA + "lease_ttl = 10\n")
    result = run_cli("check-config", "--config", str(path))
    assert result.returncode == EX_CONFIG
    assert "lease_ttl - margin (8s)" in result.stderr


def test_check_config_names_the_ha_settings(tmp_path: Path) -> None:
    path = usable(tmp_path, BASE + HA + 'instance = "ops-1"\n')
    result = run_cli("check-config", "--config", str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == (
        "ha: instance ops-1; etcd http://127.0.0.1:23790; lease 15s, renew 5s, "
        "request timeout 2s, margin 2s; prefix sparkd/v1/"
    )


def test_check_config_warns_of_etcd_anyone_may_write(tmp_path: Path) -> None:
    """Write access to the prefix is root on the GPU hosts: no auth, or plain HTTP to another
    host, is said (and not refused: a loopback etcd on the ops box is a valid setup)."""
    secret = tmp_path / "etcd-password"
    secret.write_text("pw\n")
    secret.chmod(0o600)
    remote = HA.replace("http://127.0.0.1:23790", "http://10.1.230.10:2379")
    cases = [
        (HA, ["ha: no user/password_file"]),
        (remote, ["ha: no user/password_file", "ha.etcd_endpoints: http://10.1.230.10:2379"]),
        (remote.replace("http://", "https://"), ["ha: no user/password_file"]),
        (HA + f'user = "sparkd"\npassword_file = "{secret}"\n', []),
    ]
    for number, (text, expected) in enumerate(cases):
        where = tmp_path / str(number)
        where.mkdir()
        result = run_cli("check-config", "--config", str(usable(where, BASE + text)))
        assert result.returncode == 0, result.stderr
        warned = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
        assert len(warned) == len(expected), (text, result.stderr)
        for line, start in zip(warned, expected, strict=True):
            assert line.startswith(f"warning: {start}"), line


ETCD_MODULES = ("sparkd.ha.etcd", "sparkd.ha.ownership")


def test_no_etcd_code_without_ha(tmp_path: Path) -> None:
    """Loading the config, the daemon, the web app and the metrics imports no etcd code."""
    path = write(tmp_path, BASE)
    script = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from sparkd.settings import load_settings\n"
        "import sparkd.cli.commands, sparkd.runtime.daemon, sparkd.web.serve\n"
        "import sparkd.runtime.metrics\n"
        "from sparkd.runtime.daemon import Daemon\n"
        f"settings = load_settings(Path({str(path)!r}))\n"
        f"Daemon(settings, Path({str(path)!r}), api=sparkd.web.serve.serve_api)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('sparkd.ha'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout)
    assert not set(loaded) & set(ETCD_MODULES), loaded
