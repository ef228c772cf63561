"""``smartnsq publish TOPIC [FILE…]``: one message per record (line) from files or stdin
(like ``to_nsq``), with MPUB batches, sharded ordered publishing, traced receipts, rate
limiting and deferred publishing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import click
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

from smartnsq.cli.common import (
    CliError,
    Cluster,
    OutputClosed,
    RateParam,
    cluster_options,
    command_runner,
    describe,
    pick_cluster,
    stderr_console,
    stop_event,
    topic_argument,
    writing_stdout,
)
from smartnsq.cli.records import Record, RecordTooLong, parse_delimiter, read_records
from smartnsq.config import ProducerConfig
from smartnsq.errors import NSQError
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

#: records read ahead of the publishes (ordered mode keeps this many in flight)
WINDOW = 256
#: nsqd's default --max-msg-size and --max-body-size
MAX_MSG_SIZE = 1024 * 1024
MAX_BODY_SIZE = 5 * 1024 * 1024
#: the input was not all published because stdout's reader went away: 128 + SIGPIPE, as
#: shells report a command a broken pipe ended
EXIT_OUTPUT_CLOSED = 128 + signal.SIGPIPE


class ShardKeyRule:
    """Where a record's shard key is: a JSON field (dotted path) or a regex's first group."""

    def __init__(self, *, field: str | None = None, regex: re.Pattern[bytes] | None = None,
                 path: list[str] | None = None) -> None:
        self.field = field
        self.regex = regex
        self.path = path or []

    def key(self, rec: Record) -> str | int:
        where = f"{rec.source} record {rec.number}"
        if self.regex is not None:
            m = self.regex.search(rec.body)
            if m is None:
                raise CliError(f"{where}: --shard-key-regex {self.regex.pattern.decode()!r} "
                               "does not match")
            raw = m.group(1) if self.regex.groups else m.group(0)
            if raw is None or not raw:
                raise CliError(f"{where}: --shard-key-regex matched an empty shard key")
            return raw.decode("utf-8", "replace")
        try:
            doc: Any = json.loads(rec.body)
        except ValueError as exc:
            raise CliError(f"{where}: not JSON ({exc}); --shard-key-field needs JSON "
                           "lines") from None
        for part in self.path:
            if not isinstance(doc, dict) or part not in doc:
                raise CliError(f"{where}: no field {self.field!r} in the JSON object")
            doc = doc[part]
        if isinstance(doc, bool) or not isinstance(doc, str | int) or doc == "":
            raise CliError(f"{where}: field {self.field!r} is {json.dumps(doc)}; a shard key "
                           "must be a non-empty string or an integer")
        return doc


@dataclass
class Totals:
    messages: int = 0
    bytes: int = 0
    #: stdout's reader went away (``--trace | head``): the run stops like on a signal
    output_closed: bool = False


class Pacer:
    """Spaces publishes to ``rate`` messages per second (no burst beyond one batch); a
    wait ends early when ``stop`` is set."""

    def __init__(self, rate: float | None, stop: asyncio.Event) -> None:
        self.interval = 1.0 / rate if rate else 0.0
        self.next = 0.0
        self.stop = stop

    async def wait(self, n: int = 1) -> None:
        if not self.interval:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self.next > now:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), self.next - now)
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
@command_runner
async def publish(topic: str, files: tuple[str, ...], lookupd: tuple[str, ...],
                  nsqd: tuple[str, ...], delimiter: str, batch: int | None,
                  shard_key_field: str | None, shard_key_regex: str | None,
                  partition: int | None, trace: bool, rate: float | None, defer: float | None,
                  max_msg_size: int, progress: bool | None) -> None:
    """Publish one message per record of FILEs (or stdin; '-' is stdin too) to TOPIC;
    records from a pipe are published as they arrive (with --batch, a batch at a time).
    A summary line goes to stderr; --trace receipts go to stdout as JSON lines.
    SIGINT/SIGTERM stop it after the publishes under way: the summary counts what was
    published, and the exit code is 130/143 (141 when the receipts' reader went away)."""
    cluster = pick_cluster(lookupd, nsqd)
    delim = parse_delimiter(delimiter)
    rule = _shard_rule(shard_key_field, shard_key_regex)
    if rule is not None and (batch or partition is not None or defer is not None):
        raise click.UsageError("--shard-key-* publishes each record to its key's partition; "
                               "it cannot be combined with --batch, --partition or --defer")
    if rule is not None and cluster.nsqd:
        raise click.UsageError("--shard-key-* needs --lookupd (the partition count comes from "
                               "the topic's lookup)")
    if defer is not None and (batch or partition is not None or trace):
        raise click.UsageError("--defer (DPUB) sends one plain message at a time: no --batch, "
                               "--partition or --trace")
    sources, total = _open_sources(files)
    show = progress if progress is not None else sys.stdout.isatty()
    stop = stop_event()
    totals = Totals()
    began = False
    started = time.perf_counter()
    console = stderr_console()
    producer = _producer(cluster, max_msg_size)
    try:
        async with producer:
            if cluster.lookupd:
                lookup = producer.lookup
                assert lookup is not None
                await _check_topic(lookup, topic)
            began = True
            records = read_records(sources, delim, limit=max_msg_size, stop=stop)
            with _progress(show, total) as bar:
                task = bar.add_task("publishing", total=total)
                pacer = Pacer(rate, stop)
                try:
                    async for done in _publish_all(producer, topic, records, rule=rule,
                                                   batch=batch, partition=partition,
                                                   trace=trace, defer=defer, pacer=pacer,
                                                   stop=stop, totals=totals):
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
        elapsed = time.perf_counter() - started
        rate_txt = f", {totals.messages / elapsed:,.0f} msg/s" if elapsed > 0 else ""
        why = ""
        if stop.signum is not None:
            why = f" (interrupted by {signal.Signals(stop.signum).name})"
        elif totals.output_closed:
            why = " (stopped: the output was closed)"
        console.print(f"published {totals.messages} message(s), {totals.bytes:,} bytes, to "
                      f"{topic} in {elapsed:.2f}s{rate_txt}{why}",
                      highlight=False, soft_wrap=True)
    code = stop.exit_code()
    if code is None and totals.output_closed:
        code = EXIT_OUTPUT_CLOSED
    if code is not None:
        raise click.exceptions.Exit(code)


def _shard_rule(field_name: str | None, regex: str | None) -> ShardKeyRule | None:
    if field_name is not None and regex is not None:
        raise click.UsageError("give --shard-key-field or --shard-key-regex, not both")
    if field_name is not None:
        path = field_name.split(".")
        if not all(path):
            raise click.BadParameter(f"malformed field name {field_name!r}",
                                     param_hint="--shard-key-field")
        return ShardKeyRule(field=field_name, path=path)
    if regex is not None:
        try:
            pattern = re.compile(regex.encode("utf-8"))
        except re.error as exc:
            raise click.BadParameter(f"invalid regex {regex!r}: {exc}",
                                     param_hint="--shard-key-regex") from None
        return ShardKeyRule(regex=pattern)
    return None


def _open_sources(files: tuple[str, ...]) -> tuple[list[tuple[str, BinaryIO]], int | None]:
    """Open the inputs; total = their size in bytes when every input is a regular file."""
    sources: list[tuple[str, BinaryIO]] = []
    total: int | None = 0
    for f in files or ("-",):
        if f == "-":
            sources.append(("<stdin>", sys.stdin.buffer))
            total = None
            continue
        try:
            stream = open(f, "rb")  # noqa: SIM115 - closed by the caller
        except OSError as exc:
            for name, s in sources:
                if name != "<stdin>":
                    s.close()
            raise CliError(f"cannot read {f}: {exc.strerror}") from None
        sources.append((f, stream))
        if total is not None:
            total += os.fstat(stream.fileno()).st_size
    return sources, total


def _producer(cluster: Cluster, max_msg_size: int) -> Producer:
    config = ProducerConfig(publish_timeout=10.0, max_msg_size=max_msg_size,
                            max_body_size=max(MAX_BODY_SIZE, max_msg_size),
                            lookupd_poll_interval=15.0)
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
    columns = [TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
               TransferSpeedColumn(), TimeElapsedColumn(), TimeRemainingColumn()]
    if total is None:
        columns = [TextColumn("{task.description}"), MofNCompleteColumn(),
                   TransferSpeedColumn(), TimeElapsedColumn()]
    return Progress(*columns, console=stderr_console(), disable=not show)


async def _publish_all(producer: Producer, topic: str, records: AsyncIterator[Record], *,
                       rule: ShardKeyRule | None, batch: int | None, partition: int | None,
                       trace: bool, defer: float | None, pacer: Pacer, stop: asyncio.Event,
                       totals: Totals) -> AsyncIterator[int]:
    """Publish every record; yields the input bytes consumed after each acknowledged step.
    A record that cannot be published (too long, no shard key) ends the run after the
    records before it were published."""
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
            stop.set()

    if rule is not None:
        # keys run in parallel; one key's records keep input order (the producer's lanes)
        pending: list[tuple[Record, asyncio.Future[PublishReceipt | None]]] = []

        async def settle(keep: int) -> AsyncIterator[int]:
            while len(pending) > keep:
                rec, fut = pending.pop(0)
                r = await fut
                totals.messages += 1
                totals.bytes += len(rec.body)
                receipt(r)
                yield rec.consumed

        bad: CliError | RecordTooLong | None = None
        try:
            try:
                async for rec in records:
                    if stop.is_set():
                        break
                    key = rule.key(rec)
                    await pacer.wait()
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
            await pacer.wait(len(chunk))
            bodies = [r.body for r in chunk]
            sent = await producer.publish_many(
                topic, bodies, partition=partition, trace_id=chunk[0].number if trace else None)
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
                if stop.is_set():
                    break
                chunk.append(rec)
                if len(chunk) >= batch:
                    yield await flush()
        except RecordTooLong as exc:
            too_long = exc  # the records before it are still published
        if chunk and not stop.is_set():
            yield await flush()
        if too_long is not None:
            raise too_long
        return

    async for rec in records:
        if stop.is_set():
            break
        await pacer.wait()
        r = None
        if defer is not None:
            await producer.publish_deferred(topic, rec.body, defer)
        else:
            r = await producer.publish(topic, rec.body, partition=partition,
                                       trace_id=rec.number if trace else None)
        totals.messages += 1
        totals.bytes += len(rec.body)
        receipt(r)
        yield rec.consumed


