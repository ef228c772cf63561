"""What a newcomer tries first with the operator commands, and the invariant each must keep:
it returns within a bound, with one clear line and the conventional exit code (0 done, 1
error, 2 usage error), no traceback, and changes nothing the user did not ask for.

* ``dev`` on a taken ``--lookupd-port`` or a ``--host`` that is not this machine's names
  the option to change; ``--nodes 0`` says no nsqd runs; Ctrl-C while it starts does not
  print ``ready``; bad ``--topic`` specs are usage errors; into a closed pipe it ends
  quietly; two at once each get their own ports;
* ``stat --once --json`` is one valid JSON document with 0 topics and with 200; the table
  of 200 topics has one row each, an empty one says it is empty; a topic deleted while
  ``stat`` streams leaves it running; a live table taller than the screen says so; a
  wrong ``--client-metrics`` port is said in words;
* ``lookup`` of a missing topic, admin commands run twice, names with bad characters, a
  topic shape the cluster has too few nsqd for;
* two demos at once both pass; the demo into ``| head`` ends quietly.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from smartnsq.cli.dev import DevOptions, run_dev, start_error
from tests.cli_support import (
    WAIT,
    ClusterThread,
    assert_one_line_error,
    cluster_fixture,
    invoke,
    killed_at_end,
    run_cli,
    send_signal,
    spawn_cli,
)
from tests.test_cli_dev import run_until_ready, stop_with_sigint

#: what a one-off command may take on a busy machine (they take about 0.6 s here)
QUICK = 10.0

stock = cluster_fixture("stock", nodes=1)
yz = cluster_fixture("youzan", nodes=2)


def timed(args: list[str], input: str | None = None) -> tuple[Any, float]:
    began = time.monotonic()
    result = invoke(args, input=input)
    return result, time.monotonic() - began


# --- smartnsq dev -----------------------------------------------------------------------

def test_dev_on_a_taken_lookupd_port_names_the_option() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r, took = timed(["dev", "--nodes", "1", "--lookupd-port", str(port)])
    assert r.exit_code == 1 and took < QUICK
    line = assert_one_line_error(r, f"--lookupd-port {port}", "already in use",
                                 "leave --lookupd-port out")
    assert "Errno" not in line and "ready" not in r.stdout


def test_dev_on_an_address_not_of_this_machine_names_host() -> None:
    r, took = timed(["dev", "--nodes", "1", "--host", "192.0.2.1"])  # TEST-NET-1
    assert r.exit_code == 1 and took < QUICK
    assert_one_line_error(r, "--host 192.0.2.1", "not an address of this machine")


def test_an_unresolvable_host_is_named() -> None:
    # unit-level: resolving a bogus name may wait on a DNS server a test should not need
    exc = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    text = start_error(DevOptions(host="nosuch.invalid"), exc)
    assert text == "--host nosuch.invalid: cannot be resolved (Name or service not known)"


@pytest.mark.parametrize("spec", ["a:0", ":3", "a::", "bad name", "a:2:x", "a:1:1:1", ""])
def test_bad_topic_specs_are_usage_errors(spec: str) -> None:
    r, took = timed(["dev", "--topic", spec])
    assert r.exit_code == 2 and took < QUICK
    assert_one_line_error(r, "--topic")


async def test_dev_with_no_nodes_says_no_nsqd_runs() -> None:
    proc, lines = await run_until_ready(sys.executable, "-m", "smartnsq", "dev", "--nodes",
                                        "0")
    try:
        assert not any(x.startswith("nsqd_") for x in lines)
        assert any(x.startswith("lookupd_http ") for x in lines)
    finally:
        await stop_with_sigint(proc)
    assert proc.stderr is not None
    err = (await proc.stderr.read()).decode()
    assert err.count("\n") == 1 and "--nodes 0" in err and "no nsqd" in err, err


async def test_ctrl_c_while_starting_does_not_say_ready() -> None:
    stop = asyncio.Event()
    stop.set()  # the signal came while the servers were starting
    out = io.StringIO()
    began = time.monotonic()
    code = await asyncio.wait_for(run_dev(DevOptions(nodes=2, topic=()), out=out, stop=stop),
                                  WAIT)
    assert code == 130 and "ready" not in out.getvalue()
    assert time.monotonic() - began < QUICK


def test_dev_into_a_closed_pipe_ends_quietly() -> None:
    """Its reader gone before the addresses: exit 0 and nothing on stderr, like every other
    command whose output was closed (it was 'error: BrokenPipeError', exit 1)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    began = time.monotonic()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "smartnsq", "dev", "--nodes", "1"],
                                stdout=write_end, stderr=subprocess.PIPE)
    finally:
        os.close(write_end)
    with killed_at_end(proc):
        _, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0 and err == b"", err.decode()
    assert time.monotonic() - began < QUICK


