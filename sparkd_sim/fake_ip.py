"""`ip` of a simulated host: its addresses and links, and `ip route` (text and JSON)."""

from __future__ import annotations

import json

from sparkd_sim.protocol import Done, fail
from sparkd_sim.reference import MANAGEMENT_INTERFACE
from sparkd_sim.state import HostState


def ip(host: HostState, args: list[str]) -> Done:
    as_json = False
    family = None
    rest = []
    for arg in args:
        if arg in ("-j", "-json", "--json"):
            as_json = True
        elif arg in ("-4", "-6"):
            family = arg
        elif arg in ("-br", "-brief", "-p", "-pretty"):
            continue
        else:
            rest.append(arg)
    if rest and rest[0] in ("route", "r", "ro"):
        return _route(host, rest[1:], as_json)
    if not rest or rest[0] not in ("addr", "address", "a", "link"):
        obj = rest[0] if rest else ""
        return fail(f'Object "{obj}" is unknown, try "ip help".', 255)
    words = rest[1:]
    if words and words[0] in ("show", "list", "ls"):
        words = words[1:]
    if words and words[0] == "dev":
        words = words[1:]
    device = words[0] if words else None
    if device is not None and device != host.interface:
        return fail(f'Device "{device}" does not exist.', 1)
    addr_info = []
    if family != "-6":
        addr_info.append(
            {
                "family": "inet",
                "local": host.data_ip,
                "prefixlen": 24,
                "broadcast": host.data_ip.rsplit(".", 1)[0] + ".255",
                "scope": "global",
                "noprefixroute": True,
                "label": host.interface,
                "valid_life_time": 4294967295,
                "preferred_life_time": 4294967295,
            }
        )
    link = {
        "ifindex": 2,
        "ifname": host.interface,
        "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"],
        "mtu": 9000,
        "qdisc": "mq",
        "operstate": "UP",
        "group": "default",
        "txqlen": 1000,
        "link_type": "ether",
        "address": "4c:bb:47:2c:10:" + f"{int(host.address.rsplit('.', 1)[1]) % 256:02x}",
        "broadcast": "ff:ff:ff:ff:ff:ff",
        "addr_info": addr_info,
    }
    if as_json:
        return Done(stdout=json.dumps([link], separators=(",", ":")) + "\n")
    text = (
        f"2: {host.interface}: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9000 qdisc mq state UP "
        f"group default qlen 1000\n    link/ether {link['address']} brd ff:ff:ff:ff:ff:ff\n"
    )
    for info in addr_info:
        text += (
            f"    inet {info['local']}/24 brd {info['broadcast']} scope global noprefixroute "
            f"{host.interface}\n       valid_lft forever preferred_lft forever\n"
        )
    return Done(stdout=text)


def _route(host: HostState, words: list[str], as_json: bool) -> Done:
    """`ip route [show]` and `ip route get ADDR`: the default route leaves by the management
    network when the data IP is on a network of its own (as on a real Spark)."""
    separate = host.data_ip != host.address
    mgmt_dev = MANAGEMENT_INTERFACE if separate else host.interface
    gateway = host.address.rsplit(".", 1)[0] + ".1"
    data_net = host.data_ip.rsplit(".", 1)[0] + ".0/24"
    if words and words[0] == "get":
        if len(words) < 2:
            return fail('Error: an inet prefix is expected rather than "".', 1)
        target = words[1]
        on_data = target.rsplit(".", 1)[0] == host.data_ip.rsplit(".", 1)[0]
        dev, src = (host.interface, host.data_ip) if on_data else (mgmt_dev, host.address)
        via = "" if on_data else f"via {gateway} "
        return Done(stdout=f"{target} {via}dev {dev} src {src} uid 0 \n    cache \n")
    if words and words[0] not in ("show", "list", "ls"):
        return fail(f'Command "{words[0]}" is unknown, try "ip route help".', 255)
    routes = [
        {
            "dst": "default",
            "gateway": gateway,
            "dev": mgmt_dev,
            "protocol": "dhcp",
            "prefsrc": host.address,
            "metric": 100,
            "flags": [],
        },
        {
            "dst": data_net,
            "dev": host.interface,
            "protocol": "kernel",
            "scope": "link",
            "prefsrc": host.data_ip,
            "flags": [],
        },
    ]
    if as_json:
        return Done(stdout=json.dumps(routes, separators=(",", ":")) + "\n")
    return Done(
        stdout=(
            f"default via {gateway} dev {mgmt_dev} proto dhcp src {host.address} metric 100 \n"
            f"{data_net} dev {host.interface} proto kernel scope link src {host.data_ip} \n"
        )
    )
