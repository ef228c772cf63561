"""What Spark's Python workers run, checked when a user registers the ``nsq`` format: an
interpreter that cannot import smartnsq is named at ``register(spark)`` with the fix, instead
of a ModuleNotFoundError under a Java trace at the first query."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path
from types import SimpleNamespace

import pytest

from smartnsq.errors import WorkerPythonError
from smartnsq.spark.env import check_worker_python, java_missing_reason

#: a local SparkSession in a child process: JVM start, register, one read (seconds)
CHILD_TIMEOUT = 180

#: the README's snippet as a user runs it: a SparkSession of their own, then register and read
USER_SCRIPT = """
from pyspark.sql import SparkSession
import smartnsq.spark

spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
spark.sparkContext.setLogLevel("OFF")
try:
    smartnsq.spark.register(spark)
    spark.read.format("nsq").option("lookupd", "127.0.0.1:9").option("topic", "t").load()
    print("NO ERROR")
except Exception as exc:
    print("ERROR " + type(exc).__name__ + ": " + str(exc))
finally:
    spark.stop()
"""


def bare_python(tmp_path: Path) -> str:
    """A fresh virtual environment's interpreter: the same Python, without smartnsq."""
    env_dir = tmp_path / "bare"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    return str(env_dir / "bin" / "python")


def test_register_names_the_worker_python_that_lacks_smartnsq(tmp_path: Path) -> None:
    reason = java_missing_reason()
    if reason is not None:
        pytest.skip(reason)
    pytest.importorskip("pyspark", reason="pyspark (the spark extra) is not installed")
    bare = bare_python(tmp_path)
    env = {**os.environ, "PYSPARK_PYTHON": bare, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("PYSPARK_DRIVER_PYTHON", None)
    done = subprocess.run([sys.executable, "-c", USER_SCRIPT], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT, check=False)
    out = done.stdout
    assert "ERROR WorkerPythonError: " in out, (out[-3000:], done.stderr[-3000:])
    line = out[out.index("ERROR "):].splitlines()[0]
    # one line: which interpreter, what it lacks, how to fix it
    assert f"Spark's Python workers run {bare} (PYSPARK_PYTHON)" in line
    assert "cannot import smartnsq" in line
    assert f"set PYSPARK_PYTHON to {sys.executable}" in line
    assert "smartnsq.spark.env.prepare_spark_environment()" in line


def session(python: str, *, includes: tuple[str, ...] = ()) -> SimpleNamespace:
    """What the check reads of a SparkSession: its context's worker interpreter and files."""
    return SimpleNamespace(sparkContext=SimpleNamespace(pythonExec=python,
                                                        _python_includes=list(includes)))


def test_check_passes_this_interpreter_and_names_a_missing_one(tmp_path: Path) -> None:
    check_worker_python(session(sys.executable))
    missing = str(tmp_path / "no-such-python")
    with pytest.raises(WorkerPythonError, match="which does not exist"):
        check_worker_python(session(missing))


def test_shipped_python_files_make_the_check_a_warning(tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture,
                                                       monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    # smartnsq may reach the workers in a zip given to --py-files / addPyFile: not certain
    bare = bare_python(tmp_path)
    # workers start in the driver's directory and find packages there, like `python -m`
    monkeypatch.chdir(tmp_path)
    with caplog.at_level("WARNING", logger="smartnsq.spark.env"):
        check_worker_python(session(bare, includes=("deps.zip",)))
    assert any("cannot import smartnsq" in r.getMessage() and "deps.zip" in r.getMessage()
               for r in caplog.records), caplog.text
