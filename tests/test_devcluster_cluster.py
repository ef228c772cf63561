"""DevCluster end to end, driven with raw sockets and plain HTTP: topology, topics, every fault."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import ssl
import struct
import sys
from collections.abc import AsyncIterator
from io import StringIO
from typing import Any

import aiohttp
import pytest

from smartnsq.cli.app import build_parser, run_dev
from smartnsq.devcluster import AdminError, DevCluster, MetaEvent
from smartnsq.devcluster.meta import YOUZAN_VERSION
from tests.cli_support import killed_at_end, send_signal

V1 = {"Accept": "application/vnd.nsq; version=1.0"}
TIMEOUT = aiohttp.ClientTimeout(total=5)
FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE = 0, 1, 2


class Raw:
    """A bare NSQ TCP client: magic, command lines, size-prefixed frames."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, address: str) -> Raw:
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 5)
        writer.write(b"  V2")
        return cls(reader, writer)

    @property
    def local_port(self) -> int:
        return int(self.writer.get_extra_info("sockname")[1])

    def send(self, line: str, body: bytes | None = None) -> None:
        data = line.encode() + b"\n"
        if body is not None:
            data += struct.pack(">I", len(body)) + body
        self.writer.write(data)

    async def frame(self) -> tuple[int, bytes]:
        head = await asyncio.wait_for(self.reader.readexactly(8), 5)
        size, kind = struct.unpack(">iI", head)
        return kind, await asyncio.wait_for(self.reader.readexactly(size - 4), 5)

    async def call(self, line: str, body: bytes | None = None) -> tuple[int, bytes]:
        self.send(line, body)
        return await self.frame()

    async def closed_by_server(self) -> bool:
        return await asyncio.wait_for(self.reader.read(), 5) == b""

    def close(self) -> None:
        self.writer.close()


async def http(
    method: str, address: str, path: str, *, body: bytes | None = None
) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession(timeout=TIMEOUT) as s,
        s.request(method, f"http://{address}{path}", headers=V1, data=body) as r,
    ):
        raw = await r.read()
        try:
            return r.status, json.loads(raw) if raw else None
        except ValueError:
            return r.status, raw


async def lookup(cluster: DevCluster, topic: str, access: str = "w", i: int = 0) -> Any:
    status, doc = await http(
        "GET", cluster.lookupd_http_addresses[i], f"/lookup?topic={topic}&access={access}"
    )
    return status, doc


def tcp_ports(doc: Any) -> dict[str, int]:
    return {p: peer["tcp_port"] for p, peer in doc["partitions"].items()}


def port_of(cluster: DevCluster, i: int) -> int:
    return cluster.nodes[i].info.tcp_port


@pytest.fixture
async def yz() -> AsyncIterator[DevCluster]:
    async with DevCluster(nodes=3, lookupds=2, flavour="youzan") as cluster:
        yield cluster


async def test_topology_and_addresses(yz: DevCluster) -> None:
    assert len(yz.nsqd_tcp_addresses) == len(yz.nsqd_http_addresses) == 3
    assert len(yz.lookupd_http_addresses) == 2
    addrs = yz.nsqd_tcp_addresses + yz.nsqd_http_addresses + yz.lookupd_http_addresses
    assert len(set(addrs)) == 8 and all(a.startswith("127.0.0.1:") for a in addrs)
    assert yz.lookupd_leader is yz.lookupds[0]
    status, doc = await http("GET", yz.lookupd_http_addresses[1], "/listlookup")
    assert status == 200
    assert [n["HttpPort"] for n in doc["lookupdnodes"]] == [
        a.rsplit(":", 1)[1] for a in yz.lookupd_http_addresses
    ]
    for address in yz.lookupd_http_addresses:
        status, doc = await http("GET", address, "/nodes")
        assert sorted(p["tcp_port"] for p in doc["producers"]) == sorted(
            n.info.tcp_port for n in yz.nodes
        )
        assert {p["version"] for p in doc["producers"]} == {YOUZAN_VERSION}
    status, doc = await http("GET", yz.nsqd_http_addresses[0], "/ping")
    assert status == 200


