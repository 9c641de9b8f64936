"""`make dist`'s build of sparkd (sdist and wheel, `python -m build` with the test venv's
setuptools) and the wheel installed in a fresh venv: its `sparkd` runs. Minutes: pip installs
the wheel's dependencies into the new venv (from its cache, under the test pins)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _run(*argv: str | Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_the_built_wheel_installs_in_a_fresh_venv_and_runs(tmp_path: Path) -> None:
    pytest.importorskip("build")
    tree = tmp_path / "checkout"
    shutil.copytree(ROOT / "sparkd", tree / "sparkd",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, tree / name)
    out = tmp_path / "dist"
    built = _run(sys.executable, "-m", "build", "--no-isolation", "--skip-dependency-check",
                 "--outdir", out, tree)  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = out.glob("sparkd-*.whl")
    assert len(list(out.glob("sparkd-*.tar.gz"))) == 1

    fresh = tmp_path / "venv"
    venv.create(fresh, with_pip=True)
    python = fresh / "bin" / "python"
    pins = ROOT / "constraints" / "dev.txt"
    installed = _run(python, "-m", "pip", "install", "--quiet", wheel, "-c", pins)
    assert installed.returncode == 0, installed.stderr[-2000:]
    helped = _run(fresh / "bin" / "sparkd", "--help", timeout=60)
    assert helped.returncode == 0, helped.stderr
    assert "init" in helped.stdout and "check-config" in helped.stdout
    # The fresh venv has no simulator: `sparkd demo` says how to get it.
    demo = _run(fresh / "bin" / "sparkd", "demo", timeout=60)
    assert demo.returncode != 0 and "sparkd-sim" in demo.stderr
