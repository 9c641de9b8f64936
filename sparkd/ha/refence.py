"""`sparkd ha refence CLUSTER`: after etcd was rebuilt or restored (a new etcd cluster ID, its
revisions from 1 again), the hosts' fence records name the old etcd and refuse every token, so
the cluster's owner cannot act (it fails closed and alerts). An operator who has checked that
no instance still talks to the old etcd runs this: the current owner's token, read from etcd,
replaces each host's record. A record from the same etcd with a newer token is never replaced:
refencing cannot revive a former owner. `--force` replaces that too: the way out when whoever
holds the hosts' key wrote a token above every etcd revision, run once no former owner can act."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import TextIO

from sparkd.ha.config import HaSpec
from sparkd.ha.etcd import EtcdClient, EtcdError, EtcdUnavailable
from sparkd.model.cluster import ClusterSpec
from sparkd.model.exits import EX_UNAVAILABLE, EX_USAGE
from sparkd.model.spec import HostSpec
from sparkd.shell import catalogue
from sparkd.shell.catalogue.fence import FenceToken
from sparkd.shell.ssh import SshFailure, SshPool


async def owner_token(ha: HaSpec, cluster: str) -> FenceToken | str:
    """The cluster's current owner's fencing token, or why there is none."""
    client = EtcdClient(ha.etcd_endpoints, ha.request_timeout, ha.user, ha.password_file)
    try:
        kv, _ = await client.get(f"{ha.prefix}owner/{cluster}")
    except (EtcdUnavailable, EtcdError, OSError) as exc:
        return f"etcd: {exc}"
    finally:
        await client.close()
    if kv is None:
        return f"no instance owns {cluster} now: start one, then refence"
    if client.cluster_id is None:
        return "etcd gave no cluster ID"
    instance = "?"
    with contextlib.suppress(ValueError, AttributeError):
        instance = str(json.loads(kv.value).get("instance", "?"))
    return FenceToken(cluster, kv.create_revision, client.cluster_id, instance)


async def _one(
    pool: SshPool, cluster: ClusterSpec, host: HostSpec, fence: FenceToken, force: bool
) -> str:
    seconds = cluster.ssh.command_timeout
    remote = catalogue.fence.fence_sweep(fence, seconds, refence=True, force=force)
    try:
        await pool.connection(host, cluster.ssh).run(
            remote.command, timeout=2 * seconds + catalogue.remote.KILL_GRACE
        )
    except SshFailure as failure:
        said = failure.result.stderr.strip().splitlines()[-1:] if failure.result else []
        return (
            f"{host.name}: not refenced: {failure.kind}: {' '.join(said) or failure.error.detail}"
        )
    return ""


async def refence(
    ha: HaSpec | None,
    cluster: ClusterSpec | None,
    name: str,
    out: TextIO,
    err: TextIO,
    force: bool = False,
) -> int:
    """Refence the cluster `name` (`cluster`, None when the config has none by that name). With
    `force`, the owner's token replaces any record, a newer one of the same etcd too: a token
    written above every etcd revision by whoever holds the hosts' key would otherwise refuse
    every owner for good."""
    if ha is None or cluster is None:
        why = "the config has no [ha] section" if ha is None else f"no cluster {name!r}"
        print(f"sparkd ha refence: {why}", file=err)
        return EX_USAGE
    fence = await owner_token(ha, name)
    if isinstance(fence, str):
        print(f"sparkd ha refence: {fence}", file=err)
        return EX_UNAVAILABLE
    pool = SshPool()
    try:
        failed = [
            line
            for line in await asyncio.gather(
                *(_one(pool, cluster, h, fence, force) for h in cluster.hosts)
            )
            if line
        ]
    finally:
        await pool.close()
    for line in failed:
        print(line, file=err)
    done = len(cluster.hosts) - len(failed)
    print(
        f"{name}: {done} of {len(cluster.hosts)} hosts {'forced' if force else 'refenced'} "
        f"with token {fence.token} of etcd "
        f"cluster {fence.etcd_cluster} (owner {fence.instance})",
        file=out,
    )
    return 0 if not failed else 1
