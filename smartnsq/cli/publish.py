"""``smartnsq publish TOPIC [FILE…]``: one message per record (line) from files or stdin
(like ``to_nsq``), with MPUB batches, sharded ordered publishing, traced receipts, rate
limiting and deferred publishing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import click

from smartnsq.cli.common import (
    CliError,
    Cluster,
    OutputClosed,
    RateParam,
    cluster_options,
    describe,
    err_print,
    pick_cluster,
    require_stdout,
    stderr_console,
    topic_argument,
    unless_stopped,
    writing_stdout,
)
from smartnsq.cli.records import (
    InputState,
    Record,
    RecordTooLong,
    ShardKeyRule,
    open_sources,
    parse_delimiter,
    read_records,
    shard_rule,
)
from smartnsq.cli.stopping import EXIT_OUTPUT_CLOSED, StopEvent, command_runner, stop_event
from smartnsq.cli.wire import connection_config, tcp_wire_options
from smartnsq.errors import NSQError

# the clients load when the command runs (once its stop event holds Ctrl-C), not for --help
if TYPE_CHECKING:
    from rich.progress import Progress

    from smartnsq.lookup import Lookup, TopicView
    from smartnsq.producer import Producer, PublishReceipt

EPILOG = """\b
Examples:
  printf 'a\\nb\\n' | smartnsq publish orders --lookupd 127.0.0.1:4161
  smartnsq publish orders events.jsonl --lookupd 127.0.0.1:4161 --shard-key-field user_id
  smartnsq publish orders log.txt --lookupd 127.0.0.1:4161 --shard-key-regex 'user=(\\w+)'
  smartnsq publish orders dump.txt --nsqd 127.0.0.1:4150 --batch 100 --rate 500/s
  smartnsq publish orders --lookupd 127.0.0.1:4161 --partition 2 --trace < msgs.txt
  echo later | smartnsq publish jobs --nsqd 127.0.0.1:4150 --defer 30
"""

T = TypeVar("T")

#: records read ahead of the publishes (ordered mode keeps this many in flight)
WINDOW = 256
#: nsqd's default --max-msg-size and --max-body-size
MAX_MSG_SIZE = 1024 * 1024
MAX_BODY_SIZE = 5 * 1024 * 1024
#: after SIGINT/SIGTERM, the records already read are still published for at most this long
#: (a second signal cuts it short); the rest are reported as not published
DRAIN_SECONDS = 5.0


@dataclass
class Totals:
    messages: int = 0
    bytes: int = 0
    #: stdout's reader went away (``--trace | head``): the run stops like on a signal
    output_closed: bool = False
    #: records read but not (confirmed) published when the drain after a signal was cut
    unpublished: int = 0
    #: why the drain ended early, when not for its bound or a second signal
    cut_why: str | None = None


class DrainCut(Exception):
    """The drain after a signal is over (its bound passed, or a second signal came);
    ``held`` records taken from the input were not (confirmed) published."""

    def __init__(self, held: int = 0, why: str | None = None) -> None:
        super().__init__(held, why)
        self.held = held
        #: why it ended, when not for the bound or a second signal
        self.why = why


class Drain:
    """Bounds the publishing after a stop: the records already read are published until
    :data:`DRAIN_SECONDS` after the signal, or a second signal; a publish still out then is
    abandoned (:class:`DrainCut`)."""

    def __init__(self, stop: StopEvent, seconds: float = DRAIN_SECONDS) -> None:
        self.stop = stop
        self.seconds = seconds
        self._deadline: float | None = None

    async def _cut(self) -> None:
        await self.stop.wait()
        deadline = self.deadline()
        assert deadline is not None  # the stop is set
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.hurry.wait(),
                                   max(0.0, deadline - asyncio.get_running_loop().time()))

    def deadline(self) -> float | None:
        """Loop time at which the drain ends; None while no signal came."""
        if not self.stop.is_set():
            return None
        if self._deadline is None:
            self._deadline = asyncio.get_running_loop().time() + self.seconds
        return self._deadline

    def over(self) -> bool:
        deadline = self.deadline()
        if deadline is None:
            return False
        return self.stop.hurry.is_set() or asyncio.get_running_loop().time() >= deadline

    async def bounded(self, aw: Awaitable[T]) -> T:
        """``aw``'s result, or :class:`DrainCut` (``aw`` cancelled) once the drain is over."""
        task = asyncio.ensure_future(aw)
        if self.over():
            task.cancel()
        cut = asyncio.ensure_future(self._cut())
        try:
            await asyncio.wait((task, cut), return_when=asyncio.FIRST_COMPLETED)
        finally:
            cut.cancel()
        if task.done() and not task.cancelled():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise DrainCut


