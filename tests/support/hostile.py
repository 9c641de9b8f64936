"""The specs an attacker plants: what a writer of the etcd prefix or the state dir would like a
rollback to launch."""

from __future__ import annotations

from sparkd.model.cluster import ClusterSpec


def flagged(cluster: ClusterSpec, *flags: str) -> ClusterSpec:
    """`cluster` with `flags` added to the model's arguments: an honest other spec."""
    model = cluster.model.model_copy(update={"extra_args": (*cluster.model.extra_args, *flags)})
    return cluster.model_copy(update={"model": model})


def hostile(cluster: ClusterSpec) -> ClusterSpec:
    """Ray run `--privileged` with the host's root mounted, and a command Python runs when
    `ray start` starts (its `webbrowser` module reads `BROWSER` as a command line)."""
    ray = cluster.ray.model_copy(
        update={
            "extra_docker_args": ("--privileged", "-v", "/:/host"),
            "env": {**cluster.ray.env, "BROWSER": "/bin/sh -c 'id > /host/tmp/x' #%s"},
        }
    )
    return cluster.model_copy(update={"ray": ray})
