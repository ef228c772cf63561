"""Argument checks shared by the TCP and HTTP producers: raised before any I/O."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import cast

from smartnsq._checks import check_duration
from smartnsq.errors import ConfigError


def check_body(body: object, max_msg_size: int) -> bytes:
    """The body as bytes, or ConfigError naming what is wrong with it."""
    if type(body) is bytes:
        if 0 < len(body) <= max_msg_size:  # the common case, checked first and cheaply
            return body
    elif isinstance(body, bytearray | memoryview):
        body = bytes(body)
    else:
        raise ConfigError(f"message body must be bytes, got {type(body).__name__}")
    assert isinstance(body, bytes)
    n = len(body)
    if n == 0:
        raise ConfigError("message body must not be empty")
    if n > max_msg_size:
        raise ConfigError(f"message body of {n} bytes exceeds max_msg_size "
                          f"({max_msg_size} bytes)")
    return body


def check_bodies_type(bodies: object) -> None:
    """ConfigError unless ``bodies`` is a sequence of bodies: one body (bytes, a bytearray,
    a memoryview or a str) would be taken for a sequence of its bytes or characters, and a
    generator or a set has no length or order to split and resend it by."""
    if isinstance(bodies, bytes | bytearray | memoryview | str) or \
            not isinstance(bodies, Sequence):
        raise ConfigError(f"bodies must be a sequence of bytes (a list of messages), got "
                          f"{type(bodies).__name__}")


def check_bodies(bodies: Sequence[object], max_msg_size: int) -> list[bytes]:
    """Every body checked as :func:`check_body` does, in a new list."""
    if set(map(type, bodies)) == {bytes}:
        # the common case without a Python-level step per message
        same = cast("Sequence[bytes]", bodies)
        sizes = list(map(len, same))
        if min(sizes) and max(sizes) <= max_msg_size:
            return list(same)
    return [check_body(b, max_msg_size) for b in bodies]


def deadline(timeout: float | None, default: float, now: float | None = None) -> float:
    """Loop time by which a publish call must be done (``timeout`` or the default);
    ``now``: the loop's time, when the caller has it."""
    if timeout is not None:
        timeout = check_duration(timeout, "timeout", positive=True)
    if now is None:
        now = asyncio.get_running_loop().time()
    return now + (default if timeout is None else timeout)


def delay_ms(delay: object) -> int:
    """A DPUB delay in seconds as the wire's milliseconds, or ConfigError."""
    from smartnsq.protocol.validation import check_delay_ms

    seconds = check_duration(delay, "delay")
    return check_delay_ms(round(seconds * 1000), "DPUB delay")
