"""A JSON document's shape, for the tests that hold a simulated tool's output to a real one's."""

from __future__ import annotations

from typing import Any


def json_shape(value: Any) -> Any:
    """The document's keys at every level and the type names of its leaves; a list by its first
    element (an empty list stays empty)."""
    if isinstance(value, dict):
        return {key: json_shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [json_shape(item) for item in value[:1]]
    return type(value).__name__
