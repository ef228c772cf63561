"""The command line against an embedded stock cluster (and a youzan one for the bridge):
publish/tail with --nsqd and --lookupd, DPUB, stat and admin on stock, to-file (rotation,
gzip, a graceful stop and a kill mid-stream), bridge stock → youzan."""

from __future__ import annotations

import gzip
import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import mmh3

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


stock = cluster_fixture("stock", nodes=1)


def nsqd_tcp(ct: ClusterThread) -> str:
    return ct.cluster.nsqd_tcp_addresses[0]


def nsqd_http(ct: ClusterThread) -> str:
    return ct.cluster.nsqd_http_addresses[0]


def make_topic(ct: ClusterThread, name: str, channel: str = CHANNEL) -> None:
    ct.call(lambda: ct.cluster.create_topic(name, channels=[channel]))


def publish(ct: ClusterThread, topic: str, bodies: list[str], *extra: str) -> None:
    result = invoke(["publish", topic, "--nsqd", nsqd_tcp(ct), *extra],
                    input="\n".join(bodies) + "\n")
    assert result.exit_code == 0, result.output


def channel_stats(ct: ClusterThread, topic: str, channel: str) -> dict[str, Any]:
    stats = http_json(f"http://{nsqd_http(ct)}/stats?format=json&topic={topic}")
    (t,) = stats["topics"]
    (ch,) = [c for c in t["channels"] if c["channel_name"] == channel]
    assert isinstance(ch, dict)
    return ch


def test_publish_and_tail_with_nsqd_and_lookupd(stock: ClusterThread, tmp_path: Path) -> None:
    make_topic(stock, "plain")
    f1, f2 = tmp_path / "a.txt", tmp_path / "b.txt"
    f1.write_bytes(b"a1\r\na2\n\na3")  # CRLF, an empty line and no final newline
    f2.write_bytes(b"b1\nb2\n")
    r = invoke(["publish", "plain", str(f1), str(f2), "--nsqd", nsqd_tcp(stock), "--batch", "2",
                "--rate", "1000/s"])
    assert r.exit_code == 0, r.output
    assert "published 5 message(s), 10 bytes" in r.stderr
    want = ["a1", "a2", "a3", "b1", "b2"]
    r = invoke(["tail", "plain", "--nsqd", nsqd_tcp(stock), "--channel", CHANNEL, "-n", "5"])
    assert r.exit_code == 0 and lines(r.stdout) == want
    publish(stock, "plain", ["x;y;z"], "--delimiter", ";")
    r = invoke(["tail", "plain", "--lookupd", stock.lookupd, "--channel", CHANNEL, "-n", "3",
                "--format", "json"])
    docs = [json.loads(x) for x in lines(r.stdout)]
    assert [d["body"] for d in docs] == ["x\n", "y", "z"] or \
        [d["body"] for d in docs] == ["x", "y", "z\n"]
    assert all(d["partition"] is None and d["offset"] is None for d in docs)
    assert channel_stats(stock, "plain", CHANNEL)["in_flight_count"] == 0


def test_deferred_publish_on_stock(stock: ClusterThread) -> None:
    make_topic(stock, "later")
    publish(stock, "later", ["soon"], "--defer", "60")
    ch = channel_stats(stock, "later", CHANNEL)
    assert ch["deferred_count"] == 1 and ch["depth"] == 0


