"""A first launch of a hub model id downloads its weights before any log line: vLLM 0.32.0
downloads with its progress bar off (`tqdm_class=DisabledTqdm`) and logs the format at debug
level only (model_loader/weight_utils.py `download_weights_from_hf`), so the load sits in its
silent start, CPU rising, for as long as the download takes. Only `model.load_timeout` bounds
that start; a model directory on the host keeps the start's own cap (`compile_timeout`)."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkd.model.memory import Memory
from sparkd.model.observed import LoadProgress, ServeState
from tests.support.toy_run import Run
from tests.toy import Toy

HUB_MODEL = "Qwen/Qwen3-235B-A22B-FP8"


class Downloading(Toy):
    """A new model's first launch: the workers download ~125 GB at ~60 MB/s (35 min), burning
    CPU (TLS, hashing, writes) and printing nothing; then the load goes on as usual."""

    download_seconds: float = 2100.0

    def _serve_state(self) -> ServeState:
        state = super()._serve_state()
        if not state.running or self.ready or self.serve_started is None:
            return state
        elapsed = self.now - self.serve_started
        if elapsed >= self.download_seconds:
            return state
        return state.model_copy(
            update={
                "progress": LoadProgress(stage="starting", progress_at=self.serve_started),
                "cpu_seconds": 0.4 * elapsed,
                "log_tail": (),
            }
        )


def rollout_to(model_id: str) -> tuple[Run, Downloading]:
    toy = Downloading.healthy()
    run = Run(toy=toy, desired=toy.cluster)
    run.memory = Memory(launched_at=toy.serve_started, model_ready_at=toy.now - 100)
    for _ in range(4):
        run.cycle()
    assert run.memory.last_good is not None
    model = toy.cluster.model.model_copy(update={"id": model_id})
    run.desired = toy.cluster.model_copy(update={"model": model})
    toy.load_seconds = 3000.0  # the download, then shards, compile, graphs
    return run, toy


def test_a_download_from_the_hub_is_not_a_stuck_silent_start() -> None:
    run, toy = rollout_to(HUB_MODEL)
    launched_at: float | None = None
    for _ in range(60):  # an hour of looks a minute apart
        made = run.cycle()
        if launched_at is None and any(a.kind == "restart_model" for a in made.actions):
            launched_at = toy.now
            continue
        if launched_at is not None:
            again = [a for a in made.actions if a.kind in ("restart_model", "restart_ray")]
            assert not again, f"{toy.now - launched_at:.0f}s into the download: {made.reason}"
    assert launched_at is not None
    assert run.memory.rollout is not None and run.memory.rollout.rolled_back is None


def test_a_model_directory_keeps_the_silent_starts_own_cap() -> None:
    """The same silence with the weights on the host: no download can explain it, so past
    `compile_timeout` it is a stuck start, as before."""
    run, _ = rollout_to("/models/Qwen3-235B-A22B-FP8")
    reasons = [run.cycle().reason for _ in range(60)]
    stuck = [r for r in reasons if "load stuck in a silent stage" in r]
    assert stuck and "cap 30m00s" in stuck[0], reasons[-3:]


# Each example is a few hundred looks: fewer examples than the planner's other properties.
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.from_regex(
        r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}/[A-Za-z0-9][A-Za-z0-9_.-]{0,30}", fullmatch=True
    ),
    st.floats(min_value=120.0, max_value=4500.0),
    st.sampled_from([30.0, 60.0, 120.0]),
)
def test_a_hub_models_silent_download_is_held_until_the_loads_cap_and_no_longer(
    model_id: str, download: float, every: float
) -> None:
    """Property: whatever the hub id, the download's length and the looks' spacing, a launch
    that downloads in silence and then loads is never restarted (nor Ray, nor rolled back)
    before `model.load_timeout`; at the first look past it with the load unfinished, it is: the
    hold ends."""
    run, toy = rollout_to(model_id)
    toy.download_seconds = download
    toy.load_seconds = download + 900.0  # then shards, compile, graphs
    cap = run.desired.model.load_timeout
    launched_at: float | None = None
    start = toy.now
    while launched_at is None or toy.now - launched_at <= cap + 2 * every:
        loading = not toy.ready
        made = run.cycle(every)
        kinds = [a.kind for a in made.actions]
        if launched_at is None:
            if "restart_model" in kinds:
                launched_at = toy.now
            assert toy.now - start < 3600.0, f"the new spec never launched: {made.reason}"
            continue
        since = toy.now - launched_at
        again = [k for k in kinds if k in ("restart_model", "restart_ray")]
        if since <= cap:
            assert not again, f"{since:.0f}s into a {download:.0f}s download: {made.reason}"
        elif loading:
            assert again, f"{since:.0f}s, past load_timeout, still loading: {made.reason}"
            return
