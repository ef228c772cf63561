"""What the migration pages, the concept pages, the failure and testing guides and the errors
reference say in prose and tables, checked against the code: default values, names and
parameters of the calls they map to, the exception hierarchy, the backoff windows, and a few
behaviours a migrating user relies on (on the embedded cluster); also what the CLI and Spark
guides and the protocol notes say of a secured nsqd (options, defaults, which errors stop a
command or a consumer), on an embedded nsqd requiring TLS, a client certificate and AUTH.
Their code blocks run in tests/test_doc_examples.py; nothing else reads their prose."""

from __future__ import annotations

import asyncio
import inspect
import random
import re
import shlex
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import smartnsq
from smartnsq import errors, sync
from smartnsq.config import ConnectionConfig, ConsumerConfig, ProducerConfig
from smartnsq.consumer import Consumer
from smartnsq.devcluster import DevCluster
from smartnsq.errors import ConfigError
from smartnsq.flow.attempts import requeue_delay
from smartnsq.flow.backoff import BackoffState, Pause
from smartnsq.lookup.refresher import jittered_delay
from smartnsq.message import Message
from smartnsq.producer import Producer
from smartnsq.sharding import shard_partition
from smartnsq.testing import NsqCluster, plugin
from smartnsq.testing.cluster import DEFAULT_NODES
from smartnsq.trace import TraceSwitch
from tests.cli_support import ClusterThread, invoke, sh
from tests.consumer_support import eventually
from tests.real_upgrades_support import LOCKED, AuthServer, Certs

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


# --- secured nsqd: the command line, the Spark options, the consumer's stops -----------------

def section(name: str, heading: str) -> str:
    """The text of a page's section, from its heading to the next of its level or above."""
    text = (DOCS / name).read_text()
    start = text.index(heading)
    level = len(heading.split(" ")[0])
    after = text.index("\n", start)
    end = re.search(rf"^#{{1,{level}}} ", text[after:], re.MULTILINE)
    return text[start:after + end.start()] if end else text[start:]


def cli_wire_options() -> list[str]:
    """The options of the CLI guide's TLS, compression and AUTH table."""
    rows = [r for r in section("guides/cli.md", "## TLS, compression and AUTH").splitlines()
            if r.startswith("| `")]
    return [o for r in rows for o in re.findall(r"`(--[\w-]+)", r.split("|")[1])]


def help_text(*args: str) -> str:
    result = invoke([*args, "--help"])
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


#: the commands the CLI guide gives only the TLS options, for nsqd's HTTPS API
HTTPS_COMMANDS = [("stat",), ("topic", "create"), ("topic", "delete"), ("channel", "create"),
                  ("channel", "delete"), ("channel", "empty"), ("channel", "pause"),
                  ("channel", "unpause")]


def test_the_cli_wire_options_are_on_the_commands_the_guide_names() -> None:
    """cli.md: publish, tail and to-file take every option of the table, bridge each with
    --from- and --to-, stat/topic/channel the --tls ones (not channel set-offset)."""
    options = cli_wire_options()
    assert len(options) == 9 and "--tls-insecure-skip-verify" in options
    for command in ("publish", "tail", "to-file"):
        shown = help_text(command)
        assert all(f" {o} " in shown for o in options), command
    shown = help_text("bridge")
    for o in options:
        assert f" --from-{o[2:]} " in shown and f" --to-{o[2:]} " in shown, o
    tls = [o for o in options if o.startswith("--tls")]
    assert len(tls) == 5
    for words in HTTPS_COMMANDS:
        shown = help_text(*words)
        assert all(f" {o} " in shown for o in tls), words
        assert " --snappy " not in shown and " --auth-secret " not in shown, words
    assert "--tls" not in help_text("channel", "set-offset")
    assert "(all but the youzan-only `channel set-offset`" in page("guides/cli.md")


def test_the_secret_variables_the_cli_guide_names() -> None:
    text = page("guides/cli.md")
    assert "better `SMARTNSQ_AUTH_SECRET`" in text and "`SMARTNSQ_FROM_AUTH_SECRET`" in text
    for command in ("publish", "tail", "to-file"):
        assert "[env var: SMARTNSQ_AUTH_SECRET]" in help_text(command), command
    shown = help_text("bridge")
    for side in ("FROM", "TO"):
        assert f"[env var: SMARTNSQ_{side}_AUTH_SECRET]" in shown, side


