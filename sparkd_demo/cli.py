"""`sparkd-sim`: the simulated world (`sparkd-sim --scenario …`, `sparkd-sim fault …`,
`sparkd-sim power cycle …`) and `sparkd-sim demo`. With this distribution installed, the daemon's
CLI offers the same as `sparkd sim …` and `sparkd demo` through its `sparkd.commands` entry
points (see `sparkd.cli.commands.plugin`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

EX_USAGE = 64


def sparkd_spec_labels(config: Path) -> Mapping[str, str]:
    """sparkd's own spec hashes for the config a world wrote (the contract's `SpecLabels`):
    what its `healthy` world stamps, so that a daemon pointed at that config finds no drift."""
    from sparkd.core.spec import model_spec_hash, ray_spec_hash
    from sparkd.settings import load_settings
    from sparkd_sim.contract import host_spec_key, spec_key

    labels: dict[str, str] = {}
    for cluster in load_settings(config).clusters:
        for host in cluster.hosts:
            labels[spec_key(cluster.name, host.role)] = ray_spec_hash(cluster, host)
            labels[host_spec_key(cluster.name, host.name)] = ray_spec_hash(cluster, host)
        labels[spec_key(cluster.name, "model")] = model_spec_hash(cluster)
    return labels


def sim(argv: Sequence[str]) -> int:
    """The simulated world; the simulator knows no sparkd, so this hands it sparkd's own spec
    hashes and the `healthy` world is drift-free for the config it prints."""
    from sparkd_sim.cli import main as sim_main

    return sim_main(list(argv), spec_labels=sparkd_spec_labels)


def _demo_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparkd demo", description="the simulated cluster and the daemon, recovering"
    )
    parser.add_argument("--exit-when-healthy", action="store_true")
    parser.add_argument("--fault", help="once healthy, inject this fault and show the recovery")
    parser.add_argument("--dir", type=Path, help="where the simulated world keeps its files")
    parser.add_argument("--load-seconds", type=float, default=20.0)
    parser.add_argument(
        "--port", type=int, default=9810,
        help="the API's port on 127.0.0.1 (a free one when it is taken)",
    )  # fmt: skip
    return parser


def demo(argv: Sequence[str]) -> int:
    try:
        args = _demo_parser().parse_args(list(argv))
    except SystemExit as exc:  # argparse's --help and usage errors
        return exc.code if isinstance(exc.code, int) else EX_USAGE
    from sparkd_demo.demo import main as demo_main

    return demo_main(args)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["demo"]:
        return demo(args[1:])
    return sim(args)


if __name__ == "__main__":
    sys.exit(main())
