"""`docker` as the simulated hosts answer it: same flags, output formats, messages and exit codes
as the real CLI for the subset sparkd and an operator use."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

from sparkd_sim import docker_images, docker_views
from sparkd_sim.docker_args import DAEMON, Parsed, is_restarting, no_such, not_running, parse
from sparkd_sim.docker_images import image_id
from sparkd_sim.engine import HostEngine, normalize_image
from sparkd_sim.formats import go_json, render_template, rfc3339
from sparkd_sim.protocol import Done, Exec, Reply, Stream, ToolCall, fail
from sparkd_sim.state import Container, HostState, Mount, RestartPolicy, new_container_id

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
            "ps": functools.partial(docker_views.ps, self.host),
            "run": self.run,
            "rm": self.rm,
            "exec": self.exec,
            "logs": functools.partial(docker_views.logs, self.host),
            "inspect": functools.partial(docker_views.inspect, self.host),
            "top": functools.partial(docker_views.top, self.host),
            "stop": self.stop,
            "kill": self.kill,
            "start": self.start,
            "restart": self.restart,
            "events": self.events,
            "images": functools.partial(docker_images.images, self.host),
            "image": functools.partial(docker_images.image_inspect, self.host),
        }
        if cmd == "ps":
            # The daemon answers only once it has walked every layer whose size is asked.
            walked = docker_views.walked_bytes(self.host, args)
            if walked:
                await asyncio.sleep(walked / 1e9 * self.engine.timing.size_walk)
        handler = handlers.get(cmd)
        if handler is None:
            return fail(
                f"docker: unknown command: docker {cmd}\n\n"
                "Run 'docker --help' for more information",
                rc=1,
            )
        return handler(args)

    # -- run / start / stop / rm -------------------------------------------------------------

    def run(self, args: list[str]) -> Done:
        parsed = parse(args, _RUN_VALUE_FLAGS, _RUN_BOOL_FLAGS, "run")
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
                f'docker: {DAEMON}: Conflict. The container name "/{name}" is already in use by '
                f'container "{existing.id}". You have to remove (or rename) that container to be '
                "able to reuse that name.\n\nRun 'docker run --help' for more information",
                125,
            )
        if normalize_image(image) not in self.host.images:
            if pull == "never":
                return fail(
                    f"docker: {DAEMON}: No such image: {normalize_image(image)}\n\n"
                    "Run 'docker run --help' for more information",
                    125,
                )
            return fail(
                f"Unable to find image '{normalize_image(image)}' locally\n"
                f'docker: {DAEMON}: Get "https://registry-1.docker.io/v2/": dial tcp: lookup '
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
        act: Callable[[Container, Parsed], str | None],
    ) -> Done:
        """Apply `act` to every named container, reporting each like docker does."""
        parsed = parse(args, {"--time", "-t", "--signal", "-s"}, bools, cmd)
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
                err.append(f"{DAEMON}: No such container: {ref}")
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
        def act(c: Container, parsed: Parsed) -> str | None:
            if c.up and not parsed.has("-f", "--force"):
                return (
                    f"{DAEMON}: You cannot remove a {c.status} container {c.id}. "
                    "Stop the container before attempting removal or force remove"
                )
            self.engine.remove(c)
            return None

        return self._each("rm", args, {"-f", "--force", "-v", "--volumes"}, act)

    def stop(self, args: list[str]) -> Done:
        def act(c: Container, _: Parsed) -> str | None:
            self.engine.stop_container(c, 143, by_user=True)
            return None

        return self._each("stop", args, set(), act)

    def kill(self, args: list[str]) -> Done:
        def act(c: Container, _: Parsed) -> str | None:
            if not c.up:
                return f"{DAEMON}: Cannot kill container: {c.name}: Container {c.id} is not running"
            self.engine.stop_container(c, 137, by_user=True)
            return None

        return self._each("kill", args, set(), act)

    def start(self, args: list[str]) -> Done:
        def act(c: Container, _: Parsed) -> str | None:
            if not c.up:
                self.engine.start(c)
            return None

        return self._each("start", args, {"-a", "-i"}, act)

    def restart(self, args: list[str]) -> Done:
        def act(c: Container, _: Parsed) -> str | None:
            self.engine.stop_container(c, 143, by_user=True)
            self.engine.start(c)
            self.engine.emit("restart", c)
            return None

        return self._each("restart", args, set(), act)

    # -- exec --------------------------------------------------------------------------------

    def exec(self, args: list[str]) -> Done | Exec:
        parsed = parse(
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
            return no_such(ref)
        if c.restarting:
            return is_restarting(c)
        if not c.running:
            return not_running(c)
        env = self.env_for(c)
        for item in parsed.many("-e", "--env"):
            key, _, value = item.partition("=")
            env[key] = value
        detach = parsed.has("-d", "--detach")
        exec_id = new_container_id()

        def started(pid: int) -> None:
            c.real_pids.add(pid)
            c.exec_ids.append(exec_id)
            # As Docker does: the command rides in the action (`exec_start: ray status`).
            self.engine.emit("exec_start: " + " ".join(argv), c, execID=exec_id)

        def exited(rc: int) -> None:
            if exec_id in c.exec_ids:
                c.exec_ids.remove(exec_id)
            self.engine.emit("exec_die", c, execID=exec_id, exitCode=str(rc))

        return Exec(env=env, argv=argv, detach=detach, on_started=started, on_exit=exited)

    # -- events ------------------------------------------------------------------------------

    def events(self, args: list[str]) -> Done | Stream:
        parsed = parse(args, {"--format", "-f", "--filter", "--since", "--until"}, set(), "events")
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


def _pairs(items: list[str]) -> dict[str, str]:
    return {key: value for key, _, value in (item.partition("=") for item in items)}


# Docker matches these by prefix: `--filter event=exec_start` takes `exec_start: ray status`.
_FUZZY_EVENTS = ("exec_create", "exec_start", "health_status")


def _event_matches(wanted: str, action: str) -> bool:
    if wanted in _FUZZY_EVENTS:
        return action == wanted or action.startswith(wanted + ":")
    return action == wanted
