"""What the migration pages, the concept pages, the failure and testing guides and the errors
reference say in prose and tables, checked against the code: default values, names and
parameters of the calls they map to, the exception hierarchy, the backoff windows, and a few
behaviours a migrating user relies on (on the embedded cluster). Their code blocks run in
tests/test_doc_examples.py; nothing else reads their prose."""

from __future__ import annotations

import asyncio
import inspect
import random
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import smartnsq
from smartnsq import errors, sync
from smartnsq.config import ConnectionConfig, ConsumerConfig, ProducerConfig
from smartnsq.consumer import Consumer
from smartnsq.devcluster import DevCluster
from smartnsq.flow.attempts import requeue_delay
from smartnsq.flow.backoff import BackoffState, Pause
from smartnsq.lookup.refresher import jittered_delay
from smartnsq.message import Message
from smartnsq.producer import Producer
from smartnsq.sharding import shard_partition
from smartnsq.testing import NsqCluster, plugin
from smartnsq.testing.cluster import DEFAULT_NODES
from smartnsq.trace import TraceSwitch
from tests.consumer_support import eventually

DOCS = Path(__file__).resolve().parent.parent / "docs"
MIGRATING = ("pynsq", "gnsq", "ansq")
MODELS = {"ConsumerConfig": ConsumerConfig, "ProducerConfig": ProducerConfig,
          "ConnectionConfig": ConnectionConfig}


def page(name: str) -> str:
    """A page's text with every run of whitespace made one space (prose wraps anywhere)."""
    return " ".join((DOCS / name).read_text().split())


def default(model: type, field: str) -> object:
    return model.model_fields[field].default


# --- defaults quoted in prose -----------------------------------------------------------------

#: (page, words quoted from it, model, field, the value those words give as its default)
QUOTED_DEFAULTS = [
    ("concepts/backoff.md", "`ConsumerConfig.max_attempts` times (default 5;",
     ConsumerConfig, "max_attempts", 5),
    ("concepts/backoff.md", "(90 s per attempt, as go-nsq)", ConsumerConfig,
     "default_requeue_delay", 90),
    ("concepts/backoff.md", "`max_requeue_delay` (900 s)", ConsumerConfig,
     "max_requeue_delay", 900),
    ("concepts/backoff.md", "with the default multiplier 1", ConsumerConfig,
     "backoff_multiplier", 1),
    ("concepts/backoff.md", "`max_backoff_duration` (120 s)", ConsumerConfig,
     "max_backoff_duration", 120),
    ("concepts/rdy.md", "`max_in_flight` (default 1, as go-nsq)", ConsumerConfig,
     "max_in_flight", 1),
    ("concepts/rdy.md", "`low_rdy_idle_timeout` (10 s)", ConsumerConfig,
     "low_rdy_idle_timeout", 10),
    ("concepts/rdy.md", "`rdy_redistribute_interval` (5 s)", ConsumerConfig,
     "rdy_redistribute_interval", 5),
    ("concepts/ordered.md", "`drain_timeout` (30 s by default", ConsumerConfig,
     "drain_timeout", 30),
    ("concepts/ordered.md", "`ordered_retry_pause`, 1 s", ConsumerConfig,
     "ordered_retry_pause", 1),
    ("concepts/ordered.md", "`blocked_attempts` (5)", ConsumerConfig, "blocked_attempts", 5),
    ("concepts/partitions.md", "(`publish_timeout`, 10 s)", ProducerConfig,
     "publish_timeout", 10),
    ("concepts/partitions.md", "`request_timeout` (5 s)", ProducerConfig,
     "request_timeout", 5),
    ("concepts/partitions.md", "`max_attempts` (3)", ProducerConfig, "max_attempts", 3),
    ("concepts/partitions.md", "(60 to 78 s)", ConsumerConfig, "lookupd_poll_interval", 60),
    ("guides/failures.md", "`max_attempts` times (default 5)", ConsumerConfig,
     "max_attempts", 5),
    ("guides/failures.md", "(default `publish_timeout`, 10 s)", ProducerConfig,
     "publish_timeout", 10),
    ("migrating/gnsq.md", "(90 s × attempts, capped at 900 s)", ConsumerConfig,
     "max_requeue_delay", 900),
    ("migrating/pynsq.md", "capped at `max_requeue_delay` (900 s)", ConsumerConfig,
     "max_requeue_delay", 900),
]


@pytest.mark.parametrize(("name", "words", "model", "field", "value"), QUOTED_DEFAULTS,
                         ids=[f"{q[0]}:{q[3]}" for q in QUOTED_DEFAULTS])
