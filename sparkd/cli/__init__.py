"""The `sparkd` command."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["--version"]:
        # Asked by scripts and package checks: no need to load the rest of sparkd for it.
        from sparkd import __version__

        print(f"sparkd {__version__}")
        return 0
    from sparkd.cli import api

    if args[:1] and args[0] in api.COMMANDS:
        # The daemon's API only: none of the settings model, SSH or the planner.
        return api.run(args)
    from sparkd.cli.commands import dispatch

    return dispatch(args)
