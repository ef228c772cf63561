"""The archiver behind ``smartnsq to-file``, without a server: a message is finished only
after an fsync covered the file bytes holding it, and the file work (write, gzip flush,
fsync, rotation) runs off the event loop, so a slow disk does not stall the consumer's
heartbeats."""

from __future__ import annotations

import asyncio
import gzip
import itertools
import os
import threading
import time
import zlib
from pathlib import Path

import pytest

from smartnsq.cli.archive import Archiver

#: bound on waiting for the archiver's finishes in these tests
WAIT = 10.0


class Events(list[str]):
    """What happened, in order; ``changed`` is set on the loop when a message is answered."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = asyncio.Event()


class FakeMessage:
    """What the archiver uses of a message; records when it was finished or requeued."""

    def __init__(self, body: bytes, events: Events, partition: int | None = 2) -> None:
        self.body = body
        self.partition = partition
        self.events = events

    def disable_auto_response(self) -> None:
        pass

    def finish(self) -> bool:
        self.events.append(f"fin {self.body.decode()}")
        self.events.changed.set()
        return True

    def requeue(self, delay: float, backoff: bool = True) -> bool:
        self.events.append(f"req {self.body.decode()}")
        self.events.changed.set()
        return True


def archiver(tmp_path: Path, **kw: object) -> Archiver:
    opts: dict[str, object] = {"rotate_size": None, "rotate_interval": None,
                               "compress": False, "gzip_level": 6, "sync_count": 2,
                               "host": "h"}
    opts.update(kw)
    return Archiver("t", tmp_path, **opts)  # type: ignore[arg-type]


async def finished(events: Events, n: int) -> None:
    """Wait (bounded) until ``n`` messages were finished."""
    async with asyncio.timeout(WAIT):
        while sum(e.startswith("fin ") for e in events) < n:
            events.changed.clear()
            await events.changed.wait()


def gunzip_synced(data: bytes) -> bytes:
    """What a gzip stream holds up to its last sync flush (no trailer needed)."""
    return zlib.decompressobj(wbits=31).decompress(data)


def record_fsyncs(tmp_path: Path, events: Events, monkeypatch: pytest.MonkeyPatch,
                  delay: float = 0.0) -> None:
    """os.fsync records what the directory's files hold when each sync ends."""
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if delay:
            time.sleep(delay)
        real_fsync(fd)
        on_disk = b""
        for p in sorted(tmp_path.iterdir()):
            data = p.read_bytes()
            on_disk += gunzip_synced(data) if ".gz" in p.name else data
        events.append("fsync " + ",".join(sorted(on_disk.decode().split())))

    monkeypatch.setattr(os, "fsync", fsync)


def assert_each_finish_follows_its_fsync(events: Events) -> None:
    seen: set[str] = set()
    for e in events:
        kind, _, what = e.partition(" ")
        if kind == "fsync":
            seen = set(what.split(",")) if what else set()
        elif kind == "fin":
            assert what in seen, (e, events)


async def test_finished_only_after_fsync(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    events = Events()
    record_fsyncs(tmp_path, events, monkeypatch)
    arch = archiver(tmp_path)
    for body in (b"a", b"b", b"c"):
        await arch(FakeMessage(body, events))  # type: ignore[arg-type]
    await finished(events, 2)
    assert events[:3] == ["fsync a,b", "fin a", "fin b"]
    arch.tick()
    await finished(events, 3)
    assert events[3:] == ["fsync a,b,c", "fin c"]
    arch.stopping = True
    await arch(FakeMessage(b"d", events))  # type: ignore[arg-type]
    assert events[-1] == "req d"
    await arch.close_all()
    (name,) = os.listdir(tmp_path)
    f = tmp_path / name
    assert f.name.startswith("t.p2.h.") and f.name.endswith(".0001.log")
    assert f.read_bytes() == b"a\nb\nc\n"
    assert arch.closed_files == [f] and arch.finished == 3
    assert_each_finish_follows_its_fsync(events)


async def test_a_slow_fsync_leaves_the_loop_running(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """fsync taking 0.5 s (a busy disk): the loop keeps running meanwhile (a heartbeat every
    10 ms never waits more than a fraction of it), and nothing is finished before the fsync
    that covers it ended."""
    events = Events()
    record_fsyncs(tmp_path, events, monkeypatch, delay=0.5)
    loop = asyncio.get_running_loop()
    beats: list[float] = []

    async def heartbeat() -> None:
        while True:
            beats.append(loop.time())
            await asyncio.sleep(0.01)

    hb = asyncio.ensure_future(heartbeat())
    try:
        await asyncio.sleep(0)
        arch = archiver(tmp_path, compress=True, rotate_size=4)
        for body in (b"a", b"b"):  # the second fills the file: synced, closed, renamed
            await arch(FakeMessage(body, events))  # type: ignore[arg-type]
        await arch(FakeMessage(b"c", events))  # type: ignore[arg-type]
        arch.tick()
        await finished(events, 3)
    finally:
        hb.cancel()
    # the fsyncs alone took over a second: the heartbeat kept beating through them
    assert len(beats) > 20, f"the loop ran only {len(beats)} heartbeat(s)"
    gaps = [b - a for a, b in itertools.pairwise(beats)]
    assert max(gaps) < 0.25, f"the loop stalled {max(gaps):.2f} s"
    await arch.close_all()
    assert_each_finish_follows_its_fsync(events)
    assert arch.finished == 3 and len(arch.closed_files) == 2
    got = sorted(gzip.decompress(p.read_bytes()) for p in arch.closed_files)
    assert got == [b"a\nb\n", b"c\n"]


async def test_a_failed_write_requeues_and_reports(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    events = Events()
    where = threading.get_ident()

    def fsync(fd: int) -> None:
        assert threading.get_ident() != where  # off the loop's thread
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", fsync)
    arch = archiver(tmp_path)
    for body in (b"a", b"b"):
        await arch(FakeMessage(body, events))  # type: ignore[arg-type]
    async with asyncio.timeout(WAIT):
        await arch.failed.wait()
    assert events == ["req a", "req b"] and arch.finished == 0
    assert isinstance(arch.error, OSError) and "No space left" in str(arch.error)
    arch.stopping = True
    await arch.close_all()
