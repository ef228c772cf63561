"""The Spark examples of README.md and of the documentation site run as written (a fresh
interpreter each, local Spark, the embedded cluster's addresses for the page's): see
``tests/doc_examples.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from smartnsq.spark.env import java_missing_reason
from tests.doc_examples import TEST_TIMEOUT, Example, example_cluster, run_python, runnable


@pytest.mark.timeout(TEST_TIMEOUT)
@pytest.mark.parametrize("example", runnable("spark"), ids=lambda e: e.id)
async def test_spark_example_runs(example: Example, tmp_path: Path) -> None:
    reason = java_missing_reason()
    if reason is not None:
        pytest.skip(reason)
    pytest.importorskip("pyspark", reason="pyspark (the spark extra) is not installed")
    async with example_cluster(example.kind) as cluster:
        out = await run_python(cluster, example, cwd=tmp_path)
    assert out.strip(), "the example printed nothing"
    if "readStream" in example.code:
        # the batch read's counts per partition, and the stream's rows on the console
        assert "|partition|count|" in out and "Batch: 0" in out, out[-3000:]
    else:
        assert "published 2 rows" in out, out[-3000:]
