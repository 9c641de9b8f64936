"""`docker` as the simulated hosts answer it: same flags, output formats, messages and exit codes
as the real CLI for the subset sparkd and an operator use."""

from __future__ import annotations

import asyncio
import hashlib
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sparkd_sim.engine import ENTRYPOINT, HostEngine, normalize_image
from sparkd_sim.formats import (
    ago,
    docker_time,
    go_json,
    go_quote,
    human_duration,
    render_template,
    rfc3339,
    tabwriter,
)
from sparkd_sim.protocol import Done, Exec, Reply, Stream, ToolCall, fail
from sparkd_sim.state import (
    Container,
    HostState,
    Mount,
    RestartPolicy,
    SimProcess,
    new_container_id,
)

EnvFor = Callable[[Container], dict[str, str]]

_RUN_VALUE_FLAGS = {
    "--name",
    "--label",
    "-l",
    "--env",
    "-e",
    "--volume",
    "-v",
    "--network",
    "--net",
    "--gpus",
    "--shm-size",
    "--restart",
    "--pull",
    "--ipc",
    "--ulimit",
    "--entrypoint",
    "--workdir",
    "-w",
    "--user",
    "-u",
    "--runtime",
    "--cap-add",
    "--device",
    "--hostname",
    "--env-file",
    "--memory",
}
_RUN_BOOL_FLAGS = {"-d", "--detach", "--rm", "--privileged", "--init", "-i", "-t", "-it", "-dit"}
_DAEMON = "Error response from daemon"


def _no_such(ref: str) -> Done:
    return fail(f"{_DAEMON}: No such container: {ref}")


def _not_running(c: Container) -> Done:
    return fail(f"{_DAEMON}: Container {c.id} is not running")


def _is_restarting(c: Container) -> Done:
    return fail(f"{_DAEMON}: Container {c.id} is restarting, wait until the container is running")


def _unknown_flag(cmd: str, flag: str) -> Done:
    name = flag.lstrip("-")
    kind = "flag" if flag.startswith("--") else "shorthand flag"
    shown = f"--{name}" if flag.startswith("--") else f"'{name[0]}' in {flag}"
    return fail(f"unknown {kind}: {shown}\nSee 'docker {cmd} --help'.", rc=125)


@dataclass
class _Parsed:
    flags: dict[str, list[str]] = field(default_factory=dict)
    rest: list[str] = field(default_factory=list)

    def one(self, *names: str) -> str | None:
        for name in names:
            if name in self.flags:
                return self.flags[name][-1]
        return None

    def many(self, *names: str) -> list[str]:
        return [v for name in names for v in self.flags.get(name, [])]

    def has(self, *names: str) -> bool:
        return any(name in self.flags for name in names)


def _parse(
    args: list[str], value_flags: set[str], bool_flags: set[str], cmd: str
) -> _Parsed | Done:
    """Flags up to the first positional argument, as docker's CLI (interspersed off) parses."""
    parsed = _Parsed()
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            parsed.rest = args[i + 1 :]
            return parsed
        if not arg.startswith("-") or arg == "-":
            parsed.rest = args[i:]
            return parsed
        name, eq, value = arg.partition("=")
        if name in value_flags:
            if not eq:
                if i + 1 >= len(args):
                    return fail(f"flag needs an argument: {name}\nSee 'docker {cmd} --help'.", 125)
                i += 1
                value = args[i]
            parsed.flags.setdefault(name, []).append(value)
        elif name in bool_flags:
            parsed.flags.setdefault(name, []).append(value or "true")
        elif (
            not name.startswith("--")
            and len(name) > 2
            and all(f"-{c}" in bool_flags for c in name[1:])
        ):
            for c in name[1:]:
                parsed.flags.setdefault(f"-{c}", []).append("true")
        else:
            return _unknown_flag(cmd, name)
        i += 1
    return parsed


