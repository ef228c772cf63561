"""``smartnsq to-file TOPIC --output-dir DIR``: archive a topic to files (like
``nsq_to_file``), one file per partition at a time.

At-least-once: a message is finished (FIN) only after the file holding it was flushed and
``fsync``-ed, so a crash loses nothing acknowledged; it may leave messages both in a file and
still in the channel (they are delivered again). Files are written as ``NAME.tmp`` and renamed
to ``NAME`` when rotated or closed (a ``.tmp`` left by a crash holds synced data). The file
work runs on a writer thread, off the event loop: a slow disk delays finishes, never the
consumer's heartbeats.

An ordered topic is read with ``--ordered`` (SUB_ORDERED): nsqd hands each partition one
message at a time, the next only once the current one is finished, so each message is synced
on its own (one fsync per message and partition) and every partition's file is in queue order.

Rotation by size (``--rotate-size``, bytes before compression) and by age
(``--rotate-interval``); ``--gzip`` compresses. File names carry the topic, partition, host,
UTC start time and a sequence number: ``orders.p3.host1.2026-11-23T16-00-00Z.0001.log.gz``.
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import os
import socket
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

import click

from smartnsq.cli.common import (
    CliError,
    FromParam,
    channel_argument,
    cluster_options,
    describe,
    pick_cluster,
    stderr_console,
    topic_argument,
    unless_stopped,
)
from smartnsq.cli.connections import connect_timeout_option, consume_watched, refuse_unordered
from smartnsq.cli.metrics import metrics_options
from smartnsq.cli.stopping import command_runner, stop_event
from smartnsq.cli.tail import check_partitions, check_start, skip_empty_partitions, topic_view
from smartnsq.cli.wire import connection_config, tcp_wire_options
from smartnsq.message import Message

# the clients load when the command runs (once its stop event holds Ctrl-C), not for --help
if TYPE_CHECKING:
    from smartnsq.cli.common import StartAt
    from smartnsq.config import ConsumerConfig
    from smartnsq.consumer import Consumer

EPILOG = """\b
Examples:
  smartnsq to-file orders --output-dir /data/nsq --lookupd 127.0.0.1:4161
  smartnsq to-file orders --output-dir /data/nsq --lookupd 127.0.0.1:4161 \\
      --gzip --rotate-size 100000000 --rotate-interval 3600
  smartnsq to-file events --output-dir . --nsqd 127.0.0.1:4150 --channel archive
  smartnsq to-file payments --output-dir /data/nsq --lookupd 127.0.0.1:4161 --ordered
