"""An etcd writer plants a rollback to a spec of its own: the next owner launches nothing from it.

Whoever can write the etcd prefix is not the config's author. The attack, against two real
`sparkd run` processes, one real etcd and the simulated hosts: one transaction writes the
cluster's memory with a rollout of the desired spec `rolled_back` to a last-good spec whose
`ray.extra_docker_args` is `--privileged -v /:/host` and whose `ray.env` has Python run a
command (`BROWSER`), and deletes the owner key. The next owner adopts that memory; it must
refuse it (event, log, `blocked` naming the spec), and no host may run that `docker run`."""

from __future__ import annotations

import json
import time

import pytest

from sparkd.core.spec import good_of, identity
from sparkd.ha.etcd import EtcdClient, b64
from sparkd.ha.memory import memory_key
from sparkd.model.memory import Rollout
from sparkd.settings import load_settings
from sparkd_sim.world import World
from tests.etcd.conftest import EtcdServer
from tests.support.daemon import eventually
from tests.support.ha import Instance, owner_and_standby, two_more_looks, wait_healthy
from tests.support.hostile import hostile

pytestmark = pytest.mark.etcd

PREFIX = "sparkd/v1/"


async def test_a_planted_last_good_spec_is_refused_by_the_next_owner(
    seed_world: World, pair: tuple[Instance, Instance], etcd: EtcdServer, admin: EtcdClient
) -> None:
    a, b, cluster = await owner_and_standby(seed_world, pair)
    await wait_healthy(a, within=90)
    desired = load_settings(a.config).cluster(cluster)
    assert desired is not None
    evil = hostile(desired)
    kv, _ = await admin.get(memory_key(PREFIX, cluster))
    assert kv is not None
    record = json.loads(kv.value)
    # As an older sparkd wrote it: the whole spec beside its hash. Stamps are ages.
    good = good_of(evil, None, -60.0).model_dump(mode="json")
    want = identity(desired)
    held = Rollout(
        id=9, started=time.time() - 60, began_at=-60.0, from_hash=good["hash"], to_hash=want,
        result="rolled_back", rolled_back="failed", rolled_back_at=-30.0,
    )  # fmt: skip
    record["memory"].update(last_good=good, rollout=held.model_dump(mode="json"), rollout_seq=9)
    since = time.time()
    answer = await admin.call(
        "kv/txn",
        {
            "success": [
                {
                    "request_put": {
                        "key": b64(memory_key(PREFIX, cluster)),
                        "value": b64(json.dumps(record).encode()),
                    }
                },
                {"request_delete_range": {"key": b64(f"{PREFIX}owner/{cluster}")}},
            ]
        },
    )
    assert answer.get("succeeded", True)

    def refusing() -> list[Instance]:
        return [
            instance
            for instance in (a, b)
            if any(
                e.get("event") == "memory_spec_refused" and e.get("cluster") == cluster
                for e in instance.events()
            )
        ]

    def planted() -> list[str]:
        ran = [r.command for r in seed_world.commands() if r.at >= since]
        return [c for c in ran if "--privileged" in c or "BROWSER" in c or "/:/host" in c]

    # Either the next owner refuses the record, or the hosts run what it planted.
    await eventually(lambda: bool(refusing() or planted()), within=90)
    owner = (refusing() or [a])[0]
    await two_more_looks(owner, within=30)
    assert planted() == []
    assert refusing() == [owner]
    status = (await owner.status())["clusters"][0]
    assert good["hash"] in str((status.get("blocked") or {}).get("reason")), status
    assert any(r.at >= since for r in seed_world.commands()), "no look after the plant"
    # Nothing was started or stopped on the planted memory's say: the latch holds.
    assert (await owner.status())["clusters"][0].get("blocked") is not None
    # etcd's memory no longer carries any spec's sections.
    kv, _ = await admin.get(memory_key(PREFIX, cluster))
    assert kv is not None
    stored = json.loads(kv.value)["memory"]
    assert stored.get("last_good") is None and stored.get("rollout") is None
