"""The common base of every value type: frozen, strict about unknown fields."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict

# A reason or detail may be built from what a host printed (a process name, a log line): it is
# stored in every phase event and shown by `status`, so it is bounded.
MAX_REASON = 2000


def bounded(text: str, limit: int = MAX_REASON) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


BoundedText = Annotated[str, AfterValidator(bounded)]


class Value(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
