"""The fault table: every fault `World.fault` (and the control socket) injects by name, and the
switched PDU's power cycle."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from sparkd_sim.host_faults import HostFaults
from sparkd_sim.hosts import PowerRecord
from sparkd_sim.model_faults import ModelFaults
from sparkd_sim.world_state import WorldState


class Faults:
    """Faults by name; each fault's effect lives in `HostFaults` or `ModelFaults`."""

    def __init__(
        self, state: WorldState, host_faults: HostFaults, model_faults: ModelFaults
    ) -> None:
        self.state = state
        self.host_faults = host_faults
        self.model_faults = model_faults

    async def fault(self, name: str, host: str, arg: str | None = None) -> str:
        """Inject fault `name` on `host`; returns a one-line description of what happened."""
        target = self.state.host(host)
        plain: dict[str, Callable[[str], Awaitable[str]]] = {
            "reboot": self.host_faults.reboot,
            "unreachable": self.host_faults.unreachable,
            "blackhole": self.host_faults.blackhole,
            "path-lost": self.host_faults.path_lost,
            "heal": self.host_faults.heal,
            "crash-model": self.model_faults.crash_model,
            "hang-engine": self.model_faults.hang_engine,
            "oom-capture": self.model_faults.oom_capture,
            "wrong-ip": self.host_faults.wrong_ip,
            "slow-load": self.model_faults.slow_load,
            "stall-load": self.model_faults.stall_load,
            "chatty-stall": self.model_faults.chatty_stall,
            "noisy-load": self.model_faults.noisy_load,
            "docker-down": self.model_faults.docker_down,
            "docker-hung": self.model_faults.docker_hung,
            "hand-restart-serve": self.model_faults.hand_restart_serve,
            "lost-gpu": self.host_faults.lost_gpu,
            "orphan-engine": self.model_faults.orphan_engine,
            "hang-capture": self.model_faults.hang_capture,
            "xid-79": self.host_faults.xid_79,
            "gsp-crash": self.host_faults.gsp_crash,
            "xid-13": self.host_faults.xid_13,
            "xid-45": self.host_faults.xid_45,
            "link-flap": self.host_faults.link_flap,
            "rail-down": self.host_faults.rail_down,
            "hang-under-load": self.model_faults.hang_under_load,
        }
        with_arg: dict[str, Callable[[str, str | None], Awaitable[str]]] = {
            "stray-gpu": self.host_faults.stray_gpu,
            "kill-container": self.model_faults.kill_container,
            "hang-container": self.model_faults.hang_container,
            "crash-loop": self.model_faults.crash_loop,
            "repull-image": self.model_faults.repull_image,
            "image-without-ray": self.model_faults.image_without_ray,
            "answer-style": self.model_faults.answer_style,
            "hang-tool": self.model_faults.hang_tool,
            "rename-iface": self.host_faults.rename_iface,
            "full-disk": self.host_faults.full_disk,
            "big-layer": self.host_faults.big_layer,
            "pull-image": self.model_faults.pull_image,
            "nv-no-memory-wedge": self.host_faults.nv_no_memory_wedge,
            "aer-fatal": self.host_faults.aer_fatal,
            "memory-pressure": self.host_faults.memory_pressure,
            "gid-moved": self.host_faults.gid_moved,
            "mtu-mismatch": self.host_faults.mtu_mismatch,
            "rate-degraded": self.host_faults.rate_degraded,
            "late-delivery": self.host_faults.late_delivery,
            "missing-weights": self.model_faults.missing_weights,
            "vanish-weights": self.model_faults.vanish_weights,
            "long-prompt": self.model_faults.long_prompt,
        }
        if name in with_arg:
            return await with_arg[name](target.name, arg)
        if name not in plain:
            known = ", ".join(sorted([*plain, *with_arg]))
            raise ValueError(f"unknown fault {name!r}; known: {known}")
        if arg is not None:
            raise ValueError(f"fault {name!r} takes no argument")
        return await plain[name](target.name)

    async def power(self, action: str, host: str) -> str:
        """A switched PDU's outlet: `cycle` cuts the host's power and restores it (a reboot
        that nothing on the host can refuse, a wedged kernel included)."""
        if action != "cycle":
            raise ValueError(f"unknown power action {action!r}; known: cycle")
        self.state.host(host)
        self.state.power_log.append(PowerRecord(time.time(), host, action))
        await self.host_faults.reboot(host)
        return f"{host}: outlet power cycled (off, on)"
