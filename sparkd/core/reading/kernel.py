"""The kernel's own account of a host: its log tail and its memory. Pure: text in, values out.

The fact script reads this boot's kernel log as `journalctl -k -b -o short-monotonic -n N`
(samples in tests/fixtures/kernel): every line carries the kernel's monotonic timestamp, so what
is new since the last look is what is newer than the last timestamp seen in the same boot
(`new_since`). A flood of one message is one event with a count. Both parsers are total: any
text gives a value, never an exception.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from sparkd.core.text import printable
from sparkd.model.observed import KernelEvent, KernelKind, KernelLog

Severity = Literal["application", "teardown", "hardware", "reboot"]


@dataclass(frozen=True)
class Xid:
    meaning: str
    severity: Severity


# NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors), for the XIDs sparkd judges. On
# GB10 the GPU is part of the SoC: there is no GPU reset apart from a reboot of the host, so
# what NVIDIA answers with "reset the GPU" needs a reboot here.
XIDS: dict[int, Xid] = {
    13: Xid(
        "graphics engine exception (an application's illegal access or kernel fault)", "application"
    ),
    31: Xid("GPU memory page fault (an application's illegal address)", "application"),
    43: Xid("GPU stopped processing (an application's fault; the GPU stays usable)", "application"),
    45: Xid("preemptive cleanup: a process ended (killed or exited) while on the GPU", "teardown"),
    48: Xid("double-bit ECC error (uncorrectable memory error)", "reboot"),
    63: Xid("ECC page retirement or row remapping recorded (takes effect on reset)", "hardware"),
    64: Xid("ECC page retirement or row remapping failed", "reboot"),
    74: Xid("NVLink error", "reboot"),
    79: Xid("GPU has fallen off the bus", "reboot"),
    92: Xid("high single-bit ECC error rate", "hardware"),
    94: Xid("contained ECC error (the GPU needs a reset to be trusted again)", "reboot"),
    95: Xid("uncontained ECC error", "reboot"),
    # GSP, the GPU's own firmware processor, stopped answering or crashed (NVIDIA
    # open-gpu-kernel-modules 595.45.04 `src/common/sdk/nvidia/inc/nverror.h`: GSP_RPC_TIMEOUT,
    # GSP_ERROR). The driver "soldiers on" past a lone timeout (`kernel_gsp.c`), but on GB10 these
    # come before XID 154 and a forced reboot (tests/fixtures/kernel/SOURCES.md), and nothing
    # short of a reboot resets the GPU: held as lost; a model that still serves is left alone.
    119: Xid("GSP RPC timeout (the GPU's firmware stopped answering the driver)", "reboot"),
    120: Xid("GSP error (the GPU's firmware crashed)", "reboot"),
    # The driver's recovery verdict changed. Only a new action of GPU reset, node reboot or
    # drain-and-reset is fatal: that line is classified `gpu_reset_required`, not `xid`.
    154: Xid("GPU recovery action changed (no reset asked)", "hardware"),
}

# XID 154's line: "GPU recovery action changed from 0x%x (%s) to 0x%x (%s)" (`gpu.c:7258`); the
# new action decides, by number (its name differs between driver releases: "OS Reboot", "PF
# FLR"). NV2080_CTRL_GPU_RECOVERY_ACTION (`ctrl2080gpu.h`): 0 none, 1 GPU reset, 2 node reboot,
# 3 drain P2P, 4 drain and reset, 5 recover IMEX domain. On GB10 a GPU reset is a reboot.
_RECOVERY = re.compile(
    r"GPU recovery action changed from 0x[0-9a-fA-F]{1,8} \([^)]{0,40}\) "
    r"to 0x(?P<action>[0-9a-fA-F]{1,8}) \((?P<name>[^)]{0,40})\)"
)
RESET_ACTIONS = frozenset({1, 2, 4})


def xid_info(number: int) -> Xid:
    """What an XID means; one sparkd does not know is hardware or driver, never fatal alone."""
    return XIDS.get(number, Xid(f"XID {number} (not in sparkd's catalogue)", "hardware"))


def fatal_xid(event: KernelEvent) -> bool:
    """Whether the event says the GPU needs a reset, which on GB10 is a reboot."""
    if event.kind == "gpu_reset_required":
        return True
    return (
        event.kind == "xid" and event.xid is not None and xid_info(event.xid).severity == "reboot"
    )


# Messages after which a host may stop answering with no further word (NVIDIA
# open-gpu-kernel-modules 1358; a ConnectX-7 fatal AER): the "last log seen" of a wedge.
WEDGE_OMENS: frozenset[KernelKind] = frozenset(
    {"nv_no_memory", "aer_fatal", "mlx5_pci_error", "soft_lockup"}
)

# At most this many lines are read per look (the fact script's `-n`).
TAIL_LINES = 200
# `[  65.315783] spark-a kernel: MESSAGE` (short-monotonic); the host part is optional.
_LINE = re.compile(r"^\[\s*(?P<t>[0-9]{1,10}\.[0-9]{1,9})\]\s(?:\S+ kernel: )?(?P<msg>.*)$")
_XID = re.compile(r"NVRM: Xid \((?P<dev>[^)]{0,40})\): (?P<xid>[0-9]{1,4}),")
# Each pattern with a literal that must come before its match (searched from just after it):
# `NVRM:.*\bNV_ERR_NO_MEMORY\b` as one regex retries its `.*` at every `NVRM:` of a line,
# quadratic in a line a host fills with them.
_PATTERNS: tuple[tuple[KernelKind, str, re.Pattern[str]], ...] = (
    ("nv_no_memory", "NVRM:", re.compile(r"\bNV_ERR_NO_MEMORY\b")),
    # `Uncorrectable (Fatal) error message received` / `severity=Uncorrected (Fatal)`, never
    # `(Non-Fatal)`.
    ("aer_fatal", "", re.compile(r"(?:AER: |severity=)Uncorrect(?:ed|able) \(Fatal\)")),
    ("mlx5_pci_error", "", re.compile(r"^mlx5_core (?P<dev>\S{1,40}): .*pci_err_detected")),
    ("soft_lockup", "", re.compile(r"BUG: soft lockup - CPU#[0-9]+ stuck")),
    ("oom_kill", "", re.compile(r"Out of memory: Killed process [0-9]+")),
    # After the GSP RPC timeouts pass the driver's reset threshold (`kernel_gsp.c:2477`).
    (
        "gpu_reset_required",
        "",
        re.compile(
            r"NVRM: Rate limiting GSP RPC error prints for GPU at (?P<dev>PCI:[0-9a-fA-F:]{1,20})"
            r" .{0,60}The GPU likely needs to be reset"
        ),
    ),
)
# `pcieport 0000:00:01.0: AER: ...`: the reporting device.
_DEVICE = re.compile(r"^\S+ (?P<dev>[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]):", re.I)
_LINE_LIMIT = 300
# The kernel's longest record is 1024 bytes less its header (printk's PRINTKRB_RECORD_MAX,
# linux kernel/printk/internal.h, v6.8); a longer "kernel line" is not the kernel's.
MESSAGE_LIMIT = 1024
# Every character `str.splitlines` ends a line at; a line that may be the kernel's starts with
# `[` right after one (or at the start). The text is read from its end in blocks this long.
_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_CANDIDATE = re.compile(f"(?:^|(?<=[{_BREAKS}]))\\[[^{_BREAKS}]*")
_BLOCK = 1 << 16
# What journalctl prints instead of the system journal to a user outside `adm` and
# `systemd-journal`: the kernel's lines are then missing, never "none".
_NO_ACCESS = "not seeing messages from other users and the system"


def unreadable(text: str) -> str | None:
    """Why a kernel log read that exited 0 still says nothing about the kernel, or None."""
    if _NO_ACCESS in text:
        return (
            "journalctl cannot read the system journal: add the SSH user to group "
            "systemd-journal (or adm)"
        )
    return None


def parse_kernel_log(text: str) -> KernelLog:
    """Each known message kind, de-duplicated by kind, XID and device, with every timestamp.

    Only the last `TAIL_LINES` kernel lines count (what the script asked `journalctl` for): a
    host that prints more (up to the SSH output cap, some 160,000 lines) costs one pass over the
    text from its end and no more, so no host's log can hold the event loop. The same bound
    keeps each event's `times` at most `TAIL_LINES` long and its count exact for what was read.
    """
    read = _tail(text)
    stamps: dict[tuple[str, int | None, str], list[float]] = {}
    lines: dict[tuple[str, int | None, str], str] = {}
    last: float | None = None
    for at, message in read:
        last = at if last is None else max(last, at)
        found = _classify(message)
        if found is None:
            continue
        stamps.setdefault(found, []).append(at)
        lines.setdefault(found, printable(message)[:_LINE_LIMIT])
    events = tuple(
        KernelEvent(
            kind=kind,
            xid=xid,
            device=device,
            count=len(times),
            first_at=min(times),
            last_at=max(times),
            times=tuple(times),
            line=lines[(kind, xid, device)],
        )
        for (kind, xid, device), times in stamps.items()
    )
    return KernelLog(events=events, lines=len(read), last_at=last)


def _tail(text: str) -> list[tuple[float, str]]:
    """The last `TAIL_LINES` kernel lines of `text` as (timestamp, message), oldest first.

    Read from the end a block at a time (cut at a line break), stopping once enough are found;
    in each block only lines that start with `[` are looked at, found by one regex scan rather
    than a Python step per line (8 MiB of empty lines is 8 million of them). Lines end where
    `str.splitlines` ends them. A message is cut to `MESSAGE_LIMIT` before any pattern sees it:
    the kernel's own records are shorter.
    """
    found: list[tuple[float, str]] = []
    end = len(text)
    while end > 0 and len(found) < TAIL_LINES:
        start = text.rfind("\n", 0, max(0, end - _BLOCK)) + 1
        for raw in reversed(_CANDIDATE.findall(text, start, end)):
            match = _LINE.match(raw[: MESSAGE_LIMIT + 128])
            if match is None:
                continue
            try:
                at = float(match.group("t"))
            except ValueError:
                continue
            found.append((at, match.group("msg")[:MESSAGE_LIMIT]))
            if len(found) == TAIL_LINES:
                break
        end = start - 1
    found.reverse()
    return found


def _classify(message: str) -> tuple[KernelKind, int | None, str] | None:
    xid = _XID.search(message)
    if xid is not None:
        number = int(xid.group("xid"))
        recovery = _RECOVERY.search(message) if number == 154 else None
        if recovery is not None and int(recovery.group("action"), 16) in RESET_ACTIONS:
            return "gpu_reset_required", number, printable(xid.group("dev"))
        return "xid", number, printable(xid.group("dev"))
    for kind, before, pattern in _PATTERNS:
        start = message.find(before)
        if start < 0:
            continue
        match = pattern.search(message, start + len(before))
        if match is None:
            continue
        device = match.groupdict().get("dev") or ""
        if not device:
            named = _DEVICE.match(message)
            device = named.group("dev") if named is not None else ""
        return kind, None, printable(device)
    return None


def new_since(log: KernelLog, mark: float | None) -> list[tuple[KernelEvent, int]]:
    """Each event with how many of its lines are newer than `mark` (the last timestamp seen in
    this boot; None: everything is new). Events with nothing new are left out."""
    found = []
    for event in log.events:
        fresh = sum(1 for t in event.times if mark is None or t > mark)
        if fresh:
            found.append((event, fresh))
    return found


def describe(event: KernelEvent) -> str:
    """One line naming the event, its count and (for an XID) what it means."""
    times = f" x{event.count}" if event.count > 1 else ""
    at = f" at {event.last_at:.0f}s after boot"
    if event.kind == "gpu_reset_required":
        recovery = _RECOVERY.search(event.line)
        if event.xid is not None and recovery is not None:
            action = f"0x{recovery.group('action')} ({recovery.group('name')})"
            meaning = f"the driver's recovery action is now {action}: the GPU needs a reset"
            return f"XID {event.xid} ({meaning}){times}{at}"
        return f"GSP RPC errors rate-limited: the GPU likely needs a reset{times}{at}"
    if event.kind == "xid" and event.xid is not None:
        return f"XID {event.xid} ({xid_info(event.xid).meaning}){times}{at}"
    names = {
        "nv_no_memory": "NVRM NV_ERR_NO_MEMORY",
        "aer_fatal": "PCIe fatal AER",
        "mlx5_pci_error": "mlx5 PCI error",
        "soft_lockup": "soft lockup",
        "oom_kill": "OOM kill",
    }
    device = f" on {event.device}" if event.device else ""
    return f"{names.get(event.kind, event.kind)}{device}{times}{at}"


_MEMINFO = re.compile(r"^(?P<key>MemTotal|MemAvailable):\s+(?P<n>[0-9]{1,15}) kB\s*$")


def parse_meminfo(text: str) -> tuple[int | None, int | None]:
    """(MemAvailable, MemTotal) in bytes from /proc/meminfo (whose "kB" is KiB)."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        match = _MEMINFO.match(line)
        if match is not None:
            values.setdefault(match.group("key"), int(match.group("n")) * 1024)
    return values.get("MemAvailable"), values.get("MemTotal")
