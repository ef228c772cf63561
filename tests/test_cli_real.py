"""The command line against real servers (``../shared/realnsq``), skipped unless their
addresses are given: ``SMARTNSQ_REAL_YOUZAN_LOOKUPD`` (youzan nsqlookupd HTTP, ≥ 2 nsqd),
``SMARTNSQ_REAL_NSQD`` + ``SMARTNSQ_REAL_NSQD_HTTP`` (stock nsqd TCP and HTTP)."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import mmh3
import pytest

from tests.cli_support import (
    WAIT,
    assert_one_line_error,
    http_json,
    invoke,
    killed_at_end,
    lines,
    send_signal,
    spawn_cli,
)

YOUZAN_LOOKUPD = os.environ.get("SMARTNSQ_REAL_YOUZAN_LOOKUPD", "")
NSQD = os.environ.get("SMARTNSQ_REAL_NSQD", "")
NSQD_HTTP = os.environ.get("SMARTNSQ_REAL_NSQD_HTTP", "")
#: a new youzan topic takes up to lookupd's topic check interval to accept channels
SETTLE = 60.0


def _name(prefix: str) -> str:
    return f"{prefix}_{random.randrange(10**8):08d}"


@pytest.mark.real_youzan
@pytest.mark.skipif(not YOUZAN_LOOKUPD, reason="SMARTNSQ_REAL_YOUZAN_LOOKUPD is not set")
def test_real_youzan_round_trip() -> None:
    base = ["--lookupd", YOUZAN_LOOKUPD]
    topic = _name("cli")
    r = invoke(["topic", "create", topic, *base, "--partitions", "2"])
    assert r.exit_code == 0, r.output
    try:
        deadline = time.monotonic() + SETTLE
        while True:  # E_FAILED_ON_NOT_LEADER until lookupd hands out the leader sessions
            r = invoke(["channel", "create", topic, "c", *base])
            if r.exit_code == 0:
                break
            assert time.monotonic() < deadline, r.output
            time.sleep(1)
        # only partition 0 has messages: a position on empty partition 1 would be refused
        r = invoke(["publish", topic, *base, "--partition", "0"], input="a\nb\nc\n")
        assert r.exit_code == 0, r.output
        r = invoke(["tail", topic, *base, "--from", "earliest", "-n", "3"])
        assert lines(r.stdout) == ["a", "b", "c"], r.output
        records = [json.dumps({"k": f"key{i % 8}", "n": i}) for i in range(40)]
        r = invoke(["publish", topic, *base, "--shard-key-field", "k", "--trace"],
                   input="\n".join(records))
        assert r.exit_code == 0, r.output
        receipts = [json.loads(x) for x in lines(r.stdout)]
        assert [x["partition"] for x in receipts] == [
            mmh3.hash(f"key{i % 8}", 0, signed=False) % 2 for i in range(40)]
        # from the start: a position inside a backlog can make real nsqd hand out one message
        # below it (docs/protocol.md §13.2.1), which the consumer's exact start positions handle
        r = invoke(["tail", topic, *base, "--ordered", "--from", "earliest", "-n", "43",
                    "--format", "json"])
        docs = [json.loads(x) for x in lines(r.stdout)]
        assert sorted(d["body"] for d in docs) == sorted(["a", "b", "c", *records])
        docs = [d for d in docs if d["body"].startswith("{")]
        for d in docs:
            assert d["partition"] == mmh3.hash(json.loads(d["body"])["k"], 0, signed=False) % 2
        r = invoke(["stat", topic, *base, "--once", "--json"])
        rows = {t["partition"]: t for t in json.loads(r.stdout)["topics"]}
        for p, row in rows.items():
            doc = http_json(f"http://{row['leader']}/stats?format=json&topic={topic}")
            doc = doc.get("data", doc)
            (t,) = [t for t in doc["topics"] if t["topic_partition"] == str(p)
                    and t["is_leader"]]
            assert row["message_count"] == t["message_count"]
        assert sum(t["message_count"] for t in rows.values()) == 43
        r = invoke(["channel", "pause", topic, "c", *base])
        assert r.exit_code == 0 and len(lines(r.stdout)) == 2, r.output
        r = invoke(["channel", "unpause", topic, "c", *base])
        assert r.exit_code == 0, r.output
        assert_one_line_error(invoke(["tail", topic, *base, "--partition", "2", "-n", "1"]),
                              "partitions 0..1")
        assert_one_line_error(invoke(["tail", _name("none"), *base, "-n", "1"]), "not found")
    finally:
        invoke(["topic", "delete", topic, *base])


@pytest.mark.real_nsqd
@pytest.mark.skipif(not (NSQD and NSQD_HTTP),
                    reason="SMARTNSQ_REAL_NSQD and SMARTNSQ_REAL_NSQD_HTTP are not set")
def test_real_stock_to_file_graceful_stop(tmp_path: Path) -> None:
    topic = _name("cliarch")
    assert invoke(["topic", "create", topic, "--nsqd", NSQD_HTTP]).exit_code == 0
    try:
        assert invoke(["channel", "create", topic, "arch", "--nsqd", NSQD_HTTP]).exit_code == 0
        sent = [f"r{i:05d}" for i in range(4000)]
        r = invoke(["publish", topic, "--nsqd", NSQD, "--batch", "500"], input="\n".join(sent))
        assert r.exit_code == 0, r.output
        proc = spawn_cli(["to-file", topic, "--output-dir", str(tmp_path), "--nsqd", NSQD,
                          "--channel", "arch", "--max-in-flight", "20",
                          "--sync-interval", "0.05", "--rotate-size", "2000"])
        with killed_at_end(proc):
            deadline = time.monotonic() + WAIT
            while len(list(tmp_path.iterdir())) < 2:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.05)
            send_signal(proc, signal.SIGINT)
            assert proc.wait(WAIT) == 0
        got = [x for p in sorted(tmp_path.iterdir()) for x in p.read_text().splitlines()]
        assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
        stats = http_json(f"http://{NSQD_HTTP}/stats?format=json&topic={topic}&channel=arch")
        ch = stats["topics"][0]["channels"][0]
        assert ch["in_flight_count"] == 0
        assert ch["depth"] + ch["deferred_count"] == len(sent) - len(got)
        assert len(set(got)) == len(got) and set(got) <= set(sent)
    finally:
        invoke(["topic", "delete", topic, "--nsqd", NSQD_HTTP])
