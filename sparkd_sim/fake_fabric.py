"""A simulated host's data link in sysfs, read as sparkd reads it (`grep -s -H . PATHS`).

The files and their formats are the kernel's (tests/fixtures/fabric/SOURCES.md): the netdev's
`mtu` and `carrier_changes`, and its ConnectX-7 port's `state`, `phys_state`, `rate`, GID table
and GID types, with the data IP as RoCE v2 at index 3 as mlx5 lays it out.

A DGX Spark's QSFP port is two RDMA devices, one per PCIe x4 half (NVIDIA's dgx-spark-playbooks,
`nvidia/connect-two-sparks/README.md`): the data interface's `RDMA_DEVICE`, and `RAIL_DEVICE`
for the other half, whose interface has an address of its own. Both appear under
/sys/class/infiniband, as every RDMA device does; only the first is under the data netdev.
"""

from __future__ import annotations

import fnmatch
import ipaddress
from dataclasses import dataclass, field

from sparkd_sim.protocol import Done

RDMA_DEVICE = "rocep1s0f0"
RAIL_DEVICE = "roceP2p1s0f0"
LINK_LOCAL_RAIL = "fe80:0000:0000:0000:5e3a:82ff:fe19:9a6d"
LINK_LOCAL = "fe80:0000:0000:0000:5e3a:82ff:fe19:9a6c"
ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"
GID_ROWS = 8


@dataclass
class Link:
    mtu: int = 9000
    carrier_changes: int = 2
    up: bool = True
    rate: str = "200 Gb/sec (4X HDR)"
    # Where the data IP's two rows (RoCE v1, then v2) start in the GID table.
    gid_start: int = 2
    extra: dict[str, str] = field(default_factory=dict)
    # The other PCIe half of the port (`RAIL_DEVICE`): up, with its own address, unless a
    # fault took it down.
    rail_up: bool = True


def gid_of(ip: str) -> str:
    mapped = ipaddress.IPv6Address(f"::ffff:{ip}").exploded
    return mapped


def rail_ip(data_ip: str) -> str:
    """The other half's address: the data IP's next /24 (NVIDIA's netplan addresses each half
    on a subnet of its own)."""
    return str(ipaddress.IPv4Address(data_ip) + 256)


def _port(
    port: str, up: bool, rate: str, link_local: str, ip: str | None, start: int
) -> dict[str, str | None]:
    found: dict[str, str | None] = {
        f"{port}/state": "4: ACTIVE" if up else "1: DOWN",
        f"{port}/phys_state": "5: LinkUp" if up else "3: Disabled",
        f"{port}/rate": rate,
    }
    rows = {0: (link_local, "IB/RoCE v1"), 1: (link_local, "RoCE v2")}
    if ip is not None:
        rows[start] = (gid_of(ip), "IB/RoCE v1")
        rows[start + 1] = (gid_of(ip), "RoCE v2")
    for index in range(GID_ROWS):
        gid, kind = rows.get(index, (ZERO, None))
        found[f"{port}/gids/{index}"] = gid
        # An unused row's type cannot be read (EINVAL).
        found[f"{port}/gid_attrs/types/{index}"] = kind
    return found


def files(interface: str, data_ip: str, link: Link) -> dict[str, str | None]:
    """Every file sparkd's globs can reach, with its content (None: reading it fails)."""
    base = f"/sys/class/net/{interface}"
    found: dict[str, str | None] = {
        f"{base}/mtu": str(link.mtu),
        f"{base}/carrier_changes": str(link.carrier_changes),
    }
    data = _port("", link.up, link.rate, LINK_LOCAL, data_ip, link.gid_start)
    for where in (f"{base}/device/infiniband", "/sys/class/infiniband"):
        found.update({f"{where}/{RDMA_DEVICE}/ports/1{k}": v for k, v in data.items()})
    # A port that is down has lost its address's GID rows with its carrier.
    rail = _port(
        "",
        link.rail_up,
        "200 Gb/sec (4X HDR)" if link.rail_up else "40 Gb/sec (4X QDR)",
        LINK_LOCAL_RAIL,
        rail_ip(data_ip) if link.rail_up else None,
        2,
    )
    found.update({f"/sys/class/infiniband/{RAIL_DEVICE}/ports/1{k}": v for k, v in rail.items()})
    return found


def grep(interface: str, data_ip: str, link: Link, args: list[str]) -> Done:
    """`grep -s -H . PATH...` over the simulated sysfs; the shell left the globs unexpanded
    (no such paths on the machine running the world), so they are matched here."""
    if args[:3] != ["-s", "-H", "."]:
        return Done(stderr="grep: the simulated sysfs answers only -s -H .\n", rc=2)
    tree = files(interface, data_ip, link)
    out: list[str] = []
    error = False
    for pattern in args[3:]:
        matched = sorted(p for p in tree if fnmatch.fnmatchcase(p, pattern))
        if not matched:
            error = True
        for path in matched:
            value = tree[path]
            if value is None:
                error = True
                continue
            out.append(f"{path}:{value}\n")
    return Done(stdout="".join(out), rc=2 if error else 0 if out else 1)