async def test_two_devs_at_once_get_their_own_ports() -> None:
    argv = (sys.executable, "-m", "smartnsq", "dev", "--nodes", "1", "--topic", "t")
    (a, lines_a), (b, lines_b) = await asyncio.gather(run_until_ready(*argv),
                                                      run_until_ready(*argv))
    try:
        ports_a = {x.split()[1] for x in lines_a if " 127.0.0.1:" in x}
        ports_b = {x.split()[1] for x in lines_b if " 127.0.0.1:" in x}
        assert len(ports_a) == len(ports_b) == 3 and not ports_a & ports_b
    finally:
        await asyncio.gather(stop_with_sigint(a), stop_with_sigint(b))

# --- smartnsq stat ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def empty_stock() -> Iterator[ClusterThread]:
    ct = ClusterThread(nodes=1, lookupds=1, flavour="stock")
    try:
        yield ct
    finally:
        ct.stop()


def stat_json(lookupd: str, *extra: str) -> tuple[dict[str, Any], float]:
    began = time.monotonic()
    done = run_cli(["stat", "--lookupd", lookupd, "--once", "--json", *extra])
    took = time.monotonic() - began
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""
    doc = json.loads(done.stdout)  # the whole output is one JSON document
    assert isinstance(doc, dict)
    return doc, took


def test_stat_of_no_topics_then_200(empty_stock: ClusterThread) -> None:
    doc, took = stat_json(empty_stock.lookupd)
    assert doc["topics"] == [] and took < QUICK
    r = invoke(["stat", "--lookupd", empty_stock.lookupd, "--once", "--interval", "0.1"])
    # the empty table says why it is empty
    assert r.exit_code == 0 and "no topic on the 1 nsqd that answered" in r.stdout

    names = [f"t{i:03d}" for i in range(200)]

    def create() -> None:
        for n in names:
            empty_stock.cluster.create_topic(n, channels=("c",))

    empty_stock.call(create)
    doc, took = stat_json(empty_stock.lookupd)
    assert sorted(t["topic"] for t in doc["topics"]) == names and took < QUICK
    began = time.monotonic()
    r = invoke(["stat", "--lookupd", empty_stock.lookupd, "--once", "--interval", "0.1"])
    assert r.exit_code == 0 and time.monotonic() - began < QUICK
    rows = [line for line in r.stdout.splitlines() if line.startswith("│ t")]
    assert [row.split()[1] for row in rows] == names  # one row each, in name order
    assert "no topic on" not in r.stdout


def test_stat_interval_zero_is_a_usage_error(stock: ClusterThread) -> None:
    r, took = timed(["stat", "--lookupd", stock.lookupd, "--interval", "0"])
    assert r.exit_code == 2 and took < QUICK
    assert_one_line_error(r, "--interval")


def test_a_topic_deleted_while_stat_streams(stock: ClusterThread) -> None:
    stock.call(lambda: stock.cluster.create_topic("going", channels=("c",)))
    proc = spawn_cli(["stat", "going", "--lookupd", stock.lookupd, "--interval", "0.2",
                      "--json"])
    assert proc.stdout is not None
    with killed_at_end(proc):
        first = json.loads(proc.stdout.readline())
        assert [t["topic"] for t in first["topics"]] == ["going"]
        http = stock.cluster.nsqd_http_addresses[0]
        req = urllib.request.Request(f"http://{http}/topic/delete?topic=going", b"",
                                     method="POST")
        urllib.request.urlopen(req, timeout=5).close()
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:  # each line valid JSON; it goes on without it
            if json.loads(proc.stdout.readline())["topics"] == []:
                break
        else:
            raise AssertionError("stat still showed the deleted topic")
        send_signal(proc, signal.SIGINT)
        _, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0 and b"Traceback" not in err, err


