"""Reading client metrics the way an operator's Prometheus does: scrape the real HTTP endpoint
of a :class:`~smartnsq.metrics.prometheus.PrometheusMetrics` and parse the text with
``prometheus_client``'s parser."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Awaitable, Callable

from prometheus_client.parser import text_string_to_metric_families

from smartnsq.metrics.prometheus import PrometheusMetrics

#: sample name -> [(labels, value)]
Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(metrics: PrometheusMetrics) -> Samples:
    """Serve ``metrics`` on a free port, GET /metrics once, stop serving, parse."""
    server, thread = metrics.serve(0)
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


async def ascrape(metrics: PrometheusMetrics) -> Samples:
    """:func:`scrape` from a coroutine (the HTTP round trip runs in a thread, so the client
    under test keeps running on the loop meanwhile)."""
    return await asyncio.to_thread(scrape, metrics)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(v for lab, v in samples.get(name, ())
               if all(lab.get(k) == want for k, want in labels.items()))


def series(samples: Samples, name: str, **labels: str) -> list[dict[str, str]]:
    """The label sets of ``name``'s samples that include ``labels``."""
    return [lab for lab, _ in samples.get(name, ())
            if all(lab.get(k) == want for k, want in labels.items())]


async def until(what: str, probe: Callable[[], Awaitable[bool]], seconds: float = 30.0) -> None:
    """Wait for ``probe()`` (figures that settle after the answers were written) within a
    bound."""
    try:
        async with asyncio.timeout(seconds):
            while not await probe():  # noqa: ASYNC110
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"{what}: not within {seconds:.0f} s") from None
