"""The fault table: every fault `World.fault` (and the control socket) injects by name, and the
switched PDU's power cycle."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from sparkd_sim.host_faults import HostFaults
from sparkd_sim.hosts import PowerRecord
from sparkd_sim.model_faults import ModelFaults


class Faults(HostFaults, ModelFaults):
    """Faults by name; each fault's effect lives in `HostFaults` or `ModelFaults`."""

    async def fault(self, name: str, host: str, arg: str | None = None) -> str:
        """Inject fault `name` on `host`; returns a one-line description of what happened."""
        target = self.host(host)
        plain: dict[str, Callable[[str], Awaitable[str]]] = {
            "reboot": self.reboot,
            "unreachable": self.unreachable,
            "blackhole": self.blackhole,
            "path-lost": self.path_lost,
            "heal": self.heal,
            "crash-model": self.crash_model,
            "hang-engine": self.hang_engine,
            "oom-capture": self.oom_capture,
            "wrong-ip": self.wrong_ip,
            "slow-load": self.slow_load,
            "stall-load": self.stall_load,
            "chatty-stall": self.chatty_stall,
            "noisy-load": self.noisy_load,
            "docker-down": self.docker_down,
            "docker-hung": self.docker_hung,
            "hand-restart-serve": self.hand_restart_serve,
            "lost-gpu": self.lost_gpu,
            "orphan-engine": self.orphan_engine,
            "hang-capture": self.hang_capture,
            "xid-79": self.xid_79,
            "gsp-crash": self.gsp_crash,
            "xid-13": self.xid_13,
            "xid-45": self.xid_45,
            "link-flap": self.link_flap,
            "rail-down": self.rail_down,
            "hang-under-load": self.hang_under_load,
        }
        with_arg: dict[str, Callable[[str, str | None], Awaitable[str]]] = {
            "stray-gpu": self.stray_gpu,
            "kill-container": self.kill_container,
            "hang-container": self.hang_container,
            "crash-loop": self.crash_loop,
            "repull-image": self.repull_image,
            "image-without-ray": self.image_without_ray,
            "answer-style": self.answer_style,
            "hang-tool": self.hang_tool,
            "rename-iface": self.rename_iface,
            "full-disk": self.full_disk,
            "big-layer": self.big_layer,
            "pull-image": self.pull_image,
            "nv-no-memory-wedge": self.nv_no_memory_wedge,
            "aer-fatal": self.aer_fatal,
            "memory-pressure": self.memory_pressure,
            "gid-moved": self.gid_moved,
            "mtu-mismatch": self.mtu_mismatch,
            "rate-degraded": self.rate_degraded,
            "late-delivery": self.late_delivery,
            "missing-weights": self.missing_weights,
            "vanish-weights": self.vanish_weights,
            "long-prompt": self.long_prompt,
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
        self.host(host)
        self.power_log.append(PowerRecord(time.time(), host, action))
        await self.reboot(host)
        return f"{host}: outlet power cycled (off, on)"
