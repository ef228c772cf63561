"""Bad input to the consumer fails at the call, before any I/O (nothing listens on the
addresses used here, so any attempt to connect would show up as a different error)."""

from __future__ import annotations

import functools

import pytest

from smartnsq.config import ConsumerConfig
from smartnsq.consumer import Consumer
from smartnsq.consumer.discovery import DirectDiscovery
from smartnsq.errors import ClientClosedError, ConfigError, InvalidNameError, NotStartedError
from smartnsq.message import Message
from smartnsq.protocol.commands import OffsetSpec

NSQD = ["127.0.0.1:1"]


async def handler(msg: Message) -> None:
    return None


@pytest.mark.parametrize("topic", ["", "a b", "x" * 65, "bad/topic", "t\n", 5])
def test_invalid_topic(topic: object) -> None:
    with pytest.raises(InvalidNameError):
        Consumer(topic, "c", handler, nsqd=NSQD)  # type: ignore[arg-type]


@pytest.mark.parametrize("channel", ["", "c c", "y" * 65, "c#notephemeral"])
def test_invalid_channel(channel: str) -> None:
    with pytest.raises(InvalidNameError):
        Consumer("t", channel, handler, nsqd=NSQD)


def test_ephemeral_names_are_fine() -> None:
    c = Consumer("t#ephemeral", "c#ephemeral", handler, nsqd=NSQD)
    assert c.topic == "t#ephemeral"


def test_max_in_flight_negative() -> None:
    with pytest.raises(ConfigError, match="max_in_flight"):
        Consumer("t", "c", handler, nsqd=NSQD,
                 config=ConsumerConfig(max_in_flight=-1))


@pytest.mark.parametrize("value", [-1, 1.5, "3", True])
def test_set_max_in_flight_rejects(value: object) -> None:
    c = Consumer("t", "c", handler, nsqd=NSQD)
    with pytest.raises(ConfigError):
        c.set_max_in_flight(value)  # type: ignore[arg-type]
    assert c.max_in_flight == 1


def test_handler_not_callable() -> None:
    with pytest.raises(ConfigError, match="async callable"):
        Consumer("t", "c", "nope", nsqd=NSQD)  # type: ignore[arg-type]


def test_handler_not_async() -> None:
    def sync_handler(msg: Message) -> None:
        return None

    with pytest.raises(ConfigError, match="async function"):
        Consumer("t", "c", sync_handler, nsqd=NSQD)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="async function"):
        Consumer("t", "c", lambda m: None, nsqd=NSQD)  # type: ignore[arg-type]


def test_async_callables_accepted() -> None:
    class Handler:
        async def __call__(self, msg: Message) -> None:
            return None

    async def with_extra(msg: Message, extra: int) -> None:
        return None

    Consumer("t", "c", Handler(), nsqd=NSQD)
    Consumer("t", "c", functools.partial(with_extra, extra=1), nsqd=NSQD)


def test_sources() -> None:
    # one check and one error for every client: its text names the client and both options
    with pytest.raises(ConfigError, match=r"^Consumer: give nsqd= .* or lookupd= .*one of them"):
        Consumer("t", "c", handler)
    with pytest.raises(ConfigError, match=r"^Consumer: give nsqd= .* or lookupd= .*not both"):
        Consumer("t", "c", handler, nsqd=NSQD,
                 lookupd=["127.0.0.1:2"])
    with pytest.raises(ConfigError, match=r"^Consumer: nsqd= is empty"):
        Consumer("t", "c", handler, nsqd=[])
    with pytest.raises(ConfigError, match=r"^Consumer: nsqd=: invalid address 'no-port'"):
        Consumer("t", "c", handler, nsqd=["no-port"])
    with pytest.raises(ConfigError, match=r"^Consumer: nsqd= must hold address strings"):
        Consumer("t", "c", handler, nsqd=[4150])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match=r"^Consumer: nsqd= must be an address string"):
        Consumer("t", "c", handler, nsqd=b"127.0.0.1:4150")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^Consumer: lookupd=: invalid HTTP address"):
        Consumer("t", "c", handler, lookupd=["ftp://x:1"])
    with pytest.raises(ConfigError, match=r"^Consumer: lookupd= must be an address string"):
        Consumer("t", "c", handler, lookupd=object())  # type: ignore[arg-type]


