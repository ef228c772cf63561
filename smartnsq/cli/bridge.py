"""``smartnsq bridge``: consume a topic on one cluster and publish it to another (like
``nsq_to_nsq``; the migration path from stock NSQ to youzan NSQ).

A message is finished on the source only after the destination acknowledged it, so nothing
is lost (at-least-once: a crash between the two may publish a message twice). With
``--shard-key-field`` (JSON messages) it is published ordered on the destination: one key's
messages keep their source order and land on the key's murmur3 partition.

An ordered youzan source is read with ``--ordered`` (SUB_ORDERED, through ``--from-lookupd``):
each partition hands over one message at a time and its next one only after this one was
published, so each partition's order is kept. Without ``--shard-key-field`` source partition
``p`` goes to destination partition ``p`` modulo the destination's partition count (a
destination without partitions takes them in the order they come).

The destination is dialled before anything is read: while no destination nsqd accepts a
connection, the reason is on stderr, and after ``--connect-timeout`` the command fails with
it. Later, while the destination refuses every publish, each message goes back to the source
(with a warning on stderr), and after ``--connect-timeout`` of that the command stops with
an error, since every retry costs the source channel one more attempt per message.

With ``-n COUNT`` no more is taken than forwarded (as ``tail -n``): max-in-flight is capped
at the count, and a message that arrives while the last publishes are out is held until they
are answered, then forwarded in place of a failed one or requeued once, without backoff.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Sequence
from typing import Any

import click

from smartnsq.cli.common import (
    CliError,
    cluster_options,
    command_runner,
    describe,
    err_print,
    pick_cluster,
    stderr_console,
    stop_event,
    topic_argument,
)
from smartnsq.cli.connections import (
    POLL_SECONDS,
    REMIND_SECONDS,
    connect_timeout_option,
    consume_watched,
    refuse_unordered,
)
from smartnsq.cli.metrics import metrics_options
from smartnsq.cli.publish import _check_topic
from smartnsq.cli.tail import topic_view
from smartnsq.config import ConnectionConfig, ConsumerConfig, ProducerConfig
from smartnsq.conn import Connection
from smartnsq.consumer import Consumer
from smartnsq.message import Message
from smartnsq.ordered import OrderedConsumer
from smartnsq.producer import Producer
from smartnsq.protocol.validation import parse_tcp_address

EPILOG = """\b
Examples:
  smartnsq bridge orders --from-lookupd old:4161 --to-lookupd new:4161
  smartnsq bridge orders orders_v2 --from-nsqd old:4150 --to-lookupd new:4161 \\
      --shard-key-field customer_id
  smartnsq bridge payments --from-lookupd old:4161 --to-lookupd new:4161 --ordered
