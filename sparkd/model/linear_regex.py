"""Patterns from the config run on text from outside (a model's answer): compiled by RE2
(google-re2), whose matching is linear in the text. Python's `re` backtracks, and a pattern
such as `^(\\w+,?\\s?)*\\.$` took most of a minute on one answer. RE2 has no backreferences or
lookaround: a pattern that needs them is refused when the config is read.
"""

from __future__ import annotations

import functools
from typing import Protocol

import re2


class Match(Protocol):
    def group(self, name: int | str = 0) -> str | None: ...


class Pattern(Protocol):
    def search(self, text: str) -> Match | None: ...


class Error(ValueError):
    """RE2 cannot run this pattern (its syntax, a backreference, a lookaround)."""


@functools.lru_cache(maxsize=64)
def compile_regex(pattern: str) -> Pattern:
    options = re2.Options()
    # Its errors are raised here, not also written to stderr by RE2's own logging.
    options.log_errors = False
    try:
        compiled: Pattern = re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode(errors="replace")
        raise Error(f"{reason} (RE2 syntax: no backreferences or lookaround)") from None
    return compiled
