"""A Spark standalone cluster for the ``spark_cluster`` tests, and the packed Python
environment its executors run.

:class:`StandaloneCluster` starts a master and workers (one core each) from pyspark's own
``bin/spark-class`` on 127.0.0.1, with their work and log directories under a temporary
directory, and always stops them. :func:`packed_environment` builds a separate virtual
environment with smartnsq and what its Spark side imports (pyspark itself comes from Spark
through ``pyspark.zip``) and packs it with venv-pack, cached by the sources' hash under
``.venv-spark-exec/``. Drivers run in their own process (:func:`run_driver`), in a working
directory of their own, as a user's application would: one SparkContext per process, and the
driver's planning workers resolve the executors' relative interpreter path there.

The tests run only when ``SMARTNSQ_SPARK_CLUSTER=1`` (``make test-spark-cluster``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
ENABLED = os.environ.get("SMARTNSQ_SPARK_CLUSTER") == "1"
SKIP_REASON = ("SMARTNSQ_SPARK_CLUSTER=1 is not set: the Spark standalone cluster tests run "
               "with `make test-spark-cluster`")
#: where packed executor environments are cached, one per hash of the sources (git-ignored)
CACHE = REPO / ".venv-spark-exec"
#: what executors import besides smartnsq (the spark extra without pyspark, which Spark ships)
EXECUTOR_PACKAGES = ("pyarrow", "numpy", "pandas<3")
#: the name the archive is unpacked under, on executors and in the driver's directory, and
#: the interpreter inside it that the drivers give Spark (PYSPARK_PYTHON)
ENV_NAME = "environment"
DRIVER_PYTHON = f"./{ENV_NAME}/bin/python"
#: bounds: the master and workers up (JVM starts on a loaded 2-core machine), one driver run
START_SECONDS = 120.0
DRIVER_SECONDS = 240.0
#: one cluster test in all (pytest-timeout; the suite's 120 s default is less than a driver
#: run's bound, and a stock restart test alone takes ~80 s on a quiet 2-core machine)
TEST_SECONDS = 360
STOP_SECONDS = 20.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def spark_env(**extra: str) -> dict[str, str]:
    """The environment for Spark's daemons and drivers: loopback, pyspark's own SPARK_HOME,
    and no PYTHONPATH (Spark passes it on to every Python worker it starts)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env.update(SPARK_LOCAL_IP="127.0.0.1", SPARK_HOME=str(spark_home()), **extra)
    return env


