"""First contact with a deployment made by hand: adopt it, or show what differs (docs/adoption.md).

Everyone who installs sparkd already runs the deployment by hand: Ray head and worker containers
of their own naming, `vllm serve` started in the head with `docker exec -d`. On first contact
(sparkd never launched nor adopted anything here, and no container of its own exists) sparkd
compares that deployment with the config, evidence by evidence: the image, `ray start`'s
arguments on each host (role, data IP, port, head address), the config's container environment,
and the `vllm serve` arguments. What matches is adopted once the probe passes: nothing restarted,
nothing removed, memory as if sparkd had launched it. What differs is shown with every
difference and the actions a rollout to the config would take (withheld); nothing is stopped
until the operator decides (`adopt = "replace"`).

After adoption the adopted containers stand in for sparkd's own (`as_ours`): the stages judge
them as they would judge sparkd's. A remedy that any stage proposes while they run replaces the
whole adopted deployment: their containers are removed by their own names, and sparkd's own
launch follows on the next look.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from sparkd.core.judging.judge import Context, Hold, ago
from sparkd.core.spec import (
    LABEL_CLUSTER,
    LABEL_ROLE,
    LABEL_SPEC,
    container_name,
    container_prefix,
    normalize_image,
    ray_spec_hash,
)
from sparkd.model.cluster import ClusterSpec
from sparkd.model.memory import Adopted, Memory
from sparkd.model.observed import ForeignContainer, HostFacts, Observed, ServeState
from sparkd.model.plan import EVERYTHING, MODEL_STARTS, RAY_STARTS, Action
from sparkd.model.spec import HostSpec

# Ray's default GCS port (`ray start --port`): python/ray/scripts/scripts.py, ray 2.x.
RAY_DEFAULT_PORT = "6379"
# vLLM's defaults for the options sparkd always passes, when a hand-made command omits them:
# `--port` (vllm/entrypoints/openai/cli_args.py) and the parallel sizes (vllm/config/parallel.py,
# ParallelConfig: `Field(default=1)`, vllm-project/vllm at 00193b82).
SERVE_DEFAULTS = {
    "--port": "8000",
    "--tensor-parallel-size": "1",
    "--pipeline-parallel-size": "1",
}
# Without `--distributed-executor-backend`, a `vllm serve` whose world spans more GPUs than its
# node has runs on Ray or not at all: releases before the change picked Ray by themselves when
# the node's GPUs were fewer than the world size; vllm/config/parallel.py at 00193b82
# (ParallelConfig.__post_init__) raises "World size (N) is larger than the number of available
# GPUs" instead. On more than one single-GPU host, an answering server left it out means Ray.
BACKEND = "--distributed-executor-backend"
# Names whose value is never shown: the env of a hand-made container may hold a token or a key.
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")
SECRET_OPTIONS = frozenset({"--api-key"})
REDACTED = "<redacted>"


def secret_name(name: str) -> bool:
    upper = name.upper()
    return any(word in upper for word in SECRET_WORDS)


@dataclass(frozen=True)
class Found:
    """The hand-made deployment as first contact read it."""

    # Per host, the running container whose command is `ray start` (None: none found there).
    ray: dict[str, ForeignContainer | None]
    # The `vllm serve` command line in the head's Ray container, as words.
    serve: tuple[str, ...] | None
    serve_pid: int | None


@dataclass
class AdoptVerdict:
    """What first contact concluded. `phase`/`note`: what the plan says; `holds`: what waits."""

    found: Found | None = None
    differences: list[str] = field(default_factory=list)
    holds: list[Hold] = field(default_factory=list)
    note: str | None = None
    # The adoption to remember, once the probe passed.
    adopt: Adopted | None = None
    # The operator decided `replace`: the hand-made containers go first.
    removals: list[Action] = field(default_factory=list)
    # Waiting to adopt a matching deployment (remember() keeps since when: the wait ends).
    adopting: bool = False


def first_contact(desired: ClusterSpec, observed: Observed, memory: Memory) -> bool:
    """Nothing of sparkd's ever ran here: no launch, no adoption, no container of its own."""
    if memory.adopted is not None or memory.launched_at is not None or memory.ray_started:
        return False
    prefix = container_prefix(desired)
    for facts in observed.hosts:
        if any(c.label(LABEL_CLUSTER) == desired.name for c in facts.containers):
            return False
        if any(c.name.startswith(prefix) for c in facts.containers):
            return False
    return True


def words(command: Sequence[str] | str) -> list[str]:
    """A command's words: each argv word split again as the shell would (`sh -c "ray start
    ..."` is one word of Docker's `Cmd`); an unbalanced quote splits on blanks."""
    parts = [command] if isinstance(command, str) else list(command)
    found: list[str] = []
    for part in parts:
        try:
            found.extend(shlex.split(part))
        except ValueError:
            found.extend(part.split())
    return found


