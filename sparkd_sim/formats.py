"""Small helpers that reproduce how the real tools print things (Go templates, durations)."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from typing import Any


def go_json(value: Any, indent: int | None = None) -> str:
    """JSON as Go's encoding/json writes it: HTML-sensitive characters escaped."""
    text = json.dumps(
        value, indent=indent, ensure_ascii=False, separators=None if indent else (",", ":")
    )
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def go_quote(text: str) -> str:
    """strconv.Quote for the ASCII text docker shows."""
    return json.dumps(text, ensure_ascii=False)


def human_duration(seconds: float) -> str:
    """docker's units.HumanDuration."""
    s = int(seconds)
    if s < 1:
        return "Less than a second"
    if s == 1:
        return "1 second"
    if s < 60:
        return f"{s} seconds"
    minutes = s // 60
    if minutes == 1:
        return "About a minute"
    if minutes < 60:
        return f"{minutes} minutes"
    hours = round(s / 3600)
    if hours == 1:
        return "About an hour"
    if hours < 48:
        return f"{hours} hours"
    if hours < 24 * 7 * 2:
        return f"{hours // 24} days"
    if hours < 24 * 30 * 2:
        return f"{hours // 24 // 7} weeks"
    if hours < 24 * 365 * 2:
        return f"{hours // 24 // 30} months"
    return f"{hours // 24 // 365} years"


def docker_time(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%d %H:%M:%S +0000 UTC")


def rfc3339(wall: float) -> str:
    if wall <= 0:
        return "0001-01-01T00:00:00Z"
    return datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def ago(wall: float) -> str:
    return human_duration(time.time() - wall) + " ago"


_FIELD = re.compile(r"\{\{\s*(json\s+)?\.([A-Za-z0-9_.]*)\s*\}\}")


_INDEX = re.compile(r'\{\{\s*index\s+\.([A-Za-z0-9_.]*)\s+"([^"{}]*)"\s*\}\}')


def render_template(template: str, value: dict[str, Any]) -> str:
    """The subset of Go templates docker users write: `{{.A.B}}`, `{{json .A}}` and
    `{{index .A.B "key"}}` (a missing key is the map's zero value: nothing)."""

    def lookup(path: str) -> Any:
        current: Any = value
        for part in filter(None, path.split(".")):
            current = current.get(part) if isinstance(current, dict) else None
        return current

    def replace(match: re.Match[str]) -> str:
        found = lookup(match.group(2))
        if match.group(1):
            return go_json(found)
        if found is None:
            return "<no value>"
        if isinstance(found, bool):
            return "true" if found else "false"
        if isinstance(found, dict | list):
            return go_json(found)
        return str(found)

    def index(match: re.Match[str]) -> str:
        found = lookup(match.group(1))
        item = found.get(match.group(2)) if isinstance(found, dict) else None
        return "" if item is None else str(item)

    text = _INDEX.sub(index, template.replace("\\t", "\t").replace("\\n", "\n"))
    return _FIELD.sub(replace, text)


def tabwriter(rows: list[list[str]], minwidth: int = 20, padding: int = 3) -> str:
    """Go's text/tabwriter as docker configures it (cells padded with spaces, last one bare)."""
    if not rows:
        return ""
    columns = max(len(r) for r in rows)
    widths = [
        max(minwidth, max((len(r[i]) for r in rows if i < len(r) - 1), default=0) + padding)
        for i in range(columns)
    ]
    out = []
    for row in rows:
        cells = [cell.ljust(widths[i]) if i < len(row) - 1 else cell for i, cell in enumerate(row)]
        out.append("".join(cells).rstrip() + "\n")
    return "".join(out)