"""

#: seconds between two rounds of dials to an unreachable destination
REDIAL_SECONDS = 0.5


class Forwarder:
    """The source consumer's handler: publish to the destination, then return (FIN)."""

    def __init__(self, producer: Producer, topic: str, field: list[str] | None,
                 limit: int | None = None, partitions: int | None = None) -> None:
        self.producer = producer
        self.topic = topic
        self.field = field
        self.limit = limit
        #: the destination's partition count a source partition is mapped onto (None: the
        #: producer chooses)
        self.partitions = partitions
        #: publishes started (a failed one is taken back) and acknowledged
        self.started = 0
        self.forwarded = 0
        self.done = asyncio.Event()
        self.error: CliError | None = None
        self.failed = asyncio.Event()
        #: the run is ending (before the consumer stops): held messages go back
        self.ending = False
        #: set and replaced whenever a held message may proceed (see _claim)
        self._change = asyncio.Event()
        #: loop time of the first failed publish since the last acknowledged one
        self.failing_since: float | None = None
        self.last_failure = ""
        #: the publishes under way, each in a cancel scope (see _abandon)
        self._publishing: set[asyncio.Timeout] = set()

    def shard_key(self, msg: Message) -> str | int:
        assert self.field is not None
        name = ".".join(self.field)
        try:
            doc: Any = json.loads(msg.body)
        except ValueError as exc:
            raise CliError(f"message {msg.id.hex()}: not JSON ({exc}); --shard-key-field "
                           "needs JSON messages") from None
        for part in self.field:
            if not isinstance(doc, dict) or part not in doc:
                raise CliError(f"message {msg.id.hex()}: no field {name!r} in the JSON object")
            doc = doc[part]
        if isinstance(doc, bool) or not isinstance(doc, str | int) or doc == "":
            raise CliError(f"message {msg.id.hex()}: field {name!r} is {json.dumps(doc)}; a "
                           "shard key must be a non-empty string or an integer")
        return doc

    async def __call__(self, msg: Message) -> None:
        if not await self._claim():
            # not needed (past the count, or stopping): back once, untouched, no backoff
            msg.requeue(0, backoff=False)
            return
        try:
            abandoned = await self._publish_in_scope(msg)
        except CliError as exc:
            # a message we cannot route: stop rather than drop or loop on it
            self.error = exc
            self.failed.set()
            self._take_back()
            msg.requeue(0, backoff=False)
            return
        except Exception as exc:
            self._take_back()
            self._note_failure(exc)
            raise  # requeued with backoff; the destination may be back soon
        except BaseException:
            self._take_back()
            raise
        if abandoned:
            self._take_back()
            msg.requeue(0, backoff=False)
            return
        self.failing_since = None
        self.forwarded += 1
        if self.limit is not None and self.forwarded >= self.limit:
            self.done.set()

    async def _publish_in_scope(self, msg: Message) -> bool:
        """Publish ``msg``; True when :meth:`_abandon` gave the publish up."""
        scope = asyncio.timeout(None)
        try:
            async with scope:
                self._publishing.add(scope)
                try:
                    await self._publish(msg)
                finally:
                    self._publishing.discard(scope)
        except TimeoutError:
            if scope.expired():
                return True
            raise
        return False

    def _abandon(self) -> None:
        """Give up the publishes under way: the destination has failed for the whole bound,
        and the consumer's stop would otherwise wait out their retries."""
        now = asyncio.get_running_loop().time()
        for scope in self._publishing:
            scope.reschedule(now)

    async def _publish(self, msg: Message) -> None:
        if self.field is not None:
            await self.producer.publish_ordered(self.topic, self.shard_key(msg), msg.body)
        elif self.partitions is not None and msg.partition is not None:
            await self.producer.publish(self.topic, msg.body,
                                        partition=msg.partition % self.partitions)
        else:
            await self.producer.publish(self.topic, msg.body)

    def _wanted(self) -> bool:
        if self.failed.is_set() or self.done.is_set():
            return False
        return self.limit is None or self.started < self.limit

    async def _claim(self) -> bool:
        """Whether to forward the message: yes while wanted; otherwise (at the count with
        publishes still out, or the run is ending) it is held until a publish fails (then
        it goes instead) or :meth:`end`, so a message not needed is requeued once, after
        the consumer's RDY 0, rather than bounced back and forth meanwhile."""
        while not self.ending:
            if self._wanted():
                self.started += 1
                return True
            await self._change.wait()
        return False

    def _take_back(self) -> None:
        self.started -= 1
        self._changed()

    def _changed(self) -> None:
        self._change.set()
        self._change = asyncio.Event()

    def _note_failure(self, exc: Exception) -> None:
        if self.failing_since is None:
            self.failing_since = asyncio.get_running_loop().time()
        self.last_failure = describe(exc)

    async def end(self) -> None:
        """Before the consumer stops: held messages go back to the source. Woken one loop
        turn later, so that the consumer's stop (started next) sends RDY 0 before their
        REQs: nsqd must not hand them straight back to us."""
        self.ending = True
        asyncio.get_running_loop().call_soon(self._changed)

    async def watch_destination(self, bound: float) -> None:
        """Beside the consumer: while publishes fail, say so on stderr (at once, then every
        :data:`REMIND_SECONDS`); after ``bound`` seconds without an acknowledged publish (0:
        never) set the error and stop the run."""
        loop = asyncio.get_running_loop()
        shown_at: float | None = None
        while True:
            since, now = self.failing_since, loop.time()
            if since is None:
                shown_at = None  # the next outage is told at once
            elif bound and now - since >= bound:
                self.error = CliError(f"the destination accepted no publish for {bound:g} s "
                                      f"(--connect-timeout): {self.last_failure}")
                self.failed.set()
                self._abandon()
                return
            elif shown_at is None or now - shown_at >= REMIND_SECONDS:
                err_print(f"smartnsq: warning: destination: {self.last_failure}; the message "
                          f"went back to the source{_retrying(bound)}")
                shown_at = now
            await asyncio.sleep(POLL_SECONDS)


