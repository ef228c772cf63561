"""The command line without a cluster: help with examples, the entry points, option parsers,
the admin calls' HTTP requests (against a recording HTTP server), and the consumer's
``partitions=`` argument the CLI relies on."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from smartnsq import ConfigError, Consumer, OffsetSpec
from smartnsq.cli import main
from smartnsq.cli.common import parse_from, parse_rate
from tests.cli_support import assert_one_line_error, invoke, run_cli

COMMANDS = [["tail"], ["publish"], ["to-file"], ["bridge"], ["stat"], ["lookup"],
            ["topic", "create"], ["topic", "delete"], ["channel", "create"],
            ["channel", "set-offset"], ["channel", "pause"], ["dev"]]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_help_shows_examples(command: list[str]) -> None:
    result = invoke([*command, "--help"])
    assert result.exit_code == 0
    assert "Examples:" in result.stdout and "smartnsq " + command[0] in result.stdout


def test_entry_points() -> None:
    proc = run_cli(["--help"])
    assert proc.returncode == 0 and b"Examples:" in proc.stdout
    for cmd in (b"tail", b"publish", b"to-file", b"bridge", b"stat", b"lookup", b"topic",
                b"channel", b"dev"):
        assert cmd in proc.stdout
    proc = run_cli(["tail", "t", "--from", "bogus", "--lookupd", "127.0.0.1:1"])
    assert proc.returncode == 2 and b"Traceback" not in proc.stderr
    assert proc.stderr.decode().count("\n") == 1
    assert main(["--version"]) == 0
    # dev: a click command like the others
    assert main(["dev", "--help"]) == 0
    assert main(["dev", "--nodes", "x"]) == 2


def test_parse_from() -> None:
    assert parse_from("earliest") == OffsetSpec.msgcount(0)
    assert parse_from("end") == OffsetSpec.end()
    assert parse_from("offset:0=10, 3=0") == {0: OffsetSpec.virtual_queue(10),
                                              3: OffsetSpec.virtual_queue(0)}
    assert parse_from("count:1=5") == {1: OffsetSpec.msgcount(5)}
    assert parse_from("timestamp:1700000000") == OffsetSpec.timestamp(1700000000)
    assert parse_from("timestamp:2023-11-14T22:13:20+00:00") == OffsetSpec.timestamp(1700000000)
    assert parse_from("timestamp:2023-11-14T22:13:20") == OffsetSpec.timestamp(1700000000)
    for bad, why in [("", "malformed position"), ("offset", "malformed position"),
                     ("offset:", "malformed position"), ("offset:0", "malformed offset"),
                     ("offset:-1=3", "malformed offset"), ("offset:0=1,0=2", "given twice"),
                     ("count:a=1", "malformed count"), ("timestamp:x", "malformed timestamp"),
                     ("seek:0=1", "unknown position kind 'seek'")]:
        with pytest.raises(ValueError, match=why):
            parse_from(bad)


def test_parse_rate() -> None:
    assert parse_rate("100") == 100.0
    assert parse_rate("100/s") == 100.0
    assert parse_rate("60/m") == 1.0
    assert parse_rate("3600 / h") == 1.0
    for bad in ("", "x", "10/d", "-1", "0"):
        with pytest.raises(ValueError):
            parse_rate(bad)


def test_publish_progress_bar_forced_on() -> None:
    # no server: the bar was drawn (forced on, outside a terminal), then the one-line error
    r = invoke(["publish", "t", "--nsqd", "127.0.0.1:1", "--progress"], input="a\n")
    assert r.exit_code == 1
    *bar, last = r.stderr.splitlines()
    assert "publishing" in "".join(bar)
    assert last.startswith("smartnsq: error: ") and "127.0.0.1:1" in last


# -- admin calls over HTTP -------------------------------------------------------------------


class Recorder(BaseHTTPRequestHandler):
    requests: list[tuple[str, str, bytes]] = []
    status = 200
    body = b""

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.requests.append(("POST", self.path, self.rfile.read(length)))
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[tuple[str, type[Recorder]]]:
    handler = type("R", (Recorder,), {"requests": [], "status": 200, "body": b""})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def test_channel_calls_with_nsqd(recorder: tuple[str, type[Recorder]]) -> None:
    addr, handler = recorder
    for action in ("pause", "unpause", "empty", "create", "delete"):
        r = invoke(["channel", action, "orders", "billing", "--nsqd", addr, "--partition", "1"])
        assert r.exit_code == 0, r.output
        assert r.stdout == f"channel {action}: partition 1 @ nsqd {addr}: OK\n"
        method, path, _ = handler.requests[-1]
        assert method == "POST" and path.startswith(f"/channel/{action}?")
        assert set(path.split("?")[1].split("&")) == {"topic=orders", "channel=billing",
                                                       "partition=1"}
    r = invoke(["topic", "create", "orders", "--nsqd", addr])
    assert r.exit_code == 0 and handler.requests[-1][1] == "/topic/create?topic=orders"
    handler.status = 404
    handler.body = json.dumps({"message": "CHANNEL_NOT_FOUND"}).encode()
    r = invoke(["channel", "pause", "orders", "billing", "--nsqd", addr])
    assert r.stdout == f"channel pause: nsqd {addr}: HTTP 404: CHANNEL_NOT_FOUND\n"
    assert_one_line_error(r, "channel pause failed on 1 of 1")
    assert_one_line_error(invoke(["channel", "pause", "t", "c", "--nsqd", addr,
                                  "--partition", "1", "--partition", "2"]), "at most one")
    assert_one_line_error(invoke(["channel", "pause", "t", "c", "--nsqd", "127.0.0.1:1"]),
                          "channel pause failed")


# -- the library addition: Consumer(partitions=...) ------------------------------------------


async def _noop(_: Any) -> None:
    return None


def test_consumer_partitions_argument_is_checked() -> None:
    lookupd = ["127.0.0.1:4161"]
    for bad, why in [([], "must not be empty"), ([-1], "int >= 0"), (["1"], "int >= 0"),
                     ([True], "int >= 0"), ("01", "collection")]:
        with pytest.raises(ConfigError, match=why):
            Consumer("t", "c", _noop, lookupd=lookupd,
                     partitions=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="partitions= needs lookupd"):
        Consumer("t", "c", _noop, nsqd=["127.0.0.1:4150"], partitions=[0])
    Consumer("t", "c", _noop, lookupd=lookupd, partitions=(0, 2))
