"""One refresh of ``smartnsq stat``: each nsqd's ``/stats`` (a hung nsqd waited for once,
then asked again in the background: :class:`HungNodes`), and with ``--client-metrics`` the
clients' side scraped beside it and each nsqd's TCP address, which the clients' metrics name.

Callers: :mod:`smartnsq.cli.stat` (the live view and ``--once``), :mod:`smartnsq.cli.lookup`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from smartnsq.cli.client_metrics import ClientCounts, Key, scrape, sum_counts
from smartnsq.errors import NsqdHttpError, NsqdUnavailableError, ServerError
from smartnsq.protocol.validation import NO_PARTITION, parse_http_address

# the HTTP client (aiohttp) loads when the command runs, not for its --help
if TYPE_CHECKING:
    from smartnsq.nsqd_http import NsqdHttpClient

__all__ = ["Answer", "ClientSide", "HungNodes", "Sample", "take_sample", "tcp_addresses"]


@dataclass
class Sample:
    """One refresh: the nsqds' answers and the time they were taken."""

    at: float
    stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    #: the clients' side (None without --client-metrics), their endpoints and failures
    clients: dict[Key, ClientCounts] | None = None
    endpoints: tuple[str, ...] = ()
    client_errors: dict[str, str] = field(default_factory=dict)
    #: nsqd HTTP address (as asked) -> its TCP address, which the clients' metrics name
    tcp: dict[str, str] = field(default_factory=dict)

    def client(self, topic: str, channel: str, part: int, node: str
               ) -> tuple[ClientCounts | None, list[Key]]:
        """The clients' counts for a channel row, and the subscriptions they sum: a youzan
        partition's whichever nsqd led it, a stock row's those on its nsqd."""
        if self.clients is None:
            return None, []
        if part != NO_PARTITION:
            keys = [k for k in self.clients if k[:3] == (topic, channel, str(part))]
        else:
            keys = [k for k in self.clients if k == (topic, channel, "", self.tcp.get(node))]
        return sum_counts(self.clients[k] for k in keys), keys



@dataclass(frozen=True)
class ClientSide:
    """``--client-metrics``: the endpoints' URLs, and the TCP address of each nsqd asked (a
    task: with ``--nsqd`` it is asked of each nsqd's /info beside the first /stats, not
    before it, so a silent nsqd costs the HTTP timeout once, not twice)."""

    urls: tuple[str, ...]
    tcp: asyncio.Future[dict[str, str]]


#: one nsqd's /stats: its stats or its error, and whether it got no answer in time (hung)
Answer = tuple[dict[str, Any] | None, str | None, bool]


async def _ask(nsqd: NsqdHttpClient, addr: str, topic: str | None) -> Answer:
    """One nsqd's /stats: (stats, None, False), or (None, the error, whether it was the
    HTTP timeout: a hung nsqd)."""
    try:
        return await nsqd.stats(addr, topic), None, False
    except NsqdHttpError as exc:
        hung = isinstance(exc, NsqdUnavailableError) and isinstance(exc.__cause__,
                                                                    TimeoutError)
        return None, (exc.reason if exc.status is None else str(exc)), hung
    except ServerError as exc:
        return None, str(exc), False


class HungNodes:
    """The live view's nsqds whose /stats got no answer within the HTTP timeout (hung): the
    next refreshes do not wait for them. Each is asked again in the background; until that
    answers, a refresh shows its last error. A hung nsqd costs the view its timeout once,
    not at every refresh (the nsqds that answer keep the interval)."""

    def __init__(self) -> None:
        self.errors: dict[str, str] = {}
        self.asking: dict[str, asyncio.Task[Answer]] = {}

    def note(self, addr: str, answer: Answer) -> None:
        _, error, hung = answer
        if hung and error is not None:
            self.errors[addr] = error
        else:
            self.errors.pop(addr, None)

    def poll(self, nsqd: NsqdHttpClient, addr: str, topic: str | None) -> Answer:
        """The background request's answer if it came, else the last error (asking again
        when the previous request is over)."""
        task = self.asking.get(addr)
        if task is not None and task.done():
            del self.asking[addr]
            answer = task.result()
            self.note(addr, answer)
            if addr not in self.errors:
                return answer
        if addr not in self.asking:
            self.asking[addr] = asyncio.ensure_future(_ask(nsqd, addr, topic))
        return None, self.errors[addr], True

    def close(self) -> None:
        for task in self.asking.values():
            task.cancel()


async def take_sample(nsqd: NsqdHttpClient, nodes: list[str], topic: str | None,
                      clients: ClientSide | None = None, hung: HungNodes | None = None
                      ) -> Sample:
    """One refresh; with ``hung``, the nsqds it holds are not waited for (see there)."""
    sample = Sample(at=time.time())

    def record(addr: str, answer: Answer) -> None:
        stats, error, _ = answer
        if stats is not None:
            sample.stats[addr] = stats
        else:
            sample.errors[addr] = error or "no answer"

    async def one(addr: str) -> None:
        answer = await _ask(nsqd, addr, topic)
        if hung is not None:
            hung.note(addr, answer)
        record(addr, answer)

    async def client_side(side: ClientSide) -> None:
        counts, sample.client_errors = await scrape(side.urls)
        sample.clients = {k: v for k, v in counts.items() if topic is None or k[0] == topic}
        sample.endpoints = side.urls
        sample.tcp = await side.tcp

    waited = [a for a in nodes if hung is None or a not in hung.errors]
    for addr in nodes:
        if hung is not None and addr in hung.errors:
            record(addr, hung.poll(nsqd, addr, topic))
    await asyncio.gather(*(one(a) for a in waited),
                         *([client_side(clients)] if clients is not None else []))
    return sample


async def tcp_addresses(http: NsqdHttpClient, nodes: list[str]) -> dict[str, str]:
    """Each nsqd's TCP address (the host it was asked at, its ``/info`` TCP port); one that
    does not answer is left out (its rows get no client side)."""
    out: dict[str, str] = {}

    async def one(addr: str) -> None:
        try:
            info = await http.info(addr)
        except (NsqdHttpError, ServerError):
            return
        port = info.get("tcp_port")
        if isinstance(port, int) and not isinstance(port, bool):
            host = urlsplit(parse_http_address(addr)).hostname or ""
            out[addr] = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    await asyncio.gather(*(one(a) for a in nodes))
    return out