def test_client_metrics_at_the_wrong_port_says_so(stock: ClusterThread) -> None:
    """``--client-metrics`` pointed at nothing, and at nsqd's own HTTP port: stat still
    shows nsqd's side (exit 0), each endpoint's error in words, not aiohttp's repr."""
    pytest.importorskip("prometheus_client")
    stock.call(lambda: stock.cluster.create_topic("watched", channels=("c",)))
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{closed.getsockname()[1]}"
    nsqd_http = stock.cluster.nsqd_http_addresses[0]
    doc, took = stat_json(stock.lookupd, "watched", "--client-metrics", dead,
                          "--client-metrics", nsqd_http)
    assert took < QUICK and [t["topic"] for t in doc["topics"]] == ["watched"]
    errors = {e["url"]: e["error"] for e in doc["client_metrics"]}
    assert errors[f"http://{dead}/metrics"].startswith("cannot connect")
    assert "ssl:default" not in errors[f"http://{dead}/metrics"]
    assert errors[f"http://{nsqd_http}/metrics"].startswith(
        "HTTP 404: no Prometheus metrics here")

# --- lookup, topic and channel ------------------------------------------------------------

@pytest.mark.parametrize("flavour", ["stock", "youzan"])
def test_lookup_of_a_missing_topic(flavour: str, stock: ClusterThread,
                                   yz: ClusterThread) -> None:
    ct = stock if flavour == "stock" else yz
    r, took = timed(["lookup", "nosuch", "--lookupd", ct.lookupd])
    assert r.exit_code == 1 and took < QUICK
    assert_one_line_error(r, "'nosuch' not found", ct.lookupd)


def depths(lookupd: str, topic: str) -> dict[str, int]:
    doc, _ = stat_json(lookupd, topic)
    out: dict[str, int] = {}
    for t in doc["topics"]:
        for ch in t["channels"]:
            out[ch["channel"]] = out.get(ch["channel"], 0) + ch["depth"]
    return out


@pytest.mark.parametrize("flavour", ["stock", "youzan"])
def test_admin_commands_twice(flavour: str, stock: ClusterThread, yz: ClusterThread) -> None:
    ct = stock if flavour == "stock" else yz
    lk = ["--lookupd", ct.lookupd]
    topic = f"twice_{flavour}"
    for args in (["topic", "create", topic], ["topic", "create", topic],
                 ["channel", "create", topic, "keep"], ["channel", "create", topic, "keep"],
                 ["channel", "create", topic, "drop"], ["channel", "create", topic, "drop"]):
        r, took = timed([*args, *lk])
        assert r.exit_code == 0 and took < QUICK, (args, r.output)
    assert invoke(["publish", topic, *lk], input="a\nb\nc\n").exit_code == 0
    assert depths(ct.lookupd, topic) == {"keep": 3, "drop": 3}
    for args in (["channel", "pause", topic, "drop"], ["channel", "pause", topic, "drop"],
                 ["channel", "empty", topic, "drop"], ["channel", "empty", topic, "drop"]):
        r, took = timed([*args, *lk])
        assert r.exit_code == 0 and took < QUICK, (args, r.output)
    # emptying one channel, twice, leaves the other's messages where they were
    assert depths(ct.lookupd, topic) == {"keep": 3, "drop": 0}
    assert invoke(["channel", "delete", topic, "drop", *lk]).exit_code == 0
    r, took = timed(["channel", "delete", topic, "drop", *lk])
    assert took < QUICK
    if flavour == "stock":  # stock nsqd answers 404: said once, exit 1
        assert r.exit_code == 1 and "CHANNEL_NOT_FOUND" in r.stdout
        assert_one_line_error(r, "channel delete failed on 1 of 1")
    else:  # youzan's nsqd deletes a missing channel without complaint
        assert r.exit_code == 0, r.output
    r, _ = timed(["channel", "pause", topic, "drop", *lk])
    assert r.exit_code == 1 and "CHANNEL_NOT_FOUND" in r.stdout
    assert depths(ct.lookupd, topic) == {"keep": 3}
    assert invoke(["topic", "delete", topic, *lk]).exit_code == 0
    r, took = timed(["topic", "delete", topic, *lk])
    assert r.exit_code == 1 and took < QUICK
    assert_one_line_error(r, f"topic {topic!r} not found")


