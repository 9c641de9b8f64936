"""Secrets come from files only (systemd LoadCredential= fits), read when needed, never logged.

Every secret read here is remembered by the process-wide redactor (`REDACTOR`), which keeps the
current and the previous value of each secret file: a rotated API key is still scrubbed from a
log tail written before the rotation. Everything that leaves the process (log lines, `/status`,
`/events`, snapshots, plan reasons, action details) passes `redact` or `redact_json`.
"""

from __future__ import annotations

import os
import re
import stat
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sparkd.core.text import MASK
from sparkd.core.text import redact as redact_patterns

# A key or token is one line; a file much longer is not one.
MAX_SECRET_BYTES = 4096


class SecretFileError(Exception):
    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path


class Redactor:
    """The secrets this process has read (current and previous per file), and their removal."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_path: dict[str, tuple[str, ...]] = {}
        self._secrets: tuple[str, ...] = ()
        self._pattern: re.Pattern[str] | None = None

    def note(self, path: Path, secret: str) -> None:
        key = str(path)
        with self._lock:
            held = self._by_path.get(key, ())
            if held and held[0] == secret:
                return
            self._by_path[key] = (secret, *held[:1])
            found = {s for values in self._by_path.values() for s in values if s}
            # Longest first, so a secret that contains another is masked whole.
            self._secrets = tuple(sorted(found, key=lambda s: (-len(s), s)))
            self._pattern = _encoded_forms(self._secrets)

    def secrets(self) -> tuple[str, ...]:
        return self._secrets

    def redact(self, text: str) -> str:
        pattern = self._pattern
        if pattern is not None:
            text = pattern.sub(MASK, text)
        return redact_patterns(text)

    def redact_json(self, value: Any) -> Any:
        """The same JSON-like value (dicts, lists, strings, numbers) with every string redacted,
        keys included."""
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            return {self.redact_json(k): self.redact_json(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.redact_json(v) for v in value]
        return value


def _char_forms(char: str) -> str:
    """Every way a server or proxy echoing a secret may have written one of its characters:
    as is, percent-encoded (once or twice, either hex case), JSON- or backslash-escaped, as an
    HTML entity, and a space as a form's `+`. Matched without regard to case, so a case-folded
    echo is caught too."""
    code = ord(char)
    forms = [
        re.escape(char),
        f"%{code:02x}",
        f"%25{code:02x}",
        rf"\\u{code:04x}",
        rf"\\x{code:02x}",
        rf"\\{re.escape(char)}",
        f"&#{code};",
        f"&#x0*{code:x};",
    ]
    if char == " ":
        forms.append(r"\+")
    return "(?:" + "|".join(forms) + ")"


def _encoded_forms(secrets: tuple[str, ...]) -> re.Pattern[str] | None:
    if not secrets:
        return None
    # Longest first, as an alternation tries its branches in order.
    alternatives = ("".join(_char_forms(c) for c in secret) for secret in secrets)
    return re.compile("|".join(alternatives), re.IGNORECASE)


REDACTOR = Redactor()


def redact(text: str) -> str:
    return REDACTOR.redact(text)


def redact_json(value: Any) -> Any:
    return REDACTOR.redact_json(value)


def read_secret(path: Path | None) -> str | None:
    """The file's content without the trailing newline; None when no file is configured."""
    if path is None:
        return None
    try:
        # Non-blocking, so a FIFO (or a device) put there cannot hang the reader on open.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise SecretFileError(path, exc.strerror or "unreadable") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SecretFileError(path, "is not a regular file")
        data = os.read(fd, MAX_SECRET_BYTES + 1)
    except OSError as exc:
        raise SecretFileError(path, exc.strerror or "unreadable") from None
    finally:
        os.close(fd)
    if len(data) > MAX_SECRET_BYTES:
        raise SecretFileError(path, f"is over {MAX_SECRET_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretFileError(path, "holds non-printable or non-ASCII characters") from None
    secret = text.strip()
    if not secret:
        raise SecretFileError(path, "empty")
    if "\n" in secret:
        raise SecretFileError(path, "holds more than one line")
    if not secret.isprintable() or not secret.isascii():
        raise SecretFileError(path, "holds non-printable or non-ASCII characters")
    REDACTOR.note(path, secret)
    return secret


def prime(paths: Iterable[Path | None]) -> None:
    """Read each configured secret file once at start, so the redactor knows them before any
    line is written. An unusable file is left for the code that needs it to report."""
    for path in paths:
        try:
            read_secret(path)
        except SecretFileError:
            continue
