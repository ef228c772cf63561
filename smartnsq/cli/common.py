"""What every command shares: the cluster options, running a coroutine with one-line errors,
parsers for the option values (addresses, start positions, rates), and the rich consoles.

Errors reach the operator as one line (``smartnsq: error: ...``) with a non-zero exit code and
no traceback; ``SMARTNSQ_TRACEBACK=1`` shows the traceback for bug reports.

Exit codes, one convention for every command (owned here: :func:`command_runner` applies it):

- 0: done; also a closed output (``| head`` that has read enough), which is not an error,
  unless the command left work undone because of it: ``publish`` then exits 141 (128 +
  SIGPIPE, :data:`EXIT_OUTPUT_CLOSED`), its input not all published;
- 1: an error (one line on stderr), also when a signal came first; 2: a usage error;
- after SIGINT (Ctrl-C) or SIGTERM, a command that runs until it is stopped (``tail``,
  ``stat``, ``to-file``, ``bridge``: a stop is how their run ends, as for nsq_tail or
  nsq_to_file and as a service manager expects) exits 0 once it stopped gracefully; a
  command that a signal cut short before its own end (``publish`` before its input's end)
  exits 130 or 143, 128 + the signal's number, as shells report a command a signal ended,
  so that a script around it sees its job was not done.

Another failed write to stdout (a full disk) is one error line.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import datetime as _dt
import functools
import logging
import os
import re
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, TextIO, TypeVar

import aiohttp
import click
from rich.console import Console

from smartnsq.cli.output_pipe import output_gone
from smartnsq.config import LookupConfig
from smartnsq.errors import NSQError
from smartnsq.lookup import Lookup
from smartnsq.protocol.commands import OffsetSpec
from smartnsq.protocol.validation import (
    check_channel,
    check_topic,
    parse_http_address,
    parse_tcp_address,
)

if TYPE_CHECKING:
    from smartnsq.consumer import Consumer

P = ParamSpec("P")
T = TypeVar("T")

#: exit code after Ctrl-C (128 + SIGINT), as shells report it
EXIT_INTERRUPTED = 128 + signal.SIGINT
#: exit code after SIGTERM (128 + SIGTERM)
EXIT_TERMINATED = 128 + signal.SIGTERM
#: ``publish``'s input was not all published because stdout's reader went away: 128 +
#: SIGPIPE, as shells report a command a broken pipe ended
EXIT_OUTPUT_CLOSED = 128 + signal.SIGPIPE


def exit_code_after(signum: int) -> int:
    """The exit code of a command stopped by signal ``signum``: 128 + its number."""
    return 128 + signum


class CliError(click.ClickException):
    """A one-line error for the operator (exit code 1)."""


class OutputClosed(Exception):
    """stdout's reader went away: the command ends quietly with exit code 0 (the group's
    ``run_main`` catches it). Not an OSError, so that :func:`run` lets it through."""


def one_line(text: str) -> str:
    return " ".join(text.split())


def stderr_console() -> Console:
    return Console(stderr=True)


class _StdoutConsole(Console):
    def on_broken_pipe(self) -> None:
        # rich's own exits with 1; end like every other command whose output was closed
        self.quiet = True
        stdout_closed()
        raise OutputClosed


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
    return _StdoutConsole(width=None if require_stdout().isatty() else 240)


# -- the cluster a command talks to ----------------------------------------------------------


@dataclass(frozen=True)
class Cluster:
    """``--lookupd`` / ``--nsqd`` as given (exactly one of them is non-empty)."""

    lookupd: tuple[str, ...]
    nsqd: tuple[str, ...]

    def lookup_config(self, *, poll_interval: float = 60.0) -> LookupConfig:
        return LookupConfig(addresses=self.lookupd, poll_interval=poll_interval,
                            request_timeout=2.0)

    def lookup(self, *, poll_interval: float = 60.0) -> Lookup:
        """A Lookup over ``--lookupd`` (shared by the command's clients; the caller closes
        it)."""
        return Lookup(self.lookup_config(poll_interval=poll_interval))


def _tcp_address(ctx: click.Context, param: click.Parameter,
                 value: tuple[str, ...]) -> tuple[str, ...]:
    for v in value:
        try:
            parse_tcp_address(v)
        except NSQError as exc:
            raise click.BadParameter(one_line(str(exc)), ctx, param) from None
    return value


def _http_address(ctx: click.Context, param: click.Parameter,
                  value: tuple[str, ...]) -> tuple[str, ...]:
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
    try:
        return check_channel(value)
    except NSQError as exc:
        raise click.BadParameter(one_line(str(exc)), ctx, param) from None


# -- option values ---------------------------------------------------------------------------

StartAt = OffsetSpec | dict[int, OffsetSpec]

_PART_OFFSET = re.compile(r"(\d+)=(\d+)")


def parse_from(text: str) -> StartAt:
    """``earliest``, ``end``, ``offset:P=N,…`` (byte offsets per partition), ``count:P=N,…``
    (message counts) or ``timestamp:T`` (unix seconds or ISO 8601)."""
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


class FromParam(click.ParamType[StartAt]):
    name = "POSITION"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> StartAt:
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


class StopEvent(asyncio.Event):
    """Set on SIGINT/SIGTERM; :attr:`signum` says which signal set it, :attr:`hurry` is set
    by a second signal (the operator does not want to wait for the graceful stop)."""

    signum: int | None = None

    def __init__(self, *, cuts_short: bool = False) -> None:
        super().__init__()
        self.hurry = asyncio.Event()
        #: a signal cuts the command's own job short (exit 128 + its number), rather than
        #: ending a run that lasts until it is stopped (exit 0)
        self.cuts_short = cuts_short

    def on_signal(self, signum: int) -> None:
        if self.signum is None:
            self.signum = signum
        elif self.is_set():
            self.hurry.set()
        self.set()

    def exit_code(self) -> int | None:
        """128 + the signal number (130 for SIGINT, 143 for SIGTERM), as shells report a
        command a signal ended, when a signal cut the command short; None when no signal
        came or the signal ended a run that lasts until it is stopped."""
        if self.signum is None or not self.cuts_short:
            return None
        return exit_code_after(self.signum)

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else "a stop"


#: the stop events of the command being run (see :func:`command_runner`)
_STOPS: contextvars.ContextVar[list[StopEvent] | None] = contextvars.ContextVar(
    "smartnsq_cli_stops", default=None)


def stop_event(*, cuts_short: bool = False) -> StopEvent:
    """Set on SIGINT/SIGTERM: commands stop gracefully (drain, FIN what is done, close).
    ``cuts_short``: the command has an end of its own that a signal comes before, so once it
    returns it exits with 128 + the signal's number (:func:`command_runner`); without it, a
    stop is the normal end of its run (exit 0)."""
    event = StopEvent(cuts_short=cuts_short)
    stops = _STOPS.get()
    if stops is not None:
        stops.append(event)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        # not on every platform (Windows), nor outside the main thread (tests)
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, event.on_signal, int(sig))
    return event


async def consume_until(consumer: Consumer, *events: asyncio.Event,
                        guards: Sequence[Callable[[], Awaitable[None]]] = (),
                        before_stop: Callable[[], Awaitable[None]] | None = None) -> None:
    """Start ``consumer`` and run it until one of ``events`` is set, it stops by itself, or
    one of ``guards`` (each run beside it once started) ends; then run ``before_stop``, stop
    the consumer (draining what is in flight) and raise the error it or a guard stopped on,
    if any."""
    await consumer.start()
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
    if isinstance(exc, aiohttp.ClientError | OSError | TimeoutError) and not isinstance(
            exc, NSQError):
        text = f"{type(exc).__name__}: {text}" if str(exc) else type(exc).__name__
    return text


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine; library and network errors become one-line CliErrors."""
    try:
        return asyncio.run(coro)
    except (NSQError, OSError, aiohttp.ClientError, TimeoutError) as exc:
        raise CliError(describe(exc)) from exc


