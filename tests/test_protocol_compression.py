"""snappy framing and raw deflate layers: round trips, chunking, corruption, bombs."""

from __future__ import annotations

import os
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartnsq.errors import CompressionError
from smartnsq.protocol.compression import (
    STREAM_IDENTIFIER,
    DeflateDecoder,
    DeflateEncoder,
    SnappyDecoder,
    SnappyEncoder,
)


def _feed_all(dec: SnappyDecoder | DeflateDecoder, data: bytes, step: int) -> bytes:
    out = bytearray()
    for i in range(0, len(data), step):
        for piece in dec.feed(data[i:i + step]):
            out += piece
    return bytes(out)


@given(st.lists(st.binary(max_size=3000), min_size=1, max_size=8),
       st.integers(min_value=1, max_value=997))
@settings(max_examples=150, deadline=None)
def test_snappy_roundtrip_any_chunking(writes: list[bytes], step: int) -> None:
    enc = SnappyEncoder()
    stream = b"".join(enc.encode(w) for w in writes if w)
    assert _feed_all(SnappyDecoder(), stream, step) == b"".join(writes)


@given(st.lists(st.binary(max_size=3000), min_size=1, max_size=8),
       st.integers(min_value=1, max_value=997), st.integers(min_value=1, max_value=9))
@settings(max_examples=150, deadline=None)
def test_deflate_roundtrip_any_chunking(writes: list[bytes], step: int, level: int) -> None:
    enc = DeflateEncoder(level)
    stream = b"".join(enc.encode(w) for w in writes)
    assert _feed_all(DeflateDecoder(), stream, step) == b"".join(writes)


def test_snappy_large_incompressible_spans_chunks() -> None:
    data = os.urandom(300_000)
    assert _feed_all(SnappyDecoder(), SnappyEncoder().encode(data), 4096) == data


def test_snappy_stream_starts_with_identifier() -> None:
    assert SnappyEncoder().encode(b"hello").startswith(STREAM_IDENTIFIER)


def test_snappy_skippable_and_padding_chunks_ignored() -> None:
    enc = SnappyEncoder().encode(b"payload")
    skippable = b"\x80\x03\x00\x00abc" + b"\xfe\x02\x00\x00\x00\x00"
    stream = enc[:10] + skippable + enc[10:]
    assert _feed_all(SnappyDecoder(), stream, 3) == b"payload"


@pytest.mark.parametrize(
    ("stream", "match"),
    [
        (b"\x00\x08\x00\x00" + b"\x00" * 8, "does not start with its identifier"),
        (b"\xff\x05\x00\x00sNaPp", "identifier of length 5"),
        (b"\xff\x06\x00\x00sNaPpX", "bad snappy stream identifier"),
        (STREAM_IDENTIFIER + b"\x02\x01\x00\x00x", "unskippable reserved"),
        (STREAM_IDENTIFIER + b"\x00\x02\x00\x00xx", "chunk length 2 out of range"),
        (STREAM_IDENTIFIER + b"\x00\xff\xff\xff", "out of range"),
        (STREAM_IDENTIFIER + b"\x01\x06\x00\x00\x00\x00\x00\x00ab", "corrupt snappy chunk"),
    ],
)
def test_snappy_corruption(stream: bytes, match: str) -> None:
    with pytest.raises(CompressionError, match=match):
        _feed_all(SnappyDecoder(), stream, 1000)


def test_snappy_bad_crc_detected() -> None:
    bad = bytearray(SnappyEncoder().encode(b"hello" * 40))
    bad[15] ^= 0xFF  # identifier (10) + chunk header (4): byte 15 is inside the CRC
    with pytest.raises(CompressionError, match="checksum"):
        _feed_all(SnappyDecoder(), bytes(bad), 1000)


def test_snappy_chunk_claiming_huge_expansion_rejected() -> None:
    # a compressed chunk whose varint length prefix claims 1 MiB of output
    body = b"\x80\x80\x40" + b"\x00" * 8
    chunk = b"\x00" + len(body + b"\0\0\0\0").to_bytes(3, "little") + b"\0\0\0\0" + body
    with pytest.raises(CompressionError, match="expands to"):
        _feed_all(SnappyDecoder(), STREAM_IDENTIFIER + chunk, 1000)


def test_deflate_corruption() -> None:
    with pytest.raises(CompressionError, match="corrupt deflate"):
        _feed_all(DeflateDecoder(), b"\xff\xff\xff\xff\xff", 10)


def test_deflate_final_block_on_live_connection_rejected() -> None:
    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    finished = c.compress(b"abc") + c.flush(zlib.Z_FINISH)
    with pytest.raises(CompressionError, match="ended"):
        _feed_all(DeflateDecoder(), finished, 100)


def test_deflate_bomb_is_yielded_in_bounded_pieces() -> None:
    bomb = DeflateEncoder(9).encode(b"\0" * 20_000_000)
    assert len(bomb) < 100_000
    pieces = DeflateDecoder().feed(bomb)
    first = next(pieces)
    assert 0 < len(first) <= 256 * 1024
    pieces.close()  # a consumer that rejects the first piece never materialises the rest