def _retrying(bound: float) -> str:
    return f"; retrying for up to {bound:g} s (--connect-timeout)" if bound else "; retrying"


async def _refusal(address: str, config: ConnectionConfig) -> str | None:
    """Why the nsqd at ``address`` refused a connection (dial and IDENTIFY), None if not."""
    host, port = parse_tcp_address(address)
    conn = Connection(host, port, config)
    try:
        await conn.connect()
    except Exception as exc:  # any failure to connect is the answer here
        text = describe(exc)
        return text if address in text else f"nsqd {address}: {text}"
    await conn.close()
    return None


async def reach_destination(addresses: Sequence[str], config: ConnectionConfig,
                            bound: float) -> None:
    """Return once one of the destination's nsqd ``addresses`` accepts a connection. Until
    then the reason is on stderr (at once, then every :data:`REMIND_SECONDS`); after
    ``bound`` seconds (0: never) raise :class:`CliError` with it. Nothing has been read
    from the source yet, so failing here costs it nothing."""
    loop = asyncio.get_running_loop()
    began, shown_at = loop.time(), None
    why = ""
    while True:
        left = began + bound - loop.time() if bound else None
        try:
            async with asyncio.timeout(left):
                refusals = await asyncio.gather(*(_refusal(a, config) for a in addresses))
        except TimeoutError:
            # the bound ran out during this round: the previous round's reason is the news
            why = why or "; ".join(f"nsqd {a}: no answer" for a in addresses)
        else:
            if None in refusals:
                return
            why = "; ".join(r for r in refusals if r is not None)
        now = loop.time()
        if bound and now - began >= bound:
            raise CliError(f"no destination nsqd accepted a connection within {bound:g} s "
                           f"(--connect-timeout): {why}")
        if shown_at is None or now - shown_at >= REMIND_SECONDS:
            err_print(f"smartnsq: warning: cannot reach the destination: {why}{_retrying(bound)}")
            shown_at = now
        await asyncio.sleep(REDIAL_SECONDS if left is None else min(REDIAL_SECONDS, left))


@click.command(epilog=EPILOG)
@click.argument("topic", callback=topic_argument)
@click.argument("dest_topic", required=False, callback=topic_argument)
@cluster_options(prefix="from-")
@cluster_options(prefix="to-")
@click.option("--channel", default="nsq_to_nsq", show_default=True,
              help="source channel")
@click.option("--shard-key-field", metavar="NAME",
              help="JSON messages: publish ordered on the destination by this field")
@click.option("--ordered", is_flag=True,
              help="youzan: read an ordered source topic (SUB_ORDERED, needs --from-lookupd): "
                   "one message at a time per partition, published before the next is read; "
                   "source partition P goes to destination partition P (modulo its partition "
                   "count) unless --shard-key-field says otherwise")
@click.option("--max-in-flight", type=click.IntRange(min=1), default=200, show_default=True)
@click.option("-n", "count", type=click.IntRange(min=1),
              help="exit after forwarding COUNT messages (no more are taken; the others "
                   "go back once)")
