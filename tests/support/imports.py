"""What a source file imports, read from its syntax tree: for the tests that hold the layers."""

from __future__ import annotations

import ast
from pathlib import Path


def imported(path: Path) -> set[str]:
    """Every module the file imports, under TYPE_CHECKING and inside functions too; `from m
    import x` names both `m` and `m.x` (x may be a module)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names
