"""The etcd tier's own servers: a three-member cluster gets six distinct ports, and one that
could not start leaves no member running (two leaked members once ran on through the rest of
a CI run, after one member's port had been handed to another)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.etcd.conftest import EtcdCluster, free_ports, private_address, require_etcd, running

pytestmark = pytest.mark.etcd


def test_ports_chosen_together_are_distinct() -> None:
    # Chosen one at a time and released, 500 ports from ~14k the kernel picks from would
    # repeat about nine times over.
    ports = free_ports(private_address(), 500)
    assert len(set(ports)) == len(ports)


def test_a_cluster_that_did_not_start_leaves_no_member_running(tmp_path: Path) -> None:
    cluster = EtcdCluster(require_etcd(), tmp_path / "etcd3")
    assert len({p for m in cluster.members for p in (m.client_port, m.peer_port)}) == 6
    with socket.socket() as taken:
        taken.bind((cluster.address, cluster.members[1].client_port))
        taken.listen()
        with pytest.raises(RuntimeError, match="address already in use"), running(cluster):
            pass
    assert [m.proc.poll() is not None for m in cluster.members if m.proc is not None] == [True] * 3
