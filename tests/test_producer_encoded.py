"""Producer.publish_encoded / publish_ext_batch: batches the caller encoded (one buffer for the
whole MPUB, per-message trace ids, per-message ext headers), against the embedded youzan and
stock clusters, and every bad argument refused before any I/O."""

from __future__ import annotations

import json
import struct
from collections.abc import AsyncIterator

import pytest

from smartnsq.config import ProducerConfig
from smartnsq.devcluster import DevCluster
from smartnsq.errors import ConfigError, NSQError, UnsupportedFeatureError
from smartnsq.producer import BatchReceipt, Producer, encode_batch
from tests.test_producer_support import bodies_of, consume

FAST = ProducerConfig(publish_timeout=5.0, reconnect_min=0.02, reconnect_max=0.2)
SMALL = FAST.replace(max_body_size=1024, max_msg_size=512)


@pytest.fixture
async def youzan() -> AsyncIterator[DevCluster]:
    async with DevCluster(nodes=3, flavour="youzan") as c:
        yield c


@pytest.fixture
async def stock() -> AsyncIterator[DevCluster]:
    async with DevCluster(nodes=1, flavour="stock") as c:
        yield c


def test_encode_batch_wire_format() -> None:
    assert encode_batch([b"ab", b"c"]) == (struct.pack(">I", 2) + struct.pack(">I", 2) + b"ab"
                                          + struct.pack(">I", 1) + b"c")
    assert encode_batch([b"ab"], [7]) == (struct.pack(">I", 1) + struct.pack(">I", 10)
                                          + struct.pack(">Q", 7) + b"ab")