def options(argv: list[str]) -> tuple[list[str], dict[str, list[str | None]]]:
    """Positional words and options (`--a=b` and `--a b` alike; `_` in a name as `-`)."""
    positional: list[str] = []
    found: dict[str, list[str | None]] = {}
    i = 0
    while i < len(argv):
        word = argv[i]
        if word.startswith("--"):
            name, eq, value = word.partition("=")
            name = "--" + name[2:].replace("_", "-")
            if not eq:
                following = argv[i + 1] if i + 1 < len(argv) else None
                if following is not None and not following.startswith("--"):
                    value, i = following, i + 1
                    found.setdefault(name, []).append(value)
                else:
                    found.setdefault(name, []).append(None)
            else:
                found.setdefault(name, []).append(value)
        else:
            positional.append(word)
        i += 1
    return positional, found


def _after(argv: list[str], program: str, verb: str) -> list[str] | None:
    """The words after `PROGRAM VERB` (the program by its base name), or None."""
    for i in range(len(argv) - 1):
        if posixpath.basename(argv[i]) == program and argv[i + 1] == verb:
            return argv[i + 2 :]
    return None


def ray_args(box: ForeignContainer) -> list[str] | None:
    """`ray start`'s arguments: from the container's command, or from a process in it."""
    for text in (box.command, *box.processes):
        found = _after(words(text), "ray", "start")
        if found is not None:
            return found
    return None


def serve_args(box: ForeignContainer) -> tuple[list[str], int | None] | None:
    """`vllm serve`'s arguments and PID from the container's processes (`PID ARGS` lines)."""
    for line in box.processes:
        pid_text, _, args = line.partition(" ")
        found = _after(words(args), "vllm", "serve")
        if found is not None:
            pid = int(pid_text) if pid_text.isdigit() else None
            return found, pid
    return None


def read(ctx: Context) -> Found | None:
    """The hand-made deployment, when the head shows one: a running container of another
    naming whose command is `ray start --head`. None when there is none, or it is unread."""
    desired = ctx.desired
    ray: dict[str, ForeignContainer | None] = {}
    for host in desired.hosts:
        facts = ctx.facts[host.name]
        ray[host.name] = _ray_box(facts) if facts.foreign is not None else None
    head = ray.get(desired.head.name)
    if head is None:
        return None
    args = ray_args(head)
    if args is None or "--head" not in options(args)[1]:
        return None
    serve = serve_args(head)
    return Found(
        ray=ray,
        serve=tuple(serve[0]) if serve is not None else None,
        serve_pid=serve[1] if serve is not None else None,
    )


def _ray_box(facts: HostFacts) -> ForeignContainer | None:
    return next((box for box in facts.foreign or () if ray_args(box) is not None), None)


def _option(found: dict[str, list[str | None]], name: str) -> str | None:
    values = found.get(name)
    return values[-1] if values else None


def differences(desired: ClusterSpec, found: Found) -> list[str]:
    """Every way the deployment differs from the config, each naming host, what and both values."""
    diffs: list[str] = []
    wanted = {normalize_image(desired.ray.image), desired.ray.image}
    for host in desired.hosts:
        box = found.ray.get(host.name)
        if box is None:
            diffs.append(f"{host.name}: no running `ray start` container")
            continue
        if box.image not in wanted and normalize_image(box.image) not in wanted:
            diffs.append(f"{host.name} ({box.name}): image {box.image}, config {desired.ray.image}")
        diffs.extend(_ray_differences(desired, host, box))
        for key, value in sorted(desired.ray.env.items()):
            have = box.env.get(key)
            if have == value:
                continue
            shown = ("set" if secret_name(key) else repr(have)) if have is not None else "unset"
            want = "another value" if secret_name(key) else repr(value)
            diffs.append(f"{host.name} ({box.name}): env {key} is {shown}, config {want}")
    diffs.extend(_serve_differences(desired, found))
    return diffs


def _ray_differences(desired: ClusterSpec, host: HostSpec, box: ForeignContainer) -> list[str]:
    args = ray_args(box) or []
    _, found = options(args)
    where = f"{host.name} ({box.name}): ray start"
    diffs: list[str] = []
    is_head = "--head" in found
    if is_head != (host.role == "head"):
        diffs.append(f"{where} runs a {'head' if is_head else 'worker'}, config a {host.role}")
    ip = _option(found, "--node-ip-address")
    if ip != host.ip:
        diffs.append(f"{where} --node-ip-address {ip or 'unset'}, config {host.ip}")
    if host.role == "head":
        port = _option(found, "--port") or RAY_DEFAULT_PORT
        if port != str(desired.ray.port):
            diffs.append(f"{where} --port {port}, config {desired.ray.port}")
    else:
        address = _option(found, "--address")
        want = f"{desired.head.ip}:{desired.ray.port}"
        if address != want:
            diffs.append(f"{where} --address {address or 'unset'}, config {want}")
    return diffs