@dataclass
class StandaloneCluster:
    """A running master and its workers; ``url`` is the master's ``spark://`` address."""

    base: Path
    url: str = ""
    ui_port: int = 0
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    worker_ui: dict[str, int] = field(default_factory=dict)  # name -> web UI port
    started_in: float = 0.0

    def start(self, workers: int = 2) -> None:
        began = time.monotonic()
        port, self.ui_port = _free_port(), _free_port()
        self.url = f"spark://127.0.0.1:{port}"
        self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(port), "--webui-port", str(self.ui_port))
        for i in range(1, workers + 1):
            self._spawn_worker(f"worker{i}")
        self._wait_workers(began + START_SECONDS)
        self.started_in = time.monotonic() - began

    def _spawn_worker(self, name: str) -> None:
        work = self.base / name
        work.mkdir(parents=True, exist_ok=True)
        self.worker_ui[name] = _free_port()
        self._spawn(name, "org.apache.spark.deploy.worker.Worker", self.url,
                    "--cores", "1", "--memory", "1g", "--host", "127.0.0.1",
                    "--webui-port", str(self.worker_ui[name]), "--work-dir", str(work))

    def _wait_workers(self, deadline: float) -> None:
        # by web UI port: a killed worker stays ALIVE on the master until its timeout
        while not set(self.worker_ui.values()) <= self.alive_workers():
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = f"{dead} exited" if dead else f"not up within {START_SECONDS:.0f} s"
                raise RuntimeError(f"Spark standalone cluster: {why}\n{self.logs()}")
            time.sleep(0.5)

    def restart_dead_workers(self) -> None:
        """Start again the workers a test killed; wait until all are registered."""
        dead = [n for n, p in self.procs.items() if n != "master" and p.poll() is not None]
        for name in dead:
            (self.base / f"{name}.log").rename(self.base / f"{name}.killed.log")
            self._spawn_worker(name)
        self._wait_workers(time.monotonic() + START_SECONDS)

    def _spawn(self, name: str, cls: str, *args: str) -> None:
        out = (self.base / f"{name}.log").open("wb")
        env = spark_env(SPARK_LOG_DIR=str(self.base / "logs"),
                        SPARK_WORKER_DIR=str(self.base / name))
        # spark-class execs java, so the pid is the daemon's own
        self.procs[name] = subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), cls, *args], stdout=out,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=self.base)
        out.close()

    def alive_workers(self) -> set[int]:
        """The web UI ports of the workers the master lists as ALIVE."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/",
                                        timeout=2) as answer:
                state = json.load(answer)
        except (OSError, ValueError):
            return set()
        return {int(str(w.get("webuiaddress", ":0")).rsplit(":", 1)[1])
                for w in state.get("workers", ()) if w.get("state") == "ALIVE"}

    def executor_logs(self) -> str:
        """The last lines of every executor's stderr (under the workers' work dirs)."""
        parts = []
        for f in sorted(self.base.glob("worker*/app-*/*/stderr")):
            parts.append(f"--- {f.relative_to(self.base)}\n" +
                         "\n".join(f.read_text(errors="replace").splitlines()[-40:]))
        return "\n".join(parts)

    def unfinished_tasks(self, worker: str, app: str) -> set[str]:
        """Task ids an executor of ``worker`` started for application ``app`` and never
        finished (per its log)."""
        return unfinished_tasks_in(self.base / worker, app)

    def logs(self) -> str:
        parts = []
        for name in self.procs:
            f = self.base / f"{name}.log"  # the current run's (a killed one's is .killed.log)
            text = f.read_text(errors="replace") if f.exists() else ""
            parts.append(f"--- {name}\n" + "\n".join(text.splitlines()[-30:]))
        return "\n".join(parts)

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(STOP_SECONDS)


def _source_hash(extra: tuple[str, ...] = ()) -> str:
    """A hash of what goes into the packed environment: smartnsq's sources and metadata."""
    h = hashlib.sha256()
    for f in sorted([REPO / "pyproject.toml", *(REPO / "smartnsq").rglob("*.py")]):
        h.update(str(f.relative_to(REPO)).encode())
        h.update(f.read_bytes())
    h.update(" ".join((*EXECUTOR_PACKAGES, *extra)).encode())
    return h.hexdigest()[:16]


@dataclass
class PackedEnv:
    archive: Path
    seconds: float  # spent building it in this session (0.0 when it came from the cache)


def packed_environment(name: str = "smartnsq", with_smartnsq: bool = True,
                       extra: tuple[str, ...] = ()) -> PackedEnv:
    """A venv-packed environment (``.tar.gz``) with smartnsq, the executor packages and
    ``extra`` ones (the benchmark's peers), or (``with_smartnsq=False``) an empty one, built
    once per source hash."""
    venv_pack = pytest.importorskip("venv_pack", reason="venv-pack is not installed "
                                    "(pip install venv-pack)")
    key = _source_hash(extra) if with_smartnsq else "bare"
    target = CACHE / f"{name}-{key}.tar.gz"
    if target.exists():
        return PackedEnv(target, 0.0)
    began = time.monotonic()
    CACHE.mkdir(exist_ok=True)
    for old in CACHE.glob(f"{name}-*"):
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    venv = CACHE / f"{name}-{key}"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    if with_smartnsq:
        # a regular (not editable) install of this checkout, as a user installs a wheel
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(REPO),
                        *EXECUTOR_PACKAGES, *extra], check=True, timeout=900,
                       capture_output=True)
    partial = target.with_suffix(".part")
    venv_pack.pack(prefix=str(venv), output=str(partial), format="tar.gz", force=True,
                   verbose=False)
    partial.rename(target)
    shutil.rmtree(venv)
    return PackedEnv(target, time.monotonic() - began)


def unpack(archive: Path, cwd: Path) -> None:
    """The recipe's driver step: the archive the executors get, unpacked in the driver's
    working directory (the data source's planning workers run its interpreter there)."""
    target = cwd / ENV_NAME
    target.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        tar.extractall(target, filter="tar")


