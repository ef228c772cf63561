"""End to end on the embedded youzan cluster, through the public Producer and OrderedConsumer
together, and the partition-aware pool rule ("when the view changes the pool reconnects only
what changed") on both sides.

* 10,000 messages over 100 shard keys, ``Producer.publish_ordered`` and ``OrderedConsumer``
  running at the same time: everything consumed, per-key order in handling order, the
  partition of every message equal to an independent murmur3 computation, no violations.
* The same while a partition leader moves and a node restarts during publishing: every
  acknowledged publish consumed at least once, per-key order held (see
  :func:`order_problems` for the precise rule).
* Consumer pool: after one partition's leader moves (to its replica, or to a node that just
  joined) or its node stops, only that partition's subscription is closed and re-made;
  every other subscription keeps its Connection (seen from the client and, by port, from
  the servers). The embedded cluster cannot add partitions to a topic, so "partitions
  added" is not covered.
* Producer pool: after the same changes the pools of the nodes not involved keep their
  connections (on a plain leader move the old and new leader keep theirs too).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field

import pytest

from smartnsq.config import LookupConfig, ProducerConfig
from smartnsq.conn import Connection
from smartnsq.consumer import Consumer
from smartnsq.devcluster import DevCluster
from smartnsq.errors import OrderViolationError, PublishError
from smartnsq.lookup import Lookup
from smartnsq.message import Message
from smartnsq.ordered import OrderedConsumer, ViolationAction
from smartnsq.producer import Producer
from tests.consumer_support import eventually, fast_config, publish
from tests.test_producer_support import murmur3_32_reference

PARTITIONS = 4
KEYS = [f"key-{k:03d}" for k in range(100)]
PER_KEY = 100
#: a key's publish calls in flight at once
BURST = 10
CHANNEL = "e2e"
#: the independent placement rule: murmur3_32(key bytes, seed 0, unsigned) % partitions
EXPECTED_PARTITION = {k: murmur3_32_reference(k.encode(), 0) % PARTITIONS for k in KEYS}

PRODUCER_CONFIG = ProducerConfig(publish_timeout=10.0, reconnect_min=0.02, reconnect_max=0.2,
                                 max_attempts=8)


# --- recording what the consumer handles ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Handled:
    """One handler call, in handling order."""

    key: str
    seq: int
    partition: int | None
    nsqd: str
    internal_id: int | None
    offset: int | None
    raw_size: int | None
    attempts: int


@dataclass
class Recorder:
    """The consumer's handler: logs every call (in the order the handler is entered) and
    signals once every wanted (key, seq) was handled."""

    log: list[Handled] = field(default_factory=list)
    seen: set[tuple[str, int]] = field(default_factory=set)
    _missing: set[tuple[str, int]] | None = None
    _done: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, msg: Message) -> None:
        key, _, seq = msg.body.decode().rpartition(":")
        item = (key, int(seq))
        self.log.append(Handled(key, item[1], msg.partition, msg.nsqd_address,
                                msg.internal_id, msg.offset, msg.raw_size, msg.attempts))
        self.seen.add(item)
        if self._missing is not None:
            self._missing.discard(item)
            if not self._missing:
                self._done.set()

    async def wait_for_all(self, wanted: Iterable[tuple[str, int]], within: float) -> None:
        self._missing = set(wanted) - self.seen
        if not self._missing:
            return
        try:
            async with asyncio.timeout(within):
                await self._done.wait()
        except TimeoutError:
            missing = sorted(self._missing)
            raise AssertionError(f"{len(missing)} message(s) never consumed, e.g. "
                                 f"{missing[:10]}") from None

    def per_key(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = defaultdict(list)
        for h in self.log:
            out[h.key].append(h.seq)
        return out


def order_problems(seqs: list[int]) -> list[str]:
    """Where a key's handled sequence numbers break per-key order.

    The rule: a message handled for the first time must have a higher sequence number than
    every message of its key handled before it. So the sequence may only go backwards (or
    repeat) by re-handling a message already handled — a redelivery after a reconnect or a
    leader change resumes at the server's confirmed position, and a publish retried after a
    lost answer may be stored twice — while no message is ever handled for the first time
    after a later one of the same key. Equivalently: the first handlings alone are strictly
    increasing, and every step back lands on an already-handled message.
    """
    problems: list[str] = []
    seen: set[int] = set()
    high = -1
    for i, s in enumerate(seqs):
        if s in seen:
            continue  # re-handling: allowed wherever it happens
        if s <= high:
            problems.append(f"#{i}: {s} handled for the first time after {high}")
        seen.add(s)
        high = max(high, s)
    return problems


def test_order_problems_rule() -> None:
    """The order rule itself: what it accepts and what it rejects."""
    assert order_problems([0, 1, 2, 3]) == []
    assert order_problems([0, 1, 1, 2]) == []  # redelivery of the same message
    assert order_problems([0, 1, 2, 3, 1, 2, 3, 4]) == []  # resumed at an earlier position
    assert order_problems([0, 2, 4]) == []  # failed publishes leave holes
    assert order_problems([0, 2, 1]) != []  # 1 first handled after 2
    assert order_problems([0, 1, 3, 1, 2, 4]) != []  # 2 is new, 3 was handled before it
    assert order_problems([1, 0]) != []


# --- publishing -----------------------------------------------------------------------------


@dataclass
class Publishing:
    """Per-key publishers: one task per key, its messages in call order."""

    acked: set[tuple[str, int]] = field(default_factory=set)
    acked_order: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    failed: dict[tuple[str, int], BaseException] = field(default_factory=dict)
    #: (count, event): the event is set once ``count`` publishes were acknowledged
    milestones: list[tuple[int, asyncio.Event]] = field(default_factory=list)

    def at(self, count: int) -> asyncio.Event:
        ev = asyncio.Event()
        self.milestones.append((count, ev))
        return ev

    async def one(self, producer: Producer, topic: str, key: str, seq: int,
                  tolerate_failures: bool) -> None:
        try:
            await producer.publish_ordered(topic, key, f"{key}:{seq}".encode())
        except PublishError as exc:
            if not tolerate_failures:
                raise
            # not acknowledged: it may or may not be stored
            self.failed[(key, seq)] = exc
            return
        self.acked.add((key, seq))
        self.acked_order[key].append(seq)
        n = len(self.acked)
        for count, ev in self.milestones:
            if n >= count:
                ev.set()

    async def key_worker(self, producer: Producer, topic: str, key: str,
                         tolerate_failures: bool) -> None:
        """The key's messages in bursts of BURST calls made in sequence order without
        waiting for each other: the producer's per-key lane is what keeps them in order."""
        for start in range(0, PER_KEY, BURST):
            await asyncio.gather(*(self.one(producer, topic, key, seq, tolerate_failures)
                                   for seq in range(start, min(start + BURST, PER_KEY))))

    async def run(self, producer: Producer, topic: str, *,
                  tolerate_failures: bool = False) -> None:
        await asyncio.gather(*(self.key_worker(producer, topic, k, tolerate_failures)
                               for k in KEYS))


