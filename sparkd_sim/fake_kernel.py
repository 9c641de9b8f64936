"""A simulated host's kernel: `journalctl -k` and /proc/meminfo, in the real tools' formats.

The messages the faults add are the lines the NVIDIA driver, the PCIe AER driver, mlx5 and the
kernel print (samples and their sources in tests/fixtures/kernel); each line's timestamp is the
time since the host's boot, as short-monotonic shows it.
"""

from __future__ import annotations

import time

from sparkd_sim.protocol import Done, fail
from sparkd_sim.state import HostState

MEMINFO_PATH = "/proc/meminfo"
# A GB10 host: 128 GB of unified memory, the kernel's share taken.
MEM_TOTAL_KIB = 125_488_340
MEM_AVAILABLE_KIB = 104_283_952
GB10_GPU = "000f:01:00"
CX7 = "0000:01:00.0"

BOOT_LINES = (
    "nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver for UNIX platforms  580.95.05  "
    "Release Build  (dvs-builder@U22-I3-AE18-09-3)  Sat Sep 27 23:55:09 UTC 2025",
    f"mlx5_core {CX7} enp1s0f0np0: Link up",
    "IPv6: ADDRCONF(NETDEV_CHANGE): enp1s0f0np0: link becomes ready",
)


def xid(number: int, text: str, pid: str = "'<unknown>'", name: str = "<unknown>") -> str:
    return f"NVRM: Xid (PCI:{GB10_GPU}): {number}, pid={pid}, name={name}, {text}"


XID_79 = (
    f"NVRM: GPU at PCI:{GB10_GPU}: GPU-2dee1e25-b3b5-007e-2b55-79f2d0f2ebe5",
    xid(79, "GPU has fallen off the bus."),
    f"NVRM: GPU {GB10_GPU}.0: GPU has fallen off the bus.",
)
XID_13 = (
    xid(13, "Graphics SM Warp Exception on (GPC 1, TPC 0, SM 0): Out Of Range Address"),
    xid(13, "Graphics Exception: ESR 0x514730=0x201000e 0x514734=0x24 0x514728=0xc81eb60"),
    xid(13, "Graphics Exception: ChID 0010, Class 0000c9c0, Offset 00000000, Data 00000000",
        pid="48211", name="python3"),
)  # fmt: skip
XID_45 = (
    xid(45, "Ch 00000008", pid="51022", name="python3"),
    xid(45, "Ch 00000009", pid="51022", name="python3"),
)
# A GB10's GSP crash as its owners see it: 119, 120, the driver's rate-limit notice once the RPC
# timeouts pass its reset threshold, and its recovery verdict (tests/fixtures/kernel/xid-gsp.txt).
GSP_CRASH = (
    xid(119, "Timeout after 45s of waiting for RPC response from GPU0 GSP!", "3849", "KMS thread"),
    xid(120, "GSP task exception: load access fault", "9111", "python"),
    f"NVRM: Rate limiting GSP RPC error prints for GPU at PCI:{GB10_GPU} (printing 1 of every "
    "30).  The GPU likely needs to be reset.",
    f"NVRM: Xid (PCI:{GB10_GPU}): 154, GPU recovery action changed from 0x0 (None) to 0x1 "
    "(GPU Reset Required)",
)
NV_NO_MEMORY = (
    "NVRM: nvCheckOkFailedNoLog: Check failed: Out of memory [NV_ERR_NO_MEMORY] (0x00000051) "
    "returned from _memdescAllocInternal(pMemDesc) @ mem_desc.c:1359",
) * 3
AER_FATAL = (
    f"pcieport 0000:00:00.0: AER: Uncorrectable (Fatal) error message received from {CX7}",
    f"mlx5_core {CX7}: PCIe Bus Error: severity=Uncorrectable (Fatal), type=Inaccessible, "
    "(Unregistered Agent ID)",
    f"mlx5_core {CX7}: mlx5_pci_err_detected Device state = 1 health sensors: 1 pci_status: 1. "
    "Enter, pci channel state = 3",
    "watchdog: BUG: soft lockup - CPU#7 stuck for 26s! [kworker/7:2:1841]",
)


def boot(state: HostState) -> None:
    """A fresh boot: the driver's and the link's lines, memory as after boot."""
    state.kernel_log = [(1.0 + i, line) for i, line in enumerate(BOOT_LINES)]
    state.memory_available_kib = MEM_AVAILABLE_KIB


def log(state: HostState, lines: tuple[str, ...]) -> None:
    """The lines, now (microseconds apart, as a flood prints them)."""
    now = max(time.time() - state.booted_wall, state.kernel_log[-1][0] if state.kernel_log else 0)
    state.kernel_log.extend((now + i * 1e-5, line) for i, line in enumerate(lines))


def journalctl(state: HostState, args: list[str]) -> Done:
    """`journalctl -k -b -o short-monotonic --no-pager [-n N]`: what sparkd runs, nothing
    else (another shape is a world/client mismatch, refused as the real tool refuses it)."""
    count: int | None = None
    rest = list(args)
    if "-n" in rest:
        at = rest.index("-n")
        value = rest[at + 1] if at + 1 < len(rest) else ""
        if not value.isdigit():
            return fail(f"Failed to parse lines '{value}'.", 1)
        count = int(value)
        del rest[at : at + 2]
    if sorted(rest) != sorted(["-k", "-b", "-o", "short-monotonic", "--no-pager"]):
        return fail(f"journalctl: the simulated journal does not answer {' '.join(args)}", 1)
    lines = state.kernel_log if count is None else state.kernel_log[-count:] if count else []
    if not lines:
        return Done(stdout="-- No entries --\n")
    text = "".join(f"[{at:12.6f}] {state.name} kernel: {line}\n" for at, line in lines)
    return Done(stdout=text)


def meminfo(state: HostState) -> str:
    available = state.memory_available_kib
    free = max(0, available - 100_000_000) if available > 100_000_000 else available // 2
    return (
        f"MemTotal:       {MEM_TOTAL_KIB:>9} kB\n"
        f"MemFree:        {free:>9} kB\n"
        f"MemAvailable:   {available:>9} kB\n"
        f"Buffers:            10364 kB\n"
        f"SwapTotal:       16777212 kB\n"
        f"SwapFree:        16777212 kB\n"
    )
