"""The controller's cycle over the toy, rollouts included: plan, act with the spec the plan
launches, learn."""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkd.core.deciding import rollout
from sparkd.core.deciding.planner import plan
from sparkd.core.remembering.remember import after_cycle
from sparkd.core.spec import identity, spec_of
from sparkd.model.cluster import ClusterSpec
from sparkd.model.memory import Memory
from sparkd.model.plan import ActionOutcome, ActionResult, Plan
from sparkd.model.probe import CheckResult
from tests.toy import Toy

# What `vllm serve` prints when its engine finds less free GPU memory than
# `gpu_memory_utilization` asks for (vllm-project/vllm `vllm/v1/worker/utils.py`
# `request_memory`, main at 0027b02; the wrapper from `vllm/v1/engine/core_client.py`).
GPU_MEMORY = (
    "(EngineCore_DP0 pid=312) ValueError: Free memory on device cuda:0 (61.05/119.70 GiB) on "
    "startup is less than desired GPU memory utilization (0.85, 101.75 GiB). Decrease GPU "
    "memory utilization or reduce GPU memory used by other processes.",
    "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. "
    "Failed core proc(s): {}",
)
ARG_ERROR = (
    "usage: vllm [-h] [-v]",
    "vllm: error: unrecognized arguments: --enable-resoning",
)


@dataclass
class Run:
    """The controller's cycle over the toy: plan, act with the spec the plan launches, learn."""

    toy: Toy
    desired: ClusterSpec
    memory: Memory = field(default_factory=Memory)
    plans: list[Plan] = field(default_factory=list)
    # Called after the actions of each cycle that launched the model (a fault on the new load).
    on_launch: list[str] = field(default_factory=list)
    # How the acceptance checks come out when they run.
    checks_pass: bool = True

    def cycle(self, seconds: float = 60.0) -> Plan:
        toy = self.toy
        observed = toy.observe()
        if rollout.checks_due(self.desired, self.memory) and observed.probe is not None:
            checks = tuple(
                CheckResult(index=i, ok=self.checks_pass, detail="answer lacks 'Paris'")
                for i in range(len(self.desired.rollout.checks))
            )
            observed = observed.model_copy(update={"checks": checks})
        made = plan(self.desired, observed, self.memory, toy.now)
        spec = made.spec or self.desired
        outcomes = []
        for action in made.actions:
            toy.cluster = spec
            toy.apply(action)
            result: ActionResult = "ok"
            if action.kind in ("start_model", "restart_model"):
                self.launched(spec)
                # As the executor: a serve gone before it was seen running fails its start.
                result = "ok" if toy.serve_running else "failed"
            outcomes.append(
                ActionOutcome(action=action, result=result, started_at=toy.now, finished_at=toy.now)
            )
        self.memory = after_cycle(
            self.memory, observed, outcomes, toy.now, made, self.desired, wall=toy.now
        )
        self.plans.append(made)
        toy.advance(seconds)
        return made

    def launched(self, spec: ClusterSpec) -> None:
        toy = self.toy
        toy.log_tail = ()
        toy.load_stalled_at = None
        bad = identity(spec) != identity(self.good_spec)
        for fault in self.on_launch:
            # `X` hits only a spec other than last-good; `X_all` every launch.
            kind = fault.removesuffix("_all")
            if not bad and kind == fault:
                continue
            if kind == "arg_error":
                toy.serve_running = False
                toy.log_tail = ARG_ERROR
            elif kind == "gpu_memory" and any(
                p.container is None for procs in toy.gpu.values() for p in procs
            ):
                # vLLM's check fails only while another process holds memory.
                toy.serve_running = False
                toy.log_tail = GPU_MEMORY
            elif kind == "gpu_memory_always":
                toy.serve_running = False
                toy.log_tail = GPU_MEMORY
            elif kind == "exit":
                toy.serve_running = False
            elif kind == "stall":
                toy.load_stalled_at = toy.now

    @property
    def good_spec(self) -> ClusterSpec:
        good = self.memory.last_good
        return spec_of(self.desired, good) if good is not None else self.desired

    def until(self, phase: str, limit: int = 40) -> Plan:
        for _ in range(limit):
            made = self.cycle()
            if made.phase == phase:
                return made
        raise AssertionError(f"never {phase}: {[p.reason for p in self.plans[-3:]]}")


def serving() -> Run:
    """A cluster that has served long enough to have a last-good spec."""
    toy = Toy.healthy()
    run = Run(toy=toy, desired=toy.cluster)
    run.memory = Memory(launched_at=toy.serve_started, model_ready_at=toy.now - 100)
    for _ in range(4):
        run.cycle()
    assert run.memory.last_good is not None
    return run