def ordered_consumer(cluster: DevCluster, topic: str, handler: Recorder,
                     violations: list[OrderViolationError]) -> OrderedConsumer:
    def on_violation(msg: Message, error: OrderViolationError) -> ViolationAction:
        violations.append(error)
        return ViolationAction.ACCEPT  # let the run finish so that everything is checked

    return OrderedConsumer(topic, CHANNEL, handler,
                           lookupd=cluster.lookupd_http_addresses,
                           config=fast_config(max_in_flight=2 * PARTITIONS,
                                              ordered_retry_pause=0.01),
                           on_violation=on_violation)


@pytest.fixture
async def cluster() -> AsyncIterator[DevCluster]:
    async with DevCluster(nodes=3, lookupds=2, flavour="youzan") as c:
        yield c


# --- 1. the clean run -----------------------------------------------------------------------


async def test_10k_ordered_messages_published_and_consumed_together(
        cluster: DevCluster) -> None:
    topic = "e2e_ord"
    cluster.create_topic(topic, partition_num=PARTITIONS, replica=2, ordered=True,
                         channels=(CHANNEL,))
    got = Recorder()
    violations: list[OrderViolationError] = []
    pub = Publishing()
    everything = {(k, s) for k in KEYS for s in range(PER_KEY)}
    async with asyncio.timeout(30):
        c = ordered_consumer(cluster, topic, got, violations)
        async with c, Producer(lookupd=cluster.lookupd_http_addresses,
                               config=PRODUCER_CONFIG) as producer:
            # consuming while publishing: the consumer is subscribed before the first publish
            assert {s.partition for s in c.stats().subscriptions} == set(range(PARTITIONS))
            await pub.run(producer, topic)
            handled_while_publishing = len(got.log)
            assert pub.acked == everything
            await got.wait_for_all(everything, within=20)
            positions = c.positions()
            validators = [c.validator(p) for p in range(PARTITIONS)]
        stats = c.stats()

    assert c.error is None
    assert violations == []
    assert [v.violations for v in validators] == [0] * PARTITIONS
    assert handled_while_publishing > 0  # consumed at the same time, not afterwards
    # a clean run: every message exactly once, no gaps, no redeliveries
    assert len(got.log) == 10_000 and got.seen == everything
    assert [(v.gaps, v.redeliveries) for v in validators] == [(0, 0)] * PARTITIONS
    assert stats.finished == 10_000 and stats.requeued == 0
    for key, seqs in got.per_key().items():
        assert seqs == list(range(PER_KEY)), f"{key}: {order_problems(seqs)[:5]}"
    leader_of = {p: a for a, p in leaders(cluster, topic)}
    last_offset: dict[int, int] = {}
    for h in got.log:
        # the partition the message came from is the independent murmur3 placement
        assert h.partition == EXPECTED_PARTITION[h.key], h
        assert h.nsqd == leader_of[h.partition]
        assert h.offset is not None
        last_offset[h.partition] = h.offset
    # each partition's position is the last message handled on it
    assert positions == last_offset
    assert set(last_offset) == set(range(PARTITIONS))


