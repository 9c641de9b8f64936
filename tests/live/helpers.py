"""Shared pieces for tests that run sparkd's own code against the simulated world over SSH."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from sparkd.core.spec import model_spec_hash, ray_spec_hash
from sparkd.settings import load_settings


def sparkd_spec_labels(config: Path) -> Mapping[str, str]:
    """sparkd's own spec hashes for the world's generated config, for the `healthy` scenario."""
    labels: dict[str, str] = {}
    for cluster in load_settings(config).clusters:
        labels[f"{cluster.name}/head"] = ray_spec_hash(cluster, cluster.head)
        for worker in cluster.workers:
            labels[f"{cluster.name}/worker"] = ray_spec_hash(cluster, worker)
        labels[f"{cluster.name}/model"] = model_spec_hash(cluster)
    return labels
