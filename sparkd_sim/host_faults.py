"""Faults of a host itself: its reachability, reboots, the kernel's and GPU's errors, memory, disk,
its data link and interface, and `heal`, which undoes what can be undone."""

from __future__ import annotations

import asyncio
import ipaddress
import time

from sparkd_sim import fake_fabric, fake_kernel
from sparkd_sim.consequences import Consequences
from sparkd_sim.hosts import WRONG_IP_OFFSET, SimHost
from sparkd_sim.reference import INTERFACE
from sparkd_sim.state import Container, GpuProcess, HostState, new_boot_id, new_container_id
from sparkd_sim.world_state import WorldState


class HostFaults:
    """What each host-level fault does to the host's state and its SSH endpoint."""

    def __init__(self, state: WorldState, consequences: Consequences) -> None:
        self.state = state
        self.consequences = consequences

    async def reboot(self, host: str) -> str:
        """Everything on the host dies; it comes back after `reboot_downtime` with a new boot id,
        its enabled units active and its `always`/`unless-stopped` containers restarted."""
        h = self.state.host(host)
        if h.pending_wedge is not None:
            h.pending_wedge.cancel()
            h.pending_wedge = None
        h.reachability = "down"
        await h.ssh.close()
        for serve in list(self.state.serves):
            if serve.engine is h.engine:
                serve.kill_hard()
        h.engine.shutdown()
        for unit in h.state.units.values():
            unit.active = False
        self.state.spawn(self._boot(h))
        return f"{host} rebooting; back in {self.state.timing.reboot_downtime:g}s"

    async def _boot(self, h: SimHost) -> None:
        await asyncio.sleep(self.state.timing.reboot_downtime)
        h.state.boot_id = new_boot_id()
        h.state.booted_wall = time.time()
        h.state.gpu_lost = False
        fake_kernel.boot(h.state)
        for unit in h.state.units.values():
            unit.active = unit.enabled
        h.engine.boot()
        if h.reachability == "down":  # an unreachable/blackhole fault outlives the reboot
            h.reachability = "ok"
            await h.ssh.listen()

    async def unreachable(self, host: str) -> str:
        h = self.state.host(host)
        h.reachability = "unreachable"
        await h.ssh.close()
        return f"{host} unreachable: SSH connections refused"

    async def blackhole(self, host: str) -> str:
        h = self.state.host(host)
        h.reachability = "blackhole"
        await h.ssh.blackhole()
        # Nothing answers, not even Ray's health checks: the host's nodes hang.
        for container in list(h.state.containers.values()):
            if container.running:
                self.consequences.freeze(container)
        return f"{host} blackholed: SSH accepts TCP and never answers"

    async def path_lost(self, host: str) -> str:
        """The ops box loses its path to `host` (a switch port, its management NIC, a firewall):
        its SSH goes silent to sparkd, while the host, its Ray and its model keep working and
        the other hosts still reach it over the data link."""
        h = self.state.host(host)
        h.reachability = "path_lost"
        await h.ssh.blackhole()
        return f"{host}: the ops box's path lost (SSH silent); the host runs on"

    async def heal(self, host: str) -> str:
        """Undo the reversible faults on `host` (a reboot in progress finishes on its own)."""
        h = self.state.host(host)
        if h.reachability in ("unreachable", "blackhole", "path_lost"):
            h.reachability = "ok"
            await h.ssh.listen()
        for container in list(h.state.containers.values()):
            self.consequences.thaw(container)
            container.crash_loop = False
        h.state.memory_available_kib = fake_kernel.MEM_AVAILABLE_KIB
        h.state.link = fake_fabric.Link(carrier_changes=h.state.link.carrier_changes)
        h.faults.slow_load = False
        h.faults.stall_load = False
        h.faults.chatty_stall = False
        h.faults.noisy_log = self.state.noisy_load_logs
        h.faults.oom_capture = False
        h.faults.hang_capture = False
        for model in sorted(self.state.damaged):
            self.state.add_checkpoint(model)
        self.state.damaged.clear()
        h.faults.missing_weights.clear()
        h.faults.vanish_weights.clear()
        h.state.disk_avail_bytes = HostState.disk_avail_bytes
        h.state.ray_ip_override = None
        h.behaviour.engine = "ok"
        h.behaviour.style = "reasoning_only"
        h.behaviour.naming = self.state.answer_naming
        h.hung_tools.clear()
        h.docker_down = False
        h.state.interface = INTERFACE
        h.state.gpu_processes = [
            g for g in h.state.gpu_processes if g.container_id is not None or g.graphics
        ]
        return f"{host} healed"

    async def wrong_ip(self, host: str) -> str:
        h = self.state.host(host)
        # Still a loopback address: nothing may ever dial a non-loopback one.
        h.state.ray_ip_override = str(ipaddress.IPv4Address(h.address) + WRONG_IP_OFFSET)
        return f"Ray on {host} registers as {h.state.ray_ip_override} from its next start"

    async def stray_gpu(self, host: str, arg: str | None = None) -> str:
        h = self.state.host(host)
        pid = h.engine.new_pid()
        h.state.gpu_processes.append(
            GpuProcess(pid=pid, name="/usr/bin/python3", used_mib=int(arg or 96073))
        )
        return f"stray GPU process {pid} on {host}"

    async def late_delivery(self, host: str, arg: str | None = None) -> str:
        """The next command naming its owner (HA: fenced, or tagged) reaches `host` `arg`
        seconds late, as bytes a partition held back would; nothing is printed."""
        if arg is None:
            raise ValueError("late-delivery needs seconds")
        self.state.host(host).ssh.late = float(arg)
        return f"the next owned command reaches {host} {float(arg):g}s late"

    async def big_layer(self, host: str, arg: str | None = None) -> str:
        """A stopped container left behind (`old-build`) whose writable layer holds `arg` GB
        (default 4, as after a `pip install` in a running container): every `docker ps -a`
        that asks for sizes waits while the daemon walks it (`Timing.size_walk`)."""
        gb = float(arg) if arg else 4.0
        h = self.state.host(host)
        now = time.time()
        box = Container(
            id=new_container_id(),
            name="old-build",
            image=next(iter(sorted(h.state.images)), "busybox:latest"),
            command=["sleep", "infinity"],
            labels={},
            env={},
            mounts=[],
            restart="no",
            status="exited",
            exit_code=137,
            created_wall=now,
            started_wall=now,
            finished_wall=now,
            layer_bytes=int(gb * 1e9),
        )
        h.state.containers[box.id] = box
        return f"{host}: stopped container old-build holds a {gb:g} GB writable layer"

    async def full_disk(self, host: str, arg: str | None = None) -> str:
        """The file system under the log dir (and Docker's) has `arg` bytes left (default 0)."""
        free = int(arg) if arg else 0
        self.state.host(host).state.disk_avail_bytes = free
        return f"{host}: {free} bytes free"

    async def lost_gpu(self, host: str) -> str:
        """The GPU fell off the bus (Xid 79): nvidia-smi exits 15 until a reboot."""
        self.state.host(host).state.gpu_lost = True
        return f"the GPU of {host} is lost"

    async def xid_79(self, host: str) -> str:
        """The kernel logs XID 79 and the GPU is lost (nvidia-smi exits 15) until a reboot."""
        fake_kernel.log(self.state.host(host).state, fake_kernel.XID_79)
        return await self.lost_gpu(host)

    async def gsp_crash(self, host: str) -> str:
        """The GPU's firmware (GSP) stops answering and crashes: XID 119, 120, the driver's
        rate-limit notice and XID 154 "GPU Reset Required". nvidia-smi still answers."""
        fake_kernel.log(self.state.host(host).state, fake_kernel.GSP_CRASH)
        return f"{host}: GSP crash logged"

    async def xid_13(self, host: str) -> str:
        """An application's graphics exception: logged, the GPU stays usable."""
        fake_kernel.log(self.state.host(host).state, fake_kernel.XID_13)
        return f"{host}: XID 13 logged"

    async def xid_45(self, host: str) -> str:
        """A process torn down while on the GPU: logged, harmless."""
        fake_kernel.log(self.state.host(host).state, fake_kernel.XID_45)
        return f"{host}: XID 45 logged"

    async def nv_no_memory_wedge(self, host: str, arg: str | None = None) -> str:
        """NVRM logs NV_ERR_NO_MEMORY; `arg` seconds later (default 10) the host stops
        answering, SSH included, until a power cycle (a reboot fault) or `heal`."""
        fake_kernel.log(self.state.host(host).state, fake_kernel.NV_NO_MEMORY)
        return self._wedge_later(host, arg, "NV_ERR_NO_MEMORY")

    async def aer_fatal(self, host: str, arg: str | None = None) -> str:
        """A fatal PCIe AER on the ConnectX-7, mlx5's error handler and a soft lockup; `arg`
        seconds later (default 10) the host stops answering."""
        fake_kernel.log(self.state.host(host).state, fake_kernel.AER_FATAL)
        return self._wedge_later(host, arg, "fatal AER")

    def _wedge_later(self, host: str, arg: str | None, what: str) -> str:
        delay = float(arg) if arg else 10.0

        h = self.state.host(host)

        async def wedge() -> None:
            await asyncio.sleep(delay)
            h.pending_wedge = None
            await self.blackhole(host)

        h.pending_wedge = self.state.spawn(wedge())
        return f"{host}: {what} logged; wedged in {delay:g}s"

    async def memory_pressure(self, host: str, arg: str | None = None) -> str:
        """MemAvailable drops to `arg` bytes (default 1 GiB) until a reboot or `heal`."""
        available = int(arg) if arg else 1 << 30
        self.state.host(host).state.memory_available_kib = available // 1024
        return f"{host}: MemAvailable {available} bytes"

    async def gid_moved(self, host: str, arg: str | None = None) -> str:
        """The link dropped and the data address was re-added: its RoCE v2 GID row moves to
        `arg` (default 5), and the carrier changed twice."""
        link = self.state.host(host).state.link
        link.gid_start = (int(arg) if arg else 5) - 1
        link.carrier_changes += 2
        return f"{host}: the data IP's RoCE v2 GID is now at index {link.gid_start + 1}"

    async def mtu_mismatch(self, host: str, arg: str | None = None) -> str:
        """A firmware update reset the data interface's MTU to `arg` (default 1500): the model
        serving across it hangs in NCCL without an error, and stays hung after the MTU is set
        back, until it is relaunched."""
        self.state.host(host).state.link.mtu = int(arg) if arg else 1500
        self.consequences.hang_across(host)
        return f"{host}: data interface MTU {self.state.host(host).state.link.mtu}"

    async def rate_degraded(self, host: str, arg: str | None = None) -> str:
        """The port trained at `arg` Gb/s (default 25) instead of 200."""
        rate = arg or "25"
        self.state.host(host).state.link.rate = f"{rate} Gb/sec (1X HDR)"
        return f"{host}: RDMA port at {rate} Gb/s"

    async def rail_down(self, host: str) -> str:
        """The other PCIe half of the host's QSFP port (`fake_fabric.RAIL_DEVICE`) went DOWN;
        the data interface's half stays sound, so only a read of every device NCCL uses sees
        it."""
        self.state.host(host).state.link.rail_up = False
        return f"{host}: RDMA device {fake_fabric.RAIL_DEVICE} is DOWN"

    async def link_flap(self, host: str) -> str:
        """The data link went down and came back: two carrier changes."""
        self.state.host(host).state.link.carrier_changes += 2
        return f"{host}: data link flapped"

    async def rename_iface(self, host: str, arg: str | None = None) -> str:
        """The data-plane device has a new name (a kernel update renamed it): the configured
        name no longer exists, the address stays on the renamed device."""
        h = self.state.host(host)
        h.state.interface = arg or "enP2p1s0f0np0"
        return f"{host}'s data interface is now {h.state.interface}"