# --- 2. a leader move and a node restart while publishing ----------------------------------


async def test_leader_move_and_node_restart_while_publishing(cluster: DevCluster) -> None:
    topic = "e2e_chaos"
    cluster.create_topic(topic, partition_num=PARTITIONS, replica=2, ordered=True,
                         channels=(CHANNEL,))
    got = Recorder()
    violations: list[OrderViolationError] = []
    pub = Publishing()
    move_at, restart_at = pub.at(2_000), pub.at(5_000)
    faults: list[tuple[str, int, int]] = []  # (what, node, publishes acknowledged by then)

    async def chaos() -> None:
        await move_at.wait()
        old = cluster.leader(topic, 0)
        new = cluster.move_leader(topic, 0)
        assert old is not None and new != old
        faults.append(("move p0", new, len(pub.acked)))
        await restart_at.wait()
        # the node now leading partition 0 (and, placed round-robin, partition 1 as well)
        await cluster.restart_node(new)
        faults.append(("restart", new, len(pub.acked)))

    async with asyncio.timeout(45):
        c = ordered_consumer(cluster, topic, got, violations)
        async with c, Producer(lookupd=cluster.lookupd_http_addresses,
                               config=PRODUCER_CONFIG) as producer:
            connects = c.stats().connects
            chaos_task = asyncio.create_task(chaos())
            try:
                await pub.run(producer, topic, tolerate_failures=True)
                assert restart_at.is_set(), f"only {len(pub.acked)} publishes acknowledged"
                await chaos_task
            finally:
                chaos_task.cancel()
            await got.wait_for_all(pub.acked, within=25)
            refreshes = producer.refreshes
            reconnects = c.stats().connects - connects
            validators = [c.validator(p) for p in range(PARTITIONS)]

    # the faults hit while publishing was going on, and were felt on both sides
    assert [f[0] for f in faults] == ["move p0", "restart"]
    assert all(n < len(KEYS) * PER_KEY for _, _, n in faults), faults
    # re-subscriptions: partition 0 after the move, partitions 0 and 1 after the restart
    assert refreshes >= 1 and reconnects >= 3
    # every partition always had a leader (replica 2): the bounded retries absorbed both
    # faults and no publish failed
    assert pub.failed == {}
    # acknowledged publishes were acknowledged in call order within each key
    for key, seqs in pub.acked_order.items():
        assert seqs == sorted(seqs), key
    # nothing acknowledged lost, nothing consumed that was never published
    assert pub.acked <= got.seen
    assert got.seen <= pub.acked | set(pub.failed)
    # never re-routed: every consumed message came from its key's murmur3 partition
    assert [h for h in got.log if h.partition != EXPECTED_PARTITION[h.key]] == []
    # nothing reordered within a key (duplicates only by re-handling, see order_problems)
    bad = {k: p[:3] for k, seqs in got.per_key().items() if (p := order_problems(seqs))}
    assert bad == {}
    assert c.error is None
    assert violations == []
    assert [v.violations for v in validators] == [0] * PARTITIONS


