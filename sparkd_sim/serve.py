"""`vllm serve` inside a simulated head container: a long-lived process whose stdout carries
vLLM's progress lines, which needs the Ray cluster's GPUs, and which starts the model's HTTP
server only once loading is done (until then the port refuses connections)."""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sparkd_sim.checkpoint import missing_files
from sparkd_sim.engine import HostEngine
from sparkd_sim.protocol import Stream
from sparkd_sim.serve_args import ServeArgs
from sparkd_sim.serve_hooks import Held, ModelServer, Placement, ServeFaults, ServerFactory
from sparkd_sim.state import Container, GpuProcess, RayCluster, RayNode, SimProcess
from sparkd_sim.timing import Timing
from sparkd_sim.vllm_logs import (
    EXECUTOR_STEP,
    RUN_TITLE,
    autoscaler_notice,
    compile_lines,
    cuda_oom,
    engine_failed,
    loader_bar,
    missing_weight_files,
    placement_timeout,
    python_warning,
    ray_prefix,
    shm_broadcast_wait,
    ulimit_warning,
    worker_title,
)

SHARDS = 39
GRAPH_SIZES = 67
WEIGHTS_MIB = 96073


@dataclass(eq=False)
class ServeProcess:
    engine: HostEngine
    container: Container
    args: ServeArgs
    cluster: RayCluster | None
    engines: dict[str, HostEngine]
    timing: Timing
    faults: ServeFaults
    server_factory: ServerFactory
    placement: Placement | None = None

    def __post_init__(self) -> None:
        # The process starts as it is made: its PIDs, its output stream and its main task.
        self.stream = Stream()
        self.phase = "init"
        self.server: ModelServer | None = None
        self.workers: list[tuple[HostEngine, Container, SimProcess, GpuProcess]] = []
        self.process = self.engine.add_process(
            self.container, "/usr/bin/python3 /usr/local/bin/vllm serve " + " ".join(self.args.argv)
        )
        self.pid = self.process.pid
        # vLLM's engine core runs in a child process of the API server.
        self.core = self.engine.add_process(self.container, "VLLM::EngineCore")
        self.core.ppid = self.pid
        self._busy(api=1.0, core=1.0)
        self.log_lines: list[str] = []
        self.task: asyncio.Task[None] = asyncio.ensure_future(self._main())
        self._crash = asyncio.Event()
        self._crash_rc = 0
        self.stream.on_disconnect = self.kill_hard
        self._stopping: asyncio.Future[None] | None = None

    def _missing_weights(self, model: str) -> list[str]:
        """What vLLM's loader finds missing: the shards the index names that are not in the
        model directory on the host (through the container's bind mounts)."""
        path = posixpath.normpath(model)
        for mount in self.container.mounts:
            dst = posixpath.normpath(mount.destination)
            if path == dst or path.startswith(dst.rstrip("/") + "/"):
                rest = path[len(dst) :].lstrip("/")
                vanished = self.faults.vanish_weights.pop(model, None)
                if vanished is not None:
                    (Path(mount.source) / rest / vanished).unlink(missing_ok=True)
                found = missing_files(Path(mount.source) / rest)
                if found is not None:
                    return found
        shard = self.faults.missing_weights.get(model)
        return [shard] if shard is not None else []

    # -- output ------------------------------------------------------------------------------

    def _emit(self, line: str) -> None:
        self.log_lines.append(line)
        self.stream.write(line + "\n")

    def _info(self, where: str, message: str, level: str = "INFO") -> None:
        stamp = time.strftime("%m-%d %H:%M:%S")
        self._emit(f"(APIServer pid={self.pid}) {level} {stamp} [{where}] {message}")

    def _core_info(self, where: str, message: str, level: str = "INFO") -> None:
        """A line the engine core logs: the Ray executor's placement runs there, so vLLM
        prefixes it with the core's process (tests/fixtures/vllm-ray-executor/serve.log)."""
        stamp = time.strftime("%m-%d %H:%M:%S")
        self._emit(f"(EngineCore pid={self.core.pid}) {level} {stamp} [{where}] {message}")

    # -- control from the world ----------------------------------------------------------------

    def kill_hard(self) -> None:
        self._finish(137)

    def kill_api_server(self) -> None:
        """SIGKILL of the API server alone. As in real vLLM (issue 55510), its EngineCore and
        the Ray workers stay, holding the GPUs, until their containers go."""
        if self.stream.exit_code.done():
            return
        if self.task is not asyncio.current_task():
            self.task.cancel()
        with contextlib.suppress(ValueError):
            self.container.processes.remove(self.process)
        self._busy(api=0.0, core=0.0, workers=0.0)
        server, self.server = self.server, None
        if server is not None:
            self._stopping = asyncio.ensure_future(server.stop())
        self.phase = "orphaned"
        self.stream.finish(137)

    def terminate(self) -> None:
        self._crash_rc = 0
        self._emit("INFO:     Shutting down")
        self._emit("INFO:     Application shutdown complete.")
        self._finish(143 if self.phase != "running" else 0)

    def crash(self, reason: str) -> None:
        """The engine died (a Ray worker lost, an injected crash): the server exits on its own."""
        if self.stream.exit_code.done():
            return
        self._info("core.py:842", f"EngineCore encountered a fatal error: {reason}", "ERROR")
        self._info("async_llm.py:474", "AsyncLLM output_handler failed.", "ERROR")
        self._emit("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.")
        self._emit("INFO:     Shutting down")
        # vLLM may exit with status 0 after its engine died (vllm#48966).
        self._finish(0)

    async def wait_stopped(self) -> None:
        """Until the model server (if one was started) has closed its socket."""
        if self._stopping is not None:
            await self._stopping

    def _finish(self, rc: int) -> None:
        if self.stream.exit_code.done():
            return
        if self.task is not asyncio.current_task():
            self.task.cancel()
        self._release()
        self.stream.finish(rc)

    def _busy(self, api: float, core: float, workers: float = 0.0) -> None:
        """How many CPUs the API server, the engine core and each Ray worker use from now on."""
        self.process.busy(api)
        self.core.busy(core)
        for _, _, proc, _ in self.workers:
            proc.busy(workers)

    def _release(self) -> None:
        with contextlib.suppress(ValueError):
            self.container.processes.remove(self.process)
        with contextlib.suppress(ValueError):
            self.container.processes.remove(self.core)
        for engine, container, proc, gpu in self.workers:
            with contextlib.suppress(ValueError):
                container.processes.remove(proc)
            with contextlib.suppress(ValueError):
                engine.state.gpu_processes.remove(gpu)
        if self.workers and self.cluster is not None:
            self.cluster.gpus_in_use = max(0.0, self.cluster.gpus_in_use - self.args.gpus)
        self.workers = []
        if self.placement is not None:
            self.placement.release()
        server, self.server = self.server, None
        if server is not None:
            self._stopping = asyncio.ensure_future(server.stop())
        self.phase = "exited"

    # -- the process itself --------------------------------------------------------------------

    async def _main(self) -> None:
        try:
            rc = await self._run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the simulated process dies like a Python traceback would
            self._emit(f"{type(exc).__name__}: {exc}")
            rc = 1
        self._finish(rc)

    async def _run(self) -> int:
        a = self.args
        noisy = self.faults.noisy_log
        if noisy:
            self._emit(ulimit_warning(self.pid))
        self._info("api_server.py:1896", "vLLM API server version 0.11.0")
        self._info(
            "utils.py:328",
            f"non-default args: {{'model': '{a.model}', 'port': {a.port}, "
            f"'tensor_parallel_size': {a.tensor_parallel}, "
            f"'pipeline_parallel_size': {a.pipeline_parallel}}}",
        )
        self._info("model.py:547", "Resolved architecture: Qwen3_5MoeForConditionalGeneration")
        self._info("model.py:1510", f"Using max model len {a.max_model_len}")
        await asyncio.sleep(self.timing.model_init)
        # vLLM 0.32.0 `v1/executor/ray_utils.py` `initialize_ray_cluster`, line 607.
        self._core_info(
            "ray_utils.py:607", "No current placement group found. Creating a new placement group."
        )
        if self.placement is not None:
            held = await self.placement.acquire(
                a.gpus, lambda line: self._core_info("ray_utils.py:613", line, "WARNING")
            )
            if isinstance(held, list):
                for line in held:
                    self._emit(line)
                return 1
            self._hold(held)
        else:
            held = None
        # vLLM 0.32.0 `v1/executor/ray_utils.py` `initialize_ray_cluster`, lines 608-618: fewer
        # GPUs in the cluster than the placement group asks for is only a warning ("delay
        # resource allocation failure response ... wait cluster to be ready"); the group then
        # waits for them (`_wait_until_pg_ready`, up to PG_WAIT_TIMEOUT = 1800 s) and the launch
        # goes on if a node joins in time. Without a Ray cluster, `ray.init()` starts a local one
        # with this node's GPU alone, and the wait is the same.
        total = self.cluster.total_gpus(time.monotonic(), self.timing) if self.cluster else 1.0
        if held is None and total < a.gpus:
            self._core_info(
                "ray_utils.py:613",
                "The number of required GPUs exceeds the total number of available GPUs in "
                "the placement group.",
                "WARNING",
            )
        if held is None and self.cluster is None:
            await self._wait_for_placement(lambda: False)
            return 1
        if noisy:
            # Printed while the placement group waits for the nodes' GPUs; harmless.
            for line in autoscaler_notice(max(1, int(self.timing.model_init)), a.gpus):
                self._emit(line)
        if self.cluster is not None:
            if self._pins_driver() and not any(
                n.ip == self._driver_ip()
                for n in self.cluster.counted_nodes(time.monotonic(), self.timing)
            ):
                # The older executor pins its first bundle to `node:<its own IP>`; no Ray node
                # has that IP (the host's default route is the management network): never placed.
                await self._wait_for_placement(lambda: False)
                return 1
            if not await self._wait_for_placement(self._placeable):
                return 1
            self._place_workers()
        self._busy(api=0.3, core=1.5, workers=1.0)
        missing = self._missing_weights(a.model)
        if missing:
            cause = missing_weight_files([f"{a.model.rstrip('/')}/{name}" for name in missing])
            for line in engine_failed(self.pid, self.core.pid, cause, EXECUTOR_STEP):
                self._emit(line)
            return 1
        await self._load()
        self._workers_run()
        self.phase = "compile"
        await self._compile()
        self.phase = "capture"
        await self._capture()
        if self.faults.oom_capture:
            # torch raises in the engine core; the API server reports it and exits.
            self.faults.oom_capture = False
            for line in engine_failed(self.pid, self.core.pid, cuda_oom("capture_model")):
                self._emit(line)
            return 1
        server = self.server_factory(
            a.served_name or a.model, self.engine.state.address, a.port, a.api_key, a.max_model_len
        )
        try:
            await server.start()
        except OSError as exc:
            self._info(
                "api_server.py:1924", f"[Errno 98] error while attempting to bind: {exc}", "ERROR"
            )
            return 1
        self.server = server
        self.phase = "running"
        self._busy(api=0.02, core=0.02, workers=0.02)
        # vLLM 0.32's line (tests/fixtures/vllm-real/serve.log); older ones said "API server".
        self._info("entry.py:140", f"Starting vLLM server on http://{a.host or '0.0.0.0'}:{a.port}")
        self._emit(f"INFO:     Started server process [{self.pid}]")
        self._emit("INFO:     Waiting for application startup.")
        self._emit("INFO:     Application startup complete.")
        await asyncio.Event().wait()
        return 0

    def _hold(self, held: Held) -> None:
        """Ray workers where the real placement group put its bundles; the engine dies when
        Ray loses one of their nodes."""
        for engine, container in held.nodes:
            self._add_worker(engine, container)
        held.lost.add_done_callback(lambda lost: self.crash(lost.result()))

    def _live_nodes(self) -> list[tuple[RayNode, HostEngine, Container]]:
        """The nodes a bundle can go to, head first: counted by Ray and with their raylet up. A
        node whose container exited still counts until Ray declares it dead, but no worker
        starts there; the placement group waits for another (`_wait_for_placement`)."""
        assert self.cluster is not None
        now = time.monotonic()
        nodes = sorted(
            (n for n in self.cluster.nodes if n.counted(now, self.timing)),
            key=lambda n: not n.is_head,
        )
        live = []
        for node in nodes:
            engine = self.engines[node.host]
            container = engine.state.containers.get(node.container_id)
            if container is not None and container.running:
                live.append((node, engine, container))
        return live

    def _placeable(self) -> bool:
        return len(self._live_nodes()) >= self.args.gpus

    def _place_workers(self) -> None:
        assert self.cluster is not None
        self.cluster.gpus_in_use += self.args.gpus
        placed = self._live_nodes()[: self.args.gpus]
        tp = self.args.tensor_parallel
        for node, _, _ in placed:
            if node.gpus < tp:
                # vLLM 0.32.0 `v1/executor/ray_utils.py` `_verify_bundles`, line 321: once the
                # group is ready, a warning per node holding fewer bundles than the TP size.
                self._core_info(
                    "ray_utils.py:321",
                    f"tensor_parallel_size={tp} is bigger than a reserved number of GPUs "
                    f"({node.gpus:g} GPUs) in a node {node.node_id}. Tensor parallel workers can "
                    "be spread out to 2+ nodes which can degrade the performance unless you have "
                    "fast interconnect across nodes, like Infiniband. To resolve this issue, make "
                    f"sure you have more than {tp} GPUs available at each node.",
                    "WARNING",
                )
        for _, engine, container in placed:
            self._add_worker(engine, container)

    def _add_worker(self, engine: HostEngine, container: Container) -> None:
        """One of RayExecutorV2's `RayWorkerProc` actors, rank by rank. vLLM titles it
        `VLLM::Worker_TP<rank>` while it loads the weights (tests/fixtures/vllm-ray-titles)."""
        title = worker_title(
            len(self.workers), self.args.tensor_parallel, self.args.pipeline_parallel
        )
        proc = engine.add_process(container, title, cores=1.0)
        gpu = GpuProcess(pid=proc.pid, name=title, used_mib=1052, container_id=container.id)
        engine.state.gpu_processes.append(gpu)
        self.workers.append((engine, container, proc, gpu))

    def _workers_run(self) -> None:
        """Loading done: `initialize_worker` returned and each actor runs its busy loop, where
        torch.compile, the graph capture and serving happen: Ray's title from now on."""
        for _, _, proc, gpu in self.workers:
            proc.args = gpu.name = RUN_TITLE

    async def _load(self) -> None:
        self.phase = "loading"
        per_shard = self.timing.model_load / SHARDS
        if self.faults.slow_load:
            per_shard *= self.timing.slow_load_factor
        started = time.monotonic()
        a = self.args
        bar = loader_bar(a.load_format, a.load_strategy, a.multithread)
        for done in range(SHARDS + 1):
            elapsed = time.monotonic() - started
            if bar is not None:
                self._emit(self._bar_line(bar, done, elapsed, per_shard))
            for _, _, _, gpu in self.workers:
                gpu.used_mib = 1052 + (WEIGHTS_MIB - 1052) * done // SHARDS
            if self.faults.noisy_log and done == 1 and self.workers:
                # Rank 0 runs on the driver's node: Ray's prefix names no IP.
                for line in python_warning(self.workers[0][2].pid):
                    self._emit(line)
            if self.faults.stall_load and done == SHARDS * 4 // 10:
                # A wedged read: no progress, no output, no CPU, until the process is killed.
                self.faults.stall_load = False
                self._busy(api=0.0, core=0.0, workers=0.0)
                await asyncio.Event().wait()
            if self.faults.chatty_stall and done == (SHARDS * 41 + 99) // 100:
                self.faults.chatty_stall = False
                await self._chatty_stall()
            if done < SHARDS:
                await asyncio.sleep(per_shard)
                if self.faults.load_gate is not None:
                    await self.faults.load_gate.acquire()
        took = time.monotonic() - started
        self._info("default_loader.py:267", f"Loading weights took {took:.2f} seconds")
        self._info(
            "gpu_model_runner.py:2653", f"Model loading took 58.31 GiB and {took:.6f} seconds"
        )

    def _bar_line(self, bar: tuple[str, str], done: int, elapsed: float, per_shard: float) -> str:
        """tqdm's line for `done` of SHARDS, as the rank-0 worker prints it: tqdm writes `\r`
        before each refresh, Ray puts its prefix before the line (the worker is on the
        driver's node: no IP)."""
        desc, unit = bar
        scale = {"shards": 1, "tensors": 41}.get(unit, 0)
        if scale:
            count, total = f"{done * scale}", f"{SHARDS * scale}"
        else:  # bytes, with tqdm's unit_scale
            count, total = f"{done * 2.5:.1f}G", f"{SHARDS * 2.5:.1f}G"
        rate = f"{elapsed / done:.2f}s/it" if done else "?it/s"
        remaining = _clock((SHARDS - done) * per_shard) if done else "?"
        line = (
            f"{desc}: {done * 100 // SHARDS:3d}% Completed | {count}/{total} "
            f"[{_clock(elapsed)}<{remaining}, {rate}]"
        )
        if not self.workers:
            return line
        return f"{ray_prefix(self.workers[0][2].pid)}\r{line}"

    def _pins_driver(self) -> bool:
        """Whether the placement group pins a GPU to the driver's own node (`node:<its IP>`).
        vLLM 0.32.0 runs `RayExecutorV2` unless `VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0`
        (`vllm/envs.py` line 944, `v1/executor/abstract.py` 77-85), and it calls
        `initialize_ray_cluster(..., require_gpu_on_driver=False)` (`ray_executor_v2.py` line
        295): no pin, and its workers connect by Ray's node IPs, not VLLM_HOST_IP. Only the
        older `RayDistributedExecutor` pins (`ray_utils.py` 632-643); 0.34.0 has no other."""
        value = self.container.env.get("VLLM_USE_RAY_V2_EXECUTOR_BACKEND", "1")
        return value.strip().lstrip("+-").isdigit() and int(value) == 0

    def _driver_ip(self) -> str:
        """The IP the driver names itself by: VLLM_HOST_IP, else the host's own address."""
        return self.container.env.get("VLLM_HOST_IP") or self.engine.state.address

    async def _wait_for_placement(self, placeable: Callable[[], bool]) -> bool:
        """Whether the placement group was placed: `placeable` polled while it waits, with the
        lines real vLLM prints at 10, 30, 70, ... seconds, and its error at the end."""
        if placeable():
            return True
        self._busy(api=0.01, core=0.01)
        specs: list[dict[str, float]] = [{"GPU": 1.0} for _ in range(self.args.gpus)]
        if self._pins_driver():
            # Added after the GPU, as `initialize_ray_cluster` does (line 643).
            specs[0][f"node:{self._driver_ip()}"] = 0.001
        first, timeout = self.timing.pg_wait_first, self.timing.pg_wait_timeout
        waited, interval, line_at = 0.0, first, first
        while waited < timeout:
            step = min(first / 10, timeout - waited)
            await asyncio.sleep(step)
            waited += step
            if placeable():
                return True
            if line_at <= waited < timeout:
                # vLLM 0.32.0 `v1/executor/ray_utils.py` `_wait_until_pg_ready` (logged as line
                # 467: tests/fixtures/vllm-ray-executor/placement-wait.log).
                self._core_info(
                    "ray_utils.py:467",
                    f"Waiting for creating a placement group of specs for "
                    f"{int(line_at / first * 10)} seconds. specs={specs}. Check `ray status` "
                    "and `ray list nodes` to see if you have enough resources, and make sure "
                    "the IP addresses used by ray cluster are the same as VLLM_HOST_IP "
                    "environment variable specified in each node if you are running on a "
                    "multi-node.",
                )
                interval *= 2
                line_at += interval
        for line in placement_timeout(specs):
            self._emit(line)
        return False

    async def _chatty_stall(self) -> None:
        """Stuck (a worker waits on a peer that never answers) but far from quiet: the engine's
        warnings keep the log's mtime moving; no new progress line, no CPU."""
        self._busy(api=0.0, core=0.0, workers=0.0)
        waited = 0
        while True:
            await asyncio.sleep(self.timing.stall_chatter)
            waited += 60
            self._emit(shm_broadcast_wait(self.core.pid, waited))

    async def _compile(self) -> None:
        """torch.compile: two lines, then a long quiet stretch that keeps the CPUs busy."""
        self._busy(api=0.05, core=1.0, workers=1.0)
        for line in compile_lines(self.core.pid):
            self._emit(line)
        await asyncio.sleep(self.timing.graph_capture / 2)

    async def _capture(self) -> None:
        steps = 4
        started = time.monotonic()
        for step in range(steps + 1):
            done = GRAPH_SIZES * step // steps
            bar = "█" * (10 * step // steps) + " " * (10 - 10 * step // steps)
            self._emit(
                "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): "
                f"{done * 100 // GRAPH_SIZES:3d}%|{bar}| {done}/{GRAPH_SIZES} "
                f"[{_clock(time.monotonic() - started)}<00:00, 2.21it/s]"
            )
            if self.faults.oom_capture and step == steps // 2:
                return
            if self.faults.hang_capture and step == steps // 2:
                self.faults.hang_capture = False
                self._busy(api=0.05, core=1.0, workers=1.0)
                await asyncio.Event().wait()
            if step < steps:
                await asyncio.sleep(self.timing.graph_capture / 2 / steps)
        self._info("gpu_model_runner.py:3480", "Graph capturing finished in 35 secs, took 0.86 GiB")
        self._info(
            "core.py:210", "init engine (profile, create kv cache, warmup model) took 61.2 s"
        )


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes:02d}:{secs:02d}"
