"""Python bytecodes executed per message, by function: where smartnsq's own work goes.

Counts with ``sys.settrace`` and ``f_trace_opcodes`` (exact and repeatable, unlike CPU time on
this machine; tracing makes the run ~50x slower, so counts are meaningful, times are not),
on uvloop when installed (its loop is C, so the count is the client's Python), against a
running nsqd:

* ``pub_sequential`` — one ``await producer.publish()`` at a time;
* ``pub_inflight`` — 1000 concurrent callers on one Producer;
* ``pub_autobatch`` — 5000 concurrent callers on a Producer with linger 1 ms, max_batch 500
  (the throughput benchmark's auto-batched row);
* ``mpub`` — 50 concurrent callers of ``publish_many`` with 100 bodies each (per message);
* ``consume_fin`` — a Consumer with an ``async def`` handler, max_in_flight 2500 (the
  messages are published before the count starts).

Usage: python benchmarks/opcodes.py --nsqd HOST:PORT [--count N] [--top K] [SCENARIO ...]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import consumer_bench
from _harness import BODY

from smartnsq import Consumer, Producer, ProducerConfig

try:
    import uvloop
except ImportError:  # then asyncio's own Python code is counted too
    uvloop = None  # type: ignore[assignment]

SCENARIOS = ("pub_sequential", "pub_inflight", "pub_autobatch", "mpub", "consume_fin")
_LIMIT = 300.0


class OpcodeCounter:
    """Counts the opcodes each function runs while on; ``per(n)`` divides by ``n``."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def _tracer(self, frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        code = frame.f_code
        key = f"{os.path.basename(code.co_filename)}:{code.co_name}"
        counts = self.counts

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "opcode":
                counts[key] += 1
            return local

        return local

    def on(self) -> None:
        sys.settrace(self._tracer)

    def off(self) -> None:
        sys.settrace(None)


async def _pub_sequential(nsqd: str, n: int, ops: OpcodeCounter) -> None:
    async with Producer(nsqd=nsqd) as p:
        await p.publish("opcodes_pub", BODY)
        ops.on()
        for _ in range(n):
            await p.publish("opcodes_pub", BODY)
        ops.off()


async def _concurrent(p: Producer, calls: int, callers: int, ops: OpcodeCounter,
                      one: Callable[[], Awaitable[object]]) -> None:
    """``callers`` tasks make ``calls`` calls of ``one`` in all, traced."""
    await p.publish("opcodes_pub", BODY)
    per, extra = divmod(calls, callers)

    # tasks inherit nothing from settrace: each caller turns it on for itself
    async def caller(k: int) -> None:
        ops.on()
        for _ in range(k):
            await one()

    await asyncio.gather(*(caller(per + (i < extra)) for i in range(callers)))
    ops.off()


async def _pub_inflight(nsqd: str, n: int, ops: OpcodeCounter) -> None:
    async with Producer(nsqd=nsqd) as p:
        await _concurrent(p, n, 1000, ops, lambda: p.publish("opcodes_pub", BODY))


async def _pub_autobatch(nsqd: str, n: int, ops: OpcodeCounter) -> None:
    config = ProducerConfig(linger=0.001, max_batch=500)
    async with Producer(nsqd=nsqd, config=config) as p:
        await _concurrent(p, n, 5000, ops, lambda: p.publish("opcodes_pub", BODY))


async def _mpub(nsqd: str, n: int, ops: OpcodeCounter) -> None:
    bodies = [BODY] * 100
    async with Producer(nsqd=nsqd) as p:
        await _concurrent(p, max(1, n // 100), 50, ops,
                          lambda: p.publish_many("opcodes_pub", bodies))


async def _consume_fin(nsqd: str, n: int, ops: OpcodeCounter) -> None:
    topic = "opcodes_consume"
    await consumer_bench.preload_channel(nsqd, topic, n)
    counter = consumer_bench.Counter(n)
    consumer = Consumer(topic, consumer_bench.CHANNEL, counter, nsqd=nsqd,
                        config=consumer_bench._config())
    async with consumer:
        await consumer_bench._subscribed(consumer, 1)
        ops.on()  # the loop's callbacks run in this thread: the receive path is traced
        consumer.set_max_in_flight(consumer_bench.MAX_IN_FLIGHT)
        async with asyncio.timeout(_LIMIT):
            await counter.done.wait()
        ops.off()


RUN: dict[str, Callable[[str, int, OpcodeCounter], Awaitable[None]]] = {
    "pub_sequential": _pub_sequential,
    "pub_inflight": _pub_inflight,
    "pub_autobatch": _pub_autobatch,
    "mpub": _mpub,
    "consume_fin": _consume_fin,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("scenarios", nargs="*", metavar="SCENARIO",
                    help=f"any of {' '.join(SCENARIOS)} (default: all)")
    ap.add_argument("--nsqd", required=True, help="HOST:PORT of an nsqd's TCP port")
    ap.add_argument("--count", type=int, default=2000, help="messages per scenario")
    ap.add_argument("--top", type=int, default=15, help="functions shown per scenario")
    args = ap.parse_args(argv)
    unknown = set(args.scenarios) - set(SCENARIOS)
    if unknown:
        ap.error(f"unknown scenario {', '.join(sorted(unknown))}: choose from "
                 f"{' '.join(SCENARIOS)}")
    for name in args.scenarios or SCENARIOS:
        ops = OpcodeCounter()
        coro = RUN[name](args.nsqd, args.count, ops)
        if uvloop is not None:
            uvloop.run(coro)  # the loop in C: what is counted is the client's
        else:
            asyncio.run(coro)
        total = sum(ops.counts.values()) / args.count
        print(f"{name}: {total:.0f} opcodes per message")
        for key, count in ops.counts.most_common(args.top):
            print(f"  {count / args.count:8.1f}  {key}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
