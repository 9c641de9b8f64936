"""Host-side fencing (HA): a mutating command runs on a host only under the owner's token."""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass

from sparkd.model.exits import FENCE_BUSY_EXIT, FENCE_MISMATCH_EXIT, FENCED_EXIT
from sparkd.shell.catalogue.remote import Remote

# The owner of a cluster (HA) is the only one whose commands a host runs: each mutating command
# carries the owner key's create revision (the token), and the host compares-and-sets it under
# `flock` in the same SSH command. The forced-command wrapper recognises this exact text and
# does the same in Python (forced.FENCE_BODY); the two share the file layout.
FENCE_DIR = ".local/state/sparkd/fence"
FENCE_MARKER = "sparkd fence:"
# A token is an etcd revision (an int64). Both the shell prefix and the wrapper take at most
# this many digits, a bound below int64's largest that `[ -gt ]` compares without overflow in
# every shell (dash's and bash's arithmetic is int64): a longer one, sent or recorded, is never
# compared. A real etcd reaches 10^18 revisions after 30,000 years at a million a second.
TOKEN_DIGITS = 18
TOKEN_LIMIT = 10**TOKEN_DIGITS
_LONG = "?" * (TOKEN_DIGITS + 1)
# One shell function, the same text in every fenced command (the wrapper matches it exactly).
# $1 cluster, $2 token, $3 etcd cluster id, $4 instance, $5 seconds to wait for the lock,
# $6 `refence` to take over a file naming another etcd (or an unreadable one), or `force` to
# take over any record (`sparkd ha refence --force`). It opens the lock on fd 9, which the
# command then runs without (`9>&-`): the shell keeps the lock until the command ends, and a
# detached child (`setsid`, `nohup`, `docker exec -d`) never inherits it. What the record holds
# (its token, etcd cluster ID, instance) is never echoed: whoever holds the key reads stderr.
FENCE_FUNCTION = (
    "sparkd_fence() { "
    f'case "$2" in ""|0*|*[!0-9]*|{_LONG}*) echo "{FENCE_MARKER} $1: not a token" >&2; '
    f"return {FENCE_MISMATCH_EXIT};; esac; "
    'o=""; case "$6" in refence|force) o="$6";; esac; '
    f'd="$HOME/{FENCE_DIR}"; f="$d/$1"; '
    'mkdir -p -m 700 -- "$d" && exec 9>>"$f.lock" || '
    f'{{ echo "{FENCE_MARKER} $1: cannot open the lock" >&2; return {FENCE_MISMATCH_EXIT}; }}; '
    f'flock -w "$5" 9 || {{ echo "{FENCE_MARKER} $1: lock busy for $5s" >&2; '
    f"return {FENCE_BUSY_EXIT}; }}; "
    'if [ -e "$f" ]; then '
    's=""; c=""; i=""; read -r s c i < "$f"; '
    f'case "$s" in ""|*[!0-9]*|{_LONG}*) '
    f'if [ -z "$o" ]; then echo "{FENCE_MARKER} $1: unreadable record: '
    f'run sparkd ha refence $1" >&2; return {FENCE_MISMATCH_EXIT}; fi; s=0; c="$3";; esac; '
    'if [ "$c" != "$3" ] && [ -z "$o" ]; then '
    f'echo "{FENCE_MARKER} $1: token from another etcd cluster: '
    f'run sparkd ha refence $1" >&2; return {FENCE_MISMATCH_EXIT}; fi; '
    'if [ "$c" = "$3" ] && [ "$o" != force ] && [ "$s" -gt "$2" ]; then '
    f'echo "{FENCE_MARKER} $1: refused token $2: a newer one is recorded" >&2; '
    f"return {FENCED_EXIT}; fi; "
    'if [ "$s" = "$2" ] && [ "$c" = "$3" ]; then return 0; fi; '
    "fi; "
    'printf \'%s %s %s\\n\' "$2" "$3" "$4" > "$d/.$1.new" && sync -- "$d/.$1.new" && '
    'mv -f -- "$d/.$1.new" "$f" || '
    f'{{ echo "{FENCE_MARKER} $1: cannot write the record" >&2; return {FENCE_MISMATCH_EXIT}; }}; '
    "}"
)


@dataclass(frozen=True)
class FenceToken:
    """What a fenced command carries: the owner key's create revision in one etcd cluster."""

    cluster: str
    token: int
    etcd_cluster: int
    instance: str

    def __post_init__(self) -> None:
        if not 0 < self.token < TOKEN_LIMIT or self.etcd_cluster < 0:
            raise ValueError(f"not a fencing token: {self.token} in {self.etcd_cluster}")


def fence_prefix(
    fence: FenceToken, seconds: float, refence: bool = False, force: bool = False
) -> str:
    args = [fence.cluster, str(fence.token), str(fence.etcd_cluster), fence.instance]
    args.append(str(max(1, math.ceil(seconds))))
    if force:
        args.append("force")
    elif refence:
        args.append("refence")
    return f"{FENCE_FUNCTION}; {shlex.join(['sparkd_fence', *args])} && {{ "


def fenced(remote: Remote, fence: FenceToken, seconds: float) -> Remote:
    """`remote` run only if `fence` is not older than the host's record for its cluster, and
    with the host's lock held until it ends (a takeover's sweep waits for it)."""
    if not remote.mutating:
        raise ValueError(f"{remote.name} changes nothing: it is never fenced")
    command = f"{fence_prefix(fence, seconds)}{remote.command}\n}} 9>&-"
    return Remote(remote.name, command, mutating=True, stdin=remote.stdin)


def fence_sweep(
    fence: FenceToken, seconds: float, refence: bool = False, force: bool = False
) -> Remote:
    """The no-op a new owner runs on every host first: it waits behind a former owner's command
    still running there, then records the new token so any later one of the old is refused.
    With `force` (`sparkd ha refence --force`) the token replaces any record, a newer one too."""
    name = "refence" if refence or force else "fence"
    command = f"{fence_prefix(fence, seconds, refence, force)}true\n}} 9>&-"
    return Remote(name, command, mutating=True)


def audited(remote: Remote, fence: FenceToken) -> Remote:
    """`[ha] host_fencing = false`: the owner and token named on the command, nothing checked
    (for tests and diagnosis: a stale owner's command then runs)."""
    tag = shlex.join([":", "sparkd-unfenced", fence.cluster, str(fence.token), fence.instance])
    return Remote(remote.name, f"{tag}; {remote.command}", mutating=True, stdin=remote.stdin)
