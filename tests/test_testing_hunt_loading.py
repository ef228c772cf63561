"""Loading the plugin where pytest's plugin autoloading is off (docs/guides/testing.md): the
fixtures are missing until the run names the plugin with ``-p smartnsq``, which also works
with autoloading on (the entry point's name, so the plugin is registered once)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_testing_plugin import ENTRY_POINT_LOADED, run_user_tests

pytest_plugins = ["pytester"]

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


def test_a_module_or_class_marker_sizes_its_tests_and_leaves_a_session_test_alone(
        pytester: pytest.Pytester) -> None:
    # a module-wide pytestmark sizing the module's clusters errored every test of the module
    # using a session cluster ("@pytest.mark.nsq sizes only ..."), though the marker was not
    # on it; a marker on the test itself still does
    result = run_user_tests(pytester, '''
import pytest

pytestmark = pytest.mark.nsq(nodes=2)


def test_sized(nsq_stock):
    assert len(nsq_stock.nsqd_tcp_addresses) == 2


def test_session_in_the_module(nsq_stock_session):
    assert len(nsq_stock_session.nsqd_tcp_addresses) == 1


@pytest.mark.nsq(nodes=3)
class TestGroup:
    def test_sized_by_the_class(self, nsq_stock):
        assert len(nsq_stock.nsqd_tcp_addresses) == 3

    def test_factory_in_the_class(self, nsq_cluster_factory):
        assert len(nsq_cluster_factory("stock").nsqd_tcp_addresses) == 1


@pytest.mark.nsq(nodes=4)
def test_marked_itself(nsq_stock_session):
    pass
''')
    result.assert_outcomes(passed=4, errors=1)
    result.stdout.fnmatch_lines([
        "*@pytest.mark.nsq sizes only nsq_stock / nsq_youzan; test_marked_itself uses "
        "nsq_stock_session, which it cannot size*"])
