"""docs/snapshot.md's tables are the schema's: every model a snapshot holds has one, every field
a description, and the committed file is what the generator prints."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import Field

from sparkd.model.base import Value
from sparkd.model.snapshot import load_snapshot
from tests import snapshot_doc
from tests.snapshot_doc import DOCUMENT, models, render, table, tabled, type_text


def test_committed_document_is_generated() -> None:
    text = DOCUMENT.read_text()
    assert render(text) == text, "run: .venv/bin/python -m tests.snapshot_doc"


def test_every_snapshot_model_has_a_table() -> None:
    assert sorted(tabled(DOCUMENT.read_text())) == sorted(models())


def test_every_field_of_a_snapshot_model_is_described() -> None:
    undescribed = [
        f"{name}.{field_name}"
        for name, model in models().items()
        for field_name, field in model.model_fields.items()
        if not field.description
    ]
    assert undescribed == []


def test_a_field_added_to_the_schema_shows_in_its_table() -> None:
    class Probe(Value):
        kept: int = Field(description="an old field")
        added: tuple[str, ...] | None = Field(None, description="a | new field")

    rows = table(Probe).splitlines()
    assert rows[-1] == r"| `added` | list of string or null | null | a \| new field |"


def test_a_field_without_a_description_fails() -> None:
    class Bare(Value):
        silent: int = 0

    with pytest.raises(ValueError, match=r"Bare\.silent"):
        table(Bare)


def test_a_table_for_no_snapshot_model_fails() -> None:
    with pytest.raises(KeyError, match="Gone"):
        render("<!-- fields: Gone -->\n<!-- end fields -->")


@pytest.mark.parametrize(
    ("annotation", "text"),
    [
        (dict[str, tuple[int, int, float]], "object of [int, int, number]"),
        (dict[str, Any], "object"),
        (bool | None, "bool or null"),
    ],
)
def test_type_names_are_json_names(annotation: Any, text: str) -> None:
    assert type_text(annotation) == text


def test_main_refuses_a_document_missing_a_table(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "snapshot.md"
    path.write_text(DOCUMENT.read_text().replace("<!-- fields: Rollout -->", ""))
    monkeypatch.setattr(snapshot_doc, "DOCUMENT", path)
    with pytest.raises(SystemExit, match="Rollout"):
        snapshot_doc.main()


def test_a_document_with_retired_fields_still_loads() -> None:
    # Written (always null) by versions before their removal: the format only ever adds.
    document = {
        "cluster": "c",
        "observed_at": 1.0,
        "hosts": [],
        "endpoint": {"status": "up", "requests_waiting": None},
        "memory": {"launch_spec": None},
    }
    loaded = load_snapshot(json.dumps(document))
    assert loaded.endpoint is not None and loaded.endpoint.status == "up"
    assert "requests_waiting" not in loaded.model_dump()["endpoint"]
