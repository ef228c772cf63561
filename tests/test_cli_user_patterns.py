"""The command line as users write it: shell pipelines around ``smartnsq publish`` and
``smartnsq tail``, against the embedded cluster.

The invariant of each: every message published reaches the output or stays in the channel,
and every command returns within its stated time (here: a generous bound).
"""

from __future__ import annotations

import fcntl
import json
import shlex
import signal
import struct
import subprocess
import sys
import termios
import time
from typing import IO, Any

from tests.cli_support import (
    WAIT,
    ClusterThread,
    channel_stats,
    cluster_fixture,
    lines,
    send_signal,
    sh,
)

SMARTNSQ = f"{shlex.quote(sys.executable)} -m smartnsq"
PYTHON = shlex.quote(sys.executable)
CHANNEL = "c"


stock = cluster_fixture("stock", nodes=1)


yz = cluster_fixture("youzan", nodes=2)



def channel(ct: ClusterThread, topic: str) -> dict[str, Any]:
    return channel_stats(ct, topic, CHANNEL)


def test_publish_from_a_generator_then_tail_and_count(stock: ClusterThread) -> None:
    stock.call(lambda: stock.cluster.create_topic("seq", channels=[CHANNEL]))
    nsqd = stock.cluster.nsqd_tcp_addresses[0]
    r = sh(f"seq 1 1000 | {SMARTNSQ} publish seq --nsqd {nsqd} --batch 100")
    assert r.returncode == 0, r.stderr
    assert "published 1000 message(s)" in r.stderr.decode()
    r = sh(f"{SMARTNSQ} tail seq --nsqd {nsqd} --channel {CHANNEL} -n 1000 | sort -n | "
           "uniq | wc -l")
    assert r.returncode == 0 and r.stdout.split() == [b"1000"], r.stderr
    ch = channel(stock, "seq")
    assert (ch["depth"], ch["in_flight_count"]) == (0, 0)


