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
it. Later, while the destination refuses every publish, each message taken is held (touched
on the source, so it is not redelivered meanwhile) and its publish retried, with a warning
on stderr; after ``--connect-timeout`` of that the command stops with an error and the held
messages go back to the source once. A message the destination refuses for good (larger
than its max message size, a bad topic, not authorized) is not retried: the command stops
with the destination's reason and the message stays in the source channel.

With ``-n COUNT`` no more is taken than forwarded (as ``tail -n``): max-in-flight is capped
at the count, and a message that arrives while the last publishes are out is held until they
are answered, then forwarded in place of a failed one or requeued once, without backoff.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import click

from smartnsq.cli.bridge_forward import Forwarder
from smartnsq.cli.bridge_reach import reach_destination
from smartnsq.cli.common import (
    CliError,
    channel_argument,
    cluster_options,
    pick_cluster,
    stderr_console,
    topic_argument,
    unless_stopped,
)
from smartnsq.cli.connections import connect_timeout_option, consume_watched, refuse_unordered
from smartnsq.cli.metrics import metrics_options
from smartnsq.cli.publish import _check_topic
from smartnsq.cli.records import shard_rule
from smartnsq.cli.stopping import command_runner, stop_event
from smartnsq.cli.tail import topic_view
from smartnsq.cli.wire import connection_config, tcp_wire_options
from smartnsq.protocol.validation import parse_tcp_address

# the clients load when the command runs (once its stop event holds Ctrl-C), not for --help
if TYPE_CHECKING:
    from smartnsq.config import ConsumerConfig

EPILOG = """\b
Examples:
  smartnsq bridge orders --from-lookupd old:4161 --to-lookupd new:4161
  smartnsq bridge orders orders_v2 --from-nsqd old:4150 --to-lookupd new:4161 \\
      --shard-key-field customer_id
  smartnsq bridge payments --from-lookupd old:4161 --to-lookupd new:4161 --ordered
"""

