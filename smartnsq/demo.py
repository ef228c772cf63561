"""The README's main job: an end-to-end demonstration on the embedded youzan cluster.

``python -m smartnsq.demo`` (``make demo``) starts a 3-node youzan cluster with one lookupd in
this process, creates a 4-partition ordered topic with two replicas per partition, and starts
an :class:`~smartnsq.ordered.OrderedConsumer` on it. One publishing task per shard key then
sends that key's sequence numbers in order with ``publish_ordered`` (bodies ``key:seq``), all
keys at once; halfway through, the leadership of two partitions moves to their other replica.
When every acknowledged message has been handled, the demo checks that

* every acknowledged ``(key, seq)`` was handled at least once;
* per key, the sequence numbers never decrease in handling order;
* every message arrived on the partition :func:`~smartnsq.ordered.shard_partition` names;
* the consumer's offset validation saw no gap and no violation, and its final position of
  every partition is the last record of that partition;

and prints a summary (addresses, counts per partition, leader moves, redeliveries,
throughput). Then, on the same cluster, the Spark stage (:mod:`smartnsq.demo_spark`, skipped
with ``--no-spark`` or without Java/pyspark) streams the topic through Spark with a checkpoint,
stopped and restarted, and checks every message is counted exactly once. The exit code is 0
only when every check holds.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import logging
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from smartnsq.config import ConnectionConfig, ConsumerConfig, ProducerConfig
from smartnsq.devcluster import DevCluster
from smartnsq.message import Message
from smartnsq.ordered import OrderedConsumer
from smartnsq.producer import Producer
from smartnsq.sharding import shard_partition

__all__ = ["DemoSummary", "LeaderMove", "PartitionSummary", "main", "render", "run_demo"]

TOPIC = "demo_orders"
CHANNEL = "demo"
PARTITIONS = 4
REPLICAS = 2
NODES = 3
#: partitions whose leader moves halfway through publishing
MOVES = 2

DEFAULT_MESSAGES = 50_000
DEFAULT_KEYS = 500
DEFAULT_SEED = 7
#: bound on the whole run after the cluster is up (publishing and consuming)
DEFAULT_TIMEOUT = 120.0

Report = Callable[[str], None]


# ---------------------------------------------------------------------------- results


@dataclass(frozen=True, slots=True)
class LeaderMove:
    """One leadership move made while publishing."""

    partition: int
    from_node: str
    from_address: str
    to_node: str
    to_address: str
    #: messages acknowledged when the move was made
    after_published: int


@dataclass(frozen=True, slots=True)
class PartitionSummary:
    partition: int
    #: shard keys that map to this partition
    keys: int
    #: acknowledged messages sharded to this partition
    published: int
    #: records the partition holds (a publish retried after a leader move may be stored twice)
    stored: int
    #: handler calls for messages of this partition (redeliveries included)
    deliveries: int
    #: the consumer's position: offset of the last finished message
    position: int | None
    #: offset of the partition's last record
    last_offset: int | None
    #: ``node id address`` of the leader at the end
    leader: str
    leader_address: str
    #: the address the consumer is subscribed to at the end
    subscribed: str | None
    gaps: int
    violations: int
    redeliveries: int


@dataclass(frozen=True, slots=True)
class DemoSummary:
    """What :func:`run_demo` saw; :attr:`ok` is True when every check held."""

    lookupd_http_addresses: tuple[str, ...]
    #: ``(node id, TCP address)`` of every nsqd
    nsqds: tuple[tuple[str, str], ...]
    topic: str
    channel: str
    partition_num: int
    replicas: int
    keys: int
    seed: int
    #: messages the run set out to publish
    messages: int
    #: messages acknowledged by the cluster
    published: int
    #: records stored over all partitions
    stored: int
    #: distinct acknowledged ``(key, seq)`` pairs handled
    consumed: int
    #: handler calls (redeliveries and duplicate records included)
    deliveries: int
    #: handler calls that repeated an already handled ``(key, seq)``
    redeliveries: int
    #: deliveries the server marked as a redelivery (attempts > 1)
    redelivered_attempts: int
    #: acknowledged pairs never handled
    missing: int
    #: keys whose sequence numbers went down in handling order
    out_of_order_keys: tuple[str, ...]
    #: messages that arrived on another partition than shard_partition() names
    misplaced: int
    #: bodies that are not ``key:seq`` of a published message
    unexpected: int
    gaps: int
    violations: int
    #: messages the consumer requeued (a handler failure; none expected)
    requeued: int
    #: lookup refreshes the producer made (a leader move answers E_FAILED_ON_NOT_LEADER)
    producer_refreshes: int
    partitions: tuple[PartitionSummary, ...]
    leader_moves: tuple[LeaderMove, ...]
    publish_errors: tuple[str, ...]
    consumer_error: str | None
    timed_out: bool
    publish_seconds: float
    consume_seconds: float
    elapsed: float
    failures: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def order_held(self) -> bool:
        return not self.out_of_order_keys and self.violations == 0

    @property
    def publish_rate(self) -> float:
        return self.published / self.publish_seconds if self.publish_seconds > 0 else 0.0

    @property
    def consume_rate(self) -> float:
        return self.consumed / self.consume_seconds if self.consume_seconds > 0 else 0.0


# ---------------------------------------------------------------------------- the run


class _Tally:
    """What the handler records, plus the wait for "everything acknowledged was handled"."""

    def __init__(self, keys: Sequence[str], plan: Sequence[int], partition_num: int) -> None:
        self.keys = list(keys)
        self.index = {k: i for i, k in enumerate(keys)}
        self.plan = list(plan)
        self.expected_partition = [shard_partition(k, partition_num) for k in keys]
        self.acked = [0] * len(keys)
        self.seen = [bytearray(n) for n in plan]
        #: per key: sequence numbers in handling order
        self.handled: list[list[int]] = [[] for _ in keys]
        self.deliveries = 0
        self.per_partition: dict[int, int] = {}
        self.redelivered_attempts = 0
        self.misplaced = 0
        self.unexpected = 0
        self.first_delivery: float | None = None
        self.last_new: float = 0.0
        # set once publishing is over: the acknowledged pairs still to be handled
        self._remaining: int | None = None
        self.done = asyncio.Event()

    async def handler(self, msg: Message) -> None:
        now = time.perf_counter()
        if self.first_delivery is None:
            self.first_delivery = now
        self.deliveries += 1
        part = msg.partition
        if part is not None:
            self.per_partition[part] = self.per_partition.get(part, 0) + 1
        if msg.attempts > 1:
            self.redelivered_attempts += 1
        key, sep, seq_text = msg.body.decode("utf-8", "replace").rpartition(":")
        i = self.index.get(key)
        if not sep or i is None or not seq_text.isdigit() or int(seq_text) >= self.plan[i]:
            self.unexpected += 1
            return
        seq = int(seq_text)
        if part != self.expected_partition[i]:
            self.misplaced += 1
        self.handled[i].append(seq)
        flags = self.seen[i]
        if not flags[seq]:
            flags[seq] = 1
            self.last_new = now
            if self._remaining is not None and seq < self.acked[i]:
                self._remaining -= 1
                if self._remaining <= 0:
                    self.done.set()

    def publishing_over(self) -> None:
        """The acknowledged counts are final: count what is still to be handled."""
        self._remaining = sum(
            1 for i, n in enumerate(self.acked) for s in range(n) if not self.seen[i][s])
        if self._remaining <= 0:
            self.done.set()

    def missing(self) -> int:
        return sum(1 for i, n in enumerate(self.acked) for s in range(n) if not self.seen[i][s])

    def out_of_order(self) -> list[str]:
        bad = []
        for i, seqs in enumerate(self.handled):
            if any(b < a for a, b in itertools.pairwise(seqs)):
                bad.append(self.keys[i])
        return bad


def make_keys(count: int, seed: int) -> list[str]:
    """``count`` distinct shard keys (customer ids), the same for the same seed."""
    rng = random.Random(seed)
    return [f"cust-{n:08d}" for n in rng.sample(range(100_000_000), count)]


def plan_messages(messages: int, keys: int) -> list[int]:
    """Messages per key: ``messages`` spread as evenly as possible."""
    base, extra = divmod(messages, keys)
    return [base + (1 if i < extra else 0) for i in range(keys)]


def _consumer_config() -> ConsumerConfig:
    return ConsumerConfig(
        max_in_flight=PARTITIONS * 8,
        # a subscription lost with a leader move re-polls the lookupd at once; the
        # periodic poll is only a backstop here
        lookupd_poll_interval=2.0,
        lookupd_poll_jitter=0.2,
        reconnect_min=0.05,
        reconnect_max=0.5,
        rdy_redistribute_interval=0.5,
        ordered_retry_pause=0.05,
        drain_timeout=5.0,
        connection=ConnectionConfig(dial_timeout=1.0, close_timeout=2.0),
    )


def _producer_config() -> ProducerConfig:
    return ProducerConfig(publish_timeout=10.0, max_attempts=8, reconnect_min=0.02,
                          reconnect_max=0.5)


async def run_demo(messages: int = DEFAULT_MESSAGES, keys: int = DEFAULT_KEYS,
                   seed: int = DEFAULT_SEED, *, time_limit: float = DEFAULT_TIMEOUT,
                   report: Report | None = None,
                   then: Callable[[DevCluster, DemoSummary], Awaitable[None]] | None = None
                   ) -> DemoSummary:
    """Run the demonstration and return what it saw (see the module docstring).

    ``report`` receives progress lines as they happen (``main`` prints them).
    ``time_limit`` (seconds) bounds publishing and consuming together; when it runs out
    the summary says so and counts what is missing. ``then`` is awaited with the cluster and
    the summary before the cluster stops (the Spark stage runs there).
    """
    if messages < 1 or keys < 1:
        raise ValueError("messages and keys must be at least 1")
    if keys > messages:
        raise ValueError("keys must not exceed messages (every key publishes at least one)")
    say: Report = report if report is not None else (lambda _line: None)
    started = time.perf_counter()
    rng = random.Random(seed)
    key_names = make_keys(keys, seed)
    plan = plan_messages(messages, keys)
    tally = _Tally(key_names, plan, PARTITIONS)
    moves: list[LeaderMove] = []
    publish_errors: list[str] = []
    timed_out = False
    consumer_error: str | None = None

    async with DevCluster(nodes=NODES, lookupds=1, flavour="youzan") as cluster:
        cluster.create_topic(TOPIC, partition_num=PARTITIONS, replica=REPLICAS, ordered=True,
                             channels=(CHANNEL,))
        nodes = cluster.nodes
        say(f"cluster up: lookupd http://{cluster.lookupd_http_addresses[0]}, "
            + ", ".join(f"{n.node_id} tcp {n.tcp_address}" for n in nodes))
        say(f"topic {TOPIC}: {PARTITIONS} partitions, replica {REPLICAS}, ordered; "
            f"channel {CHANNEL}; leaders "
            + ", ".join(f"{p}->{nodes[cluster.leader(TOPIC, p) or 0].node_id}"
                        for p in range(PARTITIONS)))

        consumer = OrderedConsumer(TOPIC, CHANNEL, tally.handler,
                                   lookupd=cluster.lookupd_http_addresses,
                                   config=_consumer_config())
        moved_parts = sorted(rng.sample(range(PARTITIONS), MOVES))
        halfway = asyncio.Event()
        half = messages // 2
        acked_total = 0
        pub_started = pub_ended = 0.0
        refreshes = 0

        async def move_leaders() -> None:
            await halfway.wait()
            for p in moved_parts:
                old = cluster.leader(TOPIC, p)
                try:
                    new = cluster.move_leader(TOPIC, p)
                except Exception as exc:  # reported; the summary counts the moves made
                    say(f"leader move of partition {p} failed: {exc!r}")
                    continue
                assert old is not None
                mv = LeaderMove(p, nodes[old].node_id, nodes[old].tcp_address,
                                nodes[new].node_id, nodes[new].tcp_address, acked_total)
                moves.append(mv)
                say(f"leader move: partition {p} {mv.from_node} ({mv.from_address}) -> "
                    f"{mv.to_node} ({mv.to_address}) after {mv.after_published:,} "
                    "messages were acknowledged")

        async def publish_key(producer: Producer, i: int) -> None:
            nonlocal acked_total
            key = key_names[i]
            for seq in range(plan[i]):
                try:
                    await producer.publish_ordered(TOPIC, key, f"{key}:{seq}".encode())
                except Exception as exc:
                    # the key's later messages are not sent: they would overtake this one
                    publish_errors.append(f"{key}:{seq}: {exc!r}")
                    return
                tally.acked[i] = seq + 1
                acked_total += 1
                if acked_total >= half:
                    halfway.set()

        mover = asyncio.create_task(move_leaders())
        try:
            async with asyncio.timeout(time_limit):
                await consumer.start()
                say(f"publishing {messages:,} messages over {keys:,} shard keys "
                    "(one ordered publishing task per key, all keys at once)")
                async with Producer(lookupd=cluster.lookupd_http_addresses,
                                    config=_producer_config()) as producer:
                    pub_started = time.perf_counter()
                    try:
                        await asyncio.gather(*(publish_key(producer, i) for i in range(keys)))
                    finally:
                        pub_ended = time.perf_counter()
                        refreshes = producer.refreshes
                tally.publishing_over()
                say(f"published {acked_total:,} messages in {pub_ended - pub_started:.2f} s; "
                    "waiting for the consumer")
                closed = asyncio.ensure_future(consumer.wait_closed())
                done = asyncio.ensure_future(tally.done.wait())
                try:
                    await asyncio.wait((closed, done), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for f in (closed, done):
                        f.cancel()
                    await asyncio.gather(closed, done, return_exceptions=True)
        except TimeoutError:
            timed_out = True
            if not pub_ended:
                pub_ended = time.perf_counter()
            say(f"timed out after {time_limit:g} s")
        finally:
            mover.cancel()
            await asyncio.gather(mover, return_exceptions=True)
            subscribed = {s.partition: s.address for s in consumer.stats().subscriptions
                          if s.connected}
            await consumer.stop()
        if consumer.error is not None:
            consumer_error = repr(consumer.error)
        stats = consumer.stats()

        partitions: list[PartitionSummary] = []
        for p in range(PARTITIONS):
            records = cluster.store.partition(TOPIC, p).records
            v = consumer.validator(p)
            leader = cluster.leader(TOPIC, p)
            members = [i for i in range(keys) if tally.expected_partition[i] == p]
            partitions.append(PartitionSummary(
                partition=p, keys=len(members),
                published=sum(tally.acked[i] for i in members), stored=len(records),
                deliveries=tally.per_partition.get(p, 0), position=consumer.position(p),
                last_offset=records[-1].offset if records else None,
                leader=nodes[leader].node_id if leader is not None else "-",
                leader_address=nodes[leader].tcp_address if leader is not None else "-",
                subscribed=subscribed.get(p), gaps=v.gaps, violations=v.violations,
                redeliveries=v.redeliveries))
        lookupds = tuple(cluster.lookupd_http_addresses)
        nsqds = tuple((n.node_id, n.tcp_address) for n in nodes)

        consumed = sum(1 for i, n in enumerate(tally.acked) for s in range(n)
                       if tally.seen[i][s])
        distinct = sum(sum(flags) for flags in tally.seen)
        summary = _with_failures(DemoSummary(
            lookupd_http_addresses=lookupds, nsqds=nsqds, topic=TOPIC,
            channel=CHANNEL, partition_num=PARTITIONS, replicas=REPLICAS, keys=keys, seed=seed,
            messages=messages, published=acked_total, stored=sum(p.stored for p in partitions),
            consumed=consumed, deliveries=tally.deliveries,
            redeliveries=tally.deliveries - tally.unexpected - distinct,
            redelivered_attempts=tally.redelivered_attempts, missing=tally.missing(),
            out_of_order_keys=tuple(tally.out_of_order()), misplaced=tally.misplaced,
            unexpected=tally.unexpected, gaps=sum(p.gaps for p in partitions),
            violations=sum(p.violations for p in partitions), requeued=stats.requeued,
            producer_refreshes=refreshes,
            partitions=tuple(partitions), leader_moves=tuple(moves),
            publish_errors=tuple(publish_errors), consumer_error=consumer_error,
            timed_out=timed_out, publish_seconds=pub_ended - pub_started,
            consume_seconds=(tally.last_new - tally.first_delivery
                             if tally.first_delivery is not None else 0.0),
            elapsed=time.perf_counter() - started))
        if then is not None:
            await then(cluster, summary)
    return summary


def _with_failures(s: DemoSummary) -> DemoSummary:
    problems: list[str] = []
    if s.timed_out:
        problems.append("the run timed out")
    if s.publish_errors:
        problems.append(f"{len(s.publish_errors)} publish(es) failed, first: "
                        f"{s.publish_errors[0]}")
    if s.published != s.messages:
        problems.append(f"{s.published:,} of {s.messages:,} messages acknowledged")
    if s.missing:
        problems.append(f"{s.missing:,} acknowledged messages never handled")
    if s.out_of_order_keys:
        problems.append(f"{len(s.out_of_order_keys)} key(s) out of order, first: "
                        f"{s.out_of_order_keys[0]}")
    if s.misplaced:
        problems.append(f"{s.misplaced:,} messages on another partition than their key's")
    if s.unexpected:
        problems.append(f"{s.unexpected:,} unexpected message bodies")
    if s.violations:
        problems.append(f"{s.violations} offset violation(s)")
    if s.gaps:
        problems.append(f"{s.gaps} offset gap(s)")
    if s.requeued:
        problems.append(f"{s.requeued} message(s) requeued")
    if s.consumer_error is not None:
        problems.append(f"the consumer stopped: {s.consumer_error}")
    if len(s.leader_moves) != MOVES:
        problems.append(f"{len(s.leader_moves)} leader move(s) made, {MOVES} planned")
    for p in s.partitions:
        if p.stored and p.position != p.last_offset:
            problems.append(f"partition {p.partition}: final position {p.position} is not "
                            f"the last record's offset {p.last_offset}")
        if p.subscribed is not None and p.subscribed != p.leader_address:
            problems.append(f"partition {p.partition}: consumer subscribed to {p.subscribed}, "
                            f"the leader is {p.leader} {p.leader_address}")
    return dataclasses.replace(s, failures=tuple(problems))


# ---------------------------------------------------------------------------- output


def render(s: DemoSummary) -> str:
    """The human summary of a run."""
    moved = {m.partition for m in s.leader_moves}
    lines = [
        "",
        "summary",
        f"  cluster        lookupd http://{', http://'.join(s.lookupd_http_addresses)}",
        "                 nsqd " + ", ".join(f"{nid} {addr}" for nid, addr in s.nsqds),
        f"  topic          {s.topic}: {s.partition_num} partitions, replica {s.replicas}, "
        f"ordered; channel {s.channel}",
        f"  messages       published {s.published:,} of {s.messages:,} over {s.keys:,} shard "
        f"keys, stored {s.stored:,}, consumed {s.consumed:,} ({s.deliveries:,} deliveries)",
        "  partition      keys  published  deliveries  final position  leader   moved  "
        "consumer on leader",
    ]
    for p in s.partitions:
        pos = "-" if p.position is None else f"{p.position:,}"
        on_leader = "-" if p.subscribed is None else \
            "yes" if p.subscribed == p.leader_address else f"no ({p.subscribed})"
        lines.append(f"  {p.partition:>9}  {p.keys:>8}  {p.published:>9,}  {p.deliveries:>10,}  "
                     f"{pos:>14}  {p.leader:<7}  {'yes' if p.partition in moved else 'no':<5}  "
                     f"{on_leader}")
    if s.leader_moves:
        for n, m in enumerate(s.leader_moves):
            lines.append(f"  {'leader moves' if n == 0 else '':<15}partition {m.partition}: "
                         f"{m.from_node} -> {m.to_node} after {m.after_published:,} "
                         "messages were acknowledged")
        lines.append(f"{'':<17}the producer re-routed after {s.producer_refreshes} lookup "
                     "refresh(es)")
    else:
        lines.append("  leader moves   none")
    dup_records = max(s.stored - s.published, 0)
    positions_ok = all(p.position == p.last_offset for p in s.partitions)
    misplaced = "yes" if s.misplaced == 0 else f"no ({s.misplaced:,} misplaced)"
    lines += [
        f"  redeliveries   {s.redeliveries:,} (server redeliveries with attempts > 1: "
        f"{s.redelivered_attempts:,}; records stored twice by a retried publish: "
        f"{dup_records:,})",
        f"  offsets        gaps {s.gaps}, violations {s.violations}; final positions are the "
        f"last records: {'yes' if positions_ok else 'no'}",
        f"  placement      every message on shard_partition(key, {s.partition_num}): "
        f"{misplaced}",
        f"  order held     {'yes' if s.order_held else 'no'}: per-key sequence numbers never "
        f"decreased in handling order for {s.keys - len(s.out_of_order_keys):,} of "
        f"{s.keys:,} keys",
        f"  throughput     publish {s.publish_rate:,.0f} msg/s ({s.publish_seconds:.2f} s), "
        f"consume {s.consume_rate:,.0f} msg/s ({s.consume_seconds:.2f} s)",
        f"  elapsed        {s.elapsed:.2f} s",
    ]
    if s.ok:
        lines.append("result: OK, every check held")
    else:
        lines.append("result: FAILED")
        lines += [f"  - {problem}" for problem in s.failures]
    return "\n".join(lines)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m smartnsq.demo",
        description="Sharded ordered publishing and ordered consumption on an embedded "
                    "3-node youzan NSQ cluster, with leader moves; prints a summary and "
                    "exits non-zero if a check fails.")
    parser.add_argument("--messages", type=int, default=DEFAULT_MESSAGES,
                        help=f"messages to publish (default {DEFAULT_MESSAGES:,})")
    parser.add_argument("--keys", type=int, default=DEFAULT_KEYS,
                        help=f"shard keys, one ordered publishing task each "
                             f"(default {DEFAULT_KEYS})")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED,
                        help="seed for key names and the partitions whose leader moves")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help=f"seconds allowed for publishing and consuming "
                             f"(default {DEFAULT_TIMEOUT:.0f})")
    parser.add_argument("--asyncio", action="store_true",
                        help="use the standard asyncio event loop even if uvloop is installed")
    parser.add_argument("--no-spark", action="store_true",
                        help="skip the Spark stage (smartnsq.demo_spark) after the ordered demo")
    args = parser.parse_args(argv)
    if args.messages < 1 or args.keys < 1:
        parser.error("--messages and --keys must be at least 1")
    if args.keys > args.messages:
        parser.error("--keys must not exceed --messages")
    if args.timeout <= 0:
        parser.error("--timeout must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    try:
        return _main(args)
    except BrokenPipeError:
        # the reader went away (| head): end quietly like the smartnsq commands do, not with
        # a traceback; later writes, and the interpreter's last flush, go nowhere
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 0


def _main(args: argparse.Namespace) -> int:
    # warnings (e.g. a gap) still show; the demo's own lines tell the story
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout,
                        format="  log: %(name)s: %(message)s")

    def say(line: str) -> None:
        print(line, flush=True)

    loop_name = "asyncio"
    runner: Callable[..., DemoSummary] = asyncio.run
    if not args.asyncio:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            loop_name = "uvloop"
            runner = uvloop.run
    say(f"smartnsq demo: {args.messages:,} ordered messages over {args.keys:,} shard keys on "
        f"an embedded {NODES}-node youzan cluster ({loop_name} event loop, seed {args.seed})")
    # the Spark stage runs on the same cluster, after the ordered demo's summary
    from smartnsq import demo_spark

    skip = ("--no-spark was given" if args.no_spark else
            "it needs --messages of 3 or more (it stops in the third micro-batch)"
            if args.messages < 3 else demo_spark.spark_missing_reason())
    stages: list[bool] = []
    rendered: list[DemoSummary] = []

    async def spark_stage(cluster: DevCluster, summary: DemoSummary) -> None:
        say(render(summary))
        rendered.append(summary)
        try:
            stage = await demo_spark.run_stage(cluster, TOPIC, report=say)
        except ValueError as exc:  # e.g. nothing was published
            say(f"spark stage: FAILED, not run: {exc}")
            stages.append(False)
            return
        say(demo_spark.render(stage))
        stages.append(stage.ok)

    try:
        summary = runner(run_demo(args.messages, args.keys, args.seed,
                                  time_limit=args.timeout, report=say,
                                  then=None if skip else spark_stage))
    except KeyboardInterrupt:
        say("interrupted")
        return 130  # the shell's code for a command ended by Ctrl-C
    if not rendered:
        say(render(summary))
    if skip:
        say(f"spark stage skipped: {skip}")
    return 0 if summary.ok and all(stages) else 1


if __name__ == "__main__":
    sys.exit(main())
