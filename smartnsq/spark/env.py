"""What a local PySpark needs on these machines, and whether Spark's Python workers have it.

A PySpark worker connects back to the driver on the address Spark resolves for this host; on
machines whose hostname resolves elsewhere that never arrives, so Spark is pinned to loopback
unless the user chose an address. Workers must also run an interpreter that has smartnsq (the
one running the driver, by default), or every query fails with ``ModuleNotFoundError:
smartnsq`` under a Java trace: :func:`check_worker_python` says so at ``register(spark)``.
"""

from __future__ import annotations

import builtins
import functools
import logging
import os
import shutil
import subprocess
import sys
import threading
import types
from collections.abc import Iterable, Iterator
from typing import Any

from smartnsq.errors import WorkerPythonError

__all__ = ["check_executor_python", "check_worker_python", "java_missing_reason",
           "prepare_spark_environment"]

log = logging.getLogger(__name__)

#: what the nsq source and sink import in Spark's Python workers (pyspark comes from Spark)
_WORKER_MODULES = ("smartnsq", "pyarrow", "numpy")
#: run by the workers' interpreter: its version, then the modules it cannot find (no import)
_PROBE = ("import importlib.util as u, sys; print('%d.%d' % sys.version_info[:2]); "
          f"print(','.join(m for m in {_WORKER_MODULES!r} if u.find_spec(m) is None))")
#: seconds for that interpreter to start and answer (a cold start on a loaded machine)
_PROBE_TIMEOUT = 30.0
#: seconds for the executors to answer (they may still be starting); then the probe is dropped
_EXECUTOR_PROBE_TIMEOUT = 120.0


def prepare_spark_environment() -> None:
    """Set ``SPARK_LOCAL_IP`` and ``PYSPARK_PYTHON`` unless the user already set them."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def java_missing_reason() -> str | None:
    """Why Spark cannot start here (no Java), or None when a ``java`` is on hand."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.path.exists(os.path.join(java_home, "bin", "java")):
        return None
    if shutil.which("java"):
        return None
    return ("Spark needs a Java 17 or 21 runtime and none was found (set JAVA_HOME or install "
            "one, e.g. `apt-get install openjdk-17-jre-headless`)")


def check_worker_python(spark: Any) -> None:
    """Raise :class:`WorkerPythonError` naming the interpreter Spark's Python workers run if
    it cannot import smartnsq (or pyarrow), or is another Python version than the driver.

    The workers run the interpreter the SparkContext read from ``PYSPARK_PYTHON`` when it
    started (``python3`` on the PATH without it); the data source's planning workers run it
    on this host. Asked once per interpreter (it is started once, ~30 ms). When the session
    ships Python files to the workers (``--py-files``, ``addPyFile``), smartnsq may come in
    one of them, and when the interpreter does not answer nothing is known: the finding is
    then logged as a warning instead. On a cluster the executors' interpreter is asked next
    (:func:`check_executor_python`). Spark Connect sessions (no SparkContext here) are not
    checked.
    """
    try:
        context = spark.sparkContext
        python = str(context.pythonExec)
    except Exception as exc:  # Spark Connect: the workers are the server's business
        log.debug("not checking Spark's worker Python: %r", exc)
        return
    finding = _worker_problem(python, os.environ.get("PATH", ""),
                              os.environ.get("PYTHONPATH", ""), os.getcwd())
    if finding is None:
        check_executor_python(spark)
        return
    problem, certain = finding
    # the context read PYSPARK_PYTHON when it started; it may have changed since
    source = ("PYSPARK_PYTHON" if os.environ.get("PYSPARK_PYTHON") == python else
              "python3 on the PATH: PYSPARK_PYTHON was not set when the SparkSession started"
              if python == "python3" else "PYSPARK_PYTHON when the SparkSession started")
    fix = _relative_fix(python) or (
        f"set PYSPARK_PYTHON to {sys.executable} (this interpreter) before the "
        "SparkSession starts, or call smartnsq.spark.env.prepare_spark_environment() "
        "first, or give that interpreter smartnsq[spark]")
    text = f"Spark's Python workers run {python} ({source}), {problem}; {fix}"
    shipped = [str(f) for f in getattr(context, "_python_includes", None) or ()]
    if certain and not shipped:
        raise WorkerPythonError(text)
    if shipped:
        text += f" (unless a Python file shipped to the workers provides it: {', '.join(shipped)})"
    log.warning("%s", text)