@pytest.mark.parametrize("args", [
    ["topic", "create", "bad/name"], ["topic", "delete", "a b"],
    ["channel", "create", "ok", "bad^c"], ["channel", "empty", "ok", ""],
    ["channel", "pause", "x" * 65, "c"],
])
def test_bad_names_are_usage_errors(args: list[str], stock: ClusterThread) -> None:
    r, took = timed([*args, "--lookupd", stock.lookupd])
    assert r.exit_code == 2 and took < QUICK
    assert_one_line_error(r, "invalid")


@pytest.mark.parametrize(("args", "fragments"), [
    (["--partitions", "3"], ["needs 3 nsqd", "3 partition(s) x 1 replica(s)", "knows 2"]),
    (["--partitions", "3", "--replica", "3", "--ordered"], ["needs 3 nsqd", "knows 2"]),
])
def test_a_topic_larger_than_the_cluster_says_what_it_needs(
        args: list[str], fragments: list[str], yz: ClusterThread) -> None:
    """youzan's bare 'No node is available for topic' on the 2-node cluster: the line says
    how many nsqd the shape needs and how many there are; no topic is left behind."""
    r, took = timed(["topic", "create", "toobig", *args, "--lookupd", yz.lookupd])
    assert r.exit_code == 1 and took < QUICK
    assert_one_line_error(r, "No node is available", *fragments)
    assert invoke(["lookup", "toobig", "--lookupd", yz.lookupd]).exit_code == 1


def test_partitions_youzan_refuses_are_a_usage_error(yz: ClusterThread) -> None:
    r, took = timed(["topic", "create", "p255", "--partitions", "255", "--lookupd",
                     yz.lookupd])
    assert r.exit_code == 2 and took < QUICK  # youzan's lookupd refuses partition_num >= 255
    assert_one_line_error(r, "--partitions", "254")

# --- the demo -----------------------------------------------------------------------------

async def test_two_demos_at_once() -> None:
    async def demo() -> tuple[int, bytes]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "smartnsq.demo", "--messages", "1000", "--keys", "10",
            "--no-spark", "--timeout", "30", stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)
        async with killed_at_end(proc):
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode is not None
        return proc.returncode, out

    results = await asyncio.gather(demo(), demo())
    for code, out in results:  # each its own cluster on its own free ports
        assert code == 0 and b"result: OK" in out, out.decode()[-2000:]



def test_the_demo_into_head_ends_quietly() -> None:
    """``python -m smartnsq.demo | head -n 2``: ends at once, exit 0, no traceback (it was
    BrokenPipeError's, exit 1)."""
    began = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "smartnsq.demo", "--messages", "2000",
                             "--keys", "20", "--no-spark"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    with killed_at_end(proc):
        first = [proc.stdout.readline() for _ in range(2)]
        proc.stdout.close()  # head has read its lines and exits
        err = proc.stderr.read()
        code = proc.wait(timeout=WAIT)
    assert first[0].startswith(b"smartnsq demo: ")
    assert code == 0 and err == b"", err.decode()
    assert time.monotonic() - began < 30


def test_a_live_table_taller_than_the_screen_says_so() -> None:
    """A live table shows only what fits the terminal (rich crops it to '...'): with 200
    topics on a 24-line screen its title says how many rows are below and how to see them."""
    from rich.console import Console

    from smartnsq.cli.stat import render

    def topic(name: str) -> dict[str, Any]:
        return {"topic": name, "partition": None, "leader": "127.0.0.1:4151", "replicas": [],
                "message_count": 0, "bytes": 0, "depth": 0, "rate": None, "channels": []}

    doc = {"at": time.time(), "nodes": [], "topics": [topic(f"t{i:03d}") for i in range(200)]}
    console = Console(width=200, height=24, record=True, file=io.StringIO())
    console.print(render(doc, console.height))
    assert "182 of 200 rows below the screen: give a TOPIC, or --once | less" in (
        console.export_text())
    full = Console(width=200, record=True, file=io.StringIO())
    full.print(render(doc))  # --once, a pipe: every row, no such note
    text = full.export_text()
    assert "below the screen" not in text and "t199" in text
