"""The exceptions that end a publish, and the bounded pause between attempts: what the retry
engine (:mod:`smartnsq.producer.engine` and its plans) raises when
:mod:`smartnsq.producer.retry` says stop.
"""

from __future__ import annotations

import asyncio
from typing import Any

from smartnsq.errors import (
    ClientClosedError,
    ConfigError,
    LookupRefusedError,
    PublishError,
    PublishTimeoutError,
    UnsupportedFeatureError,
)
from smartnsq.producer.ops import Publish

__all__ = ["failure", "late_attempt", "late_connection", "reconnect_timeout", "refused",
           "sleep_before"]


def _where(op: Publish[Any], partition: int | None) -> str:
    return f"topic {op.topic!r}" + (f" partition {partition}" if partition is not None else "")


def failure(op: Publish[Any], attempts: int, exc: BaseException, deadline: float) -> BaseException:
    """The exception that ends ``op`` after ``exc``: the caller's own mistakes and errors
    already shaped as publish errors as they are, anything else wrapped in PublishError
    (PublishTimeoutError when the deadline has passed)."""
    if isinstance(exc, UnsupportedFeatureError | ConfigError | ClientClosedError):
        return exc
    if isinstance(exc, PublishError):
        return exc
    where = _where(op, op.partition)
    if asyncio.get_running_loop().time() >= deadline:
        err: PublishError = PublishTimeoutError(
            f"{op.what} to {where} not acknowledged in time "
            f"({attempts} attempt(s)); last error: {exc}")
    else:
        err = PublishError(f"{op.what} to {where} failed after {attempts} attempt(s): {exc}")
    err.__cause__ = exc
    return err


def refused(topic: str, exc: LookupRefusedError) -> PublishError:
    """The publish error of a topic whose lookup was refused: raised at once, since asking
    the lookupds again until the deadline would get the same answers."""
    err = PublishError(f"cannot publish to topic {topic!r}: {exc}")
    err.__cause__ = exc
    return err


def late_connection(op: Publish[Any], address: str, partition: int | None,
                    last: BaseException | None) -> PublishTimeoutError:
    """The deadline passed while the connection to ``address`` was being made."""
    err = PublishTimeoutError(
        f"{op.what} to {_where(op, partition)} timed out while connecting to nsqd {address}"
        + (f" (last error: {last})" if last is not None else ""))
    err.__cause__ = last
    return err


def late_attempt(op: Publish[Any], address: str, partition: int | None,
                 last: BaseException | None) -> PublishTimeoutError:
    """The deadline passed before the next attempt on ``address`` could be sent (its
    backoff after a failure ran up to the deadline)."""
    err = PublishTimeoutError(
        f"{op.what} to {_where(op, partition)} timed out before it could be sent to nsqd "
        f"{address}" + (f" again (last error: {last})" if last is not None else ""))
    err.__cause__ = last
    return err


def reconnect_timeout(op: Publish[Any], address: str, partition: int | None,
                      cause: BaseException | None) -> PublishTimeoutError:
    """The deadline passed while our pool to ``address`` waited to redial."""
    err = PublishTimeoutError(
        f"{op.what} to {_where(op, partition)} timed out waiting to reconnect to nsqd "
        f"{address}" + (f"; last error: {cause}" if cause is not None else ""))
    err.__cause__ = cause
    return err


async def sleep_before(seconds: float, deadline: float) -> None:
    """Sleep ``seconds``, but never past ``deadline`` (loop time)."""
    loop = asyncio.get_running_loop()
    seconds = min(seconds, deadline - loop.time())
    if seconds > 0:
        await asyncio.sleep(seconds)
