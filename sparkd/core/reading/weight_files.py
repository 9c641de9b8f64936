"""Prepare before cutover: the model's files are on the head before anything is stopped. Pure.

The head `stat`s the model directory (config.json, the index, every *.safetensors) and sends
the index reduced to its metadata and one weight_map entry per file; here that is parsed
totally. A checkpoint is ready when
config.json is there and every file the index's `weight_map` names (or a single
`model.safetensors`) is there, none empty, and together not below the index's
`metadata.total_size` (a file holds its tensors' bytes and a header). An index that cannot be
read is unknown: never a reason to start a cutover, never a latch (it is read again each cycle).
"""

from __future__ import annotations

import json
import posixpath
import re
from typing import Any

from sparkd.model.cluster import ClusterSpec
from sparkd.model.weights import ModelFiles, WeightIndex

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
# The index is read up to this many bytes (a 235B MoE's FP8 index is ~7 MB); a longer one is
# unknown rather than parsed from a cut-off text. The host reduces it (shell.catalogue
# REDUCE_INDEX) to at most REDUCED_LIMIT bytes, well inside the fact script's output bound.
INDEX_LIMIT = 16 << 20
REDUCED_LIMIT = 1 << 20
_STAT_LINE = re.compile(r"^(\d+) (/.*)$")
_ABSENT = "No such file or directory"
# At most this many missing files are named; the rest are counted.
MAX_NAMED = 3


def host_path(spec: ClusterSpec) -> str | None:
    """The model directory on the head: the model id (a path inside the Ray container) through
    the `ray.mounts` bind mount that holds it. None for a hub id or a path no mount holds
    (nothing to check from the host)."""
    model = spec.model.id
    if not model.startswith("/"):
        return None
    model = posixpath.normpath(model)
    best: tuple[int, str] | None = None
    for mount in spec.ray.mounts:
        parts = mount.split(":")
        src, dst = posixpath.normpath(parts[0]), posixpath.normpath(parts[1])
        holds = model == dst or model.startswith(dst.rstrip("/") + "/")
        if holds and (best is None or len(dst) > best[0]):
            rest = model[len(dst) :].lstrip("/")
            best = (len(dst), posixpath.join(src, rest) if rest else src)
    return best[1] if best is not None else None


def parse_stat(directory: str, text: str, rc: int | None) -> ModelFiles:
    """`stat -L -c '%s %n' -- FILE...`: one `SIZE PATH` line per file found; an absent file is
    an error line (`stat: cannot statx 'PATH': No such file or directory`) and exit status 1."""
    sizes: list[tuple[str, int]] = []
    problems: list[str] = []
    for line in text.splitlines():
        match = _STAT_LINE.match(line)
        if match:
            sizes.append((posixpath.basename(match.group(2)), int(match.group(1))))
        elif line.strip() and _ABSENT not in line:
            problems.append(line.strip())
    error = None
    if rc is None or rc not in (0, 1):
        error = f"stat exited {rc if rc is not None else 'without a status'}"
    elif problems:
        error = problems[0]
    return ModelFiles(directory=directory, sizes=tuple(sizes), stat_error=error)


def parse_index(text: str) -> WeightIndex | str:
    """The index's text, parsed totally: a WeightIndex, or why it is unknown."""
    if len(text.encode()) > INDEX_LIMIT:
        return f"{INDEX} is larger than {INDEX_LIMIT} bytes"
    try:
        data: Any = json.loads(text)
    except ValueError as exc:
        return f"{INDEX} is not JSON ({exc})"
    except RecursionError:
        # `[[[[...` past the decoder's depth: a host's text, never an exception of the look's.
        return f"{INDEX} is not JSON (nested too deep)"
    if not isinstance(data, dict):
        return f"{INDEX} is not a JSON object"
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        return f"{INDEX} has no weight_map"
    files: set[str] = set()
    for value in weight_map.values():
        if not isinstance(value, str) or not _plain_name(value):
            return f"{INDEX} names {value!r}, not a file in the model directory"
        files.add(value)
    metadata = data.get("metadata")
    total: int | None = None
    if isinstance(metadata, dict) and "total_size" in metadata:
        raw = metadata["total_size"]
        # Some writers store it as a float; a bool, a negative or a string is garbled.
        if isinstance(raw, bool) or not isinstance(raw, int | float) or raw < 0:
            return f"{INDEX} has total_size {raw!r}"
        if isinstance(raw, float) and not raw.is_integer():
            return f"{INDEX} has total_size {raw!r}"
        total = int(raw)
    return WeightIndex(files=tuple(sorted(files)), total_size=total)


def _plain_name(name: str) -> bool:
    return bool(name) and "/" not in name and name not in (".", "..") and "\x00" not in name


def with_index(files: ModelFiles, text: str | None, rc: int | None) -> ModelFiles:
    """The stat reading with the index's (reduced) read: absent, parsed, or unknown."""
    if files.size(INDEX) is None and files.stat_error is None:
        return files  # no index: a single model.safetensors, or nothing
    if text is None or rc != 0:
        why = f"{INDEX} could not be read (exit {rc})"
        return files.model_copy(update={"index_error": why})
    if text.startswith("!"):
        # What the host's reduction could not do, in its own words.
        return files.model_copy(update={"index_error": f"{INDEX} {text[1:].strip()}"})
    parsed = parse_index(text)
    if isinstance(parsed, str):
        return files.model_copy(update={"index_error": parsed})
    return files.model_copy(update={"index": parsed})