# --- 3. consumer pool: only the changed partition reconnects -------------------------------

EndpointKey = tuple[str, int]


def client_subscriptions(c: Consumer) -> dict[EndpointKey, tuple[object, Connection]]:
    """(nsqd address, partition) → (subscription, its Connection) for the live
    subscriptions. Object identity is not in ``stats()``, so this reads the consumer's
    registered subscriptions."""
    out: dict[EndpointKey, tuple[object, Connection]] = {}
    for sub in c._subs:
        conn = sub.conn
        if conn is None or not conn.is_connected or sub.retiring or sub.partition is None:
            continue
        key = (sub.address, sub.partition)
        assert key not in out, f"two live subscriptions for {key}"
        out[key] = (sub, conn)
    return out


def server_subscriptions(cluster: DevCluster, topic: str) -> dict[EndpointKey, int]:
    """What the nsqd nodes see: (node address, partition) → remote port of the subscriber."""
    out: dict[EndpointKey, int] = {}
    for node in cluster.nodes:
        if not node.running:
            continue
        for ci in node.clients():
            if ci.topic == topic and ci.channel == CHANNEL and ci.state == 3:
                key = (node.tcp_address, ci.partition)
                assert key not in out, f"two subscribers for {key} on the server"
                out[key] = ci.remote_port
    return out


def local_port(conn: Connection) -> int:
    """Our end's port of ``conn`` (Connection does not expose its socket)."""
    wire = conn._core.wire
    assert wire is not None and wire._transport is not None
    return int(wire._transport.get_extra_info("sockname")[1])


def leaders(cluster: DevCluster, topic: str) -> dict[EndpointKey, int]:
    out = {}
    for p in range(PARTITIONS):
        index = cluster.leader(topic, p)
        assert index is not None
        out[(cluster.nsqd_tcp_addresses[index], p)] = index
    return out


#: view changes: a leader moves to its other replica; a node leading one partition stops
#: (the partition fails over to its replica); a new node joins and takes a partition over
CHANGES = ["leader_moved", "node_gone", "moved_to_new_node"]


