"""The commands that change a host: cleanup, Ray's containers, the model's launch and its
signals, the cache's pruning, and the sudoers rules for the `sudo -n` among them."""

from __future__ import annotations

import shlex
from pathlib import Path

from sparkd.core.reading import cache_entries, parsers
from sparkd.core.reading.assemble import LAUNCH_MARKER
from sparkd.core.spec import (
    LABEL_CLUSTER,
    LABEL_ROLE,
    LABEL_SPEC,
    SHORT_ID_DIGITS,
    container_name,
    key_fingerprint,
    model_spec_hash,
    ray_spec_hash,
    serve_log_path,
    serve_pid_path,
    serve_spec_path,
)
from sparkd.model.cluster import ClusterSpec
from sparkd.model.spec import DEFAULT_DASHBOARD_PORT, HostSpec
from sparkd.shell.catalogue.remote import Remote, cmd, sudo, timed

API_KEY_FILE = "api_key"
# Where the launch puts the image's digits in the cache entry's name (see start_model).
CACHE_STAND_IN = "sparkd-cache-image"


def stop_unit(cluster: ClusterSpec, unit: str, seconds: float) -> Remote:
    stop = cmd(sudo(cluster, ["systemctl", "stop", "--", unit]), seconds)
    disable = cmd(sudo(cluster, ["systemctl", "disable", "--", unit]), seconds)
    return Remote("stop_unit", f"{stop} && {disable}", mutating=True)


def remove_container(name: str, seconds: float) -> Remote:
    return Remote("remove_container", cmd(["docker", "rm", "-f", "--", name], seconds), True)


def ray_command(cluster: ClusterSpec, host: HostSpec) -> list[str]:
    ray = cluster.ray
    if host.role == "head":
        argv = [
            "ray", "start", "--block", "--head",
            f"--node-ip-address={host.ip}", f"--port={ray.port}",
        ]  # fmt: skip
        if ray.dashboard:
            argv.append("--dashboard-host=127.0.0.1")
            if ray.dashboard_port != DEFAULT_DASHBOARD_PORT:
                argv.append(f"--dashboard-port={ray.dashboard_port}")
        else:
            argv.append("--include-dashboard=false")
        return argv
    return [
        "ray", "start", "--block",
        f"--address={cluster.head.ip}:{ray.port}", f"--node-ip-address={host.ip}",
    ]  # fmt: skip


def docker_run_argv(cluster: ClusterSpec, host: HostSpec) -> list[str]:
    """Like vLLM's run_cluster.sh and NVIDIA's Spark playbook, plus sparkd's labels."""
    ray = cluster.ray
    argv = ["docker", "run", "-d", "--name", container_name(cluster, host)]
    argv += ["--label", f"{LABEL_CLUSTER}={cluster.name}"]
    argv += ["--label", f"{LABEL_ROLE}={host.role}"]
    argv += ["--label", f"{LABEL_SPEC}={ray_spec_hash(cluster, host)}"]
    for key, value in sorted(ray.env.items()):
        argv += ["-e", f"{key}={value}"]
    # Per node, as vLLM's multi-node launcher sets it: without it vLLM binds its placement
    # group to the address of the default route (the management network), unknown to Ray.
    argv += ["-e", f"VLLM_HOST_IP={host.ip}"]
    for mount in ray.mounts:
        argv += ["-v", mount]
    if host.role == "head":
        log_dir = str(cluster.model.log_dir)
        argv += ["-v", f"{log_dir}:{log_dir}"]
    # Not part of the spec hash: containers made before the mount existed are not drift; it
    # takes effect when a container is next created for another reason.
    cache_root = str(cluster.model.cache_root)
    argv += ["-v", f"{cache_root}:{cache_root}"]
    argv += ["--network", "host", "--gpus", "all", "--shm-size", ray.shm_size]
    argv += ["--restart=no", "--pull=never", *ray.extra_docker_args, ray.image]
    return argv + ray_command(cluster, host)


