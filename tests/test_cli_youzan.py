"""The command line against an embedded youzan cluster, through the real entry point:
publish → tail round trips from every --from, shard keys on their murmur3 partition, stat and
lookup against the servers' own /stats and /lookup, and the admin calls."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import mmh3
import pytest

from tests.cli_support import (
    WAIT,
    ClusterThread,
    assert_one_line_error,
    cluster_fixture,
    http_json,
    invoke,
    killed_at_end,
    lines,
    send_signal,
    spawn_cli,
)

CHANNEL = "c"


yz = cluster_fixture("youzan", nodes=2)


def make_topic(yz: ClusterThread, name: str, partitions: int = 1, **kw: bool) -> None:
    yz.call(lambda: yz.cluster.create_topic(name, partitions, 1, channels=[CHANNEL], **kw))


def publish(yz: ClusterThread, topic: str, bodies: list[str], *extra: str) -> list[str]:
    """Publish through the CLI; returns stdout lines (--trace receipts)."""
    result = invoke(["publish", topic, "--lookupd", yz.lookupd, *extra],
                    input="\n".join(bodies) + "\n")
    assert result.exit_code == 0, result.output
    assert f"published {len(bodies)} message(s)" in result.stderr
    return lines(result.stdout)


def tail(yz: ClusterThread, topic: str, *extra: str) -> list[str]:
    result = invoke(["tail", topic, "--lookupd", yz.lookupd, *extra])
    assert result.exit_code == 0, result.output
    return lines(result.stdout)


def test_publish_then_tail_from_earliest_in_order(yz: ClusterThread) -> None:
    make_topic(yz, "rt")
    sent = [f"m{i}" for i in range(30)]
    publish(yz, "rt", sent)
    assert tail(yz, "rt", "--from", "earliest", "-n", "30") == sent
    # an ephemeral channel each time: the same again
    assert tail(yz, "rt", "--from", "earliest", "-n", "5") == sent[:5]


def test_tail_from_offsets_counts_and_timestamps(yz: ClusterThread) -> None:
    make_topic(yz, "pos", 2, multi_part=True)
    sent = [f"p{i}" for i in range(10)]
    receipts = [json.loads(r) for r in publish(yz, "pos", sent, "--partition", "1", "--trace")]
    assert [r["trace_id"] for r in receipts] == list(range(1, 11))
    assert {r["partition"] for r in receipts} == {1}
    # byte offset of the 7th message → exactly messages 7..10
    at = receipts[6]["offset"]
    out = tail(yz, "pos", "--from", f"offset:1={at}", "--partition", "1", "-n", "4",
               "--format", "json")
    docs = [json.loads(line) for line in out]
    assert [d["body"] for d in docs] == sent[6:]
    assert [d["offset"] for d in docs] == [r["offset"] for r in receipts[6:]]
    assert all(d["partition"] == 1 and d["attempts"] == 1 for d in docs)
    assert docs[0]["raw_size"] == receipts[6]["raw_size"]
    assert tail(yz, "pos", "--from", "count:1=9", "--partition", "1", "-n", "2") == sent[8:]
    past = int(time.time()) - 3600
    assert tail(yz, "pos", "--from", f"timestamp:{past}", "--partition", "1",
                "-n", "10") == sent


def test_tail_partition_reads_only_that_partition(yz: ClusterThread) -> None:
    make_topic(yz, "twop", 2)
    publish(yz, "twop", ["zero-a", "zero-b"], "--partition", "0")
    publish(yz, "twop", ["one-a", "one-b"], "--partition", "1")
    out = [json.loads(x) for x in tail(yz, "twop", "--from", "earliest", "--partition", "0",
                                       "-n", "2", "--format", "json")]
    assert [d["body"] for d in out] == ["zero-a", "zero-b"]
    assert {d["partition"] for d in out} == {0}


def test_tail_from_end_sees_only_new_messages(yz: ClusterThread) -> None:
    make_topic(yz, "fromend")
    publish(yz, "fromend", [f"old{i}" for i in range(5)])
    proc = spawn_cli(["tail", "fromend", "--lookupd", yz.lookupd, "--from", "end", "-n", "3"])
    with killed_at_end(proc):
        new: list[str] = []
        deadline = time.monotonic() + WAIT
        # keep publishing until the tail has its three: it cannot say when it is subscribed
        while proc.poll() is None and time.monotonic() < deadline:
            new.append(f"new{len(new)}")
            publish(yz, "fromend", [new[-1]])
            try:
                proc.wait(0.1)
            except Exception:
                continue
        out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0, err
    got = lines(out)
    assert len(got) == 3 and not any(g.startswith("old") for g in got)
    first = new.index(got[0])
    assert got == new[first:first + 3]  # consecutive, in order


def test_ordered_tail_and_sharded_publish_land_on_murmur3_partitions(yz: ClusterThread) -> None:
    result = invoke(["topic", "create", "shard", "--lookupd", yz.lookupd, "--partitions", "4",
                     "--multi-part"])
    assert result.exit_code == 0, result.output
    assert "topic create: lookupd" in result.stdout
    result = invoke(["channel", "create", "shard", CHANNEL, "--lookupd", yz.lookupd])
    assert result.exit_code == 0, result.output
    assert len(lines(result.stdout)) == 4  # one answer per partition leader
    keys = [f"user{k}" for k in range(12)]
    records = [json.dumps({"user": keys[i % 12], "seq": i}) for i in range(96)]
    publish(yz, "shard", records, "--shard-key-field", "user")
    docs = [json.loads(x) for x in tail(yz, "shard", "--ordered", "--from", "earliest",
                                        "-n", "96", "--format", "json")]
    assert sorted(d["body"] for d in docs) == sorted(records)
    seqs: dict[str, list[int]] = {}
    for d in docs:
        body = json.loads(d["body"])
        assert d["partition"] == mmh3.hash(body["user"], 0, signed=False) % 4
        seqs.setdefault(body["user"], []).append(body["seq"])
    assert all(s == sorted(s) for s in seqs.values())
    assert len({d["partition"] for d in docs}) > 1
    # the regex form routes the same way
    publish(yz, "shard", ["id=user3 x", "id=user5 y"], "--shard-key-regex", r"id=(\w+)")
    result = invoke(["stat", "shard", "--lookupd", yz.lookupd, "--once", "--json"])
    doc = json.loads(result.stdout)
    counts = {t["partition"]: t["message_count"] for t in doc["topics"]}
    expect = {p: sum(1 for i in range(96) if mmh3.hash(keys[i % 12], 0, signed=False) % 4 == p)
              for p in range(4)}
    for key in ("user3", "user5"):
        expect[mmh3.hash(key, 0, signed=False) % 4] += 1
    assert counts == expect


def test_stat_matches_each_nsqd_stats(yz: ClusterThread) -> None:
    make_topic(yz, "st", 2)
    publish(yz, "st", [f"s{i}" for i in range(7)], "--partition", "0")
    publish(yz, "st", [f"s{i}" for i in range(3)], "--partition", "1")
    result = invoke(["stat", "st", "--lookupd", yz.lookupd, "--once", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert {n["http_address"] for n in doc["nodes"]} == set(yz.cluster.nsqd_http_addresses)
    rows = {t["partition"]: t for t in doc["topics"]}
    assert set(rows) == {0, 1}
    for node in yz.cluster.nsqd_http_addresses:
        stats = http_json(f"http://{node}/stats?format=json&topic=st")
        for t in stats["topics"]:
            p = int(t["topic_partition"])
            row = rows[p]
            if not t["is_leader"]:
                assert node in row["replicas"]
                continue
            assert row["leader"] == node
            assert row["message_count"] == t["message_count"]
            assert row["bytes"] == t["backend_depth"] - t["backend_start"]
            (ch,) = [c for c in t["channels"] if c["channel_name"] == CHANNEL]
            (mine,) = [c for c in row["channels"] if c["channel"] == CHANNEL]
            assert mine["depth"] == ch["depth"] and mine["depth_bytes"] == ch["depth_size"]
            assert mine["in_flight"] == ch["in_flight_count"]
            assert mine["clients"] == ch["client_num"]
            assert mine["lag"] == ch["depth"] + ch["in_flight_count"] + ch["deferred_count"]
    assert rows[0]["message_count"] == 7 and rows[1]["message_count"] == 3
    # the table form shows the same rows
    result = invoke(["stat", "st", "--lookupd", yz.lookupd, "--once", "--interval", "0.1"])
    assert result.exit_code == 0, result.output
    assert result.stdout.count("st ") >= 2 and CHANNEL in result.stdout


def test_lookup_matches_the_lookupd(yz: ClusterThread) -> None:
    make_topic(yz, "lk", 2)
    result = invoke(["lookup", "lk", "--lookupd", yz.lookupd, "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    raw = http_json(f"http://{yz.lookupd}/lookup?topic=lk&access=r&metainfo=true")
    leaders = {p: f"{n['broadcast_address']}:{n['tcp_port']}"
               for p, n in raw["partitions"].items()}
    assert {p: n["address"] for p, n in doc["partitions"].items()} == leaders
    assert doc["meta"]["partition_num"] == raw["meta"]["partition_num"] == 2
    assert doc["channels"] == sorted(raw["channels"])
    assert doc["answered_by"] == [f"http://{yz.lookupd}"]
    assert doc["flavour"] == "youzan" and doc["lookupd_leader"] == f"http://{yz.lookupd}"
    table = invoke(["lookup", "lk", "--lookupd", yz.lookupd])
    assert table.exit_code == 0
    for addr in leaders.values():
        assert addr in table.stdout


def test_channel_admin_calls(yz: ClusterThread) -> None:
    make_topic(yz, "adm", 2)
    publish(yz, "adm", [f"a{i}" for i in range(4)], "--partition", "0")
    base = ["--lookupd", yz.lookupd]

    def depth(p: int, channel: str = CHANNEL) -> int | None:
        doc = json.loads(invoke(["stat", "adm", *base, "--once", "--json"]).stdout)
        row = next(t for t in doc["topics"] if t["partition"] == p)
        return next((c["depth"] for c in row["channels"] if c["channel"] == channel), None)

    assert depth(0) == 4
    r = invoke(["channel", "set-offset", "adm", CHANNEL, "--to", "count:0=4", *base])
    assert r.exit_code == 0, r.output
    assert lines(r.stdout) == [f"channel set-offset: partition 0 @ nsqd "
                               f"{_leader_http(yz, 'adm', 0)}: OK"]
    assert depth(0) == 1
    # nsqd may first hand out the one message it had read ahead before the move
    # (docs/protocol.md §13.2.1), so read two: a3 is among them either way
    publish(yz, "adm", ["a4"], "--partition", "0")
    assert "a3" in tail(yz, "adm", "--channel", CHANNEL, "--partition", "0", "-n", "2")
    r = invoke(["channel", "set-offset", "adm", CHANNEL, "--to", "earliest", "--partition", "0",
                *base])
    assert r.exit_code == 0 and depth(0) == 5
    r = invoke(["channel", "empty", "adm", CHANNEL, *base])
    assert r.exit_code == 0 and len(lines(r.stdout)) == 2 and depth(0) == 0
    r = invoke(["channel", "create", "adm", "other", "--partition", "1", *base])
    assert r.exit_code == 0 and depth(1, "other") == 0 and depth(0, "other") is None
    r = invoke(["channel", "delete", "adm", "other", "--partition", "1", *base])
    assert r.exit_code == 0 and depth(1, "other") is None
    r = invoke(["topic", "delete", "adm", *base])
    assert r.exit_code == 0, r.output
    assert "adm" not in http_json(f"http://{yz.lookupd}/topics")["topics"]


def test_tail_n_returns_once_any_partition_delivers(yz: ClusterThread) -> None:
    """-n 1 over two partitions, the message on the second: each partition gets a RDY (with
    max-in-flight 1 the first held it and the second waited for a RDY rotation, 10 s)."""
    make_topic(yz, "anyp", 2)
    publish(yz, "anyp", ["late"], "--partition", "1")
    began = time.monotonic()
    assert tail(yz, "anyp", "--channel", CHANNEL, "-n", "1") == ["late"]
    assert time.monotonic() - began < 6.0


def test_channel_pause_and_unpause(yz: ClusterThread) -> None:
    make_topic(yz, "pz", 2)
    publish(yz, "pz", ["p0"], "--partition", "0")
    publish(yz, "pz", ["p1"], "--partition", "1")
    base = ["--lookupd", yz.lookupd]

    def paused() -> list[bool]:
        out = []
        for p in (0, 1):
            doc = http_json(f"http://{_leader_http(yz, 'pz', p)}/stats?format=json&topic=pz")
            doc = doc.get("data", doc)
            (t,) = [t for t in doc["topics"] if t["topic_partition"] == str(p)]
            out.append(t["channels"][0]["paused"])
        return out

    r = invoke(["channel", "pause", "pz", CHANNEL, *base])
    assert r.exit_code == 0, r.output
    assert sorted(lines(r.stdout)) == [f"channel pause: partition {p} @ nsqd "
                                       f"{_leader_http(yz, 'pz', p)}: OK" for p in (0, 1)]
    assert paused() == [True, True]
    r = invoke(["channel", "unpause", "pz", CHANNEL, *base, "--partition", "1"])
    assert r.exit_code == 0 and paused() == [True, False], r.output
    # the unpaused partition delivers, the paused one keeps its message
    assert tail(yz, "pz", "--channel", CHANNEL, "-n", "1") == ["p1"]
    r = invoke(["channel", "unpause", "pz", CHANNEL, *base])
    assert r.exit_code == 0 and paused() == [False, False], r.output
    assert tail(yz, "pz", "--channel", CHANNEL, "-n", "1") == ["p0"]


def _leader_http(yz: ClusterThread, topic: str, partition: int) -> str:
    node = yz.call(lambda: yz.cluster.leader(topic, partition))
    assert node is not None
    return yz.cluster.nodes[node].http_address


def test_tail_stops_cleanly_on_sigint(yz: ClusterThread, tmp_path: Path) -> None:
    make_topic(yz, "sig")
    publish(yz, "sig", ["x", "y"])
    proc = spawn_cli(["tail", "sig", "--lookupd", yz.lookupd, "--channel", CHANNEL])
    with killed_at_end(proc):
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"x\n"  # bounded by the 120 s test timeout
        assert proc.stdout.readline() == b"y\n"
        send_signal(proc, signal.SIGINT)
        assert proc.wait(WAIT) == 0
    stats = http_json(f"http://{_leader_http(yz, 'sig', 0)}/stats?format=json&topic=sig")
    (ch,) = stats["topics"][0]["channels"]
    assert ch["in_flight_count"] == 0 and ch["depth"] == 0 and ch["client_num"] == 0


@pytest.mark.parametrize(("args", "fragments"), [
    (["tail", "nosuch"], ["topic 'nosuch' not found"]),
    (["tail", "rt", "--from", "offset:0=x"], ["--from", "malformed offset '0=x'"]),
    (["tail", "rt", "--from", "offset:"], ["--from", "malformed position"]),
    (["tail", "rt", "--from", "yesterday"], ["--from", "malformed position"]),
    (["tail", "rt", "--from", "timestamp:soon"], ["malformed timestamp 'soon'"]),
    (["tail", "rt", "--from", "offset:7=0"], ["no partition 7"]),
    (["tail", "rt", "--partition", "3"], ["--partition 3", "partitions 0..0"]),
    (["tail", "bad/topic"], ["invalid topic name 'bad/topic'"]),
    (["tail", "rt", "--format", "xml"], ["--format"]),
    (["tail", "rt", "-n", "0"], ["-n"]),
    (["lookup", "nosuch"], ["topic 'nosuch' not found"]),
    (["stat", "nosuch", "--once"], ["topic 'nosuch' not found"]),
    (["to-file", "nosuch", "--output-dir", "/tmp/smartnsq-cli-never"],
     ["topic 'nosuch' not found"]),
    (["channel", "empty", "nosuch", "c"], ["topic 'nosuch' not found"]),
    (["channel", "set-offset", "rt", "c", "--to", "offset:0=1,0=2"], ["given twice"]),
    (["channel", "pause", "rt", "bad channel"], ["invalid channel name"]),
    (["topic", "create", "tt", "--partitions", "0"], ["--partitions"]),
    (["topic", "create", "tt", "--partitions", "9"], ["topic create tt", "HTTP 400"]),
    (["publish", "nosuch"], ["topic 'nosuch' is not writable"]),
    (["bridge", "rt", "--from-lookupd", "127.0.0.1:1", "--to-lookupd", "{lookupd}"],
     ["no lookupd answered", "127.0.0.1:1"]),
])
def test_bad_input_is_one_line_and_non_zero(yz: ClusterThread, args: list[str],
                                            fragments: list[str]) -> None:
    make_topic(yz, "rt")
    args = [a.replace("{lookupd}", yz.lookupd) for a in args]
    if not any(a.startswith("--from-lookupd") for a in args):
        args += ["--lookupd", yz.lookupd]
    assert_one_line_error(invoke(args, input=""), *fragments)


@pytest.mark.parametrize(("stdin", "extra", "fragments"), [
    ("not json\n", ["--shard-key-field", "user"], ["<stdin> record 1: not JSON"]),
    ('{"user": "a"}\n{"name": "b"}\n', ["--shard-key-field", "user"],
     ["record 2: no field 'user'", "after 1 message(s) were published"]),
    ('{"user": null}\n', ["--shard-key-field", "user"], ["field 'user' is null"]),
    ('{"user": {"id": 4}}\n', ["--shard-key-field", "user.id.x"], ["no field 'user.id.x'"]),
    ("abc\n", ["--shard-key-regex", "id=(\\d+)"], ["does not match"]),
    ("abc\n", ["--shard-key-regex", "("], ["invalid regex"]),
    ("abc\n", ["--shard-key-field", "a..b"], ["malformed field name"]),
    ("abc\n", ["--shard-key-field", "a", "--shard-key-regex", "a"], ["not both"]),
    ("abc\n", ["--shard-key-field", "a", "--batch", "2"], ["cannot be combined"]),
    ("abc\n", ["--rate", "fast"], ["malformed rate 'fast'"]),
    ("abc\n", ["--rate", "0/s"], ["rate must be > 0"]),
    ("abc\n", ["--defer", "5"], ["DPUB is not supported by youzan"]),
    ("abc\n", ["--defer", "5", "--batch", "2"], ["--defer"]),
    ("abc\n", ["--delimiter", ""], ["delimiter must not be empty"]),
    ("abc\n", ["--partition", "5"], ["partition"]),
])
def test_publish_bad_input(yz: ClusterThread, stdin: str, extra: list[str],
                           fragments: list[str]) -> None:
    make_topic(yz, "pb", 2)
    line = assert_one_line_error(invoke(["publish", "pb", "--lookupd", yz.lookupd, *extra],
                                        input=stdin), *fragments)
    assert len(line) < 400


def test_unreachable_lookupd_and_missing_cluster_options() -> None:
    for args in (["tail", "t", "--lookupd", "127.0.0.1:1"],
                 ["lookup", "t", "--lookupd", "127.0.0.1:1"],
                 ["stat", "--lookupd", "127.0.0.1:1", "--once"],
                 ["topic", "create", "t", "--lookupd", "127.0.0.1:1"]):
        assert_one_line_error(invoke(args), "127.0.0.1:1")
    assert_one_line_error(invoke(["tail", "t"]), "give --lookupd HOST:PORT or --nsqd")
    assert_one_line_error(invoke(["tail", "t", "--lookupd", "a:1", "--nsqd", "b:2"]),
                          "not both")
    assert_one_line_error(invoke(["tail", "t", "--lookupd", "nohostport"]), "--lookupd")
    assert_one_line_error(invoke(["tail", "t", "--nsqd", "h:99999"]), "--nsqd")
    assert_one_line_error(invoke(["tail", "t", "--nsqd", "127.0.0.1:1", "--from", "end"]),
                          "need --lookupd")
    assert_one_line_error(invoke(["nosuchcommand"]), "No such command")
    assert_one_line_error(invoke(["publish", "t", "/no/such/file", "--nsqd", "127.0.0.1:1"]),
                          "/no/such/file")


def test_tail_from_earliest_with_an_empty_partition(yz: ClusterThread) -> None:
    make_topic(yz, "halfempty", 2)
    publish(yz, "halfempty", ["only", "zero"], "--partition", "0")
    assert tail(yz, "halfempty", "--from", "earliest", "-n", "2") == ["only", "zero"]


def test_stat_lists_replicas_and_live_rates(yz: ClusterThread) -> None:
    yz.call(lambda: yz.cluster.create_topic("rep", 1, 2, channels=[CHANNEL]))
    leader = _leader_http(yz, "rep", 0)
    (other,) = set(yz.cluster.nsqd_http_addresses) - {leader}
    publish(yz, "rep", ["r1"])
    proc = spawn_cli(["stat", "rep", "--lookupd", yz.lookupd, "--json", "--interval", "0.3"])
    with killed_at_end(proc):
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        (row,) = first["topics"]
        assert row["leader"] == leader and row["replicas"] == [other]
        assert row["rate"] is None  # one sample: no rate yet
        publish(yz, "rep", ["r2", "r3"])
        second = json.loads(proc.stdout.readline())
        assert second["topics"][0]["rate"] is not None
        assert second["topics"][0]["channels"][0]["rate"] is not None
        send_signal(proc, signal.SIGINT)
        assert proc.wait(WAIT) == 0


def test_lookup_shows_a_failing_lookupd(yz: ClusterThread) -> None:
    make_topic(yz, "lk2")
    r = invoke(["lookup", "lk2", "--lookupd", yz.lookupd, "--lookupd", "127.0.0.1:1",
                "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["answered_by"] == [f"http://{yz.lookupd}"]
    assert "http://127.0.0.1:1" in doc["failed"]
    (bad,) = [s for s in doc["lookupds"] if s["address"] == "http://127.0.0.1:1"]
    assert bad["consecutive_failures"] >= 1 and bad["last_error"]
    table = invoke(["lookup", "lk2", "--lookupd", yz.lookupd, "--lookupd", "127.0.0.1:1"])
    assert "failed" in table.stdout or "demoted" in table.stdout


def test_lookup_lists_replicas(yz: ClusterThread) -> None:
    yz.call(lambda: yz.cluster.create_topic("rep2", 1, 2, channels=[CHANNEL]))
    leader = _leader_http(yz, "rep2", 0)
    (other,) = set(yz.cluster.nsqd_http_addresses) - {leader}
    r = invoke(["lookup", "rep2", "--lookupd", yz.lookupd, "--json"])
    doc = json.loads(r.stdout)
    assert doc["partitions"]["0"]["http_address"] == leader
    assert doc["replicas"] == {"0": [other]}
