"""Loading the plugin where pytest's plugin autoloading is off (docs/guides/testing.md): the
fixtures are missing until the run names the plugin with ``-p smartnsq``, which also works
with autoloading on (the entry point's name, so the plugin is registered once)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_testing_plugin import ENTRY_POINT_LOADED

USER_TEST = "def test_publish(nsq_stock):\n    assert nsq_stock.is_running\n"


@pytest.mark.skipif(not ENTRY_POINT_LOADED, reason="the plugin is not installed as pytest11")
@pytest.mark.parametrize("autoload", [False, True])
def test_dash_p_smartnsq_loads_the_plugin_with_autoloading_off_or_on(
        tmp_path: Path, autoload: bool) -> None:
    (tmp_path / "test_user.py").write_text(USER_TEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_DISABLE_PLUGIN_AUTOLOAD"}
    if not autoload:
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)

    named = run("-p", "smartnsq")
    assert named.returncode == 0 and "1 passed" in named.stdout, named.stdout + named.stderr
    if not autoload:
        bare = run()
        assert bare.returncode == 1 and "fixture 'nsq_stock' not found" in bare.stdout