def desired_serve(desired: ClusterSpec) -> list[str]:
    """The `vllm serve` words sparkd's own launch passes (shell.catalogue.actions.serve_argv)."""
    model = desired.model
    return [
        model.id,
        "--port", str(model.port),
        "--tensor-parallel-size", str(model.tensor_parallel_size),
        "--pipeline-parallel-size", str(model.pipeline_parallel_size),
        BACKEND, "ray",
        *model.extra_args,
    ]  # fmt: skip


def _serve_differences(desired: ClusterSpec, found: Found) -> list[str]:
    if found.serve is None:
        return [f"{desired.head.name}: no `vllm serve` process in the Ray head's container"]
    want_pos, want = options(desired_serve(desired))
    have_pos, have = options(list(found.serve))
    # `vllm serve --model X` names the model too.
    if not have_pos and "--model" in have:
        have_pos = [str(have.pop("--model")[-1])]
    for name, value in SERVE_DEFAULTS.items():
        have.setdefault(name, [value])
    if BACKEND not in have and len(desired.hosts) > 1:
        have[BACKEND] = ["ray"]
    if desired.model.api_key_file is not None:
        # sparkd's launch passes the key in the environment, never on a command line; whether
        # the hand-made server takes sparkd's key, its answer to the probe says.
        have.pop("--api-key", None)
    diffs: list[str] = []
    if have_pos[:1] != want_pos[:1]:
        running = have_pos[0] if have_pos else "none"
        diffs.append(f"vllm serve model {running}, config {desired.model.id}")
    for name in sorted(set(want) | set(have)):
        a, b = have.get(name), want.get(name)
        if a == b:
            continue
        diffs.append(f"vllm serve {name} {_shown(name, a)}, config {_shown(name, b)}")
    return diffs


def _shown(name: str, values: list[str | None] | None) -> str:
    if values is None:
        return "unset"
    if name in SECRET_OPTIONS:
        return REDACTED
    return " ".join("(flag)" if v is None else v for v in values)


def judge(ctx: Context, serving: bool) -> AdoptVerdict:
    """First contact: adopt, show, or (the operator decided) replace. Empty elsewhere."""
    desired = ctx.desired
    verdict = AdoptVerdict()
    if not first_contact(desired, ctx.observed, ctx.memory):
        return verdict
    head = ctx.facts[desired.head.name]
    if head.reachable and head.docker_up and head.foreign_error is not None:
        # Running containers whose config is unknown: maybe a hand-made Ray on the same port.
        why = (
            f"first contact: the running containers on {desired.head.name} could not be read "
            f"({head.foreign_error}); not starting Ray beside what may be a deployment made by "
            "hand"
        )
        verdict.note = why
        verdict.holds.append(Hold(why, RAY_STARTS | MODEL_STARTS))
        return verdict
    found = read(ctx)
    if found is None:
        return verdict
    verdict.found = found
    verdict.differences = differences(desired, found)
    named = describe(found)
    if verdict.differences:
        listed = "; ".join(verdict.differences)
        return _not_adoptable(desired, verdict, found, f"it differs from the config: {listed}")
    stuck = _stuck(ctx)
    if stuck is not None:
        return _not_adoptable(desired, verdict, found, f"it matches the config but {stuck}")
    healthy = ctx.observed.probe is not None and ctx.observed.probe.verdict.healthy is True
    if serving and healthy:
        verdict.adopt = Adopted(
            containers={h: box.name for h, box in found.ray.items() if box is not None},
            serve_pid=found.serve_pid,
            at=ctx.now,
        )
        verdict.note = f"adopted the deployment made by hand ({named}): it matches the config"
        return verdict
    what = "waiting for the probe" if serving else "waiting for the model to answer"
    why = f"adopting the deployment made by hand ({named}): it matches the config; {what}"
    verdict.note = why
    verdict.adopting = True
    verdict.holds.append(Hold(why, EVERYTHING))
    return verdict


def _stuck(ctx: Context) -> str | None:
    """Why a matching deployment cannot be adopted, or None while it still may: the probe can
    never pass (the server refuses sparkd's key), or it has not passed within the load timeout
    since first contact began (a hold that ends: then the operator is asked)."""
    endpoint = ctx.observed.endpoint
    if endpoint is not None and endpoint.status == "http_error":
        return f"its server refuses sparkd's API key ({endpoint.detail or 'HTTP 401/403'})"
    since = ctx.memory.adopting_since
    limit = ctx.desired.model.load_timeout
    if since is not None and ctx.now - since > limit:
        said = endpoint.status if endpoint is not None else "not read"
        return (
            f"its model has not passed the probe in {ago(ctx.now - since)} (model.load_timeout "
            f"{ago(limit)}; its endpoint: {said})"
        )
    return None


