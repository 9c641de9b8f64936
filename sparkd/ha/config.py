"""The `[ha]` config section: where etcd is, who this instance is, and the lease timings.

The timings must satisfy Patroni's rule, renew + 2 x request timeout <= TTL - margin: a renewal
that fails once (one timeout, then the next endpoint's) still leaves room for the next one before
the owner's own deadline passes, so a healthy owner never demotes itself over one slow reply.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sparkd.model.fields import NAME_PATTERN, Seconds


def default_instance() -> str:
    """The host name, cut to its first label when the full name is not a valid instance name."""
    name = socket.gethostname()
    short = name.split(".")[0]
    return name if len(name) <= 63 else short


class HaSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    etcd_endpoints: tuple[str, ...] = Field(min_length=1)
    instance: Annotated[str, Field(pattern=NAME_PATTERN)] = Field(default_factory=default_instance)
    # etcd grants whole seconds, and never less than 2 with its default election timing.
    lease_ttl: Annotated[int, Field(ge=2, le=3600)] = 15
    renew_interval: Seconds = 5.0
    request_timeout: Seconds = 2.0
    margin: Seconds = 2.0
    prefix: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_./-]+/$")] = "sparkd/v1/"
    user: Annotated[str, Field(min_length=1, pattern=r"^[^\s:]+$")] | None = None
    password_file: Path | None = None
    # Every mutating command carries the owner's token, checked on the host under `flock`.
    # False only for tests and diagnosis: a paused former owner's command then runs.
    host_fencing: bool = True

    @field_validator("etcd_endpoints")
    @classmethod
    def _endpoints(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for endpoint in value:
            url = urlsplit(endpoint)
            if url.scheme not in ("http", "https") or not url.hostname or url.path not in ("", "/"):
                raise ValueError(f"{endpoint!r}: use http://HOST:PORT or https://HOST:PORT")
            try:
                port = url.port
            except ValueError:
                raise ValueError(f"{endpoint!r}: bad port") from None
            if port is None:
                raise ValueError(f"{endpoint!r}: give the port (etcd's client port, e.g. 2379)")
        if len(set(value)) != len(value):
            raise ValueError("an endpoint is listed twice")
        return tuple(e.rstrip("/") for e in value)

    @model_validator(mode="after")
    def _timings(self) -> HaSpec:
        need = self.renew_interval + 2 * self.request_timeout
        room = self.lease_ttl - self.margin
        if need > room:
            raise ValueError(
                f"renew_interval + 2 x request_timeout ({need:g}s) must be at most "
                f"lease_ttl - margin ({room:g}s): one failed renewal would end ownership"
            )
        if (self.user is None) != (self.password_file is None):
            raise ValueError("user and password_file go together")
        if self.password_file is not None and not self.password_file.is_absolute():
            raise ValueError("password_file must be an absolute path")
        return self
