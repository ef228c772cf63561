"""Shard key → partition, the rules youzan's clients use (docs/protocol.md §8.2, §12.6).

* ``"murmur3"`` (default, youzan go-nsq and every youzan example):
  ``murmur3_32(key bytes, seed 0) as unsigned % partition_num``. ``str`` keys are UTF-8
  encoded; ``bytes`` are used as they are; ``int`` keys are their decimal text (go-nsq takes
  bytes, and a number's text is what a JSON field or Spark's ``cast(... as string)`` gives).
* ``"java"`` (youzan nsqJavaSDK): ``abs(key.hashCode() % partition_num)`` with Java's
  truncating ``%``; ``str`` keys use ``String.hashCode()`` over UTF-16 code units, ``int``
  keys ``Long.hashCode()``.

The two rules map the same key to different partitions; producers and consumers that rely on
the placement must agree on one. With tracing on, youzan go-nsq sends ordered messages with
PUB_TRACE and the key's unsigned murmur3 hash as trace id: :func:`shard_trace_id`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Literal

import mmh3

from smartnsq.errors import ConfigError

ShardRule = Literal["murmur3", "java"]
ShardKey = str | bytes | int

_MASK32 = 0xFFFFFFFF


def _utf8(key: str) -> bytes:
    try:
        return key.encode("utf-8")
    except UnicodeEncodeError as exc:
        # a lone surrogate (surrogateescape'd bytes, a JSON "\\ud800") has no UTF-8 form
        raise ConfigError(f"shard key is not valid text: {exc.reason} at index {exc.start} "
                          f"({key[exc.start:exc.end]!r}); pass its bytes instead") from None


def key_bytes(key: str | bytes) -> bytes:
    if isinstance(key, str):
        return _utf8(key)
    if isinstance(key, bytes | bytearray | memoryview):
        return bytes(key)
    raise ConfigError(f"shard key must be str or bytes, got {type(key).__name__}")


def murmur3_32(data: bytes) -> int:
    """MurmurHash3 x86_32 of ``data`` with seed 0, as an unsigned int."""
    return int(mmh3.hash(data, 0, signed=False))


def _to_int32(h: int) -> int:
    h &= _MASK32
    return h - (1 << 32) if h & 0x80000000 else h


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode()`` (signed 32-bit) over UTF-16 code units."""
    h = 0
    # a Java String may hold a lone surrogate: it is one code unit there too
    units = s.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(units), 2):
        h = (31 * h + ((units[i] << 8) | units[i + 1])) & _MASK32
    return _to_int32(h)


def java_long_hash(v: int) -> int:
    """Java's ``Long.hashCode()``: ``(int)(v ^ (v >>> 32))`` of a signed 64-bit value."""
    if not -(1 << 63) <= v < (1 << 63):
        raise ConfigError(f"int shard key {v} does not fit a Java long")
    u = v & 0xFFFFFFFFFFFFFFFF
    return _to_int32(u ^ (u >> 32))


def java_hash(key: ShardKey) -> int:
    if isinstance(key, bool):
        raise ConfigError("shard key must be str or int for the java rule, got bool")
    if isinstance(key, str):
        return java_string_hash(key)
    if isinstance(key, int):
        return java_long_hash(key)
    raise ConfigError(f"shard key must be str or int for the java rule, got {type(key).__name__}")


def _java_mod(h: int, n: int) -> int:
    # Java's % truncates toward zero (the remainder takes h's sign), so abs(h % n) there
    # equals abs(h) % n here, Integer.MIN_VALUE included
    return abs(h) % n


def shard_partition(key: ShardKey, partition_num: int, rule: ShardRule = "murmur3") -> int:
    """The partition of ``key`` among ``partition_num`` partitions under ``rule``."""
    return shard_partitions((key,), partition_num, rule)[0]


def shard_partitions(keys: Iterable[ShardKey], partition_num: int,
                     rule: ShardRule = "murmur3") -> list[int]:
    """:func:`shard_partition` of each key, the arguments checked once: the rule itself, which
    the producer applies to one key and the Spark sink to a batch's distinct keys."""
    if partition_num <= 0:
        raise ConfigError(f"partition_num must be positive, got {partition_num}")
    if rule == "murmur3":
        h = mmh3.hash
        out = []
        for k in keys:
            data: str | bytes
            if type(k) is bytes:
                data = k
            elif type(k) is str:
                # mmh3 hashes a str as its UTF-8 bytes, but crashes the process (mmh3 5.3.1,
                # SIGSEGV) on one without them: only ASCII (an O(1) check) goes in as it is
                data = k if k.isascii() else _utf8(k)
            elif type(k) is int:
                data = _int_text(k)  # its decimal text
            else:
                data = _murmur3_bytes(k)  # other bytes-likes, and the errors of bad keys
            out.append(h(data, 0, signed=False) % partition_num)
        return out
    if rule == "java":
        return [_java_mod(java_hash(k), partition_num) for k in keys]
    raise ConfigError(f"shard rule must be 'murmur3' or 'java', got {rule!r}")


def check_shard_key(key: ShardKey, rule: ShardRule = "murmur3") -> None:
    """Raise ConfigError before any I/O if ``key`` cannot be sharded under ``rule``."""
    t = type(key)
    text = key if t is str else None  # exactly str (a subclass takes the full check)
    if rule == "murmur3" and (t is bytes or (isinstance(text, str) and text.isascii())):
        return  # the common case, without hashing
    shard_partition(key, 1, rule)


def _int_text(key: int) -> str:
    try:
        return str(key)
    except ValueError:
        # Python refuses the decimal text of ints past sys.get_int_max_str_digits()
        raise ConfigError(f"int shard key too large: over {sys.get_int_max_str_digits()} "
                          f"digits ({key.bit_length()} bits)") from None


def _murmur3_bytes(key: ShardKey) -> bytes:
    if isinstance(key, int):
        if isinstance(key, bool):
            raise ConfigError("shard key must be str, bytes or int, got bool")
        return _int_text(key).encode("ascii")
    if isinstance(key, bytes | bytearray | memoryview | str):
        return key_bytes(key)
    # key_bytes' own message leaves int out: the murmur3 rule takes ints too
    raise ConfigError(f"shard key must be str, bytes or int, got {type(key).__name__}")


def shard_trace_id(key: ShardKey) -> int:
    """youzan go-nsq's trace id for an ordered message: unsigned murmur3_32 of the key
    (``int`` keys use their decimal text)."""
    return murmur3_32(_murmur3_bytes(key))
