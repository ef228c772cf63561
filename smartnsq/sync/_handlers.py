"""What a sync consumer's handler may do that the shared event loop must not see: return an
awaitable from a plain function, or end with ``sys.exit()`` (``SystemExit``) or a raised
``KeyboardInterrupt``.

Either exception, reaching a task of the loop, would end the loop's thread itself (asyncio
lets both through its tasks), and with it every sync client of the process: the consumer
would look running while its messages sat in flight on a dead thread. So they are caught
where the handler is called and carried as :class:`HandlerExited`; the consumer requeues
the message and stops with the original exception, which ``wait()`` raises in the waiting
thread (a ``sys.exit(3)`` in a handler ends the main thread's ``wait()`` with
``SystemExit(3)``, as it would have in a single-threaded worker).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Any

from smartnsq.consumer.arguments import is_async_callable

__all__ = ["AwaitableReturned", "HandlerExited", "ThreadRunner", "call_plain", "guard_async",
           "guard_callback", "returns_awaitable", "thread_callback", "threads_runner"]


class AwaitableReturned(Exception):
    """A plain handler returned an awaitable (carries its type name)."""


class HandlerExited(Exception):
    """A handler raised ``SystemExit`` or ``KeyboardInterrupt`` (carried as ``exc``)."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(repr(exc))
        self.exc = exc


def call_plain(handler: Callable[..., Any], arg: Any, *rest: Any) -> Any:
    """Call a plain handler (or callback) in its thread; an exit it raises is carried, not
    let through."""
    try:
        return handler(arg, *rest)
    except (SystemExit, KeyboardInterrupt) as exc:
        raise HandlerExited(exc) from exc


#: ``run(callback, msg, *rest)``: the callback called in a handler thread (its message as the
#: thread sees it), awaited on the loop
ThreadRunner = Callable[..., Awaitable[Any]]


def threads_runner(pool: Executor | None) -> ThreadRunner:
    """The :data:`ThreadRunner` of ``pool`` (None: the loop's default executor, for a
    consumer whose handler is async), with the caller's context, as the handler's."""
    from smartnsq.sync._thread_message import ThreadMessage

    def run(callback: Callable[..., Any], msg: Any, *rest: Any) -> Awaitable[Any]:
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(pool, contextvars.copy_context().run, call_plain,
                                    callback, ThreadMessage(msg, loop), *rest)

    return run


def thread_callback(callback: Callable[..., Any] | None, run: ThreadRunner,
                    exited: Callable[[Any, BaseException], None]) -> Callable[..., Any] | None:
    """A plain consumer callback (``giving_up``, ``dead_letter``, ``on_blocked``,
    ``on_violation``) run in a handler thread as the handler is, given the message as the
    thread sees it, and awaited by the consumer: it may block. On the shared loop, a sync
    Producer's publish in it raised EventLoopError (a dead letter was never stored: the
    message came back and was given up again on every delivery), and a slow one held every
    sync client of the process. An async callback stays on the loop
    (:func:`guard_callback`); exits as :func:`guard_callback` says."""
    if callback is None or is_async_callable(callback):
        return guard_callback(callback, exited)
    cb = callback

    @functools.wraps(cb)
    async def threaded(msg: Any, *rest: Any) -> Any:
        try:
            result = await run(cb, msg, *rest)
        except HandlerExited as exc:  # carried from the thread by call_plain
            exited(msg, exc.exc)
            raise
        return await _exits_carried(msg, result, exited) if inspect.isawaitable(result) \
            else result

    return threaded


async def _exits_carried(msg: Any, pending: Awaitable[Any],
                         exited: Callable[[Any, BaseException], None]) -> Any:
    """Await what a callback returned; an exit it raises goes to ``exited(msg, exc)`` and on
    as :class:`HandlerExited`."""
    try:
        return await pending
    except (SystemExit, KeyboardInterrupt) as exc:
        exited(msg, exc)
        raise HandlerExited(exc) from exc


def guard_async(handler: Callable[[Any], Awaitable[Any]],
                exited: Callable[[Any, BaseException], None]
                ) -> Callable[[Any], Awaitable[None]]:
    """An async handler whose exits are given to ``exited(msg, exc)`` instead of the loop."""

    @functools.wraps(handler)
    async def guarded(msg: Any) -> None:
        try:
            await handler(msg)
        except (SystemExit, KeyboardInterrupt) as exc:
            exited(msg, exc)

    return guarded


def guard_callback(callback: Callable[..., Any] | None,
                   exited: Callable[[Any, BaseException], None]) -> Callable[..., Any] | None:
    """A consumer callback run on the loop (``giving_up``, ``dead_letter``, ``on_blocked``,
    ``on_violation``: the message first), whose exits, raised or awaited, are given to
    ``exited(msg, exc)`` and then raised as :class:`HandlerExited`, an ordinary exception:
    the consumer keeps the message, as for any failed callback, instead of the loop's thread
    ending (a ``sys.exit(3)`` in ``giving_up`` stopped every sync client of the process)."""
    if callback is None:
        return None
    cb = callback

    @functools.wraps(cb)
    def guarded(msg: Any, *rest: Any) -> Any:
        try:
            result = cb(msg, *rest)
        except (SystemExit, KeyboardInterrupt) as exc:
            exited(msg, exc)
            raise HandlerExited(exc) from exc
        return _exits_carried(msg, result, exited) if inspect.isawaitable(result) else result

    return guarded


def returns_awaitable(handler: object) -> bool:
    """True for a plain callable that visibly wraps an async function (``functools.wraps``
    decorators, partials of such wrappers): calling it only makes a coroutine. A lambda
    returning a coroutine cannot be told apart before it is called; the first call then
    stops the consumer instead of finishing the message."""
    fn = handler
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.isasyncgenfunction(fn):
        return True
    try:
        inner = inspect.unwrap(fn)  # type: ignore[arg-type]
    except ValueError:  # a __wrapped__ cycle
        return False
    return inner is not fn and (inspect.iscoroutinefunction(inner)
                                or inspect.isasyncgenfunction(inner))
