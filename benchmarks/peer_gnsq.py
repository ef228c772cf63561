"""gnsq (gevent) side of the throughput benchmark; run by throughput.py in its own process.

Usage: peer_gnsq.py SCENARIO --nsqd HOST:PORT --topic T --count N
"""

from __future__ import annotations

import sys
from typing import Any

import gevent  # type: ignore[import-not-found]
import gnsq  # type: ignore[import-not-found]

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _harness import BODY, Meter, Result, peer_main


def publish(addr: str, topic: str, count: int, scenario: str) -> Result:
    producer = gnsq.Producer(nsqd_tcp_addresses=[addr])
    producer.start()
    producer.publish(topic, BODY)  # connected and warm
    meter = Meter()
    meter.start()
    if scenario == "pub_sequential":
        for _ in range(count):
            producer.publish(topic, BODY)
    elif scenario == "pub_inflight":
        pending = [producer.publish(topic, BODY, raise_error=False) for _ in range(count)]
        for r in pending:
            r.get()
    else:
        batch = 100
        pending = [producer.multipublish(topic, [BODY] * batch, raise_error=False)
                   for _ in range(count // batch)]
        for r in pending:
            r.get()
    meter.stop()
    producer.close()
    producer.join(timeout=5)
    return Result("gnsq", scenario, count, meter.wall, meter.cpu, meter.sys)


def consume(addr: str, topic: str, count: int) -> Result:
    meter = Meter()
    done = gevent.event.Event()
    seen = {"n": 0}
    consumer = gnsq.Consumer(topic, "bench", nsqd_tcp_addresses=[addr], max_in_flight=2500)

    @consumer.on_message.connect
    def handler(consumer: Any, message: Any) -> None:
        if seen["n"] == 0:
            meter.start()
        seen["n"] += 1
        if seen["n"] >= count:
            meter.stop()
            done.set()

    consumer.start(block=False)
    done.wait(timeout=600)
    gevent.sleep(0.2)  # let the last FINs go out
    consumer.close()
    consumer.join(timeout=5)
    return Result("gnsq", "consume_fin", count, meter.wall, meter.cpu, meter.sys)


if __name__ == "__main__":
    peer_main(publish, consume)