def driver_env() -> dict[str, str]:
    return spark_env(PYSPARK_PYTHON=DRIVER_PYTHON)


def driver_session(args: dict[str, Any]) -> Any:
    """In a driver process: a SparkSession on ``args["master"]`` shipping ``args["archive"]``
    to the executors as ``environment``."""
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(args["master"]).appName(args["app"])
             .config("spark.archives", f"{args['archive']}#{ENV_NAME}")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false")
             .config("spark.executor.memory", "512m")
             .config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def wait_for_executors(spark: Any, count: int, timeout: float = 60.0) -> None:
    """In a driver: wait until ``count`` executors have registered. Spark schedules on the
    first one as soon as it is up (a standalone master asks for no minimum), so a test that
    needs tasks on a given worker waits for them all first."""
    tracker = spark.sparkContext._jsc.sc().statusTracker()
    deadline = time.monotonic() + timeout
    # the driver counts among the executor infos
    while len(tracker.getExecutorInfos()) < count + 1:
        if time.monotonic() > deadline:
            raise AssertionError(f"fewer than {count} executors registered in {timeout}s")
        time.sleep(0.2)


def unfinished_tasks_in(worker_dir: Path, app: str) -> set[str]:
    """Task ids the executors of application ``app`` under a worker's directory started and
    have not finished (per their logs): the tasks running there now, or lost with it. One
    application's only: task ids start at 0 in each, so an earlier application's finished
    tasks would hide the running ones of the same ids."""
    started: set[str] = set()
    finished: set[str] = set()
    for f in (worker_dir / app).glob("*/stderr"):
        for line in f.read_text(errors="replace").splitlines():
            if "(TID " in line:
                tid = line.rsplit("(TID ", 1)[1].split(")", 1)[0]
                if "Executor: Running task" in line:
                    started.add(tid)
                elif "Executor: Finished task" in line:
                    finished.add(tid)
    return started - finished


def driver_args(cluster: StandaloneCluster, archive: Path, app: str,
                **more: Any) -> dict[str, Any]:
    return {"master": cluster.url, "archive": str(archive), "app": app, **more}


def run_driver(module: str, function: str, args: dict[str, Any], cwd: Path,
               env: dict[str, str]) -> dict[str, Any]:
    """Run ``module.function(args)`` as a Spark driver in its own Python process, in ``cwd``;
    it returns a JSON-able dict, printed on the last line of its output. The repository goes
    on the driver's ``sys.path`` (not on PYTHONPATH, which Spark hands to its workers)."""
    code = (f"import json, sys; sys.path.insert(0, {str(REPO)!r}); "
            f"from {module} import {function} as f; "
            "print('DRIVER-RESULT ' + json.dumps(f(json.loads(sys.argv[1]))))")
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code, json.dumps(args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=DRIVER_SECONDS, check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("DRIVER-RESULT ")]
    if done.returncode != 0 or not lines:
        raise AssertionError(f"driver {function} failed ({done.returncode}):\n"
                             f"{done.stdout[-4000:]}\n{done.stderr[-8000:]}")
    result: dict[str, Any] = json.loads(lines[-1][len("DRIVER-RESULT "):])
    result["driver_seconds"] = round(time.monotonic() - began, 1)
    return result


@pytest.fixture(scope="session")
def spark_standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    if not ENABLED:
        pytest.skip(SKIP_REASON)
    from smartnsq.spark.env import java_missing_reason

    reason = java_missing_reason()
    if reason is not None:
        pytest.skip(reason)
    pytest.importorskip("pyspark", reason="pyspark (the spark extra) is not installed")
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-standalone"))
    try:
        cluster.start()
        print(f"\nspark standalone cluster up in {cluster.started_in:.1f} s")
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def spark_packed_env() -> PackedEnv:
    if not ENABLED:
        pytest.skip(SKIP_REASON)
    env = packed_environment()
    print(f"\npacked executor environment {env.archive.name}: "
          f"{env.archive.stat().st_size / 2**20:.0f} MiB, built in {env.seconds:.1f} s")
    return env
