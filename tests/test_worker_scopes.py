"""How ``make test`` shares the tests out between its two pytest-xdist workers
(tests/conftest.py's ``pytest_xdist_make_scheduler``), checked on a small suite of its own:
every module on one worker, in its order, and the Spark directory all on one worker.

xdist's own ``loadgroup`` marks did this until pytest 9 made xdist ignore them without a
word: the modules were split between the workers, and a test that builds on the ones before
it in its module (a module-scoped cluster they published to) met a fresh cluster on the
other worker, in CI only."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

pytest.importorskip("xdist", reason="pytest-xdist (make test's workers) is not installed")

ROOT = Path(__file__).resolve().parent.parent

#: modules of the small suite: (path, tests in it)
MODULES = [("tests/spark/test_s1.py", 6), ("tests/spark/test_s2.py", 6),
           ("tests/test_a.py", 5), ("tests/test_b.py", 5), ("tests/test_c.py", 5),
           ("tests/test_d.py", 5)]

TEST = '''
import os

def test_{i}():
    with open(os.environ["WORKER_LOG"], "a") as f:
        f.write(f"{{os.environ['PYTEST_XDIST_WORKER']}} {{__file__}} {i}\\n")
'''


def test_each_module_and_the_spark_directory_stay_on_one_worker(tmp_path: Path) -> None:
    for rel, n in MODULES:
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(TEST.format(i=i) for i in range(n)))
    # the project's hook, as its own conftest would give it
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_xdist_make_scheduler  # noqa: F401\n")
    log = tmp_path / "workers.log"
    env = {**os.environ, "WORKER_LOG": str(log), "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadscope",
         "-p", "no:cacheprovider", "-p", "no:randomly", "--rootdir", str(tmp_path),
         str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    workers: dict[str, set[str]] = defaultdict(set)
    order: dict[str, list[int]] = defaultdict(list)
    for line in log.read_text().splitlines():
        worker, file, index = line.split()
        rel = Path(file).relative_to(tmp_path).as_posix()
        workers[rel].add(worker)
        order[rel].append(int(index))
    assert {rel: len(order[rel]) for rel, _ in MODULES} == dict(MODULES)
    # one worker per module, its tests in their order
    assert all(len(w) == 1 for w in workers.values()), dict(workers)
    assert all(ixs == sorted(ixs) for ixs in order.values()), dict(order)
    # the Spark directory together (one JVM), and both workers had work
    spark = workers["tests/spark/test_s1.py"] | workers["tests/spark/test_s2.py"]
    assert len(spark) == 1, dict(workers)
    assert len(set().union(*workers.values())) == 2, dict(workers)