class FakeDocker:
    def __init__(self, engine: HostEngine, env_for: EnvFor) -> None:
        self.engine = engine
        self.env_for = env_for

    @property
    def host(self) -> HostState:
        return self.engine.state

    async def __call__(self, call: ToolCall) -> Reply:
        if not call.args:
            return Done(stdout="Usage:  docker [OPTIONS] COMMAND\n")
        cmd, args = call.args[0], call.args[1:]
        handlers: dict[str, Callable[[list[str]], Reply]] = {
            "ps": self.ps,
            "run": self.run,
            "rm": self.rm,
            "exec": self.exec,
            "logs": self.logs,
            "inspect": self.inspect,
            "top": self.top,
            "stop": self.stop,
            "kill": self.kill,
            "start": self.start,
            "restart": self.restart,
            "events": self.events,
            "images": self.images,
            "image": self.image,
        }
        handler = handlers.get(cmd)
        if handler is None:
            return fail(
                f"docker: unknown command: docker {cmd}\n\n"
                "Run 'docker --help' for more information",
                rc=1,
            )
        return handler(args)

    # -- ps ----------------------------------------------------------------------------------

    def _ps_row(self, c: Container, no_trunc: bool) -> dict[str, Any]:
        command = shlex.join([ENTRYPOINT, *c.command])
        if not no_trunc and len(command) > 20:
            command = command[:19] + "…"
        if c.status == "running":
            status = "Up " + human_duration(time.time() - c.started_wall)
        elif c.status == "restarting":
            status = f"Restarting ({c.exit_code}) {ago(c.finished_wall)}"
        elif c.status == "exited":
            status = f"Exited ({c.exit_code}) {ago(c.finished_wall)}"
        else:
            status = "Created"
        return {
            "Command": go_quote(command),
            "CreatedAt": docker_time(c.created_wall),
            "ID": c.id if no_trunc else c.id[:12],
            "Image": c.image,
            "Labels": ",".join(f"{k}={v}" for k, v in sorted(c.labels.items())),
            "LocalVolumes": "0",
            "Mounts": ",".join(m.source for m in c.mounts),
            "Names": c.name,
            "Networks": c.network,
            # The CLI's own field (28.x), null for a single-platform image.
            "Platform": None,
            "Ports": "",
            "RunningFor": ago(c.created_wall),
            "Size": f"0B (virtual {human_size(IMAGE_SIZE)})",
            "State": c.status,
            "Status": status,
        }

    @staticmethod
    def _matches(c: Container, filters: list[str]) -> bool | str:
        by_key: dict[str, list[str]] = {}
        for f in filters:
            key, eq, value = f.partition("=")
            if not eq:
                return f"{_DAEMON}: invalid filter '{f}'"
            by_key.setdefault(key, []).append(value)
        for key, values in by_key.items():
            if key == "label":
                for v in values:
                    k, eq2, want = v.partition("=")
                    if k not in c.labels or (eq2 and c.labels[k] != want):
                        return False
            elif key == "name":
                if not any(v.lstrip("/") in c.name for v in values):
                    return False
            elif key == "status":
                if c.status not in values:
                    return False
            elif key == "id":
                if not any(c.id.startswith(v) for v in values):
                    return False
            else:
                return f"{_DAEMON}: invalid filter '{key}'"
        return True

    def ps(self, args: list[str]) -> Done:
        parsed = _parse(
            args,
            {"--format", "-f", "--filter"},
            {"-a", "--all", "--no-trunc", "-q", "--quiet"},
            "ps",
        )
        if isinstance(parsed, Done):
            return parsed
        if parsed.rest:
            return fail("\"docker ps\" accepts no arguments.\nSee 'docker ps --help'.", 1)
        show_all = parsed.has("-a", "--all")
        no_trunc = parsed.has("--no-trunc")
        selected = []
        for c in sorted(self.host.containers.values(), key=lambda c: -c.created_wall):
            if not show_all and not c.up:
                continue
            ok = self._matches(c, parsed.many("--filter", "-f"))
            if isinstance(ok, str):
                return fail(ok)
            if ok:
                selected.append(c)
        rows = [self._ps_row(c, no_trunc) for c in selected]
        if parsed.has("-q", "--quiet"):
            return Done(stdout="".join(r["ID"] + "\n" for r in rows))
        fmt = parsed.one("--format")
        if fmt is not None and fmt != "table":
            if fmt.strip() == "{{json .}}":
                return Done(stdout="".join(go_json(r) + "\n" for r in rows))
            return Done(stdout="".join(render_template(fmt, r) + "\n" for r in rows))
        table = [["CONTAINER ID", "IMAGE", "COMMAND", "CREATED", "STATUS", "PORTS", "NAMES"]]
        for r in rows:
            table.append(
                [r["ID"], r["Image"], r["Command"], r["RunningFor"], r["Status"], "", r["Names"]]
            )
        return Done(stdout=tabwriter(table, minwidth=10))

    # -- run / start / stop / rm -------------------------------------------------------------

    def run(self, args: list[str]) -> Done:
        parsed = _parse(args, _RUN_VALUE_FLAGS, _RUN_BOOL_FLAGS, "run")
        if isinstance(parsed, Done):
            return parsed
        if not parsed.rest:
            return fail(
                "\"docker run\" requires at least 1 argument.\nSee 'docker run --help'.", 125
            )
        if not parsed.has("-d", "--detach"):
            return fail("docker: the simulated docker only runs detached containers (-d)", 125)
        image, command = parsed.rest[0], parsed.rest[1:]
        name = parsed.one("--name") or f"sim_{new_container_id()[:8]}"
        restart = parsed.one("--restart") or "no"
        if restart.split(":")[0] not in ("no", "always", "unless-stopped", "on-failure"):
            return fail(f"docker: invalid restart policy '{restart}'", 125)
        pull = parsed.one("--pull") or "missing"
        existing = self.host.container(name)
        if existing is not None and existing.name == name:
            return fail(
                f'docker: {_DAEMON}: Conflict. The container name "/{name}" is already in use by '
                f'container "{existing.id}". You have to remove (or rename) that container to be '
                "able to reuse that name.\n\nRun 'docker run --help' for more information",
                125,
            )
        if normalize_image(image) not in self.host.images:
            if pull == "never":
                return fail(
                    f"docker: {_DAEMON}: No such image: {normalize_image(image)}\n\n"
                    "Run 'docker run --help' for more information",
                    125,
                )
            return fail(
                f"Unable to find image '{normalize_image(image)}' locally\n"
                f'docker: {_DAEMON}: Get "https://registry-1.docker.io/v2/": dial tcp: lookup '
                "registry-1.docker.io: no such host\n\n"
                "Run 'docker run --help' for more information",
                125,
            )
        env = _pairs(parsed.many("-e", "--env"))
        labels = _pairs(parsed.many("-l", "--label"))
        mounts = []
        for spec in parsed.many("-v", "--volume"):
            parts = spec.split(":")
            mounts.append(
                Mount(parts[0], parts[1] if len(parts) > 1 else parts[0], "ro" in parts[2:])
            )
        policy: RestartPolicy = restart.split(":")[0]  # type: ignore[assignment]
        container = Container(
            id=new_container_id(),
            name=name,
            image=image,
            command=command,
            labels=labels,
            env=env,
            mounts=mounts,
            restart=policy,
            network=parsed.one("--network", "--net") or "bridge",
            shm_size=parsed.one("--shm-size") or "",
            gpus=parsed.one("--gpus") or "",
            image_id=image_id(self.host, image),
        )
        self.host.containers[container.id] = container
        self.engine.emit("create", container)
        self.engine.start(container)
        return Done(stdout=container.id + "\n")

    def _each(
        self,
        cmd: str,
        args: list[str],
        bools: set[str],
        act: Callable[[Container, _Parsed], str | None],
    ) -> Done:
        """Apply `act` to every named container, reporting each like docker does."""
        parsed = _parse(args, {"--time", "-t", "--signal", "-s"}, bools, cmd)
        if isinstance(parsed, Done):
            return parsed
        if not parsed.rest:
            return fail(
                f"\"docker {cmd}\" requires at least 1 argument.\nSee 'docker {cmd} --help'.", 1
            )
        out, err = [], []
        failed = False
        for ref in parsed.rest:
            c = self.host.container(ref)
            if c is None:
                err.append(f"{_DAEMON}: No such container: {ref}")
                # Forced, a container already gone is said but is no failure.
                failed = failed or not (cmd == "rm" and parsed.has("-f", "--force"))
                continue
            problem = act(c, parsed)
            if problem:
                err.append(problem)
                failed = True
            else:
                out.append(ref + "\n")
        return Done("".join(out), "".join(e + "\n" for e in err), 1 if failed else 0)

    def rm(self, args: list[str]) -> Done:
        def act(c: Container, parsed: _Parsed) -> str | None:
            if c.up and not parsed.has("-f", "--force"):
                return (
                    f"{_DAEMON}: You cannot remove a {c.status} container {c.id}. "
                    "Stop the container before attempting removal or force remove"
                )
            self.engine.remove(c)
            return None

        return self._each("rm", args, {"-f", "--force", "-v", "--volumes"}, act)

    def stop(self, args: list[str]) -> Done:
        def act(c: Container, _: _Parsed) -> str | None:
            self.engine.stop_container(c, 143, by_user=True)
            return None

        return self._each("stop", args, set(), act)

    def kill(self, args: list[str]) -> Done:
        def act(c: Container, _: _Parsed) -> str | None:
            if not c.up:
                return (
                    f"{_DAEMON}: Cannot kill container: {c.name}: Container {c.id} is not running"
                )
            self.engine.stop_container(c, 137, by_user=True)
            return None

        return self._each("kill", args, set(), act)

    def start(self, args: list[str]) -> Done:
        def act(c: Container, _: _Parsed) -> str | None:
            if not c.up:
                self.engine.start(c)
            return None

        return self._each("start", args, {"-a", "-i"}, act)

    def restart(self, args: list[str]) -> Done:
        def act(c: Container, _: _Parsed) -> str | None:
            self.engine.stop_container(c, 143, by_user=True)
            self.engine.start(c)
            self.engine.emit("restart", c)
            return None

        return self._each("restart", args, set(), act)

    # -- exec --------------------------------------------------------------------------------

    def exec(self, args: list[str]) -> Done | Exec:
        parsed = _parse(
            args,
            {"-e", "--env", "-u", "--user", "-w", "--workdir", "--env-file"},
            {"-d", "--detach", "-i", "--interactive", "-t", "--tty", "--privileged"},
            "exec",
        )
        if isinstance(parsed, Done):
            return parsed
        if len(parsed.rest) < 2:
            return fail(
                "\"docker exec\" requires at least 2 arguments.\nSee 'docker exec --help'.", 1
            )
        ref, argv = parsed.rest[0], parsed.rest[1:]
        c = self.host.container(ref)
        if c is None:
            return _no_such(ref)
        if c.restarting:
            return _is_restarting(c)
        if not c.running:
            return _not_running(c)
        env = self.env_for(c)
        for item in parsed.many("-e", "--env"):
            key, _, value = item.partition("=")
            env[key] = value
        detach = parsed.has("-d", "--detach")
        exec_id = new_container_id()

        def started(pid: int) -> None:
            c.real_pids.add(pid)
            # As Docker does: the command rides in the action (`exec_start: ray status`).
            self.engine.emit("exec_start: " + " ".join(argv), c, execID=exec_id)

        def exited(rc: int) -> None:
            self.engine.emit("exec_die", c, execID=exec_id, exitCode=str(rc))

        return Exec(env=env, argv=argv, detach=detach, on_started=started, on_exit=exited)

    # -- logs / inspect / top ----------------------------------------------------------------

    def logs(self, args: list[str]) -> Done:
        parsed = _parse(
            args, {"--tail", "-n", "--since", "--until"}, {"-t", "--timestamps", "-f"}, "logs"
        )
        if isinstance(parsed, Done):
            return parsed
        if len(parsed.rest) != 1:
            return fail('"docker logs" requires exactly 1 argument.', 1)
        c = self.host.container(parsed.rest[0])
        if c is None:
            return _no_such(parsed.rest[0])
        lines = c.logs
        tail = parsed.one("--tail", "-n")
        if tail is not None and tail != "all":
            lines = lines[-int(tail) :] if int(tail) > 0 else []
        return Done(stdout="".join(line + "\n" for line in lines))

    def _inspect_value(self, c: Container) -> dict[str, Any]:
        main_pid = c.processes[0].pid if c.running and c.processes else 0
        return {
            "Id": c.id,
            "Created": rfc3339(c.created_wall),
            "Path": ENTRYPOINT,
            "Args": c.command,
            "State": {
                "Status": c.status,
                "Running": c.up,
                "Paused": False,
                "Restarting": c.restarting,
                "OOMKilled": c.oom_killed,
                "Dead": False,
                "Pid": main_pid,
                "ExitCode": c.exit_code,
                "Error": "",
                "StartedAt": rfc3339(c.started_wall),
                "FinishedAt": rfc3339(c.finished_wall),
            },
            "Image": c.image_id or image_id(self.host, c.image),
            "Name": "/" + c.name,
            "RestartCount": c.restart_count,
            "HostConfig": {
                "Binds": [
                    f"{m.source}:{m.destination}" + (":ro" if m.read_only else "") for m in c.mounts
                ],
                "NetworkMode": c.network,
                "RestartPolicy": {"Name": c.restart, "MaximumRetryCount": 0},
                "ShmSize": _bytes(c.shm_size) if c.shm_size else 67108864,
            },
            "Mounts": [
                {
                    "Type": "bind",
                    "Source": m.source,
                    "Destination": m.destination,
                    "Mode": "ro" if m.read_only else "",
                    "RW": not m.read_only,
                    "Propagation": "rprivate",
                }
                for m in c.mounts
            ],
            "Config": {
                "Hostname": self.host.name,
                "Env": [f"{k}={v}" for k, v in c.env.items()]
                + ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                "Cmd": c.command,
                "Image": c.image,
                "Entrypoint": [ENTRYPOINT],
                "Labels": dict(c.labels),
            },
        }

    def inspect(self, args: list[str]) -> Done:
        parsed = _parse(args, {"--format", "-f", "--type"}, {"-s", "--size"}, "inspect")
        if isinstance(parsed, Done):
            return parsed
        kind = parsed.one("--type")
        found, missing = [], []
        for ref in parsed.rest:
            c = self.host.container(ref) if kind in (None, "container") else None
            image = self._image(ref) if c is None and kind in (None, "image") else None
            if c is not None:
                found.append(self._inspect_value(c))
            elif image is not None:
                found.append(self._image_value(image))
            else:
                missing.append(ref)
        fmt = parsed.one("--format", "-f")
        if fmt is not None:
            # With nothing found the CLI still prints the (empty) result's line.
            out = "".join(render_template(fmt, v) + "\n" for v in found) or "\n"
        else:
            out = go_json(found, indent=4) + "\n" if found else "[]\n"
        err = "".join(f"Error: No such object: {m}\n" for m in missing)
        return Done(out, err, 1 if missing else 0)

    def top(self, args: list[str]) -> Done:
        if not args:
            return fail('"docker top" requires at least 1 argument.', 1)
        c = self.host.container(args[0])
        if c is None:
            return _no_such(args[0])
        if c.restarting:
            return _is_restarting(c)
        if not c.running:
            return _not_running(c)
        return _ps_table(c.processes, args[1:])

    # -- events ------------------------------------------------------------------------------

    def events(self, args: list[str]) -> Done | Stream:
        parsed = _parse(args, {"--format", "-f", "--filter", "--since", "--until"}, set(), "events")
        if isinstance(parsed, Done):
            return parsed
        filters: dict[str, list[str]] = {}
        for f in parsed.many("--filter", "-f"):
            key, _, value = f.partition("=")
            filters.setdefault(key, []).append(value)
        fmt = parsed.one("--format")
        queue = self.engine.subscribe()
        stream = Stream()

        def wanted(event: dict[str, Any]) -> bool:
            attrs = event["Actor"]["Attributes"]
            for key, values in filters.items():
                if key == "event" and not any(_event_matches(v, event["Action"]) for v in values):
                    return False
                if key == "type" and event["Type"] not in values:
                    return False
                if key == "container" and not any(
                    v in (attrs.get("name"), event["id"]) for v in values
                ):
                    return False
                if key == "label":
                    for v in values:
                        k, eq, want = v.partition("=")
                        if k not in attrs or (eq and attrs[k] != want):
                            return False
            return True

        async def pump() -> None:
            while True:
                event = await queue.get()
                if not wanted(event):
                    continue
                if fmt is not None and fmt.strip() == "{{json .}}":
                    stream.write(go_json(event) + "\n")
                elif fmt is not None:
                    stream.write(render_template(fmt, event) + "\n")
                else:
                    stream.write(
                        f"{rfc3339(event['time'])} container {event['Action']} {event['id']}\n"
                    )

        task = asyncio.ensure_future(pump())

        def disconnect() -> None:
            task.cancel()
            self.engine.unsubscribe(queue)
            stream.finish(0)

        stream.on_disconnect = disconnect
        return stream

    # -- images ------------------------------------------------------------------------------

    def _image(self, ref: str) -> str | None:
        """The tag `ref` names on this host: a tag, `sha256:ID` or a unique ID prefix."""
        name = normalize_image(ref)
        if name in self.host.images:
            return name
        digits = ref.removeprefix("sha256:")
        if len(digits) < 4 or any(c not in "0123456789abcdef" for c in digits):
            return None
        matches = [i for i in self.host.images if image_id(self.host, i)[7:].startswith(digits)]
        return matches[0] if len({image_id(self.host, i) for i in matches}) == 1 else None

    def _image_value(self, image: str) -> dict[str, Any]:
        ident = image_id(self.host, image)
        tags = sorted(i for i in self.host.images if image_id(self.host, i) == ident)
        return {
            "Id": ident,
            "RepoTags": tags,
            "RepoDigests": [],
            "Created": "2026-03-02T11:04:17.318Z",
            "Architecture": "arm64",
            "Os": "linux",
            "Size": IMAGE_SIZE,
        }

    def images(self, args: list[str]) -> Done:
        parsed = _parse(args, {"--format", "--filter", "-f"}, {"-q", "--quiet", "-a"}, "images")
        if isinstance(parsed, Done):
            return parsed
        wanted = [normalize_image(r) for r in parsed.rest]
        rows = []
        for image in sorted(self.host.images):
            if wanted and image not in wanted:
                continue
            repo, _, tag = image.rpartition(":")
            rows.append({"Repository": repo, "Tag": tag, "ID": image_id(self.host, image)[7:19]})
        if parsed.has("-q", "--quiet"):
            return Done(stdout="".join(r["ID"] + "\n" for r in rows))
        fmt = parsed.one("--format")
        if fmt is not None:
            return Done(stdout="".join(render_template(fmt, r) + "\n" for r in rows))
        table = [["REPOSITORY", "TAG", "IMAGE ID"]] + [
            [r["Repository"], r["Tag"], r["ID"]] for r in rows
        ]
        return Done(stdout=tabwriter(table, minwidth=10))

    def image(self, args: list[str]) -> Done:
        if not args or args[0] != "inspect":
            return fail("docker image: only 'inspect' is simulated", 1)
        parsed = _parse(args[1:], {"--format", "-f"}, set(), "image inspect")
        if isinstance(parsed, Done):
            return parsed
        found, missing = [], []
        for ref in parsed.rest:
            image = self._image(ref)
            if image is not None:
                found.append(self._image_value(image))
            else:
                missing.append(ref)
        fmt = parsed.one("--format", "-f")
        out = (
            "".join(render_template(fmt, v) + "\n" for v in found) or "\n"
            if fmt is not None
            else go_json(found, indent=4) + "\n"
        )
        # The 28.x CLI against the engine sparkd is tested with quotes the engine's reason.
        err = "".join(
            f"{_DAEMON}: no such image: {m}: No such image: {normalize_image(m)}\n" for m in missing
        )
        return Done(out, err, 1 if missing else 0)


