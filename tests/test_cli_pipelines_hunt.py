"""``smartnsq`` in shell pipelines and scripts, as an operator writes them: what its stdout
carries (data only), which nsqd it says it cannot reach, against the embedded cluster.

Each command runs as the real entry point in a bash subprocess; the invariant: stdout holds
only the command's data, every diagnostic goes to stderr (or nowhere when stderr is
closed), no traceback, each within its stated time.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import shlex
import signal
import sys
import time
from pathlib import Path

import pytest

from smartnsq import Producer
from smartnsq.devcluster import DevCluster
from tests.cli_support import (
    WAIT,
    ClusterThread,
    channel_stats,
    closed_port,
    cluster_fixture,
    eventually,
    finish_process,
    killed_at_end,
    send_signal,
    sh,
)
from tests.silent_server import Silent, silent_servers

SMARTNSQ = f"{shlex.quote(sys.executable)} -m smartnsq"

stock = cluster_fixture("stock", nodes=1)



def test_a_closed_stderr_keeps_diagnostics_out_of_stdout(stock: ClusterThread) -> None:
    """``2>&-`` (a script that closed stderr): the warnings and the error line went to
    stdout, into the data a pipeline reads (Python has no ``sys.stderr`` then, and
    ``print(file=None)`` writes to stdout). They go nowhere now; the exit codes stay."""
    gone = closed_port()
    nsqd = stock.cluster.nsqd_tcp_addresses[0]
    cases = [
        (f"tail t --nsqd {gone} --connect-timeout 0.3", 1),
        (f"publish t --nsqd {gone}", 1),
        (f"publish t --nsqd {nsqd} --no-such-flag", 2),
        ("no-such-command", 2),
    ]
    for cmd, code in cases:
        r = sh(f"{SMARTNSQ} {cmd} 2>&-", input=b"x\n")
        assert (r.returncode, r.stdout) == (code, b""), (cmd, r.stdout)


async def _stderr_line_naming(proc: asyncio.subprocess.Process, address: str) -> bytes:
    """The first stderr line of ``proc`` that names ``address`` (bounded by WAIT)."""
    assert proc.stderr is not None

    async def scan() -> bytes:
        assert proc.stderr is not None
        while line := await proc.stderr.readline():
            if address.encode() in line:
                return line
        return b""

    return await asyncio.wait_for(scan(), WAIT)


async def test_an_nsqd_that_never_answers_beside_one_that_does_is_named() -> None:
    """``tail --nsqd A --nsqd B`` with B down (a typo, a dead host): tail printed A's
    messages and never said a word about B, whose messages the operator then never sees;
    the warnings were shown only while no nsqd at all was connected. B is named at once."""
    gone = closed_port()
    async with DevCluster(nodes=1, lookupds=1, flavour="stock") as c:
        tcp = c.nsqd_tcp_addresses[0]
        c.create_topic("half", channels=["c"])
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "smartnsq", "tail", "half", "--nsqd", tcp, "--nsqd", gone,
            "--channel", "c", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        async with killed_at_end(proc):
            line = await _stderr_line_naming(proc, gone)
            assert line.startswith(b"smartnsq: warning: cannot subscribe at "), line
            assert line.rstrip().endswith(b"; retrying"), line
            async with Producer(nsqd=tcp) as p:
                await p.publish("half", b"still read")
            assert proc.stdout is not None
            out = await asyncio.wait_for(proc.stdout.readline(), WAIT)
            send_signal(proc, signal.SIGINT)
            code, rest = await finish_process(proc)
    assert (out, code) == (b"still read\n", 0), rest
    assert b"Traceback" not in rest and b"error" not in rest, rest


async def test_one_of_two_nsqd_lost_later_is_named_while_the_other_carries_on() -> None:
    """Connected to two nsqd, one goes away: the docs promise a warning for a connection
    lost later; there was none while the other nsqd stayed connected."""
    async with DevCluster(nodes=2, lookupds=1, flavour="stock") as c:
        a, b = c.nsqd_tcp_addresses
        c.create_topic("lost2", channels=["c"])
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "smartnsq", "tail", "lost2", "--nsqd", a, "--nsqd", b,
            "--channel", "c", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        assert proc.stdout is not None
        async with killed_at_end(proc):
            for addr in (a, b):  # one message through each: both are subscribed
                async with Producer(nsqd=addr) as p:
                    await p.publish("lost2", addr.encode())
            got = {await asyncio.wait_for(proc.stdout.readline(), WAIT) for _ in "ab"}
            assert got == {a.encode() + b"\n", b.encode() + b"\n"}
            await c.stop_node(1)
            line = await _stderr_line_naming(proc, b)
            assert line.startswith(b"smartnsq: warning: "), line
            async with Producer(nsqd=a) as p:
                await p.publish("lost2", b"after")
            out = await asyncio.wait_for(proc.stdout.readline(), WAIT)
            send_signal(proc, signal.SIGINT)
            code, rest = await finish_process(proc)
    assert (out, code) == (b"after\n", 0), rest
    assert b"Traceback" not in rest, rest


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_help_version_and_dev_into_a_full_disk_are_one_error_line() -> None:
    """``smartnsq --help > /dev/full`` (any failing output: a full disk): click's own output
    and dev's addresses ended with ``smartnsq: internal error: OSError: [Errno 28] ...`` or
    ``error: OSError``; now the one line every command gives for a failed output."""
    for cmd in ("--help", "--version", "tail --help", "channel --help",
                "dev --nodes 1 --flavour stock"):
        r = sh(f"{SMARTNSQ} {cmd} > /dev/full")
        err = r.stderr.decode()
        assert r.returncode == 1, (cmd, err)
        assert err.splitlines() == [err.splitlines()[0]], (cmd, err)
        assert err.startswith("smartnsq: error: cannot write ") and \
            err.rstrip().endswith(": No space left on device"), (cmd, err)


def test_publishing_a_gzipped_archive_is_refused_naming_the_file(
        stock: ClusterThread, tmp_path: Path) -> None:
    """``smartnsq publish orders archive/*.log.gz`` (replaying a ``to-file --gzip``
    archive): every compressed run of bytes between two 0x0a bytes was published as a
    message, garbage into the topic, exit 0. Refused before anything is published, naming
    the file and the way to replay it."""
    stock.call(lambda: stock.cluster.create_topic("replay", channels=["c"]))
    plain = tmp_path / "replay.all.host.0001.log"
    plain.write_bytes(b"one\ntwo\n")
    packed = tmp_path / "replay.all.host.0002.log.gz"
    packed.write_bytes(gzip.compress(b"three\n" * 50))
    nsqd = stock.cluster.nsqd_tcp_addresses[0]
    r = sh(f"{SMARTNSQ} publish replay {plain} {packed} --nsqd {nsqd}")
    err = r.stderr.decode()
    assert r.returncode == 1 and len(err.splitlines()) == 1, err
    assert err.startswith(f"smartnsq: error: {packed} is gzip-compressed") and \
        f"zcat {packed} | smartnsq publish" in err, err
    assert channel_stats(stock, "replay", "c")["message_count"] == 0


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="needs Linux /proc")
def test_an_input_that_fails_to_read_is_named(stock: ClusterThread) -> None:
    """A FILE whose read fails (a bad disk: EIO; ``/proc/self/mem`` fails the same way) said
    ``error: OSError: [Errno 5] Input/output error``, not which input failed."""
    nsqd = stock.cluster.nsqd_tcp_addresses[0]
    r = sh(f"{SMARTNSQ} publish eio /proc/self/mem --nsqd {nsqd}")
    err = r.stderr.decode()
    assert r.returncode == 1 and len(err.splitlines()) == 1, err
    assert err.startswith("smartnsq: error: cannot read /proc/self/mem: Input/output error"), \
        err


# (command, exit code after Ctrl-C): the ones that run until stopped end with 0, publish,
# cut short before its input's end, with 130
HUNG_WAITS = [
    ("tail t --nsqd {silent}", 0),
    ("to-file t --output-dir {tmp} --nsqd {silent}", 0),
    ("tail t --lookupd {silent}", 0),
    ("publish t --lookupd {silent}", 130),
    ("stat --nsqd {silent}", 0),
    ("stat --nsqd {silent} --once --json", 0),
]


async def _ctrl_c_while_waiting(silent: Silent, cmd: str) -> tuple[int, float, bytes]:
    """Start ``cmd``, Ctrl-C once it waits for ``silent``: (exit code, seconds it took to
    end after the signal, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "smartnsq", *cmd.split(), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    async with killed_at_end(proc):
        await eventually("waiting for the silent server", lambda: silent.accepted > 0)
        await asyncio.sleep(0.2)
        send_signal(proc, signal.SIGINT)
        began = time.monotonic()
        _, err = await asyncio.wait_for(proc.communicate(), WAIT)
        took = time.monotonic() - began
    assert proc.returncode is not None
    return proc.returncode, took, err


async def test_ctrl_c_while_a_hung_server_is_awaited_ends_at_once(tmp_path: Path) -> None:
    """Ctrl-C while the first answer of a hung nsqd or lookupd is awaited (an operator's
    reaction to a command that hangs): ignored until that wait's timeout (5 s for an nsqd's
    handshake or /stats, 2 s for a lookupd), then an error and exit 1 for most; now the
    command ends within a second, with its stop's exit code."""
    async with silent_servers() as make:
        for template, code in HUNG_WAITS:
            cmd = template.format(silent=(silent := await make()).address, tmp=tmp_path)
            got, took, err = await _ctrl_c_while_waiting(silent, cmd)
            assert (got, took < 1.0) == (code, True), (cmd, took, err)
            assert b"Traceback" not in err and b"error" not in err, (cmd, err)


async def test_live_stat_waits_for_a_hung_nsqd_once(stock: ClusterThread) -> None:
    """``stat --nsqd A --nsqd HUNG --json --interval 0.3``: every refresh waited the 5 s
    HTTP timeout for the hung nsqd again (one line per 5.3 s; the docs say each command
    waits for it once). Now it is asked again in the background: after the first line,
    the lines come at the interval, the hung nsqd named with its error in each."""
    http = stock.cluster.nsqd_http_addresses[0]
    async with silent_servers() as make:
        hung = (await make()).address
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "smartnsq", "stat", "--nsqd", http, "--nsqd", hung,
            "--json", "--interval", "0.3", stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        assert proc.stdout is not None
        async with killed_at_end(proc):
            docs = [json.loads(await asyncio.wait_for(proc.stdout.readline(), WAIT))]
            began = time.monotonic()
            for _ in range(3):
                docs.append(json.loads(await asyncio.wait_for(proc.stdout.readline(), WAIT)))
            took = time.monotonic() - began
            send_signal(proc, signal.SIGINT)
            code, err = await finish_process(proc)
    assert took < 3.0, took
    for doc in docs:
        errors = {n["http_address"]: n["error"] for n in doc["nodes"]}
        assert errors[http] is None and "no answer within 5 s" in errors[hung], errors
    assert code == 0 and b"Traceback" not in err, err
