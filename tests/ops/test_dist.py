"""`make dist`'s build of sparkd (sdist and wheel, `python -m build` with the test venv's
setuptools) and the wheel installed in a fresh venv: its `sparkd` runs. Minutes: pip installs
the wheel's dependencies into the new venv (from its cache, under the test pins)."""

from __future__ import annotations

import venv
from pathlib import Path

import pytest

from tests.ops.dist import PINS, build_dist
from tests.ops.dist import run as _run

pytestmark = pytest.mark.slow


def test_the_built_wheel_installs_in_a_fresh_venv_and_runs(tmp_path: Path) -> None:
    out = build_dist(tmp_path / "checkout")
    (wheel,) = out.glob("sparkd-*.whl")
    assert len(list(out.glob("sparkd-*.tar.gz"))) == 1

    fresh = tmp_path / "venv"
    venv.create(fresh, with_pip=True)
    python = fresh / "bin" / "python"
    installed = _run(python, "-m", "pip", "install", "--quiet", wheel, "-c", PINS)
    assert installed.returncode == 0, installed.stderr[-2000:]
    helped = _run(fresh / "bin" / "sparkd", "--help", timeout=60)
    assert helped.returncode == 0, helped.stderr
    assert "init" in helped.stdout and "check-config" in helped.stdout
    # The fresh venv has no simulator: `sparkd demo` says how to get it.
    demo = _run(fresh / "bin" / "sparkd", "demo", timeout=60)
    assert demo.returncode != 0 and "sparkd-sim" in demo.stderr