def test_stat_and_admin_on_stock(stock: ClusterThread) -> None:
    base = ["--lookupd", stock.lookupd]
    r = invoke(["topic", "create", "admst", *base])
    assert r.exit_code == 0, r.output
    assert lines(r.stdout) == [f"topic create: nsqd {nsqd_http(stock)}: OK"]
    r = invoke(["channel", "create", "admst", "ch1", *base])
    assert r.exit_code == 0, r.output
    publish(stock, "admst", [f"m{i}" for i in range(6)])
    r = invoke(["stat", "admst", "--nsqd", nsqd_http(stock), "--once", "--json"])
    assert r.exit_code == 0, r.output
    (row,) = json.loads(r.stdout)["topics"]
    raw = http_json(f"http://{nsqd_http(stock)}/stats?format=json&topic=admst")["topics"][0]
    assert row["partition"] is None and row["leader"] == nsqd_http(stock)
    assert row["message_count"] == raw["message_count"] == 6
    assert row["depth"] == raw["depth"] and row["bytes"] == raw["message_bytes"]
    (ch,) = row["channels"]
    assert ch["depth"] == 6 and ch["clients"] == 0 and ch["lag"] == 6
    r = invoke(["channel", "empty", "admst", "ch1", *base])
    assert r.exit_code == 0 and channel_stats(stock, "admst", "ch1")["depth"] == 0
    r = invoke(["channel", "set-offset", "admst", "ch1", "--to", "end", *base])
    assert_one_line_error(r, "set-offset needs youzan")
    r = invoke(["topic", "create", "admst", "--partitions", "3", *base])
    assert_one_line_error(r, "stock nsqlookupd")
    r = invoke(["channel", "delete", "admst", "nosuch", "--nsqd", nsqd_http(stock)])
    assert_one_line_error(r, "channel delete failed")
    r = invoke(["topic", "delete", "admst", "--nsqd", nsqd_http(stock)])
    assert r.exit_code == 0, r.output
    stats = http_json(f"http://{nsqd_http(stock)}/stats?format=json")
    assert "admst" not in [t["topic_name"] for t in stats["topics"]]


def test_deleting_through_the_lookupd_leaves_nothing_listed(stock: ClusterThread) -> None:
    # nsqd's own delete leaves the lookupd listing the topic and its channels (as the real
    # nsqlookupd 1.3.0 does): the command deletes on the lookupds too, as nsqadmin does
    make_topic(stock, "gone", "ch1")
    publish(stock, "gone", ["x"])
    ct, lookupd = stock, f"http://{stock.lookupd}"
    ct.call(lambda: ct.cluster.create_channel("gone", "ch2"))
    base = ["--lookupd", stock.lookupd]
    r = invoke(["channel", "delete", "gone", "ch2", *base])
    assert r.exit_code == 0, r.output
    assert "channel delete: lookupd" in r.output
    assert http_json(f"{lookupd}/channels?topic=gone")["channels"] == ["ch1"]
    r = invoke(["topic", "delete", "gone", *base])
    assert r.exit_code == 0, r.output
    assert "gone" not in http_json(f"{lookupd}/topics")["topics"]
    assert http_json(f"{lookupd}/channels?topic=gone")["channels"] == []
    # the command says so when run again, as for a topic that never was
    assert_one_line_error(invoke(["topic", "delete", "gone", *base]), "not found on lookupd")


# -- to-file ---------------------------------------------------------------------------------


def archived(directory: Path) -> tuple[list[str], list[Path]]:
    """Every line in the directory's files (``.tmp`` included) and the closed files."""
    for _ in range(20):
        try:
            return _archived(directory)
        except FileNotFoundError:
            continue  # a .tmp was renamed while we read: look again
    raise AssertionError("the directory kept changing under us")


def _archived(directory: Path) -> tuple[list[str], list[Path]]:
    out: list[str] = []
    closed = []
    for p in sorted(directory.iterdir()):
        data = p.read_bytes()
        if p.name.endswith((".gz", ".gz.tmp")):
            try:
                data = gzip.decompress(data)
            except EOFError:  # a .tmp cut mid-stream: take what the sync flushes made whole
                d = gzip.GzipFile(fileobj=open(p, "rb"))  # noqa: SIM115
                data = b""
                try:
                    while chunk := d.read1(1 << 16):
                        data += chunk
                except EOFError:
                    pass
                d.close()
        if not p.name.endswith(".tmp"):
            closed.append(p)
        out += data.decode().splitlines()
    return out, closed


