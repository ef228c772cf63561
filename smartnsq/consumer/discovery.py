"""Where a consumer subscribes: a small interface over direct nsqd addresses and lookups.

A :class:`Discovery` produces :class:`Topology` snapshots, each the complete set of
:class:`Endpoint` s (nsqd, partition) to subscribe to plus what the topic's metadata says.
The connection set reconciles against every new snapshot.

* :class:`DirectDiscovery`: fixed ``host:port`` list, one plain subscription per nsqd.
  A lost connection is retried for as long as the consumer runs (the connection set backs
  off exponentially with jitter).
* :class:`LookupDiscovery`: the lookup component (``access=r``): one endpoint per
  (partition leader, partition) and per old non-partitioned nsqd (partition −1), keyed by
  ``broadcast_address:tcp_port``. Polled in the background; a lost connection triggers an
  immediate re-poll, and the endpoint is retried only while a later poll still lists it.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from smartnsq.errors import ConfigError, Flavour, LookupFailedError, LookupRefusedError
from smartnsq.lookup import Lookup, Subscription, TopicChange, TopicView
from smartnsq.metrics.api import Metrics
from smartnsq.protocol.validation import NO_PARTITION, parse_tcp_address

__all__ = [
    "NO_PARTITION",
    "DirectDiscovery",
    "Discovery",
    "Endpoint",
    "EndpointKey",
    "LookupDiscovery",
    "Topology",
]

log = logging.getLogger("smartnsq.consumer")

#: (``host:port``, partition)
EndpointKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One subscription target."""

    #: ``host:port`` of the nsqd's TCP listener
    address: str
    host: str
    port: int
    #: −1: plain ``SUB t c`` (no partition)
    partition: int = NO_PARTITION
    #: ``host:port`` of the nsqd's HTTP listener when known (lookups)
    http_address: str | None = None

    @property
    def key(self) -> EndpointKey:
        return (self.address, self.partition)

    def __str__(self) -> str:
        if self.partition == NO_PARTITION:
            return self.address
        return f"{self.address} partition {self.partition}"


@dataclass(frozen=True)
class Topology:
    """Everything to subscribe to, and what is known about the topic."""

    endpoints: Mapping[EndpointKey, Endpoint] = field(
        default_factory=lambda: MappingProxyType({}))
    flavour: Flavour = Flavour.UNKNOWN
    #: the topic is an ext topic (None: unknown, the connection config decides)
    ext: bool | None = None
    #: the topic is ordered (only SUB_ORDERED is allowed on it)
    ordered: bool = False
    #: partitions each nsqd leads for this topic (for the SUB_ADVANCED partition quirk)
    partitions_led: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    #: the lookupds said the topic does not exist
    not_found: bool = False


OnUpdate = Callable[[Topology], None]


class Discovery(abc.ABC):
    """The interface the consumer's connection set uses."""

    #: "nsqd" (direct addresses) or "lookupd"
    kind: str

    @abc.abstractmethod
    async def start(self, on_update: OnUpdate) -> Topology:
        """Begin; return the first topology (possibly empty) and call ``on_update`` with
        every later one."""

    @abc.abstractmethod
    def connection_lost(self, endpoint: Endpoint, stale_leader: bool) -> None:
        """A subscription to ``endpoint`` ended (``stale_leader``: the server said it is not
        the partition's leader, or has no such partition). Must not block."""

    @abc.abstractmethod
    async def still_wanted(self, endpoint: Endpoint) -> bool:
        """Whether reconnecting to ``endpoint`` is still right (asked before each retry)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop background work. Idempotent."""

    def describe_empty(self) -> str:
        """Why a topology has no endpoint, for the log."""
        return "nothing to subscribe to"

    def report_to(self, metrics: Metrics) -> None:
        """Caller: the consumer's start, before :meth:`start`. Affects: a lookup made for
        this consumer reports into the consumer's metrics."""
        del metrics  # direct addresses: no lookup to report


class DirectDiscovery(Discovery):
    """A fixed list of nsqd TCP addresses."""

    kind = "nsqd"

    def __init__(self, addresses: Sequence[str]) -> None:
        if isinstance(addresses, str) or not isinstance(addresses, Sequence):
            raise ConfigError("nsqd= must be a list of 'host:port' strings")
        if not addresses:
            raise ConfigError("nsqd= must not be empty")
        endpoints: dict[EndpointKey, Endpoint] = {}
        for a in addresses:
            host, port = parse_tcp_address(a)
            ep = Endpoint(a, host, port)
            endpoints[ep.key] = ep
        self.topology = Topology(MappingProxyType(endpoints))

    async def start(self, on_update: OnUpdate) -> Topology:
        return self.topology

    def connection_lost(self, endpoint: Endpoint, stale_leader: bool) -> None:
        return None

    async def still_wanted(self, endpoint: Endpoint) -> bool:
        return endpoint.key in self.topology.endpoints

    async def close(self) -> None:
        return None


