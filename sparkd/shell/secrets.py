"""Secrets come from files only (systemd LoadCredential= fits), read when needed, never logged."""

from __future__ import annotations

from pathlib import Path


class SecretFileError(Exception):
    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path


def read_secret(path: Path | None) -> str | None:
    """The file's content without the trailing newline; None when no file is configured."""
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SecretFileError(path, exc.strerror or "unreadable") from None
    secret = text.strip()
    if not secret:
        raise SecretFileError(path, "empty")
    if "\n" in secret:
        raise SecretFileError(path, "holds more than one line")
    if not secret.isprintable() or not secret.isascii():
        raise SecretFileError(path, "holds non-printable or non-ASCII characters")
    return secret
