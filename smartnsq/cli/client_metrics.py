"""The client side of ``smartnsq stat --client-metrics``: the Prometheus endpoints of running
smartnsq processes (``--metrics-port``, or an application's own exporter), scraped, parsed
with ``prometheus_client.parser`` and summed per subscription over every endpoint, to be
shown beside what nsqd reports for the same channel.

A subscription is (topic, channel, partition, nsqd) as the consumer metrics label it
(:mod:`smartnsq.metrics.catalog`): a youzan partition row of ``stat`` takes the series of its
partition (whichever nsqd led it when they were counted), a stock row those of its nsqd (its
TCP address, which ``stat`` learns from the lookupd or the nsqd's ``/info``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

from smartnsq.cli.common import describe
from smartnsq.metrics.catalog import (
    CONSUMER_FINISHED,
    CONSUMER_GIVEN_UP,
    CONSUMER_IN_FLIGHT,
    CONSUMER_RECEIVED,
    CONSUMER_REQUEUED,
    PREFIX,
)

__all__ = ["ClientCounts", "Key", "endpoint_url", "parse", "scrape", "sum_counts"]

INSTALL_HINT = "pip install 'smartnsq[prometheus]'"

#: (topic, channel, partition, nsqd): a consumer's subscription, as its metrics label it
Key = tuple[str, str, str, str]

#: sample name in the text format -> ClientCounts field
_FIELDS = {
    f"{PREFIX}_{CONSUMER_RECEIVED.name}_total": "received",
    f"{PREFIX}_{CONSUMER_FINISHED.name}_total": "finished",
    f"{PREFIX}_{CONSUMER_REQUEUED.name}_total": "requeued",
    f"{PREFIX}_{CONSUMER_GIVEN_UP.name}_total": "given_up",
    f"{PREFIX}_{CONSUMER_IN_FLIGHT.name}": "in_flight",
}


@dataclass
class ClientCounts:
    """What the clients counted for one subscription (or a sum of them): counters since each
    process started, ``in_flight`` now."""

    received: float = 0.0
    finished: float = 0.0
    requeued: float = 0.0
    given_up: float = 0.0
    in_flight: float = 0.0

    def add(self, other: ClientCounts) -> None:
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)

    def as_json(self) -> dict[str, int]:
        return {k: int(v) for k, v in asdict(self).items()}


def sum_counts(counts: Iterable[ClientCounts]) -> ClientCounts | None:
    """The sum, or None when there is nothing to add (no client reported it)."""
    out: ClientCounts | None = None
    for c in counts:
        if out is None:
            out = ClientCounts()
        out.add(c)
    return out


def endpoint_url(text: str) -> str:
    """``host:port`` → ``http://host:port/metrics``; a URL without a path gets ``/metrics``;
    ValueError for anything else."""
    url = text if "://" in text else f"http://{text}"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"malformed metrics endpoint {text!r}: expected HOST:PORT or "
                         "http://HOST:PORT/metrics")
    try:
        parts.port  # noqa: B018  (urlsplit checks the port when asked for it)
    except ValueError:
        raise ValueError(f"malformed metrics endpoint {text!r}: bad port") from None
    if parts.path in ("", "/"):
        url = parts._replace(path="/metrics").geturl()
    return url


def parse(text: str) -> dict[Key, ClientCounts]:
    """The consumer counts of one endpoint's Prometheus text, per subscription."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[Key, ClientCounts] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            field = _FIELDS.get(sample.name)
            if field is None:
                continue
            labels = sample.labels
            key = (labels.get("topic", ""), labels.get("channel", ""),
                   labels.get("partition", ""), labels.get("nsqd", ""))
            counts = out.setdefault(key, ClientCounts())
            setattr(counts, field, getattr(counts, field) + sample.value)
    return out


#: bound on one endpoint's answer
SCRAPE_TIMEOUT = 5.0


async def scrape(urls: Iterable[str]) -> tuple[dict[Key, ClientCounts], dict[str, str]]:
    """Every endpoint at once: the counts summed over those that answered, and the errors of
    the others by URL."""
    import aiohttp  # here, not for stat's --help

    totals: dict[Key, ClientCounts] = {}
    errors: dict[str, str] = {}

    async def one(session: aiohttp.ClientSession, url: str) -> None:
        try:
            async with session.get(url) as resp:
                if resp.status != 200:
                    # a 404 is what NSQ's own HTTP ports answer: the wrong port, most likely
                    errors[url] = (f"HTTP {resp.status}: no Prometheus metrics here (the "
                                   "smartnsq process's metrics port?)")
                    return
                text = await resp.text()
            found = parse(text)
        except aiohttp.ClientConnectorError as exc:  # aiohttp's text adds "ssl:default"
            errors[url] = f"cannot connect ({exc.os_error.strerror or exc.os_error})"
            return
        except TimeoutError:
            errors[url] = f"no answer within {SCRAPE_TIMEOUT:g} s (timed out)"
            return
        except (aiohttp.ClientError, OSError) as exc:
            errors[url] = describe(exc)
            return
        except ValueError as exc:  # the parser's: not Prometheus text
            errors[url] = f"not Prometheus text ({describe(exc)})"
            return
        for key, counts in found.items():
            totals.setdefault(key, ClientCounts()).add(counts)

    timeout = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(one(session, u) for u in urls))
    return totals, errors


def check_installed() -> None:
    """ImportError naming the extra when ``prometheus_client`` (its parser) is missing."""
    try:
        import prometheus_client.parser  # noqa: F401
    except ImportError:
        raise ImportError(f"--client-metrics needs prometheus_client: {INSTALL_HINT}") from None


def endpoints_json(urls: Iterable[str], errors: dict[str, str]) -> list[dict[str, Any]]:
    return [{"url": u, "error": errors.get(u)} for u in urls]
