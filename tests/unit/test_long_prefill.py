"""A long prompt being prefilled is not a hang (issue 43).

vLLM V1 emits no output for a step that prefills only part of a prompt, so while a 120k-token
prompt is prefilled (a minute or more on two Sparks) one request runs and
`vllm:generation_tokens_total` (and `vllm:prompt_tokens_total`, counted when the prefill ends)
stand still, while `vllm:kv_cache_usage_perc` rises with every chunk: the scheduler stats come
with every engine step (0.32.0 and 0.34.0 `v1/core/sched/scheduler.py` `should_emit_output`,
"We must return the stats even if there are no request outputs this step";
tests/fixtures/vllm-prefill/README.md). A hung engine makes no step: every figure stands.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkd.core.deciding.planner import plan
from sparkd.core.judging.hang import _reading as reading_of
from sparkd.core.judging.hang import longest_prefill, longest_step, max_model_len_arg, stands
from sparkd.core.reading.classify import EngineLoad, judge_timeout
from sparkd.core.remembering.remember import remember
from sparkd.core.spec import model_spec_hash
from sparkd.model.observed import ModelEndpoint, Observed
from sparkd.model.plan import Plan
from tests.support.looks import look, restarts, served, walk
from tests.support.toy_run import Run, serving
from tests.toy import Toy


def with_args(toy: Toy, *args: str) -> None:
    model = toy.cluster.model.model_copy(update={"extra_args": args})
    toy.cluster = toy.cluster.model_copy(update={"model": model})


# -- judge_hang ---------------------------------------------------------------------------------


def test_a_long_prefill_is_not_restarted() -> None:
    """A 250k-token prompt on two Sparks (about 2k tokens/s): two minutes with one request
    running and the token counter still, the KV cache filling. Today's code restarted the
    model after `hang_window`, killing the user's request."""
    toy, memory = served()
    toy.prefilling = True
    plans = walk(toy, memory, looks=5)  # two minutes of looks
    assert not restarts(plans), [p.reason for p in restarts(plans)]
    withheld = [p.reason for p in plans if "not restarting:" in p.reason]
    assert withheld, [p.reason for p in plans]
    assert (
        "not restarting: 1 request(s) running and the KV cache grew since the last look "
        "(vllm:kv_cache_usage_perc 0.25375 -> 0.2575) while vllm:generation_tokens_total "
        "stood at 12345 for 1m00s: a long prefill"
    ) in withheld[0]
    # The prefill ends in a token: the model serves, nothing was restarted.
    toy.prefilling = False
    toy.tokens += 1
    plans = walk(toy, memory, looks=3)
    assert not restarts(plans)


def test_a_hang_with_the_kv_cache_still_is_restarted_within_the_window() -> None:
    """The same look as a prefill, except that nothing moves: the engine made no step."""
    toy, memory = served()
    toy.hung_under_load = True
    plans = walk(toy, memory, looks=10)
    assert len(plans) == 3 and restarts(plans)
    reason = plans[-1].actions[0].reason
    assert reason.startswith("hung under load: 1 request(s) running"), reason
    assert "vllm:kv_cache_usage_perc still at 0.25: no engine step since" in reason


def test_a_prefill_that_ends_and_then_hangs_is_restarted() -> None:
    toy, memory = served()
    toy.prefilling = True
    plans = walk(toy, memory, looks=3)
    assert not restarts(plans)
    toy.prefilling, toy.hung_under_load = False, True  # the KV cache stops: no step since
    plans = walk(toy, memory, looks=10)
    assert restarts(plans)


def test_without_the_kv_gauge_the_wait_is_the_longest_prefill() -> None:
    """No `vllm:kv_cache_usage_perc` (a partial reading, an older vLLM): a prefill cannot be
    told from a hang, so the wait is the longest prompt the engine takes (`max_model_len` from
    /v1/models, 262144 tokens) at `policy.prefill_rate` (1000 tokens/s): 262 s, then the
    restart, so the hold ends."""
    toy, memory = served()
    toy.kv_cache_usage = None
    toy.hung_under_load = True
    start = toy.now
    plans = walk(toy, memory, looks=20)
    assert restarts(plans)
    assert toy.now - start == 270.0  # the first look 30 s apart at or past 262.144 s
    reason = plans[-1].actions[0].reason
    assert "max_model_len 262144 (as /v1/models says) at policy.prefill_rate 1000" in reason


