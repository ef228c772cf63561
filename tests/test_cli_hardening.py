"""The command line under an operator's hands: an nsqd that accepts and never answers makes
``stat --client-metrics`` and ``channel set-offset`` give up after the HTTP timeout once (not
twice), naming the address and the seconds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tests.cli_support import smartnsq
from tests.lookup_fakes import FakeLookupd, TopicSpec
from tests.silent_server import Silent, silent_servers

#: NsqdHttpClient's default timeout (and the --client-metrics scrape's), which the CLI uses
HTTP_TIMEOUT = 5


@pytest.fixture
async def silent() -> AsyncIterator[Callable[[], Awaitable[Silent]]]:
    async with silent_servers() as make:
        yield make


def check_one_timeout(command: list[str], nsqd: Silent, code: int, text: str) -> None:
    """Failed with one line naming the silent nsqd and the seconds, within ~1.5x the timeout
    of its first connection (twice the timeout before the fix)."""
    assert code == 1, (command, text)
    assert "Traceback" not in text and "still running" not in text, (command, text)
    said = [line for line in text.splitlines() if nsqd.address in line]
    assert any(f"no answer within {HTTP_TIMEOUT} s (timed out)" in line for line in said), \
        (command, text)
    assert nsqd.first_accept is not None, (command, text)


async def timed(nsqd: Silent, *command: str) -> tuple[float, int, str]:
    code, out, err = await smartnsq(*command, bound=HTTP_TIMEOUT * 4)
    assert nsqd.first_accept is not None, (command, out + err)
    return time.monotonic() - nsqd.first_accept, code, (out + err).decode()


async def test_stat_client_metrics_waits_for_a_silent_nsqd_once(
        silent: Callable[[], Awaitable[Silent]]) -> None:
    # the nsqd silent to its /info (asked for its TCP address) and its /stats; the metrics
    # endpoint silent too: all three waits overlap. Both outputs at once, a silent nsqd each
    async def one(extra: list[str]) -> None:
        nsqd, metrics = await silent(), await silent()
        command = ["stat", "--once", *extra, "--nsqd", nsqd.address, "--client-metrics",
                   metrics.address]
        took, code, text = await timed(nsqd, *command)
        check_one_timeout(command, nsqd, code, text)
        assert took < HTTP_TIMEOUT * 1.5, (command, took)

    await asyncio.gather(one([]), one(["--json"]))


async def test_set_offset_waits_for_a_silent_leader_once(
        silent: Callable[[], Awaitable[Silent]]) -> None:
    # a youzan lookupd that answers, naming as partition 0's leader an nsqd whose HTTP port
    # is silent: offset and count positions read the partition's end first (/stats)
    async def one(to: str) -> None:
        nsqd = await silent()
        async with FakeLookupd("youzan") as lookupd:
            lookupd.topics["orders"] = TopicSpec(partitions={0: nsqd.port - 1})  # http=tcp+1
            command = ["channel", "set-offset", "orders", "billing", "--to", to,
                       "--lookupd", lookupd.url]
            took, code, text = await timed(nsqd, *command)
        check_one_timeout(command, nsqd, code, text)
        assert "partition 0" in text, text
        assert took < HTTP_TIMEOUT * 1.5, (command, took)

    await asyncio.gather(*(one(to) for to in ("end", "earliest", "offset:0=5", "count:0=2")))
