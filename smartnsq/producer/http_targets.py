"""The HTTP producer's side of the retry engine: nsqd HTTP endpoints as targets
(:class:`HttpNode`), the lookup's nsqd as endpoints (:class:`HttpNodes`) and one publish
request as the engine's op (:class:`HttpPublish`).

An :class:`HttpNode` has no connection of its own to keep: a request that fails the way a
node fails (refused, reset, no answer within ``request_timeout``, garbage) marks it down for
as long as its backoff says (by default :class:`~smartnsq.backoff.ExponentialBackoff` from
``reconnect_min`` doubling up to ``reconnect_max``), and an answered request brings it back.
While it is down the engine passes it over, or waits for it without spending an attempt, as
it does for a TCP pool in its reconnect backoff.
"""

# Per-call ``timeout`` arguments are the API (each attempt's bounded wait).
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import ssl as _ssl
from collections.abc import Callable, Collection
from typing import ClassVar

import aiohttp

from smartnsq.backoff import Backoff, ExponentialBackoff
from smartnsq.config import ProducerConfig
from smartnsq.errors import ClientClosedError, UnsupportedFeatureError
from smartnsq.producer.http_nsqd import flavour, post, receipt
from smartnsq.producer.retry import Action, classify
from smartnsq.producer.router import TopicRoute
from smartnsq.producer.sweeps import SweepSchedule
from smartnsq.producer.types import PublishReceipt
from smartnsq.protocol.validation import parse_http_address
from smartnsq.sharding import ShardKey, ShardRule

__all__ = ["HttpNode", "HttpNodes", "HttpPublish", "node_backoff"]

_WHAT = {"/pubtrace": "traced publish", "/pub_ext": "publish with ext header"}
#: the metrics' and spans' command of a request to each path
_COMMAND = {"/pub": "HTTP_PUB", "/mpub": "HTTP_MPUB", "/pubtrace": "HTTP_PUB_TRACE",
            "/pub_ext": "HTTP_PUB_EXT"}

#: nodes kept before the first sweep of those no route names (lookupd mode)
SWEEP_MIN = 16


def node_backoff(config: ProducerConfig) -> Backoff:
    """How long an HTTP node is passed over after its n-th consecutive failure."""
    return ExponentialBackoff(config.reconnect_min, config.reconnect_max)


class HttpNode:
    """One nsqd's HTTP endpoint (``address``: ``http://host:port``) and its health; a
    :class:`~smartnsq.producer.targets.Target` whose channel is the node itself."""

    __slots__ = ("_backoff", "address", "failures", "flavour", "last_error", "retry_at")

    #: no dials: a node is only ever tried by a publish's own request
    dial_failures: ClassVar[int] = 0

    def __init__(self, address: str, backoff: Backoff) -> None:
        self.address = address
        self._backoff = backoff
        self.failures = 0
        self.retry_at = 0.0
        self.last_error: BaseException | None = None
        #: "stock" / "youzan" once /info was asked (direct addresses only)
        self.flavour: str | None = None

    def __repr__(self) -> str:
        return f"<HttpNode {self.address} failures={self.failures}>"

    @property
    def is_up(self) -> bool:
        return not self.failures

    def pick(self) -> HttpNode:
        return self

    async def get(self) -> HttpNode:
        return self

    def standing(self, now: float) -> int:
        return 2 if now >= self.retry_at else 0

    def available(self, now: float) -> bool:
        return now >= self.retry_at

    def redial_soon(self) -> None:
        """Nothing to dial: the node is tried again once its backoff is over."""

    async def recover(self, deadline: float) -> bool:
        wait = min(deadline, self.retry_at) - asyncio.get_running_loop().time()
        if wait > 0:
            await asyncio.sleep(wait)
        return False

    def failed(self, exc: Exception) -> None:
        """A request to the node failed with ``exc``: a node failure marks it down."""
        if classify(exc) is Action.FAILOVER:
            self.failures += 1
            self.last_error = exc
            self.retry_at = asyncio.get_running_loop().time() + self._backoff.compute(
                self.failures)

    def answered(self) -> None:
        self.failures = 0


