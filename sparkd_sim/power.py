"""`sparkd sim power cycle HOST --dir PATH`: the simulated world's switched PDU, for
`[clusters.power] command`.

It takes what a PDU's or smart plug's CLI takes (an action and an outlet, here the host's
name), tells the running world over its control socket, and prints one line; it exits 0 when
the world obeyed. Light on purpose: sparkd runs it as a subprocess of the ops box.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
from pathlib import Path

from sparkd_sim.control import send_power


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparkd sim power", description="Power-cycle a host of a running simulated world."
    )
    parser.add_argument("action", choices=("cycle",))
    parser.add_argument("host")
    parser.add_argument("--dir", type=Path, default=None, help="world directory")
    return parser


def main(argv: list[str]) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    # The same default as `sparkd sim` (sim.cli.default_dir), without importing the world.
    directory: Path = args.dir or Path(tempfile.gettempdir()) / f"sparkd-sim-{os.getuid()}"
    try:
        answer = asyncio.run(send_power(directory / "control.sock", args.action, args.host))
    except (FileNotFoundError, ConnectionRefusedError):
        print(f"sparkd sim power: no running world at {directory}", file=sys.stderr)
        return 1
    ok = bool(answer.get("ok"))
    print(answer.get("message", ""), file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
