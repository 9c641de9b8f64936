"""Engine processes with no `vllm serve` beside them: a SIGKILLed API server's orphans (torn
down with Ray after a grace), or the engine of a model an operator serves by hand under another
command line, which answers (left serving). The endpoint tells them apart."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sparkd.model.observed import ModelEndpoint, ServeState
from tests.support.looks import look, served, walk
from tests.support.planning import COMMON
from tests.toy import Toy

ENGINES = ("pid 48377 (VLLM::EngineCore)", "pid 48611 (ray::RayWorkerProc.run)")


class HandServed(Toy):
    """An operator restarted the API server by hand in the head container with the module
    entry point (`python3 -m vllm.entrypoints.openai.api_server --model ...`, which vLLM
    0.32.0 still runs: entrypoints/openai/api_server.py): `docker top` shows no `vllm serve`,
    only its engine and Ray worker, while the endpoint lists the served name."""

    def _serve_state(self) -> ServeState:
        return ServeState(running=False, orphans=ENGINES)


class Orphaned(HandServed):
    """The API server SIGKILLed: the same processes, and the port refuses."""

    def _endpoint(self) -> ModelEndpoint:
        return ModelEndpoint(status="refused", detail="connection refused")


def teardowns(plans: list) -> list:  # type: ignore[type-arg]
    return [p for p in plans if any(a.kind in ("restart_ray", "restart_model") for a in p.actions)]


def test_the_engine_of_a_model_that_answers_is_not_torn_down() -> None:
    toy = HandServed.healthy()
    _, memory = served()
    plans = walk(toy, memory, looks=12)  # six minutes of looks
    assert not teardowns(plans), [(p.phase, p.reason) for p in teardowns(plans)]
    last = plans[-1]
    assert last.phase == "degraded" and last.actions == ()
    assert "served by a process that is not `vllm serve`" in last.reason, last.reason
    assert "VLLM::EngineCore" in last.reason


def test_the_same_processes_behind_a_refusing_port_go_with_ray_after_the_grace() -> None:
    toy = Orphaned.healthy()
    _, memory = served()
    plans = walk(toy, memory, looks=12)
    assert teardowns(plans), [(p.phase, p.reason) for p in plans]
    assert "no vllm serve, but engine processes still hold the GPUs" in plans[-1].reason


class Flickering(HandServed):
    """The same engine processes; the endpoint at each look as `answers` says: the served name
    listed with /health 200, or not answering (refused, a timeout), or another model's."""

    answers: tuple[str, ...] = ()
    index: int = 0

    def _endpoint(self) -> ModelEndpoint:
        said = self.answers[min(self.index, len(self.answers) - 1)]
        if said == "ours":
            return super()._endpoint()
        if said == "other":
            return ModelEndpoint(status="up", health_status=200, models=("someone/else",))
        return ModelEndpoint(status=said, detail=f"connection {said}")  # type: ignore[arg-type]


@COMMON
@given(st.lists(st.sampled_from(["ours", "ours", "refused", "timeout", "other"]), min_size=1))
def test_a_look_at_which_the_model_answers_never_tears_its_engine_down(answers: list[str]) -> None:
    """Property: engine processes with no `vllm serve` beside them, the endpoint answering or
    not at each look in any order: at a look where it answers with the served name, nothing is
    torn down or started on top of it; a teardown comes only from looks where it does not."""
    toy = Flickering.healthy()
    toy.answers = tuple(answers)
    _, memory = served()
    for index in range(len(answers)):
        toy.index = index
        made, memory = look(toy, memory)
        kinds = {a.kind for a in made.actions}
        if answers[index] == "ours":
            assert not kinds & {"restart_ray", "restart_model", "start_model"}, made.reason
        toy.advance(30.0)


class ServedElsewhere(Toy):
    """No `vllm serve` and no engine process in sparkd's head container, while the port answers
    with the served name and /health 200: a server sparkd does not run holds the port (an
    operator's own `docker run vllm/vllm-openai --network host` trying another release, or one
    started on the host itself). A start on top cannot make that port serve better: vLLM binds
    its socket before it builds the engine (vllm-project/vllm entrypoints/openai/api_server.py
    `setup_server`: "bind the port before the engine is set up"), and `create_server_socket`
    sets SO_REUSEPORT there, so the second server either fails with the port in use (counted
    against the spec, rolled back during a rollout) or loads a second engine into the memory
    the serving one uses and shares its port with it."""

    def _serve_state(self) -> ServeState:
        return ServeState(running=False)


def test_no_model_is_started_on_top_of_one_that_answers_from_elsewhere() -> None:
    toy = ServedElsewhere.healthy()
    _, memory = served()
    plans = walk(toy, memory, looks=6)
    started = [p for p in plans if any(a.kind in MODEL_KINDS for a in p.actions)]
    assert not started, [(p.phase, p.reason) for p in started]
    last = plans[-1]
    assert last.phase == "degraded" and last.actions == ()
    assert "no `vllm serve` runs in" in last.reason, last.reason


MODEL_KINDS = ("start_model", "restart_model", "restart_ray")
