"""sparkd's wheel built as `make dist` builds it (`python -m build` with the test venv's
setuptools, no isolation), from a copy of the checkout, and pip installs under the test pins."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# pip's pins for every install from the built wheel: the versions the suite last passed with.
PINS = ROOT / "constraints" / "dev.txt"


def run(*argv: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=timeout, check=False
    )


def build_dist(tree: Path, *extra: str) -> Path:
    """A copy of the checkout in `tree` (the package, its metadata and the `extra` files or
    directories) with sdist and wheel built into `tree/dist`, as `make dist` leaves them."""
    pytest.importorskip("build")
    shutil.copytree(ROOT / "sparkd", tree / "sparkd",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    for name in ("pyproject.toml", "README.md", "LICENSE", *extra):
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, tree / name)
        elif source.exists():
            shutil.copy2(source, tree / name)
    out = tree / "dist"
    built = run(sys.executable, "-m", "build", "--no-isolation", "--skip-dependency-check",
                "--outdir", out, tree)  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    return out
