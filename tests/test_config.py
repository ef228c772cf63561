"""Config models: go-nsq defaults, validation naming the field, safe reprs."""

from __future__ import annotations

import pytest

from smartnsq.config import (
    ConnectionConfig,
    ConsumerConfig,
    LookupConfig,
    ProducerConfig,
    TLSConfig,
)
from smartnsq.errors import ConfigError
from smartnsq.protocol.validation import parse_http_address, parse_tcp_address


def test_defaults_follow_go_nsq() -> None:
    c = ConsumerConfig()
    assert (c.max_in_flight, c.max_attempts, c.default_requeue_delay, c.max_requeue_delay) == (
        1, 5, 90.0, 900.0)
    assert (c.backoff_multiplier, c.max_backoff_duration) == (1.0, 120.0)
    assert (c.low_rdy_idle_timeout, c.low_rdy_timeout, c.rdy_redistribute_interval) == (
        10.0, 30.0, 5.0)
    assert (c.lookupd_poll_interval, c.lookupd_poll_jitter) == (60.0, 0.3)
    conn = ConnectionConfig()
    assert (conn.heartbeat_interval, conn.output_buffer_size, conn.output_buffer_timeout) == (
        30.0, 16384, 0.25)
    assert conn.deflate_level == 6 and conn.tls.verify is True


def test_identify_body_in_milliseconds() -> None:
    body = ConnectionConfig(heartbeat_interval=5, msg_timeout=2.5, output_buffer_timeout=-1,
                            extend_support=True, desired_tag="tagA").identify_body()
    assert body["heartbeat_interval"] == 5000
    assert body["msg_timeout"] == 2500
    assert body["output_buffer_timeout"] == -1
    assert body["feature_negotiation"] is True
    assert body["extend_support"] is True and body["desired_tag"] == "tagA"
    assert "extend_support" not in ConnectionConfig().identify_body()
    assert "topology_zone" not in ConnectionConfig().identify_body()
    zoned = ConnectionConfig(topology_region="eu", topology_zone="eu-1").identify_body()
    assert (zoned["topology_region"], zoned["topology_zone"]) == ("eu", "eu-1")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"heartbeat_interval": 0.5}, "heartbeat_interval"),
        ({"heartbeat_interval": 61}, "heartbeat_interval"),
        ({"output_buffer_size": 10}, "output_buffer_size"),
        ({"output_buffer_timeout": 0.01}, "output_buffer_timeout"),
        ({"msg_timeout": 0.5}, "msg_timeout"),
        ({"sample_rate": 100}, "sample_rate"),
        ({"deflate_level": 0}, "deflate_level"),
        ({"snappy": True, "deflate": True}, "snappy and deflate"),
        ({"dial_timeout": 0}, "dial_timeout"),
        ({"read_timeout": 20, "heartbeat_interval": 30}, "read_timeout"),
        ({"bogus": 1}, "bogus"),
        ({"desired_tag": "x" * 101}, "desired_tag"),
    ],
)
def test_connection_config_errors_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        ConnectionConfig(**kwargs)


def test_consumer_config_errors() -> None:
    with pytest.raises(ConfigError, match="max_in_flight"):
        ConsumerConfig(max_in_flight=-1)
    with pytest.raises(ConfigError, match="lookupd_poll_jitter"):
        ConsumerConfig(lookupd_poll_jitter=2)
    with pytest.raises(ConfigError, match="max_attempts"):
        ProducerConfig(max_attempts=0)


def test_tls_pairs() -> None:
    with pytest.raises(ConfigError, match="cert_file and key_file"):
        TLSConfig(cert_file="c.pem")


def test_auth_secret_hidden_in_repr() -> None:
    c = ConnectionConfig(auth_secret="hunter2")
    assert "hunter2" not in repr(c) and "hunter2" not in str(c.model_dump())
    assert c.auth_secret is not None and c.auth_secret.get_secret_value() == "hunter2"


def test_lookup_config() -> None:
    c = LookupConfig(addresses=("127.0.0.1:4161", "http://127.0.0.1:4261/"))
    assert c.poll_interval == 60.0
    with pytest.raises(ConfigError, match="at least one"):
        LookupConfig(addresses=())
    with pytest.raises(ConfigError, match="invalid HTTP address"):
        LookupConfig(addresses=("nonsense",))


def test_replace_revalidates() -> None:
    c = ConsumerConfig()
    assert c.replace(max_in_flight=10).max_in_flight == 10
    with pytest.raises(ConfigError, match="max_in_flight"):
        c.replace(max_in_flight=-3)


@pytest.mark.parametrize(("addr", "expected"), [
    ("127.0.0.1:4150", ("127.0.0.1", 4150)),
    ("localhost:1", ("localhost", 1)),
    ("[::1]:4150", ("::1", 4150)),
])
def test_parse_tcp_address(addr: str, expected: tuple[str, int]) -> None:
    assert parse_tcp_address(addr) == expected


@pytest.mark.parametrize("addr", ["", "host", "host:", ":4150", "host:99999", "host:x", "h:0"])
def test_parse_tcp_address_rejects(addr: str) -> None:
    with pytest.raises(ConfigError, match="invalid address"):
        parse_tcp_address(addr)


@pytest.mark.parametrize(("addr", "named"), [
    ("tcp://127.0.0.1:4150", "without a scheme"),
    ("http://127.0.0.1:4150", "without a scheme"),
    (" 127.0.0.1:4150", "no spaces or slashes"),
    ("127.0.0.1:4150\n", "no spaces or slashes"),
    ("host/path:4150", "no spaces or slashes"),
])
def test_a_tcp_address_with_a_scheme_space_or_slash_is_refused_at_once(addr: str,
                                                                      named: str) -> None:
    """They passed and failed about a second later at the dial, with the resolver's "Name or
    service not known" (``--nsqd tcp://h:p`` on the command line, a config file's space)."""
    with pytest.raises(ConfigError, match=f"invalid address .*{named}"):
        parse_tcp_address(addr)


@pytest.mark.parametrize(("addr", "expected"), [
    ("127.0.0.1:4161", "http://127.0.0.1:4161"),
    ("http://h:1/", "http://h:1"),
    ("https://h:443", "https://h:443"),
])
def test_parse_http_address(addr: str, expected: str) -> None:
    assert parse_http_address(addr) == expected


@pytest.mark.parametrize("addr", ["", "  ", "ftp://h:1", "http://h", "http://h:1/path",
                                  "http://h:1?x=1", "h:port"])
def test_parse_http_address_rejects(addr: str) -> None:
    with pytest.raises(ConfigError, match="invalid HTTP address"):
        parse_http_address(addr)