def test_the_max_model_len_arg_bounds_the_wait_when_v1_models_does_not_say() -> None:
    toy, _ = served()
    with_args(toy, "--max-model-len", "128k")
    seen = toy.observe().endpoint
    assert seen is not None
    silent = reading_of(seen.model_copy(update={"max_model_len": None}))
    prefill = longest_prefill(toy.cluster, silent)
    assert prefill.seconds == 128.0
    assert "max_model_len 128000 (--max-model-len)" in prefill.how
    # /v1/models, when it says, is what the engine really took (the flag's `auto` included).
    assert longest_prefill(toy.cluster, reading_of(seen)).seconds == 262.144


def test_with_nothing_to_say_how_long_a_prompt_can_be_a_million_tokens_are_assumed() -> None:
    toy, memory = served()
    toy.kv_cache_usage, toy.max_model_len = None, None
    toy.hung_under_load = True
    start = toy.now
    plans = walk(toy, memory, looks=60)
    assert restarts(plans) and toy.now - start == 1050.0  # 1048.576 s, at the next look
    assert "max_model_len 1048576 (assumed" in plans[-1].actions[0].reason


def test_the_prefill_rate_is_a_config_key() -> None:
    toy, memory = served()
    toy.kv_cache_usage = None
    policy = toy.cluster.policy.model_copy(update={"prefill_rate": 262144 / 90})
    toy.cluster = toy.cluster.model_copy(update={"policy": policy})
    toy.hung_under_load = True
    start = toy.now
    plans = walk(toy, memory, looks=20)
    assert restarts(plans) and toy.now - start == 90.0


def test_a_kv_cache_moving_for_ever_without_a_token_ends_in_a_restart() -> None:
    """No prefill lasts longer than the longest prompt at the slowest rate: an engine that keeps
    stepping with no token past that is not prefilling (a livelock), and the hold ends."""
    toy, memory = served()
    toy.prefilling = True
    start = toy.now
    plans = walk(toy, memory, looks=20)
    assert restarts(plans) and toy.now - start == 270.0
    reason = plans[-1].actions[0].reason
    assert "while vllm:kv_cache_usage_perc moved: longer than the longest prefill" in reason


def test_no_probe_is_skipped_for_a_prefill() -> None:
    """`stands` (a look skips its probe into a hang it will restart) agrees with the plan."""
    toy, memory = served()
    toy.prefilling = True
    _, memory = look(toy, memory)
    toy.advance(90.0)
    assert not stands(toy.cluster, memory, toy.observe().endpoint, toy.now)
    toy.prefilling, toy.hung_under_load = False, True
    _, memory = look(toy, memory)
    toy.advance(60.0)
    assert stands(toy.cluster, memory, toy.observe().endpoint, toy.now)


def test_max_model_len_arg_reads_as_vllm_does() -> None:
    assert max_model_len_arg(("--max-model-len", "131072")) == 131072
    assert max_model_len_arg(("--max_model_len=128k",)) == 128000
    assert max_model_len_arg(("--max-model-len", "128K")) == 131072
    assert max_model_len_arg(("--max-model-len", "auto")) is None
    assert max_model_len_arg(("--max-model-len", "-1")) is None
    assert max_model_len_arg(("--max-model-len", "1.5K")) is None  # vLLM refuses it
    assert max_model_len_arg(("--max-model-len", "1k", "--max-model-len", "2k")) == 2000
    assert max_model_len_arg(("--max-model-len",)) is None
    assert max_model_len_arg(()) is None