# Every simulated image is this big (the Qwen image on a Spark: ~21 GB).
IMAGE_SIZE = 21_474_836_480


def human_size(size: float) -> str:
    """Docker's sizes: decimal units, three significant digits (`1.98MB`, `21.5GB`)."""
    units = ["B", "kB", "MB", "GB", "TB", "PB"]
    i = 0
    while size >= 1000 and i < len(units) - 1:
        size /= 1000
        i += 1
    return f"{size:.3g}{units[i]}"


def _pairs(items: list[str]) -> dict[str, str]:
    return {key: value for key, _, value in (item.partition("=") for item in items)}


def image_id(host: HostState, image: str) -> str:
    """The ID a tag points at on this host: the same on every host unless re-pulled there."""
    name = normalize_image(image)
    return host.image_ids.get(name) or "sha256:" + hashlib.sha256(name.encode()).hexdigest()


def _bytes(size: str) -> int:
    units = {"b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
    size = size.strip().lower()
    if size and size[-1] in units:
        return int(float(size[:-1]) * units[size[-1]])
    return int(size)


_PS_COLUMNS: dict[str, str] = {
    "pid": "PID",
    "ppid": "PPID",
    "user": "USER",
    "uid": "UID",
    "etimes": "ELAPSED",
    "etime": "ELAPSED",
    "times": "TIME",
    "time": "TIME",
    "cputime": "TIME",
    "cputimes": "TIME",
    "args": "COMMAND",
    "cmd": "CMD",
    "command": "COMMAND",
    "comm": "COMMAND",
}


def _etime(seconds: int) -> str:
    days, rem = divmod(seconds, 86400)
    hours, rem = divmod(rem, 3600)
    minutes, secs = divmod(rem, 60)
    text = f"{minutes:02d}:{secs:02d}"
    if hours or days:
        text = f"{hours:02d}:{text}"
    if days:
        text = f"{days}-{text}"
    return text


def _cputime(seconds: int) -> str:
    """procps' TIME column: [DD-]HH:MM:SS of cumulative CPU time."""
    days, rem = divmod(seconds, 86400)
    text = f"{rem // 3600:02d}:{rem % 3600 // 60:02d}:{rem % 60:02d}"
    return f"{days}-{text}" if days else text


def _ps_table(processes: list[SimProcess], ps_args: list[str]) -> Done:
    columns = ["uid", "pid", "ppid", "c", "stime", "tty", "time", "cmd"]
    i = 0
    while i < len(ps_args):
        arg = ps_args[i]
        if arg in ("-o", "-eo", "-ao", "-e", "-A", "-ef", "aux", "-aux", "axo", "-axo"):
            if arg.endswith("o"):
                if i + 1 >= len(ps_args):
                    return fail(f"{_DAEMON}: ps: error: list of format specifiers expected", 1)
                columns = ps_args[i + 1].split(",")
                i += 1
        elif arg.startswith("-o"):
            columns = arg[2:].split(",")
        else:
            return fail(f"{_DAEMON}: ps: error: unsupported option (BSD syntax)\n", 1)
        i += 1
    now = time.monotonic()
    headers = {"uid": "UID", "c": "C", "stime": "STIME", "tty": "TTY"}
    rows: list[list[str]] = []
    titles = []
    for col in columns:
        name = col.split("=")[0]
        if name not in _PS_COLUMNS and name not in headers:
            return fail(f'{_DAEMON}: ps: error: unknown user-defined format specifier "{name}"', 1)
        titles.append(
            col.split("=", 1)[1] if "=" in col else _PS_COLUMNS.get(name, headers.get(name, ""))
        )
    rows.append(titles)
    for proc in processes:
        elapsed = max(0, int(now - proc.started))
        cpu = int(proc.cpu_seconds(now))
        values = {
            "pid": str(proc.pid),
            "ppid": str(proc.ppid),
            "user": proc.user,
            "uid": proc.user,
            "etimes": str(elapsed),
            "etime": _etime(elapsed),
            "args": proc.args,
            "cmd": proc.args,
            "command": proc.args,
            "comm": proc.args.split()[0].rsplit("/", 1)[-1] if proc.args else "",
            "c": "0",
            "stime": time.strftime("%H:%M", time.localtime(time.time() - elapsed)),
            "tty": "?",
            "time": _cputime(cpu),
            "cputime": _cputime(cpu),
            "times": str(cpu),
            "cputimes": str(cpu),
        }
        rows.append([values[c.split("=")[0]] for c in columns])
    return Done(stdout=tabwriter(rows))


# Docker matches these by prefix: `--filter event=exec_start` takes `exec_start: ray status`.
_FUZZY_EVENTS = ("exec_create", "exec_start", "health_status")


def _event_matches(wanted: str, action: str) -> bool:
    if wanted in _FUZZY_EVENTS:
        return action == wanted or action.startswith(wanted + ":")
    return action == wanted
