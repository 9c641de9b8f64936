"""The data link's RDMA fabric: the faults NCCL hangs on, judged from the sysfs facts
(core.reading.links). Pure.

A DGX Spark's QSFP port is two RDMA devices, one per PCIe x4 half, and NCCL spreads its traffic
over every device `NCCL_IB_HCA` lists: the script also reads those devices' ports under
/sys/class/infiniband (catalogue `rail_globs`), and each is judged as a rail (`Rail`).

A tensor-parallel NCCL run over a fabric fault hangs without an error, and restarting it hangs
again: a fault here holds every Ray and model start or restart, naming the host, the interface,
the fact and the operator's fix.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkd.core.judging import hang
from sparkd.core.judging.judge import Context, Hold, Verdict, act, ago
from sparkd.core.judging.load import launch_time
from sparkd.core.reading.links import small_int
from sparkd.core.spec import container_name
from sparkd.model.observed import Rail
from sparkd.model.plan import MODEL_STARTS, RAY_STARTS


def gid_env(ctx: Context) -> int | None:
    """The GID index the Ray containers give NCCL (`ray.env` NCCL_IB_GID_INDEX), if any."""
    return small_int(ctx.desired.ray.env.get("NCCL_IB_GID_INDEX", ""))


@dataclass(frozen=True)
class Problem:
    host: str
    # What is wrong, and the operator's fix.
    why: str
    # Hard: the fabric cannot carry NCCL at all (`blocked`); soft: slow or broken now and then.
    hard: bool
    # Whether it holds Ray and model (re)starts (a moved GID is cured by a relaunch).
    holds: bool = True


def problems(ctx: Context) -> list[Problem]:
    """Every fabric fault seen this cycle."""
    found: list[Problem] = []
    mtus: dict[str, int] = {}
    expected = ctx.desired.fabric.expected_rate_gbps
    wanted_gid = gid_env(ctx)
    for host in ctx.reachable:
        fabric = ctx.facts[host.name].fabric
        if fabric is None:
            continue
        iface = host.interface
        if fabric.mtu is not None:
            mtus[host.name] = fabric.mtu
        if fabric.rdma_device is None:
            continue
        where = f"{host.name} {iface} ({fabric.rdma_device} port {fabric.port})"
        if fabric.port_state not in (None, "ACTIVE"):
            found.append(
                Problem(
                    host.name,
                    f"{where} is {fabric.port_state} ({fabric.phys_state}): reseat the "
                    "cable or reboot the host",
                    True,
                )
            )
            continue
        if fabric.gid_index is None:
            found.append(
                Problem(
                    host.name,
                    f"{where} has no RoCE v2 GID for {host.ip}: re-add the address "
                    f"(ip addr add {host.ip}/PREFIX dev {iface})",
                    True,
                )
            )
        elif wanted_gid is not None and fabric.gid_index != wanted_gid:
            found.append(
                Problem(
                    host.name,
                    f"{where} holds {host.ip} as RoCE v2 at GID index "
                    f"{fabric.gid_index}, not NCCL_IB_GID_INDEX={wanted_gid}: re-add the address "
                    "or set ray.env NCCL_IB_GID_INDEX",
                    True,
                )
            )
        if expected is not None and fabric.rate_gbps is not None and fabric.rate_gbps < expected:
            found.append(
                Problem(
                    host.name,
                    f"{where} runs at {fabric.rate_gbps:g} Gb/s, below the expected "
                    f"{expected:g}: reseat or replace the cable",
                    False,
                )
            )
        for rail in fabric.rails:
            found.extend(_rail_problems(host.name, rail, expected, wanted_gid))
    if len(set(mtus.values())) > 1:
        top = max(mtus.values())
        listed = ", ".join(f"{name} {mtu}" for name, mtu in sorted(mtus.items()))
        low = [name for name, mtu in sorted(mtus.items()) if mtu != top]
        for name in low:
            found.append(
                Problem(
                    name,
                    f"MTU mismatch on the data link ({listed}): set the MTU of "
                    f"{ctx.desired.host(name).interface} on {name} to {top}",
                    True,
                )
            )
    for name, since in sorted(ctx.memory.flapped_at.items()):
        if name in ctx.facts and ctx.now - since <= ctx.desired.fabric.flap_window:
            iface = ctx.desired.host(name).interface
            found.append(
                Problem(
                    name,
                    f"{name} {iface} flapped (carrier changed) in the last "
                    f"{ctx.desired.fabric.flap_window:g}s: check the cable and the switch port",
                    False,
                )
            )
    serve = ctx.observed.serve
    # The serve process's own age says when it started, whoever launched it (a model sparkd
    # did not launch, or memory lost, has no launched_at); the later of the two is the launch.
    known = [t for t in (launch_time(ctx), ctx.memory.launched_at) if t is not None]
    launched = max(known) if known else None
    for name, (before, after, at) in sorted(ctx.memory.gid_moved.items()):
        # Only a model that opened NCCL before the move holds the old index.
        if serve is None or not serve.running or launched is None or launched >= at:
            continue
        iface = ctx.desired.host(name).interface
        found.append(
            Problem(
                name,
                f"{name} {iface}: the data IP's RoCE v2 GID moved from index {before} to "
                f"{after} after the model launched (NCCL keeps the old one): the model is "
                "restarted if it stops answering",
                False,
                holds=False,
            )
        )
    return found


def _rail_problems(
    host: str, rail: Rail, expected: float | None, wanted_gid: int | None
) -> list[Problem]:
    """A further RDMA port NCCL_IB_HCA lists, judged like the data device: NCCL spreads a
    connection's traffic over every listed port, so one bad half of a Spark's QSFP port hangs
    or fails the whole tensor-parallel run. Its address is not in the config, so its GID is
    judged by kind: a routable RoCE v2 row, at NCCL_IB_GID_INDEX when that is set (NCCL uses
    the one index on every device)."""
    where = f"{host} {rail.device} port {rail.port} (in NCCL_IB_HCA)"
    if rail.port_state not in (None, "ACTIVE"):
        # NCCL skips a port that is not ACTIVE when it starts (net_ib/init.cc), so the two
        # hosts would open different rails, and a port that drops later fails its transfers.
        return [
            Problem(
                host,
                f"{where} is {rail.port_state} ({rail.phys_state}): reseat the cable, bring "
                f"the interface up, or take {rail.device} out of NCCL_IB_HCA",
                True,
            )
        ]
    found: list[Problem] = []
    if rail.port_state is not None and not rail.roce_v2_gids:
        found.append(
            Problem(
                host,
                f"{where} has no routable RoCE v2 GID: give its interface its address "
                "(NVIDIA's netplan addresses both halves of the port)",
                True,
            )
        )
    elif wanted_gid is not None and rail.roce_v2_gids and wanted_gid not in rail.roce_v2_gids:
        rows = ", ".join(str(i) for i in rail.roce_v2_gids)
        found.append(
            Problem(
                host,
                f"{where} holds RoCE v2 at GID index {rows}, not NCCL_IB_GID_INDEX="
                f"{wanted_gid}: re-add its address or set ray.env NCCL_IB_GID_INDEX",
                True,
            )
        )
    if expected is not None and rail.rate_gbps is not None and rail.rate_gbps < expected:
        found.append(
            Problem(
                host,
                f"{where} runs at {rail.rate_gbps:g} Gb/s, below the expected "
                f"{expected:g}: reseat or replace the cable",
                False,
            )
        )
    return found


def judge_fabric(ctx: Context) -> Verdict:
    """No Ray or model (re)start over a faulty fabric: it would hang again."""
    verdict = Verdict()
    found = problems(ctx)
    for problem in found:
        text = f"fabric: {problem.why}"
        verdict.notes.append(text)
        if problem.holds:
            verdict.holds.append(Hold(text, RAY_STARTS | MODEL_STARTS))
        if problem.hard:
            verdict.phase = "blocked"
    if found:
        verdict.phase = verdict.phase or "degraded"
        verdict.triage = ["fabric"]
    return verdict


def carrier_changed(previous: int | None, now: int | None) -> bool:
    return previous is not None and now is not None and now > previous


def judge_recovery(ctx: Context, fabric: Verdict, *, ray_busy: bool) -> Verdict:
    """Once the fabric is sound after a hold, what hung over it is restarted: both ranks. NCCL
    opened over the faulty fabric stays hung when the link heals, in the head's Ray container
    and the workers' alike, so every Ray container is restarted (the serve process and each
    rank's actors with them) and the model relaunched on the new Ray. Only a model launched
    before the hold began whose latest probe, taken after the hold ended, failed (not busy), or
    whose token counter still stands under load over the sound fabric: a probe that failed over
    the faulty fabric says nothing of the healed one, and until one comes (two probe intervals
    at most) the failures counted during the hold restart no single rank."""
    verdict = Verdict()
    since = ctx.memory.fabric_held_since
    serve = ctx.observed.serve
    if since is None or fabric.holds or ray_busy or ctx.unreachable:
        return verdict
    if serve is None or not serve.running:
        return verdict  # nothing hangs: the model stage starts one
    known = [t for t in (launch_time(ctx), ctx.memory.launched_at) if t is not None]
    if not known or max(known) >= since:
        return verdict
    # The first look without the hold ends it: its own probe ran after its fabric reading.
    ended = ctx.memory.fabric_sound_at
    if ended is None:
        ended = ctx.observed.observed_at
    probe = ctx.observed.probe or ctx.memory.last_probe
    after = probe is not None and probe.at >= ended
    if probe is not None and after and probe.busy:
        return verdict
    failed = probe is not None and after and probe.verdict.healthy is False
    if failed and probe is not None and probe.verdict.outcome != "not_run":
        evidence = f"probe {probe.verdict.outcome}"
    elif hang.stands(ctx.desired, ctx.memory, ctx.observed.endpoint, ctx.now):
        # This reading, over the sound fabric, still has the counter standing under load.
        evidence = "hung under load"
    else:
        if not after and ctx.now - ended < 2 * ctx.desired.probe_interval:
            # The failures counted over the faulty fabric restart no single rank meanwhile.
            verdict.holds.append(
                Hold(
                    "the fabric is sound: waiting for a probe over it to tell whether the "
                    "model hung over the fault",
                    MODEL_STARTS,
                )
            )
        return verdict
    why = (
        f"fabric sound again after a hold of {ago(ctx.now - since)}, and the model launched "
        f"before it does not answer ({evidence}): restarting both ranks' Ray "
        "containers (NCCL opened over the faulty fabric stays hung); the model is relaunched "
        "on the new Ray"
    )
    verdict.phase = "starting_ray"
    verdict.notes.append(why)
    for host in (ctx.desired.head, *ctx.desired.workers):
        name = container_name(ctx.desired, host)
        verdict.actions.append(act("restart_ray", host.name, name, why))
    verdict.holds.append(Hold(why, MODEL_STARTS))
    return verdict
