"""``--metrics-port`` on the long-running commands (tail, to-file, bridge): the command's
clients report to a Prometheus endpoint while it runs. Each test runs the real command as a
subprocess, as an operator starts it beside a Prometheus, publishes through the real
``smartnsq publish``, and scrapes the real endpoint (parsed with ``prometheus_client``)."""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import sys
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from smartnsq.config import ProducerConfig
from smartnsq.metrics import catalog
from tests.cli_support import WAIT, send_signal, smartnsq
from tests.real_servers import StockServer, stock, unique  # noqa: F401  (the fixture)

Samples = dict[str, list[tuple[dict[str, str], float]]]

_URL = re.compile(rb"smartnsq: metrics on (http://\S+/metrics)")


class Running:
    """A long-running ``smartnsq`` command in a subprocess: its metrics URL comes from the
    line it prints on stderr at start."""

    def __init__(self, proc: asyncio.subprocess.Process, url: str) -> None:
        self.proc = proc
        self.url = url

    @classmethod
    async def start(cls, *args: str) -> Running:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "smartnsq", *args, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        assert proc.stderr is not None
        try:
            line = await asyncio.wait_for(proc.stderr.readline(), WAIT)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise AssertionError("no metrics line on stderr") from None
        m = _URL.search(line)
        if m is None:
            rest = await asyncio.wait_for(proc.stderr.read(), WAIT)
            await proc.wait()
            raise AssertionError(f"expected the metrics URL, got: {(line + rest)!r}")
        return cls(proc, m.group(1).decode())

    async def lines(self, n: int) -> list[bytes]:
        assert self.proc.stdout is not None
        return [await asyncio.wait_for(self.proc.stdout.readline(), WAIT) for _ in range(n)]

    async def stop(self) -> tuple[int, bytes]:
        """SIGINT, as Ctrl-C: its exit code and what it still wrote on stderr."""
        if self.proc.returncode is None:
            send_signal(self.proc, signal.SIGINT)
        _, err = await asyncio.wait_for(self.proc.communicate(), WAIT)
        assert self.proc.returncode is not None
        return self.proc.returncode, err


async def scrape_text(url: str) -> str:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s, \
            s.get(url) as resp:
        assert resp.status == 200, resp.status
        return await resp.text()


async def scrape(url: str) -> Samples:
    out: Samples = {}
    for fam in text_string_to_metric_families(await scrape_text(url)):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(v for lab, v in samples.get(name, ())
               if all(lab.get(k) == want for k, want in labels.items()))


async def publishers_of(nsqd_http: str, topic: str) -> list[int]:
    """Per client connection that published to ``topic``, its count (nsqd's /stats)."""
    async with aiohttp.ClientSession() as session, session.get(
            f"http://{nsqd_http}/stats", params={"format": "json"}) as resp:
        assert resp.status == 200, await resp.text()
        doc = await resp.json()
    doc = doc.get("data", doc)  # older nsqd wraps the answer
    return [c["count"] for p in doc.get("producers") or []
            for c in p.get("pub_counts") or [] if c["topic"] == topic]


async def until(url: str, name: str, want: float, **labels: str) -> Samples:
    """Scrape until ``name`` (summed over ``labels``) reaches ``want``; the last scrape."""
    got: Samples = {}
    for _ in range(int(WAIT / 0.1)):
        got = await scrape(url)
        if total(got, name, **labels) >= want:
            return got
        await asyncio.sleep(0.1)
    raise AssertionError(f"{name}{labels} stayed at {total(got, name, **labels)}, "
                         f"expected {want}")


async def publish(nsqd_tcp: str, topic: str, bodies: list[bytes]) -> None:
    """``smartnsq publish``, one message per line of a pipe."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "smartnsq", "publish", topic, "--nsqd", nsqd_tcp,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(b"".join(b + b"\n" for b in bodies)), WAIT)
    assert proc.returncode == 0, err


@pytest.mark.real_nsqd
async def test_tail_serves_every_catalog_metric_on_its_port(
        stock: StockServer) -> None:  # noqa: F811
    topic = unique("mport")
    tail = await Running.start("tail", topic, "--nsqd", stock.nsqd_tcp, "--channel", "audit",
                               "--metrics-port", "0")
    try:
        families = {f.name: f for f in text_string_to_metric_families(
            await scrape_text(tail.url))}
        for spec in catalog.ALL:
            fam = families.get(f"smartnsq_{spec.name}")
            assert fam is not None, spec.name
            assert fam.documentation == spec.description
            assert fam.type == spec.kind.value
        # the process' own figures, as every Python exporter has them
        assert "process_cpu_seconds" in families
        # Ctrl-C stops tail gracefully (exit 0) once it runs; before, while it starts, it
        # is "interrupted" (130): wait until it has subscribed (the metrics come first)
        await until_subscribed(tail.url)
    finally:
        code, err = await tail.stop()
    assert code == 0, err


async def until_subscribed(url: str) -> None:
    """Until the command's consumer has sent RDY on a connection (bounded by WAIT)."""
    async with asyncio.timeout(WAIT):
        # another process: polled, as its metrics are read
        while not (await scrape(url)).get("smartnsq_consumer_rdy"):  # noqa: ASYNC110
            await asyncio.sleep(0.05)


