"""pynsq (tornado) side of the throughput benchmark; run by throughput.py in its own process.

Usage: peer_pynsq.py SCENARIO --nsqd HOST:PORT --topic T --count N
"""

from __future__ import annotations

import sys
from typing import Any

import nsq  # type: ignore[import-not-found]
import tornado.ioloop  # type: ignore[import-not-found]

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _harness import BODY, Meter, Result, peer_main


def publish(addr: str, topic: str, count: int, scenario: str) -> Result:
    loop = tornado.ioloop.IOLoop.current()
    writer = nsq.Writer([addr])
    meter = Meter()
    state = {"acked": 0, "sent": 0}
    batch = 100

    def on_pub(conn: Any, data: Any) -> None:
        if isinstance(data, Exception):
            raise SystemExit(f"pynsq publish failed: {data}")
        state["acked"] += batch if scenario == "mpub" else 1
        if state["acked"] >= count:
            meter.stop()
            loop.stop()
        elif scenario == "pub_sequential":
            writer.pub(topic, BODY, callback=on_pub)

    def start() -> None:
        if not writer.conns:
            loop.call_later(0.01, start)
            return
        meter.start()
        if scenario == "pub_sequential":
            writer.pub(topic, BODY, callback=on_pub)
        elif scenario == "pub_inflight":
            for _ in range(count):
                writer.pub(topic, BODY, callback=on_pub)
        else:
            for _ in range(count // batch):
                writer.mpub(topic, [BODY] * batch, callback=on_pub)

    loop.add_callback(start)
    loop.start()
    return Result("pynsq", scenario, count, meter.wall, meter.cpu, meter.sys)


def consume(addr: str, topic: str, count: int) -> Result:
    loop = tornado.ioloop.IOLoop.current()
    meter = Meter()
    seen = {"n": 0}

    def handler(message: Any) -> bool:
        if seen["n"] == 0:
            meter.start()
        seen["n"] += 1
        if seen["n"] >= count:
            meter.stop()
            loop.call_later(0.2, loop.stop)  # let the last FINs go out
        return True

    reader = nsq.Reader(topic=topic, channel="bench", nsqd_tcp_addresses=[addr],
                        message_handler=handler, max_in_flight=2500)
    loop.start()
    reader.close()
    return Result("pynsq", "consume_fin", count, meter.wall, meter.cpu, meter.sys)


if __name__ == "__main__":
    peer_main(publish, consume)