async def test_lookupds_with_different_node_sets() -> None:
    async with DevCluster(nodes=3, lookupds=2, registrations={0: [0], 1: [1, 2]}) as cluster:
        cluster.create_topic("t", 3, channels=["c"])
        _, a = await lookup(cluster, "t", i=0)
        _, b = await lookup(cluster, "t", i=1)
        assert tcp_ports(a) == {"0": port_of(cluster, 0)}
        assert tcp_ports(b) == {"1": port_of(cluster, 1), "2": port_of(cluster, 2)}
        cluster.register(2, 0)
        cluster.unregister(1, 1)
        _, a = await lookup(cluster, "t", i=0)
        _, b = await lookup(cluster, "t", i=1)
        assert sorted(tcp_ports(a)) == ["0", "2"] and sorted(tcp_ports(b)) == ["2"]


async def test_create_topic_channels_make_it_writable(yz: DevCluster) -> None:
    topic = yz.create_topic("t", partition_num=2, replica=1, channels=["c"])
    assert topic is not None and topic.partition_num == 2
    status, doc = await lookup(yz, "t")
    assert status == 200
    assert tcp_ports(doc) == {"0": port_of(yz, 0), "1": port_of(yz, 1)}
    assert doc["channels"] == ["c"]
    yz.create_topic("bare", partition_num=1)
    status, doc = await lookup(yz, "bare")
    assert (status, doc) == (
        404,
        {"message": "Topic has no channel, should init at least one for the new topic"},
    )
    yz.create_channel("bare", "c")
    assert (await lookup(yz, "bare"))[0] == 200
    with pytest.raises(AdminError, match="No node is available"):
        yz.create_topic("big", partition_num=4)
    strict = yz.create_topic("strict", 3, ordered=True, disable_channel_auto_create=True)
    assert strict is not None
    yz.create_channel("strict", "c")
    assert strict.registered_channels == {"c"}
    status, doc = await lookup(yz, "strict")
    assert sorted(doc["partitions"]) == ["0", "1", "2"]


async def test_publish_and_consume_through_the_leader(yz: DevCluster) -> None:
    yz.create_topic("t", 1, channels=["c"])
    leader = yz.leader("t", 0)
    assert leader == 0
    pub = await Raw.connect(yz.nsqd_tcp_addresses[leader])
    assert await pub.call("PUB t 0", b"hello") == (FRAME_RESPONSE, b"OK")
    # a node that does not hold the partition refuses the write
    other = await Raw.connect(yz.nsqd_tcp_addresses[1])
    kind, data = await other.call("PUB t 0", b"x")
    assert kind == FRAME_ERROR
    sub = await Raw.connect(yz.nsqd_tcp_addresses[leader])
    assert await sub.call("SUB t c 0") == (FRAME_RESPONSE, b"OK")
    sub.send("RDY 1")
    kind, data = await sub.frame()
    assert kind == FRAME_MESSAGE and data[26:] == b"hello"
    for c in (pub, other, sub):
        c.close()


async def test_move_leader_changes_lookup_and_drops_subscribers(yz: DevCluster) -> None:
    yz.create_topic("t", 2, channels=["c"])
    events: list[MetaEvent] = []
    yz.meta.add_listener(events.append)
    sub = await Raw.connect(yz.nsqd_tcp_addresses[0])
    assert await sub.call("SUB t c 0") == (FRAME_RESPONSE, b"OK")
    new = yz.move_leader("t", 0)
    # a plain topic keeps one partition per node: the free node 2 takes over
    assert new == 2 and yz.leader("t", 0) == 2
    assert events == [MetaEvent("leader_moved", topic="t", partition=0, old="nsqd-0", new="nsqd-2")]
    assert await sub.closed_by_server()
    _, doc = await lookup(yz, "t")
    assert tcp_ports(doc) == {"0": port_of(yz, 2), "1": port_of(yz, 1)}
    # the single replica moved with the leadership: node 0 no longer holds the partition
    old = await Raw.connect(yz.nsqd_tcp_addresses[0])
    kind, data = await old.call("PUB t 0", b"x")
    assert kind == FRAME_ERROR and data.startswith(b"E_TOPIC_NOT_EXIST")
    assert yz.move_leader("t", 0, to_node=0) == 0
    _, doc = await lookup(yz, "t")
    assert tcp_ports(doc)["0"] == port_of(yz, 0)
    # with two replicas the old leader stays a follower and refuses writes as one
    yz.create_topic("r", 1, replica=2, channels=["c"])
    assert yz.move_leader("r", 0) == 1
    assert yz.meta.topics["r"].partitions[0].replicas == ["nsqd-1", "nsqd-0"]
    old.close()
    old = await Raw.connect(yz.nsqd_tcp_addresses[0])
    kind, data = await old.call("PUB r 0", b"x")
    assert kind == FRAME_ERROR and data.startswith(b"E_FAILED_ON_NOT_LEADER")
    sub.close()
    old.close()


