"""How a simulated model server behaves (`ModelBehaviour`, which the world's faults change at
run time) and what it remembers of the requests it answered (`Served`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sparkd_sim.vllm_schema import FieldNaming
from sparkd_sim.vllm_text import AnswerStyle

EngineState = Literal["ok", "dead", "hung"]


@dataclass
class ModelBehaviour:
    """How the served model behaves; mutable, the world changes it at run time (faults)."""

    style: AnswerStyle = "reasoning_only"
    naming: FieldNaming = "reasoning"
    engine: EngineState = "ok"
    token_latency: float = 0.002
    """Seconds per generated token (a real GB10 pair: ~0.05)."""
    first_token_latency: float = 0.01
    slow_factor: float = 20.0
    """`slow` and `busy` completions take this many times longer."""
    prefill_rate: float = 50_000.0
    """Prompt tokens a long prompt (`SimVllmServer.send_prompt`) is prefilled at per second:
    two GB10s do about 2000 (vllm#41834); this keeps that rate's proportion to
    `token_latency` (a real pair's 0.05 s a token is 25 times this default's)."""


# How many of its latest requests a server remembers (`SimVllmServer.served`).
SERVED_KEPT = 1000


@dataclass(frozen=True)
class Served:
    """One request as the server saw it: from its arrival to the end of its response body
    (a streamed one included), for comparing with what a client measured."""

    method: str
    path: str
    status: int
    at: float  # wall clock at arrival
    seconds: float
