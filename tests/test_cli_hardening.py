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

#: NsqdHttpClient's default timeout (and the --client-metrics scrape's), which the CLI uses
HTTP_TIMEOUT = 5


class Silent:
    """A 127.0.0.1 listener that accepts and never writes a byte; notes its first accept."""

    def __init__(self, done: asyncio.Event) -> None:
        self.done = done
        self.first_accept: float | None = None
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> Silent:
        self.server = await asyncio.start_server(self._swallow, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _swallow(self, reader: asyncio.StreamReader,
                       writer: asyncio.StreamWriter) -> None:
        if self.first_accept is None:
            self.first_accept = time.monotonic()
        self.writers.append(writer)
        await self.done.wait()

    async def close(self) -> None:
        for w in self.writers:
            w.close()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@pytest.fixture
async def silent() -> AsyncIterator[Callable[[], Awaitable[Silent]]]:
    done = asyncio.Event()
    made: list[Silent] = []

    async def make() -> Silent:
        made.append(await Silent(done).start())
        return made[-1]

    try:
        yield make
    finally:
        done.set()
        for s in made:
            await s.close()


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
