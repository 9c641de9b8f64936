"""The simulator names what it shares with sparkd once (sparkd_sim.contract) and imports no
sparkd; this, on the consuming side, holds both to the same names."""

from __future__ import annotations

from pathlib import Path

from sparkd.core import spec
from sparkd.model import exits
from sparkd.settings import load_settings
from sparkd_demo.cli import sparkd_spec_labels
from sparkd_sim import contract, owned
from tests.toy import EXAMPLE_CONFIG


def test_labels_are_sparkds() -> None:
    assert (contract.LABEL_CLUSTER, contract.LABEL_ROLE, contract.LABEL_SPEC) == (
        spec.LABEL_CLUSTER,
        spec.LABEL_ROLE,
        spec.LABEL_SPEC,
    )


def test_container_names_are_sparkds() -> None:
    for cluster in load_settings(EXAMPLE_CONFIG).clusters:
        for host in cluster.hosts:
            assert contract.container_name(cluster.name, host.role) == spec.container_name(
                cluster, host
            )


def test_spec_labels_carry_sparkds_hashes_under_the_contracts_keys() -> None:
    labels = sparkd_spec_labels(Path(EXAMPLE_CONFIG))
    for cluster in load_settings(EXAMPLE_CONFIG).clusters:
        assert labels[contract.spec_key(cluster.name, "model")] == spec.model_spec_hash(cluster)
        assert labels[contract.spec_key(cluster.name, "head")] == spec.ray_spec_hash(
            cluster, cluster.head
        )
        for host in cluster.hosts:
            key = contract.host_spec_key(cluster.name, host.name)
            assert labels[key] == spec.ray_spec_hash(cluster, host)


def test_the_fence_refusals_the_simulator_knows_are_sparkds_exit_statuses() -> None:
    sparkds = {exits.FENCED_EXIT, exits.FENCE_MISMATCH_EXIT, exits.FENCE_BUSY_EXIT}
    assert set(owned.FENCE_REFUSALS) == sparkds
