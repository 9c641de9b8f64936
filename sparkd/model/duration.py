"""Durations as an operator writes them. Standard library only: `sparkd pause --duration` reads
one without loading the config schema (pydantic)."""

from __future__ import annotations

import re

DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """`90s`, `30m`, `2h`, `1d` or plain seconds."""
    match = DURATION.match(text.strip())
    if not match:
        raise ValueError(f"bad duration {text!r}: use e.g. 90s, 30m, 2h, 1d")
    return float(match.group(1)) * DURATION_UNITS[match.group(2)]