"""


@dataclass(eq=False)
class OpenFile:
    """One archive file. The loop side fills ``buffer``/``pending``; ``stream``/``raw``
    belong to the writer thread, which opens the file on its first write."""

    path: Path
    tmp: Path
    opened: float
    written: int = 0
    #: bytes not yet handed to the writer, and the messages they hold (unfinished)
    buffer: bytearray = field(default_factory=bytearray)
    pending: list[Message] = field(default_factory=list)
    stream: IO[bytes] | gzip.GzipFile | None = None
    raw: IO[bytes] | None = None


class Archiver:
    """Writes messages to per-partition files; finishes them once their file is synced.

    The file work (open, write, gzip flush, fsync, close, rename) runs on one writer thread,
    in the order it was asked for, so the event loop (heartbeats, deliveries) never waits for
    the disk. Each sync hands the writer the bytes gathered since the previous one together
    with their messages; they are finished when that job (and so every earlier write of the
    file) has been fsync-ed. A failed job requeues its messages, sets :attr:`failed` and
    keeps the error in :attr:`error`.
    """

    def __init__(self, topic: str, out_dir: Path, *, rotate_size: int | None,
                 rotate_interval: float | None, compress: bool, gzip_level: int,
                 sync_count: int, host: str) -> None:
        self.topic = topic
        self.out_dir = out_dir
        self.rotate_size = rotate_size
        self.rotate_interval = rotate_interval
        self.compress = compress
        self.gzip_level = gzip_level
        self.sync_count = sync_count
        self.host = host
        self.files: dict[int, OpenFile] = {}
        self.seq = 0
        self.stopping = False
        self.written = 0
        self.finished = 0
        self.closed_files: list[Path] = []
        self.error: BaseException | None = None
        self.failed = asyncio.Event()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="smartnsq-to-file")
        self._jobs: set[asyncio.Future[None]] = set()

    def _name(self, partition: int) -> str:
        stamp = time.strftime("%Y-%m-%dT%H-%M-%SZ", time.gmtime())
        part = f"p{partition}" if partition >= 0 else "all"
        self.seq += 1
        ext = ".log.gz" if self.compress else ".log"
        return f"{self.topic}.{part}.{self.host}.{stamp}.{self.seq:04d}{ext}"

    def _new_file(self, partition: int) -> OpenFile:
        name = self._name(partition)
        f = OpenFile(self.out_dir / name, self.out_dir / (name + ".tmp"), time.monotonic())
        self.files[partition] = f
        return f

    async def __call__(self, msg: Message) -> None:
        msg.disable_auto_response()
        if self.stopping:
            # not written: another reader (or our next run) gets it
            msg.requeue(0, backoff=False)
            return
        partition = msg.partition if msg.partition is not None else -1
        f = self.files.get(partition) or self._new_file(partition)
        f.buffer += msg.body
        f.buffer += b"\n"
        f.written += len(msg.body) + 1
        f.pending.append(msg)
        self.written += 1
        if self.rotate_size is not None and f.written >= self.rotate_size:
            self._schedule(self.files.pop(partition), close=True)
        elif len(f.pending) >= self.sync_count:
            self._schedule(f, close=False)

    # -- the loop's side: hand work to the writer, answer messages when it is done ----------

    def _schedule(self, f: OpenFile, *, close: bool) -> None:
        """Give the writer ``f``'s new bytes (and the file's end when ``close``); finish
        their messages once it has synced them."""
        data, f.buffer = bytes(f.buffer), bytearray()
        msgs, f.pending = f.pending, []
        job = functools.partial(self._write_close if close else self._write_sync, f, data)
        fut = asyncio.get_running_loop().run_in_executor(self._writer, job)
        self._jobs.add(fut)
        fut.add_done_callback(functools.partial(self._done, msgs, f if close else None))

    def _done(self, msgs: list[Message], closed: OpenFile | None,
              fut: asyncio.Future[None]) -> None:
        self._jobs.discard(fut)
        exc = fut.exception() if not fut.cancelled() else asyncio.CancelledError()
        if exc is not None:
            for m in msgs:
                m.requeue(0, backoff=False)  # not known to be on disk: delivered again
            if self.error is None:
                self.error = exc
            self.failed.set()
            return
        for m in msgs:
            m.finish()
        self.finished += len(msgs)
        if closed is not None:
            self.closed_files.append(closed.path)

    def tick(self) -> None:
        """Periodic: sync what is pending, rotate files that are old enough."""
        now = time.monotonic()
        for partition, f in list(self.files.items()):
            if self.rotate_interval is not None and now - f.opened >= self.rotate_interval:
                self._schedule(self.files.pop(partition), close=True)
            elif f.pending:
                self._schedule(f, close=False)

    async def settle(self) -> None:
        """Wait until every write handed to the writer is done (and answered)."""
        while self._jobs:
            await asyncio.wait(set(self._jobs))

    async def close_all(self) -> None:
        """Sync, close and rename every file, answer their messages, stop the writer."""
        for partition in list(self.files):
            self._schedule(self.files.pop(partition), close=True)
        try:
            await self.settle()
        finally:
            self._writer.shutdown(wait=False)

    # -- the writer thread's side --------------------------------------------------------------

    def _write_sync(self, f: OpenFile, data: bytes) -> None:
        """Append ``data`` to ``f``, flush it through gzip and the OS, fsync."""
        if f.raw is None:
            f.raw = open(f.tmp, "xb")  # noqa: SIM115 - closed in _write_close
            f.stream = f.raw
            if self.compress:
                f.stream = gzip.GzipFile(filename=f.path.name.removesuffix(".gz"), mode="wb",
                                         fileobj=f.raw, compresslevel=self.gzip_level)
        assert f.stream is not None
        if data:
            f.stream.write(data)
        if isinstance(f.stream, gzip.GzipFile):
            f.stream.flush(zlib.Z_SYNC_FLUSH)
        f.stream.flush()
        f.raw.flush()
        os.fsync(f.raw.fileno())

    def _write_close(self, f: OpenFile, data: bytes) -> None:
        """The last sync of ``f``, its gzip trailer, then ``NAME.tmp`` → ``NAME``."""
        self._write_sync(f, data)
        assert f.stream is not None and f.raw is not None
        f.stream.close()  # writes the gzip trailer
        if f.stream is not f.raw:
            f.raw.flush()
            os.fsync(f.raw.fileno())
            f.raw.close()
        os.replace(f.tmp, f.path)
        _fsync_dir(self.out_dir)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # not every platform can open a directory
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@click.command("to-file", epilog=EPILOG)
@click.argument("topic", callback=topic_argument)
@click.option("--output-dir", required=True,
              type=click.Path(file_okay=False, writable=True, path_type=Path),
              help="directory for the files (created if missing)")
@cluster_options()
@click.option("--channel", default="nsq_to_file", show_default=True, callback=channel_argument)
@click.option("--partition", "partitions", type=click.IntRange(min=0), multiple=True,
              help="youzan: archive only this partition (repeatable)")
@click.option("--ordered", is_flag=True,
              help="youzan: read an ordered topic (SUB_ORDERED): one message at a time per "
                   "partition, each synced to its file before the next is delivered (one "
                   "fsync per message)")
@click.option("--from", "start", type=FromParam(),
              help="youzan: start position (earliest | end | offset:P=N,... | timestamp:T)")
@click.option("--rotate-size", type=click.IntRange(min=1), metavar="BYTES",
              help="start a new file after this many bytes (before compression)")
@click.option("--rotate-interval", type=click.FloatRange(min=0.1), metavar="SECONDS",
              help="start a new file after this many seconds")
@click.option("--gzip", "compress", is_flag=True, help="gzip the files")
@click.option("--gzip-level", type=click.IntRange(1, 9), default=6, show_default=True)
@click.option("--sync-interval", type=click.FloatRange(min=0.01), default=1.0,
              show_default=True, help="seconds between syncs (each sync FINs what it covers)")
@click.option("--max-in-flight", type=click.IntRange(min=1), default=1000, show_default=True,
              help="messages held at once; a sync also happens when half of them are waiting")
@connect_timeout_option()
@tcp_wire_options()
@metrics_options
@command_runner
async def to_file(topic: str, output_dir: Path, lookupd: tuple[str, ...],
                  nsqd: tuple[str, ...], channel: str, partitions: tuple[int, ...],
                  ordered: bool, start: StartAt | None, rotate_size: int | None,
                  rotate_interval: float | None, compress: bool, gzip_level: int,
                  sync_interval: float, max_in_flight: int, connect_timeout: float) -> None:
    """Archive TOPIC into files in --output-dir (at-least-once: a message is finished only
    after the file holding it has been flushed and synced). Ctrl-C stops gracefully: files
    are synced and closed, unwritten messages go back to the channel."""
    cluster = pick_cluster(lookupd, nsqd)
    if cluster.nsqd and (partitions or ordered or start is not None):
        raise click.UsageError("--partition, --ordered and --from need --lookupd")
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot create --output-dir {output_dir}: {exc.strerror}") from None
    # ordered: a partition's next message comes only once the current one is finished,
    # which here means synced
    archiver = Archiver(topic, output_dir, rotate_size=rotate_size,
                        rotate_interval=rotate_interval, compress=compress,
                        gzip_level=gzip_level,
                        sync_count=1 if ordered else max(1, max_in_flight // 2),
                        host=socket.gethostname().split(".")[0] or "host")
    stop = stop_event()
    # imported once Ctrl-C sets ``stop``: one during the import stops to-file as later ones do
    from smartnsq.consumer import Consumer
    from smartnsq.ordered import OrderedConsumer

    consumer: Consumer
    if cluster.nsqd:
        consumer = Consumer(topic, channel, archiver, nsqd=list(cluster.nsqd),
                            config=_config(max_in_flight))
        await _run(consumer, archiver, stop, sync_interval, connect_timeout)
    else:
        async with cluster.lookup(poll_interval=15.0) as lk:
            view = await unless_stopped(topic_view(lk, topic), stop)
            refuse_unordered(view, ordered)
            check_partitions(view, partitions)
            check_start(view, start)
            start = await unless_stopped(skip_empty_partitions(view, start, partitions),
                                         stop)
            only = partitions or None
            if ordered:
                # every partition read needs a RDY of its own
                config = _config(max(max_in_flight, len(partitions) or view.partition_num))
                consumer = OrderedConsumer(topic, channel, archiver, lookupd=lk, config=config,
                                           start_at=start, partitions=only)
            else:
                consumer = Consumer(topic, channel, archiver, lookupd=lk,
                                    config=_config(max_in_flight), start_at=start,
                                    partitions=only)
            await _run(consumer, archiver, stop, sync_interval, connect_timeout)
    stderr_console().print(
        f"archived {archiver.finished} message(s) of {topic} into "
        f"{len(archiver.closed_files)} file(s) in {output_dir}", highlight=False,
        soft_wrap=True)


def _config(max_in_flight: int) -> ConsumerConfig:
    from smartnsq.config import ConsumerConfig

    # max_attempts=0: a message is never given up (FIN without writing it)
    return ConsumerConfig(max_in_flight=max_in_flight, drain_timeout=5.0,
                          lookupd_poll_interval=15.0, max_attempts=0,
                          connection=connection_config())


async def _run(consumer: Consumer, archiver: Archiver, stop: asyncio.Event,
               sync_interval: float, connect_timeout: float) -> None:
    async def ticks() -> None:
        while True:
            await asyncio.sleep(sync_interval)
            archiver.tick()

    async def finish() -> None:
        # stop taking messages, make what was written durable and finish it; the consumer
        # stops after this
        archiver.stopping = True
        await archiver.close_all()

    await consume_watched(consumer, stop, archiver.failed, connect_timeout=connect_timeout,
                          guards=[ticks], before_stop=finish)
    if archiver.error is not None:
        raise CliError(f"cannot write the archive in {archiver.out_dir}: "
                       f"{describe(archiver.error)} (what was not synced went back to the "
                       "channel)")