def test_an_absurd_max_model_len_bounds_the_wait_no_further() -> None:
    toy, _ = served()
    seen = toy.observe().endpoint
    assert seen is not None
    huge = seen.model_copy(update={"max_model_len": 10**15})
    prefill = longest_prefill(toy.cluster, reading_of(huge))
    assert prefill.seconds == (1 << 22) / 1000.0


# -- judge_timeout ------------------------------------------------------------------------------


def test_a_probe_queued_behind_a_long_prefill_is_busy_not_hung() -> None:
    """The probe waits behind the prefill (V1 schedules running requests first and the chunk
    takes the token budget), times out, and its abort is processed: no token, one other
    request, the KV cache grew. Today's code called it hung."""
    before = EngineLoad(running=1, waiting=0, generation_tokens=48211, kv_cache_usage=0.31)
    after = EngineLoad(running=1, waiting=0, generation_tokens=48211, kv_cache_usage=0.34)
    busy, seen = judge_timeout(before, after, 50)
    assert busy is True, seen
    assert "a long prefill ahead of the probe" in seen


def test_a_probe_timeout_with_every_figure_still_is_hung() -> None:
    before = EngineLoad(running=1, waiting=0, generation_tokens=48211, kv_cache_usage=0.31)
    after = EngineLoad(running=2, waiting=0, generation_tokens=48211, kv_cache_usage=0.31)
    busy, seen = judge_timeout(before, after, 50)
    assert busy is False and seen.endswith(": hung"), seen


# -- one engine step: the scheduler's stats come only when it ends ---------------------------


def launched_with(toy: Toy, *args: str) -> None:
    """The model launched with these arguments: its serve runs that spec (no drift)."""
    with_args(toy, *args)
    toy.serve_spec = model_spec_hash(toy.cluster)


def test_a_whole_prompt_prefilled_in_one_step_is_not_a_hang() -> None:
    """`--no-enable-chunked-prefill`: vLLM 0.32.0 never splits a prompt then
    (v1/core/sched/scheduler.py) and config/scheduler.py makes max_num_batched_tokens at least
    max_model_len: a 131k-token prompt is one step, and the stats (the KV gauge among them)
    come only once it ends: about 131 s of every figure still at policy.prefill_rate 1000."""
    toy, memory = served()
    launched_with(toy, "--no-enable-chunked-prefill", "--max-model-len", "131072")
    toy.max_model_len = 131072
    toy.hung_under_load = True  # one step in flight: running 1, every figure still
    start = toy.now
    plans = walk(toy, memory, looks=20)
    early = [p for p in restarts(plans) if toy.now - start < 131.0]
    assert not early, [p.actions[0].reason for p in early]
    # A real hang still ends in a restart, once one step could have ended.
    assert restarts(plans), [p.reason for p in plans]
    reason = restarts(plans)[0].actions[0].reason
    assert "a whole prompt (--no-enable-chunked-prefill)" in reason, reason


def test_a_large_step_budget_holds_the_hang_for_one_step() -> None:
    """Chunked prefill on with `--max-num-batched-tokens 131072` (a long-context tuning): one
    chunk is 131k tokens, one step, no stats for about 131 s."""
    toy, memory = served()
    launched_with(toy, "--max-num-batched-tokens", "131072")
    toy.hung_under_load = True
    start = toy.now
    plans = walk(toy, memory, looks=20)
    early = [p for p in restarts(plans) if toy.now - start < 131.0]
    assert not early, [p.actions[0].reason for p in early]
    assert restarts(plans), [p.reason for p in plans]


def test_vllms_default_step_is_within_the_hang_window() -> None:
    """Without either flag the step is vLLM's default (at most 16384 tokens for the API
    server, 0.32.0 engine/arg_utils.py): 16 s, below hang_window: the window decides."""
    toy, _ = served()
    step = longest_step(toy.cluster, None)
    assert step.seconds < toy.cluster.policy.hang_window
    assert "vLLM's largest default" in step.how


