"""A launch that fails vLLM's free-memory check (vllm-project/vllm `vllm/v1/worker/utils.py`
`request_memory`, main at 0027b02: free memory below `gpu_memory_utilization` of the total)
while another process holds GPU memory on a host is the host's state, not the spec: no
rollback, no budget; the start waits until that process is gone (docs/decisions.md, rollback).
With nobody else on the GPU, the spec's `gpu_memory_utilization` asked too much: a rollback."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sparkd.model.cluster import ClusterSpec
from sparkd.model.observed import GpuProcess
from tests.support.planning import COMMON
from tests.support.toy_run import Run, serving

# A process of no sparkd container: someone's notebook on the worker.
NOTEBOOK = GpuProcess(pid=7001, name="python3", used_memory_mib=40960, container=None)


def with_args(cluster: ClusterSpec, *args: str) -> ClusterSpec:
    model = cluster.model.model_copy(update={"extra_args": (*cluster.model.extra_args, *args)})
    return cluster.model_copy(update={"model": model})


def cut_over(run: Run, holder: bool) -> None:
    """The new spec is cut over with a notebook on spark-b's GPU (`holder`: every launch fails
    the check while it is there), or alone on the GPUs with a spec that asks more than is free
    (its every launch fails the check; the last-good spec's do not)."""
    if holder:
        run.toy.gpu["spark-b"].append(NOTEBOOK)
    run.on_launch = ["gpu_memory_all" if holder else "gpu_memory_always"]
    run.desired = with_args(run.desired, "--max-num-seqs", "8")


def test_a_launch_failed_for_memory_another_process_holds_is_not_the_specs() -> None:
    run = serving()
    cut_over(run, holder=True)
    plans = [run.cycle() for _ in range(8)]
    assert all(p.rollback is None for p in plans), [p.rollback for p in plans]
    record = run.memory.rollout
    assert record is not None and record.result == "in_progress"
    waiting = plans[-1]
    assert "GPU memory held by others" in waiting.reason, waiting.reason
    assert "pid 7001 (python3, 40960 MiB) on spark-b" in waiting.reason
    # The foreign process is the hosts stage's: `blocked` with it named (no kill allowed).
    assert waiting.phase == "blocked" and waiting.latch is None
    assert run.memory.blocked is None
    # Once it is gone, the same spec starts again.
    run.toy.gpu["spark-b"].remove(NOTEBOOK)
    run.on_launch = []
    again = run.cycle()
    assert [a.kind for a in again.actions] == ["start_model"], again.reason
    assert again.rollback is None


def test_with_nobody_else_on_the_gpu_the_memory_failure_is_the_specs() -> None:
    run = serving()
    cut_over(run, holder=False)
    back = next((p for p in (run.cycle() for _ in range(4)) if p.rollback is not None), None)
    assert back is not None, [p.reason for p in run.plans[-3:]]
    assert "Free memory on device" in back.rollback


@COMMON
@given(st.integers(2, 10), st.booleans())
def test_memory_held_by_others_never_rolls_back_or_spends_budget(looks: int, allowed: bool) -> None:
    """Property: however long another process holds the memory, and whether or not the policy
    lets sparkd kill it, the new spec is never rolled back for it nor its budget latched."""
    run = serving()
    policy = run.desired.policy.model_copy(update={"allow_kill_foreign_gpu": allowed})
    run.desired = run.desired.model_copy(update={"policy": policy})
    cut_over(run, holder=True)
    for _ in range(looks):
        made = run.cycle()
        assert made.rollback is None, made.reason
        assert made.latch is None, made.reason