def topology_from_view(view: TopicView,
                       partitions: frozenset[int] | None = None) -> Topology:
    """Endpoints for every partition leader and every non-partitioned nsqd of ``view``
    (only the leaders of ``partitions`` when given)."""
    endpoints: dict[EndpointKey, Endpoint] = {}
    for node, partition in view.targets():
        if partitions is not None and partition not in partitions:
            continue
        ep = Endpoint(node.address, node.broadcast_address, node.tcp_port, partition,
                      node.http_address if node.http_port else None)
        endpoints[ep.key] = ep
    led: dict[str, int] = {}
    for node in view.partitions.values():
        led[node.address] = led.get(node.address, 0) + 1
    return Topology(
        endpoints=MappingProxyType(endpoints),
        flavour=view.flavour,
        ext=view.extend_support if view.has_meta else None,
        ordered=view.ordered,
        partitions_led=MappingProxyType(led),
        not_found=view.not_found,
    )


class LookupDiscovery(Discovery):
    """Endpoints from the lookup component (``access=r``).

    ``own``: the discovery started the ``lookup`` for itself and stops it on close; a shared
    one is the caller's.
    """

    kind = "lookupd"

    def __init__(self, topic: str, lookup: Lookup, *, own: bool,
                 partitions: frozenset[int] | None = None) -> None:
        if not isinstance(lookup, Lookup):
            raise ConfigError(f"lookup must be a smartnsq.lookup.Lookup, got "
                              f"{type(lookup).__name__}")
        self._topic = topic
        #: subscribe only to these partitions (None: all)
        self._partitions = partitions
        self._own = own
        self._lookup = lookup
        self._sub: Subscription | None = None
        self._on_update: OnUpdate | None = None
        self._closed = False
        #: why the first lookup failed (polling goes on in the background)
        self._unanswered: LookupFailedError | None = None
        #: the asked-for partitions the topic lacked at the last look (said once)
        self._missing_said: list[int] = []
        #: the partitions start_at names (checked against the topic like ``partitions``)
        self._positioned: frozenset[int] = frozenset()
        self._unpositioned_said: list[int] = []

    def name_positions(self, partitions: frozenset[int]) -> None:
        """The partitions ``start_at`` gives a position: one the topic lacks is said once
        (a typo would otherwise position nothing, without a word)."""
        self._positioned = partitions

    @property
    def lookup(self) -> Lookup:
        return self._lookup

    def report_to(self, metrics: Metrics) -> None:
        # a shared lookup keeps the metrics it was made with (or the process default)
        if self._own:
            self._lookup.meters.use(metrics)

    async def start(self, on_update: OnUpdate) -> Topology:
        self._on_update = on_update
        self._sub = self._lookup.subscribe(self._topic, "r", callback=self._changed)
        try:
            view = await self._lookup.lookup(self._topic, "r")
        except LookupFailedError as exc:
            # keep polling in the background: lookupds may come up later
            self._unanswered = exc
            return Topology()
        return self._topology(view)

    def _changed(self, change: TopicChange) -> None:
        if self._closed or change.view is None or self._on_update is None:
            return
        self._on_update(self._topology(change.view))

    def _topology(self, view: TopicView) -> Topology:
        """:func:`topology_from_view`, saying once which asked-for partitions the topic does
        not have (a typo would otherwise subscribe to less than asked, without a word)."""
        wanted = self._partitions
        if wanted is not None and view.is_partitioned and view.partition_num:
            missing = sorted(p for p in wanted if p >= view.partition_num)
            if missing and missing != self._missing_said:
                rest = ("subscribing to the others asked for" if len(missing) < len(wanted)
                        else "none of those asked for exists yet: waiting for them")
                log.warning("consumer of topic %r: no partition %s (it has partitions 0..%d); "
                            "%s", self._topic, ", ".join(map(str, missing)),
                            view.partition_num - 1, rest)
            self._missing_said = missing
        if self._positioned and view.is_partitioned and view.partition_num:
            missing = sorted(p for p in self._positioned if p >= view.partition_num)
            if missing and missing != self._unpositioned_said:
                log.warning("consumer of topic %r: start_at names partition %s, which the "
                            "topic lacks (it has partitions 0..%d); ignored", self._topic,
                            ", ".join(map(str, missing)), view.partition_num - 1)
            self._unpositioned_said = missing
        return topology_from_view(view, wanted)

    def connection_lost(self, endpoint: Endpoint, stale_leader: bool) -> None:
        if self._closed:
            return
        partition = endpoint.partition if endpoint.partition != NO_PARTITION else None
        self._lookup.report_stale(self._topic, partition, access="r")

    def describe_empty(self) -> str:
        where = ", ".join(self._lookup.config.addresses)
        if isinstance(self._unanswered, LookupRefusedError):
            return str(self._unanswered)  # polling goes on: an operator may fix the lookupd
        if self._unanswered is not None:
            return f"no lookupd answered yet ({self._unanswered}; lookupds: {where})"
        if self._partitions is not None:
            return (f"no nsqd leads partition(s) {sorted(self._partitions)} of topic "
                    f"{self._topic!r} (lookupds: {where})")
        return f"no nsqd has topic {self._topic!r} (lookupds: {where})"

    async def still_wanted(self, endpoint: Endpoint) -> bool:
        if self._closed:
            return False
        try:
            view = await self._lookup.refresh(self._topic, "r")
        except LookupFailedError:
            current = self._lookup.view(self._topic, "r")
            if current is None:
                return False
            view = current
        return endpoint.key in topology_from_view(view, self._partitions).endpoints

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._sub is not None:
            self._sub.close()
        if self._own:
            await self._lookup.stop()
