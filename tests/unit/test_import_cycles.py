"""No import cycle in sparkd, at any level: among its packages, and among the modules of each.

import-linter's contracts (pyproject.toml, `make lint`) say who may import whom between layers;
a cycle inside a layer (two modules of one package importing each other) they cannot see.
Imports under TYPE_CHECKING count: a type is a dependency too. The contracts' `ignore_imports`
are left out here as well, so one list in pyproject.toml names every exception.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator

import grimp
import pytest

from tests.toy import ROOT

Edges = dict[str, set[str]]


def ignored_imports() -> list[tuple[str, str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    pairs: list[tuple[str, str]] = []
    for contract in config["contracts"]:
        for line in contract.get("ignore_imports", []):
            importer, _, imported = line.partition(" -> ")
            pairs.append((importer.strip(), imported.strip()))
    return pairs


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    built = grimp.build_graph("sparkd", cache_dir=None)
    for importer, imported in ignored_imports():
        built.remove_import(importer=importer, imported=imported)
    return built


def packages(graph: grimp.ImportGraph) -> list[str]:
    return sorted(m for m in graph.modules if graph.find_children(m))


def edges_between_children(graph: grimp.ImportGraph, package: str) -> Edges:
    """Which child of `package` imports which other (each child with all it holds)."""
    children = sorted(graph.find_children(package))
    return {
        child: {
            other
            for other in children
            if other != child
            and graph.direct_import_exists(importer=child, imported=other, as_packages=True)
        }
        for child in children
    }


def cycle(edges: Edges) -> list[str] | None:
    """One cycle in `edges` (its modules in order, the first again at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> Iterator[list[str]]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                yield [*path[path.index(nxt) :], nxt]
            elif nxt not in state:
                yield from visit(nxt, path)
        path.pop()
        state[node] = 2

    for start in sorted(edges):
        if start not in state:
            for found in visit(start, []):
                return found
    return None


def test_the_search_finds_a_cycle() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_every_ignored_import_exists() -> None:
    built = grimp.build_graph("sparkd", cache_dir=None)
    for importer, imported in ignored_imports():
        assert built.direct_import_exists(importer=importer, imported=imported), (
            f"{importer} -> {imported} is ignored in pyproject.toml but no longer imported: "
            "drop it from ignore_imports"
        )


def test_no_import_cycle_in_any_package(graph: grimp.ImportGraph) -> None:
    found = {package: cycle(edges_between_children(graph, package)) for package in packages(graph)}
    assert {package: ring for package, ring in found.items() if ring} == {}
    assert "sparkd" in found and "sparkd.cli" in found  # the levels looked at
