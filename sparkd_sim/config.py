"""The sparkd config (TOML) a world writes for itself: every host's SSH endpoint, its loopback
address as data-plane IP (so nothing can ever dial outside loopback), per-host log dirs."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from sparkd_sim.reference import INTERFACE, MODEL_ID, QWEN_IMAGE, STALE_UNITS

if TYPE_CHECKING:
    from sparkd_sim.world import World


def _q(value: str) -> str:
    # A TOML basic string is a JSON string for the characters used here.
    return json.dumps(value)


def render_config(world: World) -> str:
    out = [
        "# Written by the sparkd simulator for its world in " + str(world.directory),
        "[daemon]",
        'listen = "127.0.0.1:9810"',
        f"state_dir = {_q(str(world.directory / 'state'))}",
        'log_format = "auto"',
        "",
    ]
    clusters: dict[str, list[str]] = {}
    for host in world.hosts.values():
        clusters.setdefault(host.cluster, []).append(host.name)
    for cluster, names in clusters.items():
        members = [world.hosts[n] for n in names]
        head = members[0]
        out += [
            "[[clusters]]",
            f"name = {_q(cluster)}",
            "interval = 30.0",
            "probe_interval = 60.0",
            "recheck_interval = 5.0",
            "",
        ]
        for host in members:
            out += [
                "  [[clusters.hosts]]",
                f"  name = {_q(host.name)}",
                f"  address = {_q(host.address)}",
                f"  port = {host.port}",
                f"  role = {_q('head' if host is head else 'worker')}",
                f"  data_ip = {_q(host.state.data_ip)}",
                f"  interface = {_q(INTERFACE)}",
                "",
            ]
        out += [
            "  [clusters.ssh]",
            f"  user = {_q(world.user)}",
            f"  key_file = {_q(str(world.client_key_path))}",
            f"  known_hosts_file = {_q(str(world.known_hosts_path))}",
            "  connect_timeout = 10.0",
            "  command_timeout = 30.0",
            "",
            "  [clusters.ray]",
            f"  image = {_q(QWEN_IMAGE)}",
            f"  port = {world.ray_port}",
            f"  expected_gpus = {len(members)}",
            '  shm_size = "16g"',
            "  dashboard = true",
            f"  dashboard_port = {world.dashboard_port}",
            "  extra_docker_args = []",
            f"  mounts = [{_q(str(world.models_dir) + ':/models')}]",
            "  [clusters.ray.env]",
            f"  NCCL_SOCKET_IFNAME = {_q(INTERFACE)}",
            f"  GLOO_SOCKET_IFNAME = {_q(INTERFACE)}",
            '  RAY_memory_monitor_refresh_ms = "0"',
            "",
            "  [clusters.model]",
            f"  id = {_q(MODEL_ID)}",
            "  port = 30000",
            f"  tensor_parallel_size = {len(members)}",
            "  pipeline_parallel_size = 1",
            '  extra_args = ["--reasoning-parser", "qwen3", "--tool-call-parser", "qwen3_coder", '
            '"--enable-auto-tool-choice"]',
            # Every host of a cluster shares the head's log dir path: it is bind-mounted into
            # the head container at the same path, and only the head runs `vllm serve`.
            f"  log_dir = {_q(head.state.log_dir)}",
            "  load_stall = 600.0",
            "  load_timeout = 3600.0",
            "",
            "  [clusters.probe]",
            '  prompt = "Say hello in one sentence."',
            "  max_tokens = 50",
            "  temperature = 0.0",
            "  timeout = 30.0",
            "  stream = false",
            "",
            "  [clusters.cleanup]",
            "  units = [" + ", ".join(_q(u) for u in STALE_UNITS) + "]",
            '  container_patterns = ["glm-*"]',
            '  harmless_gpu_processes = ["Xorg", "gnome-shell"]',
            "",
            "  [clusters.policy]",
            "  failure_threshold = 3",
            "  budget = 3",
            "  backoff_initial = 30.0",
            "  backoff_max = 900.0",
            "  healthy_reset = 600.0",
            "  allow_kill_foreign_gpu = false",
            "",
        ]
    return "\n".join(out)
