"""Every metric smartnsq reports: one :class:`MetricSpec` each, named once for all exporters.

Prometheus names are ``smartnsq_`` + ``spec.name`` (+ ``_total`` for counters), base units
(seconds, bytes), labels from :data:`LABELS`. OpenTelemetry names follow the messaging
semantic conventions where they define the metric (``messaging.client.sent.messages``,
``messaging.client.consumed.messages``, ``messaging.client.operation.duration``,
``messaging.process.duration``), else ``smartnsq.*``; label names map to attribute keys by
:data:`OTEL_ATTRIBUTES`. Labels never carry message ids or trace ids (unbounded series).

Label values: ``nsqd`` is the TCP address ``host:port``; ``partition`` is the youzan partition
number as text, ``""`` on a stock (non-partitioned) subscription or topic.
"""

from __future__ import annotations

from smartnsq.metrics.api import Kind, MetricSpec

__all__ = ["ALL", "LABELS", "OTEL_ATTRIBUTES", "PREFIX", "address_label", "by_name"]

PREFIX = "smartnsq"

#: label name -> what it holds
LABELS: dict[str, str] = {
    "topic": "the NSQ topic",
    "channel": "the consumer's channel",
    "nsqd": "the nsqd's TCP address, host:port",
    "partition": "the youzan partition number, empty on stock nsqd",
    "reason": "why a message was requeued",
    "command": "the publish command: PUB, MPUB, DPUB, PUB_TRACE, PUB_EXT, MPUB_TRACE, "
               "MPUB_EXT, HTTP_PUB, HTTP_MPUB, HTTP_PUB_TRACE, HTTP_PUB_EXT, HTTP_DPUB",
    "result": "ok, or the error's class name",
    "lookupd": "the lookupd's HTTP address, host:port",
    "state": "a connection's state: connecting, ready, closed",
    "client": "consumer or producer",
}

#: Prometheus label -> OpenTelemetry attribute key (semantic conventions where they exist);
#: ``nsqd`` becomes server.address + server.port; ``result`` "ok" adds no attribute
OTEL_ATTRIBUTES: dict[str, str] = {
    "topic": "messaging.destination.name",
    "channel": "messaging.consumer.group.name",
    "nsqd": "server.address",
    "partition": "messaging.destination.partition.id",
    "reason": "smartnsq.requeue.reason",
    "command": "messaging.operation.name",
    "result": "error.type",
    "lookupd": "smartnsq.lookupd.address",
    "state": "smartnsq.connection.state",
    "client": "smartnsq.client",
}

_DURATION = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
             10.0, 30.0, 60.0)
_LATENCY = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0,
            3600.0)
_BATCH = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 5000.0)

_SUB = ("topic", "channel", "nsqd", "partition")
_MSG = "{message}"


def _otel(name: str) -> str:
    # smartnsq.<client>.<rest>: OTel namespaces are dotted, words joined by "_"; the unit is
    # the instrument's, not part of the name
    client, _, rest = name.removesuffix("_seconds").partition("_")
    return f"smartnsq.{client}.{rest}"


def _c(name: str, description: str, labels: tuple[str, ...], otel: str = "",
       unit: str = _MSG) -> MetricSpec:
    return MetricSpec(name, Kind.COUNTER, description, labels, otel or _otel(name), unit)


def _g(name: str, description: str, labels: tuple[str, ...], unit: str = _MSG) -> MetricSpec:
    return MetricSpec(name, Kind.GAUGE, description, labels, _otel(name), unit)


def _h(name: str, description: str, labels: tuple[str, ...], buckets: tuple[float, ...],
       otel: str = "", unit: str = "s") -> MetricSpec:
    return MetricSpec(name, Kind.HISTOGRAM, description, labels, otel or _otel(name), unit,
                      buckets)


# -- consumer ---------------------------------------------------------------------------
CONSUMER_RECEIVED = _c("consumer_messages_received", "Messages delivered by nsqd.", _SUB,
                       "messaging.client.consumed.messages")
CONSUMER_FINISHED = _c("consumer_messages_finished", "Messages finished (FIN sent).", _SUB)
CONSUMER_REQUEUED = _c(
    "consumer_messages_requeued",
    "Messages requeued, by reason: handler_error (the handler, or a giving_up / "
    "dead-letter callback, raised), application (msg.requeue()), stop (returned as the "
    "consumer stopped: never handed out, or unanswered after the drain), closed (its "
    "connection closed before the handler saw it: nsqd requeues it, no REQ sent).",
    (*_SUB, "reason"))
CONSUMER_TOUCHED = _c("consumer_messages_touched", "TOUCH commands sent.", _SUB)
CONSUMER_GIVEN_UP = _c("consumer_messages_given_up",
                       "Messages given up after max_attempts (finished unhandled).", _SUB)
CONSUMER_DROPPED = _c(
    "consumer_messages_dropped_before_start",
    "Deliveries finished without reaching the handler: below the start position, or a "
    "second copy of a message nsqd had read ahead.", _SUB)
CONSUMER_FIN_FAILED = _c(
    "consumer_fin_failed", "FIN/REQ/TOUCH answered E_FIN_FAILED/E_REQ_FAILED/E_TOUCH_FAILED "
    "(a handler ran beyond msg_timeout: nsqd redelivers the message).", _SUB)
