"""A real OpenSSH sshd on loopback, for the tier that checks sparkd against OpenSSH itself
(tests/support/sshd.py). The worlds behind OpenSSH are tests/support/worlds.py's `openssh`
parameter."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.sshd import RealSshd, running_sshd


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[RealSshd]:
    with running_sshd(tmp_path) as server:
        yield server