def _not_adoptable(
    desired: ClusterSpec, verdict: AdoptVerdict, found: Found, why: str
) -> AdoptVerdict:
    named = describe(found)
    if desired.adopt == "replace":
        verdict.note = (
            f"replacing the deployment made by hand ({named}) as the config decides "
            f'(adopt = "replace"): {why}'
        )
        verdict.removals = _removals(desired, found, "replaced by the config's launch")
        return verdict
    note = (
        f"would replace the deployment made by hand ({named}): {why}; nothing is stopped "
        'until the operator decides (adopt = "replace", or a config that describes it)'
    )
    verdict.note = note
    verdict.differences.append(why)
    verdict.holds.append(Hold(note, EVERYTHING))
    return verdict


def describe(found: Found) -> str:
    boxes = ", ".join(f"{box.name} on {host}" for host, box in found.ray.items() if box is not None)
    serve = f"vllm serve pid {found.serve_pid}" if found.serve_pid is not None else "no vllm serve"
    return f"{boxes}; {serve}"


def _removals(desired: ClusterSpec, found: Found, why: str) -> list[Action]:
    return [
        Action(kind="remove_container", host=host, target=box.name, reason=f"{box.name}: {why}")
        for host, box in found.ray.items()
        if box is not None and box.name != container_name(desired, desired.host(host))
    ]


def as_ours(desired: ClusterSpec, observed: Observed, memory: Memory) -> Observed:
    """After adoption: each adopted container as if sparkd had made it (its name, labels and
    spec), and the adopted serve process as sparkd's; an adopted container that is gone is
    simply missing (its host's own launch follows)."""
    adopted = memory.adopted
    if adopted is None:
        return observed
    hosts = []
    serve = observed.serve
    for facts in observed.hosts:
        name = adopted.containers.get(facts.name)
        if name is None or facts.container(name) is None:
            hosts.append(facts)
            continue
        spec = desired.host(facts.name)
        own = container_name(desired, spec)
        labels = {
            LABEL_CLUSTER: desired.name,
            LABEL_ROLE: spec.role,
            LABEL_SPEC: ray_spec_hash(desired, spec),
        }
        boxes = tuple(
            c.model_copy(update={"name": own, "labels": {**c.labels, **labels}})
            if c.name == name
            else c
            for c in facts.containers
        )
        gpu = tuple(
            p.model_copy(update={"container": own}) if p.container == name else p
            for p in facts.gpu_processes
        )
        hosts.append(facts.model_copy(update={"containers": boxes, "gpu_processes": gpu}))
        if spec.role == "head" and (serve is None or not serve.running):
            serve = _adopted_serve(facts, name, adopted) or serve
    return observed.model_copy(update={"hosts": tuple(hosts), "serve": serve})


def _adopted_serve(facts: HostFacts, name: str, adopted: Adopted) -> ServeState | None:
    box = next((b for b in facts.foreign or () if b.name == name), None)
    if box is None:
        return None
    found = serve_args(box)
    if found is None or found[1] != adopted.serve_pid:
        return ServeState(running=False)
    return ServeState(running=True, pid=found[1])


def replacing(desired: ClusterSpec, memory: Memory, actions: list[Action]) -> list[Action]:
    """A (re)start of Ray or the model while the adopted deployment runs replaces it whole:
    its containers are removed by their own names first (sparkd's own launch follows on the
    next look, under its own names). sparkd never signals a process it did not launch."""
    adopted = memory.adopted
    remedies = [a for a in actions if a.kind in RAY_STARTS | MODEL_STARTS]
    if adopted is None or not remedies:
        # Housekeeping beside it (a stale unit, a conflicting container) is not a remedy of it.
        return actions
    why = "; ".join(dict.fromkeys(a.reason for a in remedies))
    return [
        Action(
            kind="remove_container",
            host=host,
            target=name,
            reason=f"adopted {name} replaced by sparkd's own launch ({why})",
        )
        for host, name in sorted(adopted.containers.items())
    ]


def gone(observed: Observed, memory: Memory) -> bool:
    """Every adopted container is gone from hosts that were read: the adoption is over."""
    adopted = memory.adopted
    if adopted is None:
        return False
    for host, name in adopted.containers.items():
        facts = observed.host(host)
        if facts is None or not facts.docker_up or facts.container(name) is not None:
            return False
    return True
