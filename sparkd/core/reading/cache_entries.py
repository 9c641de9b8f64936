"""The names of vLLM compile cache entries sparkd makes, and the listing of a cache root, read.
Pure.

An entry is named from the image the head container runs (its ID: a re-pulled tag is a new
image) and the model: `<image digits>-<model slug>`. The launch builds the same name on the host
from `docker inspect` (sparkd.shell.catalogue.actions.start_model); which entries go is
core.judging.cache's.
"""

from __future__ import annotations

import re

from sparkd.core.spec import SHORT_ID_DIGITS, short_image_id
from sparkd.model.observed import CacheEntry

SLUG_MAX = 100
# An entry sparkd made: image digits, a dash, the model's slug. Never `.` or `..`, never a `/`.
ENTRY = re.compile(rf"[0-9a-f]{{{SHORT_ID_DIGITS}}}-[A-Za-z0-9_][A-Za-z0-9._-]{{0,{SLUG_MAX - 1}}}")


def model_slug(model_id: str) -> str:
    """The model id as one safe path component: `Qwen/Qwen3-8B` -> `Qwen--Qwen3-8B`."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", model_id.replace("/", "--"))
    slug = slug.strip(".-")[:SLUG_MAX].rstrip(".-")
    return slug or "model"


def image_digits(image_id: str) -> str | None:
    digits = short_image_id(image_id.strip())
    return digits if re.fullmatch(rf"[0-9a-f]{{{SHORT_ID_DIGITS}}}", digits) else None


def cache_key(image_id: str, model_id: str) -> str | None:
    """The entry a launch of `model_id` in a container of image `image_id` uses; None for an
    ID that is not one."""
    digits = image_digits(image_id)
    return f"{digits}-{model_slug(model_id)}" if digits is not None else None


def parse_listing(text: str) -> tuple[CacheEntry, ...]:
    """`find DIR -mindepth 1 -maxdepth 1 -printf '%T@ %f\\n'`: modification time (the host's
    own clock, used only to order the host's own entries) and name, one a line."""
    entries: list[CacheEntry] = []
    for line in text.splitlines():
        stamp, _, name = line.partition(" ")
        try:
            mtime = float(stamp)
        except ValueError:
            continue
        if name:
            entries.append(CacheEntry(name=name, mtime=mtime))
    return tuple(entries)
