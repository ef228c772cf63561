"""The documentation site builds with ``mkdocs build --strict``: no broken link, anchor or
API cross-reference, no page left out of the navigation (``make docs`` serves the same
site)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def mkdocs() -> str:
    found = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip("mkdocs is not installed (the docs extra: pip install -e '.[docs]')")
    return found


def test_site_builds_strictly(tmp_path: Path) -> None:
    site = tmp_path / "site"
    proc = subprocess.run(
        [mkdocs(), "build", "--strict", "--site-dir", str(site)], cwd=ROOT,
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-5000:]
    # the API reference was generated from the docstrings, signatures included
    producer = (site / "reference" / "smartnsq" / "index.html").read_text()
    assert 'id="smartnsq.Producer.publish"' in producer
    assert "trace_id" in producer
    assert (site / "quickstart" / "index.html").is_file()
