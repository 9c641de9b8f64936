"""The constrained types and checks the config's sections share.

Secrets are never values in the config: only paths to files holding them.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Annotated

from pydantic import Field

# Every duration is finite and at most a week: a longer one is a typo that would make sparkd
# wait forever (an `inf` timeout, a load grace of a year).
MAX_SECONDS = 7 * 24 * 3600.0
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]
# A value that reaches a tool as an argument must not be read by it as an option.
NotOption = Annotated[str, Field(min_length=1, pattern=r"^[^-\s]")]
# A cluster's, a host's or an instance's name: safe in a file name, a container name and a shell
# word.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
Name = Annotated[str, Field(pattern=NAME_PATTERN)]
EnvName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.I)
SYSTEM_DIRS = frozenset(
    ["/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib64", "/opt", "/proc", "/root",
     "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr", "/var", "/var/lib", "/var/log",  # noqa: S108
     "/usr/local", "/usr/bin", "/usr/lib", "/usr/sbin", "/usr/share", "/usr/local/bin",
     "/var/tmp", "/var/cache", "/var/run", "/var/spool", "/var/opt", "/mnt", "/media"]  # noqa: S108
)  # fmt: skip
# Everything below these is the kernel's or shared memory, never a directory of sparkd's own.
SYSTEM_TREES = ("/proc", "/sys", "/dev")


def system_directory(path: Path) -> str | None:
    """The system directory `path` names once normalised (`//etc`, `/var/lib/../../etc`,
    `/tmp/`), or None when it is a directory a service may own."""
    text = posixpath.normpath("/" + str(path).lstrip("/"))
    if text in SYSTEM_DIRS:
        return text
    for tree in SYSTEM_TREES:
        if text == tree or text.startswith(tree + "/"):
            return tree
    return None


def own_directory(value: Path) -> Path:
    system = system_directory(value)
    if system is not None:
        raise ValueError(
            f"{value} is the system directory {system} or inside it; give sparkd a directory "
            "of its own"
        )
    return value


def unique(what: str, values: list[str]) -> None:
    seen: set[str] = set()
    for value in values:
        if value in seen:
            raise ValueError(f"duplicate {what} {value!r}")
        seen.add(value)
