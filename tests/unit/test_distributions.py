"""The daemon's wheel holds no simulator; the simulator's holds no daemon. Both are built from
this checkout's real packaging files, in a copy, so the tree stays clean."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _copy(tree: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in ("sparkd", "sparkd_sim", "sparkd_demo", "packaging"):
        shutil.copytree(ROOT / name, tree / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, tree / name)


def _wheel(project: Path, out: Path) -> list[str]:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(out), str(project)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = out.glob("*.whl")
    return zipfile.ZipFile(wheel).namelist()


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("setuptools")
    tree = tmp_path_factory.mktemp("checkout")
    _copy(tree)
    return tree


def _packages(names: list[str]) -> set[str]:
    return {n.split("/")[0] for n in names if "/" in n and ".dist-info/" not in n}


def test_the_daemons_wheel_holds_no_simulator(tree: Path, tmp_path: Path) -> None:
    names = _wheel(tree, tmp_path)
    assert _packages(names) == {"sparkd"}
    assert "sparkd/cli.py" in names or "sparkd/cli/__init__.py" in names
    # The fake tools' shim (docker, systemctl, sudo) is the simulator's alone.
    assert not [n for n in names if "sim-tool" in n or "/sim/" in n]


def test_the_simulators_wheel_holds_no_daemon(tree: Path, tmp_path: Path) -> None:
    names = _wheel(tree / "packaging" / "sparkd-sim", tmp_path)
    assert _packages(names) == {"sparkd_sim", "sparkd_demo"}
    assert "sparkd_sim/bin/sim-tool" in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(next(tmp_path.glob("*.whl"))).read(entry_points).decode()
    assert "[sparkd.commands]" in text and "sparkd-sim = sparkd_demo.cli:main" in text