CONSUMER_CONNECTS = _c("consumer_connects", "Connections made (first connects and "
                       "reconnects).", ("topic", "channel", "nsqd"), unit="{connection}")
CONSUMER_IN_FLIGHT = _g("consumer_messages_in_flight",
                        "Messages delivered and not yet answered.", _SUB)
CONSUMER_RDY = _g("consumer_rdy", "The RDY count last sent on each connection.", _SUB)
CONSUMER_BACKOFF = _g("consumer_backoff_active",
                      "1 while the consumer is in backoff (RDY held low), else 0.",
                      ("topic", "channel"), unit="1")
CONSUMER_PROCESS = _h("consumer_process_duration_seconds",
                      "Time from handing a message to the handler (or to async for) to its "
                      "answer.",
                      ("topic", "channel"), _DURATION, "messaging.process.duration")
CONSUMER_LATENCY = _h("consumer_end_to_end_latency_seconds",
                      "Time the handler (or async for) got the message minus its timestamp "
                      "(its publish time on nsqd; redeliveries keep it).",
                      ("topic", "channel"), _LATENCY)
ORDERED_GAPS = _c("consumer_ordered_offset_gaps",
                  "Ordered consumption: deliveries whose queue offset skipped ahead.",
                  ("topic", "channel", "partition"))
ORDERED_VIOLATIONS = _c("consumer_ordered_violations",
                        "Ordered consumption: deliveries out of order (offset went back).",
                        ("topic", "channel", "partition"))

# -- producer ---------------------------------------------------------------------------
PRODUCER_SENT = _c("producer_messages_sent", "Messages published, by command and result.",
                   ("topic", "command", "result"), "messaging.client.sent.messages")
PRODUCER_PUBLISHES = _c("producer_publishes", "Publish operations (one per PUB/MPUB/... "
                        "call), by command and result.", ("topic", "command", "result"),
                        unit="{operation}")
PRODUCER_DURATION = _h("producer_publish_duration_seconds",
                       "Time from a publish call to its answer, retries included.",
                       ("topic", "command"), _DURATION, "messaging.client.operation.duration")
PRODUCER_ATTEMPTS = _c("producer_attempts", "Attempts sent to an nsqd, by result (more "
                       "than publishes when retried; a dial that failed while a publish "
                       "waited for its nsqd is one).", ("topic", "nsqd", "result"),
                       unit="{attempt}")
PRODUCER_RETRIES = _c("producer_retries", "Attempts that were retries of a failed one.",
                      ("topic",), unit="{attempt}")
PRODUCER_REDIRECTS = _c("producer_leader_redirects",
                        "youzan: publishes redirected after a not-leader answer.",
                        ("topic", "nsqd"), unit="{redirect}")
PRODUCER_LEADER_WAITS = _c("producer_leader_waits",
                           "youzan: waits for a partition leader while none was known.",
                           ("topic",), unit="{wait}")
PRODUCER_BATCH = _h("producer_batch_size_messages", "Messages per MPUB (or auto-batch).",
                    ("topic",), _BATCH, unit=_MSG)
PRODUCER_CONNECTIONS = _g("producer_connections", "The producer's connections by state.",
                          ("nsqd", "state"), unit="{connection}")
PRODUCER_RECONNECTS = _c("producer_reconnects", "Connections the producer re-made after "
                         "one was lost.", ("nsqd",), unit="{connection}")

# -- lookup -----------------------------------------------------------------------------
LOOKUP_QUERIES = _c("lookup_queries", "HTTP queries to lookupds, by result.",
                    ("lookupd", "result"), unit="{query}")
LOOKUP_DEMOTIONS = _c("lookup_demotions", "Times a failing lookupd was demoted.",
                      ("lookupd",), unit="{demotion}")
LOOKUP_REFRESH = _h("lookup_refresh_duration_seconds", "Time one refresh of the topology "
                    "took (all lookupds).", (), _DURATION)
LOOKUP_TOPICS = _g("lookup_topics_tracked", "Topics the lookup keeps refreshed.", (),
                   unit="{topic}")

# -- spark ------------------------------------------------------------------------------
SPARK_SOURCE_ROWS = _c("spark_source_rows", "Rows the nsq source read.",
                       ("topic", "partition"), unit="{row}")
SPARK_SINK_ROWS = _c("spark_sink_rows", "Rows the nsq sink published.", ("topic",),
                     unit="{row}")
SPARK_LAG_MESSAGES = _g("spark_source_lag_messages",
                        "Messages the source's query has not read yet, per partition.",
                        ("topic", "channel", "partition"))
SPARK_LAG_BYTES = _g("spark_source_lag_bytes",
                     "Bytes the source's query has not read yet, per partition.",
                     ("topic", "channel", "partition"), unit="By")

#: every metric above, in this order
ALL: tuple[MetricSpec, ...] = tuple(v for v in list(globals().values())
                                    if isinstance(v, MetricSpec))


def address_label(address: str) -> str:
    """The ``nsqd`` / ``lookupd`` label of an address: ``host:port``, without the scheme of an
    HTTP base URL (``http://host:port``)."""
    return address.partition("://")[2] or address


def by_name(name: str) -> MetricSpec:
    """The spec with this Prometheus base name (without prefix or ``_total``)."""
    for spec in ALL:
        if spec.name == name:
            return spec
    raise KeyError(f"no smartnsq metric is named {name!r}")
