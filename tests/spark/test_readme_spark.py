"""The README's Spark examples run as written (a fresh interpreter each, local Spark, the
embedded cluster's addresses for the README's): see ``tests/test_readme_examples.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from smartnsq.spark.env import java_missing_reason
from tests.test_readme_examples import Example, example_cluster, run_in, runnable


@pytest.mark.parametrize("example", runnable(spark=True), ids=lambda e: e.id)
async def test_readme_spark_example_runs(example: Example, tmp_path: Path) -> None:
    reason = java_missing_reason()
    if reason is not None:
        pytest.skip(reason)
    pytest.importorskip("pyspark", reason="pyspark (the spark extra) is not installed")
    async with example_cluster(example.kind.removeprefix("spark").strip()) as cluster:
        out = await run_in(cluster, example, cwd=tmp_path)
    assert out.strip(), "the example printed nothing"
    if "readStream" in example.code:
        # the batch read's counts per partition, and the stream's rows on the console
        assert "|partition|count|" in out and "Batch: 0" in out, out[-3000:]
    else:
        assert "published 2 rows" in out, out[-3000:]
