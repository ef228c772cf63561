"""``smartnsq publish`` on long records and slow inputs: records are cut in linear time, one
longer than ``--max-msg-size`` stops the command at once (naming the record and the limit),
lines from a pipe that stays open are published as they come, and SIGINT/SIGTERM stop it
promptly with the shell's exit code and the count published so far."""

from __future__ import annotations

import asyncio
import fcntl
import io
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from smartnsq.cli.publish import DRAIN_SECONDS
from smartnsq.cli.records import Record, RecordTooLong, read_records
from tests.cli_support import (
    WAIT,
    ClusterThread,
    cluster_fixture,
    http_json,
    killed_at_end,
    run_cli,
    send_signal,
    spawn_cli,
)

CHANNEL = "c"


stock = cluster_fixture("stock", nodes=1)


def make_topic(ct: ClusterThread, name: str) -> None:
    ct.call(lambda: ct.cluster.create_topic(name, channels=[CHANNEL]))


def depth(ct: ClusterThread, topic: str) -> int:
    addr = ct.cluster.nsqd_http_addresses[0]
    doc = http_json(f"http://{addr}/stats?format=json&topic={topic}&channel={CHANNEL}")
    (t,) = doc["topics"]
    return int(t["channels"][0]["depth"])


def wait_depth(ct: ClusterThread, topic: str, n: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + WAIT
    while depth(ct, topic) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{topic}: depth {depth(ct, topic)} < {n}"
        time.sleep(0.05)


def stream(*pieces: bytes) -> io.BytesIO:
    return io.BytesIO(b"".join(pieces))


async def records(sources: list[tuple[str, Any]], delimiter: bytes = b"\n",
                  limit: int = 1 << 30) -> AsyncIterator[Record]:
    async for rec in read_records(sources, delimiter, limit=limit, stop=asyncio.Event()):
        yield rec


# -- reading ---------------------------------------------------------------------------------


async def test_a_long_record_is_read_in_linear_time() -> None:
    """Not a benchmark: 64 MiB in one record took ~30 s when every chunk re-split the
    whole buffer; cut in linear time it takes well under a second."""
    big = b"x" * (64 << 20)
    began = time.monotonic()
    got = [r async for r in records([("big", stream(big, b"\nend\n"))])]
    elapsed = time.monotonic() - began
    assert [len(r.body) for r in got] == [len(big), 3]
    assert elapsed < 10.0, f"{elapsed:.1f} s for 64 MiB"


async def test_a_record_past_the_limit_is_refused_without_reading_the_rest() -> None:
    read = 0

    class Endless(io.RawIOBase):
        """``ok``, then a record that never ends."""

        def readinto(self, b: Any) -> int:
            nonlocal read
            data = b"ok\n" if read == 0 else b"x" * len(b)
            b[:len(data)] = data
            read += len(data)
            return len(data)

        def readable(self) -> bool:
            return True

    got: list[bytes] = []
    with pytest.raises(RecordTooLong) as info:
        async for r in records([("<stdin>", io.BufferedReader(Endless()))], limit=1 << 20):
            got.append(r.body)
    assert got == [b"ok"]
    assert str(info.value) == ("<stdin> record 2 is longer than --max-msg-size "
                               "(1048576 bytes)")
    assert read < 8 << 20  # stopped soon after the limit, not at the end of the input


async def test_records_across_chunks_files_and_delimiters() -> None:
    big = b"x" * 70000
    got = [r async for r in records([("a", stream(b"one\r\ntwo\n\n" + big + b"\nthree")),
                                      ("b", stream(b"four\n"))])]
    assert [r.body for r in got] == [b"one", b"two", big, b"three", b"four"]
    assert [r.number for r in got] == [1, 2, 3, 4, 5]
    assert [r.source for r in got] == ["a", "a", "a", "a", "b"]
    assert got[-1].consumed == len(b"one\r\ntwo\n\n" + big + b"\nthree") + 1 + 5
    got = [r async for r in records([("c", stream(b"a||b||c|"))], b"||")]
    assert [r.body for r in got] == [b"a", b"b", b"c|"]
    # a record exactly at the limit passes (its \r before the \n does not count), one byte
    # more does not
    got = []
    with pytest.raises(RecordTooLong, match=r"^d record 2 is longer than --max-msg-size"):
        async for r in records([("d", stream(b"12345\r\n123456\n"))], limit=5):
            got.append(r)
    assert [r.body for r in got] == [b"12345"]


# -- the command -----------------------------------------------------------------------------


def test_an_oversize_record_stops_publish_with_one_line(stock: ClusterThread) -> None:
    make_topic(stock, "big")
    proc = spawn_cli(["publish", "big", "--nsqd", stock.cluster.nsqd_tcp_addresses[0],
                      "--max-msg-size", "1000"], stdin=subprocess.PIPE)
    assert proc.stdin is not None
    with killed_at_end(proc):
        # a record that does not end (the pipe stays open): refused once past the limit
        proc.stdin.write(b"ok\n" + b"x" * 5000)
        proc.stdin.flush()
        _, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 1, err
    (line,) = err.decode().splitlines()
    assert line == ("smartnsq: error: <stdin> record 2 is longer than --max-msg-size (1000 "
                    "bytes) (after 1 message(s) were published)"), line
    assert depth(stock, "big") == 1


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_publish_from_an_open_pipe_stops_on_a_signal(stock: ClusterThread, sig: int,
                                                     code: int) -> None:
    topic = f"sig{code}"
    make_topic(stock, topic)
    proc = spawn_cli(["publish", topic, "--nsqd", stock.cluster.nsqd_tcp_addresses[0]],
                     stdin=subprocess.PIPE)
    assert proc.stdin is not None
    with killed_at_end(proc):
        proc.stdin.write(b"one\ntwo\nthree\n")
        proc.stdin.flush()
        # published as they come, though the pipe stays open
        wait_depth(stock, topic, 3, proc)
        began = time.monotonic()
        send_signal(proc, sig)
        _, err = proc.communicate(timeout=WAIT)
        elapsed = time.monotonic() - began
    assert proc.returncode == code, err
    assert elapsed < 5.0, f"{elapsed:.1f} s after the signal"
    (line,) = err.decode().splitlines()
    assert line.startswith("published 3 message(s), 11 bytes, to " + topic), line
    assert line.endswith(f"(interrupted by {signal.Signals(sig).name})"), line


# -- a signal while records are held ---------------------------------------------------------


def bodies(ct: ClusterThread, topic: str, n: int) -> list[bytes]:
    """The channel's messages, read back with ``smartnsq tail -n`` as a user would."""
    r = subprocess.run([sys.executable, "-m", "smartnsq", "tail", topic, "--nsqd",
                        ct.cluster.nsqd_tcp_addresses[0], "--channel", CHANNEL, "-n", str(n)],
                       capture_output=True, timeout=WAIT, check=False)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def feed_slowly(proc: subprocess.Popen[bytes], lines_: list[bytes]) -> None:
    """Write lines into the pipe one at a time, as a slow producer does (the pipe stays
    open), and wait until publish has read them all (nothing left in the pipe)."""
    assert proc.stdin is not None
    for line in lines_:
        proc.stdin.write(line + b"\n")
        proc.stdin.flush()
        time.sleep(0.05)
    deadline = time.monotonic() + WAIT
    while pipe_unread(proc.stdin) > 0:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    time.sleep(0.2)  # read from the pipe: handed to the command's loop right after


def pipe_unread(writer: Any) -> int:
    """Bytes written into a pipe and not read yet (FIONREAD on the write end works too)."""
    return int(struct.unpack("i", fcntl.ioctl(writer.fileno(), termios.FIONREAD,
                                               b"\0" * 4))[0])


def finish(proc: subprocess.Popen[bytes]) -> tuple[int, str, float]:
    """Exit code, stderr and seconds from now to the exit (killed after WAIT)."""
    began = time.monotonic()
    with killed_at_end(proc):
        _, err = proc.communicate(timeout=WAIT)
    return proc.returncode, err.decode(), time.monotonic() - began


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_publishes_the_partial_batch_it_holds(stock: ClusterThread, sig: int,
                                                       code: int) -> None:
    """``slow-producer | smartnsq publish T --batch 100``, then Ctrl-C: the 7 lines read
    into a batch that never filled are published, not dropped; the usual exit code."""
    topic = f"partial{code}"
    make_topic(stock, topic)
    proc = spawn_cli(["publish", topic, "--nsqd", stock.cluster.nsqd_tcp_addresses[0],
                      "--batch", "100"], stdin=subprocess.PIPE)
    sent = [b"line%d" % i for i in range(7)]
    feed_slowly(proc, sent)
    assert depth(stock, topic) == 0  # held: the batch is not full
    send_signal(proc, sig)
    rc, err, elapsed = finish(proc)
    assert rc == code, err
    assert elapsed < 5.0, f"{elapsed:.1f} s after the signal"
    (line,) = err.splitlines()
    assert line.startswith(f"published 7 message(s), 35 bytes, to {topic}"), line
    assert line.endswith(f"(interrupted by {signal.Signals(sig).name})"), line
    assert bodies(stock, topic, 7) == sent
    assert depth(stock, topic) == 0


def test_a_signal_reports_what_a_silent_nsqd_never_confirmed(stock: ClusterThread) -> None:
    """The nsqd stops answering while a batch is out and another record is held: after
    Ctrl-C publish waits at most DRAIN_SECONDS, then says how many records read were not
    published (or not confirmed) and exits 130; a second Ctrl-C ends the wait at once."""
    node = stock.cluster.nodes[0]
    for second in (False, True):
        topic = f"silent{int(second)}"
        make_topic(stock, topic)
        proc = spawn_cli(["publish", topic, "--nsqd", stock.cluster.nsqd_tcp_addresses[0],
                          "--batch", "3"], stdin=subprocess.PIPE)
        try:
            feed_slowly(proc, [b"a1", b"a2", b"a3"])
            wait_depth(stock, topic, 3, proc)
            stock.call(lambda: node.set_response_delay(60))
            feed_slowly(proc, [b"b1", b"b2", b"b3", b"b4"])  # one MPUB out, b4 held
            send_signal(proc, signal.SIGINT)
            if second:
                time.sleep(0.5)
                send_signal(proc, signal.SIGINT)
            rc, err, elapsed = finish(proc)
        finally:
            stock.call(lambda: node.set_response_delay(0))
        assert rc == 130, err
        bound = 2.0 if second else DRAIN_SECONDS + 2.0
        assert elapsed < bound, f"{elapsed:.1f} s after the signal"
        summary, warning = err.splitlines()
        assert summary.startswith("published 3 message(s)"), err
        why = "a second signal" if second else f"the {DRAIN_SECONDS:g} s allowed"
        assert warning.startswith("smartnsq: warning: publish: 4 record(s) read before "
                                  "SIGINT were not published, or not confirmed"), warning
        assert why in warning, warning
        # nothing vanished unreported: each record is in the channel or in the warning
        assert depth(stock, topic) + 4 >= 7


def test_empty_records_are_skipped_and_counted(stock: ClusterThread) -> None:
    """nsqd refuses an empty body: blank lines (CRLF ones too) are skipped, as to_nsq does,
    and the summary says how many."""
    make_topic(stock, "blank")
    r = run_cli(["publish", "blank", "--nsqd", stock.cluster.nsqd_tcp_addresses[0]],
                input=b"a\n\nb\r\n\r\n\nc")
    (line,) = r.stderr.decode().splitlines()
    assert r.returncode == 0, line
    assert line.startswith("published 3 message(s), 3 bytes, to blank"), line
    assert "skipped 3 empty record(s)" in line, line
    assert bodies(stock, "blank", 3) == [b"a", b"b", b"c"]
    # none skipped: nothing said about it
    r = run_cli(["publish", "blank", "--nsqd", stock.cluster.nsqd_tcp_addresses[0]],
                input=b"d\n")
    assert r.returncode == 0 and b"skipped" not in r.stderr, r.stderr


def test_ctrl_c_under_a_slow_rate_does_not_wait_for_the_rate(stock: ClusterThread) -> None:
    """``--rate 1/m``: the first line goes at once, the next would wait a minute. Ctrl-C
    does not make the user wait out the drain for records the rate cannot send in it: it
    exits at once, saying the two records read were not published and why."""
    make_topic(stock, "slowrate")
    proc = spawn_cli(["publish", "slowrate", "--nsqd", stock.cluster.nsqd_tcp_addresses[0],
                      "--rate", "1/m"], stdin=subprocess.PIPE)
    feed_slowly(proc, [b"r1", b"r2", b"r3"])
    wait_depth(stock, "slowrate", 1, proc)
    send_signal(proc, signal.SIGINT)
    rc, err, elapsed = finish(proc)
    assert rc == 130, err
    assert elapsed < 2.0, f"{elapsed:.1f} s after the signal"
    summary, warning = err.splitlines()
    assert summary.startswith("published 1 message(s)"), err
    assert warning == ("smartnsq: warning: publish: 2 record(s) read before SIGINT were not "
                       "published, or not confirmed (--rate allows no more within the 5 s "
                       "allowed after the signal)"), warning
    assert bodies(stock, "slowrate", 1) == [b"r1"]


def test_publish_at_a_terminal_says_it_reads_typed_records(stock: ClusterThread) -> None:
    """``smartnsq publish T`` typed with no pipe and no file reads the terminal: it says so
    at once (it would seem to hang), publishes each typed line, and ends on Ctrl-D."""
    make_topic(stock, "typed")
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "smartnsq", "publish", "typed",
                                 "--nsqd", stock.cluster.nsqd_tcp_addresses[0]],
                                stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stderr is not None
        with killed_at_end(proc):
            ready, _, _ = select.select([proc.stderr], [], [], WAIT)
            assert ready, "no hint on stderr"
            hint = proc.stderr.readline().decode()
            assert hint.startswith("smartnsq: publish: reading records from the terminal"), hint
            assert "Ctrl-D" in hint
            os.write(master, b"typed one\n")
            wait_depth(stock, "typed", 1, proc)  # published as typed, before Ctrl-D
            os.write(master, b"\x04")  # Ctrl-D at the start of a line: the input's end
            rc, err, _ = finish(proc)
    finally:
        os.close(master)
        os.close(slave)
    assert rc == 0, err
    assert err.startswith("published 1 message(s), 9 bytes, to typed"), err
    # piped input gets no hint
    r = run_cli(["publish", "typed", "--nsqd", stock.cluster.nsqd_tcp_addresses[0]],
                input=b"two\n")
    assert r.returncode == 0 and b"terminal" not in r.stderr, r.stderr