async def test_writable_switches(yz: DevCluster) -> None:
    yz.create_topic("t", 2, channels=["c"])
    yz.create_topic("o", 1, ordered=True, channels=["c"])
    yz.set_writable("t", 1, False)
    _, doc = await lookup(yz, "t")
    assert sorted(doc["partitions"]) == ["0"]
    _, doc = await lookup(yz, "t", access="r")
    assert sorted(doc["partitions"]) == ["0", "1"]
    pub = await Raw.connect(yz.nsqd_tcp_addresses[1])
    kind, data = await pub.call("PUB t 1", b"x")
    assert kind == FRAME_ERROR and data.startswith(b"E_FAILED_ON_NOT_WRITABLE")
    yz.set_writable("t", 1, True)
    assert await pub.call("PUB t 1", b"x") == (FRAME_RESPONSE, b"OK")
    yz.set_cluster_writable(False)
    _, doc = await lookup(yz, "t")
    assert doc["partitions"] is None and doc["producers"] is None
    yz.set_cluster_writable(False, scope="ordered")
    _, doc = await lookup(yz, "t")
    assert sorted(doc["partitions"]) == ["0", "1"]
    _, doc = await lookup(yz, "o")
    assert doc["partitions"] is None and doc["meta"]["ordered"] is True
    yz.set_cluster_writable(True)
    _, doc = await lookup(yz, "o")
    assert sorted(doc["partitions"]) == ["0"]
    pub.close()


async def test_stop_and_restart_node(yz: DevCluster) -> None:
    yz.create_topic("single", 1, channels=["c"])
    yz.create_topic("replicated", 1, replica=2, channels=["c"])
    assert yz.leader("single", 0) == 0 and yz.leader("replicated", 0) == 0
    pub = await Raw.connect(yz.nsqd_tcp_addresses[0])
    assert await pub.call("PUB single 0", b"kept") == (FRAME_RESPONSE, b"OK")
    await yz.stop_node(0)
    assert await pub.closed_by_server()
    with pytest.raises(OSError):
        await Raw.connect(yz.nsqd_tcp_addresses[0])
    # the replica takes over; the single-replica partition is leaderless
    assert yz.leader("replicated", 0) == 1 and yz.leader("single", 0) is None
    _, doc = await lookup(yz, "replicated")
    assert tcp_ports(doc) == {"0": port_of(yz, 1)}
    status, doc = await lookup(yz, "single", access="r")
    assert status == 200 and doc["partitions"] == {}
    _, nodes = await http("GET", yz.lookupd_http_addresses[0], "/nodes")
    assert port_of(yz, 0) not in [p["tcp_port"] for p in nodes["producers"]]
    # with node 0 down, restarting node 1 leaves "replicated" leaderless in between; node 1
    # (a replica) leads it again when it is back
    await yz.restart_node(1)
    assert yz.leader("replicated", 0) == 1
    port = port_of(yz, 0)
    await yz.start_node(0)
    assert port_of(yz, 0) == port and yz.leader("single", 0) == 0
    _, doc = await lookup(yz, "single")
    assert tcp_ports(doc) == {"0": port}
    sub = await Raw.connect(yz.nsqd_tcp_addresses[0])
    assert await sub.call("SUB single c 0") == (FRAME_RESPONSE, b"OK")
    sub.send("RDY 1")
    kind, data = await sub.frame()
    # published and acknowledged before the stop: still there
    assert kind == FRAME_MESSAGE and data[26:] == b"kept"
    sub.close()