@click.command(epilog=EPILOG)
@click.argument("topic", callback=topic_argument)
@click.argument("dest_topic", required=False, callback=topic_argument)
@cluster_options(prefix="from-")
@cluster_options(prefix="to-")
@click.option("--channel", default="nsq_to_nsq", show_default=True,
              callback=channel_argument, help="source channel")
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
@tcp_wire_options("from-", "the source's nsqd")
@tcp_wire_options("to-", "the destination's nsqd")
@metrics_options
@command_runner
async def bridge(topic: str, dest_topic: str | None, from_lookupd: tuple[str, ...],
                 from_nsqd: tuple[str, ...], to_lookupd: tuple[str, ...],
                 to_nsqd: tuple[str, ...], channel: str, shard_key_field: str | None,
                 ordered: bool, max_in_flight: int, count: int | None,
                 connect_timeout: float) -> None:
    """Forward TOPIC from one cluster to DEST_TOPIC (default: the same name) on another,
    finishing each message on the source only after the destination acknowledged it.
    Ctrl-C stops gracefully: messages held go back to the source once (a publish still
    unanswered after 5 s is given up).

    The destination must accept a connection before anything is read, within
    --connect-timeout; once running, messages are held (touched on the source) while
    their publishes are retried, and a destination that refuses every publish for
    --connect-timeout ends the command with an error. A message the destination refuses
    for good (larger than its max message size, a bad topic, not authorized) ends it at
    once with the destination's reason. Either way the messages stay in the source
    channel. TOPIC into itself on the same nsqd is refused (give DEST_TOPIC)."""
    source = pick_cluster(from_lookupd, from_nsqd, prefix="from-")
    dest = pick_cluster(to_lookupd, to_nsqd, prefix="to-")
    if ordered and source.nsqd:
        raise click.UsageError("--ordered needs --from-lookupd (an ordered topic is read per "
                               "partition, which the lookupds publish)")
    dest_name = dest_topic or topic
    if dest_name == topic and (there := _shared(source.nsqd, dest.nsqd)):
        raise click.UsageError(_loop_text(topic, "--from-nsqd and --to-nsqd", there))
    rule = shard_rule(shard_key_field, None)
    if rule is not None and dest.nsqd:
        raise click.UsageError("--shard-key-field needs --to-lookupd (the partition count "
                               "comes from the destination topic's lookup)")
    stop = stop_event()
    # imported once Ctrl-C sets ``stop``: one during the import stops bridge as later ones do
    from smartnsq.config import ProducerConfig
    from smartnsq.consumer import Consumer
    from smartnsq.ordered import OrderedConsumer
    from smartnsq.producer import Producer

    pconfig = ProducerConfig(publish_timeout=30.0, lookupd_poll_interval=15.0,
                             connection=connection_config("to-", heartbeat_interval=30.0))
    producer = (Producer(nsqd=dest.nsqd, config=pconfig) if dest.nsqd
                else Producer(lookupd=dest.lookupd, config=pconfig))
    # sharded publishing keeps one key's order only for messages handed over in order
    in_flight = max_in_flight if rule is None else 1
    async with producer:
        dest_parts = None
        dest_nodes: Sequence[str] = dest.nsqd
        if producer.lookup is not None:
            view = await unless_stopped(_check_topic(producer.lookup, dest_name), stop)
            dest_parts = view.partition_num if view.is_partitioned else None
            dest_nodes = sorted(view.nodes)
        await unless_stopped(reach_destination(producer, dest_nodes, connect_timeout), stop)
        forwarder = Forwarder(producer, dest_name, rule, count,
                              partitions=dest_parts if ordered else None,
                              destination=_named(dest.nsqd, dest.lookupd))
        if dest_name == topic and (there := _shared(source.nsqd, dest_nodes)):
            # told on the first message, not now: a refusal of the subscription (an ordered
            # topic read without --ordered) says more, and comes first
            forwarder.refuse(CliError(_loop_text(
                topic, "--from-nsqd and the destination's lookup", there)))
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
                src = await unless_stopped(topic_view(lk, topic), stop)
                refuse_unordered(src, ordered)
                # after refuse_unordered: that refusal says more
                if dest_name == topic and (there := _shared(src.nodes, dest_nodes)):
                    raise CliError(_loop_text(
                        topic, "the source's lookup and the destination", there))
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


_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})


def _place(address: str) -> tuple[str, int]:
    host, port = parse_tcp_address(address)
    host = host.lower()
    return ("127.0.0.1" if host in _LOOPBACK else host), port


def _shared(source: Iterable[str], dest: Iterable[str]) -> list[str]:
    """The nsqd addresses of ``source`` that ``dest`` names too (loopback names taken as
    one). Checked addresses: parsing them again cannot fail."""
    places = {_place(a) for a in dest}
    return [a for a in source if _place(a) in places]


def _loop_text(topic: str, where: str, shared: Sequence[str]) -> str:
    return (f"source and destination are the same: topic {topic} on {', '.join(shared)} "
            f"({where}); each message would be forwarded to itself for ever. Give "
            "DEST_TOPIC, or a destination in another cluster")


def _named(nsqd: Sequence[str], lookupd: Sequence[str]) -> str:
    if nsqd:
        return "nsqd " + ", ".join(nsqd)
    return "lookupd " + ", ".join(lookupd)


def _config(max_in_flight: int, count: int | None, sources: int) -> ConsumerConfig:
    """With ``-n`` no more is taken than forwarded, except that every subscription (nsqd
    or partition) gets one RDY, as ``tail -n`` does; the Forwarder sends the rest back once."""
    from smartnsq.config import ConsumerConfig

    if count is not None:
        max_in_flight = min(max_in_flight, max(count, sources))
    return ConsumerConfig(max_in_flight=max_in_flight, drain_timeout=30.0,
                          lookupd_poll_interval=15.0, max_attempts=0,
                          default_requeue_delay=1.0, connection=connection_config("from-"))