class Pacer:
    """Spaces publishes to ``rate`` messages per second (no burst beyond one batch), also
    while the records read before a signal are drained; a wait ends the drain early."""

    def __init__(self, rate: float | None, drain: Drain) -> None:
        self.interval = 1.0 / rate if rate else 0.0
        self.next = 0.0
        self.drain = drain

    async def wait(self, n: int = 1) -> None:
        if not self.interval:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self.next > now and not self.drain.stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.drain.stop.wait(), self.next - now)
            now = loop.time()
        if self.next > now:  # a signal came: the drain's bound rules the wait
            deadline = self.drain.deadline()
            if deadline is not None and self.next > deadline:
                # the rate allows no more before the drain ends: no use waiting
                raise DrainCut(why=f"--rate allows no more within the {self.drain.seconds:g} s "
                                   "allowed after the signal")
            await self.drain.bounded(asyncio.sleep(self.next - now))
        self.next = max(self.next, now) + n * self.interval


def receipt_line(r: PublishReceipt) -> str:
    return json.dumps({"partition": r.partition, "offset": r.offset, "raw_size": r.raw_size,
                       "internal_id": r.internal_id, "trace_id": r.trace_id, "count": r.count,
                       "nsqd": r.nsqd})


@click.command(epilog=EPILOG)
@click.argument("topic", callback=topic_argument)
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False, allow_dash=True))
@cluster_options()
@click.option("--delimiter", default="\\n", show_default=True,
              help="record separator (backslash escapes: \\n, \\0, \\t)")
@click.option("--batch", type=click.IntRange(min=1), help="send N records per MPUB")
@click.option("--shard-key-field", metavar="NAME",
              help="records are JSON objects; publish ordered by this field (a.b for nested)")
@click.option("--shard-key-regex", metavar="REGEX",
              help="publish ordered by the regex's first group (or whole match)")
@click.option("--partition", type=click.IntRange(min=0), help="youzan: publish to this partition")
@click.option("--trace", is_flag=True,
              help="youzan: traced publish (trace id = record number); print each receipt")
@click.option("--rate", type=RateParam(), help="at most N messages per second (N/s, N/m, N/h)")
@click.option("--defer", type=click.FloatRange(min=0, max=3600), metavar="SECONDS",
              help="stock nsqd: deliver each message after SECONDS (DPUB)")
@click.option("--max-msg-size", type=click.IntRange(min=1), default=MAX_MSG_SIZE,
              show_default=True, metavar="BYTES",
              help="the longest record accepted (nsqd's --max-msg-size); a longer one stops "
                   "the command with an error as soon as it is read that far")
@click.option("--progress/--no-progress", default=None,
              help="progress bar (default: when stdout is a terminal)")
@tcp_wire_options()
@command_runner
async def publish(topic: str, files: tuple[str, ...], lookupd: tuple[str, ...],
                  nsqd: tuple[str, ...], delimiter: str, batch: int | None,
                  shard_key_field: str | None, shard_key_regex: str | None,
                  partition: int | None, trace: bool, rate: float | None, defer: float | None,
                  max_msg_size: int, progress: bool | None) -> None:
    """Publish one message per record of FILEs (or stdin; '-' is stdin too) to TOPIC;
    records from a pipe are published as they arrive (with --batch, a batch at a time).
    A summary line goes to stderr; --trace receipts go to stdout as JSON lines.
    SIGINT/SIGTERM stop reading; what was read is still published (for at most 5 s, a
    second signal ends at once; what is left then is reported), and the exit code is
    130/143 (141 when the receipts' reader went away). Empty records are skipped (nsqd
    refuses empty bodies) and counted in the summary."""
    cluster = pick_cluster(lookupd, nsqd)
    delim = parse_delimiter(delimiter)
    rule = shard_rule(shard_key_field, shard_key_regex)
    if rule is not None and (batch or partition is not None or defer is not None):
        raise click.UsageError("--shard-key-* publishes each record to its key's partition; "
                               "it cannot be combined with --batch, --partition or --defer")
    if rule is not None and cluster.nsqd:
        raise click.UsageError("--shard-key-* needs --lookupd (the partition count comes from "
                               "the topic's lookup)")
    if defer is not None and (batch or partition is not None or trace):
        raise click.UsageError("--defer (DPUB) sends one plain message at a time: no --batch, "
                               "--partition or --trace")
    sources, total = open_sources(files)
    if any(name == "<stdin>" for name, _ in sources) and sys.stdin.isatty():
        # no pipe and no file: a command that seems to hang is waiting for typed records
        err_print("smartnsq: publish: reading records from the terminal, one per line; "
                  "end with Ctrl-D (or give a FILE, or pipe records in)")
    if trace:
        require_stdout("the --trace receipts")
    show = progress if progress is not None else (sys.stdout is not None
                                                  and sys.stdout.isatty())
    stop = stop_event(cuts_short=True)
    drain = Drain(stop)
    totals = Totals()
    state = InputState()
    began = False
    started = time.perf_counter()
    producer = _producer(cluster, max_msg_size)
    try:
        async with producer:
            if cluster.lookupd:
                lookup = producer.lookup
                assert lookup is not None
                await unless_stopped(_check_topic(lookup, topic), stop)
            began = True
            records = read_records(sources, delim, limit=max_msg_size, stop=stop, state=state)
            with _progress(show, total) as bar:
                task = bar.add_task("publishing", total=total)
                pacer = Pacer(rate, drain)
                try:
                    async for done in _publish_all(producer, topic, records, rule=rule,
                                                   batch=batch, partition=partition,
                                                   trace=trace, defer=defer, pacer=pacer,
                                                   drain=drain, totals=totals):
                        bar.update(task, completed=done)
                except (CliError, NSQError, RecordTooLong, OSError) as exc:
                    # the one error line also says how far the input got
                    text = exc.message if isinstance(exc, CliError) else describe(exc)
                    raise CliError(f"{text} (after {totals.messages} message(s) were "
                                   "published)") from exc
    finally:
        for name, stream in sources:
            if name != "<stdin>":
                stream.close()
    if began:
        _summary(topic, totals, state, stop, time.perf_counter() - started)
    if totals.output_closed and stop.signum is None:
        raise click.exceptions.Exit(EXIT_OUTPUT_CLOSED)
    # after a signal, command_runner exits 128 + its number