async def test_add_and_remove_node(yz: DevCluster) -> None:
    with pytest.raises(AdminError):
        yz.create_topic("t", 4)
    i = await yz.add_node()
    assert i == 3 and len(yz.nsqd_tcp_addresses) == 4
    yz.create_topic("t", 4, channels=["c"])
    _, nodes = await http("GET", yz.lookupd_http_addresses[1], "/nodes")
    assert len(nodes["producers"]) == 4
    removed = yz.nodes[1].node_id
    await yz.remove_node(1)
    assert len(yz.nodes) == 3 and removed not in yz.meta.nodes
    # its partition found a new home and leader
    t = yz.meta.topics["t"]
    assert all(p.leader is not None and removed not in p.replicas for p in t.partitions.values())
    _, doc = await lookup(yz, "t")
    assert sorted(doc["partitions"]) == ["0", "1", "2", "3"]


async def test_client_faults(yz: DevCluster) -> None:
    yz.create_topic("t", 1, channels=["c"])
    a = await Raw.connect(yz.nsqd_tcp_addresses[0])
    b = await Raw.connect(yz.nsqd_tcp_addresses[0])
    assert await a.call("PUB t 0", b"x") == (FRAME_RESPONSE, b"OK")
    assert await b.call("PUB t 0", b"x") == (FRAME_RESPONSE, b"OK")
    assert yz.drop_client(0, remote_port=a.local_port) == 1
    assert await a.closed_by_server()
    assert await b.call("PUB t 0", b"x") == (FRAME_RESPONSE, b"OK")

    yz.delay_responses(0, 0.3)
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert await b.call("PUB t 0", b"x") == (FRAME_RESPONSE, b"OK")
    assert loop.time() - start >= 0.29
    yz.delay_responses(0, 0)

    assert yz.corrupt_next_frame(0, remote_port=b.local_port) == 1
    b.send("PUB t 0", b"x")
    head = await asyncio.wait_for(b.reader.readexactly(8), 5)
    assert struct.unpack(">i", head[:4])[0] < 0
    b.close()


async def test_lookupd_faults(yz: DevCluster) -> None:
    address = yz.lookupd_http_addresses[0]
    await yz.lookupd_fault(0, "refuse")
    with pytest.raises(aiohttp.ClientConnectionError):
        await http("GET", address, "/ping")
    assert yz.lookupd_leader is yz.lookupds[1]
    await yz.clear_lookupd_fault(0)
    assert yz.lookupd_http_addresses[0] == address
    assert (await http("GET", address, "/ping")) == (200, b"OK")

    await yz.lookupd_fault(0, "500")
    assert (await http("GET", address, "/listlookup"))[0] == 500
    await yz.lookupd_fault(0, "malformed")
    status, body = await http("GET", address, "/listlookup")
    assert status == 200 and isinstance(body, bytes)
    await yz.lookupd_fault(0, "hang")
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(http("GET", address, "/ping"), 0.3)
    await yz.clear_lookupd_fault(0)
    assert (await http("GET", address, "/ping")) == (200, b"OK")
    with pytest.raises(ValueError):
        await yz.lookupd_fault(0, "delay")
    with pytest.raises(ValueError):
        await yz.lookupd_fault(0, "explode")  # type: ignore[arg-type]


