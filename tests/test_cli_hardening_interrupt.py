"""Ctrl-C while ``smartnsq`` is still importing (most of its ~0.6 s start-up) ends quietly
with 130 and "smartnsq: interrupted", as it does once a command runs: no traceback out of
whichever import it hit, even when the user presses it again and again."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tests.cli_support import killed_at_end, send_signal
from tests.silent_server import Silent, silent_servers

ENTRY_POINTS = {
    "python -m smartnsq": ["-m", "smartnsq"],
    # what the console script's generated wrapper runs
    "smartnsq script": ["-c", "import sys; from smartnsq.cli import main; sys.exit(main())"],
}


@pytest.fixture
async def silent() -> AsyncIterator[Callable[[], Awaitable[Silent]]]:
    async with silent_servers() as make:
        yield make


def imported(line: bytes) -> str:
    """The module an ``-X importtime`` line reports (``import time: self | total | name``)."""
    return line.rsplit(b"|", 1)[-1].strip().decode()


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
async def test_ctrl_c_while_importing_ends_quietly_with_130(
        silent: Callable[[], Awaitable[Silent]], entry: str) -> None:
    nsqd = await silent()
    # -X importtime writes a line as each import ends: once a click module's is out, main()
    # is importing the commands (click, rich, every command module: ~0.6 s), where Ctrl-C
    # lands (not between smartnsq.cli's import and the call of main(), a window of
    # microseconds that a loaded machine's scheduling could stretch)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-X", "importtime", *ENTRY_POINTS[entry], "stat", "--nsqd",
        nsqd.address, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    seen: list[bytes] = []
    async with killed_at_end(proc):
        async with asyncio.timeout(20):
            while not (seen and imported(seen[-1]).startswith("click")):
                line = await proc.stderr.readline()
                assert line, b"".join(seen)[-2000:]
                seen.append(line)
            # an impatient user: Ctrl-C every 10 ms until it ends (at most 5 s of them)
            sent = 0
            for _ in range(500):
                if proc.returncode is not None:
                    break
                send_signal(proc, signal.SIGINT)
                sent += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), 0.01)
            out, err = await proc.communicate()
    text = err.decode()
    assert "Traceback" not in text and "Exception ignored" not in text, text[-3000:]
    assert proc.returncode == 130, (proc.returncode, sent, text[-3000:])
    assert text.rstrip().endswith("smartnsq: interrupted"), text[-3000:]
    assert out == b""

