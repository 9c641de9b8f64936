"""`kernel`: what the kernel sections add to a look. On this machine: the host CPU of the two
tools as the fact script runs them (`journalctl -k -b -o short-monotonic -n 200`, `cat
/proc/meminfo`, the `grep` of the data interface's sysfs), with how many kernel lines this
machine's journal holds (the cost of
`journalctl` grows with the journal it searches: a machine with no journal measures only the
tool's start), and on the ops box the parse of a full 200-line tail."""

from __future__ import annotations

import asyncio
import resource
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.common import median, table, write_result
from sparkd.core.reading import kernel
from sparkd.model.spec import HostSpec
from sparkd.shell import catalogue

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "kernel"


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def tool_cpu(argv: list[str], runs: int) -> tuple[float, str]:
    """Median CPU seconds (user + system) of one run of `argv`, and its last output."""
    costs: list[float] = []
    output = ""
    for _ in range(runs):
        before = children_cpu()
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        costs.append(children_cpu() - before)
        output = done.stdout
    return median(costs), output


def fabric_cpu(runs: int) -> tuple[str, float, str]:
    """The fabric section's `grep` of this machine's first network interface, as the fact
    script's shell runs it (the shell expands the globs)."""
    iface = sorted(p.name for p in Path("/sys/class/net").iterdir())[0]
    host = HostSpec(
        name="bench", address="127.0.0.1", role="head", data_ip="127.0.0.1", interface=iface
    )
    section = catalogue.reads.fabric_section(host, 5)
    grep = section.split(" ", 2)[2]  # without the `s fabric` wrapper
    cpu, output = tool_cpu(["sh", "-c", grep], runs)
    return iface, cpu, output


def parse_seconds(runs: int) -> float:
    lines = "".join(
        p.read_text() for p in sorted(FIXTURES.glob("*.txt")) if p.name != "no-access.txt"
    )
    sample = [line for line in lines.splitlines() if line.startswith("[")]
    text = "\n".join((sample * (kernel.TAIL_LINES // len(sample) + 1))[: kernel.TAIL_LINES])
    costs = []
    for _ in range(runs):
        started = time.process_time()
        kernel.parse_kernel_log(text)
        costs.append(time.process_time() - started)
    return median(costs)


async def main(quick: bool = False) -> None:
    runs = 10 if quick else 50
    journal, output = tool_cpu(list(catalogue.reads.KERNEL_LOG), runs)
    lines = sum(1 for line in output.splitlines() if line.startswith("["))
    meminfo, _ = tool_cpu(["cat", catalogue.reads.MEMINFO_PATH], runs)
    iface, sysfs, read = fabric_cpu(runs)
    parse = parse_seconds(runs)
    rows: list[list[Any]] = [
        ["journalctl -k -b -n 200 (host)", f"{journal * 1000:.1f} ms", f"{lines} lines read"],
        ["cat /proc/meminfo (host)", f"{meminfo * 1000:.1f} ms", ""],
        [
            f"grep sysfs of {iface} (host)",
            f"{sysfs * 1000:.1f} ms",
            f"{len(read.splitlines())} files read (sh included)",
        ],
        ["parse 200 kernel lines (ops box)", f"{parse * 1000:.2f} ms", ""],
    ]
    text = table("kernel sections, median CPU per look", ["what", "cpu", "note"], rows)
    print(text)
    write_result(
        "kernel",
        {
            "journalctl_cpu_seconds": journal,
            "journal_lines_read": lines,
            "meminfo_cpu_seconds": meminfo,
            "fabric_cpu_seconds": sysfs,
            "fabric_files_read": len(read.splitlines()),
            "parse_cpu_seconds": parse,
            "runs": runs,
        },
        text,
    )


if __name__ == "__main__":
    asyncio.run(main())
