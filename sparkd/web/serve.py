"""The HTTP API, started: what the composition root (the CLI's `run`, the demo, the tests) hands
the daemon as its `api`, so that the runtime never imports the web layer above it."""

from __future__ import annotations

import os

from aiohttp import web

from sparkd.web.app import make_app
from sparkd.web.guard import GuardedSite, runner_options
from sparkd.web.protocol import DaemonApi
from sparkd.web.unix import GuardedUnixSite, socket_path


async def serve_api(daemon: DaemonApi) -> web.AppRunner:
    """The daemon's API bound to `daemon.listen`, and to its Unix socket when it has one (web.unix);
    its runner, which the daemon cleans up at stop. Raises OSError when the address cannot be
    bound, with nothing left behind; a socket that cannot be made is logged, and the CLI then
    uses TCP."""
    app = make_app(daemon)
    runner = web.AppRunner(app, **runner_options())
    await runner.setup()
    listen = daemon.settings.daemon
    site = GuardedSite(runner, listen.listen_host, listen.listen_port, app)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    path = socket_path(listen, os.environ)
    if path is not None:
        unix = GuardedUnixSite(runner, path, app)
        try:
            await unix.start()
        except OSError as exc:
            if unix in runner.sites:
                await unix.stop()
            daemon.log.warning("api_socket_unavailable", path=str(path), error=str(exc))
        else:
            daemon.log.info("api_socket", path=str(path))
    return runner