class HttpNodes:
    """The HTTP producer's nodes by address: the listed ones, and in lookupd mode those the
    routes name (:meth:`target`, the engine's endpoints). In lookupd mode the nodes no route
    names any more are swept out as the table grows (:class:`SweepSchedule`): a cluster whose
    nsqd come and go under new addresses (pods) must not leave one behind each."""

    def __init__(self, backoff: Backoff) -> None:
        self.backoff = backoff
        self._nodes: dict[str, HttpNode] = {}
        #: lookupd mode: the HTTP addresses the routes name now (set by the producer)
        self.named: Callable[[], Collection[str]] | None = None
        self._sweeps = SweepSchedule(SWEEP_MIN)

    @property
    def size(self) -> int:
        """Nodes kept now."""
        return len(self._nodes)

    def node(self, address: str) -> HttpNode:
        """The node of ``address`` (``http://host:port``), made on first use."""
        node = self._nodes.get(address)
        if node is None:
            if self.named is not None and self._sweeps.due(len(self._nodes)):
                named = self.named()
                for gone in [a for a in self._nodes if a not in named]:
                    # a publish holding it finishes with it; the next one starts afresh
                    del self._nodes[gone]
                self._sweeps.swept(len(self._nodes))
            node = self._nodes[address] = HttpNode(address, self.backoff)
        return node

    def target(self, route: TopicRoute, address: str) -> HttpNode | None:
        """The HTTP endpoint of the nsqd ``address`` the route names (None: the lookup did
        not describe that node)."""
        view_node = route.view.nodes.get(address)
        if view_node is None:
            return None
        return self.node(parse_http_address(view_node.http_address))


class HttpPublish:
    """One publish request (``path`` with ``params`` and ``body``) as the retry engine sends
    it; ``direct``: to listed nsqd, whose flavour is asked before a partition, trace, ext or
    defer request goes to them (with lookupd the route says)."""

    __slots__ = ("body", "command", "count", "direct", "params", "partition", "path", "rule",
                 "session", "shard", "ssl", "stock_only", "topic", "what", "youzan_only")

    def __init__(self, session: aiohttp.ClientSession, path: str, params: dict[str, str],
                 body: bytes, topic: str, partition: int | None, *, youzan_only: bool,
                 stock_only: bool, direct: bool, count: int = 1,
                 ssl: _ssl.SSLContext | bool = True) -> None:
        self.session = session
        #: what ``https://`` nodes are verified with (the producer's ``tls``)
        self.ssl = ssl
        self.path = path
        self.params = params
        self.body = body
        self.topic = topic
        self.partition = partition
        self.youzan_only = youzan_only
        self.stock_only = stock_only
        self.direct = direct
        #: what errors call it
        self.what = _WHAT.get(path, "publish") if not stock_only else "deferred publish"
        #: what metrics call it, and how many messages it carries
        self.command = _COMMAND.get(path, path) if not stock_only else "HTTP_DPUB"
        self.count = count
        self.shard: ShardKey | None = None
        self.rule: ShardRule = "murmur3"

    async def send(self, node: HttpNode, partition: int | None,
                   timeout: float) -> PublishReceipt | None:
        if self.session.closed:
            raise self._stopped(node)
        try:
            if self.direct and (self.youzan_only or partition is not None or self.stock_only):
                await self._check_flavour(node, partition, timeout)
            params = self.params
            if partition is not None:
                params = {**params, "partition": str(partition)}
            data = await post(self.session, node.address, self.path, params, self.body,
                              timeout, self.topic, partition, ssl=self.ssl)
        except Exception as exc:
            if self.session.closed:
                # the session closed under the request: no node failure, no retry
                raise self._stopped(node) from exc
            node.failed(exc)
            raise
        node.answered()
        if self.path in ("/pubtrace", "/pub_ext") and data.strip() != b"OK":
            return receipt(data, self.topic, partition if partition is not None else -1,
                           node.address)
        return None

    def _stopped(self, node: HttpNode) -> ClientClosedError:
        """The producer stopped (its stop() timeout passed) with this publish in flight."""
        return ClientClosedError(
            f"the producer was stopped before nsqd {node.address} answered this {self.what} "
            f"to topic {self.topic!r}: nsqd may or may not have stored it")

    async def _check_flavour(self, node: HttpNode, partition: int | None,
                             timeout: float) -> None:
        if node.flavour is None:
            node.flavour = await flavour(self.session, node.address, timeout, ssl=self.ssl)
        if node.flavour == "stock" and (self.youzan_only or partition is not None):
            raise UnsupportedFeatureError(
                f"{self.path} with partition/trace/ext needs youzan nsqd; {node.address} is "
                "stock nsqd")
        if node.flavour == "youzan" and self.stock_only:
            raise UnsupportedFeatureError("youzan nsqd has no deferred publish")
