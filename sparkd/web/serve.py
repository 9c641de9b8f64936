"""The HTTP API, started: what the composition root (the CLI's `run`, the demo, the tests) hands
the daemon as its `api`, so that the runtime never imports the web layer above it."""

from __future__ import annotations

from aiohttp import web

from sparkd.web.app import make_app
from sparkd.web.guard import GuardedSite, runner_options
from sparkd.web.protocol import DaemonApi


async def serve_api(daemon: DaemonApi) -> web.AppRunner:
    """The daemon's API bound to `daemon.listen`; its runner, which the daemon cleans up at stop.
    Raises OSError when the address cannot be bound, with nothing left behind."""
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
    return runner
