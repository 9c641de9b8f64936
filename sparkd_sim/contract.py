"""What the simulator and sparkd must agree on, named once on the simulator's side. The
simulator imports no sparkd, so the consuming side checks these against sparkd's own names
(tests/unit/test_sim_contract.py); the rest of the contract is the real tools' formats
(tests/fixtures) and the TOML the world writes, which sparkd's own loader reads in the tests.

A `healthy` world plays what sparkd would have created: its Ray containers carry sparkd's names
and labels, and `sparkd.spec` the hash sparkd computes for the config the world prints (handed
in by the caller as a `SpecLabels` callback, keyed `CLUSTER/role`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

LABEL_CLUSTER = "sparkd.cluster"
LABEL_ROLE = "sparkd.role"
LABEL_SPEC = "sparkd.spec"

# The config the world writes, for `load_settings`: the path within the world's directory.
CONFIG_NAME = "sparkd.toml"

SpecLabels = Callable[[Path], Mapping[str, str]]


def container_name(cluster: str, role: str) -> str:
    """The name sparkd gives the Ray container of `role` ("head" or "worker") in `cluster`."""
    return f"sparkd-{cluster}-ray-{role}"


def spec_key(cluster: str, role: str) -> str:
    """A `SpecLabels` key: the hash for `role` ("head", "worker" or "model") of `cluster`."""
    return f"{cluster}/{role}"


def host_spec_key(cluster: str, host: str) -> str:
    """A `SpecLabels` key for one host's Ray container (a worker's hash carries its data IP, so
    with two or more workers each host has its own)."""
    return f"{cluster}/host/{host}"
