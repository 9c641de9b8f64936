"""Desired state: the TOML config file, validated, with `SPARKD_...` environment overrides.

Environment variables reach scalar settings (`SPARKD_DAEMON__LISTEN=...`), not items of the
cluster list. Secrets are never values here: only paths to files holding them.
"""

from __future__ import annotations

import contextlib
import contextvars
import fnmatch
import ipaddress
import os
import posixpath
import re
import socket
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from apscheduler.triggers.cron import CronTrigger
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

# config_path is read from here too; the CLI's daemon commands use it without this module.
from sparkd.config_file import DEFAULT_CONFIG_PATH
from sparkd.config_file import config_path as config_path
from sparkd.ha.config import HaSpec

# Every duration is finite and at most a week: a longer one is a typo that would make sparkd
# wait forever (an `inf` timeout, a load grace of a year).
MAX_SECONDS = 7 * 24 * 3600.0
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]
# A value that reaches a tool as an argument must not be read by it as an option.
NotOption = Annotated[str, Field(min_length=1, pattern=r"^[^-\s]")]
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
SYSTEM_DIRS = frozenset(
    ["/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64", "/opt", "/proc", "/root",
     "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var", "/var/lib", "/var/log",  # noqa: S108
     "/usr/local", "/usr/bin", "/usr/lib", "/usr/sbin", "/usr/share", "/usr/local/bin",
     "/var/tmp", "/var/cache", "/var/run", "/var/spool", "/var/opt", "/mnt", "/media"]  # noqa: S108
)  # fmt: skip
# Everything below these is the kernel's or shared memory, never a directory of sparkd's own.
SYSTEM_TREES = ("/proc", "/sys", "/dev")


def system_directory(path: Path) -> str | None:
    """The system directory `path` names once normalised (`//etc`, `/var/lib/../../etc`,
    `/tmp/`), or None when it is a directory a service may own."""
    text = posixpath.normpath("/" + str(path).lstrip("/"))
    if text in SYSTEM_DIRS:
        return text
    for tree in SYSTEM_TREES:
        if text == tree or text.startswith(tree + "/"):
            return tree
    return None


def _own_directory(value: Path) -> Path:
    system = system_directory(value)
    if system is not None:
        raise ValueError(
            f"{value} is the system directory {system} or inside it; give sparkd a directory "
            "of its own"
        )
    return value


SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.I)
Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")]
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
SHM_SIZE = re.compile(r"^[0-9]+[bkmgBKMG]?$")
DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """`90s`, `30m`, `2h`, `1d` or plain seconds."""
    match = DURATION.match(text.strip())
    if not match:
        raise ValueError(f"bad duration {text!r}: use e.g. 90s, 30m, 2h, 1d")
    return float(match.group(1)) * DURATION_UNITS[match.group(2)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DaemonSettings(_Section):
    listen: str = "127.0.0.1:9810"
    state_dir: Path = Path("/var/lib/sparkd")
    log_format: Literal["auto", "json", "console"] = "auto"
    control_token_file: Path | None = None

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if (
            not sep
            or not host
            or not (port.isascii() and port.isdigit())
            or not 0 < int(port) < 65536
        ):
            raise ValueError("must be HOST:PORT, e.g. 127.0.0.1:9810")
        bare = host.strip("[]")
        try:
            ipaddress.ip_address(bare)
        except ValueError:
            if bare != "localhost":
                raise ValueError(f"{host!r} is not an IP address (or localhost)") from None
        return value

    @field_validator("state_dir")
    @classmethod
    def _state_dir(cls, value: Path) -> Path:
        if not str(value).strip() or str(value) == ".":
            raise ValueError("must not be empty")
        if not value.is_absolute():
            raise ValueError("must be an absolute path")
        _own_directory(value)
        # The state dir is on this machine: a symlink there is judged by where it leads.
        with contextlib.suppress(OSError, RuntimeError):
            _own_directory(value.resolve())
        return value

    @property
    def listen_host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def listen_port(self) -> int:
        return int(self.listen.rpartition(":")[2])


class HostSpec(_Section):
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


class SshSpec(_Section):
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


class RaySpec(_Section):
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
        secret = sorted(name for name in value if SECRET_NAME.search(name))
        if secret:
            raise ValueError(
                f"{', '.join(secret)} looks like a secret: ray.env values appear on `docker run`'s "
                "command line (visible in ps); put it in an env file on the host and pass "
                "`--env-file` in ray.extra_docker_args"
            )
        if "VLLM_HOST_IP" in value:
            raise ValueError("VLLM_HOST_IP is set per host from its data_ip; leave it out")
        return value

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for mount in value:
            src, sep, dst = mount.partition(":")
            if not sep or not src.startswith("/") or not dst.startswith("/"):
                raise ValueError(f"mount {mount!r} must be /host/path:/container/path[:ro]")
        return value


class ModelSpec(_Section):
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
        return _own_directory(value)

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


class ProbeSpec(_Section):
    prompt: Annotated[str, Field(min_length=1)] = "Say hello in one sentence."
    max_tokens: int = Field(default=50, ge=1)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    timeout: Seconds = 30.0
    stream: bool = False
    # A healthy probe slower than this share of `timeout` is reported `degraded: slow`, never
    # counted as a failure: the model answers, late.
    slow_share: float = Field(default=0.5, gt=0.0, le=1.0)


class CleanupSpec(_Section):
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


class PolicySpec(_Section):
    failure_threshold: int = Field(default=3, ge=1)
    budget: int = Field(default=3, ge=1)
    # Accepted for old configs, no longer used: a budget counts the whole incident (core.policy).
    budget_window: Seconds = 3600.0
    backoff_initial: Seconds = 30.0
    backoff_max: Seconds = 900.0
    healthy_reset: Seconds = 600.0
    allow_kill_foreign_gpu: bool = False
    # Below this MemAvailable (bytes) on a host, memory pressure is reported, and during a load
    # the model is not started into it (GB10's GPU allocations come out of host memory).
    min_memory_available: int = Field(default=4 << 30, ge=0)
    # Requests running and vLLM's generation-token counter still this long (core.hang): a hung
    # engine, restarted without waiting for `failure_threshold` probes.
    hang_window: Seconds = 60.0
    # A just-ready engine's stall clock starts this long after it was ready: vLLM's first-shape
    # compiles stall it for 30-70 s, with requests running and no token.
    hang_ready_grace: Seconds = 70.0

    @model_validator(mode="after")
    def _backoff(self) -> PolicySpec:
        if self.backoff_initial > self.backoff_max:
            raise ValueError("backoff_initial must not exceed backoff_max")
        return self


class FabricSpec(_Section):
    """The data link's RDMA fabric: what it should look like (unset: not checked)."""

    # The RDMA port's rate below which the link is degraded (a 200 Gb/s link that trained at
    # 100 or fell back to 25 carries NCCL at a fraction of its speed).
    expected_rate_gbps: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    # A carrier change (a flap) stays visible this long after the link is back.
    flap_window: Seconds = 600.0


class PowerSpec(_Section):
    """When a host that does not answer is taken for wedged, and how it is power-cycled."""

    # Unreachable over SSH this long, whatever its last kernel log said: wedged, needs a power
    # cycle (a host that reboots comes back well within it).
    unreachable_for: Seconds = 600.0
    # The argv run on the ops box (never through a shell, never over SSH) to power-cycle a host
    # (a switched PDU's or a smart plug's CLI); every `{host}` in an element becomes the host's
    # name, inside that one element. Unset: sparkd says a host needs a power cycle, and waits.
    command: tuple[Annotated[str, Field(min_length=1)], ...] | None = None
    timeout: Seconds = 60.0

    @field_validator("command")
    @classmethod
    def _command(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("needs at least the program to run")
        if not any("{host}" in part for part in value):
            raise ValueError("must name the host to cycle: put {host} in one of its elements")
        if not value[0].startswith("/"):
            # No PATH lookup: which program powers hosts off is not left to the environment.
            raise ValueError(f"{value[0]!r}: the program must be an absolute path")
        return value

    @property
    def enabled(self) -> bool:
        return self.command is not None


class MaintenanceSpec(_Section):
    """A recurring window in which the cluster is observed and nothing is acted on."""

    cron: Annotated[str, Field(min_length=1)]
    duration: Seconds
    reason: Annotated[str, Field(min_length=1)]
    # The cron's timezone; the host's own when unset.
    timezone: str | None = None

    @field_validator("duration", mode="before")
    @classmethod
    def _duration(cls, value: object) -> object:
        return parse_duration(value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _cron(self) -> MaintenanceSpec:
        trigger = self.trigger()
        # A cron that never fires (`0 0 31 2 *`) is a mistake, and each look for its next
        # window searches to the year 9999: a fifth of a second of the event loop.
        if trigger.get_next_fire_time(None, datetime.now(trigger.timezone)) is None:
            raise ValueError(f"cron {self.cron!r} never fires")
        return self

    def trigger(self) -> CronTrigger:
        """APScheduler's trigger for the window's starts; raises ValueError when invalid."""
        try:
            return CronTrigger.from_crontab(self.cron, timezone=self.timezone)
        except ValueError as exc:
            raise ValueError(f"cron {self.cron!r}: {exc}") from None
        except LookupError as exc:  # an unknown timezone name
            raise ValueError(f"unknown timezone {self.timezone!r}: {exc}") from None


class RolloutCheck(_Section):
    """A completion a new spec must answer right before it is accepted. The expectation on the
    answer applies when there is content: a reasoning-only answer (the budget spent thinking)
    passes `contains` and `regex` as the probe passes it."""

    prompt: Annotated[str, Field(min_length=1)]
    max_tokens: int = Field(default=50, ge=1)
    contains: str | None = None
    regex: str | None = None
    min_completion_tokens: int | None = Field(default=None, ge=1)

    @field_validator("regex")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"regex {value!r}: {exc}") from None
        return value


class RolloutSpec(_Section):
    """How a change of the Ray or model spec is rolled out."""

    # A new spec that fails on evidence goes back to the last spec that served well.
    rollback: bool = True
    # Consecutive healthy probes of a new spec before it is accepted (and becomes last-good).
    acceptance_probes: int = Field(default=3, ge=1, le=100)
    # Completions a new spec must answer right, once, before it is accepted.
    checks: tuple[RolloutCheck, ...] = Field(default=(), max_length=16)


class ClusterSpec(_Section):
    """The desired state of one cluster: what `plan()` compares observations with."""

    name: Name
    interval: Seconds = 30.0
    probe_interval: Seconds = 60.0
    recheck_interval: Seconds = 5.0
    hosts: tuple[HostSpec, ...]
    ssh: SshSpec
    ray: RaySpec
    model: ModelSpec
    probe: ProbeSpec = ProbeSpec()
    cleanup: CleanupSpec = CleanupSpec()
    policy: PolicySpec = PolicySpec()
    fabric: FabricSpec = FabricSpec()
    power: PowerSpec = PowerSpec()
    maintenance: tuple[MaintenanceSpec, ...] = ()
    rollout: RolloutSpec = RolloutSpec()

    @model_validator(mode="after")
    def _cross_checks(self) -> ClusterSpec:
        heads = [h.name for h in self.hosts if h.role == "head"]
        if len(heads) != 1:
            raise ValueError(f"needs exactly one host with role head, found {len(heads)}")
        _unique("host name", [h.name for h in self.hosts])
        _unique("host data_ip", [h.ip for h in self.hosts])
        if self.ray.expected_gpus < len(self.hosts):
            raise ValueError(
                f"ray.expected_gpus ({self.ray.expected_gpus}) is less than the number of hosts "
                f"({len(self.hosts)})"
            )
        if self.probe.timeout >= self.probe_interval:
            raise ValueError(
                f"probe.timeout ({self.probe.timeout:g}s) must be less than probe_interval "
                f"({self.probe_interval:g}s)"
            )
        parallel = self.model.tensor_parallel_size * self.model.pipeline_parallel_size
        if parallel != self.ray.expected_gpus:
            raise ValueError(
                f"model tensor_parallel_size x pipeline_parallel_size = {parallel}, "
                f"but ray.expected_gpus = {self.ray.expected_gpus}"
            )
        return self

    @property
    def head(self) -> HostSpec:
        return next(h for h in self.hosts if h.role == "head")

    @property
    def workers(self) -> tuple[HostSpec, ...]:
        return tuple(h for h in self.hosts if h.role == "worker")

    def host(self, name: str) -> HostSpec:
        return next(h for h in self.hosts if h.name == name)

    @property
    def model_host(self) -> str:
        """Where the model is reached from the head's SSH endpoint (default: its data IP)."""
        return self.model.tunnel_host or self.head.ip


def _unique(what: str, values: list[str]) -> None:
    seen: set[str] = set()
    for value in values:
        if value in seen:
            raise ValueError(f"duplicate {what} {value!r}")
        seen.add(value)


_config_path: contextvars.ContextVar[Path] = contextvars.ContextVar(
    "sparkd_config_path", default=DEFAULT_CONFIG_PATH
)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SPARKD_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    daemon: DaemonSettings = DaemonSettings()
    clusters: tuple[ClusterSpec, ...] = Field(min_length=1)
    # Absent: one instance, nothing changes. Set: clusters are owned through etcd leases.
    ha: HaSpec | None = None

    @model_validator(mode="after")
    def _unique_clusters(self) -> Settings:
        _unique("cluster name", [c.name for c in self.clusters])
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml = TomlConfigSettingsSource(settings_cls, toml_file=_config_path.get())
        return (init_settings, env_settings, toml)

    def cluster(self, name: str) -> ClusterSpec | None:
        return next((c for c in self.clusters if c.name == name), None)


class ConfigError(Exception):
    """A config that cannot be used; `problems` holds one `location: message` line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def load_settings(path: Path) -> Settings:
    """Read and validate the config; every problem becomes one `location: message` line."""
    if not path.is_file():
        raise ConfigError([f"{path}: config file not found"])
    if any(name.upper().startswith("SPARKD_CLUSTERS") for name in os.environ):
        raise ConfigError(
            ["SPARKD_CLUSTERS: the cluster list comes from the config file only; unset it"]
        )
    token = _config_path.set(path)
    try:
        settings = Settings()
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        raise ConfigError([_format_error(e) for e in errors if not _echo(e, errors)]) from None
    except (OSError, ValueError) as exc:  # unreadable file or TOML syntax error
        raise ConfigError([f"{path}: {exc}"]) from None
    except RecursionError:  # arrays or tables nested past Python's recursion limit
        raise ConfigError([f"{path}: nested too deep to be a sparkd config"]) from None
    finally:
        _config_path.reset(token)
    problems = conflicts(settings)
    if problems:
        raise ConfigError(problems)
    return settings


_INET_ATON = re.compile(r"^(0[xX][0-9a-fA-F]+|[0-9]+)(\.(0[xX][0-9a-fA-F]+|[0-9]+)){0,3}$")


def canonical_address(text: str) -> str:
    """One spelling per address, as the resolver reads it: the C library takes `127.0.77.02`,
    `127.1`, `0x7f.0.0.1` and `2130706433` for IPv4 addresses (a leading 0 is octal), and an
    IPv4-mapped IPv6 address is the IPv4 one. Names are lower-cased."""
    address = text.strip().lower().strip("[]")
    try:
        parsed = ipaddress.ip_address(address.split("%", 1)[0] if ":" in address else address)
    except ValueError:
        if _INET_ATON.match(address):
            with contextlib.suppress(OSError):
                return socket.inet_ntoa(socket.inet_aton(address))
        return address
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        return str(parsed.ipv4_mapped)
    return str(parsed) if "%" not in address else address


def _host_key(host: HostSpec) -> tuple[str, int]:
    """One SSH endpoint, whatever the spelling of its address (10.0.0.1 vs 10.00.0.1, case)."""
    return canonical_address(host.address), host.port


def conflicts(settings: Settings) -> list[str]:
    """What two clusters must not share, one `location: problem` line each: a host (the same SSH
    address and port), the Ray or model port on a shared head, or the model's log_dir. Each
    cluster's controller owns its hosts' GPUs, containers and ports, and would fight the other."""
    problems: list[str] = []
    seen: dict[tuple[str, int], tuple[int, HostSpec]] = {}
    log_dirs: dict[Path, int] = {}
    cache_roots: dict[Path, int] = {}
    for index, cluster in enumerate(settings.clusters):
        where = f"clusters.{index}"
        shared: set[int] = set()
        for number, host in enumerate(cluster.hosts):
            key = _host_key(host)
            endpoint = f"{key[0]}:{key[1]}"
            if key in seen and seen[key][0] == index:
                problems.append(
                    f"{where}.hosts.{number}.address: host {host.name} ({endpoint}) is the same "
                    f"host as {seen[key][1].name}; list each host once"
                )
            elif key in seen:
                other, first = seen[key]
                shared.add(other)
                problems.append(
                    f"{where}.hosts.{number}.address: host {host.name} ({endpoint}) is also "
                    f"{first.name} in cluster "
                    f"{settings.clusters[other].name!r}; two clusters must not share a host"
                )
            else:
                seen[key] = (index, host)
        for other in sorted(shared):
            # The Ray GCS port and the model port are bound on the head only.
            rival = settings.clusters[other]
            if _host_key(rival.head) != _host_key(cluster.head):
                continue
            name = cluster.head.name
            if rival.ray.port == cluster.ray.port:
                problems.append(
                    f"{where}.ray.port: {cluster.ray.port} is also the Ray port of cluster "
                    f"{rival.name!r} on the shared head {name}"
                )
            if rival.model.port == cluster.model.port:
                problems.append(
                    f"{where}.model.port: {cluster.model.port} is also the model port of "
                    f"cluster {rival.name!r} on the shared head {name}"
                )
        log_dir = cluster.model.log_dir
        shared_log = log_dir in log_dirs
        if shared_log:
            problems.append(
                f"{where}.model.log_dir: {log_dir} is also the log_dir of cluster "
                f"{settings.clusters[log_dirs[log_dir]].name!r}; each cluster needs its own"
            )
        else:
            log_dirs[log_dir] = index
        # Each cluster prunes its own cache's entries: a shared one would lose the other's.
        cache_root = cluster.model.cache_root
        if cache_root in cache_roots and not shared_log:
            problems.append(
                f"{where}.model.cache_dir: {cache_root} is also the cache of cluster "
                f"{settings.clusters[cache_roots[cache_root]].name!r}; each cluster needs its own"
            )
        else:
            cache_roots[cache_root] = index
    return problems


def _echo(error: Any, errors: list[Any]) -> bool:
    """A list whose item failed also reports itself too short: say only what is wrong."""
    loc = tuple(error["loc"])
    return error["type"] == "too_short" and any(
        len(other["loc"]) > len(loc) and tuple(other["loc"][: len(loc)]) == loc for other in errors
    )


def _format_error(error: Any) -> str:
    loc = ".".join(str(part) for part in error["loc"]) or "config"
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{loc}: {message}"
