"""`sparkd status` with `[ha]`: one line for the instance, one per cluster with its role."""

from __future__ import annotations

from sparkd.cli.api import render_status


def body(ha: object) -> dict[str, object]:
    cluster = {"cluster": "sparks", "phase": "healthy", "reason": "ok", "snapshot": None}
    return {"clusters": [cluster], "ha": ha} if ha is not None else {"clusters": [cluster]}


def test_without_ha_no_ha_lines() -> None:
    assert not any(line.startswith("ha:") for line in render_status(body(None)).splitlines())


def test_roles() -> None:
    ha = {
        "instance": "ops-1",
        "etcd": "reachable",
        "endpoint": "http://10.1.230.10:2379",
        "clusters": {
            "sparks": {"role": "owner", "token": 42, "holder": "ops-1"},
            "lab": {"role": "standby", "token": None, "holder": "ops-2"},
            "racks": {"role": "no etcd", "token": None, "holder": None},
        },
    }
    lines = render_status(body(ha)).splitlines()
    assert lines[-4:] == [
        "ha: instance ops-1, etcd reachable (http://10.1.230.10:2379)",
        "  sparks: owner (token 42)",
        "  lab: standby (owner: ops-2)",
        "  racks: no etcd",
    ]
