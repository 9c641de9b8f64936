"""`NCCL_IB_HCA`: which RDMA devices (and ports) NCCL may use.

NCCL's syntax (NVIDIA/nccl `src/transport/net_ib/init.cc` `ncclIbInitDevices`, and
`src/misc/utils.cc` `parseStringList`/`matchIfList`, NCCL 2.2x): a
comma-separated list of `name[:port]`; a leading `^` excludes the listed devices instead of
selecting them, then a leading `=` makes names match exactly instead of as prefixes. NCCL also
skips every port that is not ACTIVE when it starts.

Device names reach a remote command (as sysfs paths): only a conservative charset is accepted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# NCCL keeps a name in `char prefix[64]`; the kernel's RDMA names are letters, digits, `_`.
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,63}$")
_PORT = re.compile(r"^[0-9]{1,3}$")


@dataclass(frozen=True)
class Hca:
    # (device name or prefix, port or None for every port), in the order given.
    devices: tuple[tuple[str, int | None], ...]
    # `=`: names are whole device names; else each is a prefix, as NCCL matches them.
    exact: bool
    # `^`: the devices listed are the ones NCCL must not use (so the used ones cannot be listed).
    exclude: bool


def parse_hca(value: str) -> Hca:
    """The parsed list; ValueError naming what is wrong (an unsafe name or a bad port)."""
    text = value
    exclude = text.startswith("^")
    if exclude:
        text = text[1:]
    exact = text.startswith("=")
    if exact:
        text = text[1:]
    devices: list[tuple[str, int | None]] = []
    for item in text.split(","):
        if not item:
            continue  # NCCL skips empty entries too (no whitespace is trimmed)
        name, sep, port = item.partition(":")
        if not _NAME.match(name):
            raise ValueError(
                f"NCCL_IB_HCA device {name!r} is not a device name (letters, digits, _ . -)"
            )
        if sep and not _PORT.match(port):
            raise ValueError(f"NCCL_IB_HCA port {port!r} of {name} is not a port number")
        devices.append((name, int(port) if sep else None))
    return Hca(tuple(devices), exact, exclude)
