"""What a Spark user runs into with the nsq sink and source: a map with null values in
``ext``, writes from another thread, and the stream options as users type them."""

from __future__ import annotations

import pytest

pa = pytest.importorskip("pyarrow", reason="pyarrow (the spark extra) is not installed")

from smartnsq.spark.sink_arrow import BatchPlan, ExtBatch  # noqa: E402
from smartnsq.spark.sink_options import parse_sink_options  # noqa: E402


def test_a_null_ext_value_leaves_its_key_out() -> None:
    # map('tenant', tenant_col) with a null tenant_col: the header said "tenant": null, which
    # consumers read back as the string "null"; a null value means the key is absent
    ext = pa.array([[("tenant", None), ("k", "v")], [("tenant", None)]],
                   pa.map_(pa.string(), pa.string()))
    batch = pa.record_batch({"value": pa.array([b"a", b"b"], pa.binary()), "ext": ext})
    (u,) = BatchPlan(batch, parse_sink_options({"nsqd": "127.0.0.1:1", "topic": "t"})
                     ).units({})
    assert isinstance(u, ExtBatch)
    assert u.items == [(b'{"k":"v"}', b"a"), (b"{}", b"b")]