def test_a_default_quoted_in_prose_is_the_code_default(name: str, words: str, model: type,
                                                       field: str, value: float) -> None:
    assert words in page(name), f"{name} no longer says {words!r}: update QUOTED_DEFAULTS"
    assert default(model, field) == value


def test_the_quoted_poll_range_is_interval_plus_jitter() -> None:
    """partitions.md and pynsq.md: a lookup poll waits 60 to 78 s (never less than 60)."""
    interval = default(ConsumerConfig, "lookupd_poll_interval")
    jitter = default(ConsumerConfig, "lookupd_poll_jitter")
    assert (interval, jitter) == (default(ProducerConfig, "lookupd_poll_interval"),
                                  default(ProducerConfig, "lookupd_poll_jitter"))
    rng = random.Random(7)
    delays = [jittered_delay(interval, jitter, rng) for _ in range(2000)]
    assert 60 <= min(delays) < 61 and 77 < max(delays) <= 78
    assert "60 to 78 s" in page("migrating/pynsq.md")


# --- the migration tables -------------------------------------------------------------------

def table_rows(name: str) -> list[str]:
    return [line for line in (DOCS / name).read_text().splitlines() if line.startswith("| ")]


def config_calls(name: str) -> list[tuple[str, str, str]]:
    """``(model, field, value)`` of every ``Model(field=value)`` in a page's table rows."""
    out = []
    for row in table_rows(name):
        smartnsq_side = row.strip("|").split("|")[-1]
        for model, args in re.findall(r"(\w+Config)\(([^()]*)\)", smartnsq_side):
            out += [(model, f, v.strip()) for f, v in re.findall(r"(\w+)=([^,]*)", args)]
    return out


@pytest.mark.parametrize("peer", MIGRATING)
def test_the_config_fields_a_migration_table_names_exist(peer: str) -> None:
    calls = config_calls(f"migrating/{peer}.md")
    assert calls
    for model, field, _ in calls:
        assert field in MODELS[model].model_fields, f"{peer}.md: {model}({field}=)"


@pytest.mark.parametrize("peer", MIGRATING)
def test_the_numbers_a_migration_table_gives_are_the_defaults(peer: str) -> None:
    """Each ``Config(field=number)`` of a table stands for smartnsq's default, beside the
    peer's (``max_backoff_duration=120`` against pynsq's 128)."""
    for model, field, value in config_calls(f"migrating/{peer}.md"):
        if re.fullmatch(r"[\d.]+", value):
            assert default(MODELS[model], field) == float(value), f"{peer}.md: {field}"


def test_pynsq_same_names_and_defaults() -> None:
    """pynsq.md: pynsq's Reader keywords and defaults that ConsumerConfig shares."""
    row = next(r for r in table_rows("migrating/pynsq.md") if "the same names and defaults" in r)
    peer_side = row.strip("|").split("|")[0]
    pairs = re.findall(r"`(\w+)=([\d.]+)`", peer_side)
    assert len(pairs) == 4
    for field, value in pairs:
        assert default(ConsumerConfig, field) == float(value), field


def params(fn: object) -> set[str]:
    return set(inspect.signature(fn).parameters)  # type: ignore[arg-type]


def test_the_calls_the_migration_pages_map_to_exist() -> None:
    for cls in (Consumer, sync.Consumer):
        assert {"nsqd", "lookupd", "config", "giving_up"} <= params(cls)
        assert {"drain_timeout"} <= params(cls.stop)
        for method in ("start", "stop", "is_starved", "set_max_in_flight", "stats"):
            assert callable(getattr(cls, method)), (cls, method)
    assert "threads" in params(sync.Consumer)
    assert {"timeout"} <= params(sync.Consumer.wait)
    assert {"delay", "backoff"} <= params(Message.requeue)
    for method in ("finish", "touch", "disable_auto_response"):
        assert callable(getattr(Message, method))
    for producer in (Producer, sync.Producer):
        assert {"nsqd", "lookupd", "config"} <= params(producer)
        assert "delay" in params(producer.publish_deferred)
        assert callable(producer.publish) and callable(producer.publish_many)
    assert "BatchReceipt" in str(inspect.signature(Producer.publish_many).return_annotation)


# --- errors ---------------------------------------------------------------------------------

def error_classes() -> list[type[BaseException]]:
    return [obj for name in errors.__all__
            if isinstance(obj := getattr(errors, name), type) and issubclass(obj, BaseException)]


