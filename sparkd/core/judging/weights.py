"""Whether the model's files on the head make a whole checkpoint (core.reading.weight_files
reads them): a cutover starts only then. Pure."""

from __future__ import annotations

import posixpath

from sparkd.core.reading.weight_files import CONFIG, INDEX, MAX_NAMED, SINGLE
from sparkd.model.weights import ModelFiles


def unready(files: ModelFiles) -> str | None:
    """Why a cutover to this model cannot start yet, naming the file or the shortfall; None
    when the checkpoint looks whole."""
    where = files.directory
    if files.stat_error is not None:
        return f"{where} is unknown: {files.stat_error}"
    if files.size(CONFIG) is None:
        return f"{posixpath.join(where, CONFIG)} is missing"
    if files.index_error is not None:
        return f"{posixpath.join(where, INDEX)} is unknown: {files.index_error}"
    index = files.index
    named = index.files if index is not None else (SINGLE,)
    missing = [name for name in named if files.size(name) is None]
    if missing:
        listed = ", ".join(missing[:MAX_NAMED])
        more = len(missing) - MAX_NAMED
        what = "named by its index " if index is not None else ""
        tail = f" and {more} more" if more > 0 else ""
        return f"weight file {listed}{tail} {what}missing in {where}"
    empty = [name for name in named if files.size(name) == 0]
    if empty:
        return f"weight file {empty[0]} in {where} is empty"
    total = sum(files.size(name) or 0 for name in named)
    if index is not None and index.total_size is not None and total < index.total_size:
        return (
            f"weight files in {where} hold {total} bytes, below the index's total_size "
            f"{index.total_size} (a download cut short?)"
        )
    return None
