"""`sparkd sim` for the benchmarks: its `healthy` world carries sparkd's own spec hashes for the
config it prints (the simulator knows no sparkd; this, its caller, does)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from sparkd.core.spec import model_spec_hash, ray_spec_hash
from sparkd.settings import load_settings
from sparkd.sim.cli import main


def sparkd_spec_labels(config: Path) -> Mapping[str, str]:
    labels: dict[str, str] = {}
    for cluster in load_settings(config).clusters:
        labels[f"{cluster.name}/head"] = ray_spec_hash(cluster, cluster.head)
        for worker in cluster.workers:
            labels[f"{cluster.name}/worker"] = ray_spec_hash(cluster, worker)
        labels[f"{cluster.name}/model"] = model_spec_hash(cluster)
    return labels


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:], spec_labels=sparkd_spec_labels))