@pytest.mark.real_nsqd
async def test_tail_counts_what_it_printed(stock: StockServer) -> None:  # noqa: F811
    topic, channel = unique("mtail"), "audit"
    tail = await Running.start("tail", topic, "--nsqd", stock.nsqd_tcp, "--channel", channel,
                               "--metrics-port", "0")
    try:
        await publish(stock.nsqd_tcp, topic, [b"m%d" % i for i in range(5)])
        assert sorted(await tail.lines(5)) == [b"m%d\n" % i for i in range(5)]
        sub = {"topic": topic, "channel": channel, "nsqd": stock.nsqd_tcp, "partition": ""}
        got = await until(tail.url, "smartnsq_consumer_messages_finished_total", 5, **sub)
        assert total(got, "smartnsq_consumer_messages_received_total", **sub) == 5
        assert total(got, "smartnsq_consumer_messages_finished_total", **sub) == 5
        assert total(got, "smartnsq_consumer_messages_requeued_total", **sub) == 0
        assert total(got, "smartnsq_consumer_messages_in_flight", **sub) == 0
        assert total(got, "smartnsq_consumer_rdy", **sub) >= 1
        assert total(got, "smartnsq_consumer_connects_total", topic=topic) == 1
        assert total(got, "smartnsq_consumer_process_duration_seconds_count",
                     topic=topic, channel=channel) == 5
    finally:
        code, err = await tail.stop()
    assert code == 0, err


@pytest.mark.real_nsqd
async def test_bridge_reports_its_consumer_and_its_producer(
        stock: StockServer) -> None:  # noqa: F811
    src, dest = unique("msrc"), unique("mdst")
    bridge = await Running.start("bridge", src, dest, "--from-nsqd", stock.nsqd_tcp,
                                 "--to-nsqd", stock.nsqd_tcp, "--metrics-port", "0")
    try:
        await publish(stock.nsqd_tcp, src, [b"b%d" % i for i in range(6)])
        got = await until(bridge.url, "smartnsq_consumer_messages_finished_total", 6,
                          topic=src)
        assert total(got, "smartnsq_producer_messages_sent_total", topic=dest,
                     result="ok") == 6
        assert total(got, "smartnsq_producer_publishes_total", topic=dest, command="PUB",
                     result="ok") == 6
        assert total(got, "smartnsq_producer_publish_duration_seconds_count", topic=dest) == 6
        # the pool dials up to connections_per_nsqd in the background once its first
        # connection is in use: the gauge shows them all ready, none dialling, and every
        # connection nsqd saw publish the six is one of them
        size = ProducerConfig().connections_per_nsqd
        got = await until(bridge.url, "smartnsq_producer_connections", size,
                          nsqd=stock.nsqd_tcp, state="ready")
        assert total(got, "smartnsq_producer_connections", nsqd=stock.nsqd_tcp,
                     state="ready") == size
        assert total(got, "smartnsq_producer_connections", nsqd=stock.nsqd_tcp,
                     state="connecting") == 0
        publishers = await publishers_of(stock.nsqd_http, dest)
        assert sum(publishers) == 6 and len(publishers) <= size
    finally:
        code, err = await bridge.stop()
    assert code == 0, err


@pytest.mark.real_nsqd
async def test_to_file_counts_what_it_archived(stock: StockServer,  # noqa: F811
                                               tmp_path: Path) -> None:
    topic = unique("mfile")
    archive = await Running.start("to-file", topic, "--nsqd", stock.nsqd_tcp, "--output-dir",
                                  str(tmp_path), "--sync-interval", "0.05",
                                  "--metrics-port", "0")
    try:
        await publish(stock.nsqd_tcp, topic, [b"f%d" % i for i in range(7)])
        got = await until(archive.url, "smartnsq_consumer_messages_finished_total", 7,
                          topic=topic)
        assert total(got, "smartnsq_consumer_messages_received_total", topic=topic) == 7
    finally:
        code, err = await archive.stop()
    assert code == 0, err
    archived = await asyncio.to_thread(lambda: b"".join(p.read_bytes()
                                                        for p in tmp_path.iterdir()))
    assert sorted(archived.split()) == [b"f%d" % i for i in range(7)]


async def test_a_port_in_use_is_one_line_at_start(stock: StockServer) -> None:  # noqa: F811
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = await smartnsq("tail", unique("mbusy"), "--nsqd", stock.nsqd_tcp,
                                        "--metrics-port", str(port), bound=10)
    assert code == 1, err
    assert err.decode().splitlines() == [
        f"smartnsq: error: --metrics-port {port}: cannot listen on 127.0.0.1:{port}: "
        "Address already in use"], err
    assert out == b""


@pytest.mark.parametrize("command", ["tail", "to-file", "bridge"])
async def test_every_long_running_command_documents_the_flags(command: str) -> None:
    code, out, err = await smartnsq(command, "--help")
    assert code == 0, err
    text = " ".join(out.decode().split())
    assert "--metrics-port PORT" in text and "--metrics-addr HOST" in text
    assert "Prometheus" in text
