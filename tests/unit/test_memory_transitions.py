"""Every change of memory is validated: a misspelt field or a wrong type is an error, never
silently dropped (pydantic's `model_copy(update=...)` checks neither)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sparkd.core.remembering.remember import remember
from sparkd.model.memory import Memory
from sparkd.model.plan import Learned, Plan
from tests.toy import Toy


def test_a_misspelt_field_is_an_error() -> None:
    with pytest.raises(KeyError, match="consecutive_failure"):
        Memory().evolve(consecutive_failure=3)


def test_a_wrong_type_is_an_error() -> None:
    with pytest.raises(ValidationError):
        Memory().evolve(consecutive_failures="three")


def test_remember_keeps_what_the_plan_decided() -> None:
    toy = Toy.healthy()
    seen = toy.observe()
    decided = Plan(
        cluster="sparks", phase="healthy", reason="ok", learned=Learned(serving_well=True)
    )
    after = remember(Memory(), seen, (), toy.now, decided)
    assert after.healthy_since == toy.now
    assert after.last_phase == "healthy"
    assert after.boot_ids == {h.name: h.boot_id for h in seen.hosts if h.boot_id}
