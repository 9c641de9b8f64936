"""Faults of what runs on a host: the model server, its loads and weights, its answers, the
containers, images and dockerd, and the fake tools that hang."""

from __future__ import annotations

import hashlib
import secrets
import shlex
from pathlib import Path
from typing import get_args

from sparkd_sim.checkpoint import shard_name, write_checkpoint
from sparkd_sim.consequences import Consequences
from sparkd_sim.engine import normalize_image
from sparkd_sim.hosts import TOOLS
from sparkd_sim.reference import QWEN_IMAGE
from sparkd_sim.vllm_text import AnswerStyle
from sparkd_sim.world_state import WorldState

# A prompt a long-context user sends: longer than two Sparks prefill in a minute (~2k tokens/s).
LONG_PROMPT_TOKENS = 150_000


class ModelFaults:
    """What each model, container and tool fault does."""

    def __init__(self, state: WorldState, consequences: Consequences) -> None:
        self.state = state
        self.consequences = consequences

    async def crash_model(self, host: str) -> str:
        self.state.serve_on(host).crash("injected crash")
        return f"model on {host} crashed"

    async def hang_engine(self, host: str) -> str:
        self.state.host(host).behaviour.engine = "hung"
        return f"engine on {host} hung: /health 200, completions never finish"

    async def hang_under_load(self, host: str) -> str:
        """Other clients' requests running when the engine hangs: vLLM's API server still
        answers /metrics with the engine's last figures, requests running and the token counter
        standing still. The hang, and the load, are this serve process's: the next one serves
        as the host did before."""
        h = self.state.host(host)
        serve = self.state.serve_on(host)
        style = h.behaviour.style
        h.behaviour.style = "busy"
        h.behaviour.engine = "hung"

        def recover(_: object) -> None:
            if h.behaviour.engine == "hung":
                h.behaviour.engine = "ok"
                h.behaviour.style = style

        serve.stream.exit_code.add_done_callback(recover)
        return f"engine on {host} hung under load: requests running, no token generated"

    async def long_prompt(self, host: str, arg: str | None = None) -> str:
        """A client sends the model on `host` a prompt of `arg` tokens (default 150000): while
        it is prefilled one more request runs, no token counter moves, the KV cache fills and
        requests that arrive meanwhile wait; then it is answered as any other."""
        tokens = int(arg) if arg else LONG_PROMPT_TOKENS
        if tokens <= 0:
            raise ValueError("long-prompt needs a positive number of prompt tokens")
        server = self.state.serve_on(host).server
        if server is None:
            raise ValueError(f"the model on {host} is not serving yet")
        server.send_prompt(tokens)
        return f"a client sent the model on {host} a prompt of {tokens} tokens"

    async def oom_capture(self, host: str) -> str:
        self.state.host(host).faults.oom_capture = True
        return f"next CUDA graph capture on {host} is OOM-killed"

    async def kill_container(self, host: str, arg: str | None = None) -> str:
        h = self.state.host(host)
        if arg is None:
            raise ValueError("kill-container needs a container name")
        container = h.state.container(arg)
        if container is None or not container.running:
            raise ValueError(f"no running container {arg!r} on {host}")
        h.engine.stop_container(container, 137, by_user=False)
        return f"container {container.name} on {host} killed (exit 137)"

    async def hang_container(self, host: str, arg: str | None = None) -> str:
        """Every process of container `arg` stops (SIGSTOP), as on a wedged node while its host
        still answers SSH; `heal` continues them."""
        h = self.state.host(host)
        container = h.state.container(arg) if arg is not None else None
        if container is None or not container.running:
            raise ValueError(f"hang-container needs a running container on {host}, got {arg!r}")
        self.consequences.freeze(container)
        return f"container {container.name} on {host} hung (its processes stopped)"

    async def crash_loop(self, host: str, arg: str | None = None) -> str:
        """Container `arg`'s process dies at start-up from now on: under a restart policy docker
        restarts it with its backoff, `restarting` in between."""
        h = self.state.host(host)
        if arg is None:
            raise ValueError("crash-loop needs a container name")
        container = h.state.container(arg)
        if container is None:
            raise ValueError(f"no container {arg!r} on {host}")
        container.crash_loop = True
        if container.running:
            h.engine.stop_container(container, 1, by_user=False)
        return f"container {container.name} on {host} now exits at start-up ({container.restart})"

    async def repull_image(self, host: str, arg: str | None = None) -> str:
        """Tag `arg` (default: the Ray image) now points at a new image ID on `host` only, as
        after a `docker pull` of a moved tag there; existing containers keep their image."""
        h = self.state.host(host)
        name = normalize_image(arg or QWEN_IMAGE)
        new_id = "sha256:" + secrets.token_hex(32)
        h.state.images.add(name)
        h.state.image_ids[name] = new_id
        return f"{name} on {host} is now {new_id[:19]}"

    async def image_without_ray(self, host: str, arg: str | None = None) -> str:
        """Tag `arg` (default: the Ray image) on `host` is now an image without `ray`, as NGC's
        vLLM image from 26.05 (NVIDIA/dgx-spark-playbooks nvidia/vllm/README.md: "ships without
        ray"), pulled there: a new image ID, and `ray start` in a container of it exits 127 at
        once. The same image ID on every host it is pulled on; existing containers keep their
        image; a re-pull (`repull-image`) brings one with `ray` again."""
        h = self.state.host(host)
        name = normalize_image(arg or QWEN_IMAGE)
        # The same image wherever it is pulled: one ID for the tag on every host.
        new_id = "sha256:" + hashlib.sha256(f"without ray: {name}".encode()).hexdigest()
        h.state.images.add(name)
        h.state.image_ids[name] = new_id
        h.state.rayless_ids.add(new_id)
        return f"{name} on {host} is now {new_id[:19]}, without ray"

    async def pull_image(self, host: str, arg: str | None = None) -> str:
        """`docker pull` of tag `arg` on `host`: the same image ID every host pulls."""
        if not arg:
            raise ValueError("pull-image needs the tag")
        name = normalize_image(arg)
        self.state.host(host).state.images.add(name)
        return f"{name} pulled on {host}"

    async def orphan_engine(self, host: str) -> str:
        """`kill -9` of the API server: its EngineCore and Ray workers stay with the GPUs."""
        self.state.serve_on(host).kill_api_server()
        return f"vllm serve on {host} SIGKILLed; its engine stays"

    async def hang_capture(self, host: str) -> str:
        self.state.host(host).faults.hang_capture = True
        return f"the next CUDA-graph capture on {host} hangs, spinning"

    async def missing_weights(self, host: str, arg: str | None = None) -> str:
        """`arg` is `MODEL[:FILE]`: a shard of MODEL's checkpoint (default the second of 39) is
        gone from the model directory (made first if MODEL had none), until `heal`; every load
        of that model fails for it, as vLLM's loader finds the file absent."""
        if not arg:
            raise ValueError("fault 'missing-weights' needs MODEL[:FILE]")
        model, _, shard = arg.partition(":")
        shard = shard or shard_name(2)
        if model.startswith("/models/"):
            directory = self.state.model_dir(model)
            if not (directory / "model.safetensors.index.json").exists():
                write_checkpoint(directory)
            (directory / shard).unlink(missing_ok=True)
            self.state.damaged.add(model)
        self.state.host(host).faults.missing_weights[model] = shard
        return f"{model} on {host} misses a weight file its index names"

    async def vanish_weights(self, host: str, arg: str | None = None) -> str:
        """`arg` is `MODEL[:FILE]`: the shard goes from MODEL's directory (under /models) once
        the next serve of MODEL on `host` has started, after sparkd prepared the cutover."""
        if not arg or not arg.startswith("/models/"):
            raise ValueError("fault 'vanish-weights' needs MODEL[:FILE], MODEL under /models")
        model, _, shard = arg.partition(":")
        self.state.host(host).faults.vanish_weights[model] = shard or shard_name(2)
        self.state.damaged.add(model)
        return f"a weight file of {model} goes from {host} once its next serve starts"

    async def slow_load(self, host: str) -> str:
        self.state.host(host).faults.slow_load = True
        return f"model loads on {host} take {self.state.timing.slow_load_factor:g}x longer"

    async def hang_tool(self, host: str, arg: str | None = None) -> str:
        """Calls of fake tool `arg` on `host` (inside its containers too) never answer, as a
        wedged `nvidia-smi` or a `ray status` stuck on a dead GCS does. `arg` may go on with
        arguments (`docker ps`): then only calls starting with those words hang. `ray` alone
        also stalls the host's Ray dashboard (its state API waits on the same GCS)."""
        words = tuple(shlex.split(arg or ""))
        tools = [t for t in TOOLS if t != "sudo"]
        if not words or words[0] not in tools:
            raise ValueError(f"hang-tool needs one of: {', '.join(tools)} (and any arguments)")
        self.state.host(host).hung_tools.add(words)
        return f"{' '.join(words)} on {host} now hangs"

    async def docker_down(self, host: str) -> str:
        self.state.host(host).docker_down = True
        return f"dockerd on {host} is gone; its containers keep running"

    async def docker_hung(self, host: str) -> str:
        self.state.host(host).hung_tools.add(("docker",))
        return f"every docker call on {host} now hangs (a wedged dockerd)"

    async def hand_restart_serve(self, host: str) -> str:
        """An operator restarts `vllm serve` by hand: stopped, then started again with the same
        arguments into the same log, without sparkd's launch marker or PID file."""
        serve = self.state.serve_on(host)
        h = self.state.host(host)
        argv, container = list(serve.args.argv), serve.container
        serve.terminate()
        await serve.wait_stopped()
        inner = f"exec vllm serve {shlex.join(argv)} >>{h.state.log_dir}/serve.log 2>&1"
        key = Path(h.state.log_dir) / "api_key"
        if serve.args.api_key is not None and key.exists():
            inner = f'VLLM_API_KEY="$(cat {key})"; export VLLM_API_KEY; {inner}'
        command = f"docker exec -d {container.name} sh -c {shlex.quote(inner)}"
        rc, _, err = await h.ssh.run_local(command)
        if rc != 0:
            raise RuntimeError(f"could not restart the model on {host}: {err.strip()}")
        return f"vllm serve on {host} restarted by hand (same arguments, no sparkd marker)"

    async def stall_load(self, host: str) -> str:
        self.state.host(host).faults.stall_load = True
        return f"the next model load on {host} stalls at 40% and never finishes"

    async def chatty_stall(self, host: str) -> str:
        self.state.host(host).faults.chatty_stall = True
        return f"the next model load on {host} sticks at 41% while its log keeps getting warnings"

    async def noisy_load(self, host: str) -> str:
        self.state.host(host).faults.noisy_log = True
        return f"model loads on {host} print vLLM's and Ray's harmless error-like warnings"

    async def answer_style(self, host: str, arg: str | None = None) -> str:
        styles: tuple[AnswerStyle, ...] = get_args(AnswerStyle)
        style = (arg or "").replace("-", "_")
        if style not in styles:
            raise ValueError(f"answer-style needs one of: {', '.join(styles)}")
        self.state.host(host).behaviour.style = style
        return f"model on {host} now answers {style}"
