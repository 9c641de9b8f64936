"""structlog: JSON lines for journald when stdout is not a terminal, a console view when it is.

Each JSON line starts with a `<N>` syslog priority so `journalctl -p err` works. Every line
passes the process-wide redactor (sparkd.shell.secrets) last, after tracebacks are rendered.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any, Literal, TextIO

import structlog

from sparkd.shell.secrets import REDACTOR

PRIORITY = {"critical": 2, "error": 3, "warning": 4, "info": 6, "debug": 7}


def _journald_json(_logger: Any, _name: str, event: Any) -> str:
    priority = PRIORITY.get(str(event.get("level", "info")), 6)
    return f"<{priority}>" + json.dumps(event, default=str, sort_keys=True)


def configure(
    fmt: Literal["auto", "json", "console"] = "auto",
    level: int = logging.INFO,
    stream: TextIO | None = None,
) -> None:
    """Logs go to stdout for the daemon (journald); commands whose stdout is data use stderr."""
    out = stream or sys.stdout
    use_json = fmt == "json" or (fmt == "auto" and not out.isatty())
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    renderer: Any = (
        _journald_json
        if use_json
        else structlog.dev.ConsoleRenderer(
            colors=False, exception_formatter=structlog.dev.plain_traceback
        )
    )
    # Never render frame locals: they can hold the API key or an Authorization header.
    tracebacks: Any = (
        structlog.processors.ExceptionRenderer(
            structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
        )
        if use_json
        else _identity
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            tracebacks,
            _redact_event,
            _redacted(renderer),
        ],
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("asyncssh").setLevel(logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger("apscheduler").setLevel(logging.WARNING)


def _redact_event(_logger: Any, _name: str, event: Any) -> Any:
    """Every value, before rendering (JSON escaping could otherwise split a secret)."""
    return {
        key: value if key == "exc_info" else _redact_value(value) for key, value in event.items()
    }


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return REDACTOR.redact(value)
    if isinstance(value, dict | list | tuple):
        return REDACTOR.redact_json(value)
    if isinstance(value, int | float | bool) or value is None:
        return value
    return REDACTOR.redact(str(value))


def _redacted(renderer: Any) -> Any:
    """The rendered line, once more: the console renderer formats exceptions itself."""

    def render(logger: Any, name: str, event: Any) -> Any:
        line = renderer(logger, name, event)
        return REDACTOR.redact(line) if isinstance(line, str) else line

    return render


def _identity(_logger: Any, _name: str, event: Any) -> Any:
    return event


def get(name: str = "sparkd") -> structlog.stdlib.BoundLogger:
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(name)
    return logger
