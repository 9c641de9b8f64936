"""systemd notification (Type=notify): READY, STATUS, WATCHDOG, RELOADING, STOPPING.

Without NOTIFY_SOCKET every call does nothing. sdnotify encodes latin-1 and swallows errors, so
STATUS text is made latin-1 safe here rather than silently lost.
"""

from __future__ import annotations

import os
import time

import sdnotify


class Notifier:
    def __init__(self) -> None:
        self._enabled = bool(os.environ.get("NOTIFY_SOCKET"))
        self._notifier = sdnotify.SystemdNotifier() if self._enabled else None

    def _send(self, text: str) -> None:
        if self._notifier is not None:
            self._notifier.notify(text.encode("latin-1", "replace").decode("latin-1"))

    def ready(self, status: str) -> None:
        self._send(f"READY=1\nSTATUS={_line(status)}")

    def status(self, status: str) -> None:
        self._send(f"STATUS={_line(status)}")

    def reloading(self) -> None:
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self._send(f"RELOADING=1\nMONOTONIC_USEC={usec}")

    def stopping(self) -> None:
        self._send("STOPPING=1")

    def watchdog(self) -> None:
        self._send("WATCHDOG=1")

    def watchdog_interval(self) -> float | None:
        """Half of WATCHDOG_USEC, when the watchdog is meant for this process."""
        usec = os.environ.get("WATCHDOG_USEC")
        pid = os.environ.get("WATCHDOG_PID")
        if not self._enabled or not usec or not usec.isdigit():
            return None
        if pid and pid.isdigit() and int(pid) != os.getpid():
            return None
        return int(usec) / 2e6


def _line(text: str) -> str:
    return " ".join(text.split())[:400]