def command_runner(fn: Callable[P, Awaitable[T]]) -> Callable[P, T]:
    """Decorate an ``async def`` command body so click can call it. A body that returns
    after a signal cut it short (its :func:`stop_event`, made with ``cuts_short``, was set
    by SIGINT/SIGTERM) exits with 128 + the signal's number; an error it raises keeps its
    own exit code."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        stops: list[StopEvent] = []

        async def main() -> T:
            _STOPS.set(stops)  # this task's own context: the command's stop events
            return await fn(*args, **kwargs)

        result = run(main())
        codes = [c for c in (s.exit_code() for s in stops) if c is not None]
        if codes:
            raise click.exceptions.Exit(codes[0])
        return result

    return wrapper


@contextlib.contextmanager
def cli_logging(verbose: int) -> Iterator[None]:
    """``-v`` shows the library's warnings, ``-vv`` info, ``-vvv`` debug; by default only our
    own one-line messages reach stderr. The previous logging setup is restored afterwards
    (commands also run inside other programs and tests)."""
    from rich.logging import RichHandler

    level = {0: logging.CRITICAL + 1, 1: logging.WARNING, 2: logging.INFO}.get(
        verbose, logging.DEBUG)
    root = logging.getLogger("smartnsq")
    saved = (root.level, root.propagate)
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
