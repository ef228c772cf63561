"""How a :class:`~smartnsq.producer.Producer` is put together from its source: the nsqd
pools, and in lookupd mode the lookup component and the router over it, under one retry
engine. Kept out of the producer so that its class holds the public calls and the life
cycle, not the assembly."""

from __future__ import annotations

from typing import NamedTuple

from smartnsq.addresses import Source, lookup_of
from smartnsq.config import ProducerConfig
from smartnsq.errors import ConfigError
from smartnsq.lookup import Lookup
from smartnsq.producer.engine import TcpEngine
from smartnsq.producer.nodes import Nodes
from smartnsq.producer.retry import RetryPolicy
from smartnsq.producer.routing import Router

__all__ = ["Wiring", "check_config", "wire"]


class Wiring(NamedTuple):
    """The parts a producer holds (``lookup``, ``own_lookup`` and ``router`` only in lookupd
    mode; ``own_lookup``: the producer made the lookup and starts and stops it)."""

    nodes: Nodes
    engine: TcpEngine
    lookup: Lookup | None
    own_lookup: bool
    router: Router | None


def check_config(config: object) -> ProducerConfig:
    """``config``, or the default configuration for None; anything else is refused."""
    if config is None:
        return ProducerConfig()
    if not isinstance(config, ProducerConfig):
        raise ConfigError(f"config must be a ProducerConfig, got {type(config).__name__}")
    return config


def wire(config: ProducerConfig, source: Source) -> Wiring:
    """The parts for ``source``: listed nsqd (direct mode) or a lookup (lookupd mode)."""
    policy = RetryPolicy.from_config(config)
    nodes = Nodes(config, source.nsqd)
    if source.direct:
        return Wiring(nodes, TcpEngine(policy, direct=nodes.direct), None, False, None)
    lookup, own = lookup_of(source, poll_interval=config.lookupd_poll_interval,
                            poll_jitter=config.lookupd_poll_jitter)
    router = Router(lookup, policy.backoff)
    nodes.named = router.routes.addresses
    return Wiring(nodes, TcpEngine(policy, router=router, endpoints=nodes), lookup, own, router)
