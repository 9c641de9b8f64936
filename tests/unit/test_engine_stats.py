"""`--disable-log-stats` takes every `vllm:` family away (vLLM 0.32.0 `v1/engine/async_llm.py`
196-203): sparkd says why hang detection reads unknown, from the config or from /metrics."""

from __future__ import annotations

import pytest

from sparkd.core.judging import engine_stats
from sparkd.model.cluster import ClusterSpec
from sparkd.model.observed import ModelEndpoint
from tests.toy import reference_cluster


def with_args(*args: str) -> ClusterSpec:
    spec = reference_cluster()
    model = spec.model.model_copy(update={"extra_args": (*spec.model.extra_args, *args)})
    return spec.model_copy(update={"model": model})


def up(vllm_metrics: bool | None) -> ModelEndpoint:
    return ModelEndpoint(status="up", health_status=200, vllm_metrics=vllm_metrics)


@pytest.mark.parametrize("flag", ["--disable-log-stats", "--disable_log_stats"])
def test_the_flag_in_the_spec_says_so_before_any_metrics_are_read(flag: str) -> None:
    why = engine_stats.missing(with_args("--max-model-len", "32768", flag), None)
    assert why is not None and "--disable-log-stats" in why and "unknown" in why


def test_metrics_without_a_vllm_family_say_so_too() -> None:
    why = engine_stats.missing(reference_cluster(), up(False))
    assert why is not None and "/metrics" in why


@pytest.mark.parametrize("seen", [True, None])
def test_metrics_there_or_not_read_say_nothing(seen: bool | None) -> None:
    assert engine_stats.missing(reference_cluster(), up(seen)) is None
    assert engine_stats.missing(reference_cluster(), None) is None


def test_a_similar_flag_is_not_it() -> None:
    assert not engine_stats.flagged(("--disable-log-requests", "--disable-log-stats-x"))
