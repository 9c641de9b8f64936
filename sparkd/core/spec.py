"""Names and spec hashes derived from the desired cluster.

A container sparkd creates carries `sparkd.spec`, the hash of everything that went into its
`docker run`; the serve process has its hash in a file beside its log. A different hash is drift.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sparkd.model.cluster import ClusterSpec
from sparkd.model.memory import GoodSpec
from sparkd.model.spec import DEFAULT_DASHBOARD_PORT, HostSpec, ModelSpec, RaySpec

LABEL_CLUSTER = "sparkd.cluster"
LABEL_ROLE = "sparkd.role"
LABEL_SPEC = "sparkd.spec"
# Every container sparkd makes is named `sparkd-CLUSTER-...` (and labelled LABEL_CLUSTER).
CONTAINER_PREFIX = "sparkd-"
# Docker's short image ID: the first hex digits of `sha256:...`, as `docker images` shows it.
SHORT_ID_DIGITS = 12
# Hex digits of a spec hash (the container label, the file beside the serve log).
SPEC_DIGITS = 12


def container_prefix(cluster: ClusterSpec) -> str:
    """What the names of the cluster's containers start with."""
    return f"{CONTAINER_PREFIX}{cluster.name}-"


def container_name(cluster: ClusterSpec, host: HostSpec) -> str:
    return f"{container_prefix(cluster)}ray-{host.role}"


def short_image_id(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:SHORT_ID_DIGITS]


def serve_log_path(cluster: ClusterSpec) -> str:
    return str(cluster.model.log_dir / "serve.log")


def serve_spec_path(cluster: ClusterSpec) -> str:
    return str(cluster.model.log_dir / "serve.spec")


def serve_pid_path(cluster: ClusterSpec) -> str:
    return str(cluster.model.log_dir / "serve.pid")


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:SPEC_DIGITS]


def ray_spec_hash(cluster: ClusterSpec, host: HostSpec) -> str:
    """The hash a new container is labelled with."""
    return _ray_hash(cluster, host, normalize_image(cluster.ray.image))


def ray_spec_hashes(cluster: ClusterSpec, host: HostSpec) -> frozenset[str]:
    """Every hash that means "as desired": `repo` and `repo:latest` are one image (a re-pulled
    tag is judged by image ID), and labels written before the name was normalized still match,
    so an upgrade of sparkd restarts nothing."""
    return frozenset(_ray_hash(cluster, host, image) for image in _image_spellings(cluster))


def _image_spellings(cluster: ClusterSpec) -> list[str]:
    image = normalize_image(cluster.ray.image)
    return list(dict.fromkeys([image, cluster.ray.image, image.removesuffix(":latest")]))


def _ray_hash(cluster: ClusterSpec, host: HostSpec, image: str) -> str:
    ray = cluster.ray
    # Only a port other than Ray's default is part of the hash: labels written before it
    # could be set still match.
    moved = ray.dashboard_port != DEFAULT_DASHBOARD_PORT
    port = {"dashboard_port": ray.dashboard_port} if moved else {}
    return _digest(
        {
            **port,
            "image": image,
            "port": ray.port,
            "env": dict(sorted(ray.env.items())),
            "shm_size": ray.shm_size,
            "extra_docker_args": list(ray.extra_docker_args),
            "mounts": list(ray.mounts),
            "dashboard": ray.dashboard,
            "role": host.role,
            "data_ip": host.ip,
            "head_ip": cluster.head.ip,
            "log_dir": str(cluster.model.log_dir) if host.role == "head" else None,
        }
    )


def key_fingerprint(secret: str) -> str:
    """A short hash of the API key, never the key: part of the model's spec, so a rotated key
    file is drift and rolls out as a model restart."""
    return hashlib.sha256(b"sparkd api key\0" + secret.encode()).hexdigest()[:16]


def model_spec_hash(cluster: ClusterSpec, key: str | None = None) -> str:
    """`key` is the API key's fingerprint as read now (`key_fingerprint`); None when no key file
    is configured."""
    return _model_hash(cluster, ray_spec_hash(cluster, cluster.head), key)


def model_spec_hashes(cluster: ClusterSpec, key: str | None = None) -> frozenset[str]:
    """Every hash that means "as desired". A model launched before key fingerprints were part
    of the spec (its hash holds `true`) still matches: upgrading sparkd restarts nothing; such a
    launch notices a rotated key at its next launch."""
    head = cluster.head
    keys = {key, None}
    return frozenset(
        _model_hash(cluster, _ray_hash(cluster, head, image), k)
        for image in _image_spellings(cluster)
        for k in keys
    )


def _model_hash(cluster: ClusterSpec, ray_hash: str, key: str | None) -> str:
    model = cluster.model
    # Without a key file the hash is what it always was; with one, the key's fingerprint (a
    # caller that does not know the key gets the older `true`).
    api_key: str | bool = model.api_key_file is not None
    if api_key and key is not None:
        api_key = key
    return _digest(
        {
            "id": model.id,
            "port": model.port,
            "tp": model.tensor_parallel_size,
            "pp": model.pipeline_parallel_size,
            "extra_args": list(model.extra_args),
            "api_key": api_key,
            "ray": ray_hash,
        }
    )


def normalize_image(image: str) -> str:
    """`repo` means `repo:latest`; a registry port (`host:5000/repo`) is not a tag."""
    last = image.rsplit("/", 1)[-1]
    if "@" in last or ":" in last:
        return image
    return f"{image}:latest"


# A spec by its model spec hash without the key: what the running serve carries beside its log,
# stable across sparkd upgrades, a key rotation aside (rollouts and last-good specs use it).
def identity(spec: ClusterSpec) -> str:
    return model_spec_hash(spec)


def good_of(spec: ClusterSpec, key: str | None, at: float) -> GoodSpec:
    return GoodSpec(
        hash=identity(spec),
        ray=spec.ray.model_dump(mode="json"),
        model=spec.model.model_dump(mode="json"),
        key=key,
        at=at,
    )


def spec_of(desired: ClusterSpec, good: GoodSpec) -> ClusterSpec:
    """The desired cluster with the last-good Ray and model sections (hosts, SSH and policy as
    configured now)."""
    ray = RaySpec.model_validate(good.ray)
    return desired.model_copy(update={"ray": ray, "model": ModelSpec.model_validate(good.model)})
