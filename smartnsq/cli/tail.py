"""``smartnsq tail TOPIC``: print messages as they arrive (like ``nsq_tail``, partition-,
order- and offset-aware)."""

from __future__ import annotations

import asyncio
import base64
import json
import random
from typing import TYPE_CHECKING, Any, BinaryIO

import click

from smartnsq.cli.common import (
    CliError,
    FromParam,
    OutputClosed,
    channel_argument,
    cluster_options,
    err_print,
    pick_cluster,
    require_stdout,
    stdout_closed,
    topic_argument,
    unless_stopped,
    writing_stdout,
)
from smartnsq.cli.connections import connect_timeout_option, consume_watched, refuse_unordered
from smartnsq.cli.metrics import metrics_options
from smartnsq.cli.output_pipe import OutputPipe, output_gone
from smartnsq.cli.stopping import command_runner, stop_event
from smartnsq.cli.wire import connection_config, tcp_wire_options
from smartnsq.errors import Flavour

# the clients load when the command runs, not for its --help (or another command's)
if TYPE_CHECKING:
    from smartnsq.cli.common import StartAt
    from smartnsq.config import ConsumerConfig
    from smartnsq.consumer import Consumer
    from smartnsq.lookup import Lookup, TopicView
    from smartnsq.message import Message

EPILOG = """\b
Examples:
  smartnsq tail orders --lookupd 127.0.0.1:4161
  smartnsq tail orders --lookupd 127.0.0.1:4161 --from earliest -n 100 --format json
  smartnsq tail orders --lookupd 127.0.0.1:4161 --partition 2 --from offset:2=4096
  smartnsq tail orders --lookupd 127.0.0.1:4161 --ordered --from timestamp:2026-11-23T10:00
  smartnsq tail events --nsqd 127.0.0.1:4150 --channel audit
"""


def ephemeral_channel() -> str:
    return f"tail{random.randrange(10**6):06d}#ephemeral"


def message_json(msg: Message) -> dict[str, Any]:
    """Everything known about a delivered message, for ``--format json``."""
    body = msg.body
    doc: dict[str, Any] = {
        "id": msg.id.hex(),
        "topic": msg.topic,
        "partition": msg.partition,
        "offset": msg.offset,
        "raw_size": msg.raw_size,
        "internal_id": msg.internal_id,
        "trace_id": msg.trace_id,
        "attempts": msg.attempts,
        "timestamp": msg.timestamp,
        "nsqd": msg.nsqd_address,
    }
    try:
        doc["ext"] = msg.ext
    except Exception:  # an unparsable header is still shown, raw
        raw = msg.ext_raw
        doc["ext"] = None
        doc["ext_raw"] = raw.decode("utf-8", "replace") if raw is not None else None
    try:
        doc["body"] = body.decode("utf-8")
    except UnicodeDecodeError:
        doc["body_base64"] = base64.b64encode(body).decode("ascii")
    return doc


