"""Names and spec hashes derived from the desired state.

A container sparkd creates carries `sparkd.spec`, the hash of everything that went into its
`docker run`; the serve process has its hash in a file beside its log. A different hash is drift.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from sparkd.settings import ClusterSpec, HostSpec

LABEL_CLUSTER = "sparkd.cluster"
LABEL_ROLE = "sparkd.role"
LABEL_SPEC = "sparkd.spec"


def container_name(cluster: ClusterSpec, host: HostSpec) -> str:
    return f"sparkd-{cluster.name}-ray-{host.role}"


def serve_log_path(cluster: ClusterSpec) -> str:
    return str(cluster.model.log_dir / "serve.log")


def serve_spec_path(cluster: ClusterSpec) -> str:
    return str(cluster.model.log_dir / "serve.spec")


def serve_pid_path(cluster: ClusterSpec) -> str:
    return str(cluster.model.log_dir / "serve.pid")


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


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
    return _digest(
        {
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


def model_spec_hash(cluster: ClusterSpec) -> str:
    return _model_hash(cluster, ray_spec_hash(cluster, cluster.head))


def model_spec_hashes(cluster: ClusterSpec) -> frozenset[str]:
    head = cluster.head
    return frozenset(
        _model_hash(cluster, _ray_hash(cluster, head, image)) for image in _image_spellings(cluster)
    )


def _model_hash(cluster: ClusterSpec, ray_hash: str) -> str:
    model = cluster.model
    return _digest(
        {
            "id": model.id,
            "port": model.port,
            "tp": model.tensor_parallel_size,
            "pp": model.pipeline_parallel_size,
            "extra_args": list(model.extra_args),
            "api_key": model.api_key_file is not None,
            "ray": ray_hash,
        }
    )


def normalize_image(image: str) -> str:
    """`repo` means `repo:latest`; a registry port (`host:5000/repo`) is not a tag."""
    last = image.rsplit("/", 1)[-1]
    if "@" in last or ":" in last:
        return image
    return f"{image}:latest"