def _summary(topic: str, totals: Totals, state: InputState, stop: StopEvent,
             elapsed: float) -> None:
    """The summary line on stderr, and after a signal what was read and not published."""
    rate_txt = f", {totals.messages / elapsed:,.0f} msg/s" if elapsed > 0 else ""
    skipped = f"; skipped {state.empty} empty record(s)" if state.empty else ""
    why = ""
    if stop.signum is not None:
        why = f" (interrupted by {stop.signal_name})"
    elif totals.output_closed:
        why = " (stopped: the output was closed)"
    console = stderr_console()
    console.print(f"published {totals.messages} message(s), {totals.bytes:,} bytes, to "
                  f"{topic} in {elapsed:.2f}s{rate_txt}{skipped}{why}",
                  highlight=False, soft_wrap=True)
    lost = []
    if totals.unpublished:
        cut = totals.cut_why or ("a second signal" if stop.hurry.is_set()
                                 else f"the {DRAIN_SECONDS:g} s allowed after the signal passed")
        lost.append(f"{totals.unpublished} record(s) read before {stop.signal_name} were "
                    f"not published, or not confirmed ({cut})")
    if state.unfinished and stop.signum is not None:
        lost.append(f"an unfinished record ({state.unfinished:,} bytes read, no delimiter "
                    "yet) was not published")
    for text in lost:
        console.print(f"smartnsq: warning: publish: {text}", highlight=False, soft_wrap=True)


def _producer(cluster: Cluster, max_msg_size: int) -> Producer:
    # called after stop_event(): a Ctrl-C during these imports stops publish as later ones do
    from smartnsq.config import ProducerConfig
    from smartnsq.producer import Producer

    config = ProducerConfig(publish_timeout=10.0, max_msg_size=max_msg_size,
                            max_body_size=max(MAX_BODY_SIZE, max_msg_size),
                            lookupd_poll_interval=15.0,
                            connection=connection_config(heartbeat_interval=30.0))
    if cluster.nsqd:
        return Producer(nsqd=cluster.nsqd, config=config)
    return Producer(lookupd=cluster.lookupd, config=config)


async def _check_topic(lookup: Lookup, topic: str) -> TopicView:
    """The writable view of ``topic``, or a CliError when it cannot be written."""
    view = await lookup.lookup(topic, "w")
    if view.not_found or not view.nodes:
        why = f" ({view.not_found_reason})" if view.not_found_reason else ""
        raise CliError(f"topic {topic!r} is not writable on lookupd "
                       f"{', '.join(view.answered_by) or ', '.join(lookup.seeds)}{why}: create "
                       "it (smartnsq topic create) and a channel first")
    return view


def _progress(show: bool, total: int | None) -> Progress:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    columns = [TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
               TransferSpeedColumn(), TimeElapsedColumn(), TimeRemainingColumn()]
    if total is None:
        columns = [TextColumn("{task.description}"), MofNCompleteColumn(),
                   TransferSpeedColumn(), TimeElapsedColumn()]
    return Progress(*columns, console=stderr_console(), disable=not show)


