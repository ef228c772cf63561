"""The delay policies (smartnsq.backoff): each formula once, with a seeded generator where it
is random. Who uses which: the consumer's reconnects EqualJitterBackoff, the producer's pools
SpreadJitterBackoff, the HTTP producer's nodes ExponentialBackoff, the retry engine
GoNsqRetryBackoff."""

from __future__ import annotations

import random

from smartnsq.backoff import (
    Backoff,
    ConstantBackoff,
    EqualJitterBackoff,
    ExponentialBackoff,
    GoNsqRetryBackoff,
    SpreadJitterBackoff,
)
from smartnsq.config import ConsumerConfig, ProducerConfig
from smartnsq.consumer.conns import reconnect_backoff as consumer_reconnects
from smartnsq.producer.http_targets import node_backoff
from smartnsq.producer.pool import reconnect_backoff as producer_reconnects
from smartnsq.producer.retry import RetryPolicy


def test_go_nsq_retry_delays_are_capped_at_one_second() -> None:
    b = GoNsqRetryBackoff()
    assert [round(b.compute(a), 3) for a in (1, 2, 3, 4)] == [0.048, 0.088, 0.168, 0.328]
    assert b.compute(0) == b.compute(1)
    assert b.compute(10) == 1.0
    assert b.compute(100) == 1.0


def test_equal_jitter_stays_in_the_upper_half_of_the_capped_step() -> None:
    b = EqualJitterBackoff(1.0, 8.0, random.Random(1))
    for n, step in ((1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (5, 8.0), (60, 8.0), (10**6, 8.0)):
        delays = [b.compute(n) for _ in range(200)]
        assert all(step / 2 <= d <= step for d in delays)
        assert len(set(delays)) > 100  # jittered, not fixed
    # seeded: the same draws again
    a, b2 = (EqualJitterBackoff(1.0, 8.0, random.Random(9)) for _ in range(2))
    assert [a.compute(3) for _ in range(5)] == [b2.compute(3) for _ in range(5)]


def test_spread_jitter_is_within_a_quarter_of_the_step_then_capped() -> None:
    b = SpreadJitterBackoff(0.1, 10.0, random.Random(3))
    for n, step in ((1, 0.1), (2, 0.2), (3, 0.4), (7, 6.4)):
        delays = [b.compute(n) for _ in range(200)]
        assert all(0.75 * step <= d <= 1.25 * step for d in delays)
        assert len(set(delays)) > 100
    # past the cap every draw is the cap (the jitter is applied before capping)
    assert {b.compute(n) for n in (9, 10, 40, 10**6) for _ in range(50)} == {10.0}


def test_exponential_doubles_up_to_the_cap_without_jitter() -> None:
    b = ExponentialBackoff(0.1, 1.0)
    assert [b.compute(n) for n in (0, 1, 2, 3, 4, 5, 10**6)] == \
        [0.1, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


def test_constant_is_constant() -> None:
    assert {ConstantBackoff(0.25).compute(n) for n in (0, 1, 7, 10**6)} == {0.25}


def test_each_client_builds_its_policy_from_its_config() -> None:
    producer = ProducerConfig(reconnect_min=0.5, reconnect_max=4.0, max_attempts=7,
                              request_timeout=3.0)
    consumer = ConsumerConfig(reconnect_min=2.0, reconnect_max=30.0)
    pools: Backoff = producer_reconnects(producer)
    nodes: Backoff = node_backoff(producer)
    reconnects: Backoff = consumer_reconnects(consumer, random.Random(5))
    assert isinstance(pools, SpreadJitterBackoff) and (pools.base, pools.cap) == (0.5, 4.0)
    assert isinstance(nodes, ExponentialBackoff) and (nodes.base, nodes.cap) == (0.5, 4.0)
    assert isinstance(reconnects, EqualJitterBackoff)
    assert (reconnects.base, reconnects.cap) == (2.0, 30.0)
    policy = RetryPolicy.from_config(producer)
    assert (policy.max_attempts, policy.request_timeout) == (7, 3.0)
    assert isinstance(policy.backoff, GoNsqRetryBackoff)
