"""The fact script's section names: what the host writes (shell.catalogue) and what assemble
reads (core.reading.assemble), named once so a rename on one side cannot read as "not observed"."""

from __future__ import annotations

from enum import StrEnum


class FactSection(StrEnum):
    NOW = "now"
    BOOT_ID = "boot_id"
    UNITS = "units"
    CONTAINERS = "containers"
    IMAGE = "image"
    GPU_APPS = "gpu_apps"
    # The running containers' names; each then has its own `top NAME` section (TOP).
    RUNNING = "running"
    GPU_APPS_AFTER = "gpu_apps_after"
    # The last lines of sparkd's own container's output, when it has exited.
    EXIT_LOG = "exit_log"
    OURS_IMAGE = "ours_image"
    IFACE = "iface"
    DISK = "disk"
    CACHE = "cache"
    DOCKER_DISK = "docker_disk"
    KERNEL = "kernel"
    MEMINFO = "meminfo"
    FABRIC = "fabric"
    RAY_NODES = "ray_nodes"
    RAY_STATUS = "ray_status"
    SERVE_SPEC = "serve_spec"
    SERVE_LOG = "serve_log"
    SERVE_LOG_MTIME = "serve_log_mtime"
    MODEL_FILES = "model_files"
    MODEL_INDEX = "model_index"
    # The running containers' config (`docker inspect`), while sparkd's own does not run.
    FOREIGN = "foreign"
    # Not a section of its own: the prefix of one container's `docker top` (`top NAME`).
    TOP = "top"
    # Not a section of its own: the prefix of one ping of another host's data IP (`peer IP`).
    PEER = "peer"


def top_section(container: str) -> str:
    """The section holding one running container's `docker top`."""
    return f"{FactSection.TOP} {container}"


def top_container(section: str) -> str | None:
    """The container a `top NAME` section is of, or None for any other section."""
    prefix = f"{FactSection.TOP} "
    return section[len(prefix) :] if section.startswith(prefix) else None


def peer_section(ip: str) -> str:
    """The section holding one ping of another host's data IP."""
    return f"{FactSection.PEER} {ip}"