async def change_view(cluster: DevCluster, topic: str, change: str) -> int:
    """Apply ``change`` (see CHANGES); return the partition whose leader changed."""
    by_node: dict[int, list[int]] = defaultdict(list)
    for (_, p), index in leaders(cluster, topic).items():
        by_node[index].append(p)
    if change in ("leader_moved", "moved_to_new_node"):
        # a partition whose node leads another partition too: that one must stay put
        partition = next(ps[0] for ps in by_node.values() if len(ps) > 1)
        if change == "leader_moved":
            cluster.move_leader(topic, partition)  # to its other replica
        else:
            # a node joins and takes the partition over (the embedded cluster cannot add
            # partitions to a topic, so "partitions added" is not covered here)
            cluster.move_leader(topic, partition, to_node=await cluster.add_node())
    else:
        # "node gone": a node leading exactly one partition (its replica takes over)
        node, ps = next((n, ps) for n, ps in sorted(by_node.items()) if len(ps) == 1)
        partition = ps[0]
        await cluster.stop_node(node)
    return partition


async def publish_each_partition(cluster: DevCluster, topic: str, prefix: str,
                                 n: int) -> set[bytes]:
    sent: set[bytes] = set()
    for (address, p) in leaders(cluster, topic):
        batch = [f"{prefix}-{p}-{i}".encode() for i in range(n)]
        await publish(address, topic, batch, partition=p)
        sent.update(batch)
    return sent


@pytest.mark.parametrize("change", CHANGES)
async def test_consumer_reconnects_only_the_changed_partition(change: str) -> None:
    topic = "e2e_pool_c"
    handled: dict[bytes, Message] = {}
    arrived = asyncio.Event()
    wanted: set[bytes] = set()

    async def handler(msg: Message) -> None:
        handled[msg.body] = msg
        if wanted <= handled.keys():
            arrived.set()

    async def consume(bodies: set[bytes]) -> None:
        wanted.clear()
        wanted.update(bodies)
        arrived.clear()
        if not wanted <= handled.keys():
            await arrived.wait()

    async with asyncio.timeout(20), DevCluster(nodes=3, lookupds=1, flavour="youzan") as cl:
        # plain (not ordered) topic, 4 partitions over 3 nodes, 2 replicas each
        cl.create_topic(topic, partition_num=PARTITIONS, replica=2, multi_part=True,
                        channels=(CHANNEL,))
        before_leaders = leaders(cl, topic)
        lookup_cfg = LookupConfig(addresses=tuple(cl.lookupd_http_addresses),
                                  poll_interval=0.2, poll_jitter=0.1)
        async with Lookup(lookup_cfg) as lookup, Consumer(
                topic, CHANNEL, handler, lookupd=lookup,
                config=fast_config(max_in_flight=16)) as c:
            await consume(await publish_each_partition(cl, topic, "before", 10))
            before = client_subscriptions(c)
            before_server = server_subscriptions(cl, topic)
            assert set(before) == set(before_leaders) == set(before_server)
            # the client's and the servers' views are the same connections
            assert {k: local_port(conn) for k, (_, conn) in before.items()} == before_server
            received = {(s.address, s.partition): s.received for s in c.stats().subscriptions}
            connects = c.stats().connects

            partition = await change_view(cl, topic, change)
            after_leaders = leaders(cl, topic)
            gone = {k for k in before_leaders if k[1] == partition}
            new = {k for k in after_leaders if k[1] == partition}
            assert gone != new and len(gone) == len(new) == 1
            await eventually(lambda: set(client_subscriptions(c)) == set(after_leaders))
            # one more complete lookup poll: a needless reconnection would show up now
            rounds = lookup.rounds(topic, "r")
            await eventually(lambda: lookup.rounds(topic, "r") >= rounds + 2)

            after = client_subscriptions(c)
            after_server = server_subscriptions(cl, topic)
            assert set(after) == set(after_server) == set(after_leaders)
            unchanged = set(before) - gone
            assert len(unchanged) == PARTITIONS - 1
            for key in unchanged:
                # the very same subscription and Connection objects ...
                assert after[key][0] is before[key][0], key
                assert after[key][1] is before[key][1], key
                # ... and, seen from the node, the same TCP connection
                assert after_server[key] == before_server[key], key
            (new_key,) = new
            assert after_server[new_key] == local_port(after[new_key][1])
            assert c.stats().connects == connects + 1  # exactly one connection was made

            # the kept connections still deliver: the new messages of their partitions come
            # through them (their counters continue where they were)
            await consume(await publish_each_partition(cl, topic, "after", 10))
            stats = {(s.address, s.partition): s.received for s in c.stats().subscriptions}
            for key in unchanged:
                assert stats[key] == received[key] + 10, key
            assert stats[new_key] >= 10
            for body in wanted:
                p = int(body.split(b"-")[1])
                assert handled[body].nsqd_address == next(
                    a for a, q in after_leaders if q == p)


