"""python -m bench [NAME ...] [--quick]: run the named benchmarks (all by default)."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import sys
import time
import traceback

from sparkd.runtime import logs

NAMES = (
    "observe", "fanout", "host", "kernel", "probe", "detect", "recover", "footprint", "scale",
    "vllm_warm", "ha", "ha_process", "fence", "ha_events", "parsers",
)  # fmt: skip


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("names", nargs="*", metavar="NAME", help=", ".join(NAMES))
    parser.add_argument("--quick", action="store_true", help="fewer runs and shorter windows")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in NAMES]
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)}; known: {', '.join(NAMES)}")
    logs.configure("console", level=logging.WARNING, stream=sys.stderr)
    failed = []
    for name in args.names or NAMES:
        module = importlib.import_module(f"bench.bench_{name}")
        started = time.monotonic()
        print(f"== {name}", flush=True)
        try:
            asyncio.run(module.main(**({"quick": True} if args.quick else {})))
        except Exception:
            traceback.print_exc()
            failed.append(name)
        print(f"   ({time.monotonic() - started:.0f} s)\n", flush=True)
    if failed:
        print("failed: " + ", ".join(failed), file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