@pytest.mark.parametrize(("sig", "gap"), [
    *((signal.SIGINT, gap) for gap in (0.0, 0.002, 0.005, 0.01, 0.02, 0.05)),
    *((signal.SIGTERM, gap) for gap in (0.0, 0.005, 0.02)),
], ids=lambda v: v.name if isinstance(v, signal.Signals) else f"{v * 1000:g}ms")
def test_a_second_signal_right_after_the_first_still_ends_with_its_code(
        stock: ClusterThread, sig: signal.Signals, gap: float) -> None:
    """A user presses Ctrl-C twice, quickly, at ``smartnsq publish`` reading from a pipe that
    stays open (or a process manager sends SIGTERM twice): the first stops the reading, the
    second cuts the drain short; either way the command ends with 130 (143) and its one summary
    line, never killed by the signal (-SIGINT, -SIGTERM) nor with a traceback, and what was
    published stays in the channel."""
    topic = f"twice{sig.name}{int(gap * 1000)}"
    make_topic(stock, topic)
    proc = spawn_cli(["publish", topic, "--nsqd", stock.cluster.nsqd_tcp_addresses[0]],
                     stdin=subprocess.PIPE)
    assert proc.stdin is not None
    with killed_at_end(proc):
        proc.stdin.write(b"one\ntwo\nthree\n")  # the pipe stays open: publish waits for more
        proc.stdin.flush()
        wait_depth(stock, topic, 3, proc)
        send_signal(proc, sig)
        time.sleep(gap)
        send_signal(proc, sig)
        _, err = proc.communicate(timeout=WAIT)
    text = err.decode()
    assert proc.returncode == 128 + sig, text
    assert "Traceback" not in text, text
    lines = text.splitlines()
    assert len(lines) == 1, text
    (line,) = lines
    assert line.startswith(f"published 3 message(s), 11 bytes, to {topic}"), line
    assert depth(stock, topic) == 3
