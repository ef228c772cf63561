"""A newcomer's first run (issue 22): smartnsq pip-installed from this repository into a fresh
virtual environment, and the user-style tests of examples/ run there with that environment's
python and only the plugin's fixtures (no conftest.py, no pytest configuration, not this
checkout on sys.path)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the whole test, venv and pip included, within pytest-timeout's bound below
BUDGET = 280.0
#: what the newcomer installs: the package and the extra with pytest and pytest-asyncio
EXTRA = "testing"


def run(args: list[str | Path], deadline: float, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=max(deadline - time.monotonic(), 1.0), check=False)


def copy_project(dest: Path) -> Path:
    """What pip needs to build the package, out of the checkout (a build in place would leave
    build/ and egg-info behind in the working tree)."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / "smartnsq", dest / "smartnsq",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def test_pyproject_installs_the_plugin_and_its_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    entry_points = project.get("entry-points", {}).get("pytest11", {})
    assert entry_points.get("smartnsq") == "smartnsq.testing.plugin", (
        "pyproject.toml needs [project.entry-points.pytest11] smartnsq = "
        "'smartnsq.testing.plugin'")
    extra = " ".join(project.get("optional-dependencies", {}).get(EXTRA, []))
    assert "pytest" in extra and "pytest-asyncio" in extra, (
        f"pyproject.toml needs the extra {EXTRA!r} with pytest and pytest-asyncio")
    assert not (ROOT / "examples" / "conftest.py").exists()


@pytest.mark.timeout(300)
def test_examples_pass_in_a_fresh_venv(tmp_path: Path) -> None:
    deadline = time.monotonic() + BUDGET
    venv = tmp_path / "venv"
    made = run([sys.executable, "-m", "venv", venv], deadline, tmp_path)
    python = venv / "bin" / "python"
    if made.returncode != 0 or not python.exists():
        pytest.skip(f"cannot create a virtual environment here: {made.stderr.strip()[-300:]}")
    if run([python, "-m", "pip", "--version"], deadline, tmp_path).returncode != 0:
        pytest.skip("the fresh virtual environment has no working pip")

    source = copy_project(tmp_path / "smartnsq-src")
    installed = run([python, "-m", "pip", "install", "-q", f"{source}[{EXTRA}]"], deadline,
                    tmp_path)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]

    # the user's project: the example files alone, in a directory of their own
    user = tmp_path / "user-project"
    shutil.copytree(ROOT / "examples", user / "examples",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    result = run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "examples/"],
                 deadline, user)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert " passed" in output and "skipped" not in output, output[-2000:]
    # the package under test is the installed one, not this checkout
    where = run([python, "-c", "import smartnsq; print(smartnsq.__file__)"], deadline, user)
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr
