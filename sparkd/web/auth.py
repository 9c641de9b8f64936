"""The control endpoints' bearer token: checked in constant time against the file named by
`daemon.control_token_file`, read per request so a rotated token applies at once. Without a
configured token they answer 403 and say how to enable them."""

from __future__ import annotations

import asyncio
import hmac

from aiohttp import web

from sparkd.shell.secrets import SecretFileError, read_secret
from sparkd.web.protocol import DAEMON


async def authorize(request: web.Request) -> None:
    token_file = request.app[DAEMON].settings.daemon.control_token_file
    if token_file is None:
        raise web.HTTPForbidden(
            text="control endpoints are disabled: set daemon.control_token_file to a file "
            "holding a bearer token"
        )
    try:
        # Off the loop: a file on a hung mount must not stall every request.
        token = await asyncio.to_thread(read_secret, token_file)
    except SecretFileError as exc:
        raise web.HTTPForbidden(text=f"control token unavailable: {exc}") from None
    given = request.headers.get("Authorization", "")
    scheme, _, value = given.partition(" ")
    expected = (token or "").encode()
    try:
        presented = value.strip().encode("utf-8")
    except UnicodeEncodeError:  # bytes that were not UTF-8 arrive as surrogates
        raise web.HTTPBadRequest(text="Authorization header is not UTF-8") from None
    if scheme.lower() != "bearer" or not hmac.compare_digest(presented, expected):
        raise web.HTTPUnauthorized(text="bad or missing bearer token")