def test_every_error_derives_from_nsqerror_and_is_exported_by_smartnsq() -> None:
    """errors.md: every error is an NSQError, importable from smartnsq and smartnsq.errors."""
    assert len(error_classes()) > 40
    for cls in error_classes():
        assert issubclass(cls, errors.NSQError), cls
        assert getattr(smartnsq, cls.__name__) is cls
        assert cls.__name__ in smartnsq.__all__
    assert "every one is importable from `smartnsq` as well as from `smartnsq.errors`" in page(
        "reference/errors.md")


def test_the_hierarchy_the_failure_guide_promises() -> None:
    text = page("guides/failures.md")
    for sub, base in (("NsqdTcpWrongPortError", "ProtocolError"),
                      ("NsqdHttpWrongPortError", "NsqdUnavailableError"),
                      ("LookupdWrongPortError", "LookupdError")):
        assert f"`{sub}` is a `{base}`" in text or f"`{sub}` an `{base}`" in text or \
            f"`{sub}` a `{base}`" in text, sub
        assert issubclass(getattr(errors, sub), getattr(errors, base))
        assert issubclass(getattr(errors, sub), errors.WrongPortError)
    assert issubclass(errors.PublishTimeoutError, errors.PublishError)
    assert "sent" in inspect.signature(errors.PublishError).parameters
    for name in ("ConfigError", "NotStartedError", "ClientClosedError",
                 "UnsupportedFeatureError", "BlockedMessageError", "SubOrderIsMustError"):
        assert issubclass(getattr(errors, name), errors.NSQError)


# --- backoff and requeue delays -------------------------------------------------------------

def test_backoff_windows_are_the_ones_the_page_lists() -> None:
    """backoff.md: 2 s, 4 s, 8 s ... from the first failure; 64 s at most by default."""
    text = page("concepts/backoff.md")
    assert "(2 s, 4 s, 8 s … from the first failure on" in text
    assert "the longest window is 64 s" in text
    state = BackoffState.from_config(ConsumerConfig())
    windows = []
    for _ in range(9):
        step = state.failure()
        assert isinstance(step, Pause)
        windows.append(step.duration)
        state.window_ended()
    assert windows == [2, 4, 8, 16, 32, 64, 64, 64, 64]


def test_an_explicit_requeue_delay_is_capped_too() -> None:
    """pynsq.md: the delay, given or computed, is capped at max_requeue_delay."""
    cfg = ConsumerConfig()
    cap = {"default_requeue_delay": cfg.default_requeue_delay,
           "max_requeue_delay": cfg.max_requeue_delay}
    assert requeue_delay(1, 3600.0, **cap) == 900_000
    assert requeue_delay(20, None, **cap) == 900_000
    assert requeue_delay(2, None, **cap) == 180_000


# --- the testing guide ------------------------------------------------------------------------

def test_the_marker_keywords_and_fixtures_the_testing_guide_lists() -> None:
    text = page("guides/testing.md")
    assert "`@pytest.mark.nsq(nodes=5, lookupds=2)`" in text
    for option in plugin.MARKER_OPTIONS[2:]:
        assert f"`{option}`" in text, option
    for fixture in (*plugin.SIZED_FIXTURES, *plugin.UNSIZED_FIXTURES):
        assert f"`{fixture}`" in text and callable(getattr(plugin, fixture)), fixture
    assert "a pytest usage error listing the keywords" in text


# --- behaviours, on the embedded cluster ------------------------------------------------------

@pytest.fixture
async def stock() -> AsyncIterator[DevCluster]:
    async with DevCluster(nodes=1, flavour="stock") as cluster:
        cluster.create_topic("t", channels=["c"])
        yield cluster


async def test_a_handler_returning_false_finishes_and_a_second_answer_is_false(
        stock: DevCluster) -> None:
    """pynsq.md: the return value is ignored (pynsq's ``return False`` requeued); answering
    twice sends only the first answer, the second returns False."""
    addr = stock.nsqd_tcp_addresses[0]
    async with Producer(nsqd=addr) as producer:
        await producer.publish_many("t", [b"a", b"b"])
    answers: list[bool] = []
    seen: list[bytes] = []

    async def handle(msg: Message) -> bool:
        seen.append(msg.body)
        if msg.body == b"b":
            answers.extend([msg.finish(), msg.finish(), msg.requeue()])
        return False

    async with Consumer("t", "c", handle, nsqd=addr) as consumer:
        await eventually(lambda: consumer.stats().finished == 2)
        stats = consumer.stats()
    assert sorted(seen) == [b"a", b"b"]
    assert answers == [True, False, False]
    assert (stats.finished, stats.requeued) == (2, 0)
    assert "`return False` finishes the message too" in page("migrating/pynsq.md")