def test_tail_waiting_while_another_shell_publishes(stock: ClusterThread) -> None:
    """One terminal tails (-n 3), another publishes: the tail prints the three and exits."""
    stock.call(lambda: stock.cluster.create_topic("live", channels=[CHANNEL]))
    nsqd = stock.cluster.nsqd_tcp_addresses[0]
    tail = subprocess.Popen([sys.executable, "-m", "smartnsq", "tail", "live", "--nsqd", nsqd,
                             "--channel", CHANNEL, "-n", "3"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        r = sh(f"printf 'one\\ntwo\\nthree\\nfour\\n' | {SMARTNSQ} publish live "
               f"--nsqd {nsqd}")
        assert r.returncode == 0, r.stderr
        out, err = tail.communicate(timeout=WAIT)
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait()
    assert tail.returncode == 0, err
    assert lines(out) == ["one", "two", "three"]
    ch = channel(stock, "live")
    assert (ch["depth"], ch["in_flight_count"]) == (1, 0)  # "four" waits for the next reader


def test_tail_into_head_keeps_what_it_did_not_print(stock: ClusterThread) -> None:
    """``tail | head -n 3``: head closes the pipe; tail ends cleanly (no traceback, exit 0)
    and says how many it printed; exactly those left the channel, the rest stay in it."""
    stock.call(lambda: stock.cluster.create_topic("headed", channels=[CHANNEL]))
    nsqd = stock.cluster.nsqd_tcp_addresses[0]
    sent = [f"h{i:04d}" for i in range(300)]
    r = sh(f"{SMARTNSQ} publish headed --nsqd {nsqd}", input="\n".join(sent).encode())
    assert r.returncode == 0, r.stderr
    r = sh(f"{SMARTNSQ} tail headed --nsqd {nsqd} --channel {CHANNEL} | head -n 3")
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert lines(r.stdout) == sent[:3]
    (note,) = err.splitlines()
    assert "Traceback" not in err and note.startswith("smartnsq: tail: the output was closed")
    printed = int(note.split(" after ")[1].split()[0])
    assert printed >= 3
    ch = channel(stock, "headed")
    assert ch["in_flight_count"] == 0 and ch["depth"] == len(sent) - printed
    # what tail did not print is all still there
    r = sh(f"{SMARTNSQ} tail headed --nsqd {nsqd} --channel {CHANNEL} -n {ch['depth']}")
    assert sorted(lines(r.stdout)) == sent[printed:]


def test_tail_into_a_slow_head_ends_when_head_does(stock: ClusterThread) -> None:
    """``tail | { sleep 1; head -n 3; }`` with fewer messages than a pipe holds: every line
    is written before head reads, and no more messages come. tail must not wait for a next
    write to notice that head exited: it ends promptly, says how many lines went into the
    pipe (head read three of them), and the channel keeps the rest, nothing in flight."""
    stock.call(lambda: stock.cluster.create_topic("slowhead", channels=[CHANNEL]))
    nsqd = stock.cluster.nsqd_tcp_addresses[0]
    sent = [f"s{i}" for i in range(10)]
    r = sh(f"{SMARTNSQ} publish slowhead --nsqd {nsqd}", input="\n".join(sent).encode())
    assert r.returncode == 0, r.stderr
    r = sh(f"{SMARTNSQ} tail slowhead --nsqd {nsqd} --channel {CHANNEL} | "
           "{ sleep 1; head -n 3; }")
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert lines(r.stdout) == sent[:3]
    (note,) = err.splitlines()
    assert note.startswith("smartnsq: tail: the output was closed after ")
    printed = int(note.split(" after ")[1].split()[0])
    ch = channel(stock, "slowhead")
    assert ch["in_flight_count"] == 0 and ch["depth"] == len(sent) - printed


def test_tail_into_a_full_disk_fails_and_keeps_every_message(stock: ClusterThread) -> None:
    """An output error other than a closed pipe (``/dev/full``: no space left) ends tail at
    once with one error line and exit 1, instead of requeueing the message with backoff
    forever; nothing was printed, so everything stays in the channel."""
    stock.call(lambda: stock.cluster.create_topic("fulldisk", channels=[CHANNEL]))
    nsqd = stock.cluster.nsqd_tcp_addresses[0]
    r = sh(f"{SMARTNSQ} publish fulldisk --nsqd {nsqd}", input=b"a\nb\nc\nd\ne")
    assert r.returncode == 0, r.stderr
    r = sh(f"{SMARTNSQ} tail fulldisk --nsqd {nsqd} --channel {CHANNEL} -n 3 > /dev/full")
    err = r.stderr.decode()
    assert r.returncode == 1, err
    (line,) = err.splitlines()
    assert line.startswith("smartnsq: error: cannot write the output: No space left on device")
    ch = channel(stock, "fulldisk")
    assert (ch["depth"], ch["in_flight_count"]) == (5, 0)


def test_ctrl_c_stops_tail_while_its_reader_reads_nothing(stock: ClusterThread) -> None:
    """``tail | less`` with the pager never scrolled: the pipe fills up. Ctrl-C still stops
    tail promptly (a blocking write would hold its event loop, signal handler included),
    and every message is either in the pipe (printed) or back in the channel."""
    stock.call(lambda: stock.cluster.create_topic("stalled", channels=[CHANNEL]))
    nsqd = stock.cluster.nsqd_tcp_addresses[0]
    # lines of one page each: the pipe (16 pages) is full at 64 KiB
    sent = [b"%04d" % i + b"x" * 4091 for i in range(300)]
    r = sh(f"{SMARTNSQ} publish stalled --nsqd {nsqd}", input=b"\n".join(sent))
    assert r.returncode == 0, r.stderr
    tail = subprocess.Popen([sys.executable, "-m", "smartnsq", "tail", "stalled", "--nsqd",
                             nsqd, "--channel", CHANNEL],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert tail.stdout is not None and tail.stderr is not None
    try:
        deadline = time.monotonic() + WAIT
        while pipe_bytes(tail.stdout) < 64 * 1024:  # full: tail waits for the reader
            assert time.monotonic() < deadline, "the pipe never filled"
            assert tail.poll() is None, tail.stderr.read()
            time.sleep(0.05)
        send_signal(tail, signal.SIGINT)
        assert tail.wait(timeout=WAIT) == 0  # a stop is how tail's run ends
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait()
    printed = tail.stdout.read().splitlines()
    tail.stdout.close()
    tail.stderr.close()
    assert printed == sent[:len(printed)]
    ch = channel(stock, "stalled")
    assert (ch["depth"], ch["in_flight_count"]) == (len(sent) - len(printed), 0)


def pipe_bytes(reader: IO[bytes]) -> int:
    """Bytes written into a pipe and not read yet (FIONREAD on its read end)."""
    return struct.unpack("i", fcntl.ioctl(reader.fileno(), termios.FIONREAD, b"\0" * 4))[0]


def test_tail_json_into_a_python_reader(yz: ClusterThread) -> None:
    yz.call(lambda: yz.cluster.create_topic("docs", 2, 1, channels=[CHANNEL]))
    lookupd = yz.lookupd
    records = [json.dumps({"user": f"u{i % 4}", "n": i}) for i in range(40)]
    r = sh(f"{SMARTNSQ} publish docs --lookupd {lookupd} --shard-key-field user",
           input="\n".join(records).encode())
    assert r.returncode == 0, r.stderr
    reader = ("import json, sys\n"
              "docs = [json.loads(line) for line in sys.stdin]\n"
              "print(json.dumps([[d['partition'], d['offset'], json.loads(d['body'])['n']] "
              "for d in docs]))")
    r = sh(f"{SMARTNSQ} tail docs --lookupd {lookupd} --from earliest -n 40 --format json | "
           f"{PYTHON} -c {shlex.quote(reader)}")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert sorted(n for _, _, n in got) == list(range(40))
    for p in (0, 1):  # each partition in its own order: offsets and numbers both ascending
        mine = [(off, n) for part, off, n in got if part == p]
        assert mine == sorted(mine)


def test_traced_publish_into_a_reader_that_stops_early(yz: ClusterThread) -> None:
    """``publish --trace | head -n 2``: the receipts' reader goes away; publish stops at once
    (no traceback) and says how many it published; they are all in the topic."""
    yz.call(lambda: yz.cluster.create_topic("traced", 1, 1, channels=[CHANNEL]))
    lookupd = yz.lookupd
    sent = [f"t{i}" for i in range(2000)]
    r = sh(f"{SMARTNSQ} publish traced --lookupd {lookupd} --trace | head -n 2",
           input="\n".join(sent).encode())
    err = r.stderr.decode()
    # 141 (128 + SIGPIPE): not all the input was published, as a shell reports a command
    # that a broken pipe ended
    assert r.returncode == 141 and "Traceback" not in err, err
    receipts = [json.loads(x) for x in lines(r.stdout)]
    assert [x["trace_id"] for x in receipts] == [1, 2]
    (summary,) = err.splitlines()
    assert summary.startswith("published ") and "the output was closed" in summary, summary
    published = int(summary.split()[1])
    assert 2 <= published < len(sent)
    r = sh(f"{SMARTNSQ} tail traced --lookupd {lookupd} --from earliest -n {published}")
    assert lines(r.stdout) == sent[:published]


def test_a_closed_stdin_or_stdout_is_one_error_line_and_nothing_consumed(
        stock: ClusterThread) -> None:
    """``publish <&-`` and ``tail >&-`` (a script that closed the descriptor): one error line
    naming it, exit 1, no 'internal error'; tail takes nothing from the channel."""
    stock.call(lambda: stock.cluster.create_topic("closedfd", channels=[CHANNEL]))
    nsqd = stock.cluster.nsqd_tcp_addresses[0]
    r = sh(f"{SMARTNSQ} publish closedfd --nsqd {nsqd} <&-")
    (line,) = r.stderr.decode().splitlines()
    assert r.returncode == 1 and line == ("smartnsq: error: stdin is closed: give a FILE, or "
                                          "pipe records in"), line
    r = sh(f"{SMARTNSQ} publish closedfd --nsqd {nsqd}", input=b"kept\n")
    assert r.returncode == 0, r.stderr
    http = stock.cluster.nsqd_http_addresses[0]
    for cmd in (f"tail closedfd --nsqd {nsqd} --channel {CHANNEL} -n 1",
                f"stat --nsqd {http} --once"):
        r = sh(f"{SMARTNSQ} {cmd} >&-")
        (line,) = r.stderr.decode().splitlines()
        assert r.returncode == 1 and line.startswith("smartnsq: error: stdout is closed: "), line
    ch = channel(stock, "closedfd")
    assert (ch["depth"], ch["in_flight_count"]) == (1, 0)