def own_dir(path: str, seconds: float) -> str:
    """`path` as a 0700 directory of the SSH user's own, created if missing; a symlink or a
    directory of another user's fails: whoever can write there can plant a symlink that
    receives the API key."""
    d = shlex.quote(path)
    refuse = shlex.quote(f"sparkd: {path} is a symlink or not the SSH user's own directory")
    return (
        f"{cmd(['mkdir', '-p', '-m', '700', '--', path], seconds)} && "
        f"{{ {{ [ ! -L {d} ] && [ -O {d} ]; }} || {{ echo {refuse} >&2; false; }}; }} && "
        f"{cmd(['chmod', '700', '--', path], seconds)}"
    )


def _write_new(target: Path, producer: str, seconds: float) -> str:
    """`producer`'s output into `target` without following a symlink there: a fresh 0600 file
    beside it (mktemp), renamed over whatever `target` was."""
    temp = cmd(["mktemp", str(target.parent / f".{target.name}.XXXXXX")], seconds)
    move = shlex.join(timed(["mv", "-fT", "--", "$t", str(target)], seconds))
    remove = shlex.join(timed(["rm", "-f", "--", "$t"], seconds))
    # "$t" is the temporary file's name: quoted for the shell, not as the literal text.
    move, remove = (text.replace("'$t'", '"$t"') for text in (move, remove))
    return f't="$({temp})" && {{ {{ {producer} > "$t" && {move}; }} || {{ {remove}; false; }}; }}'


def start_ray(cluster: ClusterSpec, host: HostSpec, seconds: float) -> Remote:
    """Start the node's container; a container holding the name (exited or not) goes first."""
    name = container_name(cluster, host)
    remove = cmd(["docker", "rm", "-f", "--", name], seconds)
    run = cmd(docker_run_argv(cluster, host), seconds)
    prepare = ""
    if host.role == "head":
        prepare = own_dir(str(cluster.model.log_dir), seconds) + " && "
    # Made by the SSH user before `docker run` would make it root's.
    prepare += own_dir(str(cluster.model.cache_root), seconds) + " && "
    return Remote("start_ray", f"{prepare}{{ {remove} >/dev/null 2>&1; {run}; }}", mutating=True)


def serve_argv(cluster: ClusterSpec) -> list[str]:
    model = cluster.model
    return [
        "vllm", "serve", model.id,
        "--port", str(model.port),
        "--tensor-parallel-size", str(model.tensor_parallel_size),
        "--pipeline-parallel-size", str(model.pipeline_parallel_size),
        "--distributed-executor-backend", "ray",
        *model.extra_args,
    ]  # fmt: skip


def serve_shell(cluster: ClusterSpec) -> str:
    """The inner `sh -c` text: exec so the serve process replaces the shell (docker top shows
    it, signals reach it), output appended to the bind-mounted log. The API key is read from a
    0600 file inside the shell, so it never appears on any command line."""
    text = f"exec {shlex.join(serve_argv(cluster))} >>{shlex.quote(serve_log_path(cluster))} 2>&1"
    if cluster.model.api_key_file is not None:
        key = shlex.quote(str(cluster.model.log_dir / API_KEY_FILE))
        text = f'VLLM_API_KEY="$(cat {key})"; export VLLM_API_KEY; {text}'
    # The PID as the container sees it: stopping the model then needs only `docker exec`,
    # not root on the host.
    return f"echo $$ > {shlex.quote(serve_pid_path(cluster))}; {text}"


def signal_serve(cluster: ClusterSpec, signal: str, seconds: float) -> Remote:
    """Signal `vllm serve` inside the head container by its recorded PID, after checking the
    PID still is a vLLM process (a stale file must never hit a reused PID)."""
    pidfile = shlex.quote(serve_pid_path(cluster))
    inner = (
        f'p="$(cat {pidfile} 2>/dev/null)"; [ -n "$p" ] && '
        f'grep -q vllm "/proc/$p/cmdline" 2>/dev/null && kill -{signal} "$p"'
    )
    head = container_name(cluster, cluster.head)
    return Remote("signal_serve", cmd(["docker", "exec", head, "sh", "-c", inner], seconds), True)


