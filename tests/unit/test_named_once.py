"""String sets two layers share are named once (model/), never respelt where they are used."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import pytest

from sparkd.model.plan import ActionKind

PACKAGE = Path(__file__).resolve().parents[2] / "sparkd"
SOURCES = sorted(PACKAGE.rglob("*.py"))
KINDS = set(get_args(ActionKind))
# Where the action-kind groups live.
GROUPS_HOME = PACKAGE / "model" / "plan.py"


def _strings(node: ast.expr) -> list[str]:
    elements = node.elts if isinstance(node, ast.Tuple | ast.Set | ast.List) else []
    return [e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def _ids(paths: list[Path]) -> list[str]:
    return [p.relative_to(PACKAGE).as_posix() for p in paths]


@pytest.mark.parametrize("path", SOURCES, ids=_ids(SOURCES))
def test_no_module_spells_a_group_of_action_kinds_but_model_plan(path: Path) -> None:
    if path == GROUPS_HOME:
        return
    tree = ast.parse(path.read_text())
    # A package's `__all__` names its functions, some of which share a kind's name.
    exported = {
        id(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple | ast.Set | ast.List) and id(node) not in exported:
            kinds = [s for s in _strings(node) if s in KINDS]
            assert len(kinds) < 2, f"{path.name}:{node.lineno} spells the kinds {kinds}"


def _literals() -> dict[frozenset[str], str]:
    """Every `Name = Literal[...]` in the package, by the set of its values."""
    found: dict[frozenset[str], str] = {}
    for path in SOURCES:
        for node in ast.parse(path.read_text()).body:
            if not (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)):
                continue
            value = node.value
            if isinstance(value, ast.Subscript) and ast.unparse(value.value) == "Literal":
                values = _strings(value.slice) if isinstance(value.slice, ast.Tuple) else []
                if len(values) > 1:
                    found[frozenset(values)] = node.targets[0].id
    return found


LITERALS = _literals()


@pytest.mark.parametrize("path", SOURCES, ids=_ids(SOURCES))
def test_a_literal_s_values_are_derived_with_get_args_not_retyped(path: Path) -> None:
    for node in ast.parse(path.read_text()).body:
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if value is None or not isinstance(value, ast.Tuple | ast.List | ast.Set):
            continue
        name = LITERALS.get(frozenset(_strings(value)))
        assert name is None, f"{path.name}:{node.lineno} retypes {name}: use typing.get_args"


# sysexits(3) statuses sparkd's commands return, and the fence's: named in model/exits.py.
EXIT_STATUSES = {64, 65, 69, 73, 75, 76, 77, 78, 126}
EXITS_HOME = PACKAGE / "model" / "exits.py"
SPEC_HOME = PACKAGE / "core" / "spec.py"


@pytest.mark.parametrize("path", SOURCES, ids=_ids(SOURCES))
def test_exit_statuses_are_named_in_one_module(path: Path) -> None:
    if path == EXITS_HOME:
        return
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Constant):
            value = node.value.value
            assert value not in EXIT_STATUSES, f"{path.name}:{node.lineno} returns {value}"
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                name = target.id if isinstance(target, ast.Name) else ""
                spelt = name.startswith("EX_") or name.endswith("_EXIT")
                assert not spelt, f"{path.name}:{node.lineno} spells the exit status {name}"


@pytest.mark.parametrize("path", SOURCES, ids=_ids(SOURCES))
def test_container_names_and_short_image_ids_are_made_in_core_spec(path: Path) -> None:
    if path == SPEC_HOME:
        return
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.JoinedStr) and len(node.values) > 1:
            first, second = node.values[0], node.values[1]
            named = isinstance(first, ast.Constant) and first.value == "sparkd-"
            assert not (named and isinstance(second, ast.FormattedValue)), (
                f"{path.name}:{node.lineno} spells a container name: use core.spec"
            )
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            stripped = node.func.attr == "removeprefix" and [
                a.value for a in node.args if isinstance(a, ast.Constant)
            ] == ["sha256:"]
            assert not stripped, f"{path.name}:{node.lineno} cuts an image ID: use core.spec"


CATALOGUE = PACKAGE / "shell" / "catalogue"


@pytest.mark.parametrize("path", SOURCES, ids=_ids(SOURCES))
def test_remote_commands_are_built_in_the_catalogue_package_only(path: Path) -> None:
    if path.is_relative_to(CATALOGUE):
        return
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            called = ast.unparse(node.func)
            assert called.rpartition(".")[2] != "Remote", f"{path.name}:{node.lineno} builds one"