async def test_stock_cluster() -> None:
    async with DevCluster(nodes=2, lookupds=1, flavour="stock") as cluster:
        assert cluster.create_topic("t", channels=["c"]) is None
        address = cluster.lookupd_http_addresses[0]
        status, doc = await http("GET", address, "/lookup?topic=t")
        assert status == 200 and doc["channels"] == ["c"] and "partitions" not in doc
        assert sorted(p["tcp_port"] for p in doc["producers"]) == sorted(
            n.info.tcp_port for n in cluster.nodes
        )
        assert (await http("GET", address, "/listlookup"))[0] == 404
        pub = await Raw.connect(cluster.nsqd_tcp_addresses[0])
        assert await pub.call("PUB t", b"stock") == (FRAME_RESPONSE, b"OK")
        await cluster.stop_node(0)
        status, doc = await http("GET", address, "/lookup?topic=t")
        assert status == 200
        assert [p["tcp_port"] for p in doc["producers"]] == [cluster.nodes[1].info.tcp_port]
        await cluster.start_node(0)
        sub = await Raw.connect(cluster.nsqd_tcp_addresses[0])
        assert await sub.call("SUB t c") == (FRAME_RESPONSE, b"OK")
        sub.send("RDY 1")
        kind, data = await sub.frame()
        assert kind == FRAME_MESSAGE and data[26:] == b"stock"
        cluster.delete_topic("t")
        status, doc = await http("GET", cluster.nsqd_http_addresses[1], "/stats?format=json")
        assert status == 200 and doc["topics"] == []
        pub.close()
        sub.close()


async def test_tls_and_auth_are_wired_to_the_nodes() -> None:
    pytest.importorskip("trustme")

    async def allow(secret: str, remote: str) -> dict[str, Any] | None:
        return None

    async with DevCluster(nodes=1, lookupds=1, flavour="stock", tls=True, auth=allow) as c:
        assert c.tls_ca_file is not None
        conn = await Raw.connect(c.nsqd_tcp_addresses[0])
        body = json.dumps({"tls_v1": True, "feature_negotiation": True}).encode()
        kind, data = await conn.call("IDENTIFY", body)
        answer = json.loads(data)
        assert kind == FRAME_RESPONSE and answer["tls_v1"] is True
        assert answer["auth_required"] is True
        await conn.writer.start_tls(c.client_ssl_context(), server_hostname="127.0.0.1")
        assert await conn.frame() == (FRAME_RESPONSE, b"OK")
        conn.close()
    with pytest.raises(Exception, match="no generated CA"):
        DevCluster().client_ssl_context()
    assert isinstance(ssl.create_default_context(), ssl.SSLContext)


class ReadyOut(StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.ready = asyncio.Event()

    def write(self, s: str) -> int:
        n = super().write(s)
        if self.getvalue().endswith("ready\n"):
            self.ready.set()
        return n


async def test_cli_run_dev_prints_addresses() -> None:
    args = build_parser().parse_args(
        ["dev", "--nodes", "2", "--lookupds", "2", "--topic", "t:2", "--channel", "c"]
    )
    out = ReadyOut()
    stop = asyncio.Event()
    task = asyncio.ensure_future(run_dev(args, out=out, stop=stop))
    await asyncio.wait_for(out.ready.wait(), 10)
    lines = out.getvalue().splitlines()
    assert lines[-1] == "ready" and lines[0] == "flavour youzan"
    kinds = [line.split()[0] for line in lines[1:-1]]
    assert kinds.count("lookupd_http") == 2 and kinds.count("nsqd_tcp") == 2
    lookupd = next(line.split()[1] for line in lines if line.startswith("lookupd_http"))
    status, doc = await http("GET", lookupd, "/lookup?topic=t&access=w")
    assert status == 200 and sorted(doc["partitions"]) == ["0", "1"]
    stop.set()
    assert await asyncio.wait_for(task, 5) == 0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
async def test_cli_process_runs_until_signalled(sig: signal.Signals) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "smartnsq.devcluster",
        "--nodes",
        "1",
        "--flavour",
        "stock",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    async with killed_at_end(proc):
        lines: list[str] = []
        while not lines or lines[-1] != "ready":
            line = await asyncio.wait_for(proc.stdout.readline(), 20)
            assert line, "the process ended before printing 'ready'"
            lines.append(line.decode().strip())
        lookupd = next(line.split()[1] for line in lines if line.startswith("lookupd_http"))
        assert await http("GET", lookupd, "/ping") == (200, b"OK")
        send_signal(proc, sig)
        assert await asyncio.wait_for(proc.wait(), 20) == 0


def test_cli_rejects_bad_topic_specs(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("t:x", ":2", "t:0", "t:1:2:3"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["dev", "--topic", bad])
    assert "NAME[:PARTITIONS[:REPLICA]]" in capsys.readouterr().err
