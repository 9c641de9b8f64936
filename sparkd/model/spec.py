"""The parts of a cluster's desired state: its hosts, how they are reached, the Ray and model
specs, the probe and what cleanup may stop."""

from __future__ import annotations

import fnmatch
import ipaddress
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from sparkd.model.base import Value
from sparkd.model.fields import SECRET_NAME, EnvName, Name, NotOption, Seconds, own_directory
from sparkd.model.hca import parse_hca

SHM_SIZE = re.compile(r"^[0-9]+[bkmgBKMG]?$")


class HostSpec(Value):
    name: Name
    address: str
    port: int = Field(default=22, gt=0, lt=65536)
    role: Literal["head", "worker"]
    data_ip: str
    interface: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:@-]{1,15}$")]

    @field_validator("data_ip")
    @classmethod
    def _ip(cls, value: str) -> str:
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            raise ValueError(f"{value!r} is not an IP address") from None

    @property
    def ip(self) -> str:
        return self.data_ip


class SshSpec(Value):
    """Host keys are always verified: there is deliberately no setting to turn that off."""

    user: Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_.-]{0,31}$")]
    key_file: Path
    known_hosts_file: Path
    connect_timeout: Seconds = 10.0
    command_timeout: Seconds = 30.0
    max_channels: int = Field(default=8, ge=1, le=64)
    # Prefix privileged commands (systemctl stop/disable, kill) with `sudo -n`; see
    # `sparkd commands --sudoers USER` for the matching sudoers entries.
    sudo: bool = False


DEFAULT_DASHBOARD_PORT = 8265


def _secret_env(name: str, value: str) -> bool:
    """A name that looks like a secret's, unless it names a file by its absolute path (Ray's
    `RAY_AUTH_TOKEN_PATH`: the token stays in the file, only the path is on the command line)."""
    if not SECRET_NAME.search(name):
        return False
    return not (name.endswith(("_PATH", "_FILE")) and value.startswith("/"))


class RaySpec(Value):
    image: Annotated[str, Field(min_length=1, pattern=r"^[^-\s][^\s]*$")]
    port: int = Field(default=6379, gt=0, lt=65536)
    expected_gpus: int = Field(default=2, ge=1)
    env: dict[EnvName, str] = Field(default_factory=dict)
    shm_size: str = "16g"
    extra_docker_args: tuple[str, ...] = ()
    mounts: tuple[str, ...] = ("/models:/models",)
    dashboard: bool = True
    # Where the head's dashboard listens (on its loopback): sparkd reads Ray's state there.
    dashboard_port: int = Field(default=DEFAULT_DASHBOARD_PORT, gt=0, lt=65536)
    # Ray's token (`RAY_AUTH_MODE=token`), a file on this machine read like model.api_key_file:
    # sent as `Authorization: Bearer` on the dashboard reads, never logged.
    auth_token_file: Path | None = None
    join_timeout: Seconds = 120.0

    @field_validator("shm_size")
    @classmethod
    def _shm(cls, value: str) -> str:
        if not SHM_SIZE.match(value):
            raise ValueError("must be a size such as 16g or 8192m")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        secret = sorted(name for name, text in value.items() if _secret_env(name, text))
        if secret:
            raise ValueError(
                f"{', '.join(secret)} looks like a secret: ray.env values appear on `docker run`'s "
                "command line (visible in ps); put it in an env file on the host and pass "
                "`--env-file` in ray.extra_docker_args (Ray's token: RAY_AUTH_TOKEN_PATH naming a "
                "mounted file)"
            )
        if "VLLM_HOST_IP" in value:
            raise ValueError("VLLM_HOST_IP is set per host from its data_ip; leave it out")
        if "NCCL_IB_HCA" in value:
            # Its device names become sysfs paths the fact script reads.
            parse_hca(value["NCCL_IB_HCA"])
        return value

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for mount in value:
            src, sep, dst = mount.partition(":")
            if not sep or not src.startswith("/") or not dst.startswith("/"):
                raise ValueError(f"mount {mount!r} must be /host/path:/container/path[:ro]")
        return value


