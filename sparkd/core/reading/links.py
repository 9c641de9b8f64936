"""The data link's sysfs facts, parsed: the interface's `mtu` and `carrier_changes`, and each
RDMA device's port (`state`, `phys_state`, `rate`, the RoCE v2 GID rows). Pure.

The fact script reads, with `grep -s -H .`, the data interface's `mtu` and `carrier_changes`
(Documentation/ABI/testing/sysfs-class-net) and, under its `device/infiniband/DEV/ports/N/`, the
port's `state`, `phys_state`, `rate`, `gids/K` and `gid_attrs/types/K`
(Documentation/ABI/stable/sysfs-class-infiniband); samples in tests/fixtures/fabric. Unused GID
rows fail to read (EINVAL), so grep's exit status says nothing: only the lines count. The
devices `NCCL_IB_HCA` lists are read under /sys/class/infiniband (catalogue `rail_globs`), each
a rail. What the facts mean is core.judging.fabric's.
"""

from __future__ import annotations

import ipaddress
import re

from sparkd.core.text import printable
from sparkd.model.observed import Fabric, Rail

_LINE = re.compile(r"^/sys/class/net/(?P<iface>[^/:]{1,64})/(?P<rest>[^:]{1,300}):(?P<value>.*)$")
_PORT = re.compile(
    r"^device/infiniband/(?P<dev>[^/]{1,64})/ports/(?P<port>[0-9]{1,3})/"
    r"(?P<what>state|phys_state|rate|gids/[0-9]{1,4}|gid_attrs/types/[0-9]{1,4})$"
)
# A further RDMA device's port, read under /sys/class/infiniband (catalogue `rail_globs`).
_RAIL = re.compile(
    r"^/sys/class/infiniband/(?P<dev>[^/:]{1,64})/ports/(?P<port>[0-9]{1,3})/"
    r"(?P<what>state|phys_state|rate|gids/[0-9]{1,4}|gid_attrs/types/[0-9]{1,4}):(?P<value>.*)$"
)
_RATE = re.compile(r"^\s*(?P<n>[0-9]{1,6}(?:\.[0-9]{1,3})?) Gb/sec")
_WORD = re.compile(r"^\s*[0-9]{1,3}:\s*(?P<word>\S{1,32})")
ROCE_V2 = "RoCE v2"


def small_int(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() and len(text) <= 12 else None


def parse_fabric(text: str, data_ip: str) -> Fabric:
    """Whatever lines came; a missing one is None, never a guess."""
    net: dict[str, str] = {}
    ports: dict[tuple[str, int], dict[str, str]] = {}
    rails: dict[tuple[str, int], dict[str, str]] = {}
    for line in text.splitlines():
        rail = _RAIL.match(line)
        if rail is not None:
            key = (printable(rail.group("dev")), int(rail.group("port")))
            rails.setdefault(key, {}).setdefault(rail.group("what"), rail.group("value"))
            continue
        match = _LINE.match(line)
        if match is None:
            continue
        rest, value = match.group("rest"), match.group("value")
        if rest in ("mtu", "carrier_changes"):
            net.setdefault(rest, value)
            continue
        port = _PORT.match(rest)
        if port is not None:
            key = (printable(port.group("dev")), int(port.group("port")))
            ports.setdefault(key, {}).setdefault(port.group("what"), value)
    fabric = Fabric(
        mtu=small_int(net.get("mtu", "")),
        carrier_changes=small_int(net.get("carrier_changes", "")),
        rails=tuple(_rail(key, rows) for key, rows in sorted(rails.items())),
    )
    if not ports:
        return fabric
    found = {key: _gid_index(rows, data_ip) for key, rows in ports.items()}
    key = next((k for k in sorted(ports) if found[k] is not None), sorted(ports)[0])
    rows = ports[key]
    rate = _RATE.match(rows.get("rate", ""))
    return fabric.model_copy(
        update={
            # The data device is judged as itself (its GID must hold the data IP).
            "rails": tuple(r for r in fabric.rails if r.device != key[0]),
            "rdma_device": key[0],
            "port": key[1],
            "port_state": _word(rows.get("state")),
            "phys_state": _word(rows.get("phys_state")),
            "rate_gbps": float(rate.group("n")) if rate is not None else None,
            "gid_index": found[key],
        }
    )


def _rail(key: tuple[str, int], rows: dict[str, str]) -> Rail:
    rate = _RATE.match(rows.get("rate", ""))
    return Rail(
        device=key[0],
        port=key[1],
        port_state=_word(rows.get("state")),
        phys_state=_word(rows.get("phys_state")),
        rate_gbps=float(rate.group("n")) if rate is not None else None,
        roce_v2_gids=_routable_v2(rows),
    )


def _routable_v2(rows: dict[str, str]) -> tuple[int, ...]:
    """The GID rows of type RoCE v2 holding an address NCCL can route: not the zero GID of an
    unused row, not the link-local one every port has."""
    return tuple(
        sorted(
            index
            for index, gid in _v2_gids(rows)
            if not gid.is_unspecified and not gid.is_link_local
        )
    )


def _v2_gids(rows: dict[str, str]) -> list[tuple[int, ipaddress.IPv6Address]]:
    """Each GID row whose type is RoCE v2, with its address (rows that are not one skipped)."""
    found = []
    for what, value in rows.items():
        if not what.startswith("gids/"):
            continue
        index = int(what.split("/")[1])
        try:
            gid = ipaddress.IPv6Address(value.strip())
        except ValueError:
            continue
        if rows.get(f"gid_attrs/types/{index}", "").strip() == ROCE_V2:
            found.append((index, gid))
    return found


def _word(text: str | None) -> str | None:
    match = _WORD.match(text or "")
    return match.group("word") if match is not None else None


def _gid_index(rows: dict[str, str], data_ip: str) -> int | None:
    """The GID row holding `data_ip` (IPv4-mapped for IPv4) whose type is RoCE v2."""
    try:
        ip = ipaddress.ip_address(data_ip)
    except ValueError:
        return None
    wanted = ipaddress.IPv6Address(f"::ffff:{ip}") if ip.version == 4 else ip
    return next((index for index, gid in _v2_gids(rows) if gid == wanted), None)