@pytest.mark.parametrize(("args", "named"), [
    (["--tls-root-ca-file", "/nonexistent/ca.pem"], "--tls-root-ca-file"),
    (["--snappy", "--deflate"], "--deflate cannot be used with --snappy"),
    (["--tls-key", __file__], "--tls-key needs --tls-cert"),
], ids=["missing-file", "snappy-deflate", "key-without-cert"])
def test_the_usage_errors_the_cli_guide_lists(args: list[str], named: str) -> None:
    assert ("A missing file, `--snappy` with `--deflate`, or `--tls-key` without `--tls-cert` "
            "is a usage error (exit 2)") in page("guides/cli.md")
    result = invoke(["tail", "t", "--nsqd", "127.0.0.1:4150", *args])
    assert result.exit_code == 2, result.output
    assert named in " ".join(result.output.split())


def spark_wire_table() -> dict[str, str]:
    """``option: default`` of the Spark guide's Secured nsqd table."""
    out = {}
    for row in section("guides/spark.md", "## Secured nsqd").splitlines():
        cells = [c.strip() for c in row.strip("|").split("|")]
        if row.startswith("| `") and len(cells) == 3:
            for name in re.findall(r"`(\w+)`", cells[0]):
                out[name] = cells[1]
    return out


def test_the_spark_wire_options_and_defaults_are_the_connectors(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from smartnsq.spark.wire_options import (
        AUTH_SECRET_ENV,
        WIRE_OPTION_NAMES,
        parse_wire_options,
    )

    table = spark_wire_table()
    assert list(table) == list(WIRE_OPTION_NAMES)
    assert {table[n] for n in ("tls", "tlsInsecureSkipVerify", "snappy", "deflate")} == {
        "`false`"}
    assert table["deflateLevel"] == "`6`" and table["authSecret"] == f"`{AUTH_SECRET_ENV}`"
    assert AUTH_SECRET_ENV == "SMARTNSQ_AUTH_SECRET"

    def fail(why: str) -> ConfigError:
        raise AssertionError(why)

    monkeypatch.setenv(AUTH_SECRET_ENV, "from-env")
    plain = parse_wire_options({}, fail).connection()
    assert not (plain.tls.enabled or plain.snappy or plain.deflate)
    assert plain.auth_secret is not None and plain.auth_secret.get_secret_value() == "from-env"
    deflate = parse_wire_options({"deflate": "true"}, fail).connection()
    assert deflate.deflate_level == 6 == default(ConnectionConfig, "deflate_level")
    tls = parse_wire_options({"tls": "true"}, fail).connection().tls
    assert tls.enabled and tls.verify and tls.ca_file is None  # the system's CAs
    assert "`--deflate-level 1-9`" in page("guides/cli.md")
    assert "deflate level (default 6;" in help_text("tail")


@pytest.mark.parametrize(("given", "named"), [
    ({"snappy": "true", "deflate": "true"}, "deflate="),
    ({"deflateLevel": "3"}, "deflateLevel="),
    ({"deflate": "true", "deflateLevel": "10"}, "deflateLevel="),
    ({"tlsKey": __file__}, "tlsKey="),
    ({"tls": "false", "tlsRootCaFile": __file__}, "tlsRootCaFile="),
], ids=["snappy-deflate", "level-without-deflate", "level-10", "key-without-cert",
        "file-with-tls-false"])
def test_the_spark_checks_the_guide_lists_name_the_option(given: dict[str, str],
                                                          named: str) -> None:
    from smartnsq.spark.wire_options import parse_wire_options

    text = page("guides/spark.md")
    assert ("`snappy` with `deflate`, a `deflateLevel` without `deflate` or outside 1–9, "
            "`tlsKey` without `tlsCert`, or a TLS option with `tls=false` fail `load()`") in text
    with pytest.raises(ConfigError) as caught:
        parse_wire_options(given, lambda why: ConfigError(why))
    assert str(caught.value).startswith(named), caught.value


def test_the_secret_option_names_spark_redacts_are_redacted_by_the_connector() -> None:
    from smartnsq.spark.wire_options import shown

    assert "its default matches `secret`, `password` and `token`, among others" in page(
        "guides/spark.md")
    for key in ("authSecret", "myPassword", "apiToken"):
        assert "redacted" in shown(key, "hunter2"), key
    assert shown("topic", "orders") == "'orders'"


def test_the_errors_that_stop_a_consumer_are_the_ones_the_failure_guide_lists() -> None:
    """failures.md, A consumer that stops by itself: what stops it at start, what is retried,
    and the three retried once it has subscribed."""
    import ssl

    from smartnsq.consumer.sub_errors import ends_consumer

    text = page("guides/failures.md")
    assert "An `E_AUTH_FAILED`, a refused IDENTIFY or a certificate that does not verify, " \
           "after the consumer has subscribed once, is retried instead" in text
    assert "AUTH secret missing (an nsqd that requires AUTH) or refused" in text
    cert = errors.TLSError("TLS handshake failed")
    cert.__cause__ = ssl.SSLCertVerificationError("certificate verify failed")
    refused_identify = errors.BadBodyError("IDENTIFY msg_timeout (900000) is invalid")
    stops = [errors.BadTopicError("bad"), errors.BadChannelError("bad"),
             errors.SubOrderIsMustError("x"), errors.UnsupportedFeatureError("youzan"),
             errors.ConfigError("nsqd requires AUTH but no auth_secret is configured"),
             errors.InvalidError("cannot AUTH in current state (TLS required)"),
             errors.AuthFailedError("AUTH failed"), errors.UnauthorizedError("AUTH failed"),
             refused_identify, cert]
    retried = [errors.NSQConnectionError("refused"), errors.TopicNotExistError("t"),
               errors.TooManyConnectionsError(""), errors.ServerNotLeaderError(""),
               errors.TLSError("reset during the handshake")]
    assert [ends_consumer(e) for e in stops] == [True] * len(stops)
    assert [ends_consumer(e) for e in retried] == [False] * len(retried)
    once_subscribed = [ends_consumer(e, subscribed=True) for e in stops]
    assert once_subscribed == [True] * 6 + [False, True, False, False]


@dataclass
class Locked:
    """An embedded nsqd requiring TLS with a client certificate and AUTH."""
    tcp: str
    certs: Certs

    def tls(self, side: str = "", ca: str | None = None, cert: str | None = None) -> str:
        ca = ca or self.certs.ca_file
        cert = cert or self.certs.client_pem
        return f"--{side}tls-root-ca-file {ca} --{side}tls-cert {cert}"


@pytest.fixture(scope="module")
def locked(certs: Certs, auth_server: AuthServer) -> Iterator[Locked]:
    ct = ClusterThread(nodes=1, flavour="stock", **LOCKED.double(certs, auth_server))
    try:
        yield Locked(ct.cluster.nsqd_tcp_addresses[0], certs)
    finally:
        ct.stop()


CLI = f"{shlex.quote(sys.executable)} -m smartnsq"


def run_sh(script: str) -> tuple[int, list[str], float]:
    began = time.monotonic()
    r = sh(script)
    return r.returncode, r.stderr.decode().splitlines(), time.monotonic() - began


def test_what_the_cli_guide_says_of_a_refused_secret_or_certificate(locked: Locked) -> None:
    """cli.md: a refused secret or an nsqd certificate that does not verify is one line and
    exit 1 at once; a refused client certificate is retried by tail (not publish, not
    bridge's destination) until --connect-timeout."""
    text = page("guides/cli.md")
    assert "ends the command at once: one line on stderr and exit 1" in text
    assert "`publish` and `bridge`'s destination end at once, but `tail`, `to-file` and " \
           "`bridge`'s source retry it as an unreachable nsqd" in text
    t, c = locked.tcp, locked.certs
    at_once = [
        f"SMARTNSQ_AUTH_SECRET=wr0ng {CLI} tail t --nsqd {t} {locked.tls()}",
        f"SMARTNSQ_AUTH_SECRET=good {CLI} to-file t --output-dir {c.dir}/out --nsqd {t} "
        f"{locked.tls(ca=c.wrong_ca_file)}",
        f"printf 'x\\n' | SMARTNSQ_AUTH_SECRET=good {CLI} publish t --nsqd {t} "
        f"{locked.tls(cert=c.stranger_pem)}",
        f"SMARTNSQ_FROM_AUTH_SECRET=wr0ng SMARTNSQ_TO_AUTH_SECRET=good {CLI} bridge t u "
        f"--from-nsqd {t} {locked.tls('from-')} --to-nsqd {t} {locked.tls('to-')}",
        # the destination: whatever its publishes would not retry (it was retried until
        # --connect-timeout, and for ever with 0)
        f"SMARTNSQ_FROM_AUTH_SECRET=good SMARTNSQ_TO_AUTH_SECRET=wr0ng {CLI} bridge t u "
        f"--from-nsqd {t} {locked.tls('from-')} --to-nsqd {t} {locked.tls('to-')}",
        f"SMARTNSQ_FROM_AUTH_SECRET=good SMARTNSQ_TO_AUTH_SECRET=good {CLI} bridge t u "
        f"--from-nsqd {t} {locked.tls('from-')} --to-nsqd {t} "
        f"{locked.tls('to-', cert=c.stranger_pem)}",
    ]
    # with --connect-timeout well past what "at once" allows
    at_once = [s if " publish " in s else f"{s} --connect-timeout 30" for s in at_once]
    for script in at_once:
        code, err, took = run_sh(script)
        assert (code, len(err)) == (1, 1) and took < 15, (script, err, took)
    retried = [
        f"SMARTNSQ_AUTH_SECRET=good {CLI} tail t --nsqd {t} {locked.tls(cert=c.stranger_pem)}",
    ]
    for script in retried:
        code, err, took = run_sh(f"{script} --connect-timeout 1")
        assert code == 1 and took >= 1, (script, err, took)
        assert "warning" in err[0] and "within 1 s (--connect-timeout)" in err[-1], err


def test_tls_required_refuses_auth_as_the_protocol_notes_say(locked: Locked) -> None:
    """protocol.md §3.1.1: without TLS, AUTH too is fatal E_INVALID ... (TLS required); the
    consumer stops at once (failures.md)."""
    assert "NOP and AUTH included, is fatal `E_INVALID cannot <command> in current state " \
           "(TLS required)`" in page("protocol.md")
    code, err, _ = run_sh(f"SMARTNSQ_AUTH_SECRET=good {CLI} tail t --nsqd {locked.tcp} "
                          "--connect-timeout 5")
    assert code == 1 and len(err) == 1, err
    assert "E_INVALID cannot AUTH in current state (TLS required)" in err[0]
    code, err, _ = run_sh(f"{CLI} tail t --nsqd {locked.tcp} {locked.tls()} "
                          "--connect-timeout 5")
    assert code == 1 and len(err) == 1 and "requires AUTH but no auth_secret" in err[0], err


def test_the_http_clients_tls_as_their_docstrings_say(certs: Certs) -> None:
    """HttpProducer (its config.connection.tls) / NsqdHttpClient (tls=): without TLS the
    system's CAs; an enabled TLSConfig without an https:// address, or a file it cannot
    load, is a ConfigError at construction; nsqd's TLS_REQUIRED names the way to reach it."""
    from smartnsq.config import TLSConfig
    from smartnsq.nsqd_http import NsqdHttpClient, https_context, known_error
    from smartnsq.producer import HttpProducer

    assert https_context(None) is True and https_context(TLSConfig()) is True
    tls = TLSConfig(enabled=True, ca_file=certs.ca_file)
    with pytest.raises(ConfigError, match="https://"):
        HttpProducer(nsqd=["127.0.0.1:4151"],
                     config=ProducerConfig(connection=ConnectionConfig(tls=tls)))
    with pytest.raises(ConfigError, match=r"tls\.ca_file"):
        NsqdHttpClient(tls=TLSConfig(enabled=True, ca_file=certs.server_key))
    answer = known_error("TLS_REQUIRED", address="127.0.0.1:4151")
    assert answer is not None and "https://" in str(answer) and "--https-address" in str(answer)
    text = " ".join(page("guides/cli.md").split())
    assert "`ProducerConfig(connection=ConnectionConfig(tls=TLSConfig(enabled=True, " \
           "ca_file=\"ca.pem\")))`, for `Producer` as for `HttpProducer(nsqd=" \
           "[\"https://127.0.0.1:4152\"], config=...)`" in text
