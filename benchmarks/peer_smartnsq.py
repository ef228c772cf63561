"""smartnsq (asyncio) side of the throughput benchmark; run by throughput.py in its own process.

Usage: peer_smartnsq.py SCENARIO --nsqd HOST:PORT --topic T --count N [--loop uvloop|asyncio]
                        [--metrics off|prometheus|otel]
       peer_smartnsq.py YOUZAN_SCENARIO [--lookupd HOST:PORT] [--scale F] [--loop ...]
                        [--metrics ...]

Stock scenarios (the same as the other peers, plus ``pub_autobatch``): ``pub_sequential``,
``pub_inflight``, ``pub_autobatch``, ``mpub``, ``consume_fin`` (``N`` messages must already
wait on ``T``/``bench``). The scenario bodies are those of producer_bench.py and
consumer_bench.py, through smartnsq's public ``Producer`` and ``Consumer``.

youzan scenarios (smartnsq only): ``ordered``, ``ordered_batched``, ``traced`` (producer) and
``partitioned_{1,4,16}``, ``ordered_{1,4,16}`` (consumer), each on a fresh embedded youzan
cluster unless ``--lookupd`` is given; counts are the scripts' defaults times ``--scale``.

``--metrics`` sets the process default the clients read at start: ``off`` (the no-op
default), ``prometheus`` (:class:`PrometheusMetrics` on its own registry; nothing scrapes it
during the run, a scrape costs nothing per message) or ``otel`` (the OpenTelemetry SDK: an
:class:`OpenTelemetryMetrics` on an SDK ``MeterProvider`` with an in-memory reader, and an SDK
``TracerProvider`` whose spans go through a ``BatchSpanProcessor`` to an exporter that drops
them, so the cost is the SDK's recording and batching, not an exporter's network). Results
are labelled ``smartnsq+prometheus`` / ``smartnsq+otel``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Awaitable, Callable, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import consumer_bench
import producer_bench
from _harness import Result

StockScenario = Callable[[str, str, int], Awaitable[Result]]

STOCK: dict[str, StockScenario] = {
    "pub_sequential": lambda nsqd, topic, n: producer_bench.pub_one_at_a_time(
        nsqd, n, topic=topic),
    "pub_inflight": lambda nsqd, topic, n: producer_bench.pub_in_flight(nsqd, n, topic=topic),
    "pub_autobatch": lambda nsqd, topic, n: producer_bench.pub_auto_batched(
        nsqd, n, topic=topic),
    "mpub": lambda nsqd, topic, n: producer_bench.mpub_pipelined(nsqd, n, topic=topic),
    "consume_fin": lambda nsqd, topic, n: consumer_bench.consume_fin(
        nsqd, n, topic=topic, preloaded=True),
}
YOUZAN_PRODUCER = [c[0] for c in producer_bench.YOUZAN_CASES]
YOUZAN_CONSUMER = [c[0] for c in consumer_bench.YOUZAN_CASES]
YOUZAN = YOUZAN_PRODUCER + YOUZAN_CONSUMER


def loop_name(requested: str) -> str:
    """The event loop that will actually run (uvloop only when installed)."""
    if requested == "uvloop":
        try:
            import uvloop  # noqa: F401
        except ImportError:
            return "asyncio"
    return requested


METRICS = ("off", "prometheus", "otel")


def observe(mode: str) -> None:
    """Make ``mode`` the process default for the clients the scenario starts."""
    if mode == "off":
        return
    from smartnsq.metrics import set_metrics

    if mode == "prometheus":
        from prometheus_client import CollectorRegistry

        from smartnsq.metrics.prometheus import PrometheusMetrics

        set_metrics(PrometheusMetrics(CollectorRegistry()))
        return
    from opentelemetry import trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    from smartnsq.metrics.otel import OpenTelemetryMetrics

    class Dropped(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    set_metrics(OpenTelemetryMetrics(MeterProvider(metric_readers=[InMemoryMetricReader()])))
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropped()))
    trace.set_tracer_provider(provider)  # this benchmark process only


def label(result: Result, mode: str) -> Result:
    if mode != "off":
        result.client = f"{result.client}+{mode}"
    return result


def run_stock(scenario: str, nsqd: str, topic: str, count: int, loop: str) -> Result:
    result = producer_bench._run(STOCK[scenario](nsqd, topic, count), loop)
    result.scenario = scenario  # the table's key; the label is throughput.py's
    return result


def run_youzan(scenario: str, lookupd: str | None, scale: float, loop: str) -> list[Result]:
    if scenario in YOUZAN_PRODUCER:
        return producer_bench.run_producer_benchmarks(lookupd=lookupd, scale=scale,
                                                      only=(scenario,), loop=loop)
    return consumer_bench.run_consumer_benchmarks(lookupd=lookupd, scale=scale,
                                                  only=(scenario,), loop=loop)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", choices=[*STOCK, *YOUZAN])
    ap.add_argument("--nsqd")
    ap.add_argument("--topic")
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--lookupd", help="youzan lookupd HTTP address (default: embedded)")
    ap.add_argument("--scale", type=float, default=1.0, help="youzan scenarios only")
    ap.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    ap.add_argument("--metrics", choices=METRICS, default="off")
    a = ap.parse_args()
    loop = loop_name(a.loop)
    observe(a.metrics)
    if a.scenario in STOCK:
        if not a.nsqd or not a.topic:
            ap.error(f"{a.scenario} needs --nsqd and --topic")
        label(run_stock(a.scenario, a.nsqd, a.topic, a.count, loop), a.metrics).emit()
    else:
        for result in run_youzan(a.scenario, a.lookupd, a.scale, loop):
            label(result, a.metrics).emit()


if __name__ == "__main__":
    main()
