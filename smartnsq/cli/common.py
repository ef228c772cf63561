"""What every command shares: the cluster options, running a coroutine with one-line errors,
parsers for the option values (addresses, start positions, rates), and the rich consoles.

Errors reach the operator as one line (``smartnsq: error: ...``) with a non-zero exit code and
no traceback; ``SMARTNSQ_TRACEBACK=1`` shows the traceback for bug reports. A closed output
(``| head`` that has read enough) is not an error; another failed write to stdout (a full
disk) is one error line. Signals and exit codes: :mod:`smartnsq.cli.stopping`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import functools
import logging
import os
import re
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, TextIO, TypeVar

import click

from smartnsq.cli.output_pipe import output_gone
from smartnsq.errors import NSQError

# The clients, the config models (pydantic), the protocol and rich are imported where they
# are used: ``smartnsq --help`` and a command's ``--help`` load this module, not them.
if TYPE_CHECKING:
    from rich.console import Console

    from smartnsq.config import LookupConfig
    from smartnsq.consumer import Consumer
    from smartnsq.lookup import Lookup
    from smartnsq.protocol.commands import OffsetSpec

    StartAt = OffsetSpec | dict[int, OffsetSpec]

P = ParamSpec("P")
T = TypeVar("T")

class CliError(click.ClickException):
    """A one-line error for the operator (exit code 1)."""


class OutputClosed(Exception):
    """stdout's reader went away: the command ends quietly with exit code 0 (the group's
    ``run_main`` catches it). Not an OSError, so that :func:`run` lets it through."""


def one_line(text: str) -> str:
    return " ".join(text.split())


def stderr_console() -> Console:
    from rich.console import Console

    return Console(stderr=True)


@functools.cache
def _stdout_console_class() -> type[Console]:
    from rich.console import Console

    class _StdoutConsole(Console):
        def on_broken_pipe(self) -> None:
            # rich's own exits with 1; end like every other command whose output was closed
            self.quiet = True
            stdout_closed()
            raise OutputClosed

    return _StdoutConsole


def require_stdout(what: str = "the output") -> TextIO:
    """stdout, or a one-line :class:`CliError` when the command was started without one
    (``>&-``: Python then has no ``sys.stdout``), before anything is consumed."""
    if sys.stdout is None:
        raise CliError(f"stdout is closed: nowhere to write {what} (redirect it to a file or "
                       "/dev/null instead)")
    return sys.stdout


def stdout_console() -> Console:
    """Tables on a terminal fit it; piped output gets room for addresses and ids. A closed
    stdout raises :class:`OutputClosed` from ``print``; a missing one (``>&-``) is a
    :class:`CliError`."""
    return _stdout_console_class()(width=None if require_stdout().isatty() else 240)


# -- the cluster a command talks to ----------------------------------------------------------


@dataclass(frozen=True)
class Cluster:
    """``--lookupd`` / ``--nsqd`` as given (exactly one of them is non-empty)."""

    lookupd: tuple[str, ...]
    nsqd: tuple[str, ...]

    def lookup_config(self, *, poll_interval: float = 60.0) -> LookupConfig:
        from smartnsq.config import LookupConfig

        return LookupConfig(addresses=self.lookupd, poll_interval=poll_interval,
                            request_timeout=2.0)

    def lookup(self, *, poll_interval: float = 60.0) -> Lookup:
        """A Lookup over ``--lookupd`` (shared by the command's clients; the caller closes
        it)."""
        from smartnsq.lookup import Lookup

        return Lookup(self.lookup_config(poll_interval=poll_interval))


def _tcp_address(ctx: click.Context, param: click.Parameter,
                 value: tuple[str, ...]) -> tuple[str, ...]:
    from smartnsq.protocol.validation import parse_tcp_address

    for v in value:
        try:
            parse_tcp_address(v)
        except NSQError as exc:
            raise click.BadParameter(one_line(str(exc)), ctx, param) from None
    return value


def _http_address(ctx: click.Context, param: click.Parameter,
                  value: tuple[str, ...]) -> tuple[str, ...]:
    from smartnsq.protocol.validation import parse_http_address

    for v in value:
        try:
            parse_http_address(v)
        except NSQError as exc:
            raise click.BadParameter(one_line(str(exc)), ctx, param) from None
    return value


def cluster_options(*, nsqd_kind: str = "tcp", nsqd: bool = True,
                    prefix: str = "") -> Callable[[Callable[P, T]], Callable[P, T]]:
    """``--lookupd HOST:PORT`` (repeatable) and ``--nsqd HOST:PORT`` (repeatable; the nsqd's
    TCP or HTTP address, as ``nsqd_kind`` says). ``prefix`` names a second cluster
    (``--from-lookupd``)."""

    def deco(fn: Callable[P, T]) -> Callable[P, T]:
        lk_name = f"--{prefix}lookupd"
        dest_lk = f"{prefix.replace('-', '_')}lookupd"
        if nsqd:
            fn = click.option(
                f"--{prefix}nsqd", f"{prefix.replace('-', '_')}nsqd", multiple=True,
                metavar="HOST:PORT", callback=_tcp_address if nsqd_kind == "tcp" else _http_address,
                help=f"nsqd {nsqd_kind.upper()} address (repeatable), instead of "
                     f"{lk_name}")(fn)
        return click.option(
            lk_name, dest_lk, multiple=True, metavar="HOST:PORT", callback=_http_address,
            help="nsqlookupd HTTP address (repeatable)")(fn)

    return deco


def pick_cluster(lookupd: tuple[str, ...], nsqd: tuple[str, ...], *, prefix: str = "",
                 allow_nsqd: bool = True) -> Cluster:
    if not allow_nsqd and nsqd:
        raise click.UsageError(f"--{prefix}nsqd is not supported here; use --{prefix}lookupd")
    if not lookupd and not nsqd:
        if not allow_nsqd:
            raise click.UsageError(f"give --{prefix}lookupd HOST:PORT")
        raise click.UsageError(f"give --{prefix}lookupd HOST:PORT or --{prefix}nsqd HOST:PORT")
    if lookupd and nsqd:
        raise click.UsageError(f"give either --{prefix}lookupd or --{prefix}nsqd, not both")
    return Cluster(tuple(lookupd), tuple(nsqd))


def topic_argument(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    from smartnsq.protocol.validation import check_topic

    try:
        return check_topic(value)
    except NSQError as exc:
        raise click.BadParameter(one_line(str(exc)), ctx, param) from None


def channel_argument(ctx: click.Context, param: click.Parameter,
                     value: str | None) -> str | None:
    """A ``--channel`` value checked as nsqd checks it: a usage error (exit 2) naming the
    option, before anything connects."""
    if value is None:
        return None
    from smartnsq.protocol.validation import check_channel

    try:
        return check_channel(value)
    except NSQError as exc:
        raise click.BadParameter(one_line(str(exc)), ctx, param) from None


# -- option values ---------------------------------------------------------------------------

_PART_OFFSET = re.compile(r"(\d+)=(\d+)")


def parse_from(text: str) -> StartAt:
    """``earliest``, ``end``, ``offset:P=N,…`` (byte offsets per partition), ``count:P=N,…``
    (message counts) or ``timestamp:T`` (unix seconds or ISO 8601)."""
    from smartnsq.protocol.commands import OffsetSpec

    if text == "earliest":
        return OffsetSpec.msgcount(0)
    if text == "end":
        return OffsetSpec.end()
    kind, sep, rest = text.partition(":")
    if not sep or not rest:
        raise ValueError(f"malformed position {text!r}: expected earliest, end, "
                         "offset:P=N[,P=N...], count:P=N[,...] or timestamp:T")
    if kind in ("offset", "count"):
        out: dict[int, OffsetSpec] = {}
        for item in rest.split(","):
            m = _PART_OFFSET.fullmatch(item.strip())
            if m is None:
                raise ValueError(f"malformed {kind} {item!r} in {text!r}: expected "
                                 "PARTITION=NUMBER (both integers >= 0)")
            p, n = int(m.group(1)), int(m.group(2))
            if p in out:
                raise ValueError(f"partition {p} given twice in {text!r}")
            out[p] = (OffsetSpec.virtual_queue(n) if kind == "offset"
                      else OffsetSpec.msgcount(n))
        return out
    if kind == "timestamp":
        return OffsetSpec.timestamp(parse_timestamp(rest))
    raise ValueError(f"unknown position kind {kind!r} in {text!r}: expected earliest, end, "
                     "offset:..., count:... or timestamp:...")


def parse_timestamp(text: str) -> int:
    if text.isdigit():
        return int(text)
    try:
        when = _dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"malformed timestamp {text!r}: expected unix seconds or ISO 8601 "
                         "(2026-11-23T16:00:00+00:00)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.UTC)
    return int(when.timestamp())


class FromParam(click.ParamType["StartAt"]):
    name = "POSITION"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> StartAt:
        from smartnsq.protocol.commands import OffsetSpec

        if isinstance(value, OffsetSpec | dict):
            return value
        try:
            return parse_from(str(value))
        except (ValueError, NSQError) as exc:
            self.fail(one_line(str(exc)), param, ctx)


def parse_rate(text: str) -> float:
    """``100``, ``100/s``, ``6000/m`` → messages per second (> 0)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(?:/\s*([smh]))?\s*", text)
    if m is None:
        raise ValueError(f"malformed rate {text!r}: expected N, N/s, N/m or N/h")
    n = float(m.group(1))
    per = {"s": 1.0, "m": 60.0, "h": 3600.0}[m.group(2) or "s"]
    if n <= 0:
        raise ValueError(f"rate must be > 0, got {text!r}")
    return n / per