def test_a_probe_queued_behind_one_long_step_is_unknown_not_hung() -> None:
    """Every figure still while the probe waited less than one step can last: the probe saw
    no step end, which says nothing of a hang."""
    before = EngineLoad(running=1, waiting=0, generation_tokens=48211, kv_cache_usage=0.31)
    after = EngineLoad(running=2, waiting=0, generation_tokens=48211, kv_cache_usage=0.31)
    busy, seen = judge_timeout(before, after, 50, waited=30.0, one_step=131.0)
    assert busy is None and "less than one engine step can take" in seen, seen
    busy, seen = judge_timeout(before, after, 50, waited=140.0, one_step=131.0)
    assert busy is False and seen.endswith(": hung"), seen


# -- properties -------------------------------------------------------------------------------


def with_reading(
    seen: Observed, running: float, tokens: float, prompt: float, kv: float
) -> Observed:
    endpoint = seen.endpoint or ModelEndpoint(status="up", health_status=200)
    update = {
        "requests_running": running,
        "generation_tokens_total": tokens,
        "prompt_tokens_total": prompt,
        "kv_cache_usage": kv,
    }
    return seen.model_copy(update={"endpoint": endpoint.model_copy(update=update)})


# (seconds since the look before, requests running, generation-counter change, whether the
# prompt counter moved, KV-cache usage change): at every look the KV cache or the prompt
# counter moved since the look before.
MOVING = st.lists(
    st.tuples(
        st.floats(1.0, 90.0),
        st.sampled_from([0.0, 1.0, 1.0, 1.0, 4.0]),
        st.sampled_from([0.0, 0.0, 0.0, 0.0, 1.0, -500.0]),
        st.booleans(),
        st.sampled_from([0.001, 0.002, 0.01, -0.005]),
    ).filter(lambda look: look[3] or look[4] != 0.0),
    min_size=1,
    max_size=30,
)
PROPS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def replay(
    looks: list[tuple[float, float, float, bool, float]],
) -> list[tuple[float, Plan, float]]:
    """Each look's time, plan, and the time of the last look at which a token counter moved
    (or the engine was idle, or the first look)."""
    toy, memory = served()
    tokens, prompt, kv = toy.tokens, 1000.0, 0.5
    last_output = toy.now
    out: list[tuple[float, Plan, float]] = []
    for index, (gap, running, change, prompt_moved, kv_change) in enumerate(looks):
        toy.advance(gap)
        tokens = max(0.0, tokens + change)
        prompt += 2048.0 if prompt_moved else 0.0
        kv = min(1.0, max(0.0, kv + kv_change))
        if index == 0 or change != 0 or prompt_moved or running == 0:
            last_output = toy.now
        seen = with_reading(toy.observe(), running, tokens, prompt, kv)
        result = plan(toy.cluster, seen, memory, toy.now)
        memory = remember(memory, seen, [], toy.now, result)
        out.append((toy.now, result, last_output))
    return out


def hung(result: Plan) -> bool:
    return any(a.kind == "restart_model" and "hung under load" in a.reason for a in result.actions)


@given(MOVING)
@PROPS
def test_no_restart_while_the_prompt_counter_moves(
    looks: list[tuple[float, float, float, bool, float]],
) -> None:
    moving = [(gap, running, change, True, kv) for gap, running, change, _, kv in looks]
    assert not any(hung(result) for _, result, _ in replay(moving))


@given(MOVING)
@PROPS
def test_no_restart_while_the_kv_cache_moves_short_of_the_longest_prefill(
    looks: list[tuple[float, float, float, bool, float]],
) -> None:
    """The KV cache or the prompt counter moves between every two looks: no restart, unless no
    token has come for longer than the longest prefill the engine allows (then it says so)."""
    toy, _ = served()
    policy = toy.cluster.policy
    # The toy's /v1/models says max_model_len 262144.
    bound = max(policy.hang_window, 262144 / policy.prefill_rate)
    for now, result, last_output in replay(looks):
        if hung(result):
            assert now - last_output >= bound, (now, last_output)
            assert "longer than the longest prefill" in result.actions[0].reason


