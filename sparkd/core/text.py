"""Text from outside the process (a host's tools, a model server, an API client) made safe to
print: C0 and C1 control characters, DEL and the bidirectional overrides and isolates become
U+FFFD. Applied once, where the text is parsed, so no terminal showing `sparkd status`, `plan` or
`once` can be repainted, cleared or made to show text in another order by a host.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

REPLACEMENT = "\ufffd"
# What a secret is replaced by wherever it is shown (logs, `/status`, snapshots, log tails).
MASK = "***"
# U+061C, U+200E/F: marks; U+202A-E: embeddings and overrides; U+2066-9: isolates.
_BIDI = "\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_UNSAFE = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}]")
# Multi-line text keeps its line breaks and tabs (parsers split on them); nothing else.
_UNSAFE_IN_LINES = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}]")
# A carriage return alone (tqdm's progress updates) is a line break to every reader here, and
# would let a line overwrite the start of the one before it on a terminal.
_RETURNS = re.compile("\r\n?")


def printable(text: str, *, lines: bool = False) -> str:
    """`text` with every control and bidi override replaced; with `lines`, `\\n` and `\\t` are
    kept and a carriage return becomes a line break."""
    if not lines:
        return _UNSAFE.sub(REPLACEMENT, text)
    return _UNSAFE_IN_LINES.sub(REPLACEMENT, _RETURNS.sub("\n", text))


def printable_json(value: Any) -> Any:
    """A decoded JSON value with every string in it (keys too) made printable, line breaks
    kept: JSON's `\\u001b` escapes decode to the very characters `printable` removes."""
    if isinstance(value, str):
        return printable(value, lines=True)
    if isinstance(value, dict):
        return {printable_json(k): printable_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [printable_json(v) for v in value]
    return value


# Secrets a line may carry that sparkd never read (so the process-wide redactor cannot know
# them): the value after each prefix is masked. The first are vLLM's and its environment's,
# masked in every line; the rest, `CREDENTIALS`, what a PDU's or smart plug's client may echo
# (`password=...`, `token: ...`, ipmitool's `-P pass`, snmpset's `-c community`, a URL's
# `user:pass@`), masked in the power command's output only: sparkd's own log lines carry
# `token=N`, the fencing token, which is no secret.
_EVERY_LINE = (
    re.compile(r"(--api-key[ =])\S+"),
    re.compile(r"(Authorization:\s*(?:Bearer|Basic)\s+)\S+", re.I),
    re.compile(r"((?:VLLM_API_KEY|HF_TOKEN|HUGGING_FACE_HUB_TOKEN|OPENAI_API_KEY)=)\S+"),
)
CREDENTIALS = (
    re.compile(
        r"(\b(?:password|passwd|pass|token|secret|api[_-]?key|community)\s*[=:]\s*)\S+", re.I
    ),
    re.compile(r"((?<!\S)-[Pc] ?)\S+"),
    re.compile(r"(\b[a-z][a-z0-9+.-]{0,20}://[^/@\s:]{0,256}:)[^/@\s]{1,256}(?=@)", re.I),
)
SECRET_PATTERNS = _EVERY_LINE + CREDENTIALS


def redact(line: str, secrets: Iterable[str] = (), credentials: bool = False) -> str:
    for secret in secrets:
        if secret:
            line = line.replace(secret, MASK)
    for pattern in SECRET_PATTERNS if credentials else _EVERY_LINE:
        line = pattern.sub(rf"\1{MASK}", line)
    return line
