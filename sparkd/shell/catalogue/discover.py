"""`sparkd init`'s reads: what a hand-made deployment runs, read without changing anything.

They run before sparkd's forced command is installed (the config it admits does not exist yet),
under the SSH user's ordinary login; none of them changes a host (`mutating=False`).
"""

from __future__ import annotations

from collections.abc import Sequence

from sparkd.shell.catalogue.reads import GPU_APPS
from sparkd.shell.catalogue.remote import Remote, cmd

# Every container, running or not (a `--restart` one may be between restarts), by name only.
NAMES = ("docker", "ps", "-a", "--no-trunc", "--size=false", "--format", "{{.Names}}")
UNIT_FILES = (
    "systemctl", "list-unit-files", "--type=service", "--state=enabled", "--no-legend",
    "--no-pager",
)  # fmt: skip
ADDRESSES = ("ip", "-j", "addr", "show")
# At most this many containers are inspected on one host.
MAX_CONTAINERS = 64


def container_names(seconds: float) -> Remote:
    return Remote("init_names", cmd(NAMES, seconds), mutating=False)


def inspect_containers(names: Sequence[str], seconds: float) -> Remote:
    argv = ["docker", "inspect", "--type", "container", "--", *names[:MAX_CONTAINERS]]
    return Remote("init_inspect", cmd(argv, seconds), mutating=False)


def image_env(image: str, seconds: float) -> Remote:
    argv = ["docker", "inspect", "--type", "image", "--format", "{{json .Config.Env}}", "--", image]
    return Remote("init_image_env", cmd(argv, seconds), mutating=False)


def container_processes(name: str, seconds: float) -> Remote:
    return Remote("init_top", cmd(["docker", "top", name, "-eo", "pid,args"], seconds), False)


def gpu_processes(seconds: float) -> Remote:
    return Remote("init_gpu_apps", cmd(GPU_APPS, seconds), mutating=False)


def unit_files(seconds: float) -> Remote:
    return Remote("init_units", cmd(UNIT_FILES, seconds), mutating=False)


def addresses(seconds: float) -> Remote:
    return Remote("init_addresses", cmd(ADDRESSES, seconds), mutating=False)
