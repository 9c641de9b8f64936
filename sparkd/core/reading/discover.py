"""`sparkd init`: a running hand-made deployment, read, as a commented config draft.

Pure: the reads' text in (`docker inspect`, `docker top`, `nvidia-smi`, `systemctl
list-unit-files`, `ip -j addr`), TOML text out. Every value in the draft carries a comment
naming where it came from; what cannot be told is said in comments, with the choices. No secret
is ever written: an API key becomes an `api_key_file` path for the operator to create.

`docker inspect` prints the engine's container JSON as it is (docker/cli
`cli/command/inspect/inspector.go`, `NewIndentedInspector`: the raw answers joined in an array
and `json.Indent`ed by four spaces; read at commit 28064c20); its fields are moby's
`api/types/container/container.go` `InspectResponse` (`ContainerJSONBase` embedded, `Mounts`,
`Config`, `NetworkSettings`; read at commit 927e07e4). Only fields every engine since API 1.41
(docker 20.10) prints are read: tests/fixtures/docker-real/init.jsonl is a real engine's.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkd.core.reading.parsers import parse_compute_apps
from sparkd.model.fields import SECRET_NAME
from sparkd.model.spec import PROTECTED_UNITS

# Docker's own rule for a container name (daemon/names.go `RestrictedNamePattern`).
CONTAINER_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,254}$")
# What looks like a model server in a unit's or container's name, image or command.
MODEL_SERVER = re.compile(
    r"vllm|sglang|llama|ollama|text-generation|tgi|triton|lmdeploy|tensorrt|trtllm|ray|"
    r"glm|qwen|mistral|model|inference|serve",
    re.I,
)
# `vllm serve`'s options sparkd sets from its own keys (model.*), and the API key.
TP_FLAGS = ("--tensor-parallel-size", "-tp")
PP_FLAGS = ("--pipeline-parallel-size", "-pp")
API_KEY_FLAG = "--api-key"
BACKEND_FLAG = "--distributed-executor-backend"
SUGGESTED_KEY_FILE = "/etc/sparkd/vllm_api_key"
# Env that sparkd sets per host itself (ray.env refuses it).
PER_HOST_ENV = ("VLLM_HOST_IP",)
# A comment quotes at most this much of what a host said.
QUOTE_LIMIT = 160


@dataclass(frozen=True)
class InspectedContainer:
    """What `docker inspect` says of one container, the parts a config is made of."""

    name: str
    image: str
    running: bool
    restart: str
    env: tuple[tuple[str, str], ...]
    mounts: tuple[str, ...]
    network: str
    shm_size: int | None
    gpus: bool
    argv: tuple[str, ...]
    privileged: bool = False
    ipc: str = ""


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _dict(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def parse_inspect(text: str) -> tuple[InspectedContainer, ...]:
    """`docker inspect NAME...` (no `--format`): a JSON array of the engine's container objects.
    Anything else (not JSON, an image's object) is left out."""
    try:
        document = json.loads(text)
    except ValueError:
        return ()
    found: list[InspectedContainer] = []
    for item in _list(document):
        entry = _dict(item)
        config, host, state = (
            _dict(entry.get("Config")),
            _dict(entry.get("HostConfig")),
            _dict(entry.get("State")),
        )
        name = _str(entry.get("Name")).lstrip("/")
        if not CONTAINER_NAME.match(name) or not config:
            continue
        env: list[tuple[str, str]] = []
        for pair in _list(config.get("Env")):
            key, eq, value = _str(pair).partition("=")
            if eq and key:
                env.append((key, value))
        mounts = []
        for mount in _list(entry.get("Mounts")):
            m = _dict(mount)
            # Volumes and tmpfs are Docker's own; a config names host paths only.
            if m.get("Type") != "bind":
                continue
            source, target = _str(m.get("Source")), _str(m.get("Destination"))
            if source.startswith("/") and target.startswith("/"):
                mounts.append(f"{source}:{target}" + ("" if m.get("RW", True) else ":ro"))
        requests = _list(host.get("DeviceRequests"))
        gpus = _str(host.get("Runtime")) == "nvidia" or any(
            "gpu" in cap for r in requests for cap in _list(_dict(r).get("Capabilities"))
        )
        shm = host.get("ShmSize")
        # `Path` and `Args` are the process the container runs: entrypoint and command joined.
        argv = [_str(entry.get("Path")), *(_str(a) for a in _list(entry.get("Args")))]
        found.append(
            InspectedContainer(
                name=name,
                image=_str(config.get("Image")),
                running=state.get("Running") is True,
                restart=_str(_dict(host.get("RestartPolicy")).get("Name")) or "no",
                env=tuple(env),
                mounts=tuple(mounts),
                network=_str(host.get("NetworkMode")),
                shm_size=shm if isinstance(shm, int) and shm > 0 else None,
                gpus=gpus,
                argv=tuple(a for a in argv if a),
                privileged=host.get("Privileged") is True,
                ipc=_str(host.get("IpcMode")),
            )
        )
    return tuple(found)


def parse_image_env(text: str) -> tuple[str, ...] | None:
    """`docker inspect --type image --format '{{json .Config.Env}}' IMAGE`: the image's own
    `KEY=VALUE`s (a container's env minus these is what its `docker run` added)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if value is None:
        return ()
    if not isinstance(value, list):
        return None
    return tuple(v for v in value if isinstance(v, str))


def parse_unit_files(text: str) -> tuple[str, ...]:
    """`systemctl list-unit-files --type=service --state=enabled --no-legend --no-pager`: one
    `UNIT STATE [PRESET]` a line (systemd 252 and later print the preset too)."""
    names = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1] == "enabled" and re.match(r"^[\w@.:-]+$", parts[0]):
            names.append(parts[0])
    return tuple(names)


def parse_addresses(text: str) -> dict[str, tuple[str, ...]]:
    """`ip -j addr show`: each interface's IPv4 addresses (loopback left out)."""
    try:
        links = json.loads(text)
    except ValueError:
        return {}
    found: dict[str, tuple[str, ...]] = {}
    for link in _list(links):
        entry = _dict(link)
        name = _str(entry.get("ifname"))
        if not name or name == "lo":
            continue
        found[name] = tuple(
            _str(_dict(a).get("local"))
            for a in _list(entry.get("addr_info"))
            if _dict(a).get("family") == "inet" and _str(_dict(a).get("local"))
        )
    return found


def words(argv: Sequence[str]) -> list[str]:
    """A command line's words, a `sh -c 'SCRIPT'` script split into its own words, stopping
    at the first shell operator (`exec vllm serve ... >>log 2>&1` is vLLM's words only)."""
    flat: list[str] = []
    for arg in argv:
        if any(c.isspace() for c in arg):
            try:
                flat.extend(shlex.split(arg))
            except ValueError:
                flat.extend(arg.split())
        else:
            flat.append(arg)
    return flat


def _operator(word: str) -> bool:
    return word in ("&&", "||", ";", "|", "&") or bool(re.match(r"^[0-9]*[<>]", word))


def _command_after(argv: Sequence[str], program: str, verb: str) -> list[str] | None:
    flat = words(argv)
    for i, word in enumerate(flat[:-1]):
        if (word == program or word.endswith("/" + program)) and flat[i + 1] == verb:
            rest: list[str] = []
            for item in flat[i + 2 :]:
                if _operator(item):
                    break
                rest.append(item)
            return rest
    return None


def _options(args: Sequence[str]) -> list[tuple[str, str | None]]:
    """`--flag=value`, `--flag value` and bare `--flag`, in order; a positional has flag ''."""
    found: list[tuple[str, str | None]] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("-"):
            flag, eq, value = arg.partition("=")
            if eq:
                found.append((flag, value))
            elif i + 1 < len(args) and not args[i + 1].startswith("-"):
                found.append((flag, args[i + 1]))
                i += 1
            else:
                found.append((flag, None))
        else:
            found.append(("", arg))
        i += 1
    return found


@dataclass(frozen=True)
class RayStart:
    head: bool
    node_ip: str | None
    address: str | None  # a worker's `--address HEAD:PORT`
    port: int | None
    dashboard_port: int | None
    text: str


def ray_start(argv: Sequence[str]) -> RayStart | None:
    rest = _command_after(argv, "ray", "start")
    if rest is None:
        return None
    # Ray's flags take `--flag value` or `--flag=value`; `--head` and `--block` none.
    bare = {"--head", "--block", "--disable-usage-stats", "--include-dashboard"}
    values: dict[str, str] = {}
    head = False
    i = 0
    while i < len(rest):
        flag, eq, value = rest[i].partition("=")
        if flag in bare:
            head = head or flag == "--head"
        elif eq:
            values[flag] = value
        elif flag.startswith("--") and i + 1 < len(rest):
            values[flag] = rest[i + 1]
            i += 1
        i += 1
    port, dash = values.get("--port", ""), values.get("--dashboard-port", "")
    return RayStart(
        head=head,
        node_ip=values.get("--node-ip-address"),
        address=values.get("--address"),
        port=int(port) if port.isdigit() else None,
        dashboard_port=int(dash) if dash.isdigit() else None,
        text=shlex.join(["ray", "start", *rest]),
    )


@dataclass(frozen=True)
class VllmServe:
    model: str | None
    port: int | None
    tensor_parallel: int | None
    pipeline_parallel: int | None
    api_key: bool
    extra_args: tuple[str, ...]
    text: str  # with any API key replaced
    # Other secret-like options (`--hf-token`), left out of extra_args, by name.
    secrets: tuple[str, ...] = ()
    # `--distributed-executor-backend` when not `ray` (sparkd always passes `ray`).
    backend: str | None = None


def vllm_serve(argv: Sequence[str]) -> VllmServe | None:
    rest = _command_after(argv, "vllm", "serve")
    if rest is None:
        return None
    model: str | None = None
    port = tp = pp = None
    api_key = False
    extra: list[str] = []
    shown: list[str] = []
    secrets: list[str] = []
    backend: str | None = None
    for flag, value in _options(rest):
        if flag == "":
            if model is None and value is not None:
                model = value
            elif value is not None:
                extra.append(value)
            shown.append(value or "")
            continue
        if flag == API_KEY_FLAG:
            api_key = True
            shown += [flag, "<secret left out>"]
            continue
        if SECRET_NAME.search(flag) and value is not None:
            secrets.append(flag)
            shown += [flag, "<secret left out>"]
            continue
        shown += [flag] if value is None else [flag, value]
        number = int(value) if value is not None and value.isdigit() else None
        if flag == "--model" and value is not None:
            model = value
        elif flag == "--port" and number is not None:
            port = number
        elif flag in TP_FLAGS and number is not None:
            tp = number
        elif flag in PP_FLAGS and number is not None:
            pp = number
        elif flag == BACKEND_FLAG:
            # sparkd passes `--distributed-executor-backend ray` itself.
            backend = value if value != "ray" else None
        else:
            extra += [flag] if value is None else [flag, value]
    text = shlex.join(["vllm", "serve", *shown])
    return VllmServe(model, port, tp, pp, api_key, tuple(extra), text, tuple(secrets), backend)


@dataclass(frozen=True)
class HostReads:
    """One host's answers to init's reads (None: the read failed, with the reason in `errors`)."""

    address: str
    port: int
    inspect: str | None = None
    image_env: Mapping[str, str] = field(default_factory=dict)  # image -> its env JSON
    top: Mapping[str, str] = field(default_factory=dict)  # container -> `docker top -eo pid,args`
    gpu_apps: str | None = None
    unit_files: str | None = None
    addresses: str | None = None
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class Options:
    user: str
    key_file: str
    known_hosts_file: str
    cluster: str = "sparks"


# --- the draft -------------------------------------------------------------------------------


def _quote(text: str) -> str:
    """A TOML basic string: JSON's escapes, which TOML shares, plus DEL (TOML forbids it raw)."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def said(text: str) -> str:
    """What a host said, safe inside a comment: one line, no control character, bounded."""
    flat = re.sub(
        r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]", " ", text
    )
    return flat if len(flat) <= QUOTE_LIMIT else flat[: QUOTE_LIMIT - 1] + "…"


def _array(items: Sequence[str]) -> str:
    return "[" + ", ".join(_quote(i) for i in items) + "]"


def _size(value: int) -> str:
    for unit, scale in (("g", 1 << 30), ("m", 1 << 20), ("k", 1 << 10)):
        if value % scale == 0:
            return f"{value // scale}{unit}"
    return str(value)


@dataclass
class _Host:
    reads: HostReads
    containers: tuple[InspectedContainer, ...]
    ray: tuple[InspectedContainer, RayStart] | None = None
    serve: tuple[InspectedContainer, VllmServe, str] | None = None
    gpu_containers: tuple[str, ...] = ()
    foreign_gpu: tuple[str, ...] = ()


def _host_name(index: int) -> str:
    return f"spark-{chr(ord('a') + index)}" if index < 26 else f"spark-{index + 1}"


def parse_top(text: str) -> tuple[tuple[int, str], ...]:
    """`docker top NAME -eo pid,args`: a `PID COMMAND` header, then each process's PID and its
    whole command line (spaces in it kept)."""
    lines = text.splitlines()
    if not lines or lines[0].split() != ["PID", "COMMAND"]:
        return ()
    rows = []
    for line in lines[1:]:
        parts = line.split(None, 1)
        if len(parts) == 2 and parts[0].isascii() and parts[0].isdigit() and len(parts[0]) < 9:
            rows.append((int(parts[0]), parts[1]))
    return tuple(rows)


def _serve_in(
    c: InspectedContainer, rows: Sequence[tuple[int, str]]
) -> tuple[VllmServe, str] | None:
    """The `vllm serve` a container runs: an exec'd one (in its processes), else its command.
    The `sh -c` around a serve that was not `exec`ed has the same words: vLLM's own first."""
    found: tuple[VllmServe, str] | None = None
    for pid, args in rows:
        argv = args.split()
        serve = vllm_serve(argv)
        if serve is not None and (found is None or not _is_shell(argv)):
            found = (serve, f"docker top {c.name}: PID {pid}")
    if found is None:
        serve = vllm_serve(c.argv)
        if serve is not None:
            found = (serve, f"docker inspect {c.name}: its command")
    return found


def _study(reads: HostReads) -> _Host:
    containers = parse_inspect(reads.inspect or "")
    host = _Host(reads, containers)
    owners: dict[int, str] = {}
    tops = {c.name: parse_top(reads.top.get(c.name, "")) for c in containers}
    for c in containers:
        for pid, _ in tops[c.name]:
            owners[pid] = c.name
        start = ray_start(c.argv)
        # The head's Ray container first, when a host has several.
        if start is not None and (host.ray is None or (start.head and not host.ray[1].head)):
            host.ray = (c, start)
    # The deployment's serve runs in its Ray container: a serve in any other container is
    # another server (a cleanup target when it restarts by itself), never the deployment's.
    if host.ray is not None:
        found = _serve_in(host.ray[0], tops[host.ray[0].name])
        if found is not None:
            host.serve = (host.ray[0], found[0], found[1])
    apps = parse_compute_apps(reads.gpu_apps or "", owners)
    host.gpu_containers = tuple(sorted({a.container for a in apps if a.container is not None}))
    host.foreign_gpu = tuple(sorted({a.name for a in apps if a.container is None}))
    return host


def _is_shell(argv: Sequence[str]) -> bool:
    return bool(argv) and argv[0].rsplit("/", 1)[-1] in ("sh", "bash", "dash") and "-c" in argv


def _interface(
    addresses: Mapping[str, tuple[str, ...]], ip: str | None, env: Mapping[str, str]
) -> tuple[str | None, str, tuple[str, ...]]:
    """The data interface: the one carrying `ip`, else NCCL's pin; (name, why, choices)."""
    if ip is not None:
        holding = [name for name, ips in addresses.items() if ip in ips]
        if len(holding) == 1:
            return holding[0], f"`ip -j addr`: the interface carrying {ip}", ()
    pinned = env.get("NCCL_SOCKET_IFNAME", "")
    choices = tuple(sorted(n for n, ips in addresses.items() if ips))
    if pinned and re.match(r"^[A-Za-z0-9_.:@-]{1,15}$", pinned) and pinned in addresses:
        return pinned, "the containers' NCCL_SOCKET_IFNAME", ()
    return None, "", choices


def draft(options: Options, hosts: Sequence[HostReads]) -> str:
    """The config draft for `hosts` (in the order given), as TOML text with comments."""
    studied = [_study(h) for h in hosts]
    out: list[str] = [
        "# sparkd configuration drafted by `sparkd init` from the running deployment.",
        "# Every value says where it came from; read each one, then `sparkd check-config`.",
        "# Lines starting with `# CHECK:` are what init could not tell on its own.",
        "",
        "[daemon]",
        'listen = "127.0.0.1:9810"',
        'state_dir = "/var/lib/sparkd"',
        "",
        "[[clusters]]",
        f"name = {_quote(options.cluster)}",
    ]
    checks: list[str] = []
    for h in studied:
        for error in h.reads.errors:
            checks.append(f"{h.reads.address}: {error}")
    heads = [h for h in studied if h.ray is not None and h.ray[1].head]
    if not any(h.ray is not None for h in studied):
        checks.append(
            "no container runs `ray start` on any host: no running deployment was found. "
            "Fill in ray.image, the hosts' role/data_ip/interface and the model by hand."
        )
    elif len(heads) != 1:
        checks.append(
            f"{len(heads)} hosts run `ray start --head` "
            f"({', '.join(h.reads.address for h in heads) or 'none'}): "
            'set exactly one role = "head"'
        )
    serving = [h for h in studied if h.serve is not None]
    for index, h in enumerate(studied):
        out += _host_lines(index, h, heads, checks)
    out += [
        "",
        "  [clusters.ssh]",
        f"  user = {_quote(options.user)}",
        f"  key_file = {_quote(options.key_file)}",
        f"  known_hosts_file = {_quote(options.known_hosts_file)}",
    ]
    out += _ray_lines(studied, heads, checks)
    out += _model_lines(studied, serving, checks)
    out += _cleanup_lines(studied)
    if checks:
        out += ["", "# CHECK: what init could not tell (each needs a decision above):"]
        out += [f"# CHECK: {said(c)}" for c in checks]
    return "\n".join(out) + "\n"


def _host_lines(index: int, h: _Host, heads: Sequence[_Host], checks: list[str]) -> list[str]:
    reads = h.reads
    lines = ["", "  [[clusters.hosts]]"]
    lines.append(f"  name = {_quote(_host_name(index))}  # rename freely: logs, metrics, API")
    lines.append(f"  address = {_quote(reads.address)}  # as given to `sparkd init`")
    lines.append(f"  port = {reads.port}")
    role = "head" if h in heads or (not heads and index == 0) else "worker"
    env: Mapping[str, str] = {}
    ip: str | None = None
    if h.ray is not None:
        container, start = h.ray
        env = dict(container.env)
        why = "`ray start --head`" if start.head else "`ray start` (no --head)"
        lines.append(f"  role = {_quote(role)}  # container {said(container.name)}: {why}")
        ip = start.node_ip
        if ip is None and start.address is not None and start.head:
            ip = start.address.rpartition(":")[0] or None
    else:
        lines.append(f"  role = {_quote(role)}  # CHECK: no `ray start` container on this host")
    addresses = parse_addresses(reads.addresses or "")
    if ip is not None:
        source = f"`--node-ip-address` of {said(h.ray[0].name)}" if h.ray else ""
        lines.append(f"  data_ip = {_quote(ip)}  # {source}")
    name, why, choices = _interface(addresses, ip, env)
    if ip is None:
        candidates = [f"{n}={','.join(ips)}" for n, ips in sorted(addresses.items()) if ips]
        chosen = next(
            (ips[0] for n, ips in sorted(addresses.items()) if ips and ips[0] != reads.address),
            None,
        )
        checks.append(
            f"{reads.address}: no --node-ip-address in `ray start`; candidates: "
            f"{'; '.join(candidates) or 'none read'}"
        )
        placeholder = chosen or "192.0.2.1"
        lines.append(
            f"  data_ip = {_quote(placeholder)}  # CHECK: a guess; candidates "
            f"{said('; '.join(candidates) or 'none read')}"
        )
        if name is None:
            name = next((n for n, ips in addresses.items() if placeholder in ips), None)
            why = "CHECK: the interface carrying the guessed data_ip"
    if name is not None:
        lines.append(f"  interface = {_quote(name)}  # {why or 'carries data_ip'}")
    else:
        pick = choices[0] if choices else "eth0"
        checks.append(
            f"{reads.address}: which interface carries the data traffic? choices: "
            f"{', '.join(choices) or 'none read'}"
        )
        lines.append(
            f"  interface = {_quote(pick)}  # CHECK: one of {said(', '.join(choices) or 'none')}"
        )
    return lines


def _ray_lines(studied: Sequence[_Host], heads: Sequence[_Host], checks: list[str]) -> list[str]:
    rays = [h.ray for h in studied if h.ray is not None]
    lines = ["", "  [clusters.ray]"]
    if not rays:
        lines.append('  # CHECK: image = "..."  (no `ray start` container found)')
        return lines
    first, start = heads[0].ray if heads and heads[0].ray else rays[0]
    images = sorted({c.image for c, _ in rays})
    lines.append(f"  image = {_quote(first.image)}  # container {said(first.name)}: Config.Image")
    if len(images) > 1:
        checks.append(f"the Ray containers run different images: {', '.join(images)}")
    port = start.port or 6379
    lines.append(f"  port = {port}  # {'`--port` of ray start' if start.port else 'Ray default'}")
    gpus = sum(1 for h in studied if h.ray is not None)
    serve = next((h.serve[1] for h in studied if h.serve is not None), None)
    if serve is not None and serve.tensor_parallel:
        gpus = max(gpus, (serve.tensor_parallel or 1) * (serve.pipeline_parallel or 1))
    lines.append(f"  expected_gpus = {gpus}  # one GPU per host; = tensor x pipeline parallel")
    if first.shm_size is not None:
        lines.append(
            f"  shm_size = {_quote(_size(first.shm_size))}  "
            f"# {said(first.name)}: HostConfig.ShmSize"
        )
    if start.dashboard_port is not None:
        lines.append(f"  dashboard_port = {start.dashboard_port}  # `--dashboard-port`")
    mounts = [m for m in first.mounts]
    lines.append(f"  mounts = {_array(mounts)}  # {said(first.name)}: Mounts (bind)")
    extra: list[str] = []
    if first.privileged:
        extra.append("--privileged")
    if first.ipc == "host":
        extra.append("--ipc=host")
    lines.append(f"  extra_docker_args = {_array(extra)}  # {said(first.name)}: HostConfig")
    if first.network != "host":
        checks.append(
            f"{first.name} runs on network {first.network!r}: sparkd runs its containers with "
            "--network host"
        )
    if not first.gpus:
        checks.append(f"{first.name} was given no GPUs (--gpus); sparkd passes --gpus all")
    env, notes = _ray_env(rays, studied)
    checks += notes
    lines.append("")
    lines.append(f"  # From {said(first.name)}: Config.Env less the image's own and VLLM_HOST_IP.")
    lines.append("  [clusters.ray.env]")
    for key, value in env:
        lines.append(f"  {key} = {_quote(value)}")
    return lines


def _ray_env(
    rays: Sequence[tuple[InspectedContainer, RayStart]], studied: Sequence[_Host]
) -> tuple[list[tuple[str, str]], list[str]]:
    notes: list[str] = []
    first = rays[0][0]
    image_env: set[str] | None = None
    for h in studied:
        text = h.reads.image_env.get(first.image)
        if text is not None:
            parsed = parse_image_env(text)
            if parsed is not None:
                image_env = set(parsed)
                break
    kept: list[tuple[str, str]] = []
    for key, value in first.env:
        if image_env is not None and f"{key}={value}" in image_env:
            continue
        if image_env is None and key in ("PATH", "HOME", "HOSTNAME"):
            continue
        if key in PER_HOST_ENV:
            continue
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            continue
        if SECRET_NAME.search(key) and not (
            key.endswith(("_PATH", "_FILE")) and value.startswith("/")
        ):
            notes.append(
                f"{first.name} has {key} in its env: a secret, left out. Put it in an env file "
                f"on each host and add `--env-file PATH` to ray.extra_docker_args"
            )
            continue
        kept.append((key, value))
    if image_env is None:
        notes.append(
            "the image's own env could not be read: ray.env may hold variables the image sets"
        )
    for c, _ in rays[1:]:
        theirs = {k: v for k, v in c.env if k not in PER_HOST_ENV}
        for key, value in kept:
            if theirs.get(key) != value:
                notes.append(
                    f"{c.name} has {key}={theirs.get(key, '(unset)')!s}, {first.name} {value}: "
                    "ray.env is one for every host"
                )
    return kept, notes


def _model_lines(
    studied: Sequence[_Host], serving: Sequence[_Host], checks: list[str]
) -> list[str]:
    lines = ["", "  [clusters.model]"]
    if not serving or serving[0].serve is None:
        checks.append("no `vllm serve` process or container was found: fill in [clusters.model]")
        lines.append('  # CHECK: id = "/models/..."  (no `vllm serve` found)')
        lines.append("  # CHECK: tensor_parallel_size = N")
        return lines
    container, serve, where = serving[0].serve
    lines.append(f"  # From {said(where)} in {said(container.name)}: {said(serve.text)}")
    if serve.model is None:
        checks.append("`vllm serve` names no model")
        lines.append('  # CHECK: id = "/models/..."')
    else:
        lines.append(f"  id = {_quote(serve.model)}  # vllm serve's model argument")
    lines.append(
        f"  port = {serve.port or 8000}  # {'--port' if serve.port else 'vLLM default (8000)'}"
    )
    hosts = sum(1 for h in studied if h.ray is not None) or 1
    tp = serve.tensor_parallel or 1
    pp = serve.pipeline_parallel or 1
    lines.append(
        f"  tensor_parallel_size = {tp}  "
        f"# {'--tensor-parallel-size' if serve.tensor_parallel else 'vLLM default'}"
    )
    lines.append(
        f"  pipeline_parallel_size = {pp}  "
        f"# {'--pipeline-parallel-size' if serve.pipeline_parallel else 'vLLM default'}"
    )
    if tp * pp < hosts:
        checks.append(f"tensor x pipeline parallel = {tp * pp} is less than the {hosts} Ray hosts")
    lines.append(f"  extra_args = {_array(serve.extra_args)}  # the other arguments, in order")
    if serve.api_key or any(SECRET_NAME.search(k) and "API" in k.upper() for k, _ in container.env):
        lines.append(
            f"  # The deployment uses an API key: it is not copied here. Write it (one line, "
            f"mode 0600) to {SUGGESTED_KEY_FILE} on this machine."
        )
        lines.append(f"  api_key_file = {_quote(SUGGESTED_KEY_FILE)}")
        checks.append(f"create {SUGGESTED_KEY_FILE} holding the vLLM API key (mode 0600)")
    for flag in serve.secrets:
        checks.append(
            f"`vllm serve` was given {flag}: a secret, left out of extra_args; give it to the "
            "serve another way (an env file in ray.extra_docker_args)"
        )
    if serve.backend is not None:
        checks.append(
            f"`vllm serve` ran with {BACKEND_FLAG} {serve.backend}; sparkd launches with ray"
        )
    if len(serving) > 1:
        checks.append(
            f"`vllm serve` runs on {len(serving)} hosts "
            f"({', '.join(h.reads.address for h in serving)}): only the first is described"
        )
    return lines


def _cleanup_lines(studied: Sequence[_Host]) -> list[str]:
    import fnmatch

    units: set[str] = set()
    for h in studied:
        for unit in parse_unit_files(h.reads.unit_files or ""):
            if any(fnmatch.fnmatchcase(unit, p) for p in PROTECTED_UNITS):
                continue
            if MODEL_SERVER.search(unit.removesuffix(".service")):
                units.add(unit)
    ours = {h.ray[0].name for h in studied if h.ray} | {h.serve[0].name for h in studied if h.serve}
    restarting: set[str] = set()
    for h in studied:
        for c in h.containers:
            if c.name in ours or c.restart in ("", "no"):
                continue
            if MODEL_SERVER.search(" ".join([c.name, c.image, *c.argv])):
                restarting.add(c.name)
    foreign = sorted({p for h in studied for p in h.foreign_gpu})
    holding = sorted({n for h in studied for n in h.gpu_containers} - ours)
    lines = ["", "  [clusters.cleanup]"]
    lines.append(
        "  # Enabled units that look like model servers (`systemctl list-unit-files "
        "--state=enabled`): sparkd stops and disables them."
    )
    lines.append(f"  units = {_array(sorted(units))}")
    lines.append(
        "  # Containers with a --restart policy that look like model servers: sparkd removes "
        "them (exact names)."
    )
    lines.append(f"  container_patterns = {_array(sorted(restarting))}")
    for h in studied:
        for c in h.containers:
            if c.name in ours and c.restart not in ("", "no"):
                lines.append(
                    f"  # {said(c.name)} has --restart {said(c.restart)}: after a reboot Docker "
                    "starts it again, beside sparkd's own containers."
                )
    if ours:
        lines.append(
            f"  # The running deployment's own containers ({said(', '.join(sorted(ours)))}) are "
            "not listed."
        )
    if holding:
        lines.append(
            f"  # Other containers holding GPU memory (nvidia-smi): {said(', '.join(holding))}; "
            "sparkd reads their processes as foreign (never killed unless allowed)."
        )
    if foreign:
        lines.append(
            f"  # GPU processes outside any container: {said(', '.join(foreign))}; "
            "add the harmless "
            "ones (graphics) to harmless_gpu_processes."
        )
    lines.append('  harmless_gpu_processes = ["Xorg", "gnome-shell"]')
    return lines
