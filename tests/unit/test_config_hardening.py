"""Config that would aim sparkd at the wrong thing is refused with its location and exit 78:
each case tries the mistake (or the attack) and checks the one line that names it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkd.model.exits import EX_CONFIG
from sparkd.settings import ConfigError, load_settings
from tests.support.config import BASE, usable, write

CASES = [
    ("image_as_option", ('image = "hellohal2064/vllm-qwen3.5-gb10"', 'image = "--privileged"'),
     "clusters.0.ray.image"),
    ("model_id_as_option", ('id = "/models/Qwen3.5-122B-A10B-FP8"', 'id = "--help"'),
     "clusters.0.model.id"),
    ("unit_as_option", ('"vllm-cluster.service"', '"--now"'), "clusters.0.cleanup.units"),
    ("sshd_unit", ('"vllm-cluster.service"', '"ssh.service"'), "never stopped by sparkd"),
    ("docker_unit", ('"vllm-cluster.service"', '"docker.service"'), "never stopped by sparkd"),
    ("systemd_unit", ('"vllm-cluster.service"', '"systemd-networkd.service"'), "never stopped"),
    ("mount_unit", ('"vllm-cluster.service"', '"models.mount"'), "never stopped by sparkd"),
    ("infinite_interval", ("interval = 30.0", "interval = inf"), "clusters.0.interval"),
    ("absurd_load_timeout", ("load_timeout = 3600.0", "load_timeout = 1e9"),
     "clusters.0.model.load_timeout"),
    ("nan_timeout", ("command_timeout = 30.0", "command_timeout = nan"),
     "clusters.0.ssh.command_timeout"),
    ("log_dir_is_etc", ('log_dir = "/var/lib/sparkd-serve"', 'log_dir = "/etc"'),
     "system directory"),
    ("log_dir_with_colon", ('log_dir = "/var/lib/sparkd-serve"', 'log_dir = "/srv/a:b"'),
     "must not contain ':'"),
    ("listen_garbage", ('listen = "127.0.0.1:9810"', 'listen = "0.0.0.0:98²0"'), "daemon.listen"),
    ("listen_hostname", ('listen = "127.0.0.1:9810"', 'listen = "example.com:9810"'),
     "not an IP address"),
    ("empty_state_dir", ('state_dir = "/var/lib/sparkd"', 'state_dir = ""'), "daemon.state_dir"),
    ("secret_in_ray_env", ('NCCL_SOCKET_IFNAME = "enp1s0f0np0"', 'HF_TOKEN = "hf_abc"'),
     "looks like a secret"),
    # Ray's token by value would be on `docker run`'s command line; by path it is a file.
    ("ray_token_in_ray_env", ('NCCL_SOCKET_IFNAME = "enp1s0f0np0"', 'RAY_AUTH_TOKEN = "abc"'),
     "looks like a secret"),
    ("ray_token_path_relative",
     ('NCCL_SOCKET_IFNAME = "enp1s0f0np0"', 'RAY_AUTH_TOKEN_PATH = "auth_token"'),
     "looks like a secret"),
    ("unused_model_url", ('port = 30000', 'port = 30000\n  url = "http://x"'),
     "clusters.0.model.url"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "edit", "message"), CASES, ids=[c[0] for c in CASES])
def test_refused(tmp_path: Path, name: str, edit: tuple[str, str], message: str) -> None:
    old, new = edit
    assert old in BASE, old
    with pytest.raises(ConfigError) as error:
        load_settings(write(tmp_path, BASE.replace(old, new, 1)))
    assert any(message in p for p in error.value.problems), error.value.problems


def test_clusters_from_the_environment_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPARKD_CLUSTERS", "[]")
    with pytest.raises(ConfigError) as error:
        load_settings(write(tmp_path, BASE))
    assert error.value.problems[0].startswith("SPARKD_CLUSTERS:")


def check(path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKD_")}
    return subprocess.run(
        [sys.executable, "-m", "sparkd.cli", "check-config", "--config", str(path)],
        capture_output=True,
        text=True,
        env=env,
    )


def test_key_readable_by_others_is_refused_like_openssh_does(tmp_path: Path) -> None:
    path = usable(tmp_path)
    (tmp_path / "id_ed25519").chmod(0o644)
    result = check(path)
    assert result.returncode == EX_CONFIG
    assert "clusters.0.ssh.key_file:" in result.stderr and "chmod 600" in result.stderr


def test_missing_known_hosts_and_passphrase_key_are_refused(tmp_path: Path) -> None:
    import asyncssh

    path = usable(tmp_path)
    key = asyncssh.generate_private_key("ssh-ed25519")
    (tmp_path / "id_ed25519").write_bytes(key.export_private_key("pkcs8-pem", passphrase="pw"))
    (tmp_path / "known_hosts").unlink()
    result = check(path)
    assert result.returncode == EX_CONFIG
    assert "passphrase-protected" in result.stderr
    assert "clusters.0.ssh.known_hosts_file:" in result.stderr and "does not exist" in result.stderr


def test_state_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    path = usable(tmp_path)
    (tmp_path / "state").write_text("not a dir")
    result = check(path)
    assert result.returncode == EX_CONFIG
    assert "daemon.state_dir:" in result.stderr and "not a directory" in result.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [("one\ntwo\n", "more than one line"), ("key\x07\n", "non-printable"), ("", "empty")],
)
def test_api_key_file_must_be_one_printable_line(
    tmp_path: Path, content: str, message: str
) -> None:
    secret = tmp_path / "api_key"
    secret.write_text(content)
    text = BASE.replace('# api_key_file = "/etc/sparkd/vllm_api_key"', f'api_key_file = "{secret}"')
    assert text != BASE
    result = check(usable(tmp_path, text))
    assert result.returncode == EX_CONFIG
    assert "clusters.0.model.api_key_file:" in result.stderr and message in result.stderr


def test_a_fifo_as_control_token_file_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "token"
    os.mkfifo(fifo)
    text = BASE.replace("[daemon]\n", f'[daemon]\ncontrol_token_file = "{fifo}"\n', 1)
    assert text != BASE
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKD_")}
    # Nothing ever writes to the FIFO: a reader that opens it waits for ever.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sparkd.cli",
            "check-config",
            "--config",
            str(usable(tmp_path, text)),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert result.returncode == EX_CONFIG
    assert "daemon.control_token_file:" in result.stderr
    assert "not a regular file" in result.stderr


def test_ray_token_path_is_a_path_not_a_secret(tmp_path: Path) -> None:
    """Ray 2.60 reads its token from the file RAY_AUTH_TOKEN_PATH names
    (python/ray/_private/authentication/authentication_token_setup.py): only the path is in
    the container's env, and sparkd's own copy is `ray.auth_token_file`, checked like a key."""
    token = tmp_path / "ray_token"
    token.write_text("s3cret-ray-token\n")
    token.chmod(0o600)
    path = usable(tmp_path)
    text = path.read_text()
    old = 'NCCL_SOCKET_IFNAME = "enp1s0f0np0"'
    assert old in text
    text = text.replace(
        old, old + '\nRAY_AUTH_MODE = "token"\nRAY_AUTH_TOKEN_PATH = "/run/ray/auth_token"', 1
    )
    port = "dashboard_port = 8265"
    assert port in text
    path.write_text(text.replace(port, f'{port}\n  auth_token_file = "{token}"', 1))
    result = check(path)
    assert result.returncode == 0, result.stderr
    assert "s3cret" not in result.stdout + result.stderr
    token.write_text("")
    result = check(path)
    assert result.returncode == EX_CONFIG
    assert "clusters.0.ray.auth_token_file:" in result.stderr


def test_ray_token_is_known_to_the_redactor_from_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray's token is masked in every line from the first one, like the API key."""
    import argparse

    from sparkd.cli import live
    from sparkd.shell import secrets

    token = tmp_path / "ray_token"
    token.write_text("primed-ray-token\n")
    path = usable(tmp_path)
    port = "dashboard_port = 8265"
    path.write_text(path.read_text().replace(port, f'{port}\n  auth_token_file = "{token}"', 1))
    primed: list[Path | None] = []
    monkeypatch.setattr(secrets, "prime", lambda paths: primed.extend(paths))

    async def nothing(*args: object, **kwargs: object) -> int:
        return 0

    monkeypatch.setattr(live, "probe", nothing)
    args = argparse.Namespace(command="probe", cluster=None, json=False)
    assert live.main(args, load_settings(path), path) == 0
    assert token in primed
