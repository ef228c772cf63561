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
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import click

from smartnsq.cli.common import (
    CliError,
    cluster_options,
    command_runner,
    pick_cluster,
    stderr_console,
    stop_event,
    topic_argument,
)
from smartnsq.cli.connections import connect_timeout_option, consume_watched, refuse_unordered
from smartnsq.cli.metrics import metrics_options
from smartnsq.cli.publish import _check_topic
from smartnsq.cli.tail import topic_view
from smartnsq.config import ConsumerConfig, ProducerConfig
from smartnsq.consumer import Consumer
from smartnsq.message import Message
from smartnsq.ordered import OrderedConsumer
from smartnsq.producer import Producer

EPILOG = """\b
Examples:
  smartnsq bridge orders --from-lookupd old:4161 --to-lookupd new:4161
  smartnsq bridge orders orders_v2 --from-nsqd old:4150 --to-lookupd new:4161 \\
      --shard-key-field customer_id
  smartnsq bridge payments --from-lookupd old:4161 --to-lookupd new:4161 --ordered
"""


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
        if self.failed.is_set() or (self.limit is not None and self.started >= self.limit):
            msg.requeue(0, backoff=False)
            return
        self.started += 1
        try:
            if self.field is not None:
                await self.producer.publish_ordered(self.topic, self.shard_key(msg), msg.body)
            elif self.partitions is not None and msg.partition is not None:
                await self.producer.publish(self.topic, msg.body,
                                            partition=msg.partition % self.partitions)
            else:
                await self.producer.publish(self.topic, msg.body)
        except CliError as exc:
            # a message we cannot route: stop rather than drop or loop on it
            self.error = exc
            self.failed.set()
            self.started -= 1
            msg.requeue(0, backoff=False)
            return
        except BaseException:
            self.started -= 1
            raise  # requeued with backoff; the destination may be back later
        self.forwarded += 1
        if self.limit is not None and self.forwarded >= self.limit:
            self.done.set()


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
              help="exit after forwarding COUNT messages")
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
    Ctrl-C stops gracefully."""
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
    async with producer:
        dest_parts = None
        if producer.lookup is not None:
            view = await _check_topic(producer.lookup, dest_name)
            dest_parts = view.partition_num if view.is_partitioned else None
        forwarder = Forwarder(producer, dest_name, field, count,
                              partitions=dest_parts if ordered else None)
        events = (stop, forwarder.failed, forwarder.done)
        if source.nsqd:
            consumer = Consumer(topic, channel, forwarder,
                                nsqd=list(source.nsqd),
                                config=_config(max_in_flight if field is None else 1))
            await consume_watched(consumer, *events, connect_timeout=connect_timeout,
                                  lookupd_flag="--from-lookupd")
        else:
            async with source.lookup(poll_interval=15.0) as lk:
                src = await topic_view(lk, topic)
                refuse_unordered(src, ordered)
                if ordered:
                    # one message at a time per partition already: each needs a RDY
                    consumer = OrderedConsumer(topic, channel, forwarder, lookupd=lk,
                                               config=_config(max(max_in_flight,
                                                                  src.partition_num)))
                else:
                    consumer = Consumer(topic, channel, forwarder, lookupd=lk,
                                        config=_config(max_in_flight if field is None else 1))
                await consume_watched(consumer, *events, connect_timeout=connect_timeout,
                                      lookupd_flag="--from-lookupd")
    if forwarder.error is not None:
        raise CliError(f"{forwarder.error.message} (after {forwarder.forwarded} message(s) "
                       "were forwarded; the failing one went back to the source)")
    stderr_console().print(f"forwarded {forwarder.forwarded} message(s) from {topic} to "
                           f"{dest_name}", highlight=False, soft_wrap=True)


def _config(max_in_flight: int) -> ConsumerConfig:
    # sharded publishing keeps one key's order only for messages handed over in order, so the
    # caller passes 1 with --shard-key-field (an ordered source hands them over in order)
    return ConsumerConfig(max_in_flight=max_in_flight, drain_timeout=30.0,
                          lookupd_poll_interval=15.0, max_attempts=0,
                          default_requeue_delay=1.0)