@connect_timeout_option()
@metrics_options
@command_runner
async def bridge(topic: str, dest_topic: str | None, from_lookupd: tuple[str, ...],
                 from_nsqd: tuple[str, ...], to_lookupd: tuple[str, ...],
                 to_nsqd: tuple[str, ...], channel: str, shard_key_field: str | None,
                 ordered: bool, max_in_flight: int, count: int | None,
                 connect_timeout: float) -> None:
    """Forward TOPIC from one cluster to DEST_TOPIC (default: the same name) on another,
    finishing each message on the source only after the destination acknowledged it.
    Ctrl-C stops gracefully.

    The destination must accept a connection before anything is read, within
    --connect-timeout; once running, a destination that refuses every publish for
    --connect-timeout ends the command with an error (the messages stay in the source
    channel)."""
    source = pick_cluster(from_lookupd, from_nsqd, prefix="from-")
    dest = pick_cluster(to_lookupd, to_nsqd, prefix="to-")
    if ordered and source.nsqd:
        raise click.UsageError("--ordered needs --from-lookupd (an ordered topic is read per "
                               "partition, which the lookupds publish)")
    dest_name = dest_topic or topic
    field = None
    if shard_key_field is not None:
        field = shard_key_field.split(".")
        if not all(field):
            raise click.BadParameter(f"malformed field name {shard_key_field!r}",
                                     param_hint="--shard-key-field")
        if dest.nsqd:
            raise click.UsageError("--shard-key-field needs --to-lookupd (the partition count "
                                   "comes from the destination topic's lookup)")
    pconfig = ProducerConfig(publish_timeout=30.0, lookupd_poll_interval=15.0)
    producer = (Producer(nsqd=dest.nsqd, config=pconfig) if dest.nsqd
                else Producer(lookupd=dest.lookupd, config=pconfig))
    stop = stop_event()
    # sharded publishing keeps one key's order only for messages handed over in order
    in_flight = max_in_flight if field is None else 1
    async with producer:
        dest_parts = None
        dest_nodes: Sequence[str] = dest.nsqd
        if producer.lookup is not None:
            view = await _check_topic(producer.lookup, dest_name)
            dest_parts = view.partition_num if view.is_partitioned else None
            dest_nodes = sorted(view.nodes)
        await reach_destination(dest_nodes, pconfig.connection, connect_timeout)
        forwarder = Forwarder(producer, dest_name, field, count,
                              partitions=dest_parts if ordered else None)
        events = (stop, forwarder.failed, forwarder.done)
        watch = [functools.partial(forwarder.watch_destination, connect_timeout)]
        if source.nsqd:
            consumer = Consumer(topic, channel, forwarder, nsqd=list(source.nsqd),
                                config=_config(in_flight, count, len(source.nsqd)))
            await consume_watched(consumer, *events, connect_timeout=connect_timeout,
                                  lookupd_flag="--from-lookupd", guards=watch,
                                  before_stop=forwarder.end)
        else:
            async with source.lookup(poll_interval=15.0) as lk:
                src = await topic_view(lk, topic)
                refuse_unordered(src, ordered)
                sources = src.partition_num if src.is_partitioned else len(src.nodes)
                if ordered:
                    # one message at a time per partition already: each needs a RDY
                    consumer = OrderedConsumer(
                        topic, channel, forwarder, lookupd=lk,
                        config=_config(max(max_in_flight, src.partition_num), count, sources))
                else:
                    consumer = Consumer(topic, channel, forwarder, lookupd=lk,
                                        config=_config(in_flight, count, sources))
                await consume_watched(consumer, *events, connect_timeout=connect_timeout,
                                      lookupd_flag="--from-lookupd", guards=watch,
                                      before_stop=forwarder.end)
    if forwarder.error is not None:
        raise CliError(f"{forwarder.error.message} (after {forwarder.forwarded} message(s) "
                       f"were forwarded; the others stay in source channel {channel})")
    stderr_console().print(f"forwarded {forwarder.forwarded} message(s) from {topic} to "
                           f"{dest_name}", highlight=False, soft_wrap=True)


def _config(max_in_flight: int, count: int | None, sources: int) -> ConsumerConfig:
    """With ``-n`` no more is taken than forwarded, except that every subscription (nsqd
    or partition) gets one RDY, as ``tail -n`` does; the Forwarder sends the rest back once."""
    if count is not None:
        max_in_flight = min(max_in_flight, max(count, sources))
    return ConsumerConfig(max_in_flight=max_in_flight, drain_timeout=30.0,
                          lookupd_poll_interval=15.0, max_attempts=0,
                          default_requeue_delay=1.0)
