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


def test_a_config_mismatch_is_said() -> None:
    ha = {
        "instance": "ops-3",
        "etcd": "reachable",
        "endpoint": "http://10.1.230.10:2379",
        "config_mismatch": {"mine": "5d41402abc4b2a76", "theirs": "7d793037a0760186"},
        "clusters": {"sparks": {"role": "standby", "token": None, "holder": "ops-1"}},
    }
    lines = render_status(body(ha)).splitlines()
    assert lines[-2:] == [
        "  refusing every cluster: config fingerprint 5d41402abc4b2a76 differs from the other "
        "instances' 7d793037a0760186",
        "  sparks: standby (owner: ops-1)",
    ]
    ha["config_mismatch"] = None
    assert "refusing" not in render_status(body(ha))
