"""A control request's body: JSON of bounded size, depth and text, received within a deadline."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from sparkd.core.text import printable

BODY_TIMEOUT = 5.0
MAX_BODY = 16 * 1024
MAX_JSON_DEPTH = 8
MAX_TEXT = 1000


def json_depth(raw: str) -> int:
    """How deeply arrays and objects nest, counted without parsing (strings skipped)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in raw:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


async def json_body(request: web.Request) -> dict[str, Any]:
    if not request.can_read_body:
        return {}
    try:
        async with asyncio.timeout(BODY_TIMEOUT):
            raw = await request.read()
    except TimeoutError:
        raise web.HTTPRequestTimeout(text=f"body not received within {BODY_TIMEOUT:g}s") from None
    try:
        text = raw.decode("utf-8")
        if json_depth(text) > MAX_JSON_DEPTH:
            raise web.HTTPBadRequest(text=f"body nests deeper than {MAX_JSON_DEPTH} levels")
        body = json.loads(text)
    except ValueError:  # also not UTF-8, and integers too long to parse
        raise web.HTTPBadRequest(text="body must be JSON") from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text="body must be a JSON object")
    return body


def text_field(body: dict[str, Any], key: str, default: str) -> str:
    value = body.get(key, default)
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise web.HTTPBadRequest(text=f"{key} must be a string of at most {MAX_TEXT} characters")
    # A client's text is shown by `sparkd status` on someone else's terminal.
    return printable(value)
