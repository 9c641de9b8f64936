"""Where a `vllm serve` load stands, from evidence: shared by the Ray and model stages.

Progress means the load advanced: a new stage, a higher percentage or a new progress line, not
any write to the log (a load stuck at 41 % with a chatty log is stuck). Silent stages (CUDA-graph
capture, torch.compile) are told from a hang by the engine processes' CPU time rising.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkd.core.judging.judge import Context, ago
from sparkd.model.cluster import ClusterSpec
from sparkd.model.memory import LoadMark

# Two readings of one launch's start time differ by the process age's one-second resolution.
LAUNCH_SLACK = 2.0
# CPU seconds a silent stage must burn between two looks to count as working.
CPU_ADVANCE = 1.0


@dataclass(frozen=True)
class Load:
    running: bool
    launch: float | None = None
    since_launch: float = 0.0
    # The load is known to have finished once (the endpoint served, or the log says the server
    # started, or a launch sparkd has no memory of is older than load_timeout).
    was_ready: bool = False
    failed: str | None = None
    stalled_for: float = 0.0
    mark: LoadMark | None = None
    where: str = "(no progress in the log yet)"
    # A silent stage past its own cap (CPU burning proves nothing there after so long).
    overdue: str | None = None

    def progressing(self, load_stall: float, load_timeout: float) -> bool:
        """A live load inside its grace: nothing that depends on it may be torn down."""
        return (
            self.running
            and not self.was_ready
            and self.failed is None
            and self.stalled_for <= load_stall
            and self.since_launch <= load_timeout
        )


def launch_time(ctx: Context) -> float | None:
    serve = ctx.observed.serve
    if serve is not None and serve.running and serve.elapsed_seconds is not None:
        return ctx.observed.observed_at - serve.elapsed_seconds
    return ctx.memory.launched_at


def assess(ctx: Context, serving: bool) -> Load:
    serve = ctx.observed.serve
    if serve is None or not serve.running:
        return Load(running=False)
    memory, model = ctx.memory, ctx.desired.model
    launch = launch_time(ctx)
    started = launch if launch is not None else ctx.now
    since_launch = max(0.0, ctx.now - started)
    progress = serve.progress
    known_launch = memory.launched_at is not None and (
        launch is None or memory.launched_at >= launch - LAUNCH_SLACK
    )
    ever_ready = memory.model_ready_at is not None and (
        launch is None or memory.model_ready_at >= launch - LAUNCH_SLACK
    )
    if progress is not None and _before(progress.progress_at, launch):
        # The log was last written before this process started: it tells of a predecessor (a
        # serve restarted by hand, logging elsewhere), nothing about this load.
        progress = None
    log_ready = progress is not None and progress.stage == "ready"
    # Memory lost (state moved aside, a first install over a running deployment): a launch
    # older than any load could take was ready; probe it rather than call it stuck.
    orphan_old = not known_launch and since_launch > model.load_timeout
    was_ready = serving or ever_ready or log_ready or orphan_old

    stage = progress.stage if progress is not None else "starting"
    percent = progress.percent if progress is not None else None
    line = progress.message if progress is not None else ""
    key = f"{stage}|{percent}|{line}"
    cpu = serve.cpu_seconds
    before = memory.load_mark
    same_launch = (
        before is not None
        and before.pid == serve.pid
        and abs(before.launch - started) <= LAUNCH_SLACK
    )
    silent = _silent(stage, percent)
    if before is None or not same_launch:
        # First look at this launch: give it a whole stall window from now. The launch's
        # start is when its first stage began.
        mark = LoadMark(
            pid=serve.pid, launch=started, key=key, cpu_seconds=cpu, at=ctx.now, entered=started
        )
    else:
        burnt = (
            silent is not None
            and cpu is not None
            and before.cpu_seconds is not None
            and cpu - before.cpu_seconds >= CPU_ADVANCE
        )
        if key != before.key:
            mark = LoadMark(
                pid=serve.pid, launch=started, key=key, cpu_seconds=cpu, at=ctx.now, entered=ctx.now
            )
        elif burnt:
            mark = before.model_copy(update={"cpu_seconds": cpu, "at": ctx.now})
        else:
            # CPU is measured from the last advance, so a slow burn adds up across looks.
            mark = before
    failed = (line or "engine failed") if stage == "failed" else None
    overdue: str | None = None
    cap = silent_cap(ctx.desired, mark)
    if cap is not None:
        entered = mark.entered if mark.entered is not None else mark.at
        if ctx.now - entered > cap:
            overdue = (
                f"{_where(stage, percent)} for {ago(ctx.now - entered)} "
                f"(cap {ago(cap)}; CPU burning there may be a spin-waiting hang)"
            )
    return Load(
        running=True,
        launch=launch,
        since_launch=since_launch,
        was_ready=was_ready,
        failed=failed,
        stalled_for=max(0.0, ctx.now - mark.at),
        mark=mark,
        where=_where(stage, percent),
        overdue=overdue,
    )


def _before(at: float | None, launch: float | None) -> bool:
    return at is not None and launch is not None and at < launch - LAUNCH_SLACK


def silent_cap(desired: ClusterSpec, mark: LoadMark) -> float | None:
    """The cap of the silent stage a load mark was taken in, or None outside one."""
    stage, _, rest = mark.key.partition("|")
    text = rest.partition("|")[0]
    try:
        percent = float(text) if text != "None" else None
    except ValueError:
        percent = None
    silent = _silent(stage, percent)
    if silent is None:
        return None
    model = desired.model
    if stage == "starting" and not model.id.startswith("/"):
        # A hub id: the silent start may hold the weights' download, which vLLM 0.32.0 makes
        # with its progress bar off and names at debug level only (model_loader/weight_utils.py
        # `download_weights_from_hf`, `DisabledTqdm`): it prints nothing for as long as it
        # takes, so only the whole load's cap bounds it.
        return model.load_timeout
    cap = model.graph_capture_timeout if silent == "graph_capture" else model.compile_timeout
    return min(cap, model.load_timeout)


def _silent(stage: str, percent: float | None) -> str | None:
    """Which silent stage a load is in, where CPU time is its only sign of work: the start
    (engine start-up and torch.compile, before the first shard or after the last) or CUDA-graph
    capture. None where the log itself advances."""
    if stage == "graph_capture":
        return "graph_capture"
    if stage == "starting" or (stage == "weights" and percent is not None and percent >= 100):
        return "compile"
    return None


def _where(stage: str, percent: float | None) -> str:
    if stage == "weights" and percent is not None:
        return f"weights {percent:g}%"
    if stage == "graph_capture":
        return "CUDA-graph capture"
    if stage == "starting":
        return "(no progress in the log yet)"
    return stage
