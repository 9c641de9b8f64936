"""The config file, loaded: the TOML source with `SPARKD_...` environment overrides, validated
into the schema (sparkd.model.cluster), and what only the whole config or this machine can judge
(clusters that would share a host, the daemon's own section, the maintenance crons).

Environment variables reach scalar settings (`SPARKD_DAEMON__LISTEN=...`), not items of the
cluster list. Secrets are never values here: only paths to files holding them.
"""

from __future__ import annotations

import contextlib
import contextvars
import ipaddress
import os
import re
import socket
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from sparkd.config_file import DEFAULT_CONFIG_PATH, MAX_SOCKET_PATH
from sparkd.ha.config import HaSpec
from sparkd.model.base import Value
from sparkd.model.cluster import ClusterSpec
from sparkd.model.fields import own_directory, unique
from sparkd.model.spec import HostSpec
from sparkd.shell.cron import cron_trigger


class DaemonSettings(Value):
    listen: str = "127.0.0.1:9810"
    state_dir: Path = Path("/var/lib/sparkd")
    log_format: Literal["auto", "json", "console"] = "auto"
    control_token_file: Path | None = None
    # The API on a Unix socket for the CLI on this machine (web.unix): unset, `api.sock` in
    # systemd's RuntimeDirectory when the unit has one; "" for none.
    socket: str | None = None

    @field_validator("socket")
    @classmethod
    def _socket(cls, value: str | None) -> str | None:
        if not value:
            return value
        if not Path(value).is_absolute():
            raise ValueError('must be an absolute path (or "" for no socket)')
        if len(os.fsencode(value)) > MAX_SOCKET_PATH:
            raise ValueError(f"must be at most {MAX_SOCKET_PATH} bytes (a Unix socket's limit)")
        return value

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
        own_directory(value)
        # The state dir is on this machine: a symlink there is judged by where it leads.
        with contextlib.suppress(OSError, RuntimeError):
            own_directory(value.resolve())
        return value

    @property
    def listen_host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def listen_port(self) -> int:
        return int(self.listen.rpartition(":")[2])


_config_path: contextvars.ContextVar[Path] = contextvars.ContextVar(
    "sparkd_config_path", default=Path(DEFAULT_CONFIG_PATH)
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
        unique("cluster name", [c.name for c in self.clusters])
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
    problems = conflicts(settings) + window_problems(settings)
    if problems:
        raise ConfigError(problems)
    return settings


def window_problems(settings: Settings) -> list[str]:
    """Each maintenance window whose cron APScheduler cannot read, or that never fires, as one
    `location: problem` line."""
    problems: list[str] = []
    for index, cluster in enumerate(settings.clusters):
        for number, spec in enumerate(cluster.maintenance):
            where = f"clusters.{index}.maintenance.{number}"
            try:
                trigger = cron_trigger(spec)
            except ValueError as exc:
                problems.append(f"{where}: {exc}")
                continue
            # A cron that never fires (`0 0 31 2 *`) is a mistake, and each look for its next
            # window searches to the year 9999: a fifth of a second of the event loop.
            if trigger.get_next_fire_time(None, datetime.now(trigger.timezone)) is None:
                problems.append(f"{where}: cron {spec.cron!r} never fires")
    return problems


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
