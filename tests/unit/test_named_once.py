"""String sets two layers share are named once (model/), never respelt where they are used.

One test per rule over every source file, each failing with every offending `path:line`."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

from sparkd.model.plan import ActionKind

PACKAGE = Path(__file__).resolve().parents[2] / "sparkd"
SOURCES = sorted(PACKAGE.rglob("*.py"))
TREES = {path: ast.parse(path.read_text()) for path in SOURCES}
KINDS = set(get_args(ActionKind))
# Where the action-kind groups live.
GROUPS_HOME = PACKAGE / "model" / "plan.py"


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(PACKAGE.parent).as_posix()}:{getattr(node, 'lineno', 0)}"


def _strings(node: ast.expr) -> list[str]:
    elements = node.elts if isinstance(node, ast.Tuple | ast.Set | ast.List) else []
    return [e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def _kind_groups(path: Path, tree: ast.Module) -> Iterator[str]:
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
            if len(kinds) > 1:
                yield f"{_where(path, node)} spells the kinds {kinds}"


def test_no_module_spells_a_group_of_action_kinds_but_model_plan() -> None:
    offences = [
        line
        for path, tree in TREES.items()
        if path != GROUPS_HOME
        for line in _kind_groups(path, tree)
    ]
    assert not offences, "\n".join(offences)


def _literals() -> dict[frozenset[str], str]:
    """Every `Name = Literal[...]` in the package, by the set of its values."""
    found: dict[frozenset[str], str] = {}
    for tree in TREES.values():
        for node in tree.body:
            if not (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)):
                continue
            value = node.value
            if isinstance(value, ast.Subscript) and ast.unparse(value.value) == "Literal":
                values = _strings(value.slice) if isinstance(value.slice, ast.Tuple) else []
                if len(values) > 1:
                    found[frozenset(values)] = node.targets[0].id
    return found


def test_a_literal_s_values_are_derived_with_get_args_not_retyped() -> None:
    literals = _literals()
    offences = []
    for path, tree in TREES.items():
        for node in tree.body:
            value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
            if value is None or not isinstance(value, ast.Tuple | ast.List | ast.Set):
                continue
            name = literals.get(frozenset(_strings(value)))
            if name is not None:
                offences.append(f"{_where(path, node)} retypes {name}: use typing.get_args")
    assert not offences, "\n".join(offences)


# sysexits(3) statuses sparkd's commands return, and the fence's: named in model/exits.py.
EXIT_STATUSES = {64, 65, 69, 73, 75, 76, 77, 78, 126}
EXITS_HOME = PACKAGE / "model" / "exits.py"
SPEC_HOME = PACKAGE / "core" / "spec.py"


def _exit_statuses(path: Path, tree: ast.Module) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Constant):
            value = node.value.value
            if value in EXIT_STATUSES:
                yield f"{_where(path, node)} returns {value}"
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                name = target.id if isinstance(target, ast.Name) else ""
                if name.startswith("EX_") or name.endswith("_EXIT"):
                    yield f"{_where(path, node)} spells the exit status {name}"


def test_exit_statuses_are_named_in_one_module() -> None:
    offences = [
        line
        for path, tree in TREES.items()
        if path != EXITS_HOME
        for line in _exit_statuses(path, tree)
    ]
    assert not offences, "\n".join(offences)


def _container_names(path: Path, tree: ast.Module) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and len(node.values) > 1:
            first, second = node.values[0], node.values[1]
            named = isinstance(first, ast.Constant) and first.value == "sparkd-"
            if named and isinstance(second, ast.FormattedValue):
                yield f"{_where(path, node)} spells a container name: use core.spec"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            stripped = node.func.attr == "removeprefix" and [
                a.value for a in node.args if isinstance(a, ast.Constant)
            ] == ["sha256:"]
            if stripped:
                yield f"{_where(path, node)} cuts an image ID: use core.spec"


def test_container_names_and_short_image_ids_are_made_in_core_spec() -> None:
    offences = [
        line
        for path, tree in TREES.items()
        if path != SPEC_HOME
        for line in _container_names(path, tree)
    ]
    assert not offences, "\n".join(offences)


CATALOGUE = PACKAGE / "shell" / "catalogue"


def test_remote_commands_are_built_in_the_catalogue_package_only() -> None:
    offences = [
        f"{_where(path, node)} builds a Remote outside shell/catalogue"
        for path, tree in TREES.items()
        if not path.is_relative_to(CATALOGUE)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func).rpartition(".")[2] == "Remote"
    ]
    assert not offences, "\n".join(offences)


def test_each_rule_reports_every_offence_with_its_path_and_line() -> None:
    path = PACKAGE / "shell" / "example.py"
    tree = ast.parse(
        'KINDS = ("start_model", "restart_model")\nEX_USAGE = 64\n\n\n'
        "def f() -> int:\n    return 78\n"
    )
    assert list(_kind_groups(path, tree)) == [
        "sparkd/shell/example.py:1 spells the kinds ['start_model', 'restart_model']"
    ]
    assert list(_exit_statuses(path, tree)) == [
        "sparkd/shell/example.py:2 spells the exit status EX_USAGE",
        "sparkd/shell/example.py:6 returns 78",
    ]