def wait_for_lines(directory: Path, n: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + WAIT
    while len(archived(directory)[0]) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the archiver wrote too little"
        time.sleep(0.05)


def test_to_file_rotates_and_stops_gracefully_mid_stream(stock: ClusterThread,
                                                         tmp_path: Path) -> None:
    make_topic(stock, "arch", "archive")
    sent = [f"msg-{i:05d}" for i in range(12000)]  # stop lands mid-stream
    publish(stock, "arch", sent, "--batch", "500")
    proc = spawn_cli(["to-file", "arch", "--output-dir", str(tmp_path), "--nsqd",
                      nsqd_tcp(stock), "--channel", "archive", "--gzip", "--rotate-size",
                      "1000", "--max-in-flight", "20", "--sync-interval", "0.05"])
    with killed_at_end(proc):
        wait_for_lines(tmp_path, 300, proc)
        send_signal(proc, signal.SIGINT)
        _, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0, err
    got, closed = archived(tmp_path)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert len(closed) > 2 and all(p.name.startswith("arch.all.") for p in closed)
    assert all(p.name.endswith(".log.gz") for p in closed)
    assert len(got) == len(set(got)) and len(got) < len(sent)  # stopped mid-stream
    assert f"archived {len(got)} message(s)" in err.decode()
    # everything not in a file is still in the channel: nothing lost, nothing finished early
    ch = channel_stats(stock, "arch", "archive")
    assert ch["in_flight_count"] == 0
    assert ch["depth"] + ch["deferred_count"] == len(sent) - len(got)
    rest = invoke(["tail", "arch", "--nsqd", nsqd_tcp(stock), "--channel", "archive", "-n",
                   str(len(sent) - len(got))])
    assert sorted(got + lines(rest.stdout)) == sent


def test_to_file_killed_mid_stream_finished_only_what_it_wrote(stock: ClusterThread,
                                                               tmp_path: Path) -> None:
    make_topic(stock, "killed", "archive")
    # enough that the kill lands mid-stream even on a quiet machine
    sent = [f"k-{i:05d}" for i in range(20000)]
    publish(stock, "killed", sent, "--batch", "500")
    proc = spawn_cli(["to-file", "killed", "--output-dir", str(tmp_path), "--nsqd",
                      nsqd_tcp(stock), "--channel", "archive", "--max-in-flight", "50",
                      "--sync-interval", "0.05"])
    with killed_at_end(proc):
        wait_for_lines(tmp_path, 500, proc)
        send_signal(proc, signal.SIGKILL)
        proc.wait(WAIT)
    got, _ = archived(tmp_path)
    ch = channel_stats(stock, "killed", "archive")
    finished = len(sent) - ch["depth"] - ch["in_flight_count"] - ch["deferred_count"]
    assert 0 < finished <= len(got) < len(sent)
    assert set(got) <= set(sent)


def test_to_file_rotates_by_time(stock: ClusterThread, tmp_path: Path) -> None:
    make_topic(stock, "timed", "archive")
    publish(stock, "timed", [f"t{i}" for i in range(10)])
    proc = spawn_cli(["to-file", "timed", "--output-dir", str(tmp_path), "--lookupd",
                      stock.lookupd, "--channel", "archive", "--rotate-interval", "0.2",
                      "--sync-interval", "0.05"])
    with killed_at_end(proc):
        deadline = time.monotonic() + WAIT
        while len(archived(tmp_path)[1]) < 1:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        publish(stock, "timed", [f"u{i}" for i in range(10)])
        while len(archived(tmp_path)[1]) < 2:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        send_signal(proc, signal.SIGINT)
        assert proc.wait(WAIT) == 0
    got, closed = archived(tmp_path)
    assert len(closed) >= 2
    assert sorted(got) == sorted([f"t{i}" for i in range(10)] + [f"u{i}" for i in range(10)])


def test_to_file_bad_input(stock: ClusterThread, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert_one_line_error(invoke(["to-file", "t", "--output-dir", str(blocker / "sub"),
                                  "--nsqd", nsqd_tcp(stock)]), "--output-dir")
    assert_one_line_error(invoke(["to-file", "t", "--nsqd", nsqd_tcp(stock)]),
                          "--output-dir")
    assert_one_line_error(invoke(["to-file", "t", "--output-dir", str(tmp_path), "--nsqd",
                                  nsqd_tcp(stock), "--rotate-size", "0"]), "--rotate-size")
    assert_one_line_error(invoke(["to-file", "t", "--output-dir", str(tmp_path), "--nsqd",
                                  nsqd_tcp(stock), "--partition", "1"]), "need --lookupd")


# -- bridge ----------------------------------------------------------------------------------


youzan = cluster_fixture("youzan", nodes=2)


def test_bridge_stock_to_youzan_loses_nothing(stock: ClusterThread,
                                              youzan: ClusterThread) -> None:
    make_topic(stock, "src", "nsq_to_nsq")
    youzan.call(lambda: youzan.cluster.create_topic("dst", 2, 1, channels=[CHANNEL]))
    sent = [f"b{i:04d}" for i in range(300)]
    publish(stock, "src", sent, "--batch", "100")
    r = invoke(["bridge", "src", "dst", "--from-lookupd", stock.lookupd, "--to-lookupd",
                youzan.lookupd, "-n", "300"])
    assert r.exit_code == 0, r.output
    assert "forwarded 300 message(s) from src to dst" in r.stderr
    ch = channel_stats(stock, "src", "nsq_to_nsq")
    assert ch["depth"] == 0 and ch["in_flight_count"] == 0 and ch["deferred_count"] == 0
    r = invoke(["tail", "dst", "--lookupd", youzan.lookupd, "--from", "earliest", "-n", "300"])
    assert sorted(lines(r.stdout)) == sent


def test_bridge_with_shard_keys_keeps_each_keys_order(stock: ClusterThread,
                                                      youzan: ClusterThread) -> None:
    make_topic(stock, "src2", "nsq_to_nsq")
    youzan.call(lambda: youzan.cluster.create_topic("dst2", 4, 1, multi_part=True,
                                                    channels=[CHANNEL]))
    sent = [json.dumps({"k": f"key{i % 5}", "n": i}) for i in range(60)]
    publish(stock, "src2", sent)
    r = invoke(["bridge", "src2", "dst2", "--from-nsqd", nsqd_tcp(stock), "--to-lookupd",
                youzan.lookupd, "--shard-key-field", "k", "-n", "60"])
    assert r.exit_code == 0, r.output
    r = invoke(["tail", "dst2", "--lookupd", youzan.lookupd, "--ordered", "--from", "earliest",
                "-n", "60", "--format", "json"])
    docs = [json.loads(x) for x in lines(r.stdout)]
    assert sorted(d["body"] for d in docs) == sorted(sent)
    per_key: dict[str, list[int]] = {}
    for d in docs:
        body = json.loads(d["body"])
        assert d["partition"] == mmh3.hash(body["k"], 0, signed=False) % 4
        per_key.setdefault(body["k"], []).append(body["n"])
    assert all(v == sorted(v) for v in per_key.values())


def test_bridge_bad_input(stock: ClusterThread, youzan: ClusterThread) -> None:
    make_topic(stock, "src3", "nsq_to_nsq")
    # its own destination: the test must not need another test to have made one
    youzan.call(lambda: youzan.cluster.create_topic("dst3", 2, 1, channels=[CHANNEL]))
    publish(stock, "src3", ["not json"])
    r = invoke(["bridge", "src3", "dst3", "--from-nsqd", nsqd_tcp(stock), "--to-lookupd",
                youzan.lookupd, "--shard-key-field", "k"])
    assert_one_line_error(r, "not JSON")
    # the message was not lost: it went back to the source channel
    assert channel_stats(stock, "src3", "nsq_to_nsq")["depth"] == 1
    assert_one_line_error(invoke(["bridge", "src3", "nosuch", "--from-nsqd", nsqd_tcp(stock),
                                  "--to-lookupd", youzan.lookupd]), "'nosuch' is not writable")
    assert_one_line_error(invoke(["bridge", "src3", "--from-nsqd", nsqd_tcp(stock)]),
                          "--to-lookupd")
    assert_one_line_error(invoke(["bridge", "src3", "x", "--from-nsqd", nsqd_tcp(stock),
                                  "--to-nsqd", nsqd_tcp(stock), "--shard-key-field", "k"]),
                          "needs --to-lookupd")
