"""What a local PySpark needs on these machines before a SparkSession starts.

A PySpark worker connects back to the driver on the address Spark resolves for this host; on
machines whose hostname resolves elsewhere that never arrives, so Spark is pinned to loopback
unless the user chose an address. Workers must also run the interpreter that runs the driver,
or they import a different (or no) smartnsq.
"""

from __future__ import annotations

import os
import shutil
import sys

__all__ = ["java_missing_reason", "prepare_spark_environment"]


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