async def _publish_all(producer: Producer, topic: str, records: AsyncIterator[Record], *,
                       rule: ShardKeyRule | None, batch: int | None, partition: int | None,
                       trace: bool, defer: float | None, pacer: Pacer, drain: Drain,
                       totals: Totals) -> AsyncIterator[int]:
    """Publish every record; yields the input bytes consumed after each acknowledged step.
    A record that cannot be published (too long, no shard key) ends the run after the
    records before it were published. After a signal the records already read are still
    published until the drain is over; those left then are counted in
    ``totals.unpublished``."""
    steps = _publish_steps(producer, topic, records, rule=rule, batch=batch,
                           partition=partition, trace=trace, defer=defer, pacer=pacer,
                           drain=drain, totals=totals)
    try:
        async for done in steps:
            yield done
    except DrainCut as cut:
        # the rest of what was read before the signal: counted, not published
        totals.unpublished = cut.held + sum([1 async for _ in records])
        totals.cut_why = cut.why


async def _publish_steps(producer: Producer, topic: str, records: AsyncIterator[Record], *,
                         rule: ShardKeyRule | None, batch: int | None, partition: int | None,
                         trace: bool, defer: float | None, pacer: Pacer, drain: Drain,
                         totals: Totals) -> AsyncIterator[int]:
    """:func:`_publish_all`'s steps; a :class:`DrainCut` says how many records it held."""
    out = sys.stdout

    def receipt(r: PublishReceipt | None) -> None:
        """Print a receipt of a message already counted as published."""
        if r is None or not trace or totals.output_closed:
            return
        try:
            with writing_stdout("the receipts"):  # another failure: the run's error line
                print(receipt_line(r), file=out, flush=True)
        except OutputClosed:
            # nobody reads the receipts any more: publish nothing more (this one is out)
            totals.output_closed = True
            drain.stop.set()

    if rule is not None:
        # keys run in parallel; one key's records keep input order (the producer's lanes)
        pending: list[tuple[Record, asyncio.Future[PublishReceipt | None]]] = []

        async def settle(keep: int) -> AsyncIterator[int]:
            while len(pending) > keep:
                rec, fut = pending[0]
                try:
                    r = await drain.bounded(asyncio.shield(fut))
                except DrainCut as cut:
                    raise DrainCut(len(pending), cut.why) from None
                pending.pop(0)
                totals.messages += 1
                totals.bytes += len(rec.body)
                receipt(r)
                yield rec.consumed

        bad: CliError | RecordTooLong | None = None
        try:
            try:
                async for rec in records:
                    if totals.output_closed:
                        break
                    key = rule.key(rec)
                    try:
                        await pacer.wait()
                    except DrainCut as cut:
                        raise DrainCut(len(pending) + 1, cut.why) from None
                    fut = asyncio.ensure_future(producer.publish_ordered(
                        topic, key, rec.body, trace_id=rec.number if trace else None))
                    pending.append((rec, fut))
                    async for done in settle(WINDOW):
                        yield done
            except (CliError, RecordTooLong) as exc:
                bad = exc  # the records before it are still published
            async for done in settle(0):
                yield done
            if bad is not None:
                raise bad
        finally:
            for _, pfut in pending:
                pfut.cancel()
            if pending:
                await asyncio.gather(*(f for _, f in pending), return_exceptions=True)
        return

    if batch:
        chunk: list[Record] = []

        async def flush() -> int:
            try:
                await pacer.wait(len(chunk))
                bodies = [r.body for r in chunk]
                sent = await drain.bounded(producer.publish_many(
                    topic, bodies, partition=partition,
                    trace_id=chunk[0].number if trace else None))
            except DrainCut as cut:
                raise DrainCut(len(chunk), cut.why) from None
            totals.messages += len(chunk)
            totals.bytes += sum(len(b) for b in bodies)
            for r in sent.receipts:
                receipt(r)
            done = chunk[-1].consumed
            chunk.clear()
            return done

        too_long: RecordTooLong | None = None
        try:
            async for rec in records:
                if totals.output_closed:
                    break
                chunk.append(rec)
                if len(chunk) >= batch:
                    yield await flush()
        except RecordTooLong as exc:
            too_long = exc  # the records before it are still published
        # a partial batch, at the input's end or after a signal: published too
        if chunk and not totals.output_closed:
            yield await flush()
        if too_long is not None:
            raise too_long
        return

    async for rec in records:
        if totals.output_closed:
            break
        r = None
        try:
            await pacer.wait()
            if defer is not None:
                await drain.bounded(producer.publish_deferred(topic, rec.body, defer))
            else:
                r = await drain.bounded(producer.publish(
                    topic, rec.body, partition=partition,
                    trace_id=rec.number if trace else None))
        except DrainCut as cut:
            raise DrainCut(1, cut.why) from None
        totals.messages += 1
        totals.bytes += len(rec.body)
        receipt(r)
        yield rec.consumed
