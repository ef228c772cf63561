"""One exit-code convention for every long-running command, as a user meets it: a command
that runs until it is stopped (tail, stat, to-file, bridge) exits 0 after a graceful stop on
Ctrl-C (SIGINT) or SIGTERM, as a service manager expects; ``publish``, which a signal cuts
short before its input's end, exits 130 or 143 (128 + the signal, as shells report it); a
closed output (``| head``) is a quiet 0, except ``publish``, which exits 141 when it left
input unpublished (tests/test_cli_user_patterns.py).

Each command runs as a subprocess against the embedded cluster, is signalled once it is
under way, and must exit within seconds with the convention's code and no traceback."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.cli_support import (
    WAIT,
    ClusterThread,
    channel_stats,
    cluster_fixture,
    killed_at_end,
    send_signal,
    spawn_cli,
)

TOPIC = "codes"
CHANNEL = "c"

stock = cluster_fixture("stock", nodes=1)


@pytest.fixture(scope="module")
def topic(stock: ClusterThread) -> str:
    stock.call(lambda: stock.cluster.create_topic(TOPIC, channels=[CHANNEL]))
    stock.call(lambda: stock.cluster.create_topic("codes_copy", channels=[CHANNEL]))
    return TOPIC


Ready = Callable[[ClusterThread, subprocess.Popen[bytes], int], bool]


def _published_count(ct: ClusterThread) -> int:
    return int(channel_stats(ct, TOPIC, CHANNEL)["message_count"])


def _subscribed(channel: str) -> Ready:
    def ready(ct: ClusterThread, proc: subprocess.Popen[bytes], base: int) -> bool:
        try:
            return int(channel_stats(ct, TOPIC, channel)["client_count"]) > 0
        except ValueError:  # the channel does not exist yet
            return False
    return ready


def _first_line(ct: ClusterThread, proc: subprocess.Popen[bytes], base: int) -> bool:
    assert proc.stdout is not None
    return bool(proc.stdout.readline())


def _published(ct: ClusterThread, proc: subprocess.Popen[bytes], base: int) -> bool:
    return _published_count(ct) > base  # its first line is out: it is under way


# (name, arguments after the addresses are filled in, how to tell it is under way)
COMMANDS: list[tuple[str, Callable[[ClusterThread, Path], list[str]], Ready]] = [
    ("publish", lambda ct, _: ["publish", TOPIC, "--nsqd", ct.cluster.nsqd_tcp_addresses[0]],
     _published),
    ("tail", lambda ct, _: ["tail", TOPIC, "--nsqd", ct.cluster.nsqd_tcp_addresses[0],
                            "--channel", "t"], _subscribed("t")),
    ("stat", lambda ct, _: ["stat", "--nsqd", ct.cluster.nsqd_http_addresses[0],
                            "--interval", "0.2"], _first_line),
    ("stat --json", lambda ct, _: ["stat", "--nsqd", ct.cluster.nsqd_http_addresses[0],
                                   "--json", "--interval", "0.2"], _first_line),
    ("to-file", lambda ct, tmp: ["to-file", TOPIC, "--nsqd", ct.cluster.nsqd_tcp_addresses[0],
                                 "--channel", "a", "--output-dir", str(tmp)],
     _subscribed("a")),
    ("bridge", lambda ct, _: ["bridge", TOPIC, "codes_copy", "--from-nsqd",
                              ct.cluster.nsqd_tcp_addresses[0], "--to-nsqd",
                              ct.cluster.nsqd_tcp_addresses[0], "--channel", "b"],
     _subscribed("b")),
]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("command", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_a_signal_ends_every_command_with_the_conventions_code(
        stock: ClusterThread, topic: str, tmp_path: Path, sig: int,
        command: tuple[str, Callable[[ClusterThread, Path], list[str]], Ready]) -> None:
    name, args, ready = command
    # publish's input had not ended: cut short, 128 + the signal; the others' runs end so
    code = 128 + sig if name == "publish" else 0
    base = _published_count(stock)
    proc = spawn_cli(args(stock, tmp_path), stdin=subprocess.PIPE)
    assert proc.stdin is not None
    with killed_at_end(proc):
        if args(stock, tmp_path)[0] == "publish":
            proc.stdin.write(b"one\n")  # the pipe stays open: publish waits for more
            proc.stdin.flush()
        deadline = time.monotonic() + WAIT
        while not ready(stock, proc, base):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "never under way"
            time.sleep(0.05)
        time.sleep(0.2)  # its signal handlers are in place once it is under way
        began = time.monotonic()
        send_signal(proc, sig)
        _, err = proc.communicate(timeout=WAIT)
        elapsed = time.monotonic() - began
    text = err.decode()
    assert proc.returncode == code, text
    assert elapsed < 10.0, f"{elapsed:.1f} s after {signal.Signals(sig).name}"
    assert "Traceback" not in text and "error" not in text, text


@pytest.mark.parametrize("args", [
    ["tail", TOPIC, "--channel", CHANNEL, "--format", "json"],
    ["stat", "--json", "--interval", "0.2"],
], ids=["tail", "stat --json"])
def test_a_closed_output_is_a_quiet_zero(stock: ClusterThread, topic: str,
                                         args: list[str]) -> None:
    """``smartnsq ... | head -n 1``: head exits after one line; the command ends with 0."""
    nsqd = (stock.cluster.nsqd_tcp_addresses[0] if args[0] == "tail"
            else stock.cluster.nsqd_http_addresses[0])
    if args[0] == "tail":
        subprocess.run([sys.executable, "-m", "smartnsq", "publish", TOPIC, "--nsqd", nsqd],
                       input=b"x\ny\n", capture_output=True, timeout=WAIT, check=True)
    script = (f"{sys.executable} -m smartnsq {' '.join(args)} --nsqd {nsqd} | head -n 1; "
              "exit ${PIPESTATUS[0]}")
    r = subprocess.run(["bash", "-c", script], capture_output=True, timeout=WAIT,
                       check=False)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 1 and b"Traceback" not in r.stderr, r.stderr