def check_executor_python(spark: Any, timeout: float = _EXECUTOR_PROBE_TIMEOUT) -> None:
    """On a cluster (a master other than ``local[...]``), raise :class:`WorkerPythonError`
    naming the interpreter the executors run, as they see it, if it cannot import smartnsq
    (or pyarrow, numpy) or is another Python version than the driver.

    The executors may run another Python than the driver (a packed environment shipped with
    ``spark.archives``, an image's own); without this the first query fails with
    ``ModuleNotFoundError`` inside a Java trace that names no interpreter. It runs one task per
    core with a function shipped by value (it needs nothing from smartnsq there); when that job
    does not finish within ``timeout`` seconds (no executor yet) or fails, the finding is
    logged as a warning instead. Called by :func:`check_worker_python` once the driver's side
    passed.
    """
    try:
        context = spark.sparkContext
        master = str(context.master)
    except Exception as exc:  # Spark Connect: the workers are the server's business
        log.debug("not checking the executors' Python: %r", exc)
        return
    if master.startswith("local"):
        return  # the executors are the driver's own Python workers, checked already
    tasks = max(1, int(context.defaultParallelism))
    tag = f"smartnsq-executor-python-{os.getpid()}-{threading.get_ident()}"
    context.addJobTag(tag)
    timer = threading.Timer(timeout, context.cancelJobsWithTag, (tag,))
    timer.start()
    try:
        answers = (context.parallelize(range(tasks), tasks)
                   .mapPartitions(_shipped_by_value(_executor_answer)).collect())
    except Exception as exc:
        log.warning("could not ask the executors' Python what it imports (%s)",
                    str(exc).splitlines()[0][:300])
        return
    finally:
        timer.cancel()
        context.removeJobTag(tag)
    driver = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for python, version, missing in sorted(set(answers)):
        if missing:
            problem = (f"which cannot import {missing.replace(',', ' or ')} (the nsq source "
                       "and sink run there)")
        elif version != driver:
            problem = (f"which is Python {version}; the driver runs Python {driver} and Spark "
                       "needs the same in both")
        else:
            continue
        raise WorkerPythonError(
            f"Spark's executors run {python} (the path {context.pythonExec} as they resolve "
            f"it), {problem}; ship them an environment with smartnsq[spark] (spark.archives "
            "with a packed virtual environment, see the Spark guide's Cluster deployment) or "
            "install smartnsq[spark] into that Python on every executor")


def _executor_answer(_: Iterable[int], modules: tuple[str, ...] = _WORKER_MODULES
                     ) -> Iterator[tuple[str, str, str]]:
    """Run on an executor: its interpreter, its version, the modules it cannot find."""
    import importlib.util
    import sys

    found = importlib.util.find_spec
    yield (sys.executable, f"{sys.version_info[0]}.{sys.version_info[1]}",
           ",".join(m for m in modules if found(m) is None))


def _shipped_by_value(fn: Any) -> Any:
    """``fn`` as a function of no module, which Spark's pickler ships by value: executors
    without smartnsq can still run it."""
    return types.FunctionType(fn.__code__, {"__builtins__": builtins}, fn.__name__,
                              fn.__defaults__)


def _relative_fix(python: str) -> str | None:
    """The fix for a relative interpreter path (a packed environment shipped to executors
    with ``spark.archives``), or None for an absolute path or a bare command name."""
    if os.sep not in python or os.path.isabs(python):
        return None
    top = python.split(os.sep)[1 if python.startswith("." + os.sep) else 0]
    return (f"the executors resolve {python} in their working directory, where spark.archives "
            "unpacks the environment, but the data source's planning workers that this driver "
            f"starts resolve it in the driver's working directory {os.getcwd()}: unpack the "
            f"same archive there before the query (mkdir {top} && tar -xzf <archive> -C {top}) "
            "or make it a link to a Python that has smartnsq[spark]")


def _worker_problem(python: str, path: str, pythonpath: str, cwd: str
                    ) -> tuple[str, bool] | None:
    """What is wrong with ``python`` as Spark's worker interpreter and whether that is
    certain, or None. ``path``, ``pythonpath`` and ``cwd`` decide which interpreter and which
    modules the workers find (they start in the driver's directory, which ``python -m`` puts
    on their path). A missing interpreter is not remembered: it may be unpacked next."""
    found = python if os.sep in python else shutil.which(python, path=path)
    if found is None or not os.path.exists(os.path.join(cwd, found)):
        return "which does not exist", True
    return _probe(os.path.join(cwd, found), pythonpath, cwd)


@functools.cache
def _probe(found: str, pythonpath: str, cwd: str) -> tuple[str, bool] | None:
    """:func:`_worker_problem` for an interpreter that exists, asked once per key."""
    try:
        done = subprocess.run([found, "-c", _PROBE], capture_output=True, text=True,
                              timeout=_PROBE_TIMEOUT, check=False, cwd=cwd,
                              env={**os.environ, "PYTHONPATH": pythonpath})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"which could not be asked what it imports ({exc!r})", False
    lines = done.stdout.splitlines()
    if done.returncode != 0 or len(lines) != 2:
        return (f"which did not answer what it imports ({done.stderr.strip()[-200:]!r})",
                False)
    version, missing = lines[0], [m for m in lines[1].split(",") if m]
    driver = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if missing:
        return (f"which cannot import {' or '.join(missing)} (the nsq source and sink run in "
                "those workers)", True)
    if version != driver:
        return (f"which is Python {version}; the driver runs Python {driver} and Spark needs "
                "the same in both", True)
    return None