def test_one_address_string_is_one_address() -> None:
    # nsqd= takes one "host:port" as well as a list (it used to refuse a bare string)
    one = Consumer("t", "c", handler, nsqd="127.0.0.1:4150")._discovery
    listed = Consumer("t", "c", handler, nsqd=["127.0.0.1:4150"])._discovery
    assert isinstance(one, DirectDiscovery) and isinstance(listed, DirectDiscovery)
    assert one.topology.endpoints == listed.topology.endpoints
    assert [e.address for e in one.topology.endpoints.values()] == ["127.0.0.1:4150"]


def test_config_type_and_callbacks() -> None:
    with pytest.raises(ConfigError):
        Consumer("t", "c", handler, nsqd=NSQD,
                 config={"max_in_flight": 5})  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        Consumer("t", "c", handler, nsqd=NSQD,
                 giving_up=42)  # type: ignore[arg-type]


def test_start_at_needs_lookups_and_valid_specs() -> None:
    with pytest.raises(ConfigError, match="start_at needs"):
        Consumer("t", "c", handler, nsqd=NSQD, start_at=OffsetSpec.end())
    lookupd = ["127.0.0.1:2"]
    with pytest.raises(ConfigError):
        Consumer("t", "c", handler, lookupd=lookupd,
                 start_at={-1: OffsetSpec.end()})
    # a partition's position may be named as the whole start_at is ("end", "earliest")
    Consumer("t", "c", handler, lookupd=lookupd, start_at={0: "end", 1: "earliest"})
    with pytest.raises(ConfigError, match=r"start_at\[0\] must be 'earliest', 'end' or an "
                       r"OffsetSpec, got 'latest'"):
        Consumer("t", "c", handler, lookupd=lookupd,
                 start_at={0: "latest"})  # type: ignore[dict-item]
    with pytest.raises(ConfigError):
        Consumer("t", "c", handler, lookupd=lookupd,
                 start_at="virtual_queue:0")  # type: ignore[arg-type]


async def test_iterating_before_start_is_refused() -> None:
    # async for no longer starts the consumer: it says how to start it
    c = Consumer("t", "c", nsqd=NSQD)
    with pytest.raises(NotStartedError, match=r"start\(\)") as info:
        async for _ in c:
            pass
    assert "async with" in str(info.value)
    assert not c.is_running and not c.is_closed
    await c.stop()
    assert c.is_closed


def test_start_at_error_names_the_options_that_exist() -> None:
    # the advice must name API 1.0's spelling (lookupd=), not the removed keywords
    with pytest.raises(ConfigError, match="start_at needs") as info:
        Consumer("t", "c", handler, nsqd=NSQD, start_at=OffsetSpec.end())
    text = str(info.value)
    assert "lookupd=" in text
    assert "lookupd_http_addresses" not in text and "lookup=" not in text


def test_iterating_a_handler_consumer() -> None:
    c = Consumer("t", "c", handler, nsqd=NSQD)
    with pytest.raises(ConfigError, match="handler"):
        c.__aiter__()


async def test_use_after_close() -> None:
    c = Consumer("t", "c", handler, nsqd=NSQD)
    await c.stop()
    assert c.is_closed
    with pytest.raises(ClientClosedError):
        await c.start()
    with pytest.raises(ClientClosedError):
        c.set_max_in_flight(3)
    await c.stop()  # idempotent


async def test_bad_drain_timeout() -> None:
    c = Consumer("t", "c", handler, nsqd=NSQD)
    with pytest.raises(ConfigError):
        await c.stop(drain_timeout=-1)
    assert not c.is_closed
