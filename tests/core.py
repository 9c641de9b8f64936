"""What `make check` runs: the tiers that take seconds whole, and a core of end-to-end stories.

The one place the selection lives. tests/conftest.py marks what is named here `core`, and
`make check` runs `-m core` (without the tiers that need the machine as a whole). Each story
names what it is there for: every action kind, every triage class and the daemon's own duties
(events, durability, the API, metrics) has one; tests/unit/test_core_stories.py holds that, and
that each story still exists. `make test` runs everything, these included.
"""

from __future__ import annotations

# Whole directories: the pure core's rules, the structure rules, parsers, the HTTP clients and the
# state directory, each test in (milli)seconds.
CORE_TIERS = ("tests/unit/", "tests/integration/")

# Test node ids (pytest's `path::name`, or a prefix of a parametrised one's `[id]`), with what
# each stands for. Where a story is parametrised by SSH server, `make check` keeps its asyncssh
# case (the OpenSSH one is the `sshd` tier's).
CORE_STORIES: dict[str, tuple[str, ...]] = {
    "tests/e2e/test_recovery.py::test_cold_start_from_seed_morning": (
        "stop_unit",
        "remove_container",
        "start_ray_head",
        "start_ray_worker",
        "start_model",
    ),
    "tests/e2e/test_recovery.py::test_head_reboot_recovers": ("restart_ray",),
    "tests/e2e/test_recovery.py::test_probe_failures_restart_once_then_block": ("restart_model",),
    "tests/e2e/test_judgement.py::test_a_foreign_gpu_process_is_killed_only_while_nvidia_smi_lists_it": (  # noqa: E501
        "kill_gpu_process",
    ),
    "tests/e2e/test_power.py::test_a_wedged_host_is_power_cycled_once_and_the_cluster_recovers": (
        "power_cycle",
        "host_wedged",
    ),
    "tests/e2e/test_cache.py::test_containers_mount_the_cache_and_old_entries_are_pruned": (
        "prune_cache",
    ),
    "tests/e2e/test_below_vllm.py::test_a_lost_gpu_blocks_with_a_reboot_restarts_nothing_and_a_reboot_recovers[xid-79": (  # noqa: E501
        "gpu_lost",
    ),
    "tests/e2e/test_below_vllm.py::test_memory_pressure_holds_the_launch_until_it_eases": (
        "memory_pressure",
    ),
    "tests/e2e/test_below_vllm.py::test_an_mtu_mismatch_holds_the_relaunch_until_the_mtu_is_set": (
        "fabric",
    ),
    "tests/e2e/test_events.py::test_a_crashed_serve_process_is_handled_on_its_event": ("events",),
    "tests/e2e/test_durability.py::test_sigkill_mid_cycle_loses_no_finished_action": (
        "durability",
    ),
    "tests/e2e/test_api.py::test_status_healthz_events_through_recovery": ("api",),
    "tests/e2e/test_api.py::test_control_auth": ("api",),
    "tests/e2e/test_metrics.py::test_metrics_agree_with_status_through_recovery": ("metrics",),
}

# What the daemon does beyond acting, each needing a story of its own.
DUTIES = ("events", "durability", "api", "metrics")


def is_core(nodeid: str) -> bool:
    """Whether `make check` runs the test of this node id."""
    if nodeid.startswith(CORE_TIERS):
        return True
    return any(
        nodeid == story or nodeid.startswith(story if "[" in story else f"{story}[")
        for story in CORE_STORIES
    )


def paths() -> list[str]:
    """What `make check` hands pytest to collect: the tiers, and the stories' files."""
    files = sorted({story.partition("::")[0] for story in CORE_STORIES})
    return [tier.rstrip("/") for tier in CORE_TIERS] + files


if __name__ == "__main__":
    print(" ".join(paths()))
