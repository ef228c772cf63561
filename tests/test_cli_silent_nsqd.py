"""An nsqd that accepts connections and never answers (hung, or a port that swallows
requests): ``stat`` and the topic and channel admin commands give up after the HTTP timeout
(5 s) with a message that names the address and the seconds waited, not a bare
"TimeoutError"."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tests.cli_support import ClusterThread, cluster_fixture, smartnsq
from tests.silent_server import Silent, silent_servers

stock = cluster_fixture("stock", nodes=1)

#: NsqdHttpClient's default timeout, which the CLI commands use
HTTP_TIMEOUT = 5


@pytest.fixture
async def silent_nsqds() -> AsyncIterator[Callable[[], Awaitable[Silent]]]:
    async with silent_servers() as make:
        yield make


async def test_commands_name_the_silent_nsqd_and_the_seconds_waited(
        silent_nsqds: Callable[[], Awaitable[Silent]]) -> None:
    commands = [
        ["stat", "--once"],
        ["stat", "--once", "--json"],
        ["channel", "empty", "orders", "c"],
        ["channel", "pause", "orders", "c", "--partition", "1"],
        ["topic", "create", "orders"],
        ["topic", "delete", "orders"],
    ]
    # a silent nsqd each, to time each command from its first connection (not from the
    # interpreter's start); all at once: one after another would take 5 s each
    nsqds = [await silent_nsqds() for _ in commands]

    async def run(command: list[str], nsqd: Silent) -> tuple[float, int, str]:
        code, out, err = await smartnsq(*command, "--nsqd", nsqd.address,
                                        bound=HTTP_TIMEOUT * 4)
        assert nsqd.first_accept is not None, (command, out + err)
        return time.monotonic() - nsqd.first_accept, code, (out + err).decode()

    results = await asyncio.gather(*(run(c, n) for c, n in zip(commands, nsqds, strict=True)))
    for command, nsqd, (took, code, text) in zip(commands, nsqds, results, strict=True):
        assert code == 1, (command, text)
        assert "Traceback" not in text and "still running" not in text, (command, text)
        said = [line for line in text.splitlines() if nsqd.address in line]
        assert any(f"no answer within {HTTP_TIMEOUT} s" in line for line in said), \
            (command, text)
        # the timeout once, not once per request (the /info asked first, then the call)
        assert took < HTTP_TIMEOUT * 2 - 1, (command, took)


async def test_stat_shows_the_silent_nsqd_beside_one_that_answers(
        stock: ClusterThread, silent_nsqds: Callable[[], Awaitable[Silent]]) -> None:
    silent = (await silent_nsqds()).address
    live = stock.cluster.nsqd_http_addresses[0]
    stock.call(lambda: stock.cluster.create_topic("beside", channels=["c"]))
    code, out, err = await smartnsq("stat", "--nsqd", live, "--nsqd", silent, "--once",
                                    "--json", bound=HTTP_TIMEOUT + 10)
    assert code == 0, err
    nodes = {n["http_address"]: n["error"] for n in json.loads(out)["nodes"]}
    assert nodes[live] is None
    assert nodes[silent] is not None and f"within {HTTP_TIMEOUT} s" in nodes[silent]


async def test_stat_once_table_waits_for_the_silent_nsqd_once(
        stock: ClusterThread, silent_nsqds: Callable[[], Awaitable[Silent]]) -> None:
    """The table of ``stat --once`` takes two samples (for its rates): an nsqd that did not
    answer the first is reported, not asked again for another HTTP timeout."""
    silent = await silent_nsqds()
    live = stock.cluster.nsqd_http_addresses[0]
    stock.call(lambda: stock.cluster.create_topic("beside_once", channels=["c"]))
    code, out, err = await smartnsq("stat", "--nsqd", live, "--nsqd", silent.address,
                                    "--once", "--interval", "0.5",
                                    bound=HTTP_TIMEOUT * 3 + 10)
    assert silent.first_accept is not None
    took = time.monotonic() - silent.first_accept
    text = (out + err).decode()
    assert code == 0, text
    assert "beside_once" in text
    said = [line for line in text.splitlines() if silent.address in line]
    assert len(said) == 1 and f"no answer within {HTTP_TIMEOUT} s (timed out)" in said[0], text
    assert silent.accepted == 1, silent.accepted
    assert took < HTTP_TIMEOUT + 3, took
