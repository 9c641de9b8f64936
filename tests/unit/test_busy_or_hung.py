"""A probe that timed out: busy only on evidence of other work, never because of the probe's own
request or its own tokens (issue 8, case 10)."""

from __future__ import annotations

import pytest

from sparkd.core.reading.classify import EngineLoad, judge_timeout

MAX_TOKENS = 50


def load(
    running: float | None,
    waiting: float | None,
    tokens: float | None,
    kv: float | None = 0.25,
) -> EngineLoad:
    """A reading; the KV-cache gauge, which vLLM 0.32 and 0.34 export, still unless given."""
    return EngineLoad(running=running, waiting=waiting, generation_tokens=tokens, kv_cache_usage=kv)


CASES = [
    # name, before, after, busy
    ("hung_with_only_the_probe_stuck", load(0, 0, 1000), load(1, 0, 1000), False),
    ("hung_with_earlier_probes_stuck", load(2, 0, 1000), load(3, 0, 1000), False),
    ("hung_with_a_queue", load(4, 6, 1000), load(5, 6, 1000), False),
    ("others_running_tokens_flowing", load(16, 0, 1000), load(16, 0, 1040), True),
    ("others_arrived_during_the_probe", load(0, 0, 1000), load(3, 0, 1020), True),
    ("others_waiting_tokens_flowing", load(1, 4, 1000), load(1, 4, 1010), True),
    ("probe_waiting_behind_nothing", load(0, 0, 1000), load(0, 1, 1000), False),
    ("only_the_probes_own_tokens", load(0, 0, 1000), load(0, 0, 1000 + MAX_TOKENS), False),
    ("own_tokens_probe_still_counted", load(0, 0, 1000), load(1, 0, 1012), False),
    ("more_tokens_than_the_probe_could", load(0, 0, 1000), load(0, 0, 1000 + MAX_TOKENS + 1), True),
    ("more_tokens_without_request_gauges", load(None, None, 0), load(None, None, 5000), True),
    ("few_tokens_without_request_gauges", load(None, None, 0), load(None, None, 20), False),
    # A long prompt prefilled ahead of the probe: no token, the KV cache filling (issue 43).
    ("behind_a_long_prefill", load(1, 0, 1000, 0.30), load(1, 1, 1000, 0.42), True),
    ("behind_a_prefill_probe_aborted", load(1, 0, 1000, 0.30), load(1, 0, 1000, 0.31), True),
    ("kv_moved_with_only_the_probe", load(0, 0, 1000, 0.30), load(1, 0, 1000, 0.31), False),
]


@pytest.mark.parametrize(("name", "before", "after", "busy"), CASES, ids=[c[0] for c in CASES])
def test_busy_or_hung(name: str, before: EngineLoad, after: EngineLoad, busy: bool) -> None:
    verdict, seen = judge_timeout(before, after, MAX_TOKENS)
    assert verdict is busy, seen


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (None, load(0, 0, 10)),
        (load(0, 0, 10), None),
        (load(1, 0, None), load(1, 0, 10)),
        (load(1, 0, 5000), load(16, 0, 10)),  # the counter went back: another server process
        # Others in the engine and no token, but no KV-cache gauge: a prefill or a hang.
        (load(1, 0, 1000, None), load(1, 1, 1000, None)),
        (load(1, 0, 1000, 0.3), load(1, 1, 1000, None)),
    ],
    ids=[
        "no_reading_before",
        "no_reading_after",
        "no_counter",
        "counter_went_back",
        "no_kv_gauge",
        "kv_gauge_read_once",
    ],
)
def test_unknown_without_two_readings_of_one_counter(
    before: EngineLoad | None, after: EngineLoad | None
) -> None:
    verdict, seen = judge_timeout(before, after, MAX_TOKENS)
    assert verdict is None
    assert seen


def test_what_was_seen_is_said() -> None:
    _, busy = judge_timeout(load(16, 0, 1000), load(16, 0, 1040), MAX_TOKENS)
    assert busy == "16 other request(s) in the engine, 40 tokens generated meanwhile"
    _, hung = judge_timeout(load(2, 0, 1000), load(3, 0, 1000), MAX_TOKENS)
    assert hung == (
        "2 other request(s) in the engine, no token generated and vllm:kv_cache_usage_perc "
        "still at 0.25: hung"
    )
    _, prefill = judge_timeout(load(1, 0, 1000, 0.3), load(1, 0, 1000, 0.42), MAX_TOKENS)
    assert prefill == (
        "1 other request(s) in the engine, no token generated while vllm:kv_cache_usage_perc "
        "moved (0.3 -> 0.42): a long prefill ahead of the probe"
    )
