"""The simulator's modules import one another without a cycle, imports made for type checking
only included: each part of the world can be read, and changed, from the bottom up. (Size is
judged by responsibility in review, not by a line count: a count split classes into halves.)"""

from __future__ import annotations

from pathlib import Path

from tests.support.imports import imported

SIM = Path(__file__).resolve().parents[2] / "sparkd_sim"


def _module(path: Path) -> str:
    parts = path.relative_to(SIM).with_suffix("").parts
    return ".".join(("sparkd_sim", *parts[: -1 if parts[-1] == "__init__" else None]))


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The simulator's own modules `path` imports (`from sparkd_sim import x` names module x)."""
    return imported(path) & modules


def _graph() -> dict[str, set[str]]:
    paths = sorted(SIM.rglob("*.py"))
    modules = {_module(p) for p in paths}
    return {_module(p): _imports(p, modules) - {_module(p)} for p in paths}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle in `graph`, as the modules along it, or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for target in sorted(graph[node]):
            found = visit(target, [*path, node])
            if found is not None:
                return found
        done.add(node)
        return None

    for start in sorted(graph):
        found = visit(start, [])
        if found is not None:
            return found
    return None


def test_the_finder_sees_a_cycle_through_a_type_checking_import() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycle(graph) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_graph_reads_the_world_and_its_parts() -> None:
    graph = _graph()
    assert "sparkd_sim.faults" in graph["sparkd_sim.world"]
    assert "sparkd_sim.config" in graph["sparkd_sim.world"]


def test_the_simulator_has_no_import_cycle() -> None:
    assert _cycle(_graph()) is None
