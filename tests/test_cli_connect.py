"""The reading commands (``tail``, ``to-file``, ``bridge``) share their connection behaviour:
``--connect-timeout`` (an nsqd that cannot be reached is named on stderr at once, and the
command exits 1 with the reason when nothing ever connected), a connection lost later is
retried with a visible warning, and an ordered topic is either read with ``--ordered`` (one
message at a time per partition, in order) or refused naming that flag. On the embedded
servers and, where the fixtures say so, on the real ones."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from smartnsq import Producer
from smartnsq.devcluster import DevCluster
from tests.cli_support import (
    WAIT,
    closed_port,
    eventually,
    finish_process,
    killed_at_end,
    send_signal,
    smartnsq,
)
from tests.real_servers import (  # noqa: F401  (the fixtures)
    StockServer,
    YouzanCluster,
    stock,
    youzan,
)

READERS = ["to-file", "bridge"]


def reader_args(command: str, topic: str, source: list[str], tmp: Path,
                dest: list[str]) -> list[str]:
    """``command`` reading ``topic`` from ``source`` (``--nsqd X`` / ``--lookupd X`` as
    tail spells them; bridge's get the ``from-`` prefix), bridging into ``dest``."""
    if command == "to-file":
        return ["to-file", topic, "--output-dir", str(tmp), *source]
    if command == "bridge":
        return ["bridge", topic, *[a.replace("--", "--from-") if a.startswith("--") else a
                                   for a in source], *dest]
    return ["tail", topic, *source]


def archived(directory: Path) -> list[str]:
    """Every line written so far (synced files are readable while still ``.tmp``)."""
    out: list[str] = []
    for p in sorted(directory.iterdir()):
        out += p.read_text().splitlines()
    return out


def archive_files(directory: Path) -> dict[str, list[str]]:
    return {p.name: p.read_text().splitlines() for p in sorted(directory.iterdir())}


async def http_pub(nsqd_http: str, topic: str, body: bytes, **params: str) -> None:
    async with aiohttp.ClientSession() as s, \
            s.post(f"http://{nsqd_http}/pub", params={"topic": topic, **params},
                   data=body) as r:
        assert r.status == 200, await r.text()



# -- help ------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", READERS)
async def test_help_documents_the_connect_bound_and_ordered(command: str) -> None:
    code, out, _ = await smartnsq(command, "--help")
    assert code == 0 and b"--connect-timeout" in out and b"--ordered" in out, out


# -- an nsqd that cannot be reached ----------------------------------------------------------


@pytest.mark.parametrize("command", ["tail", *READERS])
async def test_a_wrong_port_is_named_at_once_then_given_up(
        command: str, stock: StockServer, tmp_path: Path) -> None:  # noqa: F811
    """A closed port, and nsqd's HTTP port given for its TCP port: each named on stderr within
    seconds; then exit 1 once the bound passes without a connection (closed port), or at once
    (the HTTP port)."""
    if stock.real:
        pytest.skip("the double's addresses suffice: nothing here reaches the server")
    # a closed port may open later: retried until the bound; a port that answers as another
    # listener will not change: the command ends at once, before the bound
    for addr, why, ends in [(closed_port(), b"Connect call failed", "within 3 s"),
                            (stock.nsqd_http, b"HTTP port", "is not an nsqd TCP port")]:
        began = time.monotonic()
        args = reader_args(command, "t", ["--nsqd", addr], tmp_path,
                           ["--to-nsqd", stock.nsqd_tcp])
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "smartnsq", *args, "--connect-timeout", "3",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            assert proc.stderr is not None
            first = await asyncio.wait_for(proc.stderr.readline(), 6.0)
            # promptly, while it is still trying
            assert first.startswith(b"smartnsq: warning: ") and addr.encode() in first, first
            assert why in first, first
            if ends == "within 3 s":  # still trying (the HTTP port's run may be over)
                assert proc.returncode is None, first
        except BaseException:
            proc.kill()
            await proc.wait()
            raise
        code, rest = await finish_process(proc)
        assert code == 1, (first, rest)
        assert time.monotonic() - began < 3 + 10  # the bound plus start-up and a retry
        last = rest.decode().splitlines()[-1]
        assert last.startswith("smartnsq: error: ") and ends in last, rest
        assert addr in last and "Traceback" not in rest.decode()


# -- a connection lost later -----------------------------------------------------------------


@pytest.mark.parametrize("command", ["tail", *READERS])
async def test_a_lost_connection_is_retried_with_a_warning(command: str,
                                                           tmp_path: Path) -> None:
    """Connected, then the nsqd goes away: a warning on stderr while it is down, no exit; once
    it is back the command carries on (message 2 arrives) and ends normally."""
    async with DevCluster(nodes=1, lookupds=1, flavour="stock") as src, \
            DevCluster(nodes=1, lookupds=1, flavour="stock") as dst:
        (tcp,), (http,) = src.nsqd_tcp_addresses, src.nsqd_http_addresses
        src.create_topic("lost", channels=["c"])
        dst.create_topic("lost", channels=["c"])
        args = reader_args(command, "lost", ["--nsqd", tcp], tmp_path,
                           ["--to-nsqd", dst.nsqd_tcp_addresses[0]])
        if command != "to-file":
            args += ["-n", "2"]
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "smartnsq", *args, "--channel", "c",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        async with killed_at_end(proc):
            await http_pub(http, "lost", b"one")
            if command == "tail":
                line = await asyncio.wait_for(proc.stdout.readline(), WAIT)
                assert line == b"one\n"
            elif command == "to-file":
                await eventually("message one archived",
                                 lambda: (archived(tmp_path) == ["one"]))
            else:
                await eventually("message one forwarded",
                                 lambda: (_depth(dst, "lost") == 1))
            # printed (or archived, forwarded) comes before its FIN: stop the node once the
            # FIN arrived, or nsqd rightly hands message one out again after the restart
            await eventually("message one finished", lambda: _unanswered(src, "lost") == 0)
            await src.stop_node(0)
            warning = await asyncio.wait_for(proc.stderr.readline(), WAIT)
            assert warning.startswith(b"smartnsq: warning: ") and tcp.encode() in warning
            assert b"retrying" in warning and proc.returncode is None, warning
            await src.start_node(0)
            await http_pub(http, "lost", b"two")
            if command == "to-file":
                await eventually("message two archived",
                                 lambda: (archived(tmp_path) == ["one", "two"]))
                send_signal(proc, signal.SIGINT)
            out, err = await asyncio.wait_for(proc.communicate(), WAIT)
        assert proc.returncode == 0, err
        assert b"error" not in err and b"Traceback" not in err, err
        if command == "tail":
            assert out == b"two\n"
        elif command == "bridge":
            assert _depth(dst, "lost") == 2 and b"forwarded 2 message(s)" in err


def _unanswered(cluster: DevCluster, topic: str) -> int:
    """Messages of ``topic`` still queued or in flight on the first node."""
    st = cluster.nodes[0].store.stock_topic(cluster.nodes[0].node_id, topic)
    assert st is not None
    return sum(ch.depth() + ch.in_flight_count for ch in st.channels.values())


def _depth(cluster: DevCluster, topic: str) -> int:
    st = cluster.nodes[0].store.stock_topic(cluster.nodes[0].node_id, topic)
    assert st is not None
    return sum(ch.depth() for ch in st.channels.values())


# -- ordered topics --------------------------------------------------------------------------


@pytest.mark.real_youzan
@pytest.mark.parametrize("command", READERS)
async def test_an_ordered_topic_without_the_flag_names_it(
        command: str, youzan: YouzanCluster, tmp_path: Path) -> None:  # noqa: F811
    topic = await youzan.create_topic("connord", partition_num=1, ordered=True)
    # bridge: the destination only has to be writable, nothing is read before the refusal
    dest = ["--to-lookupd", youzan.lookupd]
    code, _, err = await smartnsq(*reader_args(command, topic.name,
                                               ["--lookupd", youzan.lookupd], tmp_path, dest))
    (line,) = err.decode().splitlines()
    assert code == 1 and line.startswith("smartnsq: error: "), err
    assert "--ordered" in line and "OrderedConsumer" not in line, line
    # straight at the nsqd (where --ordered is not available): the same advice
    code, _, err = await smartnsq(*reader_args(command, topic.name,
                                               ["--nsqd", topic.leaders[0].tcp], tmp_path,
                                               dest))
    (line,) = err.decode().splitlines()
    lookupd_flag = "--from-lookupd" if command == "bridge" else "--lookupd"
    assert code == 1 and "--ordered" in line and lookupd_flag in line, err
    assert "OrderedConsumer" not in line, line


async def publish_per_partition(youzan: YouzanCluster, topic: str,  # noqa: F811
                                partitions: int, n: int) -> dict[int, list[str]]:
    sent: dict[int, list[str]] = {}
    async with Producer(lookupd=[youzan.lookupd]) as producer:
        for p in range(partitions):
            sent[p] = [f"{topic}-p{p}-{i:03d}" for i in range(n)]
            for body in sent[p]:
                await producer.publish(topic, body.encode(), partition=p)
    return sent


@pytest.mark.real_youzan
async def test_to_file_ordered_archives_each_partition_in_order(
        youzan: YouzanCluster, tmp_path: Path) -> None:  # noqa: F811
    topic = await youzan.create_topic("fileord", partition_num=2, ordered=True,
                                      channels=("archive",))
    sent = await publish_per_partition(youzan, topic.name, 2, 15)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "smartnsq", "to-file", topic.name, "--output-dir",
        str(tmp_path), "--lookupd", youzan.lookupd, "--channel", "archive", "--ordered",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    async with killed_at_end(proc):
        await eventually("30 messages archived",
                         lambda: (len(archived(tmp_path)) >= 30), youzan.settle_seconds)
        send_signal(proc, signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), WAIT)
    assert proc.returncode == 0, err
    assert b"archived 30 message(s)" in err, err
    files = archive_files(tmp_path)
    assert not [name for name in files if name.endswith(".tmp")]
    for p in (0, 1):
        (name,) = [name for name in files if name.startswith(f"{topic.name}.p{p}.")]
        assert files[name] == sent[p]  # each partition in its order


@pytest.mark.real_youzan
async def test_bridge_ordered_keeps_each_partitions_order(
        youzan: YouzanCluster) -> None:  # noqa: F811
    src = await youzan.create_topic("brsrc", partition_num=2, ordered=True,
                                    channels=("nsq_to_nsq",))
    dst = await youzan.create_topic("brdst", partition_num=2, ordered=True, channels=("c",))
    sent = await publish_per_partition(youzan, src.name, 2, 15)
    code, _, err = await smartnsq("bridge", src.name, dst.name, "--from-lookupd",
                                  youzan.lookupd, "--to-lookupd", youzan.lookupd,
                                  "--ordered", "-n", "30")
    assert code == 0 and b"forwarded 30 message(s)" in err, err
    code, out, err = await smartnsq("tail", dst.name, "--lookupd", youzan.lookupd, "--ordered",
                                    "--channel", "c", "-n", "30", "--format", "json")
    assert code == 0, err
    got: dict[int, list[str]] = {0: [], 1: []}
    for line in out.decode().splitlines():
        doc = json.loads(line)
        got[doc["partition"]].append(doc["body"])
    # source partition p went, in its order, to destination partition p
    assert got == sent