class Printer:
    """Writes each message (in arrival order, which per partition is queue order) and stops
    after ``count`` messages, when the output's reader goes away (``| head``), when the
    output fails (a full disk: :attr:`error`) or when ``stopping`` is set while the output
    takes nothing; later deliveries, and the message not written, are requeued untouched
    for other readers. A message is finished only once its line was written."""

    def __init__(self, fmt: str, count: int | None, out: BinaryIO,
                 stopping: asyncio.Event) -> None:
        self.fmt = fmt
        self.count = count
        self.out = out
        self.pipe = OutputPipe.of(out)
        self.stopping = stopping
        self.printed = 0
        self.output_closed = False
        #: the write error (other than a closed pipe) that stopped the printing
        self.error: CliError | None = None
        self.done = asyncio.Event()

    async def __call__(self, msg: Message) -> None:
        if self.output_closed or (self.count is not None and self.printed >= self.count):
            msg.requeue(0, backoff=False)
            return
        if self.fmt == "json":
            line = json.dumps(message_json(msg), ensure_ascii=False).encode("utf-8")
        else:
            line = msg.body
        if self.pipe is not None and self.pipe.full() and not await self._room(self.pipe):
            msg.requeue(0, backoff=False)  # stopping while the reader reads nothing
            return
        try:
            with writing_stdout():
                self.out.write(line + b"\n")
                self.out.flush()
        except (OutputClosed, CliError) as exc:
            # not printed: back to the channel at once, and no more (the next write would
            # fail the same way: a message requeued with backoff forever)
            msg.requeue(0, backoff=False)
            if isinstance(exc, CliError):
                self.error = exc
            self._reader_gone()
            return
        self.printed += 1
        if self.count is not None and self.printed >= self.count:
            self.done.set()

    async def _room(self, pipe: OutputPipe) -> bool:
        """Wait until the pipe takes more; False if the command stops first."""
        room = asyncio.ensure_future(pipe.room())
        stopping = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait((room, stopping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            room.cancel()
            stopping.cancel()
        return not self.stopping.is_set()

    def _reader_gone(self) -> None:
        """No more printing: the output was closed, or failed (:attr:`error`); stdout is
        /dev/null now, so nothing may be taken as printed any more."""
        self.output_closed = True
        self.done.set()

    async def watch_output(self) -> None:
        """Return once the output is a pipe whose reader has gone (then printing is done);
        never for a terminal or a file."""
        await output_gone(self.out)
        stdout_closed()
        self._reader_gone()


async def topic_view(lookup: Lookup, topic: str) -> TopicView:
    """The readable view of ``topic``, or a CliError when the lookupds do not know it."""
    view = await lookup.lookup(topic, "r")
    if view.not_found or not view.nodes:
        why = f" ({view.not_found_reason})" if view.not_found_reason else ""
        raise CliError(f"topic {topic!r} not found on lookupd "
                       f"{', '.join(view.answered_by) or ', '.join(lookup.seeds)}{why}")
    return view


def check_partitions(view: TopicView, partitions: tuple[int, ...]) -> None:
    if not partitions:
        return
    if view.flavour is not Flavour.YOUZAN or not view.is_partitioned:
        raise CliError(f"--partition: topic {view.topic!r} is not partitioned (stock NSQ)")
    for p in partitions:
        if p >= view.partition_num:
            raise CliError(f"--partition {p}: topic {view.topic!r} has partitions "
                           f"0..{view.partition_num - 1}")


def check_start(view: TopicView, start: StartAt | None) -> None:
    if isinstance(start, dict):
        for p in start:
            if p >= view.partition_num:
                raise CliError(f"--from: no partition {p} (topic {view.topic!r} has "
                               f"{view.partition_num})")


async def skip_empty_partitions(view: TopicView, start: StartAt | None,
                                partitions: tuple[int, ...]) -> StartAt | None:
    """``start`` without the partitions that hold no message yet.

    Real youzan nsqd refuses every position on an empty partition (``E_INVALID commit log end
    of file``), and there every position is the same one: where a new channel starts. The
    leaders' own ``/stats`` say which partitions are empty.
    """
    if start is None or not view.is_partitioned:
        return start
    wanted = set(start) if isinstance(start, dict) else set(partitions or view.partitions)
    leaders = {view.partitions[p].http_address for p in wanted if p in view.partitions}
    from smartnsq.nsqd_http import NsqdHttpClient

    empty: set[int] = set()
    async with NsqdHttpClient() as nsqd:
        answers = [await nsqd.stats(addr, view.topic) for addr in sorted(leaders)]
    for stats in answers:
        for t in stats["topics"]:
            try:
                p = int(t.get("topic_partition", ""))
            except (TypeError, ValueError):
                continue
            stored = int(t.get("backend_depth") or 0) - int(t.get("backend_start") or 0)
            if p in wanted and t.get("is_leader", True) and stored <= 0:
                empty.add(p)
    if not empty:
        return start
    spec = {p: (start[p] if isinstance(start, dict) else start) for p in wanted - empty}
    return spec or None


@click.command(epilog=EPILOG)
@click.argument("topic", callback=topic_argument)
@cluster_options()
@click.option("--channel", callback=channel_argument,
              help="channel to read from (default: a new ephemeral channel)")
@click.option("--partition", "partitions", type=click.IntRange(min=0), multiple=True,
              help="youzan: read only this partition (repeatable)")
@click.option("--ordered", is_flag=True,
              help="youzan: SUB_ORDERED, one message at a time per partition, in order")
@click.option("--from", "start", type=FromParam(),
              help="youzan: where to start: earliest | end | offset:P=N,... | count:P=N,... | "
                   "timestamp:T (unix seconds or ISO 8601)")
@click.option("-n", "count", type=click.IntRange(min=1), help="exit after COUNT messages")
@click.option("--format", "fmt", type=click.Choice(["body", "json"]), default="body",
              show_default=True,
              help="body: the raw body per line; json: id, partition, offset, raw size, trace "
                   "id, attempts, timestamp, ext and body")
@click.option("--max-in-flight", type=click.IntRange(min=1), default=200, show_default=True)
@connect_timeout_option()
@tcp_wire_options()
@metrics_options
@command_runner
async def tail(topic: str, lookupd: tuple[str, ...], nsqd: tuple[str, ...], channel: str | None,
               partitions: tuple[int, ...], ordered: bool, start: StartAt | None,
               count: int | None, fmt: str, max_in_flight: int,
               connect_timeout: float) -> None:
    """Print the messages of TOPIC as they arrive. Ctrl-C stops cleanly: messages already
    printed are finished, nothing is left in flight, and a message is never consumed
    without being printed."""
    cluster = pick_cluster(lookupd, nsqd)
    if cluster.nsqd and (partitions or ordered or start is not None):
        raise click.UsageError("--partition, --ordered and --from need --lookupd (they use "
                               "youzan partitions, which the lookupds publish)")
    stop = stop_event()
    # imported once Ctrl-C sets ``stop``: one during the import ends tail as one later does
    from smartnsq.consumer import Consumer
    from smartnsq.ordered import OrderedConsumer

    printer = Printer(fmt, count, require_stdout("the messages").buffer, stop)
    chan = channel or ephemeral_channel()
    consumer: Consumer
    if cluster.nsqd:
        config = _config(max_in_flight, count, len(cluster.nsqd))
        consumer = Consumer(topic, chan, printer, nsqd=list(cluster.nsqd),
                            config=config)
        await _run(consumer, stop, printer, connect_timeout)
        _output_note(printer, channel)
        return
    async with cluster.lookup(poll_interval=15.0) as lookup:
        view = await unless_stopped(topic_view(lookup, topic), stop)
        refuse_unordered(view, ordered)
        check_partitions(view, partitions)
        check_start(view, start)
        start = await unless_stopped(skip_empty_partitions(view, start, partitions), stop)
        only = partitions or None
        sources = len(partitions) or (view.partition_num if view.is_partitioned
                                      else len(view.nodes))
        config = _config(max_in_flight, count, sources)
        if ordered:
            consumer = OrderedConsumer(topic, chan, printer, lookupd=lookup, config=config,
                                       start_at=start, partitions=only)
        else:
            consumer = Consumer(topic, chan, printer, lookupd=lookup, config=config,
                                start_at=start, partitions=only)
        await _run(consumer, stop, printer, connect_timeout)
    _output_note(printer, channel)


def _output_note(printer: Printer, channel: str | None) -> None:
    """On a named channel, say how many messages a closed output took (the ones its reader
    dropped unread are among them); the others stay in the channel."""
    if printer.output_closed and printer.error is None and channel is not None:
        err_print(f"smartnsq: tail: the output was closed after {printer.printed} "
                  f"message(s) were printed; the rest stay in channel {channel}")


def _config(max_in_flight: int, count: int | None, sources: int) -> ConsumerConfig:
    """With ``-n`` no more is taken than printed, except that every subscription (nsqd or
    partition) gets one RDY: fewer would leave one waiting for a RDY rotation (seconds)
    while its messages are the ones to print; what arrives after the count goes back."""
    from smartnsq.config import ConsumerConfig

    if count is not None:
        max_in_flight = min(max_in_flight, max(count, sources))
    # max_attempts=0: an inspection tool never gives a message up (FIN without printing it)
    # because other readers of the channel already took it several times
    return ConsumerConfig(max_in_flight=max_in_flight, drain_timeout=5.0,
                          lookupd_poll_interval=15.0, max_attempts=0,
                          connection=connection_config())


async def _run(consumer: Consumer, stop: asyncio.Event, printer: Printer,
               connect_timeout: float) -> None:
    await consume_watched(consumer, stop, printer.done, connect_timeout=connect_timeout,
                          guards=[printer.watch_output])
    if printer.error is not None:
        raise CliError(f"{printer.error.message} (after {printer.printed} message(s); the "
                       "one that failed went back to the channel)")