# -- a rollout's acceptance ---------------------------------------------------------------------


def new_spec_in_acceptance() -> Run:
    run = serving()
    model = run.desired.model
    args = (*model.extra_args, "--max-num-seqs", "8")
    run.desired = run.desired.model_copy(
        update={"model": model.model_copy(update={"extra_args": args})}
    )
    run.until("healthy")
    record = run.memory.rollout
    assert record is not None and record.result == "in_progress"
    return run


def test_a_long_prefill_during_acceptance_does_not_roll_the_new_spec_back() -> None:
    """Today's code restarted the model for the prefill, a failure of the new spec while it
    is on trial."""
    run = new_spec_in_acceptance()
    run.toy.prefilling = True
    plans = [run.cycle() for _ in range(4)]  # four minutes: within the longest prefill
    assert all(p.rollback is None for p in plans), [p.rollback for p in plans]
    assert not restarts(plans), [p.reason for p in plans]


def test_a_hang_during_acceptance_is_still_restarted() -> None:
    run = new_spec_in_acceptance()
    run.toy.hung_under_load = True
    plans = [run.cycle() for _ in range(4)]
    assert restarts(plans), [p.reason for p in plans]


# -- generated step budgets ----------------------------------------------------------------------

# How `vllm serve` may be told the size of one engine step, in the spellings vLLM 0.32.0's
# FlexibleArgumentParser accepts (dashes or underscores, `--flag value` or `--flag=value`; the
# last one given wins).
STEP_FLAGS = st.one_of(
    st.sampled_from(
        [
            ("--enable-chunked-prefill",),
            ("--no-enable-chunked-prefill",),
            ("--enable_chunked_prefill",),
            ("--no_enable_chunked_prefill",),
        ]
    ),
    st.integers(512, 400_000).map(lambda n: ("--max-num-batched-tokens", str(n))),
    st.integers(512, 400_000).map(lambda n: (f"--max_num_batched_tokens={n}",)),
)


def one_step_tokens(args: tuple[str, ...], max_len: int) -> int:
    """The longest step, read here independently of sparkd: the whole longest prompt with
    chunked prefill off, else the last step budget given, else vLLM's default (16384)."""
    chunked, budget = True, 16384
    for index, arg in enumerate(args):
        flag, _, value = arg.partition("=")
        flag = flag.replace("_", "-")
        if flag in ("--enable-chunked-prefill", "--no-enable-chunked-prefill"):
            chunked = flag == "--enable-chunked-prefill"
        elif flag == "--max-num-batched-tokens":
            budget = int(value or args[index + 1])
    return min(budget, max_len) if chunked else max_len


@given(
    st.lists(STEP_FLAGS, max_size=4),
    st.sampled_from([8192, 32768, 131072, 262144]),
)
@PROPS
def test_every_figure_still_is_a_hang_only_after_the_longest_step_and_then_it_is(
    flags: list[tuple[str, ...]], max_len: int
) -> None:
    """Property: whatever the step arguments, a request running with every figure still (one
    step in flight, or a hang: the same evidence) is not restarted before the longest step the
    arguments allow (or `hang_window`, if longer) has passed; and the hold ends there: it is."""
    toy, memory = served()
    args = (*(part for flag in flags for part in flag), "--max-model-len", str(max_len))
    launched_with(toy, *args)
    toy.max_model_len = max_len
    toy.hung_under_load = True
    policy = toy.cluster.policy
    bound = max(policy.hang_window, one_step_tokens(args, max_len) / policy.prefill_rate)
    start = toy.now
    plans = walk(toy, memory, looks=int(bound // 30) + 10)
    restarted = restarts(plans)
    assert restarted, [p.reason for p in plans[-2:]]
    took = toy.now - start
    assert took >= bound, (took, bound, restarted[0].actions[0].reason)
    # Within two looks of the bound: the hold is that long and no longer.
    assert took <= bound + 2 * 30, (took, bound, restarted[0].actions[0].reason)