def start_model(cluster: ClusterSpec, seconds: float, api_key: str | None = None) -> Remote:
    """Record the spec hash beside the log, store the API key (from stdin), launch detached."""
    log_dir = str(cluster.model.log_dir)
    spec = serve_spec_path(cluster)
    head = container_name(cluster, cluster.head)
    key = key_fingerprint(api_key) if api_key is not None else None
    spec_hash = shlex.quote(model_spec_hash(cluster, key))
    log = shlex.quote(serve_log_path(cluster))
    not_linked = shlex.quote(f"sparkd: {serve_log_path(cluster)} is a symlink")
    steps = [
        own_dir(log_dir, seconds),
        _write_new(Path(spec), f"printf '%s\\n' {spec_hash}", seconds),
        f"{{ [ ! -L {log} ] || {{ echo {not_linked} >&2; false; }}; }}",
        f"printf '%s %s ===\\n' {shlex.quote(LAUNCH_MARKER)} {spec_hash} >> {log}",
    ]
    if api_key is not None:
        target = cluster.model.log_dir / API_KEY_FILE
        steps.append(_write_new(target, shlex.join(timed(["cat"], seconds)), seconds))
    # The cache entry is named on the host from the image the head container runs (as
    # core.reading.cache_entries.cache_key names it): the text stays the same whatever the image.
    inspect = ["docker", "inspect", "--format", "{{.Image}}", "--", head]
    digits = f"%.{SHORT_ID_DIGITS}s"
    steps.append(f'i="$({cmd(inspect, seconds)})" && k="$(printf {digits} "${{i#sha256:}}")"')
    steps.append('case "$k" in *[!0-9a-f]*|"") false ;; esac')
    root = cluster.model.cache_root
    env = f"VLLM_CACHE_ROOT={root}/{CACHE_STAND_IN}-{cache_entries.model_slug(cluster.model.id)}"
    exec_argv = ["docker", "exec", "-d", "-e", env, head, "sh", "-c", serve_shell(cluster)]
    launch = cmd(exec_argv, seconds)
    quoted = shlex.quote(env)
    left, right = (shlex.quote(part) for part in env.split(CACHE_STAND_IN))
    steps.append(launch.replace(quoted, f'{left}"$k"{right}'))
    return Remote("start_model", " && ".join(steps), mutating=True, stdin=api_key)


def prune_cache(cluster: ClusterSpec, host: HostSpec, entry: str, seconds: float) -> Remote:
    """Remove one compile cache entry (core.judging.cache.judge_cache decides which); gone already
    is done. Inside the host's Ray container, which mounts the cache at the same path: vLLM writes
    the entry as the container's root, so the SSH user could not remove it."""
    if not cache_entries.ENTRY.fullmatch(entry):
        raise ValueError(f"not a cache entry of sparkd's naming: {entry!r}")
    target = str(cluster.model.cache_root / entry)
    argv = ["docker", "exec", container_name(cluster, host), "rm", "-rf", "--", target]
    return Remote("prune_cache", cmd(argv, seconds), mutating=True)


def kill_process(cluster: ClusterSpec, pid: int, signal: str, seconds: float) -> Remote:
    if not parsers.is_pid(pid):
        raise ValueError(f"not a PID sparkd signals: {pid}")
    # Through sudo or env, the kill program runs (real, or the simulator's), never the builtin.
    if cluster.ssh.sudo:
        argv = ["sudo", "-n", "kill", f"-{signal}", str(pid)]
    else:
        argv = ["env", "kill", f"-{signal}", str(pid)]
    return Remote("kill_process", cmd(argv, seconds), mutating=True)


# Where sudo finds the tools `sudo -n` runs (Ubuntu's merged /usr, DGX OS included).
SUDO_PATHS = {"systemctl": "/usr/bin/systemctl", "kill": "/usr/bin/kill"}
# A PID sparkd may signal, as a POSIX extended and a Python regular expression: decimal with no
# leading zero, never 0 or 1, at most 7 digits. procps `kill` reads a longer number modulo 2^32
# (4294967295 is -1, every process; 4294967297 is PID 1); 7 digits hold every PID the kernel
# gives (below pid_max, at most 2^22) and none of those.
PID_DIGITS = "[2-9]|[1-9][0-9]{1,6}"
# sudoers (1.9.10 and later) matches arguments by a regular expression between ^ and $: a
# signal sparkd sends, and one PID as above. Which PIDs are GPU compute processes sudo cannot
# know: sparkd checks that against `nvidia-smi` itself.
SUDOERS_KILL = f"^-(TERM|KILL) ({PID_DIGITS})$"
