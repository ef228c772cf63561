"""The one rule of every client's ``async with`` (and the sync facades' ``with``): a block
starts the client and its end stops it, so a client may be inside one block at a time, and
a block may not take over a client that ``start()`` started.

Both would end with a stop under someone else's feet: the inner block's exit stops the
client the outer block still uses, and a block around a started client stops it under the
code that started it (and will stop it). Like httpx's AsyncClient ("Cannot open a client
instance more than once") both are refused at the entry, before anything changes, with
:class:`ConfigError` (as :class:`~smartnsq.lookup.Lookup` refuses a second entry): a mistake
in the calling code, which no retry fixes. ``start()`` itself stays idempotent: a second call
starts nothing and stops nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from smartnsq.errors import ConfigError

__all__ = ["Entry"]


class Entry:
    """Whether a client named ``client`` is inside its ``keyword`` block."""

    __slots__ = ("_client", "_inside", "_keyword")

    def __init__(self, client: str, keyword: str = "async with") -> None:
        self._client = client
        self._keyword = keyword
        self._inside = False

    @property
    def inside(self) -> bool:
        return self._inside

    def claim(self, started: bool) -> None:
        """Mark the client inside a block; refuse a second block, or one around a client
        that is ``started`` already."""
        what, kw = self._client, self._keyword
        a = "an" if kw.startswith("async") else "a"
        if self._inside:
            raise ConfigError(
                f"this {what} is already inside {a} '{kw}' block: entering it again would stop "
                f"it at the end of the inner block, under the outer one; use it as it is "
                f"inside the block, or make another {what}")
        if started:
            raise ConfigError(
                f"this {what} was started with start(): {a} '{kw}' block around it would stop "
                f"it at the block's end, under the code that started it; use it as it is "
                f"(that code stops it with stop()), or make another {what}")
        self._inside = True

    def release(self) -> None:
        self._inside = False

    async def enter(self, started: bool, start: Callable[[], Awaitable[None]]) -> None:
        """:meth:`claim`, then ``start()``; a start that fails leaves the block unclaimed."""
        self.claim(started)
        try:
            await start()
        except BaseException:
            self._inside = False
            raise

    async def leave(self, stop: Callable[[], Awaitable[None]]) -> None:
        """The end of the block: ``stop()``, the block released first (a failed stop still
        ends the block)."""
        self._inside = False
        await stop()

    def enter_blocking(self, started: bool, start: Callable[[], None]) -> None:
        """:meth:`enter` for a blocking facade's ``with``."""
        self.claim(started)
        try:
            start()
        except BaseException:
            self._inside = False
            raise

    def leave_blocking(self, stop: Callable[[], None]) -> None:
        """:meth:`leave` for a blocking facade's ``with``."""
        self._inside = False
        stop()
