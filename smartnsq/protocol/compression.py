"""Stream compression layers negotiated by IDENTIFY (docs/protocol.md §3.1.1), sans-IO.

snappy uses the *framing* format (stream identifier ``ff 06 00 00 sNaPpY``, then chunks of at
most 64 KiB of data, each with a masked CRC-32C); deflate is raw RFC 1951 with a sync flush
after every write. Decoders yield their output in bounded pieces so a small compressed input
that expands enormously is rejected by the frame decoder before it is all in memory.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Protocol

import cramjam

from smartnsq.errors import CompressionError

STREAM_IDENTIFIER = b"\xff\x06\x00\x00sNaPpY"
_MAX_CHUNK_DATA = 65536
# a compressed chunk of 64 KiB of data is at most 32 + n + n/6 bytes, plus the 4-byte CRC
_MAX_CHUNK_LEN = 4 + 32 + _MAX_CHUNK_DATA + _MAX_CHUNK_DATA // 6
_PIECE = 256 * 1024


class StreamEncoder(Protocol):
    def encode(self, data: bytes) -> bytes: ...


class StreamDecoder(Protocol):
    def feed(self, data: bytes) -> Iterator[bytes]: ...


class SnappyEncoder:
    """Compress each write as a self-contained framed stream (the server accepts a stream
    identifier at any chunk boundary)."""

    __slots__ = ()

    def encode(self, data: bytes) -> bytes:
        return bytes(cramjam.snappy.compress(data))


class SnappyDecoder:
    """Incremental snappy framing-format decoder."""

    __slots__ = ("_buf", "_seen_identifier")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._seen_identifier = False

    def feed(self, data: bytes) -> Iterator[bytes]:
        buf = self._buf
        buf += data
        pos = 0
        try:
            while len(buf) - pos >= 4:
                ctype = buf[pos]
                clen = buf[pos + 1] | (buf[pos + 2] << 8) | (buf[pos + 3] << 16)
                if ctype == 0xFF:
                    if clen != 6:
                        raise CompressionError(f"snappy stream identifier of length {clen}")
                elif not self._seen_identifier:
                    raise CompressionError("snappy stream does not start with its identifier")
                elif ctype in (0x00, 0x01):
                    if clen < 4 or clen > _MAX_CHUNK_LEN:
                        raise CompressionError(f"snappy chunk length {clen} out of range")
                elif 0x02 <= ctype <= 0x7F:
                    raise CompressionError(f"unskippable reserved snappy chunk type {ctype:#x}")
                if len(buf) - pos < 4 + clen:
                    break
                chunk = bytes(buf[pos:pos + 4 + clen])
                pos += 4 + clen
                if ctype == 0xFF:
                    if chunk[4:] != b"sNaPpY":
                        raise CompressionError("bad snappy stream identifier")
                    self._seen_identifier = True
                elif ctype in (0x00, 0x01):
                    yield self._decode_chunk(ctype, chunk)
                # 0x80-0xfe: padding / skippable chunks carry nothing
        finally:
            del buf[:pos]

    @staticmethod
    def _decode_chunk(ctype: int, chunk: bytes) -> bytes:
        if ctype == 0x00:
            try:
                size = cramjam.snappy.decompress_raw_len(chunk[8:])
            except Exception as exc:  # cramjam raises its own error types
                raise CompressionError(f"corrupt snappy chunk: {exc}") from None
            if size > _MAX_CHUNK_DATA:
                raise CompressionError(f"snappy chunk expands to {size} bytes (max 65536)")
        elif len(chunk) - 8 > _MAX_CHUNK_DATA:
            raise CompressionError("uncompressed snappy chunk larger than 65536 bytes")
        try:
            # decoding identifier + chunk as a framed stream makes cramjam verify the CRC
            return bytes(cramjam.snappy.decompress(STREAM_IDENTIFIER + chunk))
        except Exception as exc:
            raise CompressionError(f"corrupt snappy chunk: {exc}") from None


class DeflateEncoder:
    __slots__ = ("_c",)

    def __init__(self, level: int = 6) -> None:
        self._c = zlib.compressobj(level, zlib.DEFLATED, -15)

    def encode(self, data: bytes) -> bytes:
        # the sync flush lets the server decode each command as soon as it arrives
        return self._c.compress(data) + self._c.flush(zlib.Z_SYNC_FLUSH)


class DeflateDecoder:
    __slots__ = ("_d",)

    def __init__(self) -> None:
        self._d = zlib.decompressobj(-15)

    def feed(self, data: bytes) -> Iterator[bytes]:
        d = self._d
        try:
            out = d.decompress(data, _PIECE)
            while out:
                yield out
                if not d.unconsumed_tail:
                    break
                out = d.decompress(d.unconsumed_tail, _PIECE)
        except zlib.error as exc:
            raise CompressionError(f"corrupt deflate stream: {exc}") from None
        if d.eof:
            raise CompressionError("deflate stream ended (final block) on a live connection")