# --- 4. producer pools: the nodes that stayed keep their connections -----------------------


@pytest.mark.parametrize("change", CHANGES)
async def test_producer_pools_keep_unaffected_connections(change: str) -> None:
    topic = "e2e_pool_p"
    # one connection per nsqd, so that "the same connections" is exact (no lazy growth)
    cfg = PRODUCER_CONFIG.replace(connections_per_nsqd=1)
    async with asyncio.timeout(20), DevCluster(nodes=3, lookupds=1, flavour="youzan") as cl, \
            Producer(lookupd=cl.lookupd_http_addresses, config=cfg) as producer:
        cl.create_topic(topic, partition_num=PARTITIONS, replica=2, multi_part=True,
                        channels=(CHANNEL,))
        for p in range(PARTITIONS):
            await producer.publish(topic, f"warm-{p}".encode(), partition=p)
        before_leaders = leaders(cl, topic)
        pools = producer.pools
        assert set(pools) == set(cl.nsqd_tcp_addresses)
        conns = {a: pool.connections for a, pool in pools.items()}
        dials = {a: pool.dials for a, pool in pools.items()}
        assert all(len(cs) == 1 for cs in conns.values())
        refreshes = producer.refreshes

        partition = await change_view(cl, topic, change)
        old_leader = next(a for a, p in before_leaders if p == partition)
        new_leader = next(a for a, p in leaders(cl, topic) if p == partition)
        assert new_leader != old_leader
        for p in range(PARTITIONS):
            await producer.publish(topic, f"after-{p}".encode(), partition=p)
        for p in range(PARTITIONS):
            bodies = [r.body for r in cl.store.partition(topic, p).records]
            assert bodies == [f"warm-{p}".encode(), f"after-{p}".encode()], p
        # the stale mapping was noticed and refreshed
        assert producer.refreshes > refreshes

        after = producer.pools
        assert set(after) == set(pools) | {new_leader}

        def kept(address: str) -> None:
            """Same pool, same Connection objects, still connected, nothing redialled."""
            assert after[address] is pools[address], address
            assert after[address].connections == conns[address], address
            assert all(conn.is_connected for conn in conns[address]), address
            assert after[address].dials == dials[address], address

        # nodes that neither led nor now lead the changed partition (3 nodes: at least one)
        unaffected = set(pools) - {old_leader, new_leader}
        assert unaffected
        for address in unaffected:
            kept(address)
        if change == "leader_moved":
            # E_FAILED_ON_NOT_LEADER does not close the connection: only the mapping changed,
            # so the old and the new leader keep their connections as well
            kept(old_leader)
            kept(new_leader)
        elif change == "node_gone":
            kept(new_leader)  # the replica that took over
            assert not any(conn.is_connected for conn in conns[old_leader])
            assert not after[old_leader].is_up
        else:
            # the old leader no longer holds the partition at all: it answers
            # E_TOPIC_NOT_EXIST, a fatal error that closes the connection (the server's
            # doing, docs/protocol.md §6.2). The node itself is fine: the same pool dialled one
            # fresh connection for the node's other partition.
            assert not any(conn.is_connected for conn in conns[old_leader])
            assert after[old_leader] is pools[old_leader]
            assert after[old_leader].is_up and after[old_leader].failures == 0
            assert after[old_leader].dials == dials[old_leader] + 1
            assert after[new_leader].is_up
