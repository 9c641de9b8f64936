"""`nvidia-smi` of a simulated host: its queries, CSV and table output, and its lost-GPU error."""

from __future__ import annotations

from collections.abc import Collection

from sparkd_sim.protocol import Done, fail
from sparkd_sim.state import HostState

_GPU_FIELDS: dict[str, tuple[str, str | None]] = {
    # name -> (header, unit shown after the value unless nounits)
    "index": ("index", None),
    "uuid": ("uuid", None),
    "name": ("name", None),
    "driver_version": ("driver_version", None),
    "memory.total": ("memory.total [MiB]", "MiB"),
    "memory.used": ("memory.used [MiB]", "MiB"),
    "memory.free": ("memory.free [MiB]", "MiB"),
    "utilization.gpu": ("utilization.gpu [%]", "%"),
    "temperature.gpu": ("temperature.gpu", None),
    "pci.bus_id": ("pci.bus_id", None),
    "count": ("count", None),
    "power.draw": ("power.draw [W]", "W"),
}
_APP_FIELDS: dict[str, tuple[str, str | None]] = {
    "pid": ("pid", None),
    "process_name": ("process_name", None),
    "name": ("process_name", None),
    "used_memory": ("used_gpu_memory [MiB]", "MiB"),
    "used_gpu_memory": ("used_gpu_memory [MiB]", "MiB"),
    "gpu_uuid": ("gpu_uuid", None),
}


# What nvidia-smi prints, and its status, once the GPU fell off the bus (Xid 79).
GPU_LOST = "Unable to determine the device handle for GPU0000:0F:01.0: Unknown Error"
GPU_LOST_RC = 15


def _unknown_field(fields: list[str], known: Collection[str], query: str) -> Done | None:
    """nvidia-smi's refusal of the first field `--query-{query}` does not know, if any."""
    bad = [f for f in fields if f not in known]
    if not bad:
        return None
    return fail(
        f'Field "{bad[0]}" is not a valid field to query.\n\n'
        f"Please run 'nvidia-smi --help-query-{query}' for more information.",
        2,
    )


def nvidia_smi(host: HostState, args: list[str]) -> Done:
    if host.gpu_lost and not any(a.startswith("-h") or a == "--help" for a in args):
        return fail(GPU_LOST, GPU_LOST_RC)
    query_gpu = query_apps = fmt = None
    for arg in args:
        key, _, value = arg.partition("=")
        if key == "--query-gpu":
            query_gpu = value
        elif key == "--query-compute-apps":
            query_apps = value
        elif key == "--format":
            fmt = value
        elif arg == "-L" or arg == "--list-gpus":
            return Done(stdout=f"GPU 0: NVIDIA GB10 (UUID: {host.gpu_uuid})\n")
        else:
            return fail(
                "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.", 2
            )
    if query_gpu is None and query_apps is None:
        return Done(stdout=_table(host))
    if fmt is None:
        return fail("Option --format is required for --query-* options.", 2)
    options = fmt.split(",")
    if options[0] != "csv":
        return fail(f'"{fmt}" is not a valid format.', 2)
    header = "noheader" not in options
    units = "nounits" not in options
    if query_gpu is not None:
        fields = query_gpu.split(",")
        refused = _unknown_field(fields, _GPU_FIELDS, "gpu")
        if refused is not None:
            return refused
        values = {
            "index": "0",
            "uuid": host.gpu_uuid,
            "name": "NVIDIA GB10",
            "driver_version": "580.142",
            "memory.total": "[N/A]",
            "memory.used": "[N/A]",
            "memory.free": "[N/A]",
            "utilization.gpu": "0",
            "temperature.gpu": "41",
            "pci.bus_id": "0000000F:01:00.0",
            "count": "1",
            "power.draw": "[N/A]",
        }
        return Done(
            stdout=_csv(
                [_GPU_FIELDS[f] for f in fields], [[values[f] for f in fields]], header, units
            )
        )
    assert query_apps is not None
    fields = query_apps.split(",")
    refused = _unknown_field(fields, _APP_FIELDS, "compute-apps")
    if refused is not None:
        return refused
    rows = []
    for proc in host.gpu_processes:
        if proc.graphics:
            continue
        values = {
            "pid": str(proc.pid),
            "process_name": proc.name,
            "name": proc.name,
            "used_memory": str(proc.used_mib),
            "used_gpu_memory": str(proc.used_mib),
            "gpu_uuid": host.gpu_uuid,
        }
        rows.append([values[f] for f in fields])
    return Done(stdout=_csv([_APP_FIELDS[f] for f in fields], rows, header, units))


def _csv(
    columns: list[tuple[str, str | None]], rows: list[list[str]], header: bool, units: bool
) -> str:
    out = []
    if header:
        out.append(", ".join(h if units else h.split(" [")[0] for h, _ in columns))
    for row in rows:
        cells = []
        for (_, unit), value in zip(columns, row, strict=True):
            show_unit = units and unit is not None and not value.startswith("[")
            cells.append(f"{value} {unit}" if show_unit else value)
        out.append(", ".join(cells))
    return "".join(line + "\n" for line in out)


def _table(host: HostState) -> str:
    rule = "+" + "-" * 89 + "+"
    split = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
    lines = [
        rule,
        "| NVIDIA-SMI 580.142"
        + " " * 16
        + "Driver Version: 580.142"
        + " " * 8
        + "CUDA Version: 13.0     |",
        split,
        "|   0  NVIDIA GB10" + " " * 20 + "On  |   0000000F:01:00.0 Off |" + " " * 18 + "N/A |",
        "| N/A   41C    P8"
        + " " * 14
        + "4W /  N/A  | Not Supported"
        + " " * 10
        + "|      0%      Default |",
        split,
        "| Processes:" + " " * 78 + "|",
        "|  GPU   GI   CI              PID   Type   Process name" + " " * 24 + "GPU Memory |",
        "|        ID   ID" + " " * 63 + "Usage      |",
        "|" + "=" * 89 + "|",
    ]
    for proc in host.gpu_processes:
        kind = "G" if proc.graphics else "C"
        usage = f"{proc.used_mib}MiB"
        lines.append(
            f"|    0   N/A  N/A    {proc.pid:>12}      {kind}   {proc.name:<36}{usage:>9} |"
        )
    lines.append(rule)
    return "".join(line + "\n" for line in lines)
