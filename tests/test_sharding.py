"""Shard key → partition rules, checked against an independent murmur3 and published vectors."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smartnsq.errors import ConfigError
from smartnsq.sharding import (
    java_hash,
    java_long_hash,
    java_string_hash,
    murmur3_32,
    shard_partition,
    shard_partitions,
    shard_trace_id,
)
from tests.test_producer_support import murmur3_32_reference

# MurmurHash3_x86_32 with seed 0, as published with the reference implementation's test
# suites and reproduced by every port (unsigned).
MURMUR_VECTORS = [
    (b"", 0),
    (b"hello", 0x248BFA47),
    (b"hello, world", 0x149BBB7F),
    (b"The quick brown fox jumps over the lazy dog", 0x2E4FF723),
]


@pytest.mark.parametrize(("data", "expected"), MURMUR_VECTORS)
def test_murmur3_published_vectors(data: bytes, expected: int) -> None:
    assert murmur3_32_reference(data) == expected
    assert murmur3_32(data) == expected


@given(st.binary(max_size=64))
def test_murmur3_matches_independent_reference(data: bytes) -> None:
    assert murmur3_32(data) == murmur3_32_reference(data)


@given(st.text(max_size=32), st.integers(min_value=1, max_value=255))
def test_murmur3_rule_is_unsigned_hash_mod_partitions(key: str, n: int) -> None:
    p = shard_partition(key, n)
    assert p == murmur3_32_reference(key.encode()) % n
    assert 0 <= p < n
    # str and its UTF-8 bytes are the same key
    assert shard_partition(key.encode(), n) == p


def test_murmur3_rule_examples() -> None:
    # computed by hand from the vectors above: 0x248bfa47 = 613153351
    assert shard_partition("hello", 4) == 613153351 % 4 == 3
    assert shard_partition("hello", 7) == 613153351 % 7
    assert shard_trace_id("hello") == 0x248BFA47
    assert shard_trace_id(b"hello") == 0x248BFA47


# Java's String.hashCode(): published values ("hello" is the classic example; "Aa"/"BB" the
# classic collision; a long string overflows the 32-bit int).
JAVA_VECTORS = [
    ("", 0),
    ("a", 97),
    ("hello", 99162322),
    ("Aa", 2112),
    ("BB", 2112),
    ("polygenelubricants", -2147483648),  # the famous Integer.MIN_VALUE hash
]


@pytest.mark.parametrize(("s", "expected"), JAVA_VECTORS)
def test_java_string_hash_vectors(s: str, expected: int) -> None:
    assert java_string_hash(s) == expected


def test_java_rule_uses_truncating_mod_and_abs() -> None:
    # "polygenelubricants" hashes to Integer.MIN_VALUE: abs(MIN_VALUE % 3) = abs(-2) = 2
    assert shard_partition("polygenelubricants", 3, "java") == 2
    assert shard_partition("hello", 4, "java") == 99162322 % 4
    # a negative hash: Java gives abs(h % n), never a negative partition
    h = java_string_hash("zzzzzzzzzz")
    assert h < 0
    assert shard_partition("zzzzzzzzzz", 7, "java") == abs(-(abs(h) % 7))


def test_java_long_hash() -> None:
    # Long.hashCode(v) = (int)(v ^ (v >>> 32))
    assert java_long_hash(0) == 0
    assert java_long_hash(1) == 1
    assert java_long_hash(-1) == 0
    assert java_long_hash(1 << 32) == 1
    assert java_hash(12345) == 12345
    assert shard_partition(10, 4, "java") == 2


def test_non_bmp_characters_hash_as_utf16_surrogates() -> None:
    # U+1F600 is the surrogate pair D83D DE00 in Java
    assert java_string_hash("\U0001F600") == (31 * 0xD83D + 0xDE00)


@given(st.text(max_size=16), st.integers(min_value=1, max_value=64))
def test_same_key_same_partition(key: str, n: int) -> None:
    assert shard_partition(key, n) == shard_partition(key, n)
    assert shard_partition(key, n, "java") == shard_partition(key, n, "java")


def test_int_keys_are_their_decimal_text_under_murmur3() -> None:
    # a JSON user_id of 42 and Spark's cast(42 as string) land where "42" does
    for key, n in ((42, 4), (0, 7), (-1, 3), (10**30, 16)):
        assert shard_partition(key, n) == shard_partition(str(key), n)
    with pytest.raises(ConfigError):
        shard_partition(True, 4)


@given(st.lists(st.one_of(st.text(max_size=16), st.binary(max_size=16),
                         st.integers(min_value=-(2**63), max_value=2**63 - 1)), max_size=20),
       st.integers(min_value=1, max_value=64))
def test_a_batch_of_keys_goes_where_each_key_goes(keys: list[str | bytes | int], n: int) -> None:
    # the Spark sink hashes a batch's distinct keys at once: the same rule, key by key
    def reference(k: str | bytes | int) -> int:
        data = k.encode() if isinstance(k, str) else str(k).encode() if isinstance(k, int) else k
        return murmur3_32_reference(data) % n

    assert shard_partitions(keys, n) == [reference(k) for k in keys]
    assert shard_partitions([bytearray(b"ab"), memoryview(b"ab")], n) == [reference(b"ab")] * 2
    text = [k for k in keys if not isinstance(k, bytes)]
    assert shard_partitions(text, n, "java") == [shard_partition(k, n, "java") for k in text]
    assert shard_partitions(text, n, "java") == [abs(java_hash(k)) % n for k in text]


def test_bad_keys_and_counts() -> None:
    with pytest.raises(ConfigError):
        shard_partitions(["a", True], 4)
    with pytest.raises(ConfigError):
        shard_partition(b"x", 4, "java")
    with pytest.raises(ConfigError):
        shard_partition("x", 0)
    with pytest.raises(ConfigError):
        shard_partition("x", 4, "crc32")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        shard_partition(True, 4, "java")
    with pytest.raises(ConfigError):
        java_long_hash(1 << 63)
