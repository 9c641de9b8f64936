"""The owner's side of the fence, without SSH: what is sent, and what a refusal means."""

from __future__ import annotations

import pytest

from sparkd.shell import catalogue
from sparkd.shell.catalogue.fence import FenceToken
from sparkd.shell.catalogue.remote import Remote
from sparkd.shell.fencing import HostFence, HostRefused
from sparkd.shell.ssh import SshPool
from sparkd.shell.ssh_errors import CommandResult, SshFailure, host_error
from tests.toy import reference_cluster

ETCD = 5


def refusal(status: int, text: str) -> SshFailure:
    result = CommandResult(status, "", text + "\n", 0.01)
    return SshFailure(host_error("exit_nonzero", f"exited with status {status}"), result)


class Owner:
    def __init__(self) -> None:
        self.fence: FenceToken | None = FenceToken("sparks", 30, ETCD, "ops-a")
        self.fenced: list[str] = []
        self.mismatch: list[tuple[str, str | None]] = []


def make(owner: Owner, enforce: bool = True) -> HostFence:
    fence = HostFence(reference_cluster(), SshPool(), lambda: owner.fence, enforce=enforce)
    fence.on_fenced = lambda host, detail: owner.fenced.append(host)
    fence.on_mismatch = lambda host, detail: owner.mismatch.append((host, detail))
    return fence


def test_nothing_is_sent_unswept_or_without_a_token() -> None:
    owner = Owner()
    fence = make(owner)
    host = reference_cluster().head
    remote = Remote("remove_container", "docker rm -f -- x", True)
    with pytest.raises(HostRefused) as caught:
        fence.wrap(host, remote, 5)
    assert caught.value.kind == "unswept"
    assert owner.fence is not None
    fence.swept[host.name] = owner.fence
    wrapped, sent = fence.wrap(host, remote, 5)
    assert sent == owner.fence and "sparkd_fence sparks 30 5 ops-a 5 && {" in wrapped.command
    owner.fence = None
    with pytest.raises(HostRefused) as caught:
        fence.wrap(host, remote, 5)
    assert caught.value.kind == "not owner"


def test_unenforced_the_token_is_only_named() -> None:
    owner = Owner()
    wrapped, _ = make(owner, enforce=False).wrap(
        reference_cluster().head, Remote("x", "docker rm -f -- x", True), 5
    )
    assert wrapped.command == ": sparkd-unfenced sparks 30 ops-a; docker rm -f -- x"


def test_a_refusal_of_the_current_token_demotes_one_of_an_older_claim_does_not() -> None:
    owner = Owner()
    fence = make(owner)
    host = reference_cluster().head
    assert owner.fence is not None
    current = owner.fence
    fence.swept[host.name] = current
    stale = FenceToken("sparks", 22, ETCD, "ops-a")
    said = f"{catalogue.fence.FENCE_MARKER} sparks: refused token 22 < 30 (ops-a)"
    with pytest.raises(HostRefused):
        fence.check(host, refusal(76, said), stale)
    assert owner.fenced == [] and fence.swept[host.name] == current
    said = f"{catalogue.fence.FENCE_MARKER} sparks: refused token 30 < 31 (ops-b)"
    with pytest.raises(HostRefused) as caught:
        fence.check(host, refusal(76, said), current)
    assert caught.value.kind == "fenced" and owner.fenced == [host.name]
    assert host.name not in fence.swept
    # The command's own exit status 76, with no word from the fence, is the command's.
    fence.check(host, refusal(76, "something else"), current)


def test_another_etcds_record_is_a_mismatch_not_a_demotion() -> None:
    owner = Owner()
    fence = make(owner)
    host = reference_cluster().head
    assert owner.fence is not None
    fence.swept[host.name] = owner.fence
    said = (
        f"{catalogue.fence.FENCE_MARKER} sparks: token from etcd cluster 9, this is 5: run sparkd"
    )
    with pytest.raises(HostRefused) as caught:
        fence.check(host, refusal(77, said), owner.fence)
    assert caught.value.kind == "mismatch" and owner.fenced == []
    assert owner.mismatch == [(host.name, said)]
    with pytest.raises(HostRefused) as caught:
        fence.wrap(host, Remote("x", "docker rm -f -- x", True), 5)
    assert caught.value.kind == "unswept" and "etcd cluster 9" in caught.value.detail


def test_a_refusal_heard_once_the_token_is_gone_still_says_fenced() -> None:
    """Paused while its command travelled, the owner wakes past its deadline (no token) to the
    host's refusal of the token it sent: a newer owner took over, and it says so."""
    owner = Owner()
    fence = make(owner)
    host = reference_cluster().head
    sent = owner.fence
    assert sent is not None
    fence.swept[host.name] = sent
    owner.fence = None
    said = f"{catalogue.fence.FENCE_MARKER} sparks: refused token 30 < 31 (ops-b)"
    with pytest.raises(HostRefused) as caught:
        fence.check(host, refusal(76, said), sent)
    assert caught.value.kind == "fenced" and owner.fenced == [host.name]
    assert host.name not in fence.swept
    # Another etcd's record is the current claim's business: none is left to keep it for.
    said = (
        f"{catalogue.fence.FENCE_MARKER} sparks: token from etcd cluster 9, this is 5: run sparkd"
    )
    with pytest.raises(HostRefused) as caught:
        fence.check(host, refusal(77, said), sent)
    assert caught.value.kind == "mismatch" and owner.mismatch == [] and not fence.mismatched