class RateParam(click.ParamType[float]):
    name = "N/s"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        if isinstance(value, float):
            return value
        try:
            return parse_rate(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


# -- running ---------------------------------------------------------------------------------


class Stopped(Exception):
    """A stop (Ctrl-C, SIGTERM) came while the command still waited for a server's first
    answer; the command ends there as its stop ends it (``stopping.command_runner`` catches
    it: exit 0, or 128 + the signal for a command it cuts short)."""


async def unless_stopped(aw: Awaitable[T], *stops: asyncio.Event) -> T:
    """``aw``'s result; :class:`Stopped` (``aw`` cancelled) when one of ``stops`` is set
    first. For the waits before a command's work begins, bounded by a server's timeout (a
    hung nsqd's 5 s): Ctrl-C ends them at once, not after that timeout with its error."""
    task = asyncio.ensure_future(aw)
    waits = [asyncio.ensure_future(s.wait()) for s in stops]
    try:
        await asyncio.wait((task, *waits), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    raise Stopped


async def consume_until(consumer: Consumer, *events: asyncio.Event,
                        guards: Sequence[Callable[[], Awaitable[None]]] = (),
                        before_stop: Callable[[], Awaitable[None]] | None = None) -> None:
    """Start ``consumer`` and run it until one of ``events`` is set, it stops by itself, or
    one of ``guards`` (each run beside it once started) ends; then run ``before_stop``, stop
    the consumer (draining what is in flight) and raise the error it or a guard stopped on,
    if any. One of ``events`` set while it starts (an nsqd that does not answer its
    handshake) cancels the start, which closes it: :class:`Stopped`."""
    await unless_stopped(consumer.start(), *events)
    failed: BaseException | None = None
    try:
        waits: list[asyncio.Future[Any]] = [asyncio.ensure_future(e.wait()) for e in events]
        waits.append(asyncio.ensure_future(_stopped_by_itself(consumer)))
        watching = [asyncio.ensure_future(g()) for g in guards]
        waits += watching
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        for w in watching:
            if w.done() and not w.cancelled() and failed is None:
                failed = w.exception()
    finally:
        try:
            if before_stop is not None:
                await before_stop()
        finally:
            await consumer.stop()
    if consumer.error is not None:
        raise consumer.error
    if failed is not None:
        raise failed


async def _stopped_by_itself(consumer: Consumer) -> None:
    # its error, if any, is read by consume_until once it has stopped
    with contextlib.suppress(Exception):
        await consumer.wait_closed()


def describe(exc: BaseException) -> str:
    """The one-line text of an error, with its cause when that says more."""
    text = one_line(str(exc)) or type(exc).__name__
    if isinstance(exc, (OSError, TimeoutError, *_aiohttp_errors())) and not isinstance(
            exc, NSQError):
        text = f"{type(exc).__name__}: {text}" if str(exc) else type(exc).__name__
    return text


def _aiohttp_errors() -> tuple[type[Exception], ...]:
    """aiohttp's error base when aiohttp is loaded: an error cannot be one of its errors
    otherwise, and importing it only to check would cost ~0.1 s."""
    aiohttp = sys.modules.get("aiohttp")
    return () if aiohttp is None else (aiohttp.ClientError,)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine; library and network errors become one-line CliErrors."""
    try:
        return asyncio.run(coro)
    except Exception as exc:
        if isinstance(exc, (NSQError, OSError, TimeoutError, *_aiohttp_errors())):
            raise CliError(describe(exc)) from exc
        raise


@contextlib.contextmanager
def cli_logging(verbose: int) -> Iterator[None]:
    """``-v`` shows the library's warnings, ``-vv`` info, ``-vvv`` debug; by default only our
    own one-line messages reach stderr. The previous logging setup is restored afterwards
    (commands also run inside other programs and tests)."""
    level = {0: logging.CRITICAL + 1, 1: logging.WARNING, 2: logging.INFO}.get(
        verbose, logging.DEBUG)
    root = logging.getLogger("smartnsq")
    saved = (root.level, root.propagate)
    handler: logging.Handler = logging.NullHandler()
    if verbose:  # without -v nothing passes the level: no need to load rich for it
        from rich.logging import RichHandler

        handler = RichHandler(console=stderr_console(), show_path=False)
    # the level on the handler too: commands lower single loggers to watch them (connections)
    handler.setLevel(level)
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(saved[0])
        root.propagate = saved[1]


def err_print(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def stdout_closed() -> None:
    """stdout's reader went away (``| head``): send what is still buffered for it, and the
    interpreter's last flush, to /dev/null instead of failing again with EPIPE."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError, AttributeError):  # not a real file (tests' captured output)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


@contextlib.contextmanager
def writing_stdout(what: str = "the output") -> Iterator[None]:
    """Around writes to stdout (``what`` they are, for the error): a reader gone away raises
    :class:`OutputClosed`, any other failed write (a full disk) a one-line
    :class:`CliError`. Either way what is still buffered for stdout is dropped, so that the
    interpreter's last flush does not fail again ("Exception ignored ...
    BrokenPipeError")."""
    try:
        yield
    except BrokenPipeError:
        stdout_closed()
        raise OutputClosed from None
    except OSError as exc:
        stdout_closed()
        raise CliError(f"cannot write {what}: {exc.strerror or exc}") from None


def echo(text: str) -> None:
    """``text`` and a newline on stdout, flushed (see :func:`writing_stdout`)."""
    with writing_stdout():
        click.echo(text)


async def stdout_gone() -> None:
    """Return once stdout is a pipe whose reader has gone; never for a terminal or a file.
    A long-running command would otherwise learn it only at its next write."""
    await output_gone(sys.stdout)
