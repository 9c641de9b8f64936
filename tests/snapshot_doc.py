"""docs/snapshot.md's field tables, generated from the snapshot's schema.

Each field's meaning is its `Field(description=...)` in sparkd/model; the prose around the
tables is the document's own. Between `<!-- fields: Name -->` and `<!-- end fields -->` stands
the table of the model `Name`. `python -m tests.snapshot_doc` rewrites the tables in place;
a test checks the committed file is what this prints.
"""

from __future__ import annotations

import re
import sys
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from sparkd.model.snapshot import SnapshotDocument
from sparkd.model.time import Clock
from tests.toy import ROOT

DOCUMENT = ROOT / "docs" / "snapshot.md"
ROOT_MODEL = SnapshotDocument
TABLE = re.compile(r"(<!-- fields: (\w+) -->\n).*?(<!-- end fields -->)", re.DOTALL)
SCALARS: dict[Any, str] = {str: "string", int: "int", float: "number", bool: "bool", Any: "any"}
CLOCKS = {"daemon": "daemon time", "wall": "wall clock", "monotonic": "monotonic clock"}


def _nested(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in get_args(annotation) for model in _nested(arg)]


def models() -> dict[str, type[BaseModel]]:
    """Every model a snapshot holds, by name, the document's own first."""
    found: dict[str, type[BaseModel]] = {}
    pending: list[type[BaseModel]] = [ROOT_MODEL]
    while pending:
        model = pending.pop(0)
        if model.__name__ in found:
            continue
        found[model.__name__] = model
        for field in model.model_fields.values():
            pending.extend(_nested(field.annotation))
    return found


def type_text(annotation: Any) -> str:
    """How a JSON reader sees the type: `null` where it may be absent of value."""
    origin = get_origin(annotation)
    args = get_args(annotation)
    if annotation in SCALARS:
        return SCALARS[annotation]
    if origin is Annotated:
        clock = next((a for a in args[1:] if isinstance(a, Clock)), None)
        suffix = f" ({CLOCKS[clock.name]})" if clock is not None and clock.name != "none" else ""
        return type_text(args[0]) + suffix
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{annotation.__name__.lower()})"
    if origin is Literal and len(args) == 1:
        return f"`{args[0]}`"
    if origin is Literal:
        return "one of " + ", ".join(f"`{value}`" for value in args)
    if origin in (Union, types.UnionType):
        kept = [type_text(arg) for arg in args if arg is not type(None)]
        nullable = len(kept) < len(args)
        return " or ".join(kept) + (" or null" if nullable else "")
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"list of {type_text(args[0])}"
        return "[" + ", ".join(type_text(arg) for arg in args) + "]"
    if origin is dict:
        value = type_text(args[1])
        return "object" if value == "any" else f"object of {value}"
    raise TypeError(f"no JSON name for {annotation!r}")


def absent_text(field: FieldInfo) -> str:
    """What a document without the field reads as."""
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "its defaults"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple | list):
        return "[]"
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(model: type[BaseModel]) -> str:
    rows = ["| field | type | if absent | meaning |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        if not field.description:
            raise ValueError(f"{model.__name__}.{name} has no description")
        # Pydantic keeps a field's own `Annotated[...]` (its clock) as metadata.
        kind: Any = field.annotation
        if field.metadata:
            kind = Annotated[(kind, *field.metadata)]
        cells = (f"`{name}`", type_text(kind), absent_text(field), field.description)
        rows.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return "\n".join(rows) + "\n"


def render(text: str) -> str:
    """`text` with every table regenerated; a table naming no model of the snapshot fails."""
    known = models()

    def replace(match: re.Match[str]) -> str:
        name = match.group(2)
        if name not in known:
            raise KeyError(f"docs/snapshot.md has a table for {name}, not a snapshot model")
        return match.group(1) + table(known[name]) + match.group(3)

    return TABLE.sub(replace, text)


def tabled(text: str) -> list[str]:
    return [match.group(2) for match in TABLE.finditer(text)]


def main() -> None:
    text = DOCUMENT.read_text()
    missing = sorted(set(models()) - set(tabled(text)))
    if missing:
        sys.exit(f"docs/snapshot.md has no table for: {', '.join(missing)}")
    DOCUMENT.write_text(render(text))


if __name__ == "__main__":
    main()