async def test_a_touch_after_the_timeout_is_written_and_returns_true(stock: DevCluster) -> None:
    """touch.md: the client cannot see nsqd's timer: a late touch() returns True (nsqd
    refuses it, E_TOUCH_FAILED, and redelivers the message)."""
    addr = stock.nsqd_tcp_addresses[0]
    async with Producer(nsqd=addr) as producer:
        await producer.publish("t", b"slow")
    late: list[bool] = []
    redelivered = asyncio.Event()

    async def handle(msg: Message) -> None:
        msg.disable_auto_response()
        if msg.attempts == 1:
            await asyncio.wait_for(redelivered.wait(), 5)  # nsqd timed it out meanwhile
            late.append(msg.touch())
            late.append(msg.finish())
        else:
            msg.finish()
            redelivered.set()

    config = ConsumerConfig(max_in_flight=2, connection=ConnectionConfig(msg_timeout=1.0))
    async with Consumer("t", "c", handle, nsqd=addr, config=config) as consumer:
        await eventually(lambda: len(late) == 2)
        assert consumer.is_running and consumer.error is None
    assert late == [True, True]
    assert "`touch()` returns True whenever the command was written" in page(
        "concepts/touch.md")


async def test_a_wrong_port_is_the_cause_of_the_publish_error(stock: DevCluster) -> None:
    """failures.md: a producer given nsqd's HTTP port raises PublishError at once, its
    ``__cause__`` the WrongPortError with address, expected and found."""
    http = stock.nsqd_http_addresses[0]
    with pytest.raises(errors.PublishError) as caught:
        async with asyncio.timeout(5), Producer(nsqd=http) as producer:
            await producer.publish("t", b"x")
    cause = caught.value.__cause__
    assert isinstance(cause, errors.NsqdTcpWrongPortError)
    assert (cause.address, cause.expected) == (http, "nsqd TCP")
    assert "HTTP" in cause.found
    assert "is not an nsqd TCP port: this looks like an HTTP port" in str(caught.value)
    assert "the `__cause__` of its `PublishError`" in page("guides/failures.md")


def test_the_cluster_sizes_and_create_topic_the_testing_guide_gives() -> None:
    text = page("guides/testing.md")
    assert "| `nsq_stock` | function | stock nsqd 1.3: one nsqd, one nsqlookupd |" in text
    assert "| `nsq_youzan` | function | youzan: three nsqd, one nsqlookupd |" in text
    assert DEFAULT_NODES == {"stock": 1, "youzan": 3}
    assert inspect.signature(NsqCluster).parameters["lookupds"].default == 1
    shown = "`create_topic(name, partitions=1, replicas=1, channels=(), ordered=False)`"
    assert shown in text
    real = inspect.signature(NsqCluster.create_topic).parameters
    assert [f"{p.name}={p.default!r}" if p.default is not p.empty else p.name
            for p in list(real.values())[1:]] == shown.strip("`")[13:-1].split(", ")


def test_the_msg_timeout_range_the_touch_page_gives() -> None:
    assert "(1 to 900 s, within the server's maximum)" in page("concepts/touch.md")
    for ok in (0, 1, 900):
        ConnectionConfig(msg_timeout=ok)
    for bad in (0.5, 901):
        with pytest.raises(errors.ConfigError, match="msg_timeout"):
            ConnectionConfig(msg_timeout=bad)


def test_shard_keys_as_the_ordered_page_describes_them() -> None:
    """ordered.md: under murmur3 42, "42" and b"42" are one key; under java an int and a str
    usually differ and bytes are refused; a lone surrogate is refused under murmur3 only."""
    text = page("concepts/ordered.md")
    assert "so `42`, `\"42\"` and `b\"42\"` are one key" in text
    assert "`bytes` keys are refused" in text
    assert len({shard_partition(k, 7) for k in (42, "42", b"42")}) == 1
    assert shard_partition(42, 7, "java") != shard_partition("42", 7, "java")
    with pytest.raises(errors.ConfigError):
        shard_partition(b"42", 7, "java")
    with pytest.raises(errors.ConfigError, match="pass its bytes"):
        shard_partition("\ud800", 7)
    assert 0 <= shard_partition("\ud800", 7, "java") < 7


def test_the_trace_switch_as_the_tracing_page_describes_it() -> None:
    """tracing.md: disable(topic) turns one topic off while the rest is on, reset(topic)
    makes it follow the global setting again."""
    text = page("concepts/tracing.md")
    assert "`disable(topic)` turns one topic off while the rest is on" in text
    switch = TraceSwitch()
    switch.enable()
    switch.disable("a")
    assert (switch.is_on("a"), switch.is_on("b")) == (False, True)
    switch.reset("a")
    assert switch.is_on("a")
    switch.disable()
    assert not switch.is_on("a")