class ModelSpec(Value):
    id: NotOption
    port: int = Field(default=30000, gt=0, lt=65536)
    tunnel_host: str | None = None
    tensor_parallel_size: int = Field(default=2, ge=1)
    pipeline_parallel_size: int = Field(default=1, ge=1)
    extra_args: tuple[str, ...] = ()
    api_key_file: Path | None = None
    log_dir: Path = Path("/var/lib/sparkd-serve")
    load_stall: Seconds = 600.0
    load_timeout: Seconds = 3600.0
    # Silent stages burn CPU whether they work or spin (an NCCL hang spin-waits): each has a cap
    # of its own (load_timeout still bounds the whole load). `compile_timeout` covers the silent
    # start (engine start-up, torch.compile after the last shard).
    compile_timeout: Seconds = 1800.0
    graph_capture_timeout: Seconds = 900.0
    # Below this many bytes free on log_dir's file system nothing is started (a full disk
    # freezes the log and fails the launch; waiting on it is not a stalled load).
    min_disk_free: int = Field(default=1 << 30, ge=0)
    # vLLM's compile caches (VLLM_CACHE_ROOT) on each host, bind-mounted into the Ray
    # containers so a restart of the same image and model loads them instead of compiling
    # again. None: `cache` under log_dir. Each image and model gets an entry of its own; each
    # host keeps the `cache_keep` newest (the one in use among them), the rest are pruned.
    cache_dir: Path | None = None
    cache_keep: int = Field(default=2, ge=1)

    @field_validator("log_dir", "cache_dir")
    @classmethod
    def _log_dir(cls, value: Path | None) -> Path | None:
        if value is None:
            return None
        if not value.is_absolute():
            raise ValueError("must be an absolute path")
        if ":" in str(value):
            raise ValueError("must not contain ':' (it is bind-mounted as HOST:CONTAINER)")
        return own_directory(value)

    @model_validator(mode="after")
    def _grace(self) -> ModelSpec:
        if self.load_stall > self.load_timeout:
            raise ValueError("load_stall must not exceed load_timeout")
        return self

    @field_validator("extra_args")
    @classmethod
    def _served_model_name(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        given = _served_name_flags(value)
        if len(given) > 1:
            raise ValueError(f"{SERVED_NAME_FLAG} is given {len(given)} times; give it once")
        if given and (not given[0] or not all(n.strip() for n in given[0])):
            raise ValueError(f"{SERVED_NAME_FLAG} needs a name")
        return value

    @property
    def cache_root(self) -> Path:
        return self.cache_dir if self.cache_dir is not None else self.log_dir / "cache"

    @property
    def served_name(self) -> str:
        """The name vLLM serves the model under: what `/v1/models` lists and a request names.
        The first of `--served-model-name`'s names in `extra_args`, else the model id."""
        for names in _served_name_flags(self.extra_args):
            return names[0]
        return self.id


SERVED_NAME_FLAG = "--served-model-name"


def _served_name_flags(args: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Each `--served-model-name` in a `vllm serve` argument list, with the names it gives:
    `--served-model-name A [B ...]` (up to the next option) or `--served-model-name=A`. vLLM's
    parser also reads the flag with underscores."""
    found: list[tuple[str, ...]] = []
    for index, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag.replace("_", "-") != SERVED_NAME_FLAG:
            continue
        if eq:
            found.append((value,))
            continue
        names: list[str] = []
        for following in args[index + 1 :]:
            if following.startswith("-"):
                break
            names.append(following)
        found.append(tuple(names))
    return found


class ProbeSpec(Value):
    prompt: Annotated[str, Field(min_length=1)] = "Say hello in one sentence."
    max_tokens: int = Field(default=50, ge=1)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    timeout: Seconds = 30.0
    stream: bool = False
    # A healthy probe slower than this share of `timeout` is reported `degraded: slow`, never
    # counted as a failure: the model answers, late.
    slow_share: float = Field(default=0.5, gt=0.0, le=1.0)


# Units sparkd must never stop: it would cut its own way in, or the container runtime.
PROTECTED_UNITS = (
    "ssh.service",
    "sshd.service",
    "docker.service",
    "docker.socket",
    "containerd.service",
    "systemd-*",
    "*.mount",
    "dbus.service",
    "NetworkManager.service",
)


class CleanupSpec(Value):
    units: tuple[Annotated[str, Field(pattern=r"^[A-Za-z0-9@_.:][A-Za-z0-9@_.:\\-]*$")], ...] = ()
    container_patterns: tuple[NotOption, ...] = ()
    harmless_gpu_processes: tuple[str, ...] = ("Xorg", "gnome-shell")

    @field_validator("units")
    @classmethod
    def _protected(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for unit in value:
            if any(fnmatch.fnmatchcase(unit, p) for p in PROTECTED_UNITS):
                raise ValueError(f"{unit} is never stopped by sparkd (it keeps the host reachable)")
        return value
