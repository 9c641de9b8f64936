"""The compile cache against the simulated world: mounted, keyed, and pruned over SSH."""

from __future__ import annotations

import os
import pwd
import time
from pathlib import Path

from sparkd.core.reading import cache_entries
from sparkd.core.spec import container_name
from sparkd.shell.ssh import SshPool
from sparkd_sim.docker_images import image_id
from sparkd_sim.world import World
from tests.support.daemon import after_its_own_launch, controller, converge, eventually, mutations


async def test_containers_mount_the_cache_and_old_entries_are_pruned(
    seed_world: World, pool: SshPool, tmp_path: Path
) -> None:
    ctl = controller(seed_world, pool, tmp_path / "state")
    await converge(ctl)
    cluster = ctl.cluster
    root = cluster.model.cache_root
    runs = [r.command for r in mutations(seed_world) if r.command.startswith("docker run")]
    assert len(runs) == 2
    assert all(f" -v {root}:{root} " in run for run in runs)

    # The launch names its entry from the image the head container runs, and the model.
    head = seed_world.hosts[cluster.head.name].state
    box = head.container(container_name(cluster, cluster.head))
    assert box is not None
    key = cache_entries.cache_key(box.image_id or image_id(head, box.image), cluster.model.id)
    assert key is not None
    launches = [
        r.command
        for r in seed_world.commands(cluster.head.name)
        if r.source == "tool" and r.command.startswith("docker exec -d")
    ]
    assert len(launches) == 1
    assert launches[0].startswith(f"docker exec -d -e VLLM_CACHE_ROOT={root}/{key} ")

    # Old entries (another image, another model), a file of someone else's, the one in use.
    now = time.time()
    ages = {"aaaaaaaaaaaa-old-model": 100, "bbbbbbbbbbbb-old-model": 200, key: 300}
    ages |= {"cccccccccccc-" + cache_entries.model_slug(cluster.model.id): 400}
    # Written as the serve process writes them: by the container's user (the session's here).
    owner = pwd.getpwnam(seed_world.run_as) if seed_world.run_as else None
    for name, age in ages.items():
        (root / name / "torch_compile_cache").mkdir(parents=True, exist_ok=True)
        for path in (root / name, root / name / "torch_compile_cache"):
            if owner is not None:
                os.chown(path, owner.pw_uid, owner.pw_gid)
        os.utime(root / name, (now - age, now - age))
    (root / "notes.txt").write_text("the operator's own\n")
    since = time.time()

    async def pruned() -> bool:
        await ctl.cycle()
        return sorted(p.name for p in root.iterdir()) == sorted(
            ["aaaaaaaaaaaa-old-model", key, "notes.txt"]
        )

    await eventually(pruned, within=20, poll=0.1)
    removed = [
        r.command
        for r in seed_world.commands()
        if r.source == "tool"
        and r.at >= since
        and r.command.startswith("docker exec sparkd-")
        and " rm -rf -- " in r.command
    ]
    assert {c.rsplit("/", 1)[-1] for c in removed} == {
        "bbbbbbbbbbbb-old-model",
        "cccccccccccc-" + cache_entries.model_slug(cluster.model.id),
    }
    # Housekeeping restarts nothing.
    assert mutations(seed_world, since=since) == []
    plans = await converge(ctl)
    assert plans[-1].phase == "healthy"


async def test_an_upgrade_restarts_no_container_made_without_the_mount(
    healthy_world: World, pool: SshPool, tmp_path: Path
) -> None:
    """The world's containers were made as an older sparkd made them (labels of today's spec
    hash, no cache mount): with a cache_dir configured, nothing is restarted."""
    cache_dir = tmp_path / "vllm-cache"
    ctl = controller(
        healthy_world, pool, tmp_path / "state", cluster={"model": {"cache_dir": cache_dir}}
    )
    since = await after_its_own_launch(healthy_world)
    plans = await converge(ctl)
    assert all(p.actions == () for p in plans)
    assert plans[-1].phase == "healthy"
    assert mutations(healthy_world, since=since) == []
    for host in ctl.cluster.hosts:
        box = healthy_world.hosts[host.name].state.container(container_name(ctl.cluster, host))
        assert box is not None and box.running
        assert str(cache_dir) not in {m.source for m in box.mounts}