@pytest.mark.parametrize(("bodies", "trace_ids", "match"), [
    ([], None, "non-empty sequence"),
    (b"abc", None, "non-empty sequence"),
    ([b"a", ""], None, r"bodies\[1\] must be non-empty bytes"),
    ([b"a", b""], None, r"bodies\[1\] must be non-empty bytes"),
    ([b"a"], [1, 2], "one per body"),
    ([b"a"], 5, "one per body"),
    ([b"a"], [-1], "trace_id must be an int"),
    ([b"a"], [True], "trace_id must be an int"),
])
def test_encode_batch_refuses_bad_input(bodies: object, trace_ids: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        encode_batch(bodies, trace_ids)  # type: ignore[arg-type]


async def test_traced_batch_keeps_every_trace_id(youzan: DevCluster) -> None:
    youzan.create_topic("enc", partition_num=3, replica=1, channels=("c",))
    bodies = [b"m%d" % i for i in range(5)]
    tids = [1000 + i for i in range(5)]
    async with Producer(lookupd=youzan.lookupd_http_addresses, config=FAST) as p:
        sent = await p.publish_encoded("enc", encode_batch(bodies, tids), partition=2,
                                       traced=True)
        plain = await p.publish_encoded("enc", memoryview(encode_batch([b"x", b"y"])))
    assert isinstance(sent, BatchReceipt)
    assert (sent.topic, sent.partitions, sent.count) == ("enc", (2,), 5)
    records = youzan.store.partition("enc", 2).records
    assert [r.body for r in records] == bodies
    assert [r.trace_id for r in records] == tids
    (receipt,) = sent.receipts  # one MPUB_TRACE, one receipt
    assert receipt.count == 5 and receipt.partition == 2
    assert receipt.offset == records[0].offset
    assert receipt.raw_size == sum(r.raw_size for r in records)
    # round-robin: the result says which partition took the batch
    assert isinstance(plain, BatchReceipt)
    assert plain.receipts == () and plain.count == 2
    (partition,) = plain.partitions
    assert partition is not None
    got = [r.body for r in youzan.store.partition("enc", partition).records]
    assert got[-2:] == [b"x", b"y"]


async def test_ext_batch_has_a_header_per_message(youzan: DevCluster) -> None:
    youzan.create_topic("ext", partition_num=1, replica=1, ext=True, channels=("c",))
    youzan.create_topic("noext", partition_num=1, replica=1, channels=("c",))
    async with Producer(lookupd=youzan.lookupd_http_addresses, config=FAST) as p:
        sent = await p.publish_ext_batch("ext", [({"k": "1"}, b"a"), (b'{"k":"2"}', b"b"),
                                                 ({"##trace_id": "9"}, b"c")])
        assert sent == BatchReceipt("ext", 3, (0,), ())
        with pytest.raises(NSQError):  # not an ext topic: refused by nsqd, not retried
            await p.publish_ext_batch("noext", [({"k": "v"}, b"x")])
    recs = youzan.store.partition("ext", 0).records
    assert [r.body for r in recs] == [b"a", b"b", b"c"]
    assert [json.loads(r.ext) for r in recs] == [{"k": "1"}, {"k": "2"}, {"##trace_id": "9"}]
    assert recs[2].trace_id == 9


async def test_stock_batch_and_youzan_only_features(stock: DevCluster) -> None:
    stock.create_topic("s", channels=("c",))
    addr = stock.nsqd_tcp_addresses[0]
    bodies = [b"%03d" % i for i in range(50)]
    async with Producer(nsqd=[addr], config=FAST) as p:
        sent = await p.publish_encoded("s", encode_batch(bodies))
        assert sent == BatchReceipt("s", 50, (None,), ())
        with pytest.raises(UnsupportedFeatureError, match="MPUB_TRACE needs youzan"):
            await p.publish_encoded("s", encode_batch([b"x"], [1]), traced=True)
        with pytest.raises(UnsupportedFeatureError, match="MPUB_EXT needs youzan"):
            await p.publish_ext_batch("s", [({"k": "v"}, b"x")])
    assert bodies_of(await consume(addr, "s", "c", 50)) == bodies


@pytest.mark.parametrize(("body", "kwargs", "match"), [
    ("text", {}, "body must be bytes"),
    (b"\x00\x00", {}, "has no message count"),
    (struct.pack(">I", 0) + b"xxxxx", {}, "holds 0 messages"),
    (struct.pack(">I", 3) + b"\x00\x00\x00\x01a", {}, "too short for the 3 messages"),
    (encode_batch([b"a"]), {"traced": True}, "too short for the 1 messages"),
    (encode_batch([b"x" * 400] * 3), {}, "exceeds max_body_size"),
    (encode_batch([b"a"]), {"traced": 1}, "traced must be a bool"),
    # element sizes that do not cover the body: nsqd would read into the next command
    (struct.pack(">II", 1, 100) + b"short", {}, "message 0 of 1 \\(100 bytes\\) runs past the end"),
    (struct.pack(">II", 2, 1) + b"a" + struct.pack(">I", 50) + b"b" * 5, {},
     "message 1 of 2 \\(50 bytes\\) runs past the end"),
    (struct.pack(">II", 1, 1) + b"abcd", {}, "take 9 bytes, the body has 12"),
    (struct.pack(">II", 2, 5) + b"abcde\0\0", {}, "size field of message 1 of 2"),
    (struct.pack(">IIQ", 1, 9, 0) + b"a" + b"x" * 3, {"traced": True}, "take 17 bytes"),
    (struct.pack(">II", 1, 0) + b"abcd", {}, "message 0 of the body is 0 bytes"),
    (struct.pack(">II", 1, 4) + b"abcd" + b"x" * 8, {"traced": True},
     "shorter than its trace id"),
    (encode_batch([b"x" * 513]), {}, "513 bytes; messages must be 1..512"),
    (encode_batch([b"a"]), {"partition": -1}, "partition"),
    (encode_batch([b"a"]), {"timeout": 0}, "timeout"),
    (encode_batch([b"a"]), {"timeout": float("nan")}, "timeout"),
])
async def test_publish_encoded_refuses_bad_arguments(body: object, kwargs: dict[str, object],
                                                    match: str) -> None:
    addr = "127.0.0.1:1"  # never dialled: every check comes before any I/O
    async with Producer(nsqd=[addr], config=SMALL) as p:
        with pytest.raises(ConfigError, match=match):
            await p.publish_encoded("t", body, **kwargs)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="topic"):
            await p.publish_encoded("bad topic!", encode_batch([b"a"]))
        assert p.pools[addr].connections == ()  # refused before any I/O


@pytest.mark.parametrize(("items", "match"), [
    ([], "non-empty sequence"),
    (b"ab", "non-empty sequence"),
    ([b"ab"], r"items\[0\] must be a \(header, body\) pair"),
    ([({"k": "v"}, b"a", b"b")], r"items\[0\] must be a \(header, body\) pair"),
    ([({"k": "v"}, b"a"), ("{}", b"b")], r"items\[1\]: the header must be a dict"),
    ([({"k": "v"}, b"")], "must not be empty"),
    ([({"k": "v"}, "text")], "must be bytes"),
    ([({"k": float("nan")}, b"a")], "not JSON"),
    ([({"k": "v"}, b"x" * 400)] * 3, "exceeds max_body_size"),
])
async def test_publish_ext_batch_refuses_bad_arguments(items: object, match: str) -> None:
    addr = "127.0.0.1:1"  # never dialled
    async with Producer(nsqd=[addr], config=SMALL) as p:
        with pytest.raises(ConfigError, match=match):
            await p.publish_ext_batch("t", items)  # type: ignore[arg-type]
        assert p.pools[addr].connections == ()
