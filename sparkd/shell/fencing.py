"""An HA owner's side of host fencing: its mutating commands carry its token, and no host gets
one before the owner's fence sweep reached it.

The host keeps, per cluster, the highest token it has seen (catalogue.fence.FENCE_FUNCTION). A new
owner first runs a fenced no-op on every host of the cluster (the sweep): it waits behind a
former owner's command still running there, then records the new token, so any later command
of the former owner is refused. A host the sweep could not reach stays unfenced, and no
mutating command goes to it until a sweep succeeds: the former owner might still reach it.

A refusal (exit 76) means a newer owner exists: this instance stops acting on the cluster and
demotes (`on_fenced`); the action is skipped, not failed, so it costs no budget. A host whose
record names another etcd cluster, or cannot be read (exit 77), refuses every token until an
operator runs `sparkd ha refence CLUSTER`: it fails closed and is reported (`on_mismatch`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from sparkd.model.cluster import ClusterSpec
from sparkd.model.exits import FENCE_MISMATCH_EXIT, FENCED_EXIT
from sparkd.model.spec import HostSpec
from sparkd.shell import catalogue
from sparkd.shell.catalogue.fence import FenceToken
from sparkd.shell.catalogue.remote import Remote
from sparkd.shell.ssh import SshFailure, SshPool

RefusalKind = Literal["fenced", "mismatch", "unswept", "not owner"]


class HostRefused(Exception):
    """A mutating command not sent, or refused by the host's fence: nothing ran."""

    def __init__(self, kind: RefusalKind, host: str, detail: str) -> None:
        super().__init__(f"{kind} on {host}: {detail}")
        self.kind = kind
        self.host = host
        self.detail = detail


def _refusal(failure: SshFailure) -> tuple[RefusalKind, str] | None:
    result = failure.result
    if failure.kind != "exit_nonzero" or result is None:
        return None
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith(catalogue.fence.FENCE_MARKER)]
    if not lines:
        return None  # the command's own status, not the fence's
    if result.exit_status == FENCED_EXIT:
        return "fenced", lines[-1]
    if result.exit_status == FENCE_MISMATCH_EXIT:
        return "mismatch", lines[-1]
    return None


@dataclass
class HostFence:
    cluster: ClusterSpec
    pool: SshPool
    # The token while this instance may act on the cluster, else None.
    token: Callable[[], FenceToken | None]
    # False (`[ha] host_fencing = false`): commands only name their owner, nothing is checked.
    enforce: bool = True
    on_fenced: Callable[[str, str], None] = lambda host, detail: None
    # (host, why) when its fence refuses every token; (host, None) once it took this one.
    on_mismatch: Callable[[str, str | None], None] = lambda host, detail: None
    # Host name -> the token its latest successful sweep recorded there.
    swept: dict[str, FenceToken] = field(default_factory=dict)
    # Host name -> why its fence refuses every token (another etcd, an unreadable record).
    mismatched: dict[str, str] = field(default_factory=dict)
    # Host name -> why its latest sweep did not get through (unreachable, a failure).
    unreached: dict[str, str] = field(default_factory=dict)

    def unswept(self) -> list[HostSpec]:
        fence = self.token()
        return [h for h in self.cluster.hosts if fence is None or self.swept.get(h.name) != fence]

    def wrap(self, host: HostSpec, remote: Remote, seconds: float) -> tuple[Remote, FenceToken]:
        """`remote` carrying the owner's token, and the token; raises when it must not be sent
        at all."""
        fence = self.token()
        if fence is None:
            raise HostRefused("not owner", host.name, "this instance no longer owns the cluster")
        if not self.enforce:
            return catalogue.fence.audited(remote, fence), fence
        if self.swept.get(host.name) != fence:
            why = self.mismatched.get(host.name) or self.unreached.get(host.name)
            raise HostRefused("unswept", host.name, why or "the fence sweep has not reached it")
        return catalogue.fence.fenced(remote, fence, seconds), fence

    def check(self, host: HostSpec, failure: SshFailure, sent: FenceToken) -> None:
        """Raise HostRefused when `failure` is the fence refusing the command sent with `sent`."""
        refusal = _refusal(failure)
        if refusal is None:
            return
        kind, detail = refusal
        current = self.token()
        if current is not None and sent != current:
            # An older claim's command, refused after this instance took the cluster again:
            # the current claim stands (its own sweep already bumped the host's record).
            raise HostRefused(kind, host.name, detail)
        self.swept.pop(host.name, None)
        if kind == "fenced":
            # No token any more (its deadline passed while the command was on its way, as in
            # a pause) is no reason to keep quiet: the host says a newer owner took over.
            self.on_fenced(host.name, detail)
        elif current is not None:
            self.mismatched[host.name] = detail
            self.on_mismatch(host.name, detail)
        raise HostRefused(kind, host.name, detail)

    async def sweep(self) -> None:
        """The fenced no-op on every host not yet fenced with the current token, at once."""
        if not self.enforce:
            return
        fence = self.token()
        if fence is None:
            return
        hosts = self.unswept()
        if hosts:
            await asyncio.gather(*(self._sweep_one(h, fence) for h in hosts))

    async def _sweep_one(self, host: HostSpec, fence: FenceToken) -> None:
        seconds = self.cluster.ssh.command_timeout
        remote = catalogue.fence.fence_sweep(fence, seconds)
        try:
            # The lock may be held by a former owner's command: wait for it (it is bounded by
            # its own timeout), plus the sweep's own time.
            await self.pool.connection(host, self.cluster.ssh).run(
                remote.command, timeout=2 * seconds + catalogue.remote.KILL_GRACE
            )
        except SshFailure as failure:
            try:
                self.check(host, failure, fence)
            except HostRefused:
                return
            # Unreachable or failed: stays unswept, retried next cycle.
            self.unreached[host.name] = f"fence sweep: {failure.kind}: {failure.error.detail}"
            return
        self.unreached.pop(host.name, None)
        if self.token() == fence:
            self.swept[host.name] = fence
            if self.mismatched.pop(host.name, None) is not None:
                self.on_mismatch(host.name, None)
