"""A user presses Ctrl-C twice, quickly, at ``smartnsq publish`` reading from a pipe that
stays open (or a process manager sends SIGTERM twice): the first stops the reading, the
second cuts the drain short; either way the command ends with 130 (143) and its one summary
line, never killed by the signal (-SIGINT, -SIGTERM) nor with a traceback, and what was
published stays in the channel."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from tests.cli_support import (
    WAIT,
    ClusterThread,
    cluster_fixture,
    http_json,
    send_signal,
    spawn_cli,
)

CHANNEL = "c"

stock = cluster_fixture("stock", nodes=1)


def depth(ct: ClusterThread, topic: str) -> int:
    addr = ct.cluster.nsqd_http_addresses[0]
    doc = http_json(f"http://{addr}/stats?format=json&topic={topic}&channel={CHANNEL}")
    (t,) = doc["topics"]
    return int(t["channels"][0]["depth"])


@pytest.mark.parametrize(("sig", "gap"), [
    *((signal.SIGINT, gap) for gap in (0.0, 0.002, 0.005, 0.01, 0.02, 0.05)),
    *((signal.SIGTERM, gap) for gap in (0.0, 0.005, 0.02)),
], ids=lambda v: v.name if isinstance(v, signal.Signals) else f"{v * 1000:g}ms")
def test_a_second_signal_right_after_the_first_still_ends_with_its_code(
        stock: ClusterThread, sig: signal.Signals, gap: float) -> None:
    topic = f"twice{sig.name}{int(gap * 1000)}"
    stock.call(lambda: stock.cluster.create_topic(topic, channels=[CHANNEL]))
    proc = spawn_cli(["publish", topic, "--nsqd", stock.cluster.nsqd_tcp_addresses[0]],
                     stdin=subprocess.PIPE)
    assert proc.stdin is not None
    try:
        proc.stdin.write(b"one\ntwo\nthree\n")  # the pipe stays open: publish waits for more
        proc.stdin.flush()
        deadline = time.monotonic() + WAIT
        while depth(stock, topic) < 3:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the records were never published"
            time.sleep(0.05)
        send_signal(proc, sig)
        time.sleep(gap)
        send_signal(proc, sig)
        _, err = proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = err.decode()
    assert proc.returncode == 128 + sig, text
    assert "Traceback" not in text, text
    lines = text.splitlines()
    assert len(lines) == 1, text
    (line,) = lines
    assert line.startswith(f"published 3 message(s), 11 bytes, to {topic}"), line
    assert depth(stock, topic) == 3
